//! `datapath-monitor status`: a running agent's readiness, probes, interfaces, CNI config
//! dirs, SDN processes and recent lifecycle events, from its JSON API.

use std::fmt::Write as _;

use serde_json::Value;

use super::table::{table, text};

pub fn render_status(server: &str, ready: &Value, interfaces: &Value, lifecycle: &Value, events: &Value) -> String {
    let mut out = String::new();
    let attached = ready["interfaces_attached"].as_u64().unwrap_or(0);
    let state = if ready["ready"].as_bool() == Some(true) { "ready" } else { "NOT READY" };
    let _ = writeln!(out, "agent {server}: {state}, {attached} interfaces attached");
    if let Some(sources) = ready["sources"].as_object() {
        for (name, source) in sources.iter().filter(|(_, source)| source["up"].as_bool() == Some(false)) {
            let why = source["error"].as_str().unwrap_or("unknown");
            let _ = writeln!(out, "DEGRADED: source {name} is down, restarting ({why})");
        }
    }
    if let Some(probes) = ready["probes"]["probes"].as_object() {
        let list: Vec<String> = probes
            .iter()
            .map(|(name, variant)| match variant.as_str() {
                Some(variant) => format!("{name}: {variant}"),
                None => {
                    let why = ready["probes"]["errors"][name].as_str().unwrap_or("unsupported");
                    format!("{name}: UNSUPPORTED ({why})")
                }
            })
            .collect();
        let _ = writeln!(out, "probes: {}", list.join(", "));
    }

    let rows: Vec<Vec<String>> = interfaces
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let pod = match (i["pod_namespace"].as_str(), i["pod"].as_str()) {
                (Some(ns), Some(pod)) if !pod.is_empty() => format!("{ns}/{pod}"),
                _ => "-".into(),
            };
            let ips: Vec<String> = i["ips"].as_array().into_iter().flatten().map(text).collect();
            let attach = match (&i["attach_mode"], &i["attach_error"]) {
                (Value::String(mode), _) => mode.clone(),
                (_, Value::String(error)) => format!("failed: {error}"),
                _ => "-".into(),
            };
            vec![
                text(&i["interface"]),
                text(&i["ifindex"]),
                if i["up"].as_bool() == Some(true) { "up".into() } else { "down".into() },
                attach,
                i["peer"]["netns"].as_u64().map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                pod,
                if ips.is_empty() { "-".into() } else { ips.join(",") },
            ]
        })
        .collect();
    let _ = writeln!(out, "\nINTERFACES ({})", rows.len());
    out.push_str(&table(&["INTERFACE", "IFINDEX", "STATE", "ATTACH", "PEER NETNS", "POD", "IPS"], &rows));

    let rows: Vec<Vec<String>> = lifecycle["cni"]["dirs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let default = match &d["default_network"] {
                Value::Object(default) => {
                    format!("{} (network {})", text(&default["file"]), text(&default["network"]))
                }
                _ if d["exists"].as_bool() == Some(true) => "MISSING".into(),
                _ => "-".into(),
            };
            let files = d["files"].as_array().map(Vec::as_slice).unwrap_or_default();
            let invalid = files.iter().filter(|f| f["valid"].as_bool() == Some(false)).count();
            vec![
                text(&d["dir"]),
                if d["exists"].as_bool() == Some(true) { "yes".into() } else { "no".into() },
                default,
                format!("{} ({invalid} invalid)", files.len()),
            ]
        })
        .collect();
    let _ = writeln!(out, "\nCNI CONFIG DIRS");
    out.push_str(&table(&["DIR", "EXISTS", "DEFAULT NETWORK", "FILES"], &rows));

    let rows: Vec<Vec<String>> = lifecycle["processes"]["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let pids: Vec<String> = p["running"].as_array().into_iter().flatten().map(text).collect();
            let last_exit = match (&p["last_exit"], &p["last_exit_detail"]) {
                (Value::String(at), detail) => format!("{at} {}", text(detail)),
                _ => "-".into(),
            };
            vec![
                text(&p["name"]),
                if pids.is_empty() { "NOT RUNNING".into() } else { format!("pid {}", pids.join(",")) },
                text(&p["restarts"]),
                last_exit,
            ]
        })
        .collect();
    let _ = writeln!(out, "\nSDN PROCESSES");
    if let Some(error) = lifecycle["processes"]["error"].as_str() {
        let _ = writeln!(out, "not watched: {error}");
    }
    out.push_str(&table(&["PROCESS", "RUNNING", "RESTARTS", "LAST EXIT"], &rows));

    let all = events.as_array().map(Vec::as_slice).unwrap_or_default();
    let recent = &all[all.len().saturating_sub(15)..];
    let rows: Vec<Vec<String>> = recent
        .iter()
        .map(|e| vec![text(&e["at"]), text(&e["kind"]), text(&e["subject"]), text(&e["detail"])])
        .collect();
    let _ = writeln!(out, "\nRECENT LIFECYCLE EVENTS ({} of {})", recent.len(), all.len());
    out.push_str(&table(&["AT", "KIND", "SUBJECT", "DETAIL"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn status_renders_every_section_and_tolerates_missing_fields() {
        let ready = json!({"ready": true, "interfaces_attached": 1,
            "probes": {"probes": {"tc": "tcx", "sched_process": null}, "errors": {"sched_process": "no tracefs"}},
            "sources": {"link_watch": {"up": true, "error": null, "failures": 0},
                        "cni_config": {"up": false, "error": "cannot watch /etc/cni/net.d: No space left on device (os error 28)", "failures": 1}}});
        let interfaces = json!([{"interface": "veth1a2b3c4d", "ifindex": 5, "up": true, "attach_mode": "tcx",
            "peer": {"ifindex": 2, "netns": 4026532301u64}, "pod_namespace": "openshift-apiserver",
            "pod": "apiserver-zg25k", "ips": ["10.129.0.43/23"]}]);
        let lifecycle = json!({
            "cni": {"dirs": [
                {"dir": "/etc/cni/net.d", "exists": true, "default_network": null, "files": [{"file": "x.conf", "valid": false}]},
                {"dir": "/etc/kubernetes/cni/net.d", "exists": false, "default_network": null, "files": []}]},
            "processes": {"processes": [{"name": "ovs-vswitchd", "running": [1234], "restarts": 1,
                "last_exit": "2026-01-12T20:58:45.100Z", "last_exit_detail": "pid 1200 killed by SIGTERM"}]}});
        let events = json!([{"at": "2026-01-12T20:58:46.230Z", "kind": "cni_config_removed",
            "subject": "/etc/cni/net.d/80-openshift-network.conf", "detail": "deleted"}]);
        let out = render_status("http://127.0.0.1:9781", &ready, &interfaces, &lifecycle, &events);
        for needle in [
            "ready, 1 interfaces attached",
            "sched_process: UNSUPPORTED (no tracefs)",
            "openshift-apiserver/apiserver-zg25k",
            "10.129.0.43/23",
            "MISSING",
            "1 (1 invalid)",
            "pid 1234",
            "killed by SIGTERM",
            "cni_config_removed",
            "DEGRADED: source cni_config is down, restarting (cannot watch /etc/cni/net.d: No space left on device",
        ] {
            assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
        }
        // An older agent without some endpoints' fields still prints.
        let out = render_status("x", &json!({}), &json!([]), &json!({}), &json!([]));
        assert!(out.contains("NOT READY"), "{out}");
    }
}
