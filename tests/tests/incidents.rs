//! End-to-end: the incident engine on the real kernel. A steady UDP stream from a pod, a
//! watched process restarted, then an iptables DROP on the pod's traffic: one incident on
//! that veth, attributed to the restart; the same restart without the DROP: nothing new.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use datapath_monitor_tests::{Agent, Netns, Pod, TempDir, UdpStream, agent_binary, require_root, unique};
use serde_json::Value;

const PORT: u16 = 7000;
/// Datagrams per second from the pod.
const RATE: u64 = 100;

fn restart(binary: &std::path::Path, running: &mut Child) -> Result<Child> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(running.id() as i32), nix::sys::signal::Signal::SIGTERM)?;
    running.wait()?;
    thread::sleep(Duration::from_millis(300));
    Ok(Command::new(binary).arg("600").stdin(Stdio::null()).spawn()?)
}

fn incidents(agent: &Agent) -> Result<Vec<Value>> {
    Ok(agent.get_json("/api/v1/incidents")?.as_array().context("incidents array")?.clone())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn a_drop_rule_after_a_restart_is_one_incident_attributed_to_the_restart() -> Result<()> {
    require_root();
    let host = Netns::new("dmti")?;
    let pod = Pod::new(&host, 3)?;
    let dirs = TempDir::new("dminc")?;
    let state = TempDir::new("dmstate")?;
    let name = unique("dm-ovs-");
    let binary = dirs.join(&name);
    fs::copy("/bin/sleep", &binary)?;
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o755))?;
    let (dir, state_dir) = (dirs.display(), state.display());
    let args = ["--sdn-process", &name, "--cni-dir", &dir, "--cni-cache-dir", &dir, "--state-dir", &state_dir];
    let agent = Agent::start(&host, &args)?;

    // A healthy steady stream: a listener on the host, RATE datagrams a second from the pod.
    let stream = UdpStream::start(&host, &pod, PORT, RATE)?;

    // Baseline warm-up (5 calm seconds), with the watched process running.
    let mut process = Command::new(&binary).arg("600").stdin(Stdio::null()).spawn()?;
    thread::sleep(Duration::from_secs(7));
    ensure!(incidents(&agent)?.is_empty(), "an incident without any disruption: {:#?}", incidents(&agent)?);

    process = restart(&binary, &mut process)?;
    agent.wait_events("restart", |s| s == name, |e| e.iter().any(|e| e.kind == "process_restart"))?;
    thread::sleep(Duration::from_secs(1));

    // The DROP, for 4 s.
    let rule = ["INPUT", "-i", pod.veth.as_str(), "-p", "udp", "--dport", "7000", "-j", "DROP"];
    let insert: Vec<&str> = ["iptables", "-I"].into_iter().chain(rule).collect();
    host.exec(&insert)?;
    let dropped_from = Instant::now();
    let mut latency = None;
    while dropped_from.elapsed() < Duration::from_secs(4) {
        if latency.is_none() && !incidents(&agent)?.is_empty() {
            latency = Some(dropped_from.elapsed());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let delete: Vec<&str> = ["iptables", "-D"].into_iter().chain(rule).collect();
    host.exec(&delete)?;
    let latency = latency.context("no incident visible while the DROP rule was in place")?;
    println!("detection latency (DROP rule inserted → incident in /api/v1/incidents): {latency:?}");

    // Closed after the quiet period.
    let deadline = Instant::now() + Duration::from_secs(15);
    let all = loop {
        let all = incidents(&agent)?;
        if all.first().is_some_and(|i| i["active"] == false) {
            break all;
        }
        ensure!(Instant::now() < deadline, "incident still active: {all:#?}");
        thread::sleep(Duration::from_millis(200));
    };
    println!("{}", serde_json::to_string_pretty(&all)?);
    ensure!(all.len() == 1, "expected exactly one incident: {all:#?}");
    let incident = &all[0];
    let duration = incident["duration_seconds"].as_f64().context("duration")?;
    ensure!((duration - 4.0).abs() <= 1.5, "duration {duration} s, expected 4 ± 1.5 s");
    let interfaces = incident["interfaces"].as_array().context("interfaces")?;
    ensure!(interfaces.len() == 1 && interfaces[0]["interface"] == pod.veth.as_str(), "{incident:#}");
    ensure!(interfaces[0]["drop_reasons"]["NETFILTER_DROP"].as_u64().is_some_and(|n| n >= 3 * RATE), "{incident:#}");
    let top = &incident["causes"][0];
    ensure!(top["kind"] == "process_restart" && top["subject"] == name.as_str(), "top cause: {incident:#}");
    ensure!(top["offset_seconds"].as_f64().is_some_and(|o| o < 0.0), "{top}");
    // The CNI dir was empty from the start: a state, not a change, so never a cause.
    ensure!(incident["causes"].as_array().is_some_and(|c| c.len() == 1), "only the restart: {incident:#}");

    let metrics = agent.metrics()?;
    ensure!(metrics.value("datapath_incidents_total", &[("cause", "process_restart")]) == 1.0, "{}", metrics.text);
    ensure!(metrics.value("datapath_incident_active", &[]) == 0.0);
    ensure!(metrics.value("datapath_incident_duration_seconds_count", &[("cause", "process_restart")]) == 1.0);

    // The same restart, no DROP: no new incident.
    process = restart(&binary, &mut process)?;
    agent.wait_events(
        "second restart",
        |s| s == name,
        |e| e.iter().filter(|e| e.kind == "process_restart").count() == 2,
    )?;
    thread::sleep(Duration::from_secs(5));
    ensure!(incidents(&agent)?.len() == 1, "a restart without impact made an incident: {:#?}", incidents(&agent)?);

    let table = host.exec(&[agent_binary()?.to_str().context("path")?, "incidents"])?;
    println!("{table}");
    ensure!(table.contains(&pod.veth) && table.contains("process_restart"), "{table}");

    // History survives an agent restart.
    let id = incident["id"].clone();
    let mut agent = agent;
    agent.stop()?;
    let agent = Agent::start(&host, &args)?;
    let after = incidents(&agent)?;
    ensure!(after.first().is_some_and(|i| i["id"] == id), "history lost across restart: {after:#?}");

    ensure!(stream.stop()? > 0, "the listener received nothing");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(process.id() as i32), nix::sys::signal::Signal::SIGKILL);
    let _ = process.wait();
    Ok(())
}
