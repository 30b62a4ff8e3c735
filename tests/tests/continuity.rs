//! End-to-end: what an agent restart (a DaemonSet rollout) costs. With `--keep-attached` the
//! programs stay attached and counting while no agent runs, and the next agent takes over
//! their pinned maps: packets, drops and SDN process runs of the gap are all counted. Without
//! it the gap is blind and the counters start again from zero.

use std::{net::UdpSocket, os::unix::fs::PermissionsExt as _};

use anyhow::{Context as _, Result, ensure};
use datapath_monitor_tests::{
    Agent, FALLBACKS, Metrics, Netns, Pod, TempDir, UDP_PAYLOAD, addr, agent_binary, expected_tc_attach, ifindex_of,
    iptables_rule_packets, not_applicable, require_root, send_udp, settle, sh, unique, unique_comm,
};

/// A datagram's frame on the veth: Ethernet (14) + IPv4 (20) + UDP (8) + payload.
const FRAME: f64 = (14 + 20 + 8 + UDP_PAYLOAD) as f64;

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn with_keep_attached_a_restart_loses_no_packet_drop_or_process_run() -> Result<()> {
    restart_loses_nothing(&[], 41)
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn with_keep_attached_a_restart_loses_nothing_on_clsact_and_the_classic_tracepoint() -> Result<()> {
    restart_loses_nothing(FALLBACKS, 42)
}

fn restart_loses_nothing(extra: &[&str], subnet: u8) -> Result<()> {
    require_root();
    let host = Netns::new("dmka")?;
    let pod = Pod::new(&host, subnet)?;
    let dir = TempDir::new("dmka")?;
    let name = unique_comm("dm-sdn-");
    let short = dir.join(&name);
    std::fs::copy("/bin/true", &short)?;
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o755))?;
    let pin_dir = format!("{}/{}", bpffs()?, unique("dmpins"));
    let _cleanup = Detach(pin_dir.clone());
    let cache = TempDir::new("dmkacache")?;
    let (cache_dir, pins) = (cache.display(), pin_dir.as_str());
    let mut args = vec!["--keep-attached", "true", "--pin-dir", pins, "--cni-cache-dir", &cache_dir];
    args.extend(["--sdn-process", &name]);
    args.extend_from_slice(extra);
    host.exec(&["iptables", "-A", "INPUT", "-p", "udp", "--dport", "5002", "-j", "DROP"])?;
    let listener = host.run(|| UdpSocket::bind("0.0.0.0:5001"))??;
    let (to_listener, to_rule) = (addr(&pod.host_ip, 5001), addr(&pod.host_ip, 5002));
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    let dropped = [("interface", pod.veth.as_str()), ("reason", "NETFILTER_DROP")];
    let veth_ifindex = ifindex_of(&host, &pod.veth)?;
    let clsact = extra.contains(&"clsact") || expected_tc_attach()? == "clsact";
    let attachments = || attachments(&host, veth_ifindex, clsact);

    let mut first = Agent::start(&host, &args)?;
    ensure!(first.metrics()?.value("datapath_probe_loaded", &[("probe", "continuity")]) == 1.0);
    send_udp(&pod.ns, to_listener, 100)?;
    send_udp(&pod.ns, to_rule, 10)?;
    first.wait_metrics("the first agent's counts", |m| m.value("datapath_drops_total", &dropped) >= 10.0)?;
    settle();
    let before = first.metrics()?;
    ensure!(before.value("datapath_packets_total", &ingress) == 110.0, "{}", before.text);
    ensure!(before.value("datapath_drops_total", &dropped) == 10.0, "{}", before.text);
    first.stop()?;
    ensure!(first.log_text().contains("left the kernel programs attached"), "{}", first.log_text());
    ensure!(attachments()? == 2, "the programs stay attached while no agent runs");

    // No agent runs: 300 datagrams through, 40 into the DROP rule, 5 runs of an SDN process.
    send_udp(&pod.ns, to_listener, 300)?;
    send_udp(&pod.ns, to_rule, 40)?;
    for _ in 0..5 {
        ensure!(std::process::Command::new(&short).status()?.success());
    }
    let rule_drops = iptables_rule_packets(&host, "5002")?;

    let second = Agent::start(&host, &args)?;
    ensure!(second.log_text().contains("took over the previous agent's link"), "{}", second.log_text());
    second.wait_metrics("the gap's counts", |m| m.value("datapath_drops_total", &dropped) >= 50.0)?;
    settle();
    let after = second.metrics()?;
    let egress = [("interface", pod.veth.as_str()), ("direction", "egress")];
    println!(
        "across the restart: ingress {} packets (sent 450), drops {} (iptables: {rule_drops}), egress {}",
        after.value("datapath_packets_total", &ingress),
        after.value("datapath_drops_total", &dropped),
        after.value("datapath_packets_total", &egress),
    );
    ensure!(rule_drops == 50, "iptables' own count: {rule_drops}");
    ensure!(after.value("datapath_packets_total", &ingress) == 450.0, "{}", after.text);
    ensure!(after.value("datapath_bytes_total", &ingress) == 450.0 * FRAME, "{}", after.text);
    ensure!(after.value("datapath_drops_total", &dropped) == 50.0, "{}", after.text);
    ensure!(after.value("datapath_packets_total", &egress) == 0.0, "{}", after.text);
    ensure!(probe(&after, "continuity") == 1.0 && probe(&after, "tc") == 1.0, "{}", after.text);
    ensure!(attachments()? == 2, "attached exactly once after the take-over");
    // The gap's process runs were in the pinned ring buffer.
    let lifecycle = second.get_json("/api/v1/lifecycle")?;
    let ours = lifecycle["processes"]["processes"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == name.as_str()))
        .with_context(|| format!("{name} in {lifecycle}"))?;
    ensure!(ours["starts"] == 5 && ours["exits"] == 5, "the gap's 5 runs: {ours}");
    drop(second);

    // Uninstall: nothing of the agent stays.
    let binary = agent_binary()?;
    let detached = host.exec(&[binary.to_str().context("path")?, "detach", "--pin-dir", pins])?;
    println!("{}", detached.trim());
    ensure!(!std::path::Path::new(&pin_dir).exists(), "{pin_dir} left: {detached}");
    ensure!(attachments()? == 0, "attached after detach: {detached}");
    drop(listener);
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn a_restart_onto_the_other_attach_mode_counts_each_packet_once() -> Result<()> {
    require_root();
    if expected_tc_attach()? == "clsact" {
        return not_applicable("no tcx on this kernel: nothing to switch from");
    }
    let host = Netns::new("dmkc")?;
    let pod = Pod::new(&host, 44)?;
    let pin_dir = format!("{}/{}", bpffs()?, unique("dmpins"));
    let _cleanup = Detach(pin_dir.clone());
    let listener = host.run(|| UdpSocket::bind("0.0.0.0:5001"))??;
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    let veth_ifindex = ifindex_of(&host, &pod.veth)?;
    let keep = ["--keep-attached", "true", "--pin-dir", pin_dir.as_str()];
    let mut expected = 0.0;
    // tcx, then clsact, then tcx again: each agent takes over the same pinned counters, and
    // the previous agent's programs of the other mode go.
    for (round, mode) in ["tcx", "clsact", "tcx"].into_iter().enumerate() {
        let mut args = keep.to_vec();
        args.extend(["--tc-attach", mode]);
        let mut agent = Agent::start(&host, &args)?;
        send_udp(&pod.ns, addr(&pod.host_ip, 5001), 50)?;
        expected += 50.0;
        agent.wait_metrics("this round's packets", |m| m.value("datapath_packets_total", &ingress) >= expected)?;
        settle();
        let m = agent.metrics()?;
        let (tcx, clsact) = (attachments(&host, veth_ifindex, false)?, attachments(&host, veth_ifindex, true)?);
        println!(
            "round {round} on {mode}: {} packets (sent {expected}); tcx links {tcx}, clsact filters {clsact}",
            m.value("datapath_packets_total", &ingress)
        );
        ensure!(m.value("datapath_packets_total", &ingress) == expected, "{}", m.text);
        ensure!((tcx, clsact) == if mode == "tcx" { (2, 0) } else { (0, 2) }, "tcx {tcx}, clsact {clsact}");
        agent.stop()?;
    }
    drop(listener);
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn without_keep_attached_a_restart_is_blind_and_counts_start_again() -> Result<()> {
    require_root();
    let host = Netns::new("dmkb")?;
    let pod = Pod::new(&host, 43)?;
    let listener = host.run(|| UdpSocket::bind("0.0.0.0:5001"))??;
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    let veth_ifindex = ifindex_of(&host, &pod.veth)?;
    let clsact = expected_tc_attach()? == "clsact";
    let mut first = Agent::start(&host, &[])?;
    send_udp(&pod.ns, addr(&pod.host_ip, 5001), 100)?;
    first.wait_metrics("the first agent's counts", |m| m.value("datapath_packets_total", &ingress) >= 100.0)?;
    first.stop()?;
    ensure!(attachments(&host, veth_ifindex, clsact)? == 0, "detached at exit");
    send_udp(&pod.ns, addr(&pod.host_ip, 5001), 300)?;
    let second = Agent::start(&host, &[])?;
    send_udp(&pod.ns, addr(&pod.host_ip, 5001), 7)?;
    second.wait_metrics("the second agent's counts", |m| m.value("datapath_packets_total", &ingress) >= 7.0)?;
    settle();
    let after = second.metrics()?;
    println!(
        "without keep_attached: {} packets after the restart (7 sent since)",
        after.value("datapath_packets_total", &ingress)
    );
    ensure!(after.value("datapath_packets_total", &ingress) == 7.0, "{}", after.text);
    ensure!(!after.has("datapath_probe_loaded", &[("probe", "continuity")]), "{}", after.text);
    drop(listener);
    Ok(())
}

/// Runs `datapath-monitor detach` on drop, so that a failed test leaves nothing attached.
struct Detach(String);

impl Drop for Detach {
    fn drop(&mut self) {
        if std::path::Path::new(&self.0).exists()
            && let Ok(binary) = agent_binary()
        {
            let _ = std::process::Command::new(binary).args(["detach", "--pin-dir", &self.0]).status();
        }
    }
}

/// A bpffs the agents of a test share: `ip netns exec` gives each its own /sys, where the
/// agent would mount a bpffs of its own, gone with it (a DaemonSet mounts the host's).
fn bpffs() -> Result<&'static str> {
    const ROOT: &str = "/run/datapath-monitor-tests-bpffs";
    std::fs::create_dir_all(ROOT)?;
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    if !mounts.lines().any(|line| line.split_whitespace().nth(1) == Some(ROOT) && line.contains(" bpf ")) {
        sh(&["mount", "-t", "bpf", "bpf", ROOT])?;
    }
    Ok(ROOT)
}

fn probe(metrics: &Metrics, name: &str) -> f64 {
    metrics.value("datapath_probe_loaded", &[("probe", name)])
}

/// The agent's programs on the interface `ifindex` of `ns`: tcx links, or clsact filters.
fn attachments(ns: &Netns, ifindex: u32, clsact: bool) -> Result<usize> {
    if !clsact {
        // bpftool 7.1 names no interface for a tcx link: the machine's tcx links that run
        // the agent's programs (tests run one at a time, and every agent detaches at exit).
        let programs: serde_json::Value = serde_json::from_str(&sh(&["bpftool", "-j", "prog", "show"])?)?;
        let ours: Vec<&serde_json::Value> = programs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["name"] == "tc_ingress" || p["name"] == "tc_egress")
            .map(|p| &p["id"])
            .collect();
        let links: serde_json::Value = serde_json::from_str(&sh(&["bpftool", "-j", "link", "show"])?)?;
        let _ = (ns, ifindex);
        return Ok(links
            .as_array()
            .into_iter()
            .flatten()
            .filter(|link| (link["type"] == "tcx" || link["type"] == 11) && ours.contains(&&link["prog_id"]))
            .count());
    }
    let listing: serde_json::Value = serde_json::from_str(&ns.exec(&["bpftool", "-j", "net", "show"])?)?;
    let filters = listing.as_array().into_iter().flatten().filter_map(|entry| entry["tc"].as_array()).flatten();
    Ok(filters
        .filter(|filter| {
            filter["ifindex"] == ifindex
                && filter["kind"].as_str().is_some_and(|kind| kind.starts_with("clsact/"))
                && filter["name"].as_str().is_some_and(|name| name.starts_with("tc_"))
        })
        .count())
}
