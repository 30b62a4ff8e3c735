//! `cargo xtask eval`: how well the monitor detects, measured on the lab against the lab's own
//! ground truth (which the agent never sees): every scenario N times, each with a fresh agent,
//! then a soak of natural traffic with no fault. Writes EVALUATION.md at the repository root and
//! the raw runs to target/eval/results.json.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use dm_lab::{
    Lab, LossWindow, NODE_NETNS, Outage, Scenario, ScenarioReport,
    probe_log::{self, UdpSecond, seconds_between},
    soak,
};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use crate::{
    build,
    command::{self, Workspace},
    lab::{AGENT_LISTEN, LabAgent, require_root},
    setup,
};

/// `cargo xtask eval` options.
pub struct EvalOptions {
    /// Runs per scenario.
    pub repeat: u32,
    /// Minutes of natural-traffic soak.
    pub soak_minutes: f64,
    /// Only these scenarios (comma-separated names); all when None.
    pub scenarios: Option<String>,
    /// Skip the soak.
    pub no_soak: bool,
}

/// Seconds a run waits after the agent is ready before disrupting: cold (odd repeats) and warm.
const COLD_WAIT: Duration = Duration::from_secs(2);
const WARM_WAIT: Duration = Duration::from_secs(12);
/// After the scenario: wait for every incident to close, at most this long ...
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// ... or this long when no incident appeared at all.
const NO_INCIDENT_WAIT: Duration = Duration::from_secs(8);
/// How often the incidents are polled.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// An incident matches a run when it overlaps the scenario widened by this much each side.
const MATCH_SLACK_SECONDS: f64 = 1.0;

/// The goals the summary judges against.
const GOAL_RECALL: f64 = 1.0;
const GOAL_TOP1: f64 = 0.95;
const GOAL_DURATION_ERROR: f64 = 1.0;
const GOAL_LATENCY: f64 = 1.0;

// ---------------------------------------------------------------------------------------------
// What the agent reports.

/// An incident as read from `/api/v1/incidents` (fields missing in older agents default).
#[derive(Clone, Debug, PartialEq)]
pub struct IncidentView {
    pub id: String,
    pub start: Timestamp,
    pub end: Option<Timestamp>,
    pub active: bool,
    pub duration_seconds: f64,
    /// (kind, subject), strongest first.
    pub causes: Vec<(String, String)>,
    /// `totals.lost_packets`; None when the agent does not report it.
    pub lost_packets: Option<u64>,
}

impl IncidentView {
    /// Reads one incident; None when it has no id or no parsable start.
    pub fn from_json(value: &Value) -> Option<Self> {
        let id = value["id"].as_str()?.to_string();
        let start: Timestamp = value["start"].as_str()?.parse().ok()?;
        let end = value["end"].as_str().and_then(|end| end.parse().ok());
        let causes = value["causes"]
            .as_array()
            .map(|causes| {
                causes
                    .iter()
                    .map(|cause| {
                        (
                            cause["kind"].as_str().unwrap_or("").to_string(),
                            cause["subject"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(IncidentView {
            id,
            start,
            end,
            active: value["active"].as_bool().unwrap_or(end.is_none()),
            duration_seconds: value["duration_seconds"].as_f64().unwrap_or(0.0),
            causes,
            lost_packets: value["totals"]["lost_packets"].as_u64(),
        })
    }

    /// The end, or for an incident still open, its start plus its duration so far.
    pub fn end_or_now(&self) -> Timestamp {
        self.end.unwrap_or_else(|| {
            self.start.checked_add(SignedDuration::from_secs_f64(self.duration_seconds)).unwrap_or(self.start)
        })
    }

    /// Whether `[start, end]` overlaps `[from, until]`.
    pub fn overlaps(&self, from: Timestamp, until: Timestamp) -> bool {
        self.start <= until && self.end_or_now() >= from
    }

    /// `kind subject` of the top cause, or `unattributed`.
    pub fn top_cause(&self) -> String {
        match self.causes.first() {
            Some((kind, subject)) => format!("{kind} {subject}"),
            None => "unattributed".to_string(),
        }
    }
}

/// An incident and when the poller first saw it.
#[derive(Clone, Debug)]
pub struct SeenIncident {
    pub view: IncidentView,
    pub first_seen: Timestamp,
    /// The agent's JSON, last seen (for results.json).
    pub raw: Value,
}

// ---------------------------------------------------------------------------------------------
// Expectations and per-run assessment.

/// What a scenario should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// One incident whose top cause is (kind, subject); None: no cause (`unattributed`).
    Incident(Option<(&'static str, &'static str)>),
    /// No incident at all.
    Nothing,
}

/// The expectation for `scenario`.
pub fn expected(scenario: Scenario) -> Expected {
    match scenario {
        Scenario::SdnUpgrade | Scenario::OvsRestart => Expected::Incident(Some(("process_restart", "ovs-vswitchd"))),
        Scenario::FlowFlush => Expected::Incident(Some(("process_restart", "openshift-sdn-n"))),
        Scenario::SilentDrop => Expected::Incident(None),
        Scenario::CniFlap | Scenario::BenignRestart => Expected::Nothing,
    }
}

/// How [`Expected`] reads in a report.
pub fn expected_text(expected: Expected) -> String {
    match expected {
        Expected::Incident(Some((kind, subject))) => format!("incident, {kind} {subject}"),
        Expected::Incident(None) => "incident, unattributed".to_string(),
        Expected::Nothing => "no incident".to_string(),
    }
}

/// One run of one scenario: what the lab did and saw, and what the agent reported.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub scenario: Scenario,
    /// 1-based.
    pub repeat: u32,
    /// Disrupted 2 s after the agent was ready (else 12 s).
    pub cold: bool,
    pub agent_ready: Timestamp,
    pub started: Timestamp,
    pub finished: Timestamp,
    pub outage: Option<Outage>,
    pub udp_loss: Option<LossWindow>,
    pub udp_sent: u64,
    pub udp_received: u64,
    pub incidents: Vec<SeenIncident>,
    pub report: Value,
}

/// The figures of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assessment {
    pub expects_incident: bool,
    /// Index into the run's incidents of the one matching the scenario.
    pub matched: Option<usize>,
    /// Incidents that should not be there.
    pub false_incidents: usize,
    /// Top cause as expected (runs expecting an incident only).
    pub top1_correct: Option<bool>,
    /// Incident start − first failed probe (s).
    pub onset_error_prober: Option<f64>,
    /// Incident duration − prober outage (s).
    pub duration_error_prober: Option<f64>,
    /// Incident start − first lost datagram's send time (s).
    pub onset_error_udp: Option<f64>,
    /// Incident duration − (last − first lost datagram's send time) (s).
    pub duration_error_udp: Option<f64>,
    /// First seen − first loss (s).
    pub latency: Option<f64>,
    /// `lost_packets` of the matched incident (None: none matched or not reported).
    pub lost_reported: Option<u64>,
    /// UDP datagrams lost + failed probes.
    pub lost_truth: u64,
}

/// When the run first lost something: the earliest of the first failed probe and the first
/// lost datagram.
pub fn first_lost(outage: Option<&Outage>, udp: Option<&LossWindow>) -> Option<Timestamp> {
    match (outage.map(|o| o.first_failure), udp.map(|u| u.first_lost)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn widen(at: Timestamp, seconds: f64) -> Timestamp {
    at.checked_add(SignedDuration::from_secs_f64(seconds)).unwrap_or(at)
}

/// Judges one run.
pub fn assess(run: &RunRecord) -> Assessment {
    let expectation = expected(run.scenario);
    let from = widen(run.started, -MATCH_SLACK_SECONDS);
    let until = widen(run.finished, MATCH_SLACK_SECONDS);
    let mut assessment = Assessment {
        expects_incident: matches!(expectation, Expected::Incident(_)),
        lost_truth: run.udp_loss.as_ref().map_or(0, |loss| loss.lost)
            + run.outage.as_ref().map_or(0, |outage| outage.failed_probes as u64),
        ..Assessment::default()
    };
    let Expected::Incident(cause) = expectation else {
        assessment.false_incidents = run.incidents.len();
        return assessment;
    };
    let matched = run
        .incidents
        .iter()
        .enumerate()
        .filter(|(_, incident)| incident.view.overlaps(from, until))
        .min_by_key(|(_, incident)| incident.view.start)
        .map(|(index, _)| index);
    assessment.matched = matched;
    assessment.false_incidents = run.incidents.len() - usize::from(matched.is_some());
    let Some(index) = matched else {
        assessment.top1_correct = Some(false);
        return assessment;
    };
    let seen = &run.incidents[index];
    let incident = &seen.view;
    assessment.top1_correct = Some(match cause {
        Some((kind, subject)) => incident.causes.first().is_some_and(|(k, s)| k == kind && s == subject),
        None => incident.causes.is_empty(),
    });
    if let Some(outage) = &run.outage {
        assessment.onset_error_prober = Some(seconds_between(outage.first_failure, incident.start));
        assessment.duration_error_prober = Some(incident.duration_seconds - outage.seconds);
    }
    if let Some(loss) = &run.udp_loss {
        assessment.onset_error_udp = Some(seconds_between(loss.first_lost, incident.start));
        assessment.duration_error_udp = Some(incident.duration_seconds - loss.seconds());
    }
    assessment.latency =
        first_lost(run.outage.as_ref(), run.udp_loss.as_ref()).map(|lost| seconds_between(lost, seen.first_seen));
    assessment.lost_reported = incident.lost_packets;
    assessment
}

// ---------------------------------------------------------------------------------------------
// The soak.

/// The soak: natural traffic, no fault.
#[derive(Clone, Debug)]
pub struct SoakRecord {
    pub minutes: f64,
    pub started: Timestamp,
    pub finished: Timestamp,
    pub incidents: Vec<SeenIncident>,
    /// Start times of failed probes in the soak.
    pub failed_probes: Vec<Timestamp>,
    /// The UDP client's seconds in the soak.
    pub udp: Vec<UdpSecond>,
    pub udp_sent: u64,
    pub udp_received: u64,
}

/// Whether the lab saw loss (a failed probe, a lost datagram) within 1 s of `incident`.
pub fn soak_incident_had_loss(incident: &IncidentView, failed_probes: &[Timestamp], udp: &[UdpSecond]) -> bool {
    let from = widen(incident.start, -MATCH_SLACK_SECONDS);
    let until = widen(incident.end_or_now(), MATCH_SLACK_SECONDS);
    failed_probes.iter().any(|at| *at >= from && *at <= until) || probe_log::udp_loss_window(udp, from, until).is_some()
}

impl SoakRecord {
    /// (false incidents, incidents with real loss).
    pub fn counts(&self) -> (usize, usize) {
        let real = self
            .incidents
            .iter()
            .filter(|seen| soak_incident_had_loss(&seen.view, &self.failed_probes, &self.udp))
            .count();
        (self.incidents.len() - real, real)
    }

    pub fn hours(&self) -> f64 {
        seconds_between(self.started, self.finished) / 3600.0
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics.

/// The nearest-rank `p`-th percentile (0–100) of `values`; None when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The value of largest magnitude (sign kept).
pub fn max_abs(values: &[f64]) -> Option<f64> {
    values.iter().copied().max_by(|a, b| a.abs().total_cmp(&b.abs()))
}

fn abs_all(values: &[f64]) -> Vec<f64> {
    values.iter().map(|v| v.abs()).collect()
}

/// `+0.12 s`; `—` for None.
pub fn signed(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_string(), |v| format!("{v:+.2} s"))
}

/// `0.12 s`; `—` for None.
pub fn plain(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_string(), |v| format!("{v:.2} s"))
}

/// `95 %` style; `—` when there is nothing to count.
pub fn ratio(numerator: usize, denominator: usize) -> String {
    if denominator == 0 {
        "—".to_string()
    } else {
        format!("{:.0} % ({numerator}/{denominator})", 100.0 * numerator as f64 / denominator as f64)
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "no data",
    }
}

// ---------------------------------------------------------------------------------------------
// EVALUATION.md.

/// How the evaluation was produced.
pub struct Meta {
    pub command: String,
    pub date: Timestamp,
    pub kernel: String,
    pub commit: String,
    pub repeat: u32,
    pub soak_minutes: Option<f64>,
    pub total_seconds: f64,
}

/// The whole report.
pub fn render(meta: &Meta, runs: &[RunRecord], soak: Option<&SoakRecord>) -> String {
    let assessed: Vec<(&RunRecord, Assessment)> = runs.iter().map(|run| (run, assess(run))).collect();
    let mut out = String::new();
    let _ = writeln!(out, "# Detection quality\n");
    let _ = writeln!(
        out,
        "Produced by `{}` on {:.0} (kernel `{}`, commit `{}`): {} run(s) per scenario, {}; {:.0} s in all. \
         Regenerate with `sudo -E cargo xtask eval`; the raw runs are in `target/eval/results.json`.\n",
        meta.command,
        meta.date,
        meta.kernel,
        meta.commit,
        meta.repeat,
        meta.soak_minutes.map_or("no soak".to_string(), |m| format!("{m} min soak")),
        meta.total_seconds
    );
    let _ = writeln!(
        out,
        "Ground truth comes from the lab, which the agent never sees: the kubelet-like prober (a probe \
         every 1 s; outage = first failed probe → first successful one) and the client pod's UDP stream \
         (20 datagrams/s, each numbered and echoed; a datagram not echoed within 1 s is lost). Each run \
         starts a fresh agent (empty state dir) and disrupts 2 s after it is ready (cold, odd repeats) or \
         12 s after (warm, even repeats).\n"
    );
    render_summary(&mut out, &assessed, soak);
    render_scenarios(&mut out, &assessed);
    render_runs(&mut out, &assessed);
    render_soak(&mut out, soak);
    out
}

fn render_summary(out: &mut String, assessed: &[(&RunRecord, Assessment)], soak: Option<&SoakRecord>) {
    let expecting: Vec<&Assessment> = assessed.iter().map(|(_, a)| a).filter(|a| a.expects_incident).collect();
    let detected = expecting.iter().filter(|a| a.matched.is_some()).count();
    let top1 = expecting.iter().filter(|a| a.top1_correct == Some(true)).count();
    let duration_errors: Vec<f64> = assessed.iter().filter_map(|(_, a)| a.duration_error_prober).collect();
    let latencies: Vec<f64> = assessed.iter().filter_map(|(_, a)| a.latency).collect();
    let decoy_false: usize = assessed.iter().filter(|(_, a)| !a.expects_incident).map(|(_, a)| a.false_incidents).sum();
    let extra_false: usize = assessed.iter().filter(|(_, a)| a.expects_incident).map(|(_, a)| a.false_incidents).sum();
    let soak_counts = soak.map(SoakRecord::counts);
    let soak_false = soak_counts.map_or(0, |(false_, _)| false_);
    let total_false = decoy_false + extra_false + soak_false;

    let fraction = |n: usize, d: usize| (d > 0).then(|| n as f64 / d as f64);
    let recall = fraction(detected, expecting.len());
    let top1_rate = fraction(top1, expecting.len());
    let duration_p95 = percentile(&abs_all(&duration_errors), 95.0);
    let latency_p95 = percentile(&latencies, 95.0);

    let _ = writeln!(out, "## Summary\n");
    let _ = writeln!(out, "| measure | result | goal | |\n|---|---|---|---|");
    let _ = writeln!(
        out,
        "| recall (runs of scenarios expecting an incident that got one) | {} | 100 % | {} |",
        ratio(detected, expecting.len()),
        verdict(recall.map(|r| r >= GOAL_RECALL))
    );
    let _ = writeln!(
        out,
        "| top-1 cause accuracy (of those runs) | {} | ≥ 95 % | {} |",
        ratio(top1, expecting.len()),
        verdict(top1_rate.map(|r| r >= GOAL_TOP1))
    );
    let _ = writeln!(
        out,
        "| duration error vs the prober, p95 of \\|error\\| ({} runs with an outage) | {} | ≤ 1 s | {} |",
        duration_errors.len(),
        plain(duration_p95),
        verdict(duration_p95.map(|d| d <= GOAL_DURATION_ERROR))
    );
    let _ = writeln!(
        out,
        "| detection latency p95 (first seen − first loss, {} runs) | {} | ≤ 1 s | {} |",
        latencies.len(),
        plain(latency_p95),
        verdict(latency_p95.map(|l| l <= GOAL_LATENCY))
    );
    let soak_text = match soak {
        Some(soak) => {
            let per_hour = if soak.hours() > 0.0 { soak_false as f64 / soak.hours() } else { 0.0 };
            format!("{soak_false} in the soak ({per_hour:.1}/h)")
        }
        None => "no soak".to_string(),
    };
    let _ = writeln!(
        out,
        "| false incidents | {total_false}: {decoy_false} in decoy runs, {extra_false} extra in incident runs, {soak_text} | 0 | {} |",
        verdict(Some(total_false == 0))
    );
    out.push('\n');
}

fn render_scenarios(out: &mut String, assessed: &[(&RunRecord, Assessment)]) {
    let _ = writeln!(out, "## Per scenario\n");
    let _ = writeln!(
        out,
        "Onset error = incident start − first failed probe; duration error = incident duration − prober \
         outage; the same against the UDP loss window (first → last lost datagram's send time) in \
         brackets. Latency = when the poller (every 100 ms) first saw the incident − the first loss \
         (failed probe or lost datagram). Lost packets: the incident's `totals.lost_packets` vs the lab's \
         lost datagrams + failed probes, summed over the runs (reported, not judged).\n"
    );
    let _ = writeln!(
        out,
        "| scenario | expected | runs | with incident | top-1 correct | false | onset error p50 / max | duration error p50 / max | latency p50 / p95 | lost packets reported / truth | cold / warm detected |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let mut order: Vec<Scenario> = Vec::new();
    for (run, _) in assessed {
        if !order.contains(&run.scenario) {
            order.push(run.scenario);
        }
    }
    for scenario in order {
        let rows: Vec<&(&RunRecord, Assessment)> =
            assessed.iter().filter(|(run, _)| run.scenario == scenario).collect();
        let runs = rows.len();
        let with_incident = rows.iter().filter(|(run, a)| a.matched.is_some() || !run.incidents.is_empty()).count();
        let falses: usize = rows.iter().map(|(_, a)| a.false_incidents).sum();
        let expects = rows.first().is_some_and(|(_, a)| a.expects_incident);
        let top1 = rows.iter().filter(|(_, a)| a.top1_correct == Some(true)).count();
        let collect = |f: fn(&Assessment) -> Option<f64>| rows.iter().filter_map(|(_, a)| f(a)).collect::<Vec<f64>>();
        let onset = collect(|a| a.onset_error_prober);
        let onset_udp = collect(|a| a.onset_error_udp);
        let duration = collect(|a| a.duration_error_prober);
        let duration_udp = collect(|a| a.duration_error_udp);
        let latency = collect(|a| a.latency);
        let matched: Vec<&Assessment> = rows.iter().map(|(_, a)| a).filter(|a| a.matched.is_some()).collect();
        let reported: Option<u64> = if matched.iter().any(|a| a.lost_reported.is_some()) {
            Some(matched.iter().filter_map(|a| a.lost_reported).sum())
        } else {
            None
        };
        let truth: u64 = rows.iter().map(|(_, a)| a.lost_truth).sum();
        let lost = match reported {
            Some(reported) if truth > 0 => format!("{reported} / {truth} ({:.2}×)", reported as f64 / truth as f64),
            Some(reported) => format!("{reported} / {truth}"),
            None => format!("— / {truth}"),
        };
        let split = |cold: bool| {
            let group: Vec<&&(&RunRecord, Assessment)> = rows.iter().filter(|(run, _)| run.cold == cold).collect();
            let hit = group
                .iter()
                .filter(|(run, a)| if expects { a.matched.is_some() } else { !run.incidents.is_empty() })
                .count();
            format!("{hit}/{}", group.len())
        };
        let pair = |a: &[f64], b: &[f64]| {
            let p50 = |v: &[f64]| percentile(v, 50.0);
            if a.is_empty() && b.is_empty() {
                "—".to_string()
            } else {
                format!("{} / {} [{} / {}]", signed(p50(a)), signed(max_abs(a)), signed(p50(b)), signed(max_abs(b)))
            }
        };
        let _ = writeln!(
            out,
            "| {scenario} | {} | {runs} | {with_incident} | {} | {falses} | {} | {} | {} / {} | {lost} | {} / {} |",
            expected_text(expected(scenario)),
            if expects { format!("{top1}/{runs}") } else { "—".to_string() },
            pair(&onset, &onset_udp),
            pair(&duration, &duration_udp),
            plain(percentile(&latency, 50.0)),
            plain(percentile(&latency, 95.0)),
            split(true),
            split(false),
        );
    }
    out.push_str(
        "\n(cold / warm: runs with an incident, of the cold and the warm runs; for decoys that is a false alarm.)\n\n",
    );
}

fn render_runs(out: &mut String, assessed: &[(&RunRecord, Assessment)]) {
    let _ = writeln!(out, "## Per run\n");
    let _ = writeln!(
        out,
        "| scenario | # | start | prober outage | UDP lost | incident | start error (prober / UDP) | duration | duration error (prober / UDP) | latency | top cause | lost_packets / truth | other incidents |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (run, a) in assessed {
        let incident = a.matched.map(|index| &run.incidents[index].view);
        let outage = run
            .outage
            .as_ref()
            .map_or("none".to_string(), |o| format!("{:.1} s ({} probes)", o.seconds, o.failed_probes));
        let udp = match &run.udp_loss {
            Some(l) => format!("{} of {} ({:.1} s)", l.lost, run.udp_sent, l.seconds()),
            None => format!("0 of {} ({} echoed)", run.udp_sent, run.udp_received),
        };
        let lost = format!("{} / {}", a.lost_reported.map_or("—".to_string(), |n| n.to_string()), a.lost_truth);
        let others: Vec<String> = run
            .incidents
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != a.matched)
            .map(|(_, seen)| {
                format!("`{}` {:.1} s, {}", seen.view.id, seen.view.duration_seconds, seen.view.top_cause())
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {outage} | {udp} | {} | {} / {} | {} | {} / {} | {} | {} | {lost} | {} |",
            run.scenario,
            run.repeat,
            if run.cold { "cold" } else { "warm" },
            incident.map_or("**none**".to_string(), |i| format!("`{}`", i.id)),
            signed(a.onset_error_prober),
            signed(a.onset_error_udp),
            incident.map_or("—".to_string(), |i| format!("{:.2} s", i.duration_seconds)),
            signed(a.duration_error_prober),
            signed(a.duration_error_udp),
            plain(a.latency),
            incident.map_or("—".to_string(), |i| i.top_cause()),
            if others.is_empty() { "—".to_string() } else { others.join("; ") },
        );
    }
    out.push('\n');
}

fn render_soak(out: &mut String, soak: Option<&SoakRecord>) {
    let _ = writeln!(out, "## Soak: natural traffic, no fault\n");
    let Some(soak) = soak else {
        let _ = writeln!(out, "Not run (`--no-soak`).");
        return;
    };
    let (false_, real) = soak.counts();
    let hours = soak.hours();
    let _ = writeln!(
        out,
        "A fresh agent, 2 s to warm up, then {:.1} min of pod traffic that is healthy but looks like \
         trouble to a naive detector, alongside the prober and the UDP stream:\n",
        hours * 60.0
    );
    for behaviour in soak::Behaviour::ALL {
        let _ = writeln!(out, "- `{}`: {}", behaviour.name(), behaviour.description());
    }
    let _ = writeln!(out, "\nWhere it runs:\n");
    for line in soak::layout() {
        let _ = writeln!(out, "- {line}");
    }
    let lost: u64 = soak.udp.iter().map(|s| s.lost).sum();
    let _ = writeln!(
        out,
        "\nDuring it the prober failed {} probe(s) and the UDP client lost {lost} of {} datagrams.\n",
        soak.failed_probes.len(),
        soak.udp_sent
    );
    let _ = writeln!(
        out,
        "| duration | incidents | false incidents | false per hour | soak incidents with real loss |\n|---|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| {:.1} min | {} | {false_} | {:.1} | {real} |\n",
        hours * 60.0,
        soak.incidents.len(),
        if hours > 0.0 { false_ as f64 / hours } else { 0.0 }
    );
    if !soak.incidents.is_empty() {
        let _ = writeln!(out, "| incident | start | duration | top cause | real loss near it |\n|---|---|---|---|---|");
        for seen in &soak.incidents {
            let _ = writeln!(
                out,
                "| `{}` | {:+.1} s into the soak | {:.2} s | {} | {} |",
                seen.view.id,
                seconds_between(soak.started, seen.view.start),
                seen.view.duration_seconds,
                seen.view.top_cause(),
                if soak_incident_had_loss(&seen.view, &soak.failed_probes, &soak.udp) { "yes" } else { "no" }
            );
        }
        out.push('\n');
    }
}

// ---------------------------------------------------------------------------------------------
// Polling the agent.

#[derive(Default)]
struct PollState {
    first_seen: BTreeMap<String, Timestamp>,
    latest: Vec<Value>,
    polls: u64,
    errors: u64,
}

/// Polls `/api/v1/incidents` every 100 ms from a thread that entered the node netns.
struct Poller {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<PollState>>,
    handle: thread::JoinHandle<()>,
}

impl Poller {
    fn start() -> anyhow::Result<Self> {
        let netns = fs::File::open(format!("/run/netns/{NODE_NETNS}")).context("opening the node netns")?;
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(PollState::default()));
        let (thread_stop, thread_state) = (Arc::clone(&stop), Arc::clone(&state));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = thread::spawn(move || {
            // SAFETY: setns on a valid fd; it moves only this thread into the node netns.
            let entered = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == 0;
            let _ = ready_tx.send(entered);
            if !entered {
                return;
            }
            while !thread_stop.load(Ordering::Relaxed) {
                poll_once(&thread_state);
                thread::sleep(POLL_INTERVAL);
            }
            poll_once(&thread_state);
        });
        ensure!(
            ready_rx.recv().unwrap_or(false),
            "cannot enter netns {NODE_NETNS}: {}",
            std::io::Error::last_os_error()
        );
        Ok(Poller { stop, state, handle })
    }

    /// (incidents now, all of them inactive).
    fn snapshot(&self) -> (usize, bool) {
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (state.latest.len(), state.latest.iter().all(|incident| incident["active"] != true))
    }

    fn finish(self) -> (Vec<SeenIncident>, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut seen: Vec<SeenIncident> = state
            .latest
            .iter()
            .filter_map(|raw| {
                let view = IncidentView::from_json(raw)?;
                let first_seen = *state.first_seen.get(&view.id)?;
                Some(SeenIncident { view, first_seen, raw: raw.clone() })
            })
            .collect();
        seen.sort_by_key(|s| s.view.start);
        (seen, state.polls, state.errors)
    }
}

fn poll_once(state: &Mutex<PollState>) {
    let result = http_get_local("/api/v1/incidents");
    let seen_at = Timestamp::now();
    let mut state = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    state.polls += 1;
    match result.and_then(|body| serde_json::from_str::<Value>(&body).context("incidents are not JSON")) {
        Ok(Value::Array(incidents)) => {
            for incident in &incidents {
                if let Some(id) = incident["id"].as_str() {
                    state.first_seen.entry(id.to_string()).or_insert(seen_at);
                }
            }
            state.latest = incidents;
        }
        Ok(_) | Err(_) => state.errors += 1,
    }
}

/// GET `path` from the agent (the calling thread must be in the node netns).
fn http_get_local(path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&AGENT_LISTEN.parse()?, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {AGENT_LISTEN}\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    parse_http_response(&response)
}

/// The body of a 200 response (Content-Length or chunked framing).
pub fn parse_http_response(response: &[u8]) -> anyhow::Result<String> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").context("no end of the response head")?;
    let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
    ensure!(head.starts_with("http/1.1 200") || head.starts_with("http/1.0 200"), "not a 200: {head}");
    let body = &response[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok(String::from_utf8_lossy(body).into_owned());
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").context("truncated chunk")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).context("bad chunk size")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            break;
        }
        ensure!(rest.len() >= size, "truncated chunk");
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

// ---------------------------------------------------------------------------------------------
// Running it.

/// `cargo xtask eval`.
pub fn eval(options: EvalOptions) -> anyhow::Result<()> {
    require_root("eval")?;
    ensure!(options.repeat >= 1, "--repeat must be at least 1");
    ensure!(options.soak_minutes >= 0.0 && options.soak_minutes.is_finite(), "--soak-minutes must be ≥ 0");
    let scenarios = parse_scenarios(options.scenarios.as_deref())?;
    setup::ensure_ready()?;
    let workspace = Workspace::locate()?;
    let agent_binary = build::build_agent(&workspace, false)?;
    let lab_binary = build::build_lab(&workspace)?;
    let out_dir = workspace.target_dir.join("eval");
    let logs = out_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let date = Timestamp::now();
    let clock = Instant::now();

    println!("==> lab up");
    let result = Lab::up(&lab_binary).and_then(|lab| {
        let result = eval_in(&lab, &agent_binary, &scenarios, &options, &out_dir, &logs);
        lab.stop_soak();
        result
    });
    println!("==> lab down");
    if let Err(error) = Lab::down() {
        eprintln!("warning: lab down: {error:#}");
    }
    let (runs, soak) = result?;

    let mut command_line = format!("cargo xtask eval --repeat {}", options.repeat);
    if let Some(list) = &options.scenarios {
        let _ = write!(command_line, " --scenarios {list}");
    }
    if options.no_soak {
        command_line.push_str(" --no-soak");
    } else {
        let _ = write!(command_line, " --soak-minutes {}", options.soak_minutes);
    }
    let meta = Meta {
        command: command_line,
        date,
        kernel: command::stdout(std::process::Command::new("uname").arg("-r"))
            .map(|k| k.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
        commit: command::stdout(std::process::Command::new("git").current_dir(&workspace.root).args([
            "rev-parse",
            "--short",
            "HEAD",
        ]))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into()),
        repeat: options.repeat,
        soak_minutes: (!options.no_soak).then_some(options.soak_minutes),
        total_seconds: clock.elapsed().as_secs_f64(),
    };
    write_results(&out_dir, &runs, soak.as_ref())?;
    let report = render(&meta, &runs, soak.as_ref());
    let path = workspace.root.join("EVALUATION.md");
    fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("\n{}", report.split("## Per scenario").next().unwrap_or(""));
    println!("wrote {} and {}", path.display(), out_dir.join("results.json").display());
    Ok(())
}

fn parse_scenarios(list: Option<&str>) -> anyhow::Result<Vec<Scenario>> {
    let Some(list) = list else { return Ok(Scenario::ALL.to_vec()) };
    let mut scenarios = Vec::new();
    for name in list.split(',').filter(|name| !name.trim().is_empty()) {
        let scenario = Scenario::parse(name).with_context(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
            format!("unknown scenario {name:?}; one of: {}", names.join(", "))
        })?;
        if !scenarios.contains(&scenario) {
            scenarios.push(scenario);
        }
    }
    if scenarios.is_empty() {
        bail!("--scenarios names no scenario");
    }
    Ok(scenarios)
}

fn eval_in(
    lab: &Lab,
    agent_binary: &Path,
    scenarios: &[Scenario],
    options: &EvalOptions,
    out_dir: &Path,
    logs: &Path,
) -> anyhow::Result<(Vec<RunRecord>, Option<SoakRecord>)> {
    let mut runs = Vec::new();
    for repeat in 1..=options.repeat {
        for &scenario in scenarios {
            let run = run_once(lab, agent_binary, scenario, repeat, logs)
                .with_context(|| format!("{scenario} run {repeat}"))?;
            let a = assess(&run);
            println!(
                "    => {} incident(s); matched: {}; top cause {}; onset {} duration {} latency {} (prober), false {}",
                run.incidents.len(),
                a.matched.map_or("none".to_string(), |i| run.incidents[i].view.id.clone()),
                a.matched.map_or("—".to_string(), |i| run.incidents[i].view.top_cause()),
                signed(a.onset_error_prober),
                signed(a.duration_error_prober),
                plain(a.latency),
                a.false_incidents
            );
            runs.push(run);
            write_results(out_dir, &runs, None)?;
        }
    }
    let soak = if options.no_soak { None } else { Some(run_soak(lab, agent_binary, options.soak_minutes, logs)?) };
    Ok((runs, soak))
}

fn run_once(lab: &Lab, agent_binary: &Path, scenario: Scenario, repeat: u32, logs: &Path) -> anyhow::Result<RunRecord> {
    let cold = repeat % 2 == 1;
    let wait = if cold { COLD_WAIT } else { WARM_WAIT };
    println!(
        "==> {scenario} run {repeat} ({}, disrupting {} s after the agent is ready)",
        if cold { "cold" } else { "warm" },
        wait.as_secs()
    );
    let log = logs.join(format!("agent-{scenario}-{repeat}.log"));
    let agent = LabAgent::start_fresh(agent_binary, lab, &log)?;
    let agent_ready = Timestamp::now();
    let poller = Poller::start()?;
    thread::sleep(wait);
    let report = lab.disrupt_with(scenario, &mut |at, step| println!("    {at:.3}  {step}"));
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            poller.finish();
            agent.stop();
            return Err(error);
        }
    };
    let after = Instant::now();
    loop {
        thread::sleep(Duration::from_millis(200));
        let (count, all_closed) = poller.snapshot();
        if (count == 0 && after.elapsed() >= NO_INCIDENT_WAIT)
            || (count > 0 && all_closed)
            || after.elapsed() >= CLOSE_TIMEOUT
        {
            break;
        }
    }
    let (incidents, polls, errors) = poller.finish();
    agent.stop();
    if errors > polls / 2 {
        eprintln!("warning: {errors} of {polls} polls of the agent failed (see {})", log.display());
    }
    Ok(record(lab, scenario, repeat, cold, agent_ready, &report, incidents))
}

fn record(
    lab: &Lab,
    scenario: Scenario,
    repeat: u32,
    cold: bool,
    agent_ready: Timestamp,
    report: &ScenarioReport,
    incidents: Vec<SeenIncident>,
) -> RunRecord {
    // Re-read the UDP log now: a datagram is declared lost 1 s after sending, so the report's
    // own window may lack the last losses.
    let udp = probe_log::parse_udp(&fs::read_to_string(lab.udp_log()).unwrap_or_default());
    let udp_loss = probe_log::udp_loss_window(&udp, report.started, report.finished).or(report.udp_loss.clone());
    RunRecord {
        scenario,
        repeat,
        cold,
        agent_ready,
        started: report.started,
        finished: report.finished,
        outage: report.outage.clone(),
        udp_loss,
        udp_sent: report.udp_sent,
        udp_received: report.udp_received,
        incidents,
        report: serde_json::to_value(report).unwrap_or(Value::Null),
    }
}

fn run_soak(lab: &Lab, agent_binary: &Path, minutes: f64, logs: &Path) -> anyhow::Result<SoakRecord> {
    println!("==> soak: {minutes} min of natural traffic (no fault), fresh agent");
    let log = logs.join("agent-soak.log");
    let agent = LabAgent::start_fresh(agent_binary, lab, &log)?;
    let poller = Poller::start()?;
    thread::sleep(COLD_WAIT);
    let started = Timestamp::now();
    let soak = lab.start_soak();
    let result = soak.map(|_| {
        let until = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
        let mut reported = 0;
        while Instant::now() < until {
            thread::sleep(Duration::from_secs(1).min(until.saturating_duration_since(Instant::now())));
            let (count, _) = poller.snapshot();
            if count != reported {
                println!("    {:.3}  the agent reports {count} incident(s)", Timestamp::now());
                reported = count;
            }
        }
    });
    let finished = Timestamp::now();
    let (incidents, _, _) = poller.finish();
    agent.stop();
    lab.stop_soak();
    result?;
    let failed_probes: Vec<Timestamp> =
        lab.probes(Some(started))?.into_iter().filter(|p| !p.ok && p.at <= finished).map(|p| p.at).collect();
    let udp: Vec<UdpSecond> = probe_log::parse_udp(&fs::read_to_string(lab.udp_log()).unwrap_or_default())
        .into_iter()
        .filter(|s| s.at >= started)
        .collect();
    let (udp_sent, udp_received) = probe_log::udp_totals(&udp, started, finished);
    // Soak daemons' own tallies, kept with the agent logs.
    for name in ["soak-client", "soak-apiserver", "soak-web"] {
        let _ = fs::copy(lab.logs_dir().join(format!("{name}.log")), logs.join(format!("{name}.log")));
    }
    Ok(SoakRecord { minutes, started, finished, incidents, failed_probes, udp, udp_sent, udp_received })
}

fn seen_json(seen: &SeenIncident) -> Value {
    json!({ "first_seen": format!("{:.3}", seen.first_seen), "incident": seen.raw })
}

fn write_results(out_dir: &Path, runs: &[RunRecord], soak: Option<&SoakRecord>) -> anyhow::Result<()> {
    let runs: Vec<Value> = runs
        .iter()
        .map(|run| {
            let a = assess(run);
            json!({
                "scenario": run.scenario.name(),
                "repeat": run.repeat,
                "start": if run.cold { "cold" } else { "warm" },
                "wait_seconds": if run.cold { COLD_WAIT.as_secs() } else { WARM_WAIT.as_secs() },
                "agent_ready": format!("{:.3}", run.agent_ready),
                "report": run.report,
                "udp_loss": run.udp_loss.as_ref().map(|l| json!({
                    "first_lost": format!("{:.3}", l.first_lost), "last_lost": format!("{:.3}", l.last_lost), "lost": l.lost,
                })),
                "incidents": run.incidents.iter().map(seen_json).collect::<Vec<_>>(),
                "assessment": {
                    "expected": expected_text(expected(run.scenario)),
                    "matched": a.matched.map(|i| run.incidents[i].view.id.clone()),
                    "top1_correct": a.top1_correct,
                    "false_incidents": a.false_incidents,
                    "onset_error_prober": a.onset_error_prober,
                    "duration_error_prober": a.duration_error_prober,
                    "onset_error_udp": a.onset_error_udp,
                    "duration_error_udp": a.duration_error_udp,
                    "latency": a.latency,
                    "lost_reported": a.lost_reported,
                    "lost_truth": a.lost_truth,
                },
            })
        })
        .collect();
    let soak = soak.map(|soak| {
        let (false_, real) = soak.counts();
        json!({
            "minutes": soak.minutes,
            "started": format!("{:.3}", soak.started),
            "finished": format!("{:.3}", soak.finished),
            "incidents": soak.incidents.iter().map(seen_json).collect::<Vec<_>>(),
            "false_incidents": false_,
            "incidents_with_real_loss": real,
            "failed_probes": soak.failed_probes.iter().map(|at| format!("{at:.3}")).collect::<Vec<_>>(),
            "udp_sent": soak.udp_sent,
            "udp_received": soak.udp_received,
            "udp_lost": soak.udp.iter().map(|s| s.lost).sum::<u64>(),
            "udp_loss_seconds": soak.udp.iter().filter(|s| s.lost > 0).map(|s| json!({
                "at": format!("{:.3}", s.at),
                "lost": s.lost,
                "first_lost_at": s.first_lost_at.map(|t| format!("{t:.3}")),
                "last_lost_at": s.last_lost_at.map(|t| format!("{t:.3}")),
            })).collect::<Vec<_>>(),
        })
    });
    let path: PathBuf = out_dir.join("results.json");
    let text = serde_json::to_string_pretty(&json!({ "runs": runs, "soak": soak }))?;
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn incident(id: &str, start: &str, end: Option<&str>, duration: f64, causes: &[(&str, &str)]) -> Value {
        let causes: Vec<Value> = causes.iter().map(|(k, s)| json!({"kind": k, "subject": s})).collect();
        json!({
            "id": id, "start": start, "end": end, "active": end.is_none(), "duration_seconds": duration,
            "totals": {"drops": 3}, "causes": causes,
        })
    }

    fn seen(value: Value, first_seen: &str) -> SeenIncident {
        SeenIncident { view: IncidentView::from_json(&value).unwrap(), first_seen: ts(first_seen), raw: value }
    }

    fn run(scenario: Scenario, incidents: Vec<SeenIncident>) -> RunRecord {
        RunRecord {
            scenario,
            repeat: 1,
            cold: true,
            agent_ready: ts("2026-01-12T20:58:38Z"),
            started: ts("2026-01-12T20:58:40Z"),
            finished: ts("2026-01-12T20:58:55Z"),
            outage: Some(Outage {
                first_failure: ts("2026-01-12T20:58:41.5Z"),
                recovered: ts("2026-01-12T20:58:49.5Z"),
                seconds: 8.0,
                failed_probes: 8,
                ongoing: false,
            }),
            udp_loss: Some(LossWindow {
                first_lost: ts("2026-01-12T20:58:41.2Z"),
                last_lost: ts("2026-01-12T20:58:49.2Z"),
                lost: 160,
            }),
            udp_sent: 300,
            udp_received: 140,
            incidents,
            report: Value::Null,
        }
    }

    #[test]
    fn incidents_parse_old_and_new_shapes() {
        let old = incident("a", "2026-01-12T20:58:41Z", Some("2026-01-12T20:58:49Z"), 8.0, &[]);
        let view = IncidentView::from_json(&old).unwrap();
        assert_eq!(view.lost_packets, None);
        assert_eq!(view.top_cause(), "unattributed");
        assert!(!view.active);
        let mut new = incident("b", "2026-01-12T20:58:41Z", None, 2.5, &[("process_restart", "ovs-vswitchd")]);
        new["totals"]["lost_packets"] = json!(42);
        let view = IncidentView::from_json(&new).unwrap();
        assert_eq!(view.lost_packets, Some(42));
        assert!(view.active);
        assert_eq!(view.end_or_now(), ts("2026-01-12T20:58:43.5Z"));
        assert_eq!(view.top_cause(), "process_restart ovs-vswitchd");
        assert!(IncidentView::from_json(&json!({"id": "x"})).is_none());
    }

    #[test]
    fn a_matching_incident_is_measured_against_the_ground_truth() {
        let mut matched = incident(
            "m",
            "2026-01-12T20:58:41.0Z",
            Some("2026-01-12T20:58:49.7Z"),
            8.7,
            &[("process_restart", "ovs-vswitchd"), ("cni_default_network_missing", "x")],
        );
        matched["totals"]["lost_packets"] = json!(150);
        // One before the scenario (starting up), one matching.
        let early = incident("e", "2026-01-12T20:58:38.5Z", Some("2026-01-12T20:58:38.9Z"), 0.4, &[]);
        let r = run(
            Scenario::SdnUpgrade,
            vec![seen(early, "2026-01-12T20:58:38.6Z"), seen(matched, "2026-01-12T20:58:41.9Z")],
        );
        let a = assess(&r);
        assert_eq!(a.matched, Some(1));
        assert_eq!(a.false_incidents, 1);
        assert_eq!(a.top1_correct, Some(true));
        let close = |x: Option<f64>, y: f64| (x.unwrap() - y).abs() < 1e-9;
        assert!(close(a.onset_error_prober, -0.5));
        assert!(close(a.duration_error_prober, 0.7));
        assert!(close(a.onset_error_udp, -0.2));
        assert!(close(a.duration_error_udp, 0.7));
        // First loss is the UDP datagram at 41.2, seen at 41.9.
        assert!(close(a.latency, 0.7));
        assert_eq!((a.lost_reported, a.lost_truth), (Some(150), 168));

        // Wrong top cause; flow-flush expects the sdn.
        let r = run(
            Scenario::FlowFlush,
            vec![seen(
                incident(
                    "w",
                    "2026-01-12T20:58:41Z",
                    Some("2026-01-12T20:58:45Z"),
                    4.0,
                    &[("process_restart", "ovs-vswitchd")],
                ),
                "2026-01-12T20:58:42Z",
            )],
        );
        assert_eq!(assess(&r).top1_correct, Some(false));
    }

    #[test]
    fn misses_decoys_and_unattributed_incidents() {
        // Nothing overlapping the scenario ±1 s: a miss, and the incident is false.
        let late = incident("l", "2026-01-12T20:58:56.5Z", Some("2026-01-12T20:58:58Z"), 1.5, &[]);
        let a = assess(&run(Scenario::OvsRestart, vec![seen(late.clone(), "2026-01-12T20:58:57Z")]));
        assert_eq!((a.matched, a.false_incidents, a.top1_correct), (None, 1, Some(false)));
        assert_eq!(a.latency, None);
        // Within the slack it matches.
        let edge = incident("g", "2026-01-12T20:58:55.8Z", Some("2026-01-12T20:58:58Z"), 2.2, &[]);
        assert_eq!(assess(&run(Scenario::SilentDrop, vec![seen(edge, "2026-01-12T20:58:56Z")])).matched, Some(0));
        // Silent drop wants no cause.
        let attributed =
            incident("s", "2026-01-12T20:58:41Z", Some("2026-01-12T20:58:46Z"), 5.0, &[("process_start", "x")]);
        assert_eq!(
            assess(&run(Scenario::SilentDrop, vec![seen(attributed, "2026-01-12T20:58:42Z")])).top1_correct,
            Some(false)
        );
        // Any incident in a decoy run is false; none is right.
        let a = assess(&run(Scenario::BenignRestart, vec![seen(late, "2026-01-12T20:58:57Z")]));
        assert_eq!((a.expects_incident, a.matched, a.false_incidents, a.top1_correct), (false, None, 1, None));
        assert_eq!(assess(&run(Scenario::CniFlap, vec![])).false_incidents, 0);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values = [0.5, -2.0, 1.0, 0.25, 3.0];
        assert_eq!(percentile(&values, 50.0), Some(0.5));
        assert_eq!(percentile(&values, 95.0), Some(3.0));
        assert_eq!(percentile(&values, 0.0), Some(-2.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(max_abs(&[0.5, -2.0, 1.0]), Some(-2.0));
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&twenty, 95.0), Some(19.0));
        assert_eq!(signed(Some(0.123)), "+0.12 s");
        assert_eq!(signed(None), "—");
        assert_eq!(ratio(19, 20), "95 % (19/20)");
        assert_eq!(ratio(0, 0), "—");
    }

    #[test]
    fn soak_incidents_with_loss_nearby_are_not_false() {
        let udp = probe_log::parse_udp(
            "{\"at\":\"2026-01-12T21:00:10Z\",\"sent\":20,\"received\":18,\"lost\":2,\
             \"first_lost_at\":\"2026-01-12T21:00:08.5Z\",\"last_lost_at\":\"2026-01-12T21:00:08.6Z\"}",
        );
        let near =
            IncidentView::from_json(&incident("n", "2026-01-12T21:00:09Z", Some("2026-01-12T21:00:12Z"), 3.0, &[]))
                .unwrap();
        let far =
            IncidentView::from_json(&incident("f", "2026-01-12T21:01:00Z", Some("2026-01-12T21:01:03Z"), 3.0, &[]))
                .unwrap();
        assert!(soak_incident_had_loss(&near, &[], &udp));
        assert!(!soak_incident_had_loss(&far, &[], &udp));
        assert!(soak_incident_had_loss(&far, &[ts("2026-01-12T21:01:03.5Z")], &[]));
        let soak = SoakRecord {
            minutes: 2.0,
            started: ts("2026-01-12T20:59:30Z"),
            finished: ts("2026-01-12T21:01:30Z"),
            incidents: vec![
                SeenIncident { view: near, first_seen: ts("2026-01-12T21:00:10Z"), raw: Value::Null },
                SeenIncident { view: far, first_seen: ts("2026-01-12T21:01:01Z"), raw: Value::Null },
            ],
            failed_probes: vec![],
            udp,
            udp_sent: 2400,
            udp_received: 2398,
        };
        assert_eq!(soak.counts(), (1, 1));
        assert!((soak.hours() - 2.0 / 60.0).abs() < 1e-9);
    }

    #[test]
    fn chunked_and_plain_responses_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]";
        assert_eq!(parse_http_response(plain).unwrap(), "[]");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[{}\r\n1\r\n]\r\n0\r\n\r\n";
        assert_eq!(parse_http_response(chunked).unwrap(), "[{}]");
        assert!(parse_http_response(b"HTTP/1.1 503 Unavailable\r\n\r\n").is_err());
    }

    #[test]
    fn the_report_has_every_section_and_judges_the_goals() {
        let good = seen(
            incident(
                "g",
                "2026-01-12T20:58:41.3Z",
                Some("2026-01-12T20:58:49.6Z"),
                8.3,
                &[("process_restart", "ovs-vswitchd")],
            ),
            "2026-01-12T20:58:41.8Z",
        );
        let runs = vec![run(Scenario::SdnUpgrade, vec![good]), run(Scenario::BenignRestart, vec![])];
        let meta = Meta {
            command: "cargo xtask eval --repeat 1".into(),
            date: ts("2026-01-12T21:00:00Z"),
            kernel: "6.12.0".into(),
            commit: "abc1234".into(),
            repeat: 1,
            soak_minutes: None,
            total_seconds: 95.0,
        };
        let text = render(&meta, &runs, None);
        for needle in [
            "# Detection quality",
            "kernel `6.12.0`, commit `abc1234`",
            "## Summary",
            "| recall (runs of scenarios expecting an incident that got one) | 100 % (1/1) | 100 % | met |",
            "| top-1 cause accuracy (of those runs) | 100 % (1/1) | ≥ 95 % | met |",
            "| false incidents | 0: 0 in decoy runs, 0 extra in incident runs, no soak | 0 | met |",
            "## Per scenario",
            "| sdn-upgrade | incident, process_restart ovs-vswitchd | 1 | 1 | 1/1 | 0 |",
            "| benign-restart | no incident | 1 | 0 | — | 0 |",
            "## Per run",
            "`g`",
            "— / 168",
            "## Soak: natural traffic, no fault",
            "Not run",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        // Latency 0.6 s (first loss 41.2, seen 41.8) meets the goal; duration error 0.3 s too.
        assert!(text.contains("| 0.30 s | ≤ 1 s | met |"), "{text}");
        assert!(text.contains("| 0.60 s | ≤ 1 s | met |"), "{text}");
        // A missed run is called out.
        let missed = render(&meta, &[run(Scenario::OvsRestart, vec![])], None);
        assert!(missed.contains("0 % (0/1) | 100 % | **missed** |"), "{missed}");
        assert!(missed.contains("**none**"), "{missed}");
    }
}
