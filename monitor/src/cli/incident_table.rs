//! `datapath-monitor incidents`: renders the `/api/v1/incidents` JSON array (newest first)
//! for people, one table row per incident followed by its detail lines (message, interfaces,
//! suspected causes). Works on `serde_json::Value` so that an agent of another version still
//! prints what both understand; missing fields print as `-`.

use std::fmt::Write as _;

use serde_json::Value;

use super::table::{clean, clip, column_widths, format_row, text};

/// At most this many interfaces are listed under an incident.
const MAX_INTERFACES: usize = 10;
/// At most this many drop reasons are listed for one interface.
const MAX_REASONS: usize = 4;

const HEADER: [&str; 9] = ["ID", "START", "DURATION", "STATE", "IFACES", "LOST", "DROPS", "SYN RETX", "TOP CAUSE"];

/// Renders the incidents answer (a JSON array, newest first) as a table with detail lines.
pub fn render_incidents(incidents: &Value) -> String {
    let Some(all) = incidents.as_array() else {
        return format!("unexpected answer, not a list of incidents: {}\n", clip(&incidents.to_string(), 200));
    };
    let objects: Vec<&Value> = all.iter().filter(|i| i.is_object()).collect();
    let mut out = String::new();
    if objects.is_empty() {
        out.push_str("no incidents recorded\n");
    } else {
        let rows: Vec<Vec<String>> = objects.iter().map(|i| summary_row(i)).collect();
        let widths = column_widths(Some(&HEADER), &rows);
        out.push_str(&format_row(&HEADER.map(String::from), &widths));
        for (n, (incident, row)) in objects.iter().zip(&rows).enumerate() {
            if n > 0 {
                out.push('\n');
            }
            out.push_str(&format_row(row, &widths));
            details(&mut out, incident);
        }
    }
    let ignored = all.len() - objects.len();
    if ignored > 0 {
        let _ = writeln!(out, "({ignored} entries of the answer were not incidents and are not shown)");
    }
    out
}

fn summary_row(incident: &Value) -> Vec<String> {
    let active = incident["active"].as_bool();
    let state = match active {
        Some(true) => "ACTIVE",
        Some(false) => "closed",
        None if incident["end"].is_string() => "closed",
        None => "-",
    };
    let duration = match (seconds(&incident["duration_seconds"]), active) {
        (Some(d), Some(true)) => format!("{d} so far"),
        (Some(d), _) => d,
        (None, _) => "-".into(),
    };
    let totals = &incident["totals"];
    let top_cause = match incident["causes"].as_array() {
        Some(causes) if causes.is_empty() => "unattributed".into(),
        Some(causes) => {
            let cause = &causes[0];
            format!(
                "{} {} ({}, {})",
                text(&cause["kind"]),
                text(&cause["subject"]),
                offset(&cause["offset_seconds"]),
                confidence(&cause["confidence"])
            )
        }
        None => "-".into(),
    };
    vec![
        text(&incident["id"]),
        text(&incident["start"]),
        duration,
        state.into(),
        count(&totals["interfaces"]),
        count(&totals["lost_packets"]),
        count(&totals["drops"]),
        count(&totals["syn_retransmits"]),
        top_cause,
    ]
}

/// The lines under an incident's row: message, interfaces, causes.
fn details(out: &mut String, incident: &Value) {
    if let Some(message) = incident["message"].as_str().filter(|m| !m.is_empty()) {
        let _ = writeln!(out, "  {}", clean(message));
    }

    let interfaces = incident["interfaces"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = interfaces.iter().take(MAX_INTERFACES).map(interface_row).collect();
    let widths = column_widths(None, &rows);
    for row in &rows {
        out.push_str("  ");
        out.push_str(&format_row(row, &widths));
    }
    if interfaces.len() > MAX_INTERFACES {
        let _ = writeln!(out, "  … and {} more interfaces", interfaces.len() - MAX_INTERFACES);
    }

    match incident["causes"].as_array() {
        Some(causes) if causes.is_empty() => {
            let _ = writeln!(out, "  causes: none found (no lifecycle event near the start): unattributed");
        }
        Some(causes) => {
            for (n, cause) in causes.iter().enumerate() {
                let lead = if n == 0 { "  causes: " } else { "          " };
                let mut line = format!(
                    "{lead}{} {} at {} ({}, confidence {})",
                    text(&cause["kind"]),
                    text(&cause["subject"]),
                    text(&cause["at"]),
                    offset(&cause["offset_seconds"]),
                    confidence(&cause["confidence"])
                );
                if let Some(detail) = cause["detail"].as_str().filter(|d| !d.is_empty()) {
                    let _ = write!(line, ": {}", clean(detail));
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
        None => {}
    }
}

fn interface_row(interface: &Value) -> Vec<String> {
    let pod = match (interface["pod_namespace"].as_str(), interface["pod"].as_str()) {
        (Some(ns), Some(pod)) if !ns.is_empty() && !pod.is_empty() => format!("{}/{}", clean(ns), clean(pod)),
        (_, Some(pod)) if !pod.is_empty() => clean(pod),
        _ => "-".into(),
    };
    let mut drops = format!("drops {}", count(&interface["drops"]));
    if let Some(reasons) = interface["drop_reasons"].as_object().filter(|r| !r.is_empty()) {
        let mut reasons: Vec<(&String, Option<u64>)> = reasons.iter().map(|(r, n)| (r, n.as_u64())).collect();
        // Most frequent first; names break ties (the map is already sorted by name).
        reasons.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let mut list: Vec<String> = reasons
            .iter()
            .take(MAX_REASONS)
            .map(|(r, n)| format!("{} {}", clean(r), n.map_or_else(|| "-".into(), |n| n.to_string())))
            .collect();
        if reasons.len() > MAX_REASONS {
            list.push(format!("+{} more", reasons.len() - MAX_REASONS));
        }
        let _ = write!(drops, " ({})", list.join(", "));
    }
    let mut lost = format!("lost {}", count(&interface["lost_packets"]));
    if let Some(unanswered) = interface["lost"]["unanswered"].as_u64().filter(|n| *n > 0) {
        let _ = write!(lost, " ({unanswered} unanswered)");
    }
    let mut row = vec![
        text(&interface["interface"]),
        pod,
        lost,
        drops,
        format!("syn retx {}", count(&interface["syn_retransmits"])),
        format!("resets {}", count(&interface["tcp_resets"])),
    ];
    let silent: Vec<String> =
        interface["silent_directions"].as_array().into_iter().flatten().filter_map(Value::as_str).map(clean).collect();
    if !silent.is_empty() {
        row.push(format!("silent {}", silent.join(",")));
    }
    row
}

/// A counter: a non-negative integer, otherwise `-`.
fn count(value: &Value) -> String {
    value.as_u64().map_or_else(|| "-".into(), |n| n.to_string())
}

/// A duration for people: `9.4 s`, `2m05s`, `1h02m`.
fn seconds(value: &Value) -> Option<String> {
    let s = value.as_f64().filter(|s| s.is_finite() && *s >= 0.0)?;
    Some(if s < 59.95 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        let whole = s.round() as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        let minutes = (s / 60.0).round() as u64;
        format!("{}h{:02}m", minutes / 60, minutes % 60)
    })
}

/// A cause's time relative to the incident start, signed: `-1.1 s` is before it began.
fn offset(value: &Value) -> String {
    match value.as_f64().filter(|s| s.is_finite()) {
        Some(s) if s.abs() < 0.05 => "0.0 s".into(),
        Some(s) => format!("{s:+.1} s"),
        None => "- s".into(),
    }
}

fn confidence(value: &Value) -> String {
    value.as_f64().filter(|c| c.is_finite()).map_or_else(|| "-".into(), |c| format!("{c:.2}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The seed incident of DESIGN.md, closed, with 14 interfaces.
    fn seed() -> Value {
        let mut interfaces = vec![json!({
            "interface": "veth1a2b3c4d", "pod_namespace": "openshift-apiserver", "pod": "apiserver-zg25k",
            "drops": 310, "drop_reasons": {"NOT_SPECIFIED": 10, "NO_SOCKET": 300},
            "tcp_resets": 1, "syn_retransmits": 6, "silent_directions": ["egress"],
            "lost_packets": 46, "lost": {"dropped": {}, "retransmitted": 6, "unanswered": 40}})];
        for n in 1..14 {
            interfaces.push(json!({
                "interface": format!("veth0000{n:04x}"), "pod_namespace": "openshift-dns", "pod": format!("dns-{n}"),
                "drops": 300, "drop_reasons": {"NOT_SPECIFIED": 300}, "tcp_resets": 0, "syn_retransmits": 2}));
        }
        json!({
            "id": "2026-01-12T20:58:47.100Z-1", "start": "2026-01-12T20:58:47.100Z",
            "end": "2026-01-12T20:58:56.500Z", "active": false, "duration_seconds": 9.4,
            "totals": {"drops": 4210, "tcp_resets": 3, "syn_retransmits": 37, "interfaces": 14, "lost_packets": 412},
            "interfaces": interfaces,
            "causes": [
                {"kind": "process_restart", "subject": "ovs-vswitchd", "at": "2026-01-12T20:58:46.000Z",
                 "offset_seconds": -1.1, "confidence": 0.8, "detail": "exited (SIGKILL), started again after 2.0 s"},
                {"kind": "cni_default_network_missing", "subject": "/etc/cni/net.d/80-openshift-network.conf",
                 "at": "2026-01-12T20:58:44.200Z", "offset_seconds": -2.9, "confidence": 0.6, "detail": "removed"}],
            "message": "9.4 s pod-network disruption on 14 interfaces (4,210 drops, 37 SYN retransmits, 3 resets)"
        })
    }

    fn assert_contains(out: &str, needles: &[&str]) {
        for needle in needles {
            assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
        }
    }

    #[test]
    fn the_seed_incident_renders_row_interfaces_and_causes() {
        let out = render_incidents(&json!([seed()]));
        assert_contains(
            &out,
            &[
                "ID                          START                     DURATION  STATE   IFACES  LOST  DROPS  SYN RETX  TOP CAUSE\n",
                "2026-01-12T20:58:47.100Z-1  2026-01-12T20:58:47.100Z  9.4 s     closed  14      412   4210   37        process_restart ovs-vswitchd (-1.1 s, 0.80)\n",
                "\n  9.4 s pod-network disruption on 14 interfaces (4,210 drops",
                "  veth1a2b3c4d  openshift-apiserver/apiserver-zg25k  lost 46 (40 unanswered)  drops 310 (NO_SOCKET 300, NOT_SPECIFIED 10)  syn retx 6  resets 1  silent egress\n",
                "openshift-dns/dns-9 ",
                "  … and 4 more interfaces\n",
                "  causes: process_restart ovs-vswitchd at 2026-01-12T20:58:46.000Z (-1.1 s, confidence 0.80): exited (SIGKILL), started again after 2.0 s\n",
                "\n          cni_default_network_missing /etc/cni/net.d/80-openshift-network.conf at 2026-01-12T20:58:44.200Z (-2.9 s, confidence 0.60): removed\n",
            ],
        );
        // Ten interfaces listed, no more.
        assert_eq!(out.lines().filter(|l| l.starts_with("  veth")).count(), MAX_INTERFACES);
        assert!(!out.contains("dns-10"), "{out}");
        assert!(out.lines().all(|l| l == l.trim_end()), "trailing blanks:\n{out}");
    }

    #[test]
    fn an_active_incident_says_so_and_counts_its_duration_so_far() {
        let active = json!({
            "id": "2026-01-12T21:10:00.000Z-2", "start": "2026-01-12T21:10:00.000Z", "end": null, "active": true,
            "duration_seconds": 75.2,
            "totals": {"drops": 12, "tcp_resets": 0, "syn_retransmits": 4, "interfaces": 1},
            "interfaces": [{"interface": "0123456789abcde", "pod_namespace": "ns", "pod": "p", "drops": 12,
                            "drop_reasons": {}, "tcp_resets": 0, "syn_retransmits": 4}],
            "causes": [{"kind": "interface_down", "subject": "br-int", "at": "2026-01-12T21:10:00.300Z",
                        "offset_seconds": 0.3, "confidence": 0.5, "detail": ""}],
            "message": "ongoing"});
        let out = render_incidents(&json!([active, seed()]));
        assert_contains(
            &out,
            &[
                "1m15s so far  ACTIVE",
                "interface_down br-int (+0.3 s, 0.50)",
                "  0123456789abcde  ns/p  lost -  drops 12  syn retx 4  resets 0\n",
                "causes: interface_down br-int at 2026-01-12T21:10:00.300Z (+0.3 s, confidence 0.50)\n",
            ],
        );
        // Newest first, as served, with a blank line between incidents.
        let active_at = out.find("2026-01-12T21:10:00.000Z-2").unwrap();
        let seed_at = out.find("2026-01-12T20:58:47.100Z-1").unwrap();
        assert!(active_at < seed_at);
        assert!(out.contains("\n\n2026-01-12T20:58:47.100Z-1"), "{out}");
    }

    #[test]
    fn an_unattributed_incident_says_unattributed() {
        let mut incident = seed();
        incident["causes"] = json!([]);
        let out = render_incidents(&json!([incident]));
        assert_contains(&out, &["  37        unattributed\n", "causes: none found"]);
    }

    #[test]
    fn empty_garbage_and_partial_answers_do_not_panic() {
        assert_eq!(render_incidents(&json!([])), "no incidents recorded\n");
        assert!(render_incidents(&json!({})).starts_with("unexpected answer"));
        assert!(render_incidents(&json!({"error": "x"})).contains("\"error\""));
        assert!(render_incidents(&Value::Null).starts_with("unexpected answer"));
        let out = render_incidents(&json!([1, 2]));
        assert!(out.starts_with("no incidents recorded\n"), "{out}");
        assert!(out.contains("2 entries"), "{out}");

        // An incident from an agent that knows fewer (or other) fields.
        let out = render_incidents(&json!([{}, {"id": "x", "totals": 7, "interfaces": [{"x": 1}, 5],
            "causes": [{"kind": "process_exit"}], "duration_seconds": "soon", "message": "a\nb\u{1b}[31m"}]));
        assert_contains(
            &out,
            &[
                "-   -      -         -      -       -     -      -         -\n",
                "process_exit - (- s, -)",
                "a\\nb\\u{1b}[31m",
            ],
        );
        assert!(!out.contains('\u{1b}'), "{out}");
    }

    #[test]
    fn durations_and_offsets() {
        assert_eq!(seconds(&json!(0)).as_deref(), Some("0.0 s"));
        assert_eq!(seconds(&json!(9.44)).as_deref(), Some("9.4 s"));
        assert_eq!(seconds(&json!(59.96)).as_deref(), Some("1m00s"));
        assert_eq!(seconds(&json!(3725)).as_deref(), Some("1h02m"));
        assert_eq!(seconds(&json!(-1)), None);
        assert_eq!(offset(&json!(-1.1)), "-1.1 s");
        assert_eq!(offset(&json!(-0.01)), "0.0 s");
        assert_eq!(offset(&json!(2)), "+2.0 s");
    }
}
