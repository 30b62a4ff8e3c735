//! The incident engine: turns per-interface counter samples and lifecycle events into
//! incidents that say what broke, how badly, for how long, and what most likely caused it.
//!
//! Detection, per watched interface, at every sample (250 ms):
//! - **bad events** are drops + TCP resets + SYN retransmits. Their rate in 1 s buckets
//!   outside disruptions forms the interface's own baseline (median and MAD over the last
//!   `baseline_seconds`). A disruption starts when the bad events of the trailing second
//!   exceed `median + max(3·MAD, 3·√median)` by at least `floor`; it is backdated to the
//!   sample interval of the first bad event in that second.
//! - **silence**: a direction whose packets came at most 1.6 s apart for the 10 s before
//!   its last packet, and then none for `silence`, starts a disruption, backdated to that
//!   last packet.
//! - A disruption goes on while samples stay above the baseline with the trailing second
//!   at least `floor / 2` over it (or the direction stays silent), and ends `quiet` after
//!   the last such sample, at that sample: a flapping burst is one disruption.
//!   Disruptions that overlap in time form one incident.
//!
//! Attribution: see [`attribute`].

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use prometheus_client::metrics::histogram::Histogram;
use tracing::{info, warn};

use crate::{
    incidents::record::{Cause, Incident, IncidentInterface, IncidentTotals},
    lifecycle::timeline::{Event, EventKind, Stamp, Timeline, rfc3339},
    sampling::sampler::InterfaceSeries,
};

const SECOND_NS: u64 = 1_000_000_000;
/// Seconds of baseline needed before rates are judged (warm-up of a new interface).
const BASELINE_MIN: usize = 5;
/// Buckets of `datapath_incident_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0];
const DIRECTIONS: [&str; 2] = ["ingress", "egress"];

/// Detection and attribution settings (flags `--incident-*`).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Bad events in one second, above the baseline, that start a disruption.
    pub floor: u64,
    /// How long a disruption must stay calm to end (hysteresis).
    pub quiet: Duration,
    /// How long a steadily active direction must be silent to count as disrupted.
    pub silence: Duration,
    /// How far before an incident's start lifecycle events are candidate causes.
    pub lookback: Duration,
    /// Seconds of history in an interface's baseline.
    pub baseline_seconds: usize,
    /// Closed incidents kept in memory (and read back at start-up).
    pub history: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            floor: 5,
            quiet: Duration::from_secs(3),
            silence: Duration::from_secs(2),
            lookback: Duration::from_secs(30),
            baseline_seconds: 60,
            history: 1000,
        }
    }
}

/// Cumulative counters of one interface at one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counters {
    drops: BTreeMap<String, u64>,
    resets: u64,
    syn: u64,
    packets: [u64; 2],
}

impl Counters {
    fn from_series(series: &InterfaceSeries) -> Self {
        let c = &series.counters;
        Self {
            drops: series.drops.clone(),
            resets: c.ingress.tcp_resets + c.egress.tcp_resets,
            syn: c.ingress.syn_retransmits + c.egress.syn_retransmits,
            packets: [c.ingress.packets, c.egress.packets],
        }
    }

    fn bad(&self) -> u64 {
        self.drops.values().sum::<u64>() + self.resets + self.syn
    }

    /// `self - earlier`, per counter; a counter that went down (re-created map entry) counts from 0.
    fn since(&self, earlier: &Counters) -> Counters {
        let diff = |now: u64, then: u64| if now >= then { now - then } else { now };
        Counters {
            drops: self
                .drops
                .iter()
                .map(|(reason, n)| (reason.clone(), diff(*n, earlier.drops.get(reason).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect(),
            resets: diff(self.resets, earlier.resets),
            syn: diff(self.syn, earlier.syn),
            packets: [diff(self.packets[0], earlier.packets[0]), diff(self.packets[1], earlier.packets[1])],
        }
    }

    fn add(&mut self, other: &Counters) {
        for (reason, n) in &other.drops {
            *self.drops.entry(reason.clone()).or_default() += n;
        }
        self.resets += other.resets;
        self.syn += other.syn;
    }
}

/// Whether one direction of an interface carries steady traffic, and since when it is silent.
///
/// Steady: packets seen for at least `STEADY_NS`, never more than `STEADY_GAP_NS` apart
/// (at sample resolution), up to the last packet. Gaps, not per-second buckets: a 1/s
/// prober would fall in and out of buckets that drift against its ticks.
#[derive(Debug, Default)]
struct Activity {
    /// The last sample that saw packets.
    last_packet_ns: Option<u64>,
    /// Since when packets have come without a gap over `STEADY_GAP_NS`.
    steady_since: Option<u64>,
    /// Steady traffic up to the last packet.
    steady_at_last_packet: bool,
}

/// How long traffic must have been regular to count as steady.
const STEADY_NS: u64 = 10 * SECOND_NS;
/// The largest gap between packets that still counts as regular traffic.
const STEADY_GAP_NS: u64 = 1_600_000_000;

impl Activity {
    fn observe(&mut self, now_ns: u64, packets: u64) {
        if packets == 0 {
            return;
        }
        let regular = self.last_packet_ns.is_some_and(|last| now_ns.saturating_sub(last) <= STEADY_GAP_NS);
        if !regular {
            self.steady_since = Some(now_ns);
        }
        self.last_packet_ns = Some(now_ns);
        self.steady_at_last_packet = self.steady_since.is_some_and(|since| now_ns.saturating_sub(since) >= STEADY_NS);
    }

    /// Silent for at least `silence` after steady traffic: the time of the last packet.
    fn silent_since(&self, now_ns: u64, silence_ns: u64) -> Option<u64> {
        let last = self.last_packet_ns?;
        (self.steady_at_last_packet && now_ns.saturating_sub(last) >= silence_ns).then_some(last)
    }
}

#[derive(Debug)]
struct Tick {
    /// The previous sample's time: the interval (prev_ns, at_ns] holds `bad` events.
    prev_ns: u64,
    at_ns: u64,
    bad: u64,
    /// Counters at `prev_ns`.
    before: Counters,
}

#[derive(Debug)]
struct Disruption {
    last_bad_ns: u64,
    start: Counters,
    /// Counters at `last_bad_ns`.
    end: Counters,
    silent: [bool; 2],
}

#[derive(Debug)]
struct Iface {
    name: String,
    pod_namespace: String,
    pod: String,
    last: Counters,
    last_ns: u64,
    window: VecDeque<Tick>,
    baseline: VecDeque<u64>,
    bucket_start_ns: u64,
    bucket_bad: u64,
    activity: [Activity; 2],
    disruption: Option<Disruption>,
}

impl Iface {
    fn new(series: &InterfaceSeries, now_ns: u64) -> Self {
        Self {
            name: series.interface.clone(),
            pod_namespace: series.pod_namespace.clone(),
            pod: series.pod.clone(),
            last: Counters::from_series(series),
            last_ns: now_ns,
            window: VecDeque::new(),
            baseline: VecDeque::new(),
            bucket_start_ns: now_ns,
            bucket_bad: 0,
            activity: Default::default(),
            disruption: None,
        }
    }

    /// Median and MAD of the baseline buckets (bad events per second).
    fn baseline(&self) -> (f64, f64) {
        if self.baseline.is_empty() {
            return (0.0, 0.0);
        }
        let median = median_f(self.baseline.iter().map(|v| *v as f64).collect());
        let mad = median_f(self.baseline.iter().map(|v| (*v as f64 - median).abs()).collect());
        (median, mad)
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
    ifaces: HashMap<u32, Iface>,
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
        let (quiet_ns, silence_ns) = (self.config.quiet.as_nanos() as u64, self.config.silence.as_nanos() as u64);
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
            let Some(iface) = self.ifaces.get_mut(&s.ifindex) else {
                self.ifaces.insert(s.ifindex, Iface::new(s, now_ns));
                continue;
            };
            if now_ns <= iface.last_ns {
                continue;
            }
            iface.pod_namespace.clone_from(&s.pod_namespace);
            iface.pod.clone_from(&s.pod);
            let current = Counters::from_series(s);
            let delta = current.since(&iface.last);
            let dt_s = (now_ns - iface.last_ns) as f64 / 1e9;
            let bad = delta.bad();
            let before = std::mem::replace(&mut iface.last, current.clone());
            iface.window.push_back(Tick { prev_ns: iface.last_ns, at_ns: now_ns, bad, before });
            iface.last_ns = now_ns;
            while iface.window.front().is_some_and(|t| t.at_ns + SECOND_NS <= now_ns) {
                iface.window.pop_front();
            }
            for (direction, activity) in iface.activity.iter_mut().enumerate() {
                activity.observe(now_ns, delta.packets[direction]);
            }

            // Counts are noisy like Poisson counts: the spread is at least √median.
            let (median, mad) = iface.baseline();
            let expected_per_s = median + (3.0 * mad).max(3.0 * median.sqrt());
            let window_bad: u64 = iface.window.iter().map(|t| t.bad).sum();
            let window_excess = window_bad as f64 - expected_per_s;
            let tick_above = bad > 0 && bad as f64 > expected_per_s * dt_s;
            let silent: [Option<u64>; 2] = [
                iface.activity[0].silent_since(now_ns, silence_ns),
                iface.activity[1].silent_since(now_ns, silence_ns),
            ];

            match &mut iface.disruption {
                None => {
                    // Rates are judged once the baseline is warm: steady benign drops at start-up are no incident.
                    let warm = iface.baseline.len() >= BASELINE_MIN;
                    let first_bad = iface.window.iter().find(|t| t.bad > 0);
                    let by_rate =
                        if warm && window_excess >= self.config.floor.max(1) as f64 { first_bad } else { None };
                    let silent_since = silent.iter().flatten().min().copied();
                    if by_rate.is_some() || silent_since.is_some() {
                        let (start_ns, start_counters) = match by_rate {
                            Some(first) => (first.prev_ns, first.before.clone()),
                            None => (silent_since.unwrap_or(now_ns), current.clone()),
                        };
                        iface.disruption = Some(Disruption {
                            last_bad_ns: now_ns,
                            start: start_counters,
                            end: current.clone(),
                            silent: [silent[0].is_some(), silent[1].is_some()],
                        });
                        started.push((iface.name.clone(), start_ns));
                    }
                }
                Some(disruption) => {
                    // Goes on while this sample is above the baseline and the trailing second
                    // still clearly is: benign traffic around its baseline lets it end.
                    if tick_above && window_excess >= (self.config.floor as f64 / 2.0).max(1.0) {
                        disruption.last_bad_ns = now_ns;
                        disruption.end = current.clone();
                    }
                    for (was_silent, silent_now) in disruption.silent.iter_mut().zip(&silent) {
                        if silent_now.is_some() {
                            *was_silent = true;
                            disruption.last_bad_ns = now_ns;
                        }
                    }
                }
            }

            // Baseline: only calm seconds count.
            if iface.disruption.is_some() {
                iface.bucket_bad = 0;
                iface.bucket_start_ns = now_ns;
            } else {
                iface.bucket_bad += bad;
                if now_ns - iface.bucket_start_ns >= SECOND_NS {
                    let seconds = (now_ns - iface.bucket_start_ns) as f64 / 1e9;
                    iface.baseline.push_back((iface.bucket_bad as f64 / seconds).round() as u64);
                    if iface.baseline.len() > self.config.baseline_seconds.max(BASELINE_MIN) {
                        iface.baseline.pop_front();
                    }
                    iface.bucket_bad = 0;
                    iface.bucket_start_ns = now_ns;
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
    fn fold(open: &mut Option<OpenIncident>, iface: &Iface, disruption: Disruption) {
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

fn build_incident(
    seq: u64,
    start: Stamp,
    end_ns: u64,
    active: bool,
    interfaces: Vec<IncidentInterface>,
    causes: Vec<Cause>,
    lookback: Duration,
) -> Incident {
    let end = Stamp::from_monotonic(end_ns.max(start.mono_ns));
    let duration_seconds = round(start.seconds_until(&end), 1_000.0);
    let totals = IncidentTotals {
        drops: interfaces.iter().map(|i| i.drops).sum(),
        tcp_resets: interfaces.iter().map(|i| i.tcp_resets).sum(),
        syn_retransmits: interfaces.iter().map(|i| i.syn_retransmits).sum(),
        interfaces: interfaces.len(),
    };
    let start_text = rfc3339(start.wall);
    let mut incident = Incident {
        id: format!("{start_text}-{seq}"),
        start: start_text,
        end: (!active).then(|| rfc3339(end.wall)),
        active,
        duration_seconds,
        totals,
        interfaces,
        causes,
        message: String::new(),
    };
    incident.message = message(&incident, lookback);
    incident
}

fn round(value: f64, scale: f64) -> f64 {
    (value * scale).round() / scale
}

/// How likely each kind of event is to break pod traffic.
pub fn kind_weight(kind: EventKind) -> f64 {
    match kind {
        EventKind::ProcessRestart | EventKind::ProcessExit => 1.0,
        EventKind::CniDefaultNetworkMissing => 0.9,
        EventKind::InterfaceDown | EventKind::InterfaceRemoved => 0.8,
        EventKind::CniConfigRemoved => 0.7,
        EventKind::CniConfigChanged | EventKind::CniConfigInvalid => 0.6,
        EventKind::ProcessStart => 0.5,
        EventKind::CniConfigAdded | EventKind::InterfaceAdded => 0.3,
        EventKind::InterfaceUp => 0.2,
        EventKind::CniDefaultNetworkRestored => 0.1,
    }
}

/// Events up to this long after the detected start count as at the start: the start is only
/// as precise as the sample interval, and a silence starts at the last packet seen.
const AT_START_SECONDS: f64 = 1.0;

/// Seconds over which closeness in time decays by a factor e.
const CLOSENESS_SECONDS: f64 = 10.0;

/// Ranks lifecycle events as causes of an incident that started at `start`.
///
/// Candidates are the events from `lookback` before the start until the end (the caller
/// passes those), except states found at agent start-up (those are not changes) and a
/// daemon's parent exiting after its fork (the daemon carries on). Interface events count only for the incident's own interfaces and for
/// non-pod interfaces (bridges, tunnels), not for other pods' veths. For each subject only
/// its strongest event is kept, and a process restart stands for the exit and start it
/// pairs (one cause, timed at the exit: when the process went down).
/// `confidence = kind weight × closeness`, where closeness is `e^(−|offset|/10 s)` for an
/// event up to 1 s after the start or any time before it, and `0.5 × e^(−offset/10 s)` later
/// (an event well into the disruption is more likely a consequence or a fix). Sorted by confidence, then
/// closeness. No candidate → empty: a cause is never invented.
pub fn attribute(
    events: &[Event],
    start: Stamp,
    incident_interfaces: &BTreeSet<String>,
    pod_veths: &HashMap<String, Option<u64>>,
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
        let family = match event.kind {
            EventKind::ProcessStart | EventKind::ProcessExit | EventKind::ProcessRestart => 0,
            EventKind::InterfaceAdded
            | EventKind::InterfaceRemoved
            | EventKind::InterfaceUp
            | EventKind::InterfaceDown => {
                if pod_veths.contains_key(&event.subject) && !incident_interfaces.contains(&event.subject) {
                    continue;
                }
                1
            }
            _ => 2,
        };
        let offset = start.seconds_until(&stamp);
        let closeness = if offset <= AT_START_SECONDS {
            (-offset.abs() / CLOSENESS_SECONDS).exp()
        } else {
            0.5 * (-offset / CLOSENESS_SECONDS).exp()
        };
        let cause = Cause {
            kind: event.kind.as_str().to_string(),
            subject: event.subject.clone(),
            at: rfc3339(stamp.wall),
            offset_seconds: round(offset, 1_000.0),
            confidence: round(kind_weight(event.kind) * closeness, 100.0),
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

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// "ovs-vswitchd restarted", "the CNI default network config was removed", ...
fn phrase(cause: &Cause) -> String {
    let s = cause.subject.as_str();
    match cause.kind.as_str() {
        "process_restart" => format!("{s} went down for a restart"),
        "process_exit" => format!("{s} exited"),
        "process_start" => format!("{s} started"),
        "cni_default_network_missing" => "the CNI default network config was removed".into(),
        "cni_default_network_restored" => "the CNI default network came back".into(),
        "cni_config_removed" => format!("CNI config {} was removed", basename(s)),
        "cni_config_changed" => format!("CNI config {} changed", basename(s)),
        "cni_config_invalid" => format!("CNI config {} became invalid", basename(s)),
        "cni_config_added" => format!("CNI config {} was added", basename(s)),
        "interface_down" => format!("{s} went down"),
        "interface_up" => format!("{s} came up"),
        "interface_removed" => format!("{s} was removed"),
        "interface_added" => format!("{s} appeared"),
        other => format!("{other} {s}"),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// "9.4 s pod-network disruption on 14 interfaces (4,210 drops, 37 SYN retransmits, 3
/// resets), began 1.1 s after ovs-vswitchd restarted and 2.9 s after ..."
fn message(incident: &Incident, lookback: Duration) -> String {
    let t = &incident.totals;
    let mut text = format!(
        "{}{:.1} s pod-network disruption on {} ({}, {}, {}",
        if incident.active { "ongoing: " } else { "" },
        incident.duration_seconds,
        plural(t.interfaces as u64, "interface", "interfaces"),
        plural(t.drops, "drop", "drops"),
        plural(t.syn_retransmits, "SYN retransmit", "SYN retransmits"),
        plural(t.tcp_resets, "reset", "resets"),
    );
    let silent: Vec<String> = incident
        .interfaces
        .iter()
        .flat_map(|i| i.silent_directions.iter().map(move |d| format!("{} {d}", i.interface)))
        .collect();
    if !silent.is_empty() {
        text.push_str(&format!("; traffic stopped on {}", silent.join(", ")));
    }
    text.push(')');
    if incident.causes.is_empty() {
        text.push_str(&format!(
            ", unattributed: no lifecycle event from {} s before it began until it ended",
            lookback.as_secs()
        ));
        return text;
    }
    let parts: Vec<String> = incident
        .causes
        .iter()
        .take(2)
        .map(|c| {
            if c.offset_seconds <= 0.0 {
                format!("{:.1} s after {}", -c.offset_seconds, phrase(c))
            } else {
                format!("{:.1} s before {}", c.offset_seconds, phrase(c))
            }
        })
        .collect();
    text.push_str(&format!(", began {}", parts.join(" and ")));
    text
}

/// Logs an update as one line.
pub fn log_update(update: &IncidentUpdate) {
    match update {
        IncidentUpdate::Opened(i) => {
            info!(
                id = i.id,
                interfaces = i.totals.interfaces,
                cause = i.cause_label(),
                "incident opened: {}",
                i.message
            )
        }
        IncidentUpdate::Closed(i) => info!(
            id = i.id,
            duration_seconds = i.duration_seconds,
            drops = i.totals.drops,
            cause = i.cause_label(),
            "incident closed: {}",
            i.message
        ),
    }
}

#[cfg(test)]
mod tests {
    use monitor_common::{DirectionCounters, InterfaceCounters};
    use proptest::prelude::*;

    use super::*;

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

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(4210), "4,210");
        assert_eq!(thousands(1_234_567), "1,234,567");
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

/// The engine shared by the sampler task (writer), the API and scrapes.
pub type SharedEngine = Arc<std::sync::Mutex<IncidentEngine>>;

/// `datapath_incidents_total`, `datapath_incident_active`, `datapath_incident_duration_seconds`.
#[derive(Clone)]
pub struct IncidentCollector(pub SharedEngine);

impl std::fmt::Debug for IncidentCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IncidentCollector")
    }
}

impl prometheus_client::collector::Collector for IncidentCollector {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::export::metrics::{Labels, counter, family, gauge};
        let (opened, active, durations) = {
            let engine = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            (engine.opened_by_cause().clone(), engine.active(), engine.durations().clone())
        };
        counter(
            &mut encoder,
            "datapath_incidents",
            "Incidents opened since the agent started, by top cause kind when opened (or unattributed).",
            opened.iter().map(|(cause, n)| {
                let labels: Labels = vec![("cause", cause.as_str())];
                (labels, *n)
            }),
        )?;
        gauge(
            &mut encoder,
            "datapath_incident_active",
            "1 while a pod-network disruption is in progress.",
            std::iter::once((Labels::new(), i64::from(active))),
        )?;
        family(
            &mut encoder,
            "datapath_incident_duration_seconds",
            "Durations of closed incidents, by top cause kind.",
            prometheus_client::metrics::MetricType::Histogram,
            durations.iter().map(|(cause, histogram)| {
                let labels: Labels = vec![("cause", cause.as_str())];
                (labels, histogram.clone())
            }),
        )
    }
}
