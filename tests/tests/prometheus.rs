//! The Prometheus side of the deployment: the rule file and the PrometheusRule carry the
//! same rules, promtool accepts them and passes their unit tests, the dashboard is valid,
//! every alert has its runbook; and, end to end (root), a real Prometheus scraping the real
//! agent fires `DatapathDisruptionInProgress` during an iptables DROP and resolves it after.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use datapath_monitor_tests::{Agent, Netns, Pod, TempDir, UdpStream, http_get_port, require_root, unique_comm};
use serde_json::Value;

/// The eight alerts, as named in the manifests, the runbooks and the dashboard.
const ALERTS: [&str; 8] = [
    "DatapathDisruptionInProgress",
    "DatapathDisruptionsRecurring",
    "DatapathSDNProcessRestarting",
    "DatapathCNIDefaultNetworkMissing",
    "DatapathMonitorDown",
    "DatapathMonitorSourceDown",
    "DatapathMonitorKernelMapFull",
    "DatapathMonitorFlowTableFull",
];
const RUNBOOK_BASE: &str = "https://github.com/datapath-monitor/datapath-monitor/blob/main/deploy/README.md#";
const PROMETHEUS_PORT: u16 = 9090;
const UDP_PORT: u16 = 7000;
/// Datagrams per second from the pod.
const RATE: u64 = 100;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(path)
}

/// A YAML file as a JSON value (YAML parsed by a YAML parser, compared as plain data).
fn yaml(path: &str) -> Result<Value> {
    let text = fs::read_to_string(deploy(path)).with_context(|| format!("reading deploy/{path}"))?;
    serde_norway::from_str(&text).with_context(|| format!("parsing deploy/{path}"))
}

fn alert_rules(groups: &Value) -> Vec<&Value> {
    groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

#[test]
fn the_rule_file_and_the_prometheus_rule_carry_the_same_rules() -> Result<()> {
    let file = yaml("prometheus/rules.yaml")?;
    let rule = yaml("base/prometheusrule.yaml")?;
    ensure!(rule["apiVersion"] == "monitoring.coreos.com/v1" && rule["kind"] == "PrometheusRule", "{rule:#}");
    ensure!(rule["metadata"]["labels"]["app.kubernetes.io/name"] == "datapath-monitor", "{:#}", rule["metadata"]);
    ensure!(rule["metadata"].get("namespace").is_none(), "the PrometheusRule is namespace-less");
    ensure!(file["groups"].is_array(), "rules.yaml has no groups");
    ensure!(
        file["groups"] == rule["spec"]["groups"],
        "deploy/prometheus/rules.yaml and deploy/base/prometheusrule.yaml differ:\n{:#}\nvs\n{:#}",
        file["groups"],
        rule["spec"]["groups"]
    );

    let alerts = alert_rules(&file["groups"]);
    let names: BTreeSet<&str> = alerts.iter().filter_map(|r| r["alert"].as_str()).collect();
    ensure!(names == ALERTS.into_iter().collect(), "alerts {names:?}, expected {ALERTS:?}");
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap_or_default();
        let severity = &alert["labels"]["severity"];
        ensure!(severity == "warning" || severity == "critical", "{name}: severity {severity}");
        for key in ["summary", "description"] {
            ensure!(alert["annotations"][key].as_str().is_some_and(|s| !s.is_empty()), "{name}: no {key}");
        }
        let runbook = format!("{RUNBOOK_BASE}{}", name.to_lowercase());
        ensure!(alert["annotations"]["runbook_url"] == runbook.as_str(), "{name}: runbook_url is not {runbook}");
    }
    Ok(())
}

#[test]
fn every_alert_has_a_runbook_section_and_the_dashboard_is_valid() -> Result<()> {
    let runbooks = fs::read_to_string(deploy("README.md"))?;
    for name in ALERTS {
        ensure!(
            runbooks.lines().any(|l| l.trim() == format!("### {name}")),
            "deploy/README.md: no `### {name}` runbook"
        );
    }
    let text = fs::read_to_string(deploy("grafana/datapath-monitor.json"))?;
    let dashboard: Value = serde_json::from_str(&text).context("the dashboard is not JSON")?;
    let variables = dashboard["templating"]["list"].as_array().context("no template variables")?;
    ensure!(
        variables.iter().any(|v| v["name"] == "datasource" && v["query"] == "prometheus"),
        "no datasource variable"
    );
    ensure!(variables.iter().any(|v| v["name"] == "node"), "no node variable");
    let panels = dashboard["panels"].as_array().context("no panels")?;
    let expressions: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    for metric in [
        "datapath_drops_total",
        "datapath_tcp_resets_total",
        "datapath_tcp_syn_retransmits_total",
        "datapath_lifecycle_events_total",
        "datapath_cni_default_network_present",
        "datapath_sdn_process_restarts_total",
        "datapath_probe_loaded",
        "datapath_interfaces_attached",
        "datapath_bpf_map_update_errors_total",
    ] {
        ensure!(expressions.iter().any(|e| e.contains(metric)), "no panel queries {metric}");
    }
    for panel in panels {
        let datasource = &panel["datasource"]["uid"];
        ensure!(
            panel["type"] == "row" || datasource == "${datasource}",
            "panel {} datasource {datasource}",
            panel["title"]
        );
    }
    Ok(())
}

/// `promtool` on this machine, or None (then the check is skipped, except in CI).
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "promtool is missing (Debian package `prometheus`)");
        println!("promtool not installed (Debian package `prometheus`): skipped");
    }
    found.then_some("promtool")
}

fn run(args: &[&str]) -> Result<String> {
    let output = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("running {args:?}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    ensure!(output.status.success(), "{args:?} failed:\n{text}");
    Ok(text)
}

#[test]
fn promtool_accepts_both_rule_files_and_passes_the_rule_unit_tests() -> Result<()> {
    let Some(promtool) = promtool() else { return Ok(()) };
    let rules = deploy("prometheus/rules.yaml");
    println!("{}", run(&[promtool, "check", "rules", rules.to_str().context("path")?])?);
    // The PrometheusRule's groups, as a rule file of their own (JSON is YAML).
    let dir = TempDir::new("dmrules")?;
    let extracted = dir.join("prometheusrule-groups.yaml");
    let groups = &yaml("base/prometheusrule.yaml")?["spec"]["groups"];
    fs::write(&extracted, serde_json::to_string_pretty(&serde_json::json!({ "groups": groups }))?)?;
    println!("{}", run(&[promtool, "check", "rules", extracted.to_str().context("path")?])?);
    let tests = deploy("prometheus/rules_test.yaml");
    println!("{}", run(&[promtool, "test", "rules", tests.to_str().context("path")?])?);
    Ok(())
}

/// Percent-encodes a query string value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A real Prometheus inside a netns; killed (and its TSDB removed) on drop.
struct Prometheus<'a> {
    ns: &'a Netns,
    child: Child,
    dir: TempDir,
}

impl<'a> Prometheus<'a> {
    fn start(ns: &'a Netns) -> Result<Self> {
        let binary = Path::new("/usr/bin/prometheus");
        ensure!(binary.exists(), "{} is missing (Debian package `prometheus`)", binary.display());
        let rules = deploy("prometheus/rules.yaml").canonicalize().context("deploy/prometheus/rules.yaml")?;
        let dir = TempDir::new("dmprom")?;
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: datapath-monitor\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
                rules.display(),
                datapath_monitor_tests::AGENT_PORT
            ),
        )?;
        let log = fs::File::create(dir.join("prometheus.log"))?;
        let (config, tsdb) = (
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
        );
        let listen = format!("--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}");
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "/usr/bin/prometheus", &config, &tsdb, &listen])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let mut prometheus = Self { ns, child, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = prometheus.child.try_wait()? {
                bail!("prometheus exited with {status}:\n{}", prometheus.log());
            }
            if let Ok((200, _)) = prometheus.get("/-/ready") {
                return Ok(prometheus);
            }
            ensure!(Instant::now() < deadline, "prometheus not ready after 30 s:\n{}", prometheus.log());
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Result<(u16, String)> {
        let path = path.to_string();
        self.ns.run(move || http_get_port(PROMETHEUS_PORT, &path))?
    }

    /// The `data` of a successful API answer.
    fn api(&self, path: &str) -> Result<Value> {
        let (status, body) = self.get(path)?;
        ensure!(status == 200, "GET {path} answered {status}: {body}");
        let value: Value = serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON: {body}"))?;
        ensure!(value["status"] == "success", "GET {path}: {value}");
        Ok(value["data"].clone())
    }

    /// The alerts Prometheus reports (pending or firing) with this name.
    fn alerts(&self, name: &str) -> Result<Vec<Value>> {
        let data = self.api("/api/v1/alerts")?;
        let alerts = data["alerts"].as_array().context("alerts array")?;
        Ok(alerts.iter().filter(|a| a["labels"]["alertname"] == name).cloned().collect())
    }

    fn firing(&self, name: &str) -> Result<Option<Value>> {
        Ok(self.alerts(name)?.into_iter().find(|a| a["state"] == "firing"))
    }

    /// The value of an instant query's only sample.
    fn scalar(&self, query: &str) -> Result<f64> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(query)))?;
        let result = data["result"].as_array().context("result")?;
        ensure!(result.len() == 1, "{query}: {data}");
        result[0]["value"][1].as_str().context("value")?.parse().context("value")
    }
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid (`ip netns exec` execs prometheus).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An iptables rule in a netns, deleted on drop.
struct Iptables<'a> {
    ns: &'a Netns,
    rule: Vec<String>,
}

impl<'a> Iptables<'a> {
    fn insert(ns: &'a Netns, rule: &[&str]) -> Result<Self> {
        let args: Vec<&str> = ["iptables", "-I"].into_iter().chain(rule.iter().copied()).collect();
        ns.exec(&args)?;
        Ok(Self { ns, rule: rule.iter().map(|s| s.to_string()).collect() })
    }
}

impl Drop for Iptables<'_> {
    fn drop(&mut self) {
        let args: Vec<&str> = ["iptables", "-D"].into_iter().chain(self.rule.iter().map(String::as_str)).collect();
        let _ = self.ns.exec(&args);
    }
}

/// The agent, Prometheus and a UDP stream in one netns; an 8 s iptables DROP in between.
#[test]
#[ignore = "needs root and /usr/bin/prometheus: run through cargo xtask test"]
fn a_real_prometheus_fires_disruption_in_progress_during_a_drop_and_resolves_it_after() -> Result<()> {
    require_root();
    let host = Netns::new("dmtm")?;
    let pod = Pod::new(&host, 5)?;
    let dirs = TempDir::new("dmmoncni")?;
    let state = TempDir::new("dmmonstate")?;
    // A valid default network, so DatapathCNIDefaultNetworkMissing has no reason to pend.
    fs::write(dirs.join("10-test.conf"), r#"{"cniVersion": "0.4.0", "name": "test", "type": "bridge"}"#)?;
    // A watched name no other test's processes carry.
    let sdn = unique_comm("dmnone-");
    let (dir, state_dir) = (dirs.display(), state.display());
    let args = ["--sdn-process", &sdn, "--cni-dir", &dir, "--cni-cache-dir", &dir, "--state-dir", &state_dir];
    let agent = Agent::start(&host, &args)?;
    let prometheus = Prometheus::start(&host)?;

    // A healthy steady stream: a listener on the host, RATE datagrams a second from the pod.
    let stream = UdpStream::start(&host, &pod, UDP_PORT, RATE)?;

    // Baseline warm-up (32 samples judged); Prometheus scrapes the agent meanwhile.
    agent.wait_samples(32)?;
    ensure!(prometheus.scalar("up{job=\"datapath-monitor\"}")? == 1.0, "target not up:\n{}", prometheus.log());
    ensure!(prometheus.firing("DatapathDisruptionInProgress")?.is_none(), "fired before any disruption");
    ensure!(agent.metrics()?.value("datapath_incident_active", &[]) == 0.0, "an incident before the DROP");

    // The DROP, for 8 s: the alert must fire while it is in place.
    let drop_rule = Iptables::insert(
        &host,
        &["INPUT", "-i", &pod.veth, "-p", "udp", "--dport", &UDP_PORT.to_string(), "-j", "DROP"],
    )?;
    let dropped_from = Instant::now();
    let mut fired = None;
    while dropped_from.elapsed() < Duration::from_secs(8) {
        if fired.is_none()
            && let Some(alert) = prometheus.firing("DatapathDisruptionInProgress")?
        {
            fired = Some((dropped_from.elapsed(), alert));
        }
        thread::sleep(Duration::from_millis(200));
    }
    drop(drop_rule);
    let removed_at = Instant::now();
    let (latency, alert) = fired.with_context(|| {
        format!("DatapathDisruptionInProgress never fired during the 8 s DROP; agent log:\n{}", agent.log_text())
    })?;
    println!("DROP inserted → DatapathDisruptionInProgress firing: {latency:?}");
    println!("the alert as Prometheus reported it:\n{}", serde_json::to_string_pretty(&alert)?);
    ensure!(alert["labels"]["severity"] == "warning" && alert["labels"]["job"] == "datapath-monitor", "{alert:#}");
    let description = alert["annotations"]["description"].as_str().unwrap_or_default();
    // Incidents are counted when they end: the description does not count them while one is open.
    ensure!(description.contains("127.0.0.1:9781") && description.contains("packets lost"), "{alert:#}");
    ensure!(
        alert["annotations"]["runbook_url"] == format!("{RUNBOOK_BASE}datapathdisruptioninprogress").as_str(),
        "{alert:#}"
    );
    // The agent is up and scraped: its Down alert is neither firing nor pending.
    let down = prometheus.alerts("DatapathMonitorDown")?;
    ensure!(down.is_empty(), "DatapathMonitorDown while the agent runs: {down:#?}");

    // Resolved: the incident closes 4 s (incident_quiet_ms) after its last bad sample,
    // then the next scrape and evaluation clear the alert.
    let deadline = removed_at + Duration::from_secs(20);
    while !prometheus.alerts("DatapathDisruptionInProgress")?.is_empty() {
        ensure!(
            Instant::now() < deadline,
            "DatapathDisruptionInProgress still reported 20 s after the DROP went: {:#?}",
            prometheus.alerts("DatapathDisruptionInProgress")?
        );
        thread::sleep(Duration::from_millis(200));
    }
    println!("DROP removed → DatapathDisruptionInProgress resolved: {:?}", removed_at.elapsed());

    // The first incident of its cause counts: the recorded per-target sum saw it. The
    // recording rule is in its own group, evaluated at its own offset in the 1 s interval,
    // so it may see the closing scrape an evaluation after the alert group did.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let recorded = prometheus.scalar("instance:datapath_incidents_total:sum")?;
        if recorded == 1.0 {
            break;
        }
        ensure!(
            Instant::now() < deadline && recorded == 0.0,
            "instance:datapath_incidents_total:sum is {recorded}, expected 1 (one incident)"
        );
        thread::sleep(Duration::from_millis(200));
    }
    // Every rule evaluated without error on real data.
    let groups = prometheus.api("/api/v1/rules")?;
    for rule in
        groups["groups"].as_array().into_iter().flatten().flat_map(|g| g["rules"].as_array().into_iter().flatten())
    {
        ensure!(rule["health"] != "err", "rule {} failed: {}", rule["name"], rule["lastError"]);
    }
    ensure!(prometheus.alerts("DatapathMonitorDown")?.is_empty(), "DatapathMonitorDown while the agent runs");
    // Every query of the dashboard (Grafana's variables filled in) is valid PromQL here.
    let dashboard: Value = serde_json::from_str(&fs::read_to_string(deploy("grafana/datapath-monitor.json"))?)?;
    let panels = dashboard["panels"].as_array().into_iter().flatten();
    let annotations = dashboard["annotations"]["list"].as_array().into_iter().flatten();
    for query in panels
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .chain(annotations)
        .filter_map(|t| t["expr"].as_str())
    {
        let query = query.replace("$node", ".*").replace("$__rate_interval", "1m").replace("$__range", "1h");
        prometheus
            .api(&format!("/api/v1/query?query={}", encode(&query)))
            .with_context(|| format!("dashboard query {query}"))?;
    }
    ensure!(prometheus.alerts("DatapathCNIDefaultNetworkMissing")?.is_empty(), "CNI alert with a valid config");

    stream.stop()?;
    drop(prometheus);
    drop(agent);
    Ok(())
}
