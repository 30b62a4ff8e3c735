//! Attribution: which lifecycle events near an incident's onset most likely caused it, by
//! what the event is, what the process does for the datapath, the incident's shape, and time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{message::round, record::Cause};
use crate::lifecycle::{
    clock::{Stamp, rfc3339},
    timeline::{Event, EventKind},
};

/// How likely each kind of event is to break the traffic of running pods.
///
/// CNI config events matter to the setup of new pods, not to the traffic of running ones:
/// they weigh little. Process events are weighed again by the process's role
/// ([`process_role`]).
pub fn kind_weight(kind: EventKind) -> f64 {
    match kind {
        EventKind::ProcessRestart | EventKind::ProcessExit => 1.0,
        EventKind::InterfaceDown | EventKind::InterfaceRemoved => 0.8,
        EventKind::ProcessStart => 0.5,
        EventKind::CniDefaultNetworkMissing => 0.35,
        EventKind::CniConfigRemoved | EventKind::CniConfigChanged | EventKind::CniConfigInvalid => 0.3,
        EventKind::InterfaceAdded => 0.3,
        EventKind::InterfaceUp => 0.2,
        EventKind::CniConfigAdded => 0.15,
        EventKind::CniDefaultNetworkRestored => 0.1,
    }
}

/// What a watched process does for the datapath, by its kernel name (`comm`, 15 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Owns the datapath: its restart loses the flows (`ovs-vswitchd`).
    Datapath,
    /// Programs the flows (`openshift-sdn`, `ovn-controller`, `ovnkube`).
    Flows,
    /// Holds the switch's configuration (`ovsdb-server`).
    Database,
    /// Any other process the agent was told to watch.
    Other,
}

/// The role of a watched process, by its name (`comm`, or `comm(instance)`).
pub fn process_role(name: &str) -> Role {
    let comm = crate::lifecycle::processes::comm_of(name);
    if comm == "ovs-vswitchd" {
        Role::Datapath
    } else if comm.starts_with("openshift-sdn") || comm.starts_with("ovn-controller") || comm.starts_with("ovnkube") {
        Role::Flows
    } else if comm == "ovsdb-server" {
        Role::Database
    } else {
        Role::Other
    }
}

fn role_weight(role: Role) -> f64 {
    match role {
        Role::Datapath => 1.0,
        Role::Flows => 0.9,
        Role::Database => 0.6,
        Role::Other => 0.7,
    }
}

/// The incident's shape: which causes fit it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A bridge or tunnel port, or several pods: the node's datapath.
    NodeWide,
    /// One pod's interface: a node-wide change would rarely hit one pod only.
    OnePod,
}

/// How well an event's kind fits the incident's shape.
fn shape_weight(kind: EventKind, subject_is_incident_interface: bool, scope: Scope) -> f64 {
    let process = matches!(kind, EventKind::ProcessRestart | EventKind::ProcessExit | EventKind::ProcessStart);
    match scope {
        Scope::OnePod if process => 0.6,
        Scope::NodeWide if !process && subject_is_incident_interface => 0.7,
        _ => 1.0,
    }
}

/// Events from this long before the onset up to [`AT_START_SECONDS`] after it count as at
/// the onset: ranking among them is by weight, not by which is a second closer, so that
/// sample jitter in the onset never swaps two causes.
const PLATEAU_SECONDS: f64 = 3.0;

/// Events up to this long after the detected onset count as at the onset: the onset is only
/// as precise as the first evidence.
const AT_START_SECONDS: f64 = 1.0;

/// Seconds over which closeness in time decays by a factor e, beyond the plateau.
const CLOSENESS_SECONDS: f64 = 10.0;

/// Ranks lifecycle events as causes of an incident that started at `start` (its first
/// evidence of loss).
///
/// Candidates are the events from `lookback` before the start until the end (the caller
/// passes those), except states found at agent start-up (those are not changes) and a
/// daemon's parent exiting after its fork (the daemon carries on). Interface events count
/// only for the incident's own interfaces and for non-pod interfaces (bridges, tunnels), not
/// for other pods' veths. For each subject only its strongest event is kept, and a process
/// restart stands for the exit and start it pairs (one cause, timed at the exit: when the
/// process went down).
///
/// `confidence = kind weight × role weight × shape weight × closeness`: the role of a process
/// ([`process_role`]: datapath 1.0, flows 0.9, other 0.7, database 0.6), the shape
/// ([`Scope`]: process events × 0.6 for a one-pod incident, a node-wide incident's own
/// interface events × 0.7), and closeness 1 from 3 s before the onset to 1 s after it,
/// `e^(−(|offset| − 3 s)/10 s)` earlier, `0.5 × e^(−(offset − 1 s)/10 s)` later (an event well
/// into the disruption is more likely a consequence or the fix). Sorted by confidence, then
/// closeness. No candidate → empty: a cause is never invented.
pub fn attribute(
    events: &[Event],
    start: Stamp,
    incident_interfaces: &BTreeSet<String>,
    pod_veths: &HashMap<String, Option<u64>>,
    scope: Scope,
) -> Vec<Cause> {
    let mut best: BTreeMap<(u8, String), Cause> = BTreeMap::new();
    for event in events.iter().filter(|e| !e.never_a_cause) {
        // A restart is timed at the exit it follows: that is when the process went down.
        let stamp = match event.kind {
            EventKind::ProcessRestart => events
                .iter()
                .filter(|e| {
                    e.kind == EventKind::ProcessExit
                        && e.subject == event.subject
                        && e.stamp.mono_ns <= event.stamp.mono_ns
                })
                .map(|e| e.stamp)
                .next_back()
                .unwrap_or(event.stamp),
            _ => event.stamp,
        };
        let (family, role) = match event.kind {
            EventKind::ProcessStart | EventKind::ProcessExit | EventKind::ProcessRestart => {
                (0, role_weight(process_role(&event.subject)))
            }
            EventKind::InterfaceAdded
            | EventKind::InterfaceRemoved
            | EventKind::InterfaceUp
            | EventKind::InterfaceDown => {
                if pod_veths.contains_key(&event.subject) && !incident_interfaces.contains(&event.subject) {
                    continue;
                }
                (1, 1.0)
            }
            _ => (2, 1.0),
        };
        let offset = start.seconds_until(&stamp);
        let closeness = if offset > AT_START_SECONDS {
            0.5 * (-(offset - AT_START_SECONDS) / CLOSENESS_SECONDS).exp()
        } else if offset >= -PLATEAU_SECONDS {
            1.0
        } else {
            (-(offset.abs() - PLATEAU_SECONDS) / CLOSENESS_SECONDS).exp()
        };
        let shape = shape_weight(event.kind, incident_interfaces.contains(&event.subject), scope);
        let weight = kind_weight(event.kind) * role * shape;
        let cause = Cause {
            kind: event.kind.as_str().to_string(),
            subject: event.subject.clone(),
            at: rfc3339(stamp.wall),
            offset_seconds: round(offset, 1_000.0),
            confidence: round(weight * closeness, 100.0),
            detail: event.detail.clone(),
        };
        let key = (family, event.subject.clone());
        // Per subject the strongest event; a restart stands for its exit and start.
        let rank = |c: &Cause| (c.kind == "process_restart", c.confidence);
        let stronger = best.get(&key).is_none_or(|kept| {
            let (new, old) = (rank(&cause), rank(kept));
            (new.0 && !old.0)
                || (new.0 == old.0 && new.1 > old.1)
                || (new == old && cause.offset_seconds.abs() < kept.offset_seconds.abs())
        });
        if stronger {
            best.insert(key, cause);
        }
    }
    let mut causes: Vec<Cause> = best.into_values().collect();
    causes.sort_by(|a, b| {
        b.confidence.total_cmp(&a.confidence).then(a.offset_seconds.abs().total_cmp(&b.offset_seconds.abs()))
    });
    causes
}
