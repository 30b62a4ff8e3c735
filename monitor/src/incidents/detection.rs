//! Detection, per watched interface, at every sample (250 ms), from evidence that packets
//! are being lost, never from silence alone:
//! - **loss evidence** ([`LostPackets`]): drops whose reason means the network lost the packet
//!   (`NETFILTER_DROP`, `NEIGH_FAILED`, `QDISC_DROP`, an OVS drop, ...), SYN and data retransmits,
//!   handshakes left unanswered ([`Handshakes`]), and packets of conversations sending while
//!   nothing comes back (counted by the kernel, see `monitor_common::Conversation`). It needs
//!   no warm-up: an interface's baseline of it starts at zero.
//! - **benign-class evidence**: drops whose reason healthy nodes see all the time
//!   ([`is_benign_reason`]: `OTHERHOST`, `NO_SOCKET`, `NOT_SPECIFIED`, TCP state drops, ...),
//!   and handshakes to services never seen answering one (a scan, a port filtered all along:
//!   their SYNs left unanswered or retransmitted, their drops `…:unseen_service`). Flows that
//!   never worked lose nothing; they are evidence only above a warm baseline (5 calm seconds).
//!   Of these, refusals ([`is_refusal_reason`]: the network delivered the packet and the
//!   receiver refused it, or the flow never worked) count in a disruption but never open one
//!   or move its end; the rest (unnamed drops, malformed packets, a switch's unforwarded
//!   packets) may be loss, and open one above their own baseline.
//!
//! Each class has its own baseline: per-second counts in calm seconds, median and MAD over
//! the last `baseline_seconds`. A disruption starts when a class's trailing second exceeds
//! `median + max(3·MAD, 3·√median)` by at least `floor` (benign-class drops: and exceed the
//! same bound per packet of the second's traffic, as many grow with it); its onset is the earliest evidence in
//! that second, timed as [`InterfaceState::observe`] says (the kernel's time for unanswered
//! packets, the middle of a sample interval for drops and unanswered SYNs, earlier by TCP's
//! least timeout for retransmits). It goes on while samples stay above the baseline with the
//! trailing second at least `floor / 2` over it, and ends `quiet` after the last such sample,
//! at its latest evidence (the engine ends it, see [`super::engine`]). While an incident is
//! open, loss evidence one packet over the baseline is enough to start a disruption on a
//! pod's veth, which joins it, and to keep it going. Both directions going quiet is idle:
//! [`Activity`] only tells the engine which interfaces fell silent during an incident.

use std::collections::{BTreeMap, VecDeque};

use super::{EngineConfig, record::LostPackets};
use crate::sampling::{
    sampler::{InterfaceSeries, UNSEEN_SERVICE_SUFFIX},
    switches::UNFORWARDED_REASON,
};

pub(super) const SECOND_NS: u64 = 1_000_000_000;
/// TCP's initial retransmission timeout (`TCP_TIMEOUT_INIT`): a SYN is retransmitted no sooner.
const TCP_SYN_TIMEOUT_NS: u64 = SECOND_NS;
/// TCP's minimum retransmission timeout (`TCP_RTO_MIN`).
const TCP_RTO_MIN_NS: u64 = 200_000_000;
/// Packets queued for a neighbour that could not be resolved, dropped when resolution failed.
const NEIGH_FAILED: &str = "NEIGH_FAILED";
/// The kernel's default interval between neighbour solicitations (`retrans_time_ms`, 1000).
const NEIGH_RETRANS_NS: u64 = SECOND_NS;
/// How far before a sample the kernel's time of the latest unanswered packet may be and still
/// be this sample's (see `monitor_common::DirectionCounters::unanswered_last_ns`).
const UNANSWERED_LAST_BACK_NS: u64 = 2 * SECOND_NS;
/// Calm seconds a benign-class baseline needs before benign drops are judged.
const BASELINE_MIN: usize = 5;
/// The directions of an interface's counters, in their index order.
pub(super) const DIRECTIONS: [&str; 2] = ["ingress", "egress"];

/// Drop reasons that healthy nodes see all the time: packets for other hosts on a bridge
/// port, to closed ports (answered by a reset or an ICMP error), unknown protocols, socket
/// filters, TCP's own state checks, drops without a reason (or with one this agent cannot
/// name), malformed or oversized packets, and a switch's unforwarded count, noisy by nature.
/// Evidence only above the interface's warm baseline.
pub fn is_benign_reason(reason: &str) -> bool {
    is_refusal_reason(reason)
        || matches!(
            reason,
            "NOT_SPECIFIED"
                | "unknown"
                | "PKT_TOO_SMALL"
                | "PKT_TOO_BIG"
                | "DUP_FRAG"
                | "IP_CSUM"
                | "IP_INHDR"
                // A switch's entered-minus-left count: noisy by nature.
                | UNFORWARDED_REASON
        )
        || reason.starts_with("REASON_")
}

/// Of the benign class, the drops of packets the network delivered and the receiver refused,
/// or of flows that never worked: a closed port, a packet for another host or of a protocol
/// nobody speaks, a socket's filter or full buffer, TCP's state checks, a SYN to a service never
/// seen answering. However many there are, the network lost nothing: above the baseline they
/// count in a disruption that loss opened, but never open one or move its end (a pod that
/// starts calling a closed port is no incident; nor are the SYN-ACKs a recovered switch
/// delivers late to sockets that gave up). Unnamed drops, malformed packets and a switch's
/// unforwarded packets may be loss: above the baseline, they open a disruption.
pub fn is_refusal_reason(reason: &str) -> bool {
    matches!(
        reason,
        "OTHERHOST"
            | "NO_SOCKET"
            | "SOCKET_FILTER"
            | "SOCKET_CLOSE"
            | "SOCKET_RCVBUFF"
            | "UNHANDLED_PROTO"
            | "IP_NOPROTO"
            | "IPV6DISABLED"
            | "UNICAST_IN_L2_MULTICAST"
    ) || reason.starts_with("TCP_")
        // A SYN to a service never seen answering, whatever dropped it: a scan, a port
        // filtered all along.
        || reason.ends_with(UNSEEN_SERVICE_SUFFIX)
}

/// One interface's evidence of lost packets, with the direction of what went unanswered.
///
/// A packet between two pods of the node crosses two watched interfaces: left unanswered, it
/// shows on the sender's veth (ingress) and on the receiver's (egress). Incident totals take,
/// for unanswered packets and SYN retransmits, the larger of the two directions' sums
/// ([`Evidence::total`]), so that such a packet is counted once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Evidence {
    pub(super) lost: LostPackets,
    /// Unanswered packets (conversations and handshakes) by direction (ingress, egress).
    pub(super) unanswered: [u64; 2],
    /// SYN retransmits by direction.
    pub(super) syn_retransmits: [u64; 2],
}

impl Evidence {
    pub(super) fn add(&mut self, other: &Evidence) {
        self.lost.add(&other.lost);
        for d in 0..2 {
            self.unanswered[d] += other.unanswered[d];
            self.syn_retransmits[d] += other.syn_retransmits[d];
        }
    }

    /// The incident's lost packets over its interfaces' evidence, each packet counted once.
    pub(super) fn total<'a>(all: impl Iterator<Item = &'a Evidence>) -> LostPackets {
        let mut sum = Evidence::default();
        for evidence in all {
            sum.add(evidence);
        }
        let directed = |pair: [u64; 2]| pair[0].max(pair[1]);
        let syn_retransmits = sum.syn_retransmits[0] + sum.syn_retransmits[1];
        LostPackets {
            dropped: sum.lost.dropped,
            unanswered: directed(sum.unanswered),
            // Data retransmits are counted once per socket already.
            retransmitted: directed(sum.syn_retransmits) + sum.lost.retransmitted.saturating_sub(syn_retransmits),
        }
    }
}

/// Cumulative counters of one interface at one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) drops: BTreeMap<String, u64>,
    pub(super) resets: u64,
    pub(super) syn: u64,
    syn_retransmits: [u64; 2],
    /// TCP data segments retransmitted by the pod's sockets or to its addresses.
    data_retransmits: u64,
    packets: [u64; 2],
    syns: [u64; 2],
    answered: [u64; 2],
    /// Of `syns`, `answered` and `syn_retransmits`: handshakes to services not seen
    /// answering before (see `monitor_common::ServiceKey`).
    unseen_syns: [u64; 2],
    unseen_answered: [u64; 2],
    unseen_syn_retransmits: [u64; 2],
    unanswered: [u64; 2],
    unanswered_since_ns: u64,
    unanswered_last_ns: u64,
}

impl Counters {
    fn from_series(series: &InterfaceSeries) -> Self {
        let c = &series.counters;
        let both = |pick: fn(&monitor_common::DirectionCounters) -> u64| [pick(&c.ingress), pick(&c.egress)];
        Self {
            drops: series.drops.clone(),
            resets: c.ingress.tcp_resets + c.egress.tcp_resets,
            syn: c.ingress.syn_retransmits + c.egress.syn_retransmits,
            syn_retransmits: both(|d| d.syn_retransmits),
            data_retransmits: series.tcp_retransmits,
            packets: both(|d| d.packets),
            syns: both(|d| d.syns),
            answered: both(|d| d.syns_answered),
            unseen_syns: both(|d| d.unseen_syns),
            unseen_answered: both(|d| d.unseen_syns_answered),
            unseen_syn_retransmits: both(|d| d.unseen_syn_retransmits),
            unanswered: both(|d| d.unanswered),
            unanswered_since_ns: c.ingress.unanswered_since_ns.max(c.egress.unanswered_since_ns),
            unanswered_last_ns: c.ingress.unanswered_last_ns.max(c.egress.unanswered_last_ns),
        }
    }

    /// `self - earlier`, per counter; a counter that went down (re-created map entry) counts from 0.
    pub(super) fn since(&self, earlier: &Counters) -> Counters {
        let diff = |now: u64, then: u64| if now >= then { now - then } else { now };
        let pair = |now: [u64; 2], then: [u64; 2]| [diff(now[0], then[0]), diff(now[1], then[1])];
        Counters {
            drops: self
                .drops
                .iter()
                .map(|(reason, n)| (reason.clone(), diff(*n, earlier.drops.get(reason).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect(),
            resets: diff(self.resets, earlier.resets),
            syn: diff(self.syn, earlier.syn),
            syn_retransmits: pair(self.syn_retransmits, earlier.syn_retransmits),
            data_retransmits: diff(self.data_retransmits, earlier.data_retransmits),
            packets: pair(self.packets, earlier.packets),
            syns: pair(self.syns, earlier.syns),
            answered: pair(self.answered, earlier.answered),
            unseen_syns: pair(self.unseen_syns, earlier.unseen_syns),
            unseen_answered: pair(self.unseen_answered, earlier.unseen_answered),
            unseen_syn_retransmits: pair(self.unseen_syn_retransmits, earlier.unseen_syn_retransmits),
            unanswered: pair(self.unanswered, earlier.unanswered),
            unanswered_since_ns: self.unanswered_since_ns,
            unanswered_last_ns: self.unanswered_last_ns,
        }
    }

    fn seen_syns(&self) -> [u64; 2] {
        [0, 1].map(|d| self.syns[d].saturating_sub(self.unseen_syns[d]))
    }

    fn seen_answered(&self) -> [u64; 2] {
        [0, 1].map(|d| self.answered[d].saturating_sub(self.unseen_answered[d]))
    }

    pub(super) fn add(&mut self, other: &Counters) {
        for (reason, n) in &other.drops {
            *self.drops.entry(reason.clone()).or_default() += n;
        }
        self.resets += other.resets;
        self.syn += other.syn;
    }
}

/// Unanswered handshakes. Outstanding handshakes at a sample are the SYNs started minus the
/// handshakes answered, per direction; the least of that over the last three samples counts
/// handshakes pending for at least two sample intervals (500 ms), as a SYN answered in time
/// is pending in one sample at most. Each rise of that floor is an unanswered SYN; a fall
/// (a late answer) lowers the mark. Handshakes pending when the agent started set the mark,
/// so they are never counted.
#[derive(Debug, Default)]
pub(super) struct Handshakes {
    /// (time, outstanding handshakes per direction) of the last samples, newest last.
    recent: VecDeque<(u64, [u64; 2])>,
    mark: Option<[u64; 2]>,
}

impl Handshakes {
    /// Unanswered SYNs found at this sample by direction, and the sample interval they were
    /// sent in, from the cumulative handshakes started and answered per direction.
    fn observe(&mut self, now_ns: u64, syns: [u64; 2], answered: [u64; 2]) -> ([u64; 2], Option<(u64, u64)>) {
        let outstanding = [0, 1].map(|d| syns[d].saturating_sub(answered[d]));
        self.recent.push_back((now_ns, outstanding));
        while self.recent.len() > 4 {
            self.recent.pop_front();
        }
        let n = self.recent.len();
        if n < 3 {
            return ([0, 0], None);
        }
        let floor = [0, 1].map(|d| self.recent.iter().skip(n - 3).map(|(_, o)| o[d]).min().unwrap_or(0));
        // Sent after the sample before the oldest of the three, up to that oldest one.
        let sent_in = (self.recent[n.saturating_sub(4)].0, self.recent[n - 3].0);
        let Some(mark) = self.mark.replace(floor) else {
            return ([0, 0], None);
        };
        let unanswered = [0, 1].map(|d| floor[d].saturating_sub(mark[d]));
        (unanswered, (unanswered != [0, 0]).then_some(sent_in))
    }
}

/// Whether one direction of an interface was busy, and since when it is silent: only to list
/// interfaces that fell silent during an incident (never to open one).
///
/// Busy: packets for at least `BUSY_NS`, never more than `BUSY_GAP_NS` apart (at sample
/// resolution), up to the last packet.
#[derive(Debug, Default)]
struct Activity {
    last_packet_ns: Option<u64>,
    busy_since: Option<u64>,
    busy_at_last_packet: bool,
}

const BUSY_NS: u64 = 2 * SECOND_NS;
const BUSY_GAP_NS: u64 = 1_600_000_000;
/// How long a busy direction must be silent to be listed as silent.
const SILENT_NS: u64 = 1_500_000_000;

impl Activity {
    fn observe(&mut self, now_ns: u64, packets: u64) {
        if packets == 0 {
            return;
        }
        let regular = self.last_packet_ns.is_some_and(|last| now_ns.saturating_sub(last) <= BUSY_GAP_NS);
        if !regular {
            self.busy_since = Some(now_ns);
        }
        self.last_packet_ns = Some(now_ns);
        self.busy_at_last_packet = self.busy_since.is_some_and(|since| now_ns.saturating_sub(since) >= BUSY_NS);
    }

    /// Silent for [`SILENT_NS`] after busy traffic: the time of the last packet.
    fn silent_since(&self, now_ns: u64) -> Option<u64> {
        let last = self.last_packet_ns?;
        (self.busy_at_last_packet && now_ns.saturating_sub(last) >= SILENT_NS).then_some(last)
    }
}

/// Per-second counts of one class of evidence (with the interface's packets in that second),
/// and its baseline over calm seconds.
#[derive(Debug)]
struct Baseline {
    /// Calm seconds (count, packets), oldest first.
    calm: VecDeque<(u64, u64)>,
    /// Every second, calm or not (taken as the baseline when an incident hits the cap).
    all: VecDeque<(u64, u64)>,
    bucket_start_ns: u64,
    bucket: (u64, u64),
    bucket_calm: bool,
}

/// `median + max(3·MAD, 3·√median)` of `values`: counts are noisy like Poisson counts, so the
/// spread is at least √median. Returns (that, median).
fn upper(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let values: Vec<f64> = values.collect();
    let median = median_f(values.clone());
    let mad = median_f(values.iter().map(|v| (v - median).abs()).collect());
    (median + (3.0 * mad).max(3.0 * median.sqrt()), median)
}

impl Baseline {
    fn new(now_ns: u64) -> Self {
        Self { calm: VecDeque::new(), all: VecDeque::new(), bucket_start_ns: now_ns, bucket: (0, 0), bucket_calm: true }
    }

    fn warm(&self) -> bool {
        self.calm.len() >= BASELINE_MIN
    }

    /// The most a calm second holds ([`upper`] of the calm seconds' counts). 0 without history.
    fn expected_per_s(&self) -> f64 {
        if self.calm.is_empty() {
            return 0.0;
        }
        upper(self.calm.iter().map(|(count, _)| *count as f64)).0
    }

    /// The most a calm stretch of `seconds` carrying `packets` holds: the larger of the
    /// per-second model and a per-packet one (the calm seconds' counts per packet, times `packets`, with its
    /// Poisson spread), so that drops that grow with the traffic (a userspace switch's
    /// `OTHERHOST`, one per frame) stay calm when the traffic grows, and drops that do not
    /// (broadcasts) stay calm when it shrinks.
    fn expected_in(&self, seconds: f64, packets: u64) -> f64 {
        let per_second = self.expected_per_s() * seconds;
        let ratios: Vec<f64> =
            self.calm.iter().filter(|(_, p)| *p > 0).map(|(count, p)| *count as f64 / *p as f64).collect();
        if ratios.is_empty() {
            return per_second;
        }
        let (high, median) = upper(ratios.into_iter());
        let per_packet = packets as f64 * high + 3.0 * (packets as f64 * median).sqrt();
        per_second.max(per_packet)
    }

    fn record(&mut self, now_ns: u64, count: u64, packets: u64, calm: bool, keep: usize) {
        self.bucket.0 += count;
        self.bucket.1 += packets;
        self.bucket_calm &= calm;
        if now_ns.saturating_sub(self.bucket_start_ns) < SECOND_NS {
            return;
        }
        let seconds = (now_ns - self.bucket_start_ns) as f64 / 1e9;
        let per_second = |n: u64| (n as f64 / seconds).round() as u64;
        let second = (per_second(self.bucket.0), per_second(self.bucket.1));
        let keep = keep.max(BASELINE_MIN);
        for (list, take) in [(&mut self.calm, self.bucket_calm), (&mut self.all, true)] {
            if take {
                list.push_back(second);
                while list.len() > keep {
                    list.pop_front();
                }
            }
        }
        self.bucket = (0, 0);
        self.bucket_calm = true;
        self.bucket_start_ns = now_ns;
    }

    /// Takes every recent second as calm: the rate of a loss that went on past the cap is this
    /// interface's new normal.
    fn adopt_recent(&mut self) {
        self.calm = self.all.clone();
    }
}

/// One sample interval of an interface, in its trailing second.
#[derive(Debug)]
struct SampleInterval {
    at_ns: u64,
    /// Loss evidence, benign-class evidence (of which `noisy`: not refusals), packets.
    loss: u64,
    benign: u64,
    noisy: u64,
    packets: u64,
    /// The earliest and the latest evidence in this interval.
    onset_ns: Option<u64>,
    last_evidence_ns: Option<u64>,
    /// Counters at the previous sample.
    before: Counters,
    evidence: Evidence,
}

/// A disruption of one interface, going on.
#[derive(Debug)]
pub(super) struct Disruption {
    /// The latest sample still above the baseline: `quiet` after it, the disruption ends.
    pub(super) last_bad_ns: u64,
    /// The time of the latest evidence of those samples: the disruption's end.
    pub(super) last_evidence_ns: u64,
    pub(super) start: Counters,
    /// Counters at `last_bad_ns`.
    pub(super) end: Counters,
    /// Evidence of lost packets since it began.
    pub(super) lost: Evidence,
    /// Started below `floor`, joining an open incident: goes on at that same bar.
    joined: bool,
}

/// What detection knows of one watched interface.
#[derive(Debug)]
pub(super) struct InterfaceState {
    pub(super) name: String,
    pub(super) pod_namespace: String,
    pub(super) pod: String,
    pub(super) is_pod_veth: bool,
    last: Counters,
    last_ns: u64,
    window: VecDeque<SampleInterval>,
    loss_baseline: Baseline,
    benign_baseline: Baseline,
    /// The benign class less its refusals ([`is_refusal_reason`]): what may open a disruption.
    noisy_baseline: Baseline,
    /// Handshakes to services seen answering before (loss evidence when unanswered), and to
    /// others (benign-class: a scan, a port filtered all along).
    handshakes: Handshakes,
    unseen_handshakes: Handshakes,
    activity: [Activity; 2],
    pub(super) disruption: Option<Disruption>,
}

impl InterfaceState {
    pub(super) fn new(series: &InterfaceSeries, now_ns: u64) -> Self {
        let last = Counters::from_series(series);
        let mut handshakes = Handshakes::default();
        handshakes.observe(now_ns, last.seen_syns(), last.seen_answered());
        let mut unseen_handshakes = Handshakes::default();
        unseen_handshakes.observe(now_ns, last.unseen_syns, last.unseen_answered);
        Self {
            name: series.interface.clone(),
            pod_namespace: series.pod_namespace.clone(),
            pod: series.pod.clone(),
            is_pod_veth: series.is_pod_veth,
            last,
            last_ns: now_ns,
            window: VecDeque::new(),
            loss_baseline: Baseline::new(now_ns),
            benign_baseline: Baseline::new(now_ns),
            noisy_baseline: Baseline::new(now_ns),
            handshakes,
            unseen_handshakes,
            activity: Default::default(),
            disruption: None,
        }
    }

    /// Takes one sample of this interface's cumulative counters at `now_ns`: finds this
    /// interval's evidence, updates the trailing second, the baselines and the activity of each
    /// direction, and goes on with, or starts, its disruption. Returns the onset of a
    /// disruption that starts now.
    ///
    /// `joining`: an incident is open on the node. Then on a pod's veth loss evidence one
    /// packet over this interface's baseline starts a disruption (that joins the incident),
    /// not `floor`, and that disruption goes on while each sample's loss keeps one packet
    /// over: the floor keeps sporadic loss from opening an incident, but during one, a pod
    /// that loses a packet a second (a readiness probe's SYNs) is part of it for as long as
    /// it does. Other interfaces (tun0, a bridge) name no pod: they keep the floor.
    pub(super) fn observe(
        &mut self,
        series: &InterfaceSeries,
        now_ns: u64,
        config: &EngineConfig,
        joining: bool,
    ) -> Option<u64> {
        if now_ns <= self.last_ns {
            return None;
        }
        self.pod_namespace.clone_from(&series.pod_namespace);
        self.pod.clone_from(&series.pod);
        let current = Counters::from_series(series);
        let delta = current.since(&self.last);
        let prev_ns = self.last_ns;
        let dt_s = (now_ns - prev_ns) as f64 / 1e9;

        // This interval's evidence.
        let (unanswered_syns, syn_sent_in) =
            self.handshakes.observe(now_ns, current.seen_syns(), current.seen_answered());
        let (unseen_unanswered, unseen_sent_in) =
            self.unseen_handshakes.observe(now_ns, current.unseen_syns, current.unseen_answered);
        let unseen_retransmits = delta.unseen_syn_retransmits;
        let seen_retransmits = [0, 1].map(|d| delta.syn_retransmits[d].saturating_sub(unseen_retransmits[d]));
        let unanswered_flows = delta.unanswered[0] + delta.unanswered[1];
        let mut unanswered = [0, 1].map(|d| delta.unanswered[d] + unanswered_syns[d]);
        let mut syn_retransmits = seen_retransmits;
        let mut lost = LostPackets {
            retransmitted: seen_retransmits[0] + seen_retransmits[1] + delta.data_retransmits,
            unanswered: unanswered[0] + unanswered[1],
            ..LostPackets::default()
        };
        let mut benign_drops = BTreeMap::new();
        for (reason, n) in &delta.drops {
            if is_benign_reason(reason) {
                benign_drops.insert(reason.clone(), *n);
            } else {
                lost.dropped.insert(reason.clone(), *n);
            }
        }
        // Handshakes to services never seen answering are benign-class evidence too.
        let unseen = unseen_unanswered[0] + unseen_unanswered[1] + unseen_retransmits[0] + unseen_retransmits[1];
        let benign: u64 = benign_drops.values().sum::<u64>() + unseen;
        let noisy: u64 = benign_drops.iter().filter(|(reason, _)| !is_refusal_reason(reason)).map(|(_, n)| *n).sum();
        let loss = lost.evidence();
        let packets = delta.packets[0] + delta.packets[1];
        let benign_above = self.benign_baseline.warm()
            && benign > 0
            && benign as f64 > self.benign_baseline.expected_in(dt_s, packets);
        let noisy_above =
            self.noisy_baseline.warm() && noisy > 0 && noisy as f64 > self.noisy_baseline.expected_in(dt_s, packets);
        if benign_above {
            for (reason, n) in benign_drops {
                *lost.dropped.entry(reason).or_default() += n;
            }
            for d in 0..2 {
                unanswered[d] += unseen_unanswered[d];
                syn_retransmits[d] += unseen_retransmits[d];
            }
            lost.unanswered += unseen_unanswered[0] + unseen_unanswered[1];
            lost.retransmitted += unseen_retransmits[0] + unseen_retransmits[1];
        }
        let syn_retransmitted = syn_retransmits[0] + syn_retransmits[1];
        // When the lost packets this interval shows were sent, as (earliest, latest): the
        // kernel's times for unanswered packets; the interval's midpoint (the least worst-case
        // error) for drops and for SYNs left unanswered, the one before for a switch's
        // unforwarded packets; for a retransmit, that midpoint less the
        // least the sender waited before retransmitting (TCP's initial SYN timeout of 1 s, its
        // 200 ms minimum RTO for data): the lost packet is the one it retransmits; likewise for
        // a neighbour that failed (its queue is dropped a solicitation interval after the last
        // solicitation went out).
        let mid = |from: u64, to: u64| from + (to - from) / 2;
        let mut times: Vec<(u64, u64)> = Vec::new();
        if lost.dropped.keys().any(|reason| reason != NEIGH_FAILED && reason != UNFORWARDED_REASON) {
            let at = mid(prev_ns, now_ns);
            times.push((at, at));
        }
        if lost.dropped.contains_key(UNFORWARDED_REASON) {
            // A switch reports its unforwarded packets one sample late (see
            // `crate::sampling::switches`): they entered during the interval before this one.
            let at = mid(prev_ns, now_ns).saturating_sub(now_ns - prev_ns);
            times.push((at, at));
        }
        if lost.dropped.contains_key(NEIGH_FAILED) {
            // Dropped when resolution gave up: the neighbour's last solicitation, sent
            // `retrans_time` earlier, went unanswered; the queue may have waited past recovery.
            let at = mid(prev_ns, now_ns).saturating_sub(NEIGH_RETRANS_NS);
            times.push((at, at));
        }
        if syn_retransmitted > 0 {
            let at = mid(prev_ns, now_ns).saturating_sub(TCP_SYN_TIMEOUT_NS);
            times.push((at, at));
        }
        if delta.data_retransmits > 0 {
            let at = mid(prev_ns, now_ns).saturating_sub(TCP_RTO_MIN_NS);
            times.push((at, at));
        }
        let unseen_sent_in = unseen_sent_in.filter(|_| benign_above);
        for (from, to) in syn_sent_in.into_iter().chain(unseen_sent_in) {
            let at = mid(from, to);
            times.push((at, at));
        }
        if unanswered_flows > 0 {
            // The kernel's start of the latest counted stretch; a stale one (the field keeps the
            // latest ever counted) falls back to the stretch length before this interval.
            let since = current.unanswered_since_ns;
            let fallback = prev_ns.saturating_sub(monitor_common::UNANSWERED_AFTER_NS);
            let first = if since >= fallback.saturating_sub(SECOND_NS) && since <= now_ns { since } else { fallback };
            // The kernel's time of the latest unanswered packet that more of its stretch
            // followed: in this interval, or before it when the packet counted now was a sparse
            // stretch's next one (an ARP request a second later, perhaps the answered one). A
            // time after the sample or long before it (a kernel without it, a stale value)
            // falls back to the sample.
            let last = current.unanswered_last_ns;
            let last = if last <= now_ns && last + UNANSWERED_LAST_BACK_NS > prev_ns { last } else { now_ns };
            times.push((first, last));
        }
        let onset_ns = times.iter().map(|(first, _)| *first).min();
        let last_evidence_ns = times.iter().map(|(_, last)| *last).max();

        let before = std::mem::replace(&mut self.last, current.clone());
        let evidence = Evidence { lost, unanswered, syn_retransmits };
        self.window.push_back(SampleInterval {
            at_ns: now_ns,
            loss,
            benign,
            noisy,
            packets,
            onset_ns,
            last_evidence_ns,
            before,
            evidence: evidence.clone(),
        });
        self.last_ns = now_ns;
        while self.window.front().is_some_and(|t| t.at_ns + SECOND_NS <= now_ns) {
            self.window.pop_front();
        }
        for (direction, activity) in self.activity.iter_mut().enumerate() {
            activity.observe(now_ns, delta.packets[direction]);
        }

        let loss_expected = self.loss_baseline.expected_per_s();
        let window_loss: u64 = self.window.iter().map(|t| t.loss).sum();
        let window_benign: u64 = self.window.iter().map(|t| t.benign).sum();
        let loss_excess = window_loss as f64 - loss_expected;
        let window_packets: u64 = self.window.iter().map(|t| t.packets).sum();
        let benign_excess = if self.benign_baseline.warm() {
            window_benign as f64 - self.benign_baseline.expected_in(1.0, window_packets)
        } else {
            0.0
        };
        let window_noisy: u64 = self.window.iter().map(|t| t.noisy).sum();
        let noisy_excess = if self.noisy_baseline.warm() {
            window_noisy as f64 - self.noisy_baseline.expected_in(1.0, window_packets)
        } else {
            0.0
        };
        let floor = config.floor.max(1) as f64;
        let sample_loss_above = loss > 0 && loss as f64 > loss_expected * dt_s;

        let mut started = None;
        match &mut self.disruption {
            None => {
                let by_loss = loss_excess >= floor;
                let joined = joining && self.is_pod_veth && !by_loss && loss_excess >= 1.0;
                // Refusals alone open nothing (see [`is_refusal_reason`]).
                let by_noisy = noisy_excess >= floor;
                if by_loss || by_noisy || joined {
                    // Onset: the earliest evidence of the class that crossed, in the trailing second.
                    let first = self
                        .window
                        .iter()
                        .find(|t| ((by_loss || joined) && t.loss > 0) || (by_noisy && t.noisy > 0))
                        .unwrap_or_else(|| self.window.back().expect("this sample is in the window"));
                    let start_ns = self
                        .window
                        .iter()
                        .filter_map(|t| t.onset_ns)
                        .min()
                        .map_or(first.at_ns, |onset| onset.min(first.at_ns));
                    let mut total = Evidence::default();
                    for t in &self.window {
                        total.add(&t.evidence);
                    }
                    let last_evidence_ns =
                        self.window.iter().filter_map(|t| t.last_evidence_ns).max().unwrap_or(now_ns);
                    self.disruption = Some(Disruption {
                        last_bad_ns: now_ns,
                        last_evidence_ns,
                        start: first.before.clone(),
                        end: current.clone(),
                        lost: total,
                        joined: joined && !by_noisy,
                    });
                    started = Some(start_ns);
                }
            }
            Some(disruption) => {
                disruption.lost.add(&evidence);
                // Goes on while this sample is above the baseline and the trailing second
                // still clearly is: benign traffic around its baseline lets it end.
                let half = (floor / 2.0).max(1.0);
                let loss_bar = if disruption.joined { 1.0 } else { half };
                let by_loss = sample_loss_above && loss_excess >= loss_bar;
                if by_loss || (benign_above && benign_excess >= half) {
                    disruption.last_bad_ns = now_ns;
                    // Refusals keep the disruption going but do not move its end: after a
                    // recovery come late answers to packets lost before it (SYN-ACKs queued in a
                    // restarting switch, for sockets that gave up: NO_SOCKET drops), not loss
                    // going on.
                    if by_loss || noisy_above {
                        // A retransmit seen late may tell of a loss before the latest evidence.
                        disruption.last_evidence_ns =
                            disruption.last_evidence_ns.max(last_evidence_ns.unwrap_or(now_ns));
                    }
                    disruption.end = current.clone();
                }
            }
        }

        // Baselines: only calm seconds count as calm.
        let calm = self.disruption.is_none();
        let keep = config.baseline_seconds;
        self.loss_baseline.record(now_ns, loss, packets, calm, keep);
        self.benign_baseline.record(now_ns, benign, packets, calm, keep);
        self.noisy_baseline.record(now_ns, noisy, packets, calm, keep);
        started
    }

    /// Directions silent since no earlier than `since_ns` after busy traffic.
    pub(super) fn silent_since(&self, now_ns: u64, since_ns: u64) -> [bool; 2] {
        [0, 1].map(|d| self.activity[d].silent_since(now_ns).is_some_and(|last| last >= since_ns))
    }

    /// An incident that hit the cap: its loss rate becomes this interface's baseline.
    pub(super) fn adopt_baseline(&mut self) {
        self.loss_baseline.adopt_recent();
        self.benign_baseline.adopt_recent();
        self.noisy_baseline.adopt_recent();
    }
}

fn median_f(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}
