//! What the agent reported, what each run expected, and how a run measures against the lab's
//! ground truth; the soak's record; the statistics the report uses.

use dm_lab::{
    FaultPlan, LossWindow, Outage, Roles, Scenario,
    probe_log::{self, UdpSecond, seconds_between},
};
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

/// An incident matches a run when it overlaps the scenario widened by this much each side.
const MATCH_SLACK_SECONDS: f64 = 1.0;

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
    /// The pods its interfaces name (`namespace/pod`), sorted, each once.
    pub pods: Vec<String>,
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
        let mut pods: Vec<String> = value["interfaces"]
            .as_array()
            .map(|interfaces| {
                interfaces
                    .iter()
                    .filter_map(|i| {
                        let (namespace, pod) = (i["pod_namespace"].as_str()?, i["pod"].as_str()?);
                        (!namespace.is_empty() && !pod.is_empty()).then(|| format!("{namespace}/{pod}"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        pods.sort();
        pods.dedup();
        Some(IncidentView {
            id,
            pods,
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
        Scenario::CniFlap | Scenario::BenignRestart | Scenario::RejectsRestart | Scenario::ScanFlap => {
            Expected::Nothing
        }
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
    /// How the fault was shaped, drawn from the eval's seed.
    pub plan: FaultPlan,
    /// Which pods carried the probe and the UDP stream, drawn from the seed too.
    pub roles: Roles,
    /// The pods that lost traffic in truth (`namespace/pod`).
    pub truth_pods: Vec<String>,
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
    /// Incident duration − the lab's outage on either path: from the first loss (failed probe
    /// or lost datagram) to the later of the prober's recovery and the last lost datagram (s).
    pub duration_error_either: Option<f64>,
    /// First seen − first loss (s).
    pub latency: Option<f64>,
    /// `lost_packets` of the matched incident (None: none matched or not reported).
    pub lost_reported: Option<u64>,
    /// UDP datagrams lost + failed probes.
    pub lost_truth: u64,
    /// The matched incident's pods against the truth's.
    pub pods: Option<PodScore>,
}

/// The pods an incident names against those that lost traffic in truth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodScore {
    /// Pods the incident names.
    pub named: usize,
    /// Of those, pods that lost traffic in truth.
    pub right: usize,
    /// Pods that lost traffic in truth.
    pub truth: usize,
}

impl PodScore {
    pub fn of(named: &[String], truth: &[String]) -> Self {
        Self { named: named.len(), right: named.iter().filter(|pod| truth.contains(pod)).count(), truth: truth.len() }
    }

    pub fn add(&mut self, other: &PodScore) {
        self.named += other.named;
        self.right += other.right;
        self.truth += other.truth;
    }
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
    let first = first_lost(run.outage.as_ref(), run.udp_loss.as_ref());
    let last = match (run.outage.as_ref().map(|o| o.recovered), run.udp_loss.as_ref().map(|u| u.last_lost)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    if let (Some(first), Some(last)) = (first, last) {
        assessment.duration_error_either = Some(incident.duration_seconds - seconds_between(first, last));
    }
    assessment.latency = first.map(|lost| seconds_between(lost, seen.first_seen));
    assessment.lost_reported = incident.lost_packets;
    assessment.pods = Some(PodScore::of(&incident.pods, &run.truth_pods));
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

pub(super) fn abs_all(values: &[f64]) -> Vec<f64> {
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

#[cfg(test)]
pub(super) mod fixtures {
    use serde_json::json;

    use super::*;

    pub(in crate::eval) fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    pub(in crate::eval) fn incident(
        id: &str,
        start: &str,
        end: Option<&str>,
        duration: f64,
        causes: &[(&str, &str)],
    ) -> Value {
        let causes: Vec<Value> = causes.iter().map(|(k, s)| json!({"kind": k, "subject": s})).collect();
        json!({
            "id": id, "start": start, "end": end, "active": end.is_none(), "duration_seconds": duration,
            "totals": {"drops": 3}, "causes": causes,
        })
    }

    pub(in crate::eval) fn seen(value: Value, first_seen: &str) -> SeenIncident {
        SeenIncident { view: IncidentView::from_json(&value).unwrap(), first_seen: ts(first_seen), raw: value }
    }

    pub(in crate::eval) fn run(scenario: Scenario, incidents: Vec<SeenIncident>) -> RunRecord {
        RunRecord {
            scenario,
            repeat: 1,
            plan: FaultPlan::default_for(scenario),
            roles: Roles::default(),
            truth_pods: vec![
                "openshift-apiserver/apiserver-zg25k".into(),
                "client/client-1".into(),
                "web/web-1".into(),
            ],
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{fixtures::*, *};

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
        // Pods come from the interfaces, each once, sorted; interfaces without a pod add none.
        new["interfaces"] = json!([
            {"interface": "a", "pod_namespace": "web", "pod": "web-1"},
            {"interface": "b", "pod_namespace": "client", "pod": "client-1"},
            {"interface": "c", "pod_namespace": "web", "pod": "web-1"},
            {"interface": "tun0"},
            {"interface": "br0", "pod_namespace": "", "pod": ""},
        ]);
        assert_eq!(IncidentView::from_json(&new).unwrap().pods, ["client/client-1", "web/web-1"]);
        assert_eq!(
            PodScore::of(&["web/web-1".into(), "x/y".into()], &["web/web-1".into()]),
            PodScore { named: 2, right: 1, truth: 1 }
        );
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
        // Either path: from the datagram lost at 41.2 to the prober's recovery at 49.5.
        assert!(close(a.duration_error_either, 0.4));
        // First loss is the UDP datagram at 41.2, seen at 41.9.
        assert!(close(a.latency, 0.7));
        assert_eq!((a.lost_reported, a.lost_truth), (Some(150), 168));
        // No interfaces named: no pod right, three in truth.
        assert_eq!(a.pods, Some(PodScore { named: 0, right: 0, truth: 3 }));

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
}
