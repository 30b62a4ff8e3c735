//! The incident engine: per-interface samples in ([`super::detection`]), incidents out.
//! Disruptions that overlap in time form one incident; each incident is attributed
//! ([`super::attribution`]) and rendered ([`super::message`]) when it opens, when it is read
//! and when it closes; closed ones are kept for `/api/v1/incidents`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
};

use prometheus_client::metrics::histogram::Histogram;
use tracing::warn;

use super::{
    EngineConfig,
    attribution::attribute,
    detection::{Counters, DIRECTIONS, Disruption, InterfaceState},
    message::build_incident,
    record::{Incident, IncidentInterface},
};
use crate::{
    lifecycle::{clock::Stamp, timeline::Timeline},
    sampling::sampler::InterfaceSeries,
};

/// The engine shared by the sampler task (writer), the API and scrapes.
pub type SharedEngine = Arc<Mutex<IncidentEngine>>;

/// Buckets of `datapath_incident_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0];

/// One interface's part of the open incident.
#[derive(Debug, Default)]
struct Member {
    pod_namespace: String,
    pod: String,
    /// Sums over this interface's disruptions that have ended.
    ended: Counters,
    silent: BTreeSet<&'static str>,
    last_end_ns: u64,
}

#[derive(Debug)]
struct OpenIncident {
    seq: u64,
    start: Stamp,
    members: BTreeMap<String, Member>,
}

/// What changed in one observation, for logs.
#[derive(Clone, Debug, PartialEq)]
pub enum IncidentUpdate {
    Opened(Incident),
    Closed(Incident),
}

pub struct IncidentEngine {
    config: EngineConfig,
    timeline: Arc<Timeline>,
    /// By ifindex; an ifindex that comes back under another name is another interface.
    ifaces: HashMap<u32, InterfaceState>,
    /// Pod veths seen, with when each vanished (None while present): interface events of
    /// other pods' veths are no cause. Names gone for longer than the lookback are forgotten
    /// while no incident is open, so pod churn does not grow this.
    pod_veths: HashMap<String, Option<u64>>,
    open: Option<OpenIncident>,
    closed: VecDeque<Incident>,
    seq: u64,
    /// `datapath_incidents_total{cause}` (cause at open).
    opened_by_cause: BTreeMap<String, u64>,
    /// `datapath_incident_duration_seconds{cause}` (cause at close).
    durations: BTreeMap<String, Histogram>,
}

impl IncidentEngine {
    /// `history`: closed incidents read back from the state file, oldest first.
    pub fn new(config: EngineConfig, timeline: Arc<Timeline>, history: Vec<Incident>) -> Self {
        let keep = config.history;
        let mut closed: VecDeque<Incident> = history.into();
        while closed.len() > keep {
            closed.pop_front();
        }
        Self {
            config,
            timeline,
            ifaces: HashMap::new(),
            pod_veths: HashMap::new(),
            open: None,
            closed,
            seq: 0,
            opened_by_cause: BTreeMap::new(),
            durations: BTreeMap::new(),
        }
    }

    /// Feeds one sample of every watched interface (cumulative counters) taken at `now`.
    pub fn observe(&mut self, now: Stamp, series: &[InterfaceSeries]) -> Vec<IncidentUpdate> {
        let now_ns = now.mono_ns;
        let mut updates = Vec::new();
        let mut present: HashSet<u32> = HashSet::with_capacity(series.len());
        let mut present_pod_veths: HashSet<&str> = HashSet::new();
        let quiet_ns = self.config.quiet.as_nanos() as u64;
        let mut started: Vec<(String, u64)> = Vec::new();
        for s in series.iter().filter(|s| !s.removed) {
            present.insert(s.ifindex);
            if s.is_pod_veth {
                present_pod_veths.insert(&s.interface);
                match self.pod_veths.get_mut(&s.interface) {
                    Some(gone) => *gone = None,
                    None => {
                        self.pod_veths.insert(s.interface.clone(), None);
                    }
                }
            }
            if self.ifaces.get(&s.ifindex).is_some_and(|iface| iface.name != s.interface) {
                // Renamed, or the ifindex was reused: the old one is gone.
                if let Some(mut old) = self.ifaces.remove(&s.ifindex)
                    && let Some(disruption) = old.disruption.take()
                {
                    Self::fold(&mut self.open, &old, disruption);
                }
            }
            match self.ifaces.get_mut(&s.ifindex) {
                None => {
                    self.ifaces.insert(s.ifindex, InterfaceState::new(s, now_ns));
                }
                Some(iface) => {
                    if let Some(start_ns) = iface.observe(s, now_ns, &self.config) {
                        started.push((iface.name.clone(), start_ns));
                    }
                }
            }
        }

        // Interfaces that vanished end their disruption where it was.
        let gone: Vec<u32> = self.ifaces.keys().filter(|k| !present.contains(*k)).copied().collect();
        for key in gone {
            if let Some(mut iface) = self.ifaces.remove(&key)
                && let Some(disruption) = iface.disruption.take()
            {
                Self::fold(&mut self.open, &iface, disruption);
            }
        }

        for (name, gone) in self.pod_veths.iter_mut() {
            if gone.is_none() && !present_pod_veths.contains(name.as_str()) {
                *gone = Some(now_ns);
            }
        }
        if self.open.is_none() {
            let lookback_ns = self.config.lookback.as_nanos() as u64;
            self.pod_veths.retain(|_, gone| gone.is_none_or(|at| now_ns.saturating_sub(at) <= lookback_ns));
        }

        // New disruptions join the open incident or open one.
        for (name, start_ns) in started {
            let Some(iface) = self.ifaces.values().find(|i| i.name == name) else { continue };
            let newly = self.open.is_none();
            let open = self.open.get_or_insert_with(|| {
                self.seq += 1;
                OpenIncident { seq: self.seq, start: Stamp::from_monotonic(start_ns), members: BTreeMap::new() }
            });
            if start_ns < open.start.mono_ns {
                open.start = Stamp::from_monotonic(start_ns);
            }
            let member = open.members.entry(name).or_default();
            member.pod_namespace.clone_from(&iface.pod_namespace);
            member.pod.clone_from(&iface.pod);
            if newly {
                let incident = self.render_open();
                *self.opened_by_cause.entry(incident.cause_label().to_string()).or_default() += 1;
                updates.push(IncidentUpdate::Opened(incident));
            }
        }

        // Disruptions calm for `quiet` end.
        for iface in self.ifaces.values_mut() {
            if iface.disruption.as_ref().is_some_and(|d| now_ns.saturating_sub(d.last_bad_ns) >= quiet_ns)
                && let Some(disruption) = iface.disruption.take()
            {
                Self::fold(&mut self.open, iface, disruption);
            }
        }

        // The incident closes when none of its interfaces is still disrupted.
        if self.open.is_some() && self.ifaces.values().all(|i| i.disruption.is_none()) {
            let incident = self.render_open();
            self.open = None;
            let mut incident = incident;
            incident.active = false;
            self.durations
                .entry(incident.cause_label().to_string())
                .or_insert_with(|| Histogram::new(DURATION_BUCKETS))
                .observe(incident.duration_seconds);
            self.closed.push_back(incident.clone());
            while self.closed.len() > self.config.history {
                self.closed.pop_front();
            }
            updates.push(IncidentUpdate::Closed(incident));
        }
        updates
    }

    /// Adds an ended disruption to its interface's part of the open incident.
    fn fold(open: &mut Option<OpenIncident>, iface: &InterfaceState, disruption: Disruption) {
        let Some(open) = open.as_mut() else {
            warn!(interface = iface.name, "disruption without an open incident: dropped");
            return;
        };
        let member = open.members.entry(iface.name.clone()).or_default();
        member.ended.add(&disruption.end.since(&disruption.start));
        for (direction, silent) in disruption.silent.iter().enumerate() {
            if *silent {
                member.silent.insert(DIRECTIONS[direction]);
            }
        }
        member.last_end_ns = member.last_end_ns.max(disruption.last_bad_ns);
    }

    /// The open incident as a record, as of `now_ns`.
    fn render_open(&self) -> Incident {
        let Some(open) = &self.open else { return Incident::default() };
        let mut interfaces = Vec::new();
        let mut end_ns = open.start.mono_ns;
        let mut active = false;
        for (name, member) in &open.members {
            let mut counters = member.ended.clone();
            let mut silent = member.silent.clone();
            end_ns = end_ns.max(member.last_end_ns);
            if let Some(iface) = self.ifaces.values().find(|i| &i.name == name)
                && let Some(d) = &iface.disruption
            {
                active = true;
                counters.add(&d.end.since(&d.start));
                end_ns = end_ns.max(d.last_bad_ns);
                for (direction, is_silent) in d.silent.iter().enumerate() {
                    if *is_silent {
                        silent.insert(DIRECTIONS[direction]);
                    }
                }
            }
            interfaces.push(IncidentInterface {
                interface: name.clone(),
                pod_namespace: member.pod_namespace.clone(),
                pod: member.pod.clone(),
                drops: counters.drops.values().sum(),
                drop_reasons: counters.drops,
                tcp_resets: counters.resets,
                syn_retransmits: counters.syn,
                silent_directions: silent.into_iter().map(String::from).collect(),
            });
        }
        let names: BTreeSet<String> = open.members.keys().cloned().collect();
        let lookback_ns = self.config.lookback.as_nanos() as u64;
        let candidates = self.timeline.between(open.start.mono_ns.saturating_sub(lookback_ns), end_ns);
        let causes = attribute(&candidates, open.start, &names, &self.pod_veths);
        build_incident(open.seq, open.start, end_ns, active, interfaces, causes, self.config.lookback)
    }

    /// All incidents, newest first; an open one first, with `active: true`.
    pub fn incidents(&self) -> Vec<Incident> {
        let mut all = Vec::with_capacity(self.closed.len() + 1);
        if self.open.is_some() {
            all.push(self.render_open());
        }
        all.extend(self.closed.iter().rev().cloned());
        all
    }

    pub fn active(&self) -> bool {
        self.open.is_some()
    }

    pub fn opened_by_cause(&self) -> &BTreeMap<String, u64> {
        &self.opened_by_cause
    }

    pub fn durations(&self) -> &BTreeMap<String, Histogram> {
        &self.durations
    }

    /// Closes the open incident as of now (agent shutdown), so it is not lost.
    pub fn close_now(&mut self) -> Option<Incident> {
        let disrupted: Vec<u32> = self.ifaces.iter().filter(|(_, i)| i.disruption.is_some()).map(|(k, _)| *k).collect();
        for key in disrupted {
            if let Some(iface) = self.ifaces.get_mut(&key)
                && let Some(disruption) = iface.disruption.take()
            {
                Self::fold(&mut self.open, iface, disruption);
            }
        }
        self.open.as_ref()?;
        let mut incident = self.render_open();
        self.open = None;
        incident.active = false;
        incident.message.push_str(" (the agent stopped during it)");
        self.closed.push_back(incident.clone());
        Some(incident)
    }
}

#[cfg(test)]
mod tests {
    use monitor_common::{DirectionCounters, InterfaceCounters};
    use proptest::prelude::*;

    use super::{super::detection::SECOND_NS, *};
    use crate::lifecycle::timeline::{Event, EventKind};

    const TICK_NS: u64 = 250_000_000;
    /// Synthetic monotonic time starts here (so offsets before it stay positive).
    const T0_NS: u64 = 1_000 * SECOND_NS;

    fn at(seconds: f64) -> u64 {
        T0_NS + (seconds * 1e9) as u64
    }

    fn stamp(seconds: f64) -> Stamp {
        Stamp::from_monotonic(at(seconds))
    }

    /// What one interface does per second in a time range.
    #[derive(Clone)]
    struct Rates {
        interface: &'static str,
        from: f64,
        to: f64,
        drops: u64,
        packets_in: u64,
        packets_out: u64,
    }

    struct Sim {
        engine: IncidentEngine,
        timeline: Arc<Timeline>,
        totals: BTreeMap<&'static str, (f64, f64, f64)>,
        updates: Vec<IncidentUpdate>,
    }

    impl Sim {
        fn new() -> Self {
            let timeline = Arc::new(Timeline::new(1000));
            Self {
                engine: IncidentEngine::new(EngineConfig::default(), Arc::clone(&timeline), Vec::new()),
                timeline,
                totals: BTreeMap::new(),
                updates: Vec::new(),
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
                        for r in rates.iter().filter(|r| r.interface == *name && t > r.from && t <= r.to + 1e-9) {
                            total.0 += r.drops as f64 / 4.0;
                            total.1 += r.packets_in as f64 / 4.0;
                            total.2 += r.packets_out as f64 / 4.0;
                        }
                        let mut drops = BTreeMap::new();
                        if total.0 >= 1.0 {
                            drops.insert("NO_SOCKET".to_string(), total.0 as u64);
                        }
                        InterfaceSeries {
                            interface: name.to_string(),
                            ifindex: i as u32 + 10,
                            pod_namespace: "ns".into(),
                            pod: format!("pod-{name}"),
                            counters: InterfaceCounters {
                                ingress: DirectionCounters { packets: total.1 as u64, ..Default::default() },
                                egress: DirectionCounters { packets: total.2 as u64, ..Default::default() },
                            },
                            drops,
                            removed: false,
                            is_pod_veth: true,
                        }
                    })
                    .collect();
                let now = Stamp { mono_ns: at(t), wall: stamp(t).wall };
                self.updates.extend(self.engine.observe(now, &series));
                t += TICK_NS as f64 / 1e9;
            }
        }
    }

    fn steady(interface: &'static str, to: f64) -> Rates {
        Rates { interface, from: 0.0, to, drops: 0, packets_in: 20, packets_out: 20 }
    }

    fn burst(interface: &'static str, from: f64, to: f64, drops: u64) -> Rates {
        Rates { interface, from, to, drops, packets_in: 0, packets_out: 0 }
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
        assert!((incident.duration_seconds - 9.0).abs() <= 0.5, "{}", incident.duration_seconds);
        let kinds: Vec<&str> = incident.causes.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["process_restart", "cni_default_network_missing"], "{:#?}", incident.causes);
        // The restart is timed at the exit it follows.
        assert!((incident.causes[0].offset_seconds + 2.0).abs() < 0.3, "{:?}", incident.causes[0]);
        assert!((incident.causes[1].offset_seconds + 2.9).abs() < 0.3, "{:?}", incident.causes[1]);
        assert!(incident.message.contains("began 2.") && incident.message.contains("after ovs-vswitchd went down"));
        assert!(incident.message.contains("the CNI default network config was removed"), "{}", incident.message);
        assert_eq!(incident.interfaces[0].drop_reasons["NO_SOCKET"], 360);
        let opened = sim.updates.iter().filter(|u| matches!(u, IncidentUpdate::Opened(_))).count();
        assert_eq!(opened, 1);
        assert_eq!(sim.engine.opened_by_cause().get("process_restart"), Some(&1));
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
    fn candidate_causes_rank_by_closeness() {
        let mut sim = Sim::new();
        sim.event(5.0, EventKind::ProcessRestart, "ovsdb-server", "started again");
        sim.event(9.0, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
        sim.run(&["veth0001"], &[steady("veth0001", 40.0), burst("veth0001", 10.0, 12.0, 100)], 0.0, 20.0);
        let causes = &sim.engine.incidents()[0].causes;
        let subjects: Vec<&str> = causes.iter().map(|c| c.subject.as_str()).collect();
        assert_eq!(subjects, ["ovs-vswitchd", "ovsdb-server"]);
        assert!(causes[0].confidence > causes[1].confidence);
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
        let remembered = sim.engine.pod_veths.len();
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

    #[test]
    fn steady_benign_drops_are_absorbed_by_the_baseline() {
        let mut sim = Sim::new();
        let benign = Rates { interface: "br0", from: 0.0, to: 60.0, drops: 30, packets_in: 20, packets_out: 20 };
        sim.run(&["br0"], &[benign], 0.0, 60.0);
        assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
    }

    #[test]
    fn bursty_benign_drops_at_agent_start_open_no_incident() {
        // As in the lab: one burst of 5 OTHERHOST drops per probe every second, 20/s on others.
        let mut sim = Sim::new();
        let mut rates =
            vec![Rates { interface: "veth0002", from: 0.0, to: 60.0, drops: 20, packets_in: 20, packets_out: 20 }];
        for second in 0..60 {
            let from = second as f64 + 0.5;
            rates.push(Rates {
                interface: "veth0001",
                from,
                to: from + 0.25,
                drops: 20,
                packets_in: 20,
                packets_out: 20,
            });
        }
        sim.run(&["veth0001", "veth0002"], &rates, 0.0, 60.0);
        assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
    }

    #[test]
    fn steady_traffic_that_goes_silent_is_a_disruption() {
        let mut sim = Sim::new();
        // A prober: one packet a second each way, stopped between 20 s and 25 s.
        let probe =
            |from: f64, to: f64| Rates { interface: "veth0001", from, to, drops: 0, packets_in: 1, packets_out: 1 };
        sim.event(19.5, EventKind::ProcessRestart, "ovs-vswitchd", "started again");
        sim.run(&["veth0001"], &[probe(0.0, 20.0), probe(25.0, 60.0)], 0.0, 40.0);
        let incidents = sim.engine.incidents();
        assert_eq!(incidents.len(), 1, "{incidents:#?}");
        let incident = &incidents[0];
        assert_eq!(incident.interfaces[0].silent_directions, ["egress", "ingress"]);
        assert!((incident.duration_seconds - 5.0).abs() <= 1.0, "{}", incident.duration_seconds);
        assert_eq!(incident.cause_label(), "process_restart");
        assert!(incident.message.contains("traffic stopped on veth0001"), "{}", incident.message);
    }

    #[test]
    fn an_active_incident_grows_and_closes_after_the_quiet_period() {
        let mut sim = Sim::new();
        let rates = [steady("veth0001", 60.0), burst("veth0001", 10.0, 20.0, 100)];
        sim.run(&["veth0001"], &rates, 0.0, 12.0);
        let first = sim.engine.incidents();
        assert!(first[0].active && first[0].end.is_none());
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
        let hist = &sim.engine.durations()["unattributed"];
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("d", "d", hist.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("d_count 1"), "{text}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random bursts on three interfaces, random lifecycle events.
        #[test]
        fn incidents_are_consistent(
            bursts in proptest::collection::vec((0usize..3, 6.0f64..80.0, 0.25f64..6.0, 1u64..200), 0..8),
            events in proptest::collection::vec((0.0f64..90.0, 0usize..4), 0..6),
        ) {
            let names = ["veth0001", "veth0002", "veth0003"];
            let mut sim = Sim::new();
            let kinds = [EventKind::ProcessRestart, EventKind::CniDefaultNetworkMissing, EventKind::InterfaceDown, EventKind::CniConfigChanged];
            let mut events = events;
            events.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (t, k) in &events {
                sim.event(*t, kinds[*k], "subject", "detail");
            }
            let mut rates: Vec<Rates> = names.iter().map(|n| steady(n, 100.0)).collect();
            for (i, from, len, drops) in &bursts {
                rates.push(burst(names[*i], *from, from + len, *drops));
            }
            sim.run(&names, &rates, 0.0, 100.0);
            let incidents = sim.engine.incidents();
            let mut spans: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for incident in &incidents {
                prop_assert!(incident.duration_seconds >= 0.0);
                let start: jiff::Timestamp = incident.start.parse().unwrap();
                if let Some(end) = &incident.end {
                    let end: jiff::Timestamp = end.parse().unwrap();
                    prop_assert!(end >= start);
                }
                let sum = |f: fn(&IncidentInterface) -> u64| incident.interfaces.iter().map(f).sum::<u64>();
                prop_assert_eq!(incident.totals.drops, sum(|i| i.drops));
                prop_assert_eq!(incident.totals.tcp_resets, sum(|i| i.tcp_resets));
                prop_assert_eq!(incident.totals.syn_retransmits, sum(|i| i.syn_retransmits));
                prop_assert_eq!(incident.totals.interfaces, incident.interfaces.len());
                for i in &incident.interfaces {
                    prop_assert_eq!(i.drops, i.drop_reasons.values().sum::<u64>());
                }
                prop_assert!(incident.causes.windows(2).all(|w| w[0].confidence >= w[1].confidence));
                prop_assert!(incident.causes.iter().all(|c| (0.0..=1.0).contains(&c.confidence)));
                let start_s = start.as_millisecond() as f64 / 1e3;
                for i in &incident.interfaces {
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
            // Every dropped packet inside a disruption is counted once at most.
            let dropped: u64 = incidents.iter().map(|i| i.totals.drops).sum();
            let injected: u64 = bursts.iter().map(|(_, _, len, d)| ((len * 4.0).floor() as u64 + 1) * d).sum();
            prop_assert!(dropped <= injected);
        }
    }
}
