//! End-to-end: the incident engine on the real kernel. A steady UDP stream from a pod, a
//! watched process restarted, then an iptables DROP on the pod's traffic: one incident on
//! that veth, attributed to the restart; the same restart without the DROP: nothing new.

use std::{
    fs,
    net::UdpSocket,
    os::unix::fs::PermissionsExt as _,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use datapath_monitor_tests::{Agent, Netns, Pod, TempDir, UdpStream, agent_binary, require_root, unique_comm};
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

/// The incidents once the newest has closed (at most 15 s).
fn closed_incidents(agent: &Agent) -> Result<Vec<Value>> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let all = incidents(agent)?;
        if all.first().is_some_and(|i| i["active"] == false) {
            return Ok(all);
        }
        ensure!(Instant::now() < deadline, "incident still active: {all:#?}");
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn a_drop_rule_after_a_restart_is_one_incident_attributed_to_the_restart() -> Result<()> {
    require_root();
    let host = Netns::new("dmti")?;
    let pod = Pod::new(&host, 3)?;
    let dirs = TempDir::new("dminc")?;
    let state = TempDir::new("dmstate")?;
    let name = unique_comm("dm-ovs-");
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
    agent.wait_samples(28)?;
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
    let all = closed_incidents(&agent)?;
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
    // The restart seen, then 5 s of samples judged: long enough for any incident it caused.
    agent.wait_samples(20)?;
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

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn an_incident_open_when_the_agent_is_killed_is_closed_at_its_next_start() -> Result<()> {
    require_root();
    let host = Netns::new("dmti")?;
    let pod = Pod::new(&host, 6)?;
    let state = TempDir::new("dmstate")?;
    let dir = state.display();
    let args = ["--cni-dir", &dir, "--cni-cache-dir", &dir, "--state-dir", &dir];
    let stream = UdpStream::start_echo(&host, &pod, PORT, RATE)?;
    let mut agent = Agent::start(&host, &args)?;
    thread::sleep(Duration::from_secs(2));

    let rule = ["INPUT", "-i", pod.veth.as_str(), "-p", "udp", "--dport", "7000", "-j", "DROP"];
    let insert: Vec<&str> = ["iptables", "-I"].into_iter().chain(rule).collect();
    host.exec(&insert)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let open = loop {
        let all = incidents(&agent)?;
        if let Some(open) = all.first().filter(|i| i["active"] == true) {
            break open.clone();
        }
        ensure!(Instant::now() < deadline, "no incident while the DROP rule was in place: {all:#?}");
        thread::sleep(Duration::from_millis(100));
    };
    // Past its first checkpoints, the agent dies without a word (OOM kill, crash).
    thread::sleep(Duration::from_millis(2_500));
    agent.kill()?;
    let delete: Vec<&str> = ["iptables", "-D"].into_iter().chain(rule).collect();
    host.exec(&delete)?;
    ensure!(state.join("open-incident.jsonl").exists(), "no checkpoint of the open incident");

    let agent = Agent::start(&host, &args)?;
    let all = incidents(&agent)?;
    println!("{}", serde_json::to_string_pretty(&all)?);
    let recovered = all.iter().find(|i| i["id"] == open["id"]).context("the open incident was lost")?;
    ensure!(recovered["active"] == false, "{recovered:#}");
    let reason = recovered["close_reason"].as_str().unwrap_or_default();
    ensure!(reason.contains("killed or crashed"), "{recovered:#}");
    let lost = recovered["totals"]["lost_packets"].as_u64().unwrap_or(0);
    ensure!(lost >= 2 * RATE, "lost {lost}: less than the 2.5 s checkpointed: {recovered:#}");
    ensure!(!state.join("open-incident.jsonl").exists(), "the checkpoint was not consumed");
    let metrics = agent.metrics()?;
    ensure!(metrics.value("datapath_incident_store_up", &[]) == 1.0, "{}", metrics.text);
    ensure!(metrics.value("datapath_incident_store_errors_total", &[]) == 0.0, "{}", metrics.text);
    stream.stop()?;
    Ok(())
}

/// Unanswered packets the agent counted on `veth` in `direction`.
fn unanswered(metrics: &datapath_monitor_tests::Metrics, veth: &str, direction: &str) -> f64 {
    metrics.value("datapath_unanswered_packets_total", &[("interface", veth), ("direction", direction)])
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn steady_traffic_that_stops_is_idle_not_an_incident() -> Result<()> {
    require_root();
    let host = Netns::new("dmti")?;
    let pod = Pod::new(&host, 4)?;
    let state = TempDir::new("dmstate")?;
    let dir = state.display();
    let agent = Agent::start(&host, &["--cni-dir", &dir, "--cni-cache-dir", &dir, "--state-dir", &dir])?;

    // Request/response and one-way streams for 6 s, then the pod simply stops talking.
    let echo = UdpStream::start_echo(&host, &pod, PORT, RATE)?;
    let one_way = UdpStream::start(&host, &pod, PORT + 1, RATE)?;
    thread::sleep(Duration::from_secs(6));
    let (sent, echoed) = echo.counts();
    echo.stop()?;
    one_way.stop()?;
    // 8 s of samples judged after the pod fell silent (twice the quiet time an incident needs).
    agent.wait_samples(32)?;

    let all = incidents(&agent)?;
    ensure!(all.is_empty(), "idle traffic made an incident: {all:#?}");
    let metrics = agent.metrics()?;
    ensure!(unanswered(&metrics, &pod.veth, "ingress") == 0.0, "{}", metrics.text);
    ensure!(unanswered(&metrics, &pod.veth, "egress") == 0.0, "{}", metrics.text);
    ensure!(
        sent >= 5 * RATE && echoed + 2 >= sent,
        "the echo stream itself lost packets: {sent} sent, {echoed} echoed"
    );
    println!("6 s of echoed ({sent} sent, {echoed} echoed) and one-way traffic, then idle: no incident, 0 unanswered");
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn a_fault_two_seconds_after_the_agent_is_ready_is_one_incident_counting_what_was_lost() -> Result<()> {
    require_root();
    let host = Netns::new("dmti")?;
    let pod = Pod::new(&host, 5)?;
    let state = TempDir::new("dmstate")?;
    let dir = state.display();
    // Traffic first, as on a node whose agent is restarted by an upgrade.
    let stream = UdpStream::start_echo(&host, &pod, PORT, RATE)?;
    thread::sleep(Duration::from_secs(1));
    let agent = Agent::start(&host, &["--cni-dir", &dir, "--cni-cache-dir", &dir, "--state-dir", &dir])?;
    thread::sleep(Duration::from_secs(2));

    // The host drops the pod's datagrams for 3 s: dropped, and left unanswered.
    let rule = ["INPUT", "-i", pod.veth.as_str(), "-p", "udp", "--dport", "7000", "-j", "DROP"];
    let insert: Vec<&str> = ["iptables", "-I"].into_iter().chain(rule).collect();
    let (sent_before, echoed_before) = stream.counts();
    host.exec(&insert)?;
    let dropped_from = Instant::now();
    let mut latency = None;
    while dropped_from.elapsed() < Duration::from_secs(3) {
        if latency.is_none() && !incidents(&agent)?.is_empty() {
            latency = Some(dropped_from.elapsed());
        }
        thread::sleep(Duration::from_millis(20));
    }
    // Stop sending before the rule goes, so its counter is the whole truth.
    stream.pause_sender();
    thread::sleep(Duration::from_millis(300));
    let listing = host.exec(&["iptables", "-L", "INPUT", "-v", "-x", "-n"])?;
    let dropped_by_rule: u64 = listing
        .lines()
        .find(|l| l.contains("DROP") && l.contains(&pod.veth))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context(format!("no rule counter in:\n{listing}"))?;
    let delete: Vec<&str> = ["iptables", "-D"].into_iter().chain(rule).collect();
    host.exec(&delete)?;
    let (sent_after, echoed_after) = stream.counts();
    let not_echoed = (sent_after - sent_before) - (echoed_after - echoed_before);
    let latency = latency.context("no incident visible while the DROP rule was in place")?;
    println!("detection latency (DROP rule inserted 2 s after the agent was ready → incident visible): {latency:?}");

    let all = closed_incidents(&agent)?;
    println!("{}", serde_json::to_string_pretty(&all)?);
    ensure!(all.len() == 1, "expected exactly one incident: {all:#?}");
    let incident = &all[0];
    let interfaces = incident["interfaces"].as_array().context("interfaces")?;
    ensure!(interfaces.len() == 1 && interfaces[0]["interface"] == pod.veth.as_str(), "{incident:#}");
    let lost = &interfaces[0]["lost"];
    let netfilter = lost["dropped"]["NETFILTER_DROP"].as_u64().unwrap_or(0);
    let unanswered_lost = lost["unanswered"].as_u64().unwrap_or(0);
    println!(
        "iptables rule counter {dropped_by_rule}, datagrams not echoed {not_echoed}; incident: NETFILTER_DROP {netfilter}, unanswered {unanswered_lost}, lost_packets {}",
        incident["totals"]["lost_packets"]
    );
    ensure!(netfilter == dropped_by_rule, "NETFILTER_DROP {netfilter} vs the rule's own counter {dropped_by_rule}");
    ensure!(dropped_by_rule >= 2 * RATE, "the rule dropped only {dropped_by_rule}");
    // Every dropped datagram was also left unanswered (one more may fall in the stretch).
    ensure!(
        unanswered_lost.abs_diff(dropped_by_rule) <= 2,
        "unanswered {unanswered_lost} vs dropped {dropped_by_rule}"
    );
    ensure!(not_echoed.abs_diff(dropped_by_rule) <= 2, "not echoed {not_echoed} vs dropped {dropped_by_rule}");
    ensure!(incident["totals"]["lost_packets"].as_u64().is_some_and(|n| n.abs_diff(dropped_by_rule) <= 2));
    let duration = incident["duration_seconds"].as_f64().context("duration")?;
    ensure!((duration - 3.3).abs() <= 1.0, "duration {duration} s, expected about 3.3 s");
    let metrics = agent.metrics()?;
    ensure!(metrics.value("datapath_incidents_total", &[("cause", "unattributed")]) == 1.0, "{}", metrics.text);
    ensure!(metrics.value("datapath_incident_lost_packets_total", &[("cause", "unattributed")]) >= 2.0 * RATE as f64);
    stream.stop()?;
    Ok(())
}

/// Two pods on one L2 segment in `host`, ports of its bridge `brdm`: (netns, host-side veth, IP).
fn bridged_pods(host: &Netns) -> Result<Vec<(Netns, String, &'static str)>> {
    host.exec(&["ip", "link", "add", "brdm", "type", "bridge"])?;
    host.exec(&["ip", "link", "set", "brdm", "up"])?;
    let mut pods = Vec::new();
    for (n, ip) in [(0u8, "10.78.0.2"), (1, "10.78.0.3")] {
        let ns = Netns::new("dmtp")?;
        let veth = format!("vethbr{n}{:05x}", std::process::id() & 0xfffff);
        host.exec(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns.name])?;
        host.exec(&["ip", "link", "set", &veth, "master", "brdm", "up"])?;
        ns.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.exec(&["ip", "link", "set", "eth0", "up"])?;
        pods.push((ns, veth, ip));
    }
    Ok(pods)
}

/// Counts the datagrams that reach `bind` in `ns` into `received` until `stop`.
fn count_datagrams(
    ns: &Netns,
    bind: &'static str,
    stop: &Arc<AtomicBool>,
    received: &Arc<AtomicU64>,
) -> Result<thread::JoinHandle<Result<Result<()>>>> {
    let (stop, received) = (Arc::clone(stop), Arc::clone(received));
    ns.spawn(move || -> Result<()> {
        let socket = UdpSocket::bind(bind)?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let mut buffer = [0u8; 256];
        while !stop.load(Ordering::Relaxed) {
            if socket.recv(&mut buffer).is_ok() {
                received.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    })
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn packets_a_bridge_forwards_to_no_port_are_lost_on_the_switch() -> Result<()> {
    require_root();
    let host = Netns::new("dmti")?;
    let pods = bridged_pods(&host)?;
    let (a, b) = (&pods[0], &pods[1]);
    let b_mac = datapath_monitor_tests::mac_of(&b.0, "eth0")?;
    a.0.exec(&["ip", "neigh", "replace", b.2, "lladdr", &b_mac, "dev", "eth0", "nud", "permanent"])?;
    // The host on the bridge's own device, as a bridge CNI's gateway (cni0): what A sends it
    // leaves the switch through that device, which the agent watches, and is no loss.
    host.exec(&["ip", "addr", "add", "10.78.0.1/24", "dev", "brdm"])?;
    let bridge_mac = datapath_monitor_tests::mac_of(&host, "brdm")?;
    a.0.exec(&["ip", "neigh", "replace", "10.78.0.1", "lladdr", &bridge_mac, "dev", "eth0", "nud", "permanent"])?;
    let state = TempDir::new("dmstate")?;
    let dir = state.display();
    let agent = Agent::start(
        &host,
        &[
            "--interface",
            "veth*",
            "--interface",
            "brdm",
            "--cni-dir",
            &dir,
            "--cni-cache-dir",
            &dir,
            "--state-dir",
            &dir,
        ],
    )?;

    // A sends B 200 datagrams a second; the bridge has not learnt B's port, so it floods them.
    // A sends the host as many.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, received) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let host_received = Arc::new(AtomicU64::new(0));
    let host_receiver = count_datagrams(&host, "10.78.0.1:7101", &stop, &host_received)?;
    let receiver = count_datagrams(&b.0, "0.0.0.0:7100", &stop, &received)?;
    let sender = {
        let (stop, sent, target) = (Arc::clone(&stop), Arc::clone(&sent), format!("{}:7100", b.2));
        a.0.spawn(move || -> Result<()> {
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * 200.0) as u64;
                while sent.load(Ordering::Relaxed) < due {
                    socket.send_to(&[0x5a; 64], &target)?;
                    socket.send_to(&[0x5a; 64], "10.78.0.1:7101")?;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })?
    };
    // The switch's baseline needs calm seconds: its count is noisy by nature.
    agent.wait_samples(32)?;
    ensure!(incidents(&agent)?.is_empty(), "an incident before the fault: {:#?}", incidents(&agent)?);

    // B's port stops taking flooded frames for 3 s: the bridge forwards them to no port.
    let counts = || (sent.load(Ordering::Relaxed), received.load(Ordering::Relaxed));
    let before = counts();
    host.exec(&["bridge", "link", "set", "dev", &b.1, "flood", "off"])?;
    thread::sleep(Duration::from_secs(3));
    host.exec(&["bridge", "link", "set", "dev", &b.1, "flood", "on"])?;
    thread::sleep(Duration::from_millis(300));
    let after = counts();
    let lost = (after.0 - before.0) - (after.1 - before.1);

    let all = closed_incidents(&agent)?;
    stop.store(true, Ordering::Relaxed);
    let _ = (sender.join(), receiver.join(), host_receiver.join());
    println!("{}", serde_json::to_string_pretty(&all)?);
    let (to_host, host_got) = (sent.load(Ordering::Relaxed), host_received.load(Ordering::Relaxed));
    println!("datagrams A sent the host on the bridge's device: {to_host}, received: {host_got}");
    ensure!(host_got + 5 >= to_host, "the host received {host_got} of {to_host} datagrams");
    ensure!(all.len() == 1, "expected exactly one incident: {all:#?}");
    let interfaces = all[0]["interfaces"].as_array().context("interfaces")?;
    let switch = interfaces.iter().find(|i| i["interface"] == "brdm").context(format!("no brdm in {all:#?}"))?;
    let unforwarded = switch["lost"]["dropped"]["NO_OUTPUT_PORT"].as_u64().unwrap_or(0);
    println!(
        "datagrams A sent that B never got: {lost}; the switch's unforwarded packets in the incident: {unforwarded}"
    );
    ensure!(lost >= 400, "the fault lost only {lost} datagrams");
    ensure!(unforwarded.abs_diff(lost) <= lost / 20 + 2, "unforwarded {unforwarded} vs lost {lost}");
    let metrics = agent.metrics()?;
    let total = metrics.value("datapath_switch_unforwarded_packets_total", &[("switch", "brdm")]);
    ensure!(total >= unforwarded as f64, "{}", metrics.text);
    // The same datagrams are also kernel drops on the sender's port: counted once.
    ensure!(all[0]["totals"]["lost_packets"].as_u64() == Some(unforwarded), "{all:#?}");
    Ok(())
}
