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
    attribution::{Scope, attribute},
    detection::{Counters, DIRECTIONS, Disruption, Evidence, InterfaceState, SECOND_NS},
    message::{Span, build_incident},
    record::{Incident, IncidentInterface},
};
use crate::{
    lifecycle::{
        clock::{Stamp, rfc3339},
        timeline::Timeline,
    },
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
    lost: Evidence,
    /// Directions that fell silent during the incident (listed, never evidence).
    silent: BTreeSet<&'static str>,
    last_end_ns: u64,
}

#[derive(Debug)]
struct OpenIncident {
    seq: u64,
    start: Stamp,
    detected: Stamp,
    members: BTreeMap<String, Member>,
    close_reason: Option<String>,
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
    /// `datapath_incidents_total{cause}`, counted when an incident ends (its final top cause).
    ended_by_cause: BTreeMap<String, u64>,
    /// `datapath_incident_lost_packets_total{cause}`.
    lost_by_cause: BTreeMap<String, u64>,
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
            ended_by_cause: BTreeMap::new(),
            lost_by_cause: BTreeMap::new(),
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
                    iface.is_pod_veth = s.is_pod_veth;
                    if let Some(start_ns) = iface.observe(s, now_ns, &self.config, self.open.is_some()) {
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
                OpenIncident {
                    seq: self.seq,
                    start: Stamp::from_monotonic(start_ns),
                    detected: now,
                    members: BTreeMap::new(),
                    close_reason: None,
                }
            });
            if start_ns < open.start.mono_ns {
                open.start = Stamp::from_monotonic(start_ns);
            }
            let member = open.members.entry(name).or_default();
            member.pod_namespace.clone_from(&iface.pod_namespace);
            member.pod.clone_from(&iface.pod);
            if newly {
                updates.push(IncidentUpdate::Opened(self.render_open()));
            }
        }

        // Interfaces whose busy traffic stopped since just before the incident began are
        // part of it: listed as silent, never evidence of their own.
        if let Some(open) = &mut self.open {
            let since_ns = open.start.mono_ns.saturating_sub(SECOND_NS);
            for iface in self.ifaces.values() {
                let silent = iface.silent_since(now_ns, since_ns);
                if silent.iter().any(|s| *s) {
                    let member = open.members.entry(iface.name.clone()).or_default();
                    member.pod_namespace.clone_from(&iface.pod_namespace);
                    member.pod.clone_from(&iface.pod);
                    for (direction, is_silent) in silent.iter().enumerate() {
                        if *is_silent {
                            member.silent.insert(DIRECTIONS[direction]);
                        }
                    }
                }
            }
        }

        // The cap: an incident still going after `max_duration` ends, and the loss rate of its
        // interfaces becomes their baseline.
        let max_ns = self.config.max_duration.as_nanos() as u64;
        if let Some(open) = &mut self.open
            && now_ns.saturating_sub(open.start.mono_ns) >= max_ns
        {
            let mut capped = Vec::new();
            for iface in self.ifaces.values_mut() {
                if let Some(disruption) = iface.disruption.take() {
                    iface.adopt_baseline();
                    capped.push(iface.name.clone());
                    Self::fold_into(open, iface, disruption);
                }
            }
            open.close_reason = Some(format!(
                "closed at the {} s cap with loss still going on; its rate is now the baseline of {}",
                self.config.max_duration.as_secs(),
                capped.join(", ")
            ));
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
            self.count_ended(&incident);
            self.closed.push_back(incident.clone());
            while self.closed.len() > self.config.history {
                self.closed.pop_front();
            }
            updates.push(IncidentUpdate::Closed(incident));
        }
        updates
    }

    /// The metrics of an incident that ended, by its final top cause.
    fn count_ended(&mut self, incident: &Incident) {
        let cause = incident.cause_label().to_string();
        *self.ended_by_cause.entry(cause.clone()).or_default() += 1;
        *self.lost_by_cause.entry(cause.clone()).or_default() += incident.totals.lost_packets;
        self.durations
            .entry(cause)
            .or_insert_with(|| Histogram::new(DURATION_BUCKETS))
            .observe(incident.duration_seconds);
    }

    /// Adds an ended disruption to its interface's part of the open incident.
    fn fold(open: &mut Option<OpenIncident>, iface: &InterfaceState, disruption: Disruption) {
        let Some(open) = open.as_mut() else {
            warn!(interface = iface.name, "disruption without an open incident: dropped");
            return;
        };
        Self::fold_into(open, iface, disruption);
    }

    fn fold_into(open: &mut OpenIncident, iface: &InterfaceState, disruption: Disruption) {
        let offset = |ns: u64| (ns as f64 - open.start.mono_ns as f64) / 1e9;
        tracing::debug!(
            interface = iface.name,
            last_evidence_s = offset(disruption.last_evidence_ns),
            last_bad_s = offset(disruption.last_bad_ns),
            lost = ?disruption.lost,
            "disruption ended (seconds from the incident's start)"
        );
        let member = open.members.entry(iface.name.clone()).or_default();
        member.ended.add(&disruption.end.since(&disruption.start));
        member.lost.add(&disruption.lost);
        member.last_end_ns = member.last_end_ns.max(disruption.last_evidence_ns);
    }

    /// The open incident as a record, as of `now_ns`.
    fn render_open(&self) -> Incident {
        let Some(open) = &self.open else { return Incident::default() };
        let mut interfaces = Vec::new();
        let mut end_ns = open.start.mono_ns;
        let mut active = false;
        let mut pod_veths = 0;
        let mut other_interfaces = 0;
        let mut evidence = Vec::with_capacity(open.members.len());
        for (name, member) in &open.members {
            let mut counters = member.ended.clone();
            let mut lost = member.lost.clone();
            end_ns = end_ns.max(member.last_end_ns);
            let iface = self.ifaces.values().find(|i| &i.name == name);
            if let Some(d) = iface.and_then(|i| i.disruption.as_ref()) {
                active = true;
                counters.add(&d.end.since(&d.start));
                lost.add(&d.lost);
                end_ns = end_ns.max(d.last_evidence_ns);
            }
            if iface.is_none_or(|i| i.is_pod_veth) {
                pod_veths += 1;
            } else {
                other_interfaces += 1;
            }
            interfaces.push(IncidentInterface {
                interface: name.clone(),
                pod_namespace: member.pod_namespace.clone(),
                pod: member.pod.clone(),
                drops: counters.drops.values().sum(),
                drop_reasons: counters.drops,
                tcp_resets: counters.resets,
                syn_retransmits: counters.syn,
                silent_directions: member.silent.iter().map(|d| d.to_string()).collect(),
                lost_packets: lost.lost.packets(),
                lost: lost.lost.clone(),
            });
            evidence.push(lost);
        }
        let names: BTreeSet<String> = open.members.keys().cloned().collect();
        let lookback_ns = self.config.lookback.as_nanos() as u64;
        let candidates = self.timeline.between(open.start.mono_ns.saturating_sub(lookback_ns), end_ns);
        // Node-wide: a bridge or tunnel port, or more than one pod, lost packets.
        let scope = if other_interfaces > 0 || pod_veths > 1 { Scope::NodeWide } else { Scope::OnePod };
        let causes = attribute(&candidates, open.start, &names, &self.pod_veths, scope);
        let lost = Evidence::total(evidence.iter());
        let span = Span { seq: open.seq, start: open.start, end_ns, active };
        let mut incident = build_incident(span, interfaces, lost, causes, self.config.lookback);
        incident.detected_at = rfc3339(open.detected.wall);
        incident.close_reason.clone_from(&open.close_reason);
        incident
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

    /// One page of [`Self::incidents`]: at most `limit` incidents older than the one with id
    /// `before` (from the newest when None), and the id to ask `before` next when more remain.
    /// An unknown `before` (evicted from the history) gives an empty page.
    pub fn incidents_page(&self, before: Option<&str>, limit: usize) -> (Vec<Incident>, Option<String>) {
        let open = self.open.as_ref().map(|_| self.render_open());
        let all = open.iter().chain(self.closed.iter().rev());
        let mut page: Vec<Incident> = match before {
            None => all.take(limit.saturating_add(1)).cloned().collect(),
            Some(before) => all.skip_while(|i| i.id != before).skip(1).take(limit.saturating_add(1)).cloned().collect(),
        };
        let next = (page.len() > limit).then(|| {
            page.truncate(limit);
            page.last().map(|i| i.id.clone()).unwrap_or_default()
        });
        (page, next)
    }

    pub fn active(&self) -> bool {
        self.open.is_some()
    }

    /// The incident in progress, as `/api/v1/incidents` shows it.
    pub fn open_incident(&self) -> Option<Incident> {
        self.open.as_ref().map(|_| self.render_open())
    }

    /// Pod veth names remembered for attribution (tests of their forgetting).
    #[cfg(test)]
    pub(super) fn remembered_pod_veths(&self) -> usize {
        self.pod_veths.len()
    }

    /// Incidents ended, by final top cause.
    pub fn ended_by_cause(&self) -> &BTreeMap<String, u64> {
        &self.ended_by_cause
    }

    /// Packets lost in ended incidents, by final top cause.
    pub fn lost_by_cause(&self) -> &BTreeMap<String, u64> {
        &self.lost_by_cause
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
        incident.close_reason = Some("the agent stopped during it".to_string());
        incident.message.push_str(" (the agent stopped during it)");
        self.count_ended(&incident);
        self.closed.push_back(incident.clone());
        Some(incident)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_from_the_newest_to_the_oldest_each_incident_once() {
        let past: Vec<Incident> = (1..=5).map(|n| Incident { id: format!("i{n}"), ..Incident::default() }).collect();
        let engine = IncidentEngine::new(EngineConfig::default(), Arc::new(Timeline::new(10)), past);
        let ids = |page: &[Incident]| page.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(",");
        let (first, next) = engine.incidents_page(None, 2);
        assert_eq!((ids(&first).as_str(), next.as_deref()), ("i5,i4", Some("i4")));
        let (second, next) = engine.incidents_page(Some("i4"), 2);
        assert_eq!((ids(&second).as_str(), next.as_deref()), ("i3,i2", Some("i2")));
        let (last, next) = engine.incidents_page(Some("i2"), 2);
        assert_eq!((ids(&last).as_str(), next), ("i1", None));
        // Exactly one page's worth: no next page.
        assert_eq!(engine.incidents_page(None, 5).1, None);
        // An id no longer kept: nothing older can be told.
        assert!(engine.incidents_page(Some("gone"), 2).0.is_empty());
    }
}
