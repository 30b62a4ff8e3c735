//! The prober's and the UDP client's JSON-lines logs: one line per probe / per second, read back
//! forgivingly (a torn or foreign line is skipped), and the outage a scenario caused, computed
//! from the probes the way kubelet sees it (first failed probe → first successful one).

use std::path::Path;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// One readiness probe of the lab's kubelet-like prober.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// When the probe started (connect + GET with a 1 s total timeout).
    pub at: Timestamp,
    /// HTTP 200 within the timeout.
    pub ok: bool,
    /// Why it failed, in kubelet's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Probe {
    /// The JSON line the prober appends for this probe (`at` with millisecond precision).
    pub fn to_line(&self) -> String {
        let mut value = serde_json::json!({ "at": format!("{:.3}", self.at), "ok": self.ok });
        if let Some(error) = &self.error {
            value["error"] = serde_json::Value::String(error.clone());
        }
        value.to_string()
    }
}

/// A window in which the prober failed: from the first failed probe to the first successful
/// probe after the last failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outage {
    /// Start of the first failed probe.
    pub first_failure: Timestamp,
    /// Start of the first successful probe after the last failure (the window's end when
    /// `ongoing`).
    pub recovered: Timestamp,
    /// `recovered - first_failure` in seconds.
    pub seconds: f64,
    /// Failed probes in the window.
    pub failed_probes: usize,
    /// No successful probe followed the last failure.
    #[serde(default)]
    pub ongoing: bool,
}

/// Parses prober log text, skipping lines that are not probes.
pub fn parse_probes(text: &str) -> Vec<Probe> {
    text.lines().filter_map(|line| serde_json::from_str::<Probe>(line.trim()).ok()).collect()
}

/// Reads the prober log at `path` (no file: no probes), keeping probes at or after `since`,
/// in the order they started (overlapping probes are logged as they finish).
pub fn read_probes(path: &Path, since: Option<Timestamp>) -> anyhow::Result<Vec<Probe>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(anyhow::anyhow!("cannot read prober log {}: {error}", path.display())),
    };
    let mut probes: Vec<Probe> =
        parse_probes(&text).into_iter().filter(|probe| since.is_none_or(|since| probe.at >= since)).collect();
    probes.sort_by_key(|probe| probe.at);
    Ok(probes)
}

/// The outage among `probes` started in `[from, until]`: None when none of them failed.
pub fn compute_outage(probes: &[Probe], from: Timestamp, until: Timestamp) -> Option<Outage> {
    let mut window: Vec<&Probe> = probes.iter().filter(|probe| probe.at >= from && probe.at <= until).collect();
    window.sort_by_key(|probe| probe.at);
    let first = window.iter().position(|probe| !probe.ok)?;
    let last = window.iter().rposition(|probe| !probe.ok)?;
    let failed_probes = window.iter().filter(|probe| !probe.ok).count();
    let first_failure = window[first].at;
    let recovery = window[last + 1..].iter().find(|probe| probe.ok).map(|probe| probe.at);
    let recovered = recovery.unwrap_or(until);
    Some(Outage {
        first_failure,
        recovered,
        seconds: seconds_between(first_failure, recovered),
        failed_probes,
        ongoing: recovery.is_none(),
    })
}

/// Whether the prober is ready again after `after`: its last `needed` probes started at or
/// after `after` all succeeded.
pub fn ready_since(probes: &[Probe], after: Timestamp, needed: usize) -> bool {
    let recent: Vec<&Probe> = probes.iter().filter(|probe| probe.at >= after).collect();
    recent.len() >= needed && recent[recent.len() - needed..].iter().all(|probe| probe.ok)
}

/// Seconds from `earlier` to `later` (negative when `later` is earlier).
pub fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64()
}

/// One second of the UDP client: datagrams sent and echoes received, and the datagrams it
/// declared lost in that second (no echo 1 s after sending; older logs lack these fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpSecond {
    /// End of the second.
    pub at: Timestamp,
    /// Datagrams sent in that second.
    pub sent: u64,
    /// Echoes received in that second.
    pub received: u64,
    /// Datagrams declared lost in that second (sent 1–2 s earlier, never echoed).
    #[serde(default)]
    pub lost: u64,
    /// Send time of the first datagram declared lost in that second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_lost_at: Option<Timestamp>,
    /// Send time of the last datagram declared lost in that second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_lost_at: Option<Timestamp>,
}

/// Where the UDP client lost datagrams: send times of the first and the last lost datagram.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossWindow {
    /// Send time of the first lost datagram.
    pub first_lost: Timestamp,
    /// Send time of the last lost datagram.
    pub last_lost: Timestamp,
    /// Datagrams lost.
    pub lost: u64,
}

impl LossWindow {
    /// `last_lost - first_lost` in seconds.
    pub fn seconds(&self) -> f64 {
        seconds_between(self.first_lost, self.last_lost)
    }
}

/// The UDP loss among `seconds` whose lost datagrams were sent in `[from, until]`: None when no
/// datagram sent then was lost. A second whose lost datagrams straddle a window edge counts
/// whole (its record has only the first and last send times and the count).
pub fn udp_loss_window(seconds: &[UdpSecond], from: Timestamp, until: Timestamp) -> Option<LossWindow> {
    let mut window: Option<LossWindow> = None;
    for second in seconds.iter().filter(|second| second.lost > 0) {
        let (Some(first), Some(last)) = (second.first_lost_at, second.last_lost_at) else { continue };
        if last < from || first > until {
            continue;
        }
        window = Some(match window {
            None => LossWindow { first_lost: first, last_lost: last, lost: second.lost },
            Some(w) => LossWindow {
                first_lost: w.first_lost.min(first),
                last_lost: w.last_lost.max(last),
                lost: w.lost + second.lost,
            },
        });
    }
    window
}

/// Parses UDP client log text, skipping lines that are not per-second records.
pub fn parse_udp(text: &str) -> Vec<UdpSecond> {
    text.lines().filter_map(|line| serde_json::from_str::<UdpSecond>(line.trim()).ok()).collect()
}

/// Datagrams sent and echoes received in seconds ending in `[from, until]`.
pub fn udp_totals(seconds: &[UdpSecond], from: Timestamp, until: Timestamp) -> (u64, u64) {
    seconds
        .iter()
        .filter(|second| second.at >= from && second.at <= until)
        .fold((0, 0), |(sent, received), second| (sent + second.sent, received + second.received))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn probe(at: &str, ok: bool) -> Probe {
        Probe { at: ts(at), ok, error: (!ok).then(|| "timeout".to_string()) }
    }

    #[test]
    fn probe_lines_round_trip_and_bad_lines_are_skipped() {
        let p = Probe { at: ts("2026-01-12T20:58:46.230Z"), ok: false, error: Some("dial tcp: i/o timeout".into()) };
        let line = p.to_line();
        assert!(line.contains("\"at\":\"2026-01-12T20:58:46.230Z\""), "{line}");
        let ok = Probe { at: ts("2026-01-12T20:58:47Z"), ok: true, error: None };
        assert!(!ok.to_line().contains("error"));
        let text = format!(
            "{line}\nnot json\n{{\"at\":\"bad\",\"ok\":true}}\n{}\n{{\"at\":\"2026-01-12T20:58:48",
            ok.to_line()
        );
        assert_eq!(parse_probes(&text), vec![p, ok]);
    }

    #[test]
    fn outage_runs_from_first_failure_to_first_success_after_last_failure() {
        let probes = vec![
            probe("2026-01-12T20:58:40Z", true),
            probe("2026-01-12T20:58:41.5Z", false),
            probe("2026-01-12T20:58:42.5Z", false),
            probe("2026-01-12T20:58:43.5Z", true),
            probe("2026-01-12T20:58:44.5Z", false),
            probe("2026-01-12T20:58:45.9Z", true),
            probe("2026-01-12T20:58:46.9Z", true),
        ];
        let outage = compute_outage(&probes, ts("2026-01-12T20:58:39Z"), ts("2026-01-12T20:59:00Z")).unwrap();
        assert_eq!(outage.first_failure, ts("2026-01-12T20:58:41.5Z"));
        assert_eq!(outage.recovered, ts("2026-01-12T20:58:45.9Z"));
        assert!((outage.seconds - 4.4).abs() < 1e-9);
        assert_eq!(outage.failed_probes, 3);
        assert!(!outage.ongoing);
        // Probes outside the window do not count.
        assert_eq!(compute_outage(&probes, ts("2026-01-12T20:58:45Z"), ts("2026-01-12T20:59:00Z")), None);
        assert!(compute_outage(&[], ts("2026-01-12T20:58:45Z"), ts("2026-01-12T20:59:00Z")).is_none());
    }

    #[test]
    fn outage_without_recovery_is_ongoing_until_the_window_end() {
        let probes = vec![probe("2026-01-12T20:58:40Z", true), probe("2026-01-12T20:58:41Z", false)];
        let outage = compute_outage(&probes, ts("2026-01-12T20:58:39Z"), ts("2026-01-12T20:58:50Z")).unwrap();
        assert!(outage.ongoing);
        assert_eq!(outage.recovered, ts("2026-01-12T20:58:50Z"));
        assert!((outage.seconds - 9.0).abs() < 1e-9);
    }

    #[test]
    fn ready_needs_the_last_probes_after_the_mark_to_succeed() {
        let probes = vec![
            probe("2026-01-12T20:58:40Z", false),
            probe("2026-01-12T20:58:41Z", true),
            probe("2026-01-12T20:58:42Z", true),
        ];
        assert!(ready_since(&probes, ts("2026-01-12T20:58:40.5Z"), 2));
        assert!(!ready_since(&probes, ts("2026-01-12T20:58:39Z"), 3));
        assert!(!ready_since(&probes, ts("2026-01-12T20:58:41.5Z"), 2));
    }

    #[test]
    fn udp_loss_window_spans_the_lost_send_times() {
        // An old line (no loss fields) still parses; lost datagrams outside the window are left out.
        let text = "{\"at\":\"2026-01-12T20:58:40Z\",\"sent\":20,\"received\":20}\n\
                    {\"at\":\"2026-01-12T20:58:41Z\",\"sent\":20,\"received\":20,\"lost\":2,\
                     \"first_lost_at\":\"2026-01-12T20:58:30.100Z\",\"last_lost_at\":\"2026-01-12T20:58:30.150Z\"}\n\
                    {\"at\":\"2026-01-12T20:58:43Z\",\"sent\":20,\"received\":5,\"lost\":7,\
                     \"first_lost_at\":\"2026-01-12T20:58:41.600Z\",\"last_lost_at\":\"2026-01-12T20:58:41.900Z\"}\n\
                    {\"at\":\"2026-01-12T20:58:44Z\",\"sent\":20,\"received\":0,\"lost\":20,\
                     \"first_lost_at\":\"2026-01-12T20:58:41.950Z\",\"last_lost_at\":\"2026-01-12T20:58:42.900Z\"}\n\
                    {\"at\":\"2026-01-12T20:58:45Z\",\"sent\":20,\"received\":20,\"lost\":0}\n";
        let seconds = parse_udp(text);
        assert_eq!(seconds.len(), 5);
        assert_eq!(seconds[0].lost, 0);
        assert_eq!(seconds[0].first_lost_at, None);
        let window = udp_loss_window(&seconds, ts("2026-01-12T20:58:40Z"), ts("2026-01-12T20:58:50Z")).unwrap();
        assert_eq!(window.first_lost, ts("2026-01-12T20:58:41.600Z"));
        assert_eq!(window.last_lost, ts("2026-01-12T20:58:42.900Z"));
        assert_eq!(window.lost, 27);
        assert!((window.seconds() - 1.3).abs() < 1e-9);
        // A window touching only the end of a second's losses takes that second whole.
        let tail = udp_loss_window(&seconds, ts("2026-01-12T20:58:42.5Z"), ts("2026-01-12T20:58:50Z")).unwrap();
        assert_eq!((tail.first_lost, tail.lost), (ts("2026-01-12T20:58:41.950Z"), 20));
        assert_eq!(udp_loss_window(&seconds, ts("2026-01-12T20:58:43Z"), ts("2026-01-12T20:58:50Z")), None);
        // The per-second line round-trips; no loss fields are written when nothing was lost.
        let line = serde_json::to_string(&seconds[3]).unwrap();
        assert_eq!(parse_udp(&line), vec![seconds[3].clone()]);
        assert!(!serde_json::to_string(&seconds[4]).unwrap().contains("first_lost_at"));
    }

    #[test]
    fn udp_totals_sum_the_window() {
        let text = "{\"at\":\"2026-01-12T20:58:40Z\",\"sent\":20,\"received\":20}\n\
                    {\"at\":\"2026-01-12T20:58:41Z\",\"sent\":20,\"received\":3}\ngarbage\n\
                    {\"at\":\"2026-01-12T20:58:42Z\",\"sent\":20,\"received\":0}\n";
        let seconds = parse_udp(text);
        assert_eq!(seconds.len(), 3);
        assert_eq!(udp_totals(&seconds, ts("2026-01-12T20:58:40.5Z"), ts("2026-01-12T20:58:42Z")), (40, 3));
    }
}
