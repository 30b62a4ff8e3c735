//! `cargo xtask lab up|status|disrupt SCENARIO|down` and `cargo xtask demo`: the node in a
//! box (crate `datapath-monitor-lab`) and the agent watching it.

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use dm_lab::{Datapath, Lab, NODE_NETNS, Probe, Scenario, datapath};
use serde_json::Value;

use crate::{
    build,
    command::{self, Workspace},
    setup,
};

/// Where the agent listens inside the lab's node namespace.
pub(crate) const AGENT_LISTEN: &str = "127.0.0.1:9781";

pub enum LabAction {
    Up(Datapath),
    Status,
    Disrupt(String),
    Down,
}

pub(crate) fn require_root(what: &str) -> anyhow::Result<()> {
    if !command::is_root() {
        bail!(
            "{what} creates network namespaces, an OVS bridge and processes: run it as root (sudo -E cargo xtask ...)"
        );
    }
    Ok(())
}

/// Builds the lab's binary (its daemons run from it).
fn lab_binary() -> anyhow::Result<PathBuf> {
    setup::ensure_ready()?;
    build::build_lab(&Workspace::locate()?)
}

pub fn lab(action: LabAction) -> anyhow::Result<()> {
    require_root("the lab")?;
    match action {
        LabAction::Up(datapath) => {
            let lab = Lab::up_on(&lab_binary()?, datapath)?;
            println!("{}", lab.status()?);
            println!(
                "\nwatch it: sudo ip netns exec {NODE_NETNS} target/debug/datapath-monitor run {}",
                lab.agent_args().join(" ")
            );
        }
        LabAction::Status => println!("{}", Lab::attach()?.status()?),
        LabAction::Disrupt(name) => {
            let scenario = Scenario::parse(&name).with_context(|| {
                let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
                format!("unknown scenario {name:?}; one of: {}", names.join(", "))
            })?;
            let report = Lab::attach()?.disrupt(scenario)?;
            for (at, step) in &report.steps {
                println!("{}  {step}", stamp(at));
            }
            match &report.outage {
                Some(outage) => println!(
                    "prober outage: {:.1} s ({} failed probes, {} → {})",
                    outage.seconds,
                    outage.failed_probes,
                    stamp(&outage.first_failure),
                    stamp(&outage.recovered)
                ),
                None => println!("prober outage: none"),
            }
        }
        LabAction::Down => {
            Lab::down()?;
            println!("lab removed");
        }
    }
    Ok(())
}

fn stamp(at: &jiff::Timestamp) -> String {
    format!("{at:.3}")
}

/// The agent running in the lab's node namespace; stopped (SIGTERM) on drop.
pub(crate) struct LabAgent {
    child: Child,
    binary: PathBuf,
}

impl LabAgent {
    pub(crate) fn start(binary: &Path, lab: &Lab, log_path: &Path) -> anyhow::Result<Self> {
        let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", NODE_NETNS])
            .arg(binary)
            .args(["run", "--listen", AGENT_LISTEN])
            .args(lab.agent_args())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the agent in the lab")?;
        let mut agent = Self { child, binary: binary.to_path_buf() };
        // In a test VM (software emulation, DM_TEST_TIME_SCALE set) a debug agent's start-up
        // has taken over 60 s while the lab's daemons ran.
        let scale = std::env::var("DM_TEST_TIME_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1u32).max(1);
        let limit = Duration::from_secs(30) * scale;
        let started = Instant::now();
        while agent.get("/readyz").is_err() {
            let failure = match agent.child.try_wait()? {
                Some(status) => format!("the agent exited ({status}) before it became ready"),
                None if started.elapsed() >= limit => {
                    format!("the agent did not become ready within {} s", limit.as_secs())
                }
                None => {
                    thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            let text = fs::read_to_string(log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            bail!("{failure}; the last lines of {}:\n{tail}", log_path.display());
        }
        Ok(agent)
    }

    /// GET inside the node namespace (curl, which `cargo xtask setup` installs).
    pub(crate) fn get(&self, path: &str) -> anyhow::Result<String> {
        let output = Command::new("ip")
            .args(["netns", "exec", NODE_NETNS, "curl", "-sf", "--max-time", "5"])
            .arg(format!("http://{AGENT_LISTEN}{path}"))
            .output()?;
        ensure!(output.status.success(), "GET {path} failed");
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `datapath-monitor <args>` against this agent.
    fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new("ip")
            .args(["netns", "exec", NODE_NETNS])
            .arg(&self.binary)
            .args(args)
            .args(["--server", &format!("http://{AGENT_LISTEN}")])
            .output()?;
        ensure!(output.status.success(), "datapath-monitor {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl LabAgent {
    /// Starts a fresh agent: its state dir wiped first, so no earlier incident is read back.
    pub(crate) fn start_fresh(binary: &Path, lab: &Lab, log: &Path) -> anyhow::Result<Self> {
        let state = lab.agent_state_dir();
        if state.exists() {
            std::fs::remove_dir_all(&state).with_context(|| format!("wiping {}", state.display()))?;
        }
        Self::start(binary, lab, log)
    }

    /// Stops the agent (SIGTERM) and waits for it to exit. Err when it had exited before (it
    /// crashed, or someone killed it: what it reported since is no measurement), or when it
    /// did not exit cleanly on SIGTERM.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the agent exited during the run, {status}, before it was stopped");
        }
        let status = self.terminate()?;
        ensure!(status.success(), "the agent exited with {status} when stopped with SIGTERM");
        Ok(())
    }

    /// Whether the agent is still running (Err: it exited, with its status).
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("the agent exited during the run, {status}"),
            None => Ok(()),
        }
    }

    fn terminate(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        // SAFETY: kill on our own child's pid (`ip netns exec` execs the agent).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait()
    }
}

impl Drop for LabAgent {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// `cargo xtask demo` options.
pub struct DemoOptions {
    pub datapath: Datapath,
    /// (agent, dm-lab) binaries built already (the guest's half of `demo --vm`).
    pub prebuilt: Option<(PathBuf, PathBuf)>,
}

/// `cargo xtask demo`: the seed incident, replayed on real OVS and caught.
pub fn demo(options: DemoOptions) -> anyhow::Result<()> {
    require_root("the demo")?;
    let (agent_binary, lab_binary) = match options.prebuilt {
        Some(binaries) => binaries,
        None => {
            setup::ensure_ready()?;
            let workspace = Workspace::locate()?;
            (build::build_agent(&workspace, false)?, build::build_lab(&workspace)?)
        }
    };
    let started = Instant::now();
    println!(
        "==> lab up: OVS br0 ({} datapath, fail_mode=secure), tun0, 3 pods, prober, stand-in openshift-sdn",
        options.datapath
    );
    let lab = Lab::up_on(&lab_binary, options.datapath)?;
    let result = demo_in(&lab, &agent_binary);
    println!("==> lab down");
    if let Err(error) = Lab::down() {
        eprintln!("warning: lab down: {error:#}");
    }
    let verdict = result?;
    println!("demo finished in {:.0} s", started.elapsed().as_secs_f64());
    verdict.check()
}

/// How far a caught incident's duration may be from the prober's outage.
const DEMO_DURATION_TOLERANCE_SECONDS: f64 = 2.0;

/// What the demo's agent recorded, against the prober's ground truth.
#[derive(Debug, PartialEq)]
struct DemoVerdict {
    /// (duration, top cause (kind, subject)) of the first incident.
    incident: Option<(f64, Option<(String, String)>)>,
    outage_seconds: Option<f64>,
}

impl DemoVerdict {
    fn read(incidents: &Value, outage_seconds: Option<f64>) -> Self {
        let incident = incidents.as_array().and_then(|all| all.first()).map(|first| {
            let cause = &first["causes"][0];
            let top = cause["kind"].as_str().zip(cause["subject"].as_str()).map(|(k, s)| (k.to_owned(), s.to_owned()));
            (first["duration_seconds"].as_f64().unwrap_or(f64::NAN), top)
        });
        Self { incident, outage_seconds }
    }

    /// Err unless the incident was caught, its top cause is the one the eval expects of the
    /// seed scenario, and its duration is within 2 s of the prober's outage.
    fn check(&self) -> anyhow::Result<()> {
        let Some((duration, top)) = &self.incident else {
            bail!("the agent recorded no incident for the sdn-upgrade disruption");
        };
        let crate::eval::Expected::Incident(Some((kind, subject))) = crate::eval::expected(Scenario::SdnUpgrade) else {
            bail!("the eval expects no attributed incident of sdn-upgrade");
        };
        ensure!(
            top.as_ref().is_some_and(|(k, s)| k == kind && s == subject),
            "the incident's top cause is {top:?}, not {kind} {subject}"
        );
        let outage = self.outage_seconds.context("the prober saw no outage: nothing to compare the incident with")?;
        ensure!(
            (duration - outage).abs() <= DEMO_DURATION_TOLERANCE_SECONDS,
            "the incident lasted {duration:.1} s, the prober's outage {outage:.1} s: more than \
             {DEMO_DURATION_TOLERANCE_SECONDS} s apart"
        );
        Ok(())
    }
}

fn demo_in(lab: &Lab, agent_binary: &Path) -> anyhow::Result<DemoVerdict> {
    let log = lab.root.join("agent.log");
    println!("==> agent: datapath-monitor run {} (log: {})", lab.agent_args().join(" "), log.display());
    let starting = Instant::now();
    let agent = LabAgent::start(agent_binary, lab, &log)?;
    // Evidence of loss needs no warm-up: the agent is restarted by the very upgrades it
    // watches, so the demo disrupts 3 s after it is ready.
    println!("==> agent ready after {:.1} s; disrupting in 3 s", starting.elapsed().as_secs_f64());
    thread::sleep(Duration::from_secs(3));

    println!(
        "==> disrupt sdn-upgrade: TERM openshift-sdn (its trap removes the CNI config), restart ovs-vswitchd, new sdn ~9 s later"
    );
    let datapath_before = (lab.datapath == Datapath::Kernel).then(datapath::stats).transpose()?;
    let agent_before = OvsCounts::parse(&agent.get("/metrics")?);
    let report = lab.disrupt(Scenario::SdnUpgrade)?;
    for (at, step) in &report.steps {
        println!("    {}  {step}", stamp(at));
    }

    // Wait for the incident to close (quiet period), at most 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let incidents = loop {
        let incidents: Value = serde_json::from_str(&agent.get("/api/v1/incidents")?)?;
        let closed = incidents.as_array().and_then(|all| all.first()).is_some_and(|i| i["active"] == false);
        if closed || Instant::now() > deadline {
            break incidents;
        }
        thread::sleep(Duration::from_millis(500));
    };

    println!("\n=== What kubelet's prober saw (every 1 s, 1 s timeout) ===");
    let probes = lab.probes(Some(report.started))?;
    print_readiness(&probes);
    match &report.outage {
        Some(outage) => println!(
            "outage: {:.1} s, {} failed probes ({} → {})",
            outage.seconds,
            outage.failed_probes,
            stamp(&outage.first_failure),
            stamp(&outage.recovered)
        ),
        None => println!("outage: none seen by the prober"),
    }
    // The other ground truth: the client pod's UDP stream to the apiserver pod (pod to pod),
    // which can recover apart from the prober's node-to-pod path.
    match &report.udp_loss {
        Some(loss) => println!(
            "client pod's UDP stream: {} of {} datagrams lost, sent {} → {} ({:.1} s)",
            loss.lost,
            report.udp_sent,
            stamp(&loss.first_lost),
            stamp(&loss.last_lost),
            loss.seconds()
        ),
        None => println!("client pod's UDP stream: nothing lost ({} datagrams)", report.udp_sent),
    }

    println!("\n=== What datapath-monitor recorded ===");
    print!("{}", agent.cli(&["incidents"])?);
    let verdict = DemoVerdict::read(&incidents, report.outage.as_ref().map(|outage| outage.seconds));
    if let (Some((duration, top)), Some(outage)) = (&verdict.incident, verdict.outage_seconds) {
        let (kind, subject) = top.clone().unwrap_or_else(|| ("unattributed".to_owned(), String::new()));
        println!("\nincident {duration:.1} s vs prober outage {outage:.1} s; top cause: {kind} {subject}");
    }

    println!("\n=== Key metrics ===");
    let metrics = agent.get("/metrics")?;
    let apiserver = lab.pods.iter().find(|p| p.name == "apiserver").map(|p| p.veth.clone()).unwrap_or_default();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let key = line.starts_with("datapath_incidents_total")
            || line.starts_with("datapath_incident_duration_seconds_count")
            || line.starts_with("datapath_incident_lost_packets_total")
            || (line.starts_with("datapath_unanswered_packets_total") && !line.ends_with(" 0"))
            || line.starts_with("datapath_cni_default_network_present")
            || line.starts_with("datapath_sdn_process_restarts_total{process=\"ovs-vswitchd\"")
            || line.starts_with("datapath_sdn_process_restarts_total{process=\"openshift-sdn-n\"")
            || ((line.starts_with("datapath_packets_total") || line.starts_with("datapath_drops_total"))
                && !apiserver.is_empty()
                && line.contains(&format!("interface=\"{apiserver}\"")));
        if key {
            println!("{line}");
        }
    }

    if let Some(before) = datapath_before {
        // What the switch lost itself, twice: as the agent counted it, and as OVS's own tool reads
        // the kernel datapath's counters. Both over the replay.
        let after = datapath::stats()?;
        let agent = OvsCounts::parse(&metrics).since(&agent_before);
        println!("\n=== OVS's kernel datapath during the replay: datapath-monitor next to ovs-dpctl show ===");
        println!(
            "ovs-dpctl show:    lookups hit +{} missed +{} lost +{}; flows {} → {}",
            after.hit.saturating_sub(before.hit),
            after.missed.saturating_sub(before.missed),
            after.lost.saturating_sub(before.lost),
            before.flows,
            after.flows
        );
        println!("datapath-monitor:  {} (the same counters, read over netlink)", agent.describe_lookups());
        println!("                   {}", agent.describe());
        println!(
            "failed upcalls:    datapath-monitor lost +{} (the datapath's counter), {} named per input port \
             (OVS_UPCALL_FAILED: freed as drops); ovs-dpctl lost +{}",
            agent.lookups.get("lost").copied().unwrap_or_default(),
            agent.drops.get(UPCALL_FAILED).copied().unwrap_or_default(),
            after.lost.saturating_sub(before.lost)
        );
    }
    Ok(verdict)
}

/// The drop reason the agent gives a packet whose upcall to ovs-vswitchd failed: the
/// counterpart of the datapath's `lost` counter.
const UPCALL_FAILED: &str = "OVS_UPCALL_FAILED";

/// The agent's counts of what OVS dropped itself: drops with an `OVS_` reason, summed over
/// interfaces, packets the datapath forwarded to no port, and the datapaths' own lookup
/// counters (hit, missed, lost) summed over datapaths.
#[derive(Debug, Default, PartialEq)]
struct OvsCounts {
    drops: std::collections::BTreeMap<String, u64>,
    unforwarded: u64,
    lookups: std::collections::BTreeMap<String, u64>,
}

impl OvsCounts {
    /// From the agent's `/metrics` text.
    fn parse(metrics: &str) -> Self {
        let mut counts = Self::default();
        for line in metrics.lines().filter(|line| !line.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let value = value as u64;
            if series.starts_with("datapath_switch_unforwarded_packets_total{") {
                counts.unforwarded += value;
            } else if series.starts_with("datapath_ovs_lookups_total{")
                && let Some(result) = label(series, "result")
            {
                *counts.lookups.entry(result.to_string()).or_default() += value;
            } else if series.starts_with("datapath_drops_total{")
                && let Some(reason) = label(series, "reason")
                && reason.starts_with("OVS_")
            {
                *counts.drops.entry(reason.to_string()).or_default() += value;
            }
        }
        counts
    }

    /// What was counted after `before`.
    fn since(&self, before: &Self) -> Self {
        let minus = |now: &std::collections::BTreeMap<String, u64>, then: &std::collections::BTreeMap<String, u64>| {
            now.iter()
                .map(|(key, count)| (key.clone(), count.saturating_sub(then.get(key).copied().unwrap_or_default())))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let mut drops = minus(&self.drops, &before.drops);
        drops.retain(|_, count| *count > 0);
        Self {
            drops,
            unforwarded: self.unforwarded.saturating_sub(before.unforwarded),
            lookups: minus(&self.lookups, &before.lookups),
        }
    }

    fn describe_lookups(&self) -> String {
        if self.lookups.is_empty() {
            return "no datapath counters (datapath_ovs_lookups_total)".to_string();
        }
        let count = |result: &str| self.lookups.get(result).copied().unwrap_or_default();
        format!("lookups hit +{} missed +{} lost +{}", count("hit"), count("missed"), count("lost"))
    }

    fn describe(&self) -> String {
        let mut parts: Vec<String> = self.drops.iter().map(|(reason, count)| format!("{reason} +{count}")).collect();
        if parts.is_empty() {
            parts.push("no OVS drops".to_string());
        }
        format!("{}; forwarded to no port +{}", parts.join(", "), self.unforwarded)
    }
}

/// The value of label `name` in a series like `family{a="x",name="y"}`.
fn label<'s>(series: &'s str, name: &str) -> Option<&'s str> {
    series.split(&format!("{name}=\"")).nth(1).and_then(|rest| rest.split('"').next())
}

fn print_readiness(probes: &[Probe]) {
    let mut ready = true;
    for probe in probes {
        if probe.ok != ready {
            ready = probe.ok;
            if probe.ok {
                println!("{}  Readiness probe succeeded: ready again", stamp(&probe.at));
            } else {
                println!(
                    "{}  Readiness probe failed: {}",
                    stamp(&probe.at),
                    probe.error.as_deref().unwrap_or("no response")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_passes_only_on_the_restart_and_a_duration_near_the_outage() {
        let incident = |duration: f64, kind: &str, subject: &str| serde_json::json!([{ "duration_seconds": duration, "causes": [{ "kind": kind, "subject": subject }] }]);
        let caught = DemoVerdict::read(&incident(10.3, "process_restart", "ovs-vswitchd"), Some(10.0));
        assert!(caught.check().is_ok());
        let far = DemoVerdict::read(&incident(12.5, "process_restart", "ovs-vswitchd"), Some(10.0));
        assert!(far.check().unwrap_err().to_string().contains("more than 2 s apart"));
        let wrong = DemoVerdict::read(&incident(10.0, "cni_default_network_missing", "x"), Some(10.0));
        assert!(wrong.check().unwrap_err().to_string().contains("top cause"));
        let unattributed =
            DemoVerdict::read(&serde_json::json!([{ "duration_seconds": 10.0, "causes": [] }]), Some(10.0));
        assert!(unattributed.check().is_err());
        assert!(DemoVerdict::read(&serde_json::json!([]), Some(10.0)).check().is_err());
        assert!(DemoVerdict::read(&incident(10.0, "process_restart", "ovs-vswitchd"), None).check().is_err());
    }

    #[test]
    fn ovs_counts_sum_ovs_reasons_over_interfaces_and_subtract() {
        let before = OvsCounts::parse(
            r#"# HELP datapath_drops_total x
datapath_drops_total{interface="veth1",reason="OVS_DROP_LAST_ACTION",pod_namespace="a",pod="b"} 4
datapath_drops_total{interface="other",reason="NOT_SPECIFIED",pod_namespace="",pod=""} 9
datapath_switch_unforwarded_packets_total{switch="ovs-system"} 2
"#,
        );
        let after = OvsCounts::parse(
            r#"datapath_drops_total{interface="veth1",reason="OVS_DROP_LAST_ACTION",pod_namespace="a",pod="b"} 10
datapath_drops_total{interface="veth2",reason="OVS_DROP_LAST_ACTION",pod_namespace="c",pod="d"} 3
datapath_drops_total{interface="veth2",reason="OVS_UPCALL_FAILED",pod_namespace="c",pod="d"} 1
datapath_drops_total{interface="other",reason="NOT_SPECIFIED",pod_namespace="",pod=""} 30
datapath_switch_unforwarded_packets_total{switch="ovs-system"} 7
datapath_ovs_lookups_total{datapath="ovs-system",result="hit"} 990
datapath_ovs_lookups_total{datapath="ovs-system",result="missed"} 40
datapath_ovs_lookups_total{datapath="ovs-system",result="lost"} 1
"#,
        );
        let replay = after.since(&before);
        assert_eq!(replay.drops.get("OVS_DROP_LAST_ACTION"), Some(&9));
        assert_eq!(replay.drops.get(UPCALL_FAILED), Some(&1));
        assert_eq!(replay.drops.len(), 2, "NOT_SPECIFIED is not OVS's own");
        assert_eq!(replay.unforwarded, 5);
        assert_eq!(replay.describe(), "OVS_DROP_LAST_ACTION +9, OVS_UPCALL_FAILED +1; forwarded to no port +5");
        assert_eq!(OvsCounts::default().describe(), "no OVS drops; forwarded to no port +0");
        assert_eq!(replay.describe_lookups(), "lookups hit +990 missed +40 lost +1");
        assert_eq!(before.describe_lookups(), "no datapath counters (datapath_ovs_lookups_total)");
    }
}
