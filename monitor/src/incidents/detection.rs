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
//!   the last such sample, at that sample: a flapping burst is one disruption (the engine
//!   ends it; see [`super::engine`]).

use std::collections::{BTreeMap, VecDeque};

use super::EngineConfig;
use crate::sampling::sampler::InterfaceSeries;

pub(super) const SECOND_NS: u64 = 1_000_000_000;
/// Seconds of baseline needed before rates are judged (warm-up of a new interface).
const BASELINE_MIN: usize = 5;
/// The directions of an interface's counters, in their index order.
pub(super) const DIRECTIONS: [&str; 2] = ["ingress", "egress"];

/// Cumulative counters of one interface at one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) drops: BTreeMap<String, u64>,
    pub(super) resets: u64,
    pub(super) syn: u64,
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
    pub(super) fn since(&self, earlier: &Counters) -> Counters {
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

    pub(super) fn add(&mut self, other: &Counters) {
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

/// One sample interval of an interface, in its trailing second.
#[derive(Debug)]
struct SampleInterval {
    /// The previous sample's time: the interval (prev_ns, at_ns] holds `bad` events.
    prev_ns: u64,
    at_ns: u64,
    bad: u64,
    /// Counters at `prev_ns`.
    before: Counters,
}

/// A disruption of one interface, going on.
#[derive(Debug)]
pub(super) struct Disruption {
    pub(super) last_bad_ns: u64,
    pub(super) start: Counters,
    /// Counters at `last_bad_ns`.
    pub(super) end: Counters,
    pub(super) silent: [bool; 2],
}

/// What detection knows of one watched interface.
#[derive(Debug)]
pub(super) struct InterfaceState {
    pub(super) name: String,
    pub(super) pod_namespace: String,
    pub(super) pod: String,
    last: Counters,
    last_ns: u64,
    window: VecDeque<SampleInterval>,
    baseline: VecDeque<u64>,
    bucket_start_ns: u64,
    bucket_bad: u64,
    activity: [Activity; 2],
    pub(super) disruption: Option<Disruption>,
}

impl InterfaceState {
    pub(super) fn new(series: &InterfaceSeries, now_ns: u64) -> Self {
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

    /// Takes one sample of this interface's cumulative counters at `now_ns`: updates the
    /// trailing second, the activity of each direction and the baseline, and goes on with,
    /// or starts, its disruption. Returns the start of a disruption that starts now.
    pub(super) fn observe(&mut self, series: &InterfaceSeries, now_ns: u64, config: &EngineConfig) -> Option<u64> {
        if now_ns <= self.last_ns {
            return None;
        }
        let silence_ns = config.silence.as_nanos() as u64;
        let mut started = None;
        self.pod_namespace.clone_from(&series.pod_namespace);
        self.pod.clone_from(&series.pod);
        let current = Counters::from_series(series);
        let delta = current.since(&self.last);
        let dt_s = (now_ns - self.last_ns) as f64 / 1e9;
        let bad = delta.bad();
        let before = std::mem::replace(&mut self.last, current.clone());
        self.window.push_back(SampleInterval { prev_ns: self.last_ns, at_ns: now_ns, bad, before });
        self.last_ns = now_ns;
        while self.window.front().is_some_and(|t| t.at_ns + SECOND_NS <= now_ns) {
            self.window.pop_front();
        }
        for (direction, activity) in self.activity.iter_mut().enumerate() {
            activity.observe(now_ns, delta.packets[direction]);
        }

        // Counts are noisy like Poisson counts: the spread is at least √median.
        let (median, mad) = self.baseline();
        let expected_per_s = median + (3.0 * mad).max(3.0 * median.sqrt());
        let window_bad: u64 = self.window.iter().map(|t| t.bad).sum();
        let window_excess = window_bad as f64 - expected_per_s;
        let sample_above = bad > 0 && bad as f64 > expected_per_s * dt_s;
        let silent: [Option<u64>; 2] =
            [self.activity[0].silent_since(now_ns, silence_ns), self.activity[1].silent_since(now_ns, silence_ns)];

        match &mut self.disruption {
            None => {
                // Rates are judged once the baseline is warm: steady benign drops at start-up are no incident.
                let warm = self.baseline.len() >= BASELINE_MIN;
                let first_bad = self.window.iter().find(|t| t.bad > 0);
                let by_rate = if warm && window_excess >= config.floor.max(1) as f64 { first_bad } else { None };
                let silent_since = silent.iter().flatten().min().copied();
                if by_rate.is_some() || silent_since.is_some() {
                    let (start_ns, start_counters) = match by_rate {
                        Some(first) => (first.prev_ns, first.before.clone()),
                        None => (silent_since.unwrap_or(now_ns), current.clone()),
                    };
                    self.disruption = Some(Disruption {
                        last_bad_ns: now_ns,
                        start: start_counters,
                        end: current.clone(),
                        silent: [silent[0].is_some(), silent[1].is_some()],
                    });
                    started = Some(start_ns);
                }
            }
            Some(disruption) => {
                // Goes on while this sample is above the baseline and the trailing second
                // still clearly is: benign traffic around its baseline lets it end.
                if sample_above && window_excess >= (config.floor as f64 / 2.0).max(1.0) {
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
        if self.disruption.is_some() {
            self.bucket_bad = 0;
            self.bucket_start_ns = now_ns;
        } else {
            self.bucket_bad += bad;
            if now_ns - self.bucket_start_ns >= SECOND_NS {
                let seconds = (now_ns - self.bucket_start_ns) as f64 / 1e9;
                self.baseline.push_back((self.bucket_bad as f64 / seconds).round() as u64);
                if self.baseline.len() > config.baseline_seconds.max(BASELINE_MIN) {
                    self.baseline.pop_front();
                }
                self.bucket_bad = 0;
                self.bucket_start_ns = now_ns;
            }
        }
        started
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
