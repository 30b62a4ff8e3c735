//! The incident record: what `/api/v1/incidents` serves, what the state file holds, and
//! what `datapath-monitor incidents` prints. Schema: ../shared/DESIGN.md.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::sampling::switches::UNFORWARDED_REASON;

/// One pod-network disruption across one or more interfaces.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// `<start RFC 3339>-<sequence>`, unique across restarts.
    pub id: String,
    /// RFC 3339, UTC, milliseconds.
    pub start: String,
    /// None while active.
    pub end: Option<String>,
    pub active: bool,
    pub duration_seconds: f64,
    pub totals: IncidentTotals,
    pub interfaces: Vec<IncidentInterface>,
    /// Most likely first (by confidence); empty when no lifecycle event was near: never invented.
    pub causes: Vec<Cause>,
    pub message: String,
    /// When the agent opened it (RFC 3339): what it knew how soon.
    #[serde(default)]
    pub detected_at: String,
    /// Why it ended other than by its evidence stopping (the cap, the agent stopping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<String>,
}

/// Lost packets by kind of evidence (README, "Incidents").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostPackets {
    /// Dropped by the kernel, by drop reason.
    pub dropped: BTreeMap<String, u64>,
    /// SYN retransmits and TCP data segments retransmitted: each repeats a packet that was
    /// lost or left unanswered.
    pub retransmitted: u64,
    /// Sent with nothing coming back (conversations gone one-sided, unanswered handshakes).
    pub unanswered: u64,
}

impl LostPackets {
    /// Packets lost, counted once: a packet is often evidence twice (a dropped SYN is also
    /// unanswered, a datagram a switch forwards to no port is also a kernel drop), so this is
    /// the largest of the kernel's drops, the switches' unforwarded packets and the
    /// not-answered (unanswered + retransmitted) count: a lower bound.
    pub fn packets(&self) -> u64 {
        let unforwarded = self.dropped.get(UNFORWARDED_REASON).copied().unwrap_or(0);
        let kernel_drops = self.dropped.values().sum::<u64>() - unforwarded;
        kernel_drops.max(unforwarded).max(self.retransmitted + self.unanswered)
    }

    /// Every piece of evidence, each kind in full (what detection weighs).
    pub fn evidence(&self) -> u64 {
        self.dropped.values().sum::<u64>() + self.retransmitted + self.unanswered
    }

    pub fn add(&mut self, other: &LostPackets) {
        for (reason, n) in &other.dropped {
            *self.dropped.entry(reason.clone()).or_default() += n;
        }
        self.retransmitted += other.retransmitted;
        self.unanswered += other.unanswered;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentTotals {
    pub drops: u64,
    pub tcp_resets: u64,
    pub syn_retransmits: u64,
    pub interfaces: usize,
    /// `lost`'s packets, counted once (see [`LostPackets::packets`]); the same packet can be
    /// evidence on two interfaces (unanswered on the sender's, dropped on the receiver's).
    #[serde(default)]
    pub lost_packets: u64,
    #[serde(default)]
    pub lost: LostPackets,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentInterface {
    pub interface: String,
    pub pod_namespace: String,
    pub pod: String,
    pub drops: u64,
    pub drop_reasons: BTreeMap<String, u64>,
    pub tcp_resets: u64,
    pub syn_retransmits: u64,
    /// Directions ("ingress": from the pod, "egress": to the pod) whose busy traffic stopped
    /// during the incident. Silence alone never opens an incident.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub silent_directions: Vec<String>,
    /// Packets this interface lost during the incident, counted once (see [`LostPackets::packets`]).
    #[serde(default)]
    pub lost_packets: u64,
    #[serde(default)]
    pub lost: LostPackets,
}

/// A lifecycle event suspected of causing the incident.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    /// A lifecycle event kind, e.g. `process_restart`.
    pub kind: String,
    pub subject: String,
    /// RFC 3339 time of the event.
    pub at: String,
    /// Event time minus incident start: negative = before it began.
    pub offset_seconds: f64,
    /// In [0, 1]: kind weight times closeness in time (README, "Attribution").
    pub confidence: f64,
    pub detail: String,
}

impl Incident {
    /// The label of `datapath_incidents_total{cause}`: the top cause's kind, or `unattributed`
    /// (counted when the incident ends, so it is the final top cause).
    pub fn cause_label(&self) -> &str {
        self.causes.first().map_or("unattributed", |cause| cause.kind.as_str())
    }
}
