//! Scenario tests of detection, the engine and attribution together: synthetic interfaces
//! sampled every 250 ms, with rates of traffic and evidence switched on and off in time.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use monitor_common::{DirectionCounters, InterfaceCounters};
use proptest::prelude::*;

use super::{EngineConfig, IncidentEngine, IncidentUpdate, detection::SECOND_NS, record::IncidentInterface};
use crate::{
    lifecycle::{
        clock::{Stamp, rfc3339},
        timeline::{Event, EventKind, Timeline},
    },
    sampling::sampler::InterfaceSeries,
};

/// Benign-class evidence: drops healthy nodes see, handshakes that never worked.
mod benign;

const TICK_NS: u64 = 250_000_000;
/// Synthetic monotonic time starts here (so offsets before it stay positive).
const T0_NS: u64 = 1_000 * SECOND_NS;

fn at(seconds: f64) -> u64 {
    T0_NS + (seconds * 1e9) as u64
}

fn stamp(seconds: f64) -> Stamp {
    Stamp::from_monotonic(at(seconds))
}

/// What one interface does per second in a time range `(from, to]`.
#[derive(Clone, Default)]
struct Rates {
    interface: &'static str,
    from: f64,
    to: f64,
    /// Drops per second, with `reason` (NOT_SPECIFIED when empty: benign class, not a refusal).
    drops: u64,
    reason: &'static str,
    packets_in: u64,
    packets_out: u64,
    /// Unanswered packets per second (from the pod), as the kernel counts them.
    unanswered: u64,
    /// Unanswered packets per second to the pod.
    unanswered_out: u64,
    /// Handshakes started and answered per second (from the pod).
    syns: u64,
    answered: u64,
    syn_retransmits: u64,
    /// Handshakes per second (from the pod) to services never seen answering, unanswered.
    unseen_syns: u64,
    /// TCP data segments retransmitted per second.
    data_retransmits: u64,
}

#[derive(Default)]
struct Totals {
    drops: BTreeMap<&'static str, f64>,
    packets: [f64; 2],
    unanswered: f64,
    unanswered_out: f64,
    unanswered_since_ns: u64,
    unanswered_last_ns: u64,
    syns: f64,
    answered: f64,
    syn_retransmits: f64,
    unseen_syns: f64,
    data_retransmits: f64,
}

struct Sim {
    engine: IncidentEngine,
    timeline: Arc<Timeline>,
    totals: BTreeMap<&'static str, Totals>,
    updates: Vec<IncidentUpdate>,
    /// When each incident id was first seen (seconds).
    first_seen: BTreeMap<String, f64>,
}

impl Sim {
    fn new() -> Self {
        Self::with(EngineConfig::default())
    }

    fn with(config: EngineConfig) -> Self {
        let timeline = Arc::new(Timeline::new(1000));
        Self {
            engine: IncidentEngine::new(config, Arc::clone(&timeline), Vec::new()),
            timeline,
            totals: BTreeMap::new(),
            updates: Vec::new(),
            first_seen: BTreeMap::new(),
        }
    }

    fn event(&self, seconds: f64, kind: EventKind, subject: &str, detail: &str) {
        self.timeline.record(Event::new(
            Stamp { mono_ns: at(seconds), wall: stamp(seconds).wall },
            kind,
            subject,
            detail,
        ));
    }

    /// Runs ticks of 250 ms from `from` to `to` seconds; `rates` active in their ranges.
    fn run(&mut self, interfaces: &[&'static str], rates: &[Rates], from: f64, to: f64) {
        let mut t = from;
        while t <= to + 1e-9 {
            let series: Vec<InterfaceSeries> = interfaces
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let total = self.totals.entry(name).or_default();
                    let tick = TICK_NS as f64 / 1e9;
                    for r in rates.iter().filter(|r| r.interface == *name && t > r.from && t - tick < r.to - 1e-9) {
                        // The part of this tick's interval the range covers (ranges may end
                        // between two samples).
                        let part = (t.min(r.to) - (t - tick).max(r.from)) / tick;
                        let per_tick = |rate: u64| rate as f64 / 4.0 * part;
                        let reason = if r.reason.is_empty() { "NOT_SPECIFIED" } else { r.reason };
                        *total.drops.entry(reason).or_default() += per_tick(r.drops);
                        total.packets[0] += per_tick(r.packets_in);
                        total.packets[1] += per_tick(r.packets_out);
                        if r.unanswered > 0 || r.unanswered_out > 0 {
                            total.unanswered += per_tick(r.unanswered);
                            total.unanswered_out += per_tick(r.unanswered_out);
                            total.unanswered_since_ns = at(r.from);
                            // The kernel's time of the latest unanswered packet.
                            total.unanswered_last_ns = at(t.min(r.to));
                        }
                        total.syns += per_tick(r.syns);
                        total.answered += per_tick(r.answered);
                        total.syn_retransmits += per_tick(r.syn_retransmits);
                        total.unseen_syns += per_tick(r.unseen_syns);
                        total.data_retransmits += per_tick(r.data_retransmits);
                    }
                    let drops = total
                        .drops
                        .iter()
                        .filter(|(_, n)| **n >= 1.0)
                        .map(|(r, n)| (r.to_string(), *n as u64))
                        .collect();
                    InterfaceSeries {
                        interface: name.to_string(),
                        ifindex: i as u32 + 10,
                        pod_namespace: "ns".into(),
                        pod: format!("pod-{name}"),
                        counters: InterfaceCounters {
                            ingress: DirectionCounters {
                                packets: total.packets[0] as u64,
                                unanswered: total.unanswered as u64,
                                unanswered_since_ns: total.unanswered_since_ns,
                                unanswered_last_ns: total.unanswered_last_ns,
                                syns: (total.syns + total.unseen_syns) as u64,
                                syns_answered: total.answered as u64,
                                syn_retransmits: total.syn_retransmits as u64,
                                unseen_syns: total.unseen_syns as u64,
                                ..Default::default()
                            },
                            egress: DirectionCounters {
                                packets: total.packets[1] as u64,
                                unanswered: total.unanswered_out as u64,
                                unanswered_since_ns: total.unanswered_since_ns,
                                unanswered_last_ns: total.unanswered_last_ns,
                                ..Default::default()
                            },
                        },
                        drops,
                        tcp_retransmits: total.data_retransmits as u64,
                        removed: false,
                        is_pod_veth: !name.starts_with("tun"),
                    }
                })
                .collect();
            let now = Stamp { mono_ns: at(t), wall: stamp(t).wall };
            self.updates.extend(self.engine.observe(now, &series));
            for incident in self.engine.incidents() {
                self.first_seen.entry(incident.id.clone()).or_insert(t);
            }
            t += TICK_NS as f64 / 1e9;
        }
    }
}

fn steady(interface: &'static str, to: f64) -> Rates {
    Rates { interface, from: 0.0, to, packets_in: 20, packets_out: 20, ..Rates::default() }
}

fn burst(interface: &'static str, from: f64, to: f64, drops: u64) -> Rates {
    Rates { interface, from, to, drops, ..Rates::default() }
}

/// A request/response stream whose answers stop in `(from, to]`: what the kernel counts on a
/// pod veth when the switch stops forwarding (20 packets a second sent, nothing back).
fn one_sided(interface: &'static str, from: f64, to: f64) -> Rates {
    Rates { interface, from, to, unanswered: 20, packets_in: 20, ..Rates::default() }
}

fn kinds(incident: &super::Incident) -> Vec<&str> {
    incident.causes.iter().map(|c| c.kind.as_str()).collect()
}

#[test]
fn the_seed_sequence_is_one_incident_with_both_causes_restart_first() {
    let mut sim = Sim::new();
    let veths = ["veth0001", "veth0002", "veth0003"];
    sim.event(17.1, EventKind::CniConfigRemoved, "/etc/cni/net.d/80-openshift-network.conf", "deleted");
    sim.event(17.1, EventKind::CniDefaultNetworkMissing, "/etc/cni/net.d/80-openshift-network.conf", "removed");
    sim.event(18.0, EventKind::ProcessExit, "ovs-vswitchd", "pid 10 killed by SIGTERM");
    sim.event(18.9, EventKind::ProcessStart, "ovs-vswitchd", "pid 11");
    sim.event(18.9, EventKind::ProcessRestart, "ovs-vswitchd", "started again 0.90 s after pid 10 was killed");
    let mut rates: Vec<Rates> = veths.iter().map(|v| steady(v, 60.0)).collect();
    rates.extend(veths.iter().map(|v| burst(v, 20.0, 29.0, 40)));
    sim.run(&veths, &rates, 0.0, 40.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let incident = &incidents[0];
    assert!(!incident.active);
    assert_eq!(incident.totals.interfaces, 3);
    assert_eq!(incident.totals.drops, 3 * 9 * 40);
    // NOT_SPECIFIED is benign-class: lost only while above the baseline, which it is throughout.
    assert_eq!(incident.totals.lost_packets, 3 * 9 * 40);
    assert_eq!(incident.interfaces[0].lost.dropped["NOT_SPECIFIED"], 360);
    assert!((incident.duration_seconds - 9.0).abs() <= 0.5, "{}", incident.duration_seconds);
    assert_eq!(kinds(incident), ["process_restart", "cni_default_network_missing"], "{:#?}", incident.causes);
    // The restart is timed at the exit it follows.
    assert!((incident.causes[0].offset_seconds + 2.0).abs() < 0.3, "{:?}", incident.causes[0]);
    assert!((incident.causes[1].offset_seconds + 2.9).abs() < 0.3, "{:?}", incident.causes[1]);
    assert!(incident.message.contains("began 2.") && incident.message.contains("after ovs-vswitchd went down"));
    assert!(incident.message.contains("the CNI default network config was removed"), "{}", incident.message);
    assert!(
        incident.message.contains("1,080 packets lost (1,080 dropped: NOT_SPECIFIED 1,080)"),
        "{}",
        incident.message
    );
    let opened = sim.updates.iter().filter(|u| matches!(u, IncidentUpdate::Opened(_))).count();
    assert_eq!(opened, 1);
    assert_eq!(sim.engine.ended_by_cause().get("process_restart"), Some(&1));
    assert_eq!(sim.engine.lost_by_cause().get("process_restart"), Some(&1080));
}

#[test]
fn a_restart_without_traffic_impact_is_no_incident() {
    let mut sim = Sim::new();
    sim.event(10.0, EventKind::ProcessExit, "ovs-vswitchd", "pid 10 killed by SIGTERM");
    sim.event(11.0, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
    sim.run(&["veth0001"], &[steady("veth0001", 40.0)], 0.0, 30.0);
    assert!(sim.engine.incidents().is_empty());
}

#[test]
fn drops_without_a_lifecycle_event_are_one_unattributed_incident() {
    let mut sim = Sim::new();
    sim.run(&["veth0001"], &[steady("veth0001", 40.0), burst("veth0001", 10.0, 14.0, 100)], 0.0, 25.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1);
    assert!(incidents[0].causes.is_empty());
    assert_eq!(incidents[0].cause_label(), "unattributed");
    assert!(incidents[0].message.contains("unattributed"), "{}", incidents[0].message);
    assert!((incidents[0].duration_seconds - 4.0).abs() <= 0.5, "{}", incidents[0].duration_seconds);
}

#[test]
fn candidate_causes_rank_by_role_and_closeness() {
    let mut sim = Sim::new();
    sim.event(2.0, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
    sim.event(5.0, EventKind::ProcessRestart, "ovsdb-server", "started again");
    sim.event(9.0, EventKind::ProcessRestart, "openshift-sdn-n", "started again");
    let veths = ["veth0001", "veth0002"];
    let rates = [steady("veth0001", 40.0), burst("veth0001", 10.0, 12.0, 100), burst("veth0002", 10.0, 12.0, 100)];
    sim.run(&veths, &rates, 0.0, 20.0);
    let causes = &sim.engine.incidents()[0].causes;
    let subjects: Vec<&str> = causes.iter().map(|c| c.subject.as_str()).collect();
    // The flow programmer is at the onset; the datapath owner 8 s before it; the database 5 s.
    assert_eq!(subjects, ["openshift-sdn-n", "ovs-vswitchd", "ovsdb-server"], "{causes:#?}");
    assert!(causes[0].confidence > causes[1].confidence);
}

#[test]
fn two_restarts_a_second_apart_keep_their_ranking_whatever_the_onset_jitter() {
    // The seed: the sdn goes down, ovs-vswitchd 1 s later; the loss begins about then.
    for onset in [18.5, 18.75, 19.0, 19.25, 19.5, 20.0] {
        let mut sim = Sim::new();
        sim.event(17.0, EventKind::ProcessExit, "openshift-sdn-n", "pid 9 terminated by SIGTERM");
        sim.event(18.0, EventKind::ProcessExit, "ovs-vswitchd", "pid 10 terminated by SIGTERM");
        sim.event(18.3, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
        sim.event(26.0, EventKind::ProcessRestart, "openshift-sdn-n", "started again");
        let veths = ["veth0001", "tun0"];
        sim.run(&veths, &[one_sided("veth0001", onset, 27.0), one_sided("tun0", onset, 27.0)], 0.0, 35.0);
        let incidents = sim.engine.incidents();
        assert_eq!(incidents.len(), 1, "onset {onset}: {incidents:#?}");
        let top = &incidents[0].causes[0];
        assert_eq!((top.kind.as_str(), top.subject.as_str()), ("process_restart", "ovs-vswitchd"), "onset {onset}");
    }
}

#[test]
fn the_cause_counted_is_the_final_top_cause() {
    // Detected before the restart event arrives (it is recorded after the onset): unattributed
    // when opened, the restart when it ends; only the final one is counted.
    let mut sim = Sim::new();
    let rates = [steady("veth0001", 60.0), one_sided("veth0001", 10.0, 16.0)];
    sim.run(&["veth0001"], &rates, 0.0, 11.0);
    let opened = sim.engine.incidents();
    assert_eq!(opened[0].cause_label(), "unattributed");
    sim.event(10.5, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
    sim.run(&["veth0001"], &rates, 11.25, 30.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1);
    assert_eq!(incidents[0].cause_label(), "process_restart");
    assert_eq!(sim.engine.ended_by_cause(), &BTreeMap::from([("process_restart".to_string(), 1)]));
    let hist = &sim.engine.durations()["process_restart"];
    let mut text = String::new();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("d", "d", hist.clone());
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("d_count 1"), "{text}");
}

#[test]
fn a_one_pod_incident_weighs_node_wide_restarts_less_than_its_own_interface() {
    let mut sim = Sim::new();
    sim.event(9.5, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
    sim.event(9.8, EventKind::InterfaceDown, "veth0001", "link down");
    sim.run(&["veth0001"], &[steady("veth0001", 40.0), burst("veth0001", 10.0, 12.0, 100)], 0.0, 20.0);
    let causes = &sim.engine.incidents()[0].causes;
    assert_eq!(causes[0].kind, "interface_down", "{causes:#?}");
    assert_eq!(causes[1].subject, "ovs-vswitchd");
}

#[test]
fn cni_config_events_rank_below_a_datapath_restart() {
    let mut sim = Sim::new();
    sim.event(9.9, EventKind::CniDefaultNetworkMissing, "/etc/cni/net.d/80-openshift-network.conf", "removed");
    sim.event(8.0, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
    let veths = ["veth0001", "veth0002"];
    sim.run(&veths, &[one_sided("veth0001", 10.0, 14.0), one_sided("veth0002", 10.0, 14.0)], 0.0, 25.0);
    let incident = &sim.engine.incidents()[0];
    assert_eq!(kinds(incident), ["process_restart", "cni_default_network_missing"], "{:#?}", incident.causes);
}

#[test]
fn events_outside_the_lookback_or_of_other_pods_are_not_causes() {
    let mut sim = Sim::new();
    sim.event(1.0, EventKind::ProcessRestart, "ovs-vswitchd", "long before");
    sim.event(39.0, EventKind::InterfaceDown, "veth0002", "another pod's veth");
    sim.run(&["veth0001", "veth0002"], &[steady("veth0001", 80.0), burst("veth0001", 40.0, 42.0, 100)], 0.0, 50.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1);
    assert!(incidents[0].causes.is_empty(), "{:#?}", incidents[0].causes);
}

#[test]
fn states_found_at_start_up_are_not_causes() {
    let mut sim = Sim::new();
    let missing = Event::new(stamp(9.0), EventKind::CniDefaultNetworkMissing, "/etc/cni/net.d", "at start-up");
    sim.timeline.record(Event { stamp: Stamp { mono_ns: at(9.0), ..missing.stamp }, ..missing }.found_at_startup());
    sim.run(&["veth0001"], &[steady("veth0001", 40.0), burst("veth0001", 10.0, 12.0, 100)], 0.0, 20.0);
    assert!(sim.engine.incidents()[0].causes.is_empty());
}

#[test]
fn pod_veth_churn_is_forgotten_after_the_lookback() {
    let mut sim = Sim::new();
    let names: Vec<&'static str> = (0..40).map(|i| &*Box::leak(format!("veth{i:04}").into_boxed_str())).collect();
    for (i, name) in names.iter().enumerate() {
        let from = i as f64 * 2.0;
        sim.run(&[name], &[steady(name, 1_000.0)], from, from + 1.75);
    }
    // 80 s of churn, a 30 s lookback: only the pods of the last ~30 s are remembered.
    let remembered = sim.engine.remembered_pod_veths();
    assert!((14..=17).contains(&remembered), "{remembered}");
    assert!(sim.engine.incidents().is_empty());
}

#[test]
fn a_flapping_burst_is_one_incident() {
    let mut sim = Sim::new();
    let mut rates = vec![steady("veth0001", 60.0)];
    for i in 0..4 {
        let from = 10.0 + 2.0 * i as f64;
        rates.push(burst("veth0001", from, from + 1.0, 50));
    }
    sim.run(&["veth0001"], &rates, 0.0, 30.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    assert_eq!(incidents[0].totals.drops, 4 * 50);
    assert!((incidents[0].duration_seconds - 7.0).abs() <= 0.5, "{}", incidents[0].duration_seconds);
}

/// Each evidence alone, from the agent's first sample or later: (what, starts at, expected
/// incident). Loss-class evidence needs no warm-up; benign-class drops need a warm baseline,
/// and refusals among them open nothing.
#[test]
fn each_evidence_opens_an_incident_when_it_should() {
    let cases: [(&str, Rates, bool); 13] = [
        ("unanswered from the first second", one_sided("veth0001", 0.0, 6.0), true),
        ("unanswered 2 s after start", one_sided("veth0001", 2.0, 8.0), true),
        (
            "NETFILTER_DROP 2 s after start",
            Rates { drops: 50, reason: "NETFILTER_DROP", ..burst("veth0001", 2.0, 6.0, 0) },
            true,
        ),
        (
            "NEIGH_FAILED 2 s after start",
            Rates { drops: 5, reason: "NEIGH_FAILED", ..burst("veth0001", 2.0, 6.0, 0) },
            true,
        ),
        ("SYN retransmits 2 s after start", Rates { syn_retransmits: 8, ..burst("veth0001", 2.0, 6.0, 0) }, true),
        ("data retransmits 2 s after start", Rates { data_retransmits: 8, ..burst("veth0001", 2.0, 6.0, 0) }, true),
        (
            "unanswered handshakes 2 s after start",
            Rates { syns: 8, answered: 0, ..burst("veth0001", 2.0, 6.0, 0) },
            true,
        ),
        ("answered handshakes", Rates { syns: 50, answered: 50, ..burst("veth0001", 0.0, 20.0, 0) }, false),
        (
            "OTHERHOST 2 s after start (cold baseline)",
            Rates { drops: 50, reason: "OTHERHOST", ..burst("veth0001", 2.0, 6.0, 0) },
            false,
        ),
        (
            // Unnamed drops may be loss: news above a warm baseline.
            "NOT_SPECIFIED surge on a warm baseline",
            Rates { drops: 50, reason: "NOT_SPECIFIED", ..burst("veth0001", 12.0, 16.0, 0) },
            true,
        ),
        // Refusals open nothing however many there are: the network delivered those packets.
        (
            "OTHERHOST surge on a warm baseline",
            Rates { drops: 50, reason: "OTHERHOST", ..burst("veth0001", 12.0, 16.0, 0) },
            false,
        ),
        (
            "NO_SOCKET surge on a warm baseline",
            Rates { drops: 50, reason: "NO_SOCKET", ..burst("veth0001", 12.0, 16.0, 0) },
            false,
        ),
        (
            // Packets a switch forwarded to no port in (12, 16], reported a sample late.
            "NO_OUTPUT_PORT surge on a warm baseline",
            Rates { drops: 50, reason: "NO_OUTPUT_PORT", ..burst("veth0001", 12.25, 16.25, 0) },
            true,
        ),
    ];
    for (what, rates, expected) in cases {
        let mut sim = Sim::new();
        sim.run(&["veth0001"], &[steady("veth0001", 30.0), rates.clone()], 0.0, 30.0);
        let incidents = sim.engine.incidents();
        assert_eq!(incidents.len(), usize::from(expected), "{what}: {incidents:#?}");
        if let Some(incident) = incidents.first() {
            assert!(!incident.active, "{what}: still open");
            assert!(incident.totals.lost_packets > 0, "{what}: {incident:#?}");
            // Onset from the first evidence, within a sample interval (plus the 500 ms an
            // unanswered handshake waits); a retransmitted SYN tells of the SYN it repeats, sent
            // TCP's initial timeout (1 s) earlier, a NEIGH_FAILED drop of the solicitation that
            // went unanswered 1 s before it.
            let lead = if what.starts_with("SYN retransmits") || what.starts_with("NEIGH_FAILED") {
                1.0
            } else if what.starts_with("NO_OUTPUT_PORT") {
                0.25
            } else {
                0.0
            };
            let onset = stamp(rates.from - lead).wall;
            let start: jiff::Timestamp = incident.start.parse().unwrap();
            let error = start.duration_since(onset).as_secs_f64();
            assert!((-0.3..=0.8).contains(&error), "{what}: onset off by {error} s");
            let duration = rates.to - rates.from;
            assert!((incident.duration_seconds - duration).abs() <= 0.8, "{what}: {} s", incident.duration_seconds);
        }
    }
}

#[test]
fn unanswered_evidence_counts_lost_packets_and_is_seen_within_a_second() {
    let mut sim = Sim::new();
    let rates = [steady("veth0001", 40.0), one_sided("veth0001", 10.0, 18.0)];
    sim.run(&["veth0001"], &rates, 0.0, 40.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let incident = &incidents[0];
    assert_eq!(incident.interfaces[0].lost.unanswered, 8 * 20);
    assert_eq!(incident.totals.lost_packets, 8 * 20);
    assert!(incident.message.contains("160 packets lost (160 unanswered)"), "{}", incident.message);
    let seen = sim.first_seen[&incident.id];
    assert!(seen - 10.0 <= 1.0, "seen {seen}");
}

#[test]
fn an_incident_ends_at_its_last_unanswered_packet_not_at_the_next_sample() {
    let mut sim = Sim::new();
    // The answers come back at 18.1 s, between the samples at 18.0 and 18.25 s.
    let rates = [steady("veth0001", 40.0), one_sided("veth0001", 10.0, 18.1)];
    sim.run(&["veth0001"], &rates, 0.0, 40.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let incident = &incidents[0];
    assert_eq!(incident.start, rfc3339(stamp(10.0).wall), "{incident:#?}");
    assert_eq!(incident.end, Some(rfc3339(stamp(18.1).wall)), "{incident:#?}");
    assert!((incident.duration_seconds - 8.1).abs() < 1e-6, "{}", incident.duration_seconds);
    // Drops have no kernel time: their incident ends in the middle of the sample interval
    // that counted the last (18.0–18.25 s), and starts in the middle of the first one.
    let mut sim = Sim::new();
    let rates = [steady("veth0001", 40.0), burst("veth0001", 10.0, 18.1, 100)];
    sim.run(&["veth0001"], &rates, 0.0, 40.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents[0].end, Some(rfc3339(stamp(18.125).wall)), "{incidents:#?}");
    assert_eq!(incidents[0].start, rfc3339(stamp(10.125).wall), "{incidents:#?}");
}

#[test]
fn a_packet_unanswered_on_two_pods_veths_is_lost_once() {
    // Pod to pod on one node: the sender's veth sees it leave unanswered, the receiver's
    // arrive and go unanswered; the receiver's firewall drops it too.
    let mut sim = Sim::new();
    let rates = [
        steady("veth0001", 40.0),
        steady("veth0002", 40.0),
        one_sided("veth0001", 10.0, 15.0),
        Rates { unanswered_out: 20, drops: 20, reason: "NETFILTER_DROP", ..burst("veth0002", 10.0, 15.0, 0) },
    ];
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 30.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let totals = &incidents[0].totals;
    assert_eq!((totals.lost.unanswered, totals.lost.dropped["NETFILTER_DROP"], totals.lost_packets), (100, 100, 100));
    // Each interface still shows what it saw.
    assert!(incidents[0].interfaces.iter().all(|i| i.lost_packets == 100), "{incidents:#?}");
}

#[test]
fn pending_handshakes_at_agent_start_are_not_counted() {
    let mut sim = Sim::new();
    // Handshakes that were left pending before the agent's first sample.
    sim.totals.insert("veth0001", Totals { syns: 500.0, ..Totals::default() });
    sim.run(&["veth0001"], &[steady("veth0001", 20.0)], 0.0, 20.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}

#[test]
fn traffic_that_stops_is_idle_not_an_incident() {
    // A client that talked steadily for 15 s and finished; another that pauses and resumes.
    let mut sim = Sim::new();
    let rates = [
        Rates { to: 15.0, ..steady("veth0001", 0.0) },
        Rates { to: 20.0, ..steady("veth0002", 0.0) },
        Rates { from: 30.0, to: 60.0, ..steady("veth0002", 0.0) },
    ];
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 60.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}

#[test]
fn interfaces_that_fall_silent_during_an_incident_are_listed_but_do_not_make_it() {
    // The switch stops forwarding: the client's veth sends unanswered, the server's goes quiet.
    let mut sim = Sim::new();
    let rates = [
        steady("veth0001", 10.0),
        one_sided("veth0001", 10.0, 18.0),
        steady("veth0001", 40.0).clone_from_to(18.0, 40.0),
        steady("veth0002", 10.0),
        steady("veth0002", 40.0).clone_from_to(18.0, 40.0),
    ];
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 40.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let server = incidents[0].interfaces.iter().find(|i| i.interface == "veth0002").expect("silent member");
    assert_eq!(server.silent_directions, ["egress", "ingress"]);
    assert_eq!(server.lost_packets, 0);
    assert!((incidents[0].duration_seconds - 8.0).abs() <= 0.5, "{}", incidents[0].duration_seconds);
    // The client's veth gets nothing back either.
    let message = &incidents[0].message;
    assert!(message.contains("went silent: veth0001 egress, veth0002 egress, veth0002 ingress"), "{message}");
}

#[test]
fn a_pod_losing_a_packet_a_second_joins_an_open_incident_but_opens_none() {
    // The seed on OVS's kernel datapath: the client's stream is dropped by the dozen a second;
    // the apiserver pod loses only the node's readiness probes, one SYN a second, below the
    // floor. During the incident that is enough: the pod the probes failed for is in it, with
    // its lost probes.
    let probe_drops = |from, to| Rates { drops: 1, reason: "OVS_DROP_LAST_ACTION", ..burst("veth0002", from, to, 0) };
    let mut sim = Sim::new();
    let client = Rates { drops: 20, reason: "OVS_DROP_LAST_ACTION", ..burst("veth0001", 10.0, 20.0, 0) };
    sim.run(&["veth0001", "veth0002"], &[client, probe_drops(10.0, 20.0)], 0.0, 40.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let apiserver = incidents[0].interfaces.iter().find(|i| i.interface == "veth0002").expect("apiserver member");
    assert_eq!(apiserver.drop_reasons.get("OVS_DROP_LAST_ACTION"), Some(&10), "{apiserver:#?}");
    assert_eq!(apiserver.lost_packets, 10);
    assert!((incidents[0].duration_seconds - 10.0).abs() <= 0.5, "{}", incidents[0].duration_seconds);

    // The same probe loss alone is under the floor: no incident.
    let mut sim = Sim::new();
    sim.run(&["veth0001", "veth0002"], &[probe_drops(10.0, 20.0)], 0.0, 40.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}

#[test]
fn a_loss_that_never_stops_is_closed_at_the_cap_and_becomes_the_baseline() {
    let config = EngineConfig { max_duration: Duration::from_secs(60), ..EngineConfig::default() };
    let mut sim = Sim::with(config);
    let policy = Rates { drops: 40, reason: "NETFILTER_DROP", ..burst("veth0001", 0.0, 200.0, 0) };
    sim.run(&["veth0001"], &[steady("veth0001", 200.0), policy], 0.0, 200.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let incident = &incidents[0];
    assert!(!incident.active);
    assert!((incident.duration_seconds - 60.0).abs() <= 0.5, "{}", incident.duration_seconds);
    let reason = incident.close_reason.as_deref().unwrap_or_default();
    assert!(reason.contains("60 s cap") && reason.contains("veth0001"), "{reason}");
}

#[test]
fn an_active_incident_grows_and_closes_after_the_quiet_period() {
    let mut sim = Sim::new();
    let rates = [steady("veth0001", 60.0), burst("veth0001", 10.0, 20.0, 100)];
    sim.run(&["veth0001"], &rates, 0.0, 12.0);
    let first = sim.engine.incidents();
    assert!(first[0].active && first[0].end.is_none());
    assert!(!first[0].detected_at.is_empty());
    assert!(sim.engine.active());
    sim.run(&["veth0001"], &rates, 12.25, 16.0);
    let later = sim.engine.incidents();
    assert!(later[0].duration_seconds > first[0].duration_seconds);
    assert_eq!(later[0].id, first[0].id);
    sim.run(&["veth0001"], &rates, 16.25, 22.0);
    assert!(sim.engine.active(), "quiet period not over yet");
    sim.run(&["veth0001"], &rates, 22.25, 24.0);
    assert!(!sim.engine.active());
    assert!(matches!(sim.updates.last(), Some(IncidentUpdate::Closed(_))));
}

impl Rates {
    fn clone_from_to(&self, from: f64, to: f64) -> Rates {
        Rates { from, to, ..self.clone() }
    }
}

/// A random on/off traffic pattern of one interface: both directions together, as a client
/// that talks, pauses and stops; plus steady benign drops.
fn idle_pattern() -> impl Strategy<Value = (Vec<(f64, f64, u64)>, u64)> {
    (proptest::collection::vec((0.0f64..100.0, 0.25f64..30.0, 1u64..200), 0..8), 0u64..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Traffic that starts, pauses and stops, at any rate, with steady benign drops, never
    /// opens an incident: nothing is lost.
    #[test]
    fn idle_never_opens_an_incident(patterns in proptest::collection::vec(idle_pattern(), 1..4)) {
        let names = ["veth0001", "veth0002", "veth0003"];
        let mut sim = Sim::new();
        let mut rates = Vec::new();
        for (i, (spans, benign)) in patterns.iter().enumerate() {
            for (from, len, rate) in spans {
                rates.push(Rates { interface: names[i], from: *from, to: from + len, packets_in: *rate, packets_out: *rate, ..Rates::default() });
            }
            rates.push(Rates { drops: *benign, reason: "OTHERHOST", ..burst(names[i], 0.0, 140.0, 0) });
        }
        sim.run(&names[..patterns.len()], &rates, 0.0, 140.0);
        prop_assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
    }

    /// Whatever evidence comes and goes, every incident ends once it stops, and the records
    /// add up.
    #[test]
    fn incidents_close_once_evidence_stops_and_add_up(
        bursts in proptest::collection::vec((0usize..3, 0.0f64..80.0, 0.25f64..6.0, 1u64..200, 0usize..3), 0..8),
        events in proptest::collection::vec((0.0f64..90.0, 0usize..4), 0..6),
    ) {
        let names = ["veth0001", "veth0002", "tun0"];
        let mut sim = Sim::new();
        let kinds = [EventKind::ProcessRestart, EventKind::CniDefaultNetworkMissing, EventKind::InterfaceDown, EventKind::CniConfigChanged];
        let mut events = events;
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (t, k) in &events {
            sim.event(*t, kinds[*k], "subject", "detail");
        }
        let mut rates: Vec<Rates> = names.iter().map(|n| steady(n, 100.0)).collect();
        let mut last_evidence: f64 = 0.0;
        for (i, from, len, n, kind) in &bursts {
            let r = burst(names[*i], *from, from + len, 0);
            rates.push(match kind {
                0 => Rates { drops: *n, reason: "NETFILTER_DROP", ..r },
                1 => Rates { unanswered: *n, ..r },
                _ => Rates { syn_retransmits: *n, ..r },
            });
            last_evidence = last_evidence.max(from + len);
        }
        sim.run(&names, &rates, 0.0, 100.0);
        let incidents = sim.engine.incidents();
        // Evidence stopped by 86 s; quiet is 4 s: nothing may be open at 100 s.
        prop_assert!(last_evidence > 96.0 || !sim.engine.active(), "{incidents:#?}");
        let mut spans: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for incident in &incidents {
            let start: jiff::Timestamp = incident.start.parse().unwrap();
            if let Some(end) = &incident.end {
                let end: jiff::Timestamp = end.parse().unwrap();
                prop_assert!(end >= start);
            }
            let sum = |f: fn(&IncidentInterface) -> u64| incident.interfaces.iter().map(f).sum::<u64>();
            prop_assert_eq!(incident.totals.drops, sum(|i| i.drops));
            // Counted once: never more than the interfaces' sum, never less than any of them.
            prop_assert!(incident.totals.lost_packets <= sum(|i| i.lost_packets));
            prop_assert!(incident.interfaces.iter().all(|i| i.lost_packets <= incident.totals.lost_packets));
            prop_assert_eq!(incident.totals.syn_retransmits, sum(|i| i.syn_retransmits));
            prop_assert_eq!(incident.totals.interfaces, incident.interfaces.len());
            for i in &incident.interfaces {
                prop_assert_eq!(i.drops, i.drop_reasons.values().sum::<u64>());
                prop_assert!(i.lost_packets <= i.lost.evidence());
            }
            prop_assert!(incident.causes.windows(2).all(|w| w[0].confidence >= w[1].confidence));
            prop_assert!(incident.causes.iter().all(|c| (0.0..=1.0).contains(&c.confidence)));
            let start_s = start.as_millisecond() as f64 / 1e3;
            for i in incident.interfaces.iter().filter(|i| i.lost_packets > 0) {
                spans.entry(i.interface.clone()).or_default().push((start_s, start_s + incident.duration_seconds));
            }
        }
        // Incidents of one interface never overlap (1 ms for rounding).
        for (_, mut list) in spans {
            list.sort_by(|a, b| a.0.total_cmp(&b.0));
            for pair in list.windows(2) {
                prop_assert!(pair[1].0 >= pair[0].1 - 0.002, "{:?}", pair);
            }
        }
        // Every lost packet is counted once at most.
        let lost: u64 = incidents.iter().map(|i| i.totals.lost_packets).sum();
        let injected: u64 = bursts.iter().map(|(_, _, len, n, _)| ((len * 4.0).floor() as u64 + 1) * n).sum();
        prop_assert!(lost <= injected, "{lost} > {injected}");
    }
}
