//! End-to-end: the real agent on real veths, with real traffic and real drops.
//! Each test builds its own namespaces; counts are exact.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use datapath_monitor_tests::{
    Agent, FALLBACKS, Metrics, Netns, Pod, TempDir, addr, expected_tc_attach, ifindex_of, iptables_rule_packets,
    require_root, send_udp, settle, sh,
};

use datapath_monitor_tests::UDP_PAYLOAD as PAYLOAD;
/// Ethernet (14) + IPv4 (20) + UDP (8) + payload: skb->len on a veth.
const FRAME: f64 = (14 + 20 + 8 + PAYLOAD) as f64;

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn packets_and_bytes_are_counted_exactly_per_direction() -> Result<()> {
    packets_and_bytes(&[], 1)
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn packets_and_bytes_with_clsact_and_classic_tracepoint() -> Result<()> {
    packets_and_bytes(FALLBACKS, 6)
}

fn packets_and_bytes(agent_args: &[&str], subnet: u8) -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, subnet)?;
    let agent = Agent::start(&host, agent_args)?;
    let sent = 100;

    // A listener on the host, so nothing is dropped and nothing (ICMP) comes back.
    let listener = host.run(|| UdpSocket::bind("0.0.0.0:5001"))??;
    send_udp(&pod.ns, addr(&pod.host_ip, 5001), sent)?;
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    agent.wait_metrics("ingress packets", |m| m.value("datapath_packets_total", &ingress) >= sent as f64)?;
    settle();
    let m = agent.metrics()?;
    let egress = [("interface", pod.veth.as_str()), ("direction", "egress")];
    assert_eq!(m.value("datapath_packets_total", &ingress), sent as f64, "{}", m.text);
    assert_eq!(m.value("datapath_bytes_total", &ingress), sent as f64 * FRAME, "{}", m.text);
    assert_eq!(m.value("datapath_packets_total", &egress), 0.0, "{}", m.text);

    // And the other way: host to pod is egress on the host-side veth.
    let pod_listener = pod.ns.run(|| UdpSocket::bind("0.0.0.0:5002"))??;
    send_udp(&host, addr(&pod.pod_ip, 5002), 40)?;
    agent.wait_metrics("egress packets", |m| m.value("datapath_packets_total", &egress) >= 40.0)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!(m.value("datapath_packets_total", &egress), 40.0, "{}", m.text);
    assert_eq!(m.value("datapath_bytes_total", &egress), 40.0 * FRAME, "{}", m.text);
    assert_eq!(m.value("datapath_packets_total", &ingress), sent as f64, "{}", m.text);
    // The kernel's run-time statistics are opt-in (--bpf-stats): without them, no cost series.
    assert!(!m.text.contains("datapath_bpf_program_run"), "{}", m.text);
    drop((listener, pod_listener));
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn interfaces_sharing_a_counters_slot_are_each_counted_exactly() -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let first = Pod::new(&host, 7)?;
    // INTERFACE_SLOTS_MAX apart: the same fast-path slot, so the second falls back to the hash map.
    let second_ifindex = ifindex_of(&host, &first.veth)? + monitor_common::INTERFACE_SLOTS_MAX;
    let second = Pod::with_ifindex(&host, 8, second_ifindex)?;
    assert_eq!(ifindex_of(&host, &second.veth)?, second_ifindex);
    let agent = Agent::start(&host, &[])?;
    let listener = host.run(|| UdpSocket::bind("0.0.0.0:5011"))??;
    send_udp(&first.ns, addr(&first.host_ip, 5011), 30)?;
    send_udp(&second.ns, addr(&second.host_ip, 5011), 50)?;
    let ingress = |pod: &Pod| [("interface", pod.veth.clone()), ("direction", "ingress".to_string())];
    let value = |m: &Metrics, pod: &Pod| {
        let labels = ingress(pod);
        m.value("datapath_packets_total", &[(labels[0].0, labels[0].1.as_str()), (labels[1].0, labels[1].1.as_str())])
    };
    agent.wait_metrics("both pods' packets", |m| value(m, &first) >= 30.0 && value(m, &second) >= 50.0)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!((value(&m, &first), value(&m, &second)), (30.0, 50.0), "{}", m.text);
    drop(listener);
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn resets_from_a_closed_port_are_counted_on_the_right_direction() -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, 2)?;
    let agent = Agent::start(&host, &[])?;
    let attempts = 5;
    let target = addr(&pod.host_ip, 5999);
    pod.ns.run(move || {
        for _ in 0..attempts {
            let refused = TcpStream::connect_timeout(&target, Duration::from_secs(2));
            assert!(refused.is_err(), "port 5999 should be closed");
        }
    })?;
    let egress = [("interface", pod.veth.as_str()), ("direction", "egress")];
    agent.wait_metrics("resets", |m| m.value("datapath_tcp_resets_total", &egress) >= attempts as f64)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!(m.value("datapath_tcp_resets_total", &egress), attempts as f64, "{}", m.text);
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    assert_eq!(m.value("datapath_tcp_resets_total", &ingress), 0.0, "{}", m.text);
    // A refused SYN is answered: never a retransmit.
    assert_eq!(m.value("datapath_tcp_syn_retransmits_total", &[("interface", &pod.veth)]), 0.0, "{}", m.text);
    Ok(())
}

/// Connects with TCP_SYNCNT = `syn_retries`: the kernel sends exactly that many retransmits
/// before giving up, so the expected count does not depend on timing.
fn connect_with_syn_retries(target: SocketAddr, syn_retries: i32) -> std::io::Result<TcpStream> {
    // SAFETY: plain socket syscalls on a descriptor we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let retries = syn_retries;
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_SYNCNT,
            (&raw const retries).cast(),
            std::mem::size_of::<i32>() as u32,
        );
        let SocketAddr::V4(v4) = target else { unreachable!("IPv4 test address") };
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(fd, (&raw const sin).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32);
        if rc == 0 {
            Ok(std::os::fd::FromRawFd::from_raw_fd(fd))
        } else {
            let error = std::io::Error::last_os_error();
            libc::close(fd);
            Err(error)
        }
    }
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn syn_retransmits_into_a_drop_rule_are_counted_and_healthy_connects_are_not() -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, 3)?;
    host.exec(&["iptables", "-A", "INPUT", "-p", "tcp", "--dport", "7777", "-j", "DROP"])?;
    let agent = Agent::start(&host, &[])?;
    let interface = [("interface", pod.veth.as_str())];
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    let handshakes = |m: &Metrics| {
        (
            m.value("datapath_tcp_handshakes_total", &ingress),
            m.value("datapath_tcp_handshakes_unseen_service_total", &ingress),
        )
    };

    // Healthy: a listener answers; no retransmit. Only the first handshake goes to a service
    // not seen answering yet: its SYN-ACK makes the service known.
    let listener = host.run(|| TcpListener::bind("0.0.0.0:7000"))??;
    let healthy = addr(&pod.host_ip, 7000);
    pod.ns.run(move || {
        for _ in 0..3 {
            let stream = connect_with_syn_retries(healthy, 1).expect("healthy connect");
            drop(stream);
        }
    })?;
    agent.wait_metrics("handshake packets", |m| m.value("datapath_packets_total", &ingress) >= 6.0)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!(m.value("datapath_tcp_syn_retransmits_total", &interface), 0.0, "{}", m.text);
    assert_eq!(handshakes(&m), (3.0, 1.0), "handshakes, of which to an unseen service:\n{}", m.text);

    // Dropped: every SYN hits the DROP rule; all but the first are retransmits. How many
    // the kernel sends before giving up depends on its timeout policy (6.5+ starts with
    // linear timeouts), so the exact expectation comes from the drop count of the same SYNs.
    // Port 7777 never answered: its drops are a filtered port's, `:unseen_service`.
    let dropped = addr(&pod.host_ip, 7777);
    let started = Instant::now();
    let outcome = pod.ns.run(move || connect_with_syn_retries(dropped, 2).map(drop))?;
    ensure!(outcome.is_err(), "connect through a DROP rule should time out");
    eprintln!("connect gave up after {:?}", started.elapsed());
    // The DROP rule's own packet counter is the exact number of SYNs.
    let syns = iptables_rule_packets(&host, "7777")?;
    assert!(syns >= 3, "at least the SYN and TCP_SYNCNT=2 retransmits, got {syns}");
    let expected = (syns - 1) as f64;
    agent.wait_metrics("retransmits", |m| m.value("datapath_tcp_syn_retransmits_total", &interface) >= expected)?;
    settle();
    let m = agent.metrics()?;
    eprintln!("SYNs dropped by iptables (rule counter): {syns}");
    assert_eq!(m.value("datapath_tcp_syn_retransmits_total", &interface), expected, "{}", m.text);
    assert_eq!(handshakes(&m), (4.0, 2.0), "{}", m.text);
    let unseen = [("interface", pod.veth.as_str()), ("reason", "NETFILTER_DROP:unseen_service")];
    let netfilter = [("interface", pod.veth.as_str()), ("reason", "NETFILTER_DROP")];
    assert_drops_within_misses(&m, &unseen, syns)?;
    assert_eq!(m.value("datapath_drops_total", &netfilter), 0.0, "{}", m.text);

    // A service that answered, then filtered: its dropped SYNs are lost packets, plain
    // NETFILTER_DROP, and the handshake is no unseen one.
    let answering = host.run(|| TcpListener::bind("0.0.0.0:7778"))??;
    let known = addr(&pod.host_ip, 7778);
    pod.ns.run(move || connect_with_syn_retries(known, 1).map(drop))??;
    host.exec(&["iptables", "-A", "INPUT", "-p", "tcp", "--dport", "7778", "-j", "DROP"])?;
    let outcome = pod.ns.run(move || connect_with_syn_retries(known, 2).map(drop))?;
    ensure!(outcome.is_err(), "connect through the new DROP rule should time out");
    let known_syns = iptables_rule_packets(&host, "7778")?;
    let expected = expected + (known_syns - 1) as f64;
    agent.wait_metrics("retransmits", |m| m.value("datapath_tcp_syn_retransmits_total", &interface) >= expected)?;
    settle();
    let m = agent.metrics()?;
    eprintln!("SYNs to the service that answered before, dropped (rule counter): {known_syns}");
    assert_eq!(m.value("datapath_tcp_syn_retransmits_total", &interface), expected, "{}", m.text);
    assert_eq!(handshakes(&m), (6.0, 3.0), "{}", m.text);
    assert_drops_within_misses(&m, &netfilter, known_syns)?;
    assert_drops_within_misses(&m, &unseen, syns)?;
    assert_eq!(m.value("datapath_tcp_syn_retransmits_total", &[("interface", "other")]), 0.0);
    drop((listener, answering));
    Ok(())
}

/// The drops under `labels` are `packets` exactly, but for runs of the drop tracer the kernel
/// skipped: it skips a tracing program that would nest on one CPU and counts a recursion miss.
fn assert_drops_within_misses(m: &Metrics, labels: &[(&str, &str)], packets: u64) -> Result<()> {
    let misses = recursion_misses("kfree_skb_btf")?;
    let drops = m.value("datapath_drops_total", labels);
    assert!(
        drops <= packets as f64 && drops >= packets.saturating_sub(misses) as f64,
        "{labels:?}: {drops}, packets {packets}, kernel recursion misses {misses}:\n{}",
        m.text
    );
    Ok(())
}

/// The kernel's own count of TCP segments retransmitted by the sockets of `ns`.
fn tcp_retrans_segs(ns: &Netns) -> Result<u64> {
    // -a absolute, -s leaving nstat's history file alone, -z zeros included.
    let listing = ns.exec(&["nstat", "-asz", "TcpRetransSegs"])?;
    let line = listing
        .lines()
        .find(|l| l.starts_with("TcpRetransSegs"))
        .ok_or_else(|| anyhow::anyhow!("no TcpRetransSegs in nstat output:\n{listing}"))?;
    Ok(line.split_whitespace().nth(1).unwrap_or_default().parse()?)
}

/// Writes 1000 bytes every 10 ms to `to` until `stop`, then closes; returns the bytes sent.
fn send_tcp_steadily(to: SocketAddr, stop: Arc<AtomicBool>) -> Result<usize> {
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        stream.write_all(&[0x5a; 1000])?;
        sent += 1000;
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(sent)
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn data_retransmits_are_counted_as_the_pods_kernel_counts_them_and_healthy_traffic_has_none() -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, 9)?;
    let agent = Agent::start(&host, &[])?;
    let interface = [("interface", pod.veth.as_str())];
    let m = agent.wait_metrics("retransmit series", |m| m.has("datapath_tcp_retransmits_total", &interface))?;
    assert_eq!(m.value("datapath_probe_loaded", &[("probe", "tcp_retransmit")]), 1.0, "{}", m.text);
    let readyz = agent.get_json("/readyz")?;
    ensure!(readyz["probes"]["probes"]["tcp_retransmit"] == "tp_btf", "{readyz}");
    let before = tcp_retrans_segs(&pod.ns)?;

    // The host reads everything the pod sends, to the end.
    let port = 7100;
    let listener = host.run(move || TcpListener::bind(("0.0.0.0", port)))??;
    let reader = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut stream, _) = listener.accept()?;
        let (mut buffer, mut received) = (vec![0; 65536], 0);
        loop {
            match stream.read(&mut buffer)? {
                0 => return Ok(received),
                n => received += n,
            }
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let target = addr(&pod.host_ip, port);
    let sender = {
        let stop = Arc::clone(&stop);
        let pod_ns = Netns::existing(&pod.ns.name);
        std::thread::spawn(move || pod_ns.run(move || send_tcp_steadily(target, stop)))
    };

    // Healthy: 2 s of steady data, nothing retransmitted.
    std::thread::sleep(Duration::from_secs(2));
    settle();
    let m = agent.metrics()?;
    assert_eq!(tcp_retrans_segs(&pod.ns)?, before, "the healthy connection retransmitted");
    assert_eq!(m.value("datapath_tcp_retransmits_total", &interface), 0.0, "{}", m.text);

    // Lossy: the host drops the connection's data segments (ACKs pass, as did the handshake)
    // for 3 s; the pod's socket retransmits until the rule is gone.
    let rule = ["-i", &pod.veth, "-p", "tcp", "--dport", "7100", "-m", "length", "--length", "100:65535", "-j", "DROP"];
    host.exec(&[&["iptables", "-I", "INPUT"][..], &rule].concat())?;
    std::thread::sleep(Duration::from_secs(3));
    host.exec(&[&["iptables", "-D", "INPUT"][..], &rule].concat())?;
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))???;
    // Everything arrived: the socket has nothing left to retransmit.
    let received = reader.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
    assert_eq!(received, sent, "the connection lost data");

    let retransmitted = tcp_retrans_segs(&pod.ns)? - before;
    assert!(retransmitted > 0, "the DROP rule caused no retransmit");
    let counted = |m: &Metrics| m.value("datapath_tcp_retransmits_total", &interface);
    agent.wait_metrics("retransmits", |m| counted(m) >= retransmitted as f64)?;
    settle();
    let m = agent.metrics()?;
    eprintln!("TcpRetransSegs of the pod's netns: {retransmitted}; agent: {}", counted(&m));
    assert_eq!(counted(&m), retransmitted as f64, "{}", m.text);
    // Data retransmits only: the tc programs' SYN retransmit count did not move.
    assert_eq!(m.value("datapath_tcp_syn_retransmits_total", &interface), 0.0, "{}", m.text);
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn udp_to_closed_ports_counts_no_socket_drops_on_both_sides() -> Result<()> {
    no_socket_drops(&[], 4)
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn no_socket_drops_with_clsact_and_classic_tracepoint() -> Result<()> {
    no_socket_drops(FALLBACKS, 7)
}

fn no_socket_drops(agent_args: &[&str], subnet: u8) -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, subnet)?;
    let agent = Agent::start(&host, agent_args)?;
    let no_socket = [("interface", pod.veth.as_str()), ("reason", "NO_SOCKET")];

    // Pod to a closed host port: dropped in the host namespace on the host-side veth.
    send_udp(&pod.ns, addr(&pod.host_ip, 6001), 20)?;
    agent.wait_metrics("host-side drops", |m| m.value("datapath_drops_total", &no_socket) >= 20.0)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!(m.value("datapath_drops_total", &no_socket), 20.0, "{}", m.text);

    // Host to a closed pod port: dropped inside the pod on eth0, attributed to its veth.
    send_udp(&host, addr(&pod.pod_ip, 6002), 15)?;
    agent.wait_metrics("pod-side drops", |m| m.value("datapath_drops_total", &no_socket) >= 35.0)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!(m.value("datapath_drops_total", &no_socket), 35.0, "{}", m.text);
    let (_, readyz) = agent.get("/readyz")?;
    // auto picks tcx where the kernel has it (>= 6.6) and falls back to clsact elsewhere.
    let expected = if agent_args.is_empty() { [expected_tc_attach()?, "tp_btf"] } else { ["clsact", "tracepoint"] };
    for variant in expected {
        ensure!(readyz.contains(&format!("\"{variant}\"")), "{variant} not in /readyz: {readyz}");
    }
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn drops_on_a_host_device_for_a_pod_address_count_for_that_pod() -> Result<()> {
    drops_for_a_pod_on_a_host_device(&[], 21)
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn drops_for_a_pod_on_a_host_device_with_clsact_and_classic_tracepoint() -> Result<()> {
    drops_for_a_pod_on_a_host_device(FALLBACKS, 22)
}

/// The node's packets for a pod, dropped on a host device that is not the pod's veth (as
/// tun0 or a management port drops them when the switch behind it fails), count for that
/// pod: the drop tracer reads the destination and finds the pod's address from the CNI cache.
/// Drops there for an address no pod has stay with "other".
fn drops_for_a_pod_on_a_host_device(agent_args: &[&str], subnet: u8) -> Result<()> {
    require_root();
    let host = Netns::new("dmtd")?;
    let pod = Pod::new(&host, subnet)?;
    let cache = TempDir::new("dmcache")?;
    let sandbox = format!("/var/run/netns/{}", pod.ns.name);
    let entry = serde_json::json!({
        "kind": "cniCacheV1", "containerId": "c0ffee", "config": "", "ifName": "eth0",
        "networkName": "openshift-sdn",
        "cniArgs": [["K8S_POD_NAMESPACE", "openshift-apiserver"], ["K8S_POD_NAME", "apiserver-1"]],
        "result": {"cniVersion": "0.3.1",
                   "interfaces": [{"name": "eth0", "mac": "0a:58:0a:81:00:2b", "sandbox": sandbox}],
                   "ips": [{"version": "4", "interface": 0, "address": format!("{}/30", pod.pod_ip)}]}
    });
    std::fs::write(cache.join("openshift-sdn-c0ffee-eth0"), entry.to_string())?;
    let cache_dir = cache.display();
    let mut args = vec!["--cni-cache-dir", cache_dir.as_str()];
    args.extend_from_slice(agent_args);
    let agent = Agent::start(&host, &args)?;
    let labels = [("interface", pod.veth.as_str()), ("pod", "apiserver-1")];
    agent.wait_metrics("the pod's series", |m| m.has("datapath_packets_total", &labels))?;

    // The pod's address and one no pod has, routed through a host device of their own, where
    // a rule drops every packet leaving by it (NETFILTER_DROP, with skb->dev that device).
    let stranger = format!("10.78.{subnet}.3");
    host.exec(&["ip", "link", "add", "dmhost0", "type", "veth", "peer", "name", "dmhost1"])?;
    let peer_mac = datapath_monitor_tests::mac_of(&host, "dmhost1")?;
    for dev in ["dmhost0", "dmhost1"] {
        host.exec(&["ip", "link", "set", dev, "up"])?;
    }
    for ip in [pod.pod_ip.as_str(), stranger.as_str()] {
        host.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", "dmhost0"])?;
        host.exec(&["ip", "neigh", "replace", ip, "lladdr", &peer_mac, "dev", "dmhost0", "nud", "permanent"])?;
    }
    host.exec(&["iptables", "-t", "mangle", "-A", "POSTROUTING", "-o", "dmhost0", "-j", "DROP"])?;
    let dropped = [("interface", pod.veth.as_str()), ("reason", "NETFILTER_DROP")];
    // Wherever the agent puts drops it credits to no pod: "other", or dmhost0 if it watches it.
    let netfilter = [("reason", "NETFILTER_DROP")];
    let elsewhere =
        |m: &Metrics| m.value("datapath_drops_total", &netfilter) - m.value("datapath_drops_total", &dropped);
    let before_elsewhere = elsewhere(&agent.metrics()?);

    // Sending fails with EPERM once the rule dropped the datagram: that is the drop.
    let send = |to: &str, count: usize| {
        let to = addr(to, 6100);
        host.run(move || {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
            (0..count).filter(|_| socket.send_to(&[0x5a; PAYLOAD], to).is_err()).count()
        })
    };
    let refused = send(&pod.pod_ip, 40)?;
    let stranger_refused = send(&stranger, 7)?;
    let rule = host.exec(&["iptables", "-t", "mangle", "-L", "POSTROUTING", "-v", "-x", "-n"])?;
    let matched: u64 = rule
        .lines()
        .find(|l| l.contains("dmhost0"))
        .and_then(|l| l.split_whitespace().next())
        .context("the DROP rule's counters")?
        .parse()?;
    agent.wait_metrics("drops credited to the pod", |m| m.value("datapath_drops_total", &dropped) >= 40.0)?;
    settle();
    let m = agent.metrics()?;
    eprintln!(
        "iptables matched {matched}; send refused {refused} + {stranger_refused}; agent: pod {}, elsewhere +{}",
        m.value("datapath_drops_total", &dropped),
        elsewhere(&m) - before_elsewhere
    );
    assert_eq!(matched, 47, "iptables' own count");
    assert_eq!(m.value("datapath_drops_total", &dropped), 40.0, "{}", m.text);
    assert_eq!(elsewhere(&m) - before_elsewhere, 7.0, "{}", m.text);
    Ok(())
}

/// Runs of `program` the kernel skipped to avoid recursion (bpf_prog_info.recursion_misses).
fn recursion_misses(program: &str) -> Result<u64> {
    let programs: serde_json::Value = serde_json::from_str(&sh(&["bpftool", "-j", "prog", "show", "name", program])?)?;
    let programs = if programs.is_array() { programs } else { serde_json::Value::Array(vec![programs]) };
    Ok(programs.as_array().into_iter().flatten().filter_map(|p| p["recursion_misses"].as_u64()).sum())
}

fn count_programs(name: &str) -> Result<usize> {
    Ok(sh(&["bpftool", "prog", "show"])?.lines().filter(|l| l.contains(&format!(" name {name} "))).count())
}

/// tcx links on any interface of the machine (older bpftool prints the type as 11).
fn count_tcx_links() -> Result<usize> {
    let links: serde_json::Value = serde_json::from_str(&sh(&["bpftool", "-j", "link", "show"])?)?;
    Ok(links.as_array().into_iter().flatten().filter(|link| link["type"] == "tcx" || link["type"] == 11).count())
}

/// The agent's tc attachments as this kernel makes them: tcx links machine-wide, or (before
/// 6.6) clsact filters running our programs on the interfaces of `ns`.
fn count_tc_attachments(ns: &Netns) -> Result<usize> {
    if expected_tc_attach()? == "tcx" {
        return count_tcx_links();
    }
    let listing: serde_json::Value = serde_json::from_str(&ns.exec(&["bpftool", "-j", "net", "show"])?)?;
    let filters = listing.as_array().into_iter().flatten().filter_map(|entry| entry["tc"].as_array()).flatten();
    Ok(filters
        .filter(|filter| {
            filter["kind"].as_str().is_some_and(|kind| kind.starts_with("clsact/"))
                && filter["name"].as_str().is_some_and(|name| name.starts_with("tc_"))
        })
        .count())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn veth_churn_attaches_each_and_leaves_nothing_behind() -> Result<()> {
    require_root();
    let programs_before = count_programs("tc_ingress")?;
    let host = Netns::new("dmth")?;
    let links_before = count_tc_attachments(&host)?;
    let pods = Netns::new("dmtc")?;
    let mut agent = Agent::start(&host, &[])?;
    let base = agent.metrics()?.value("datapath_interfaces_attached", &[]);
    let pairs = 50;
    let names: Vec<String> = (0..pairs).map(|i| format!("veth{:04x}{i:04x}", std::process::id() & 0xffff)).collect();

    let mut latencies = Vec::with_capacity(pairs);
    for (i, name) in names.iter().enumerate() {
        let created = Instant::now();
        host.exec(&["ip", "link", "add", name, "type", "veth", "peer", "name", &format!("p{i}"), "netns", &pods.name])?;
        host.exec(&["ip", "link", "set", name, "up"])?;
        let deadline = created + Duration::from_secs(10);
        loop {
            let (_, body) = agent.get("/api/v1/interfaces")?;
            let interfaces: serde_json::Value = serde_json::from_str(&body)?;
            let attached = interfaces
                .as_array()
                .into_iter()
                .flatten()
                .any(|i| i["interface"] == name.as_str() && !i["attach_mode"].is_null());
            if attached {
                latencies.push(created.elapsed());
                break;
            }
            ensure!(Instant::now() < deadline, "{name} not attached after 10 s:\n{}", agent.log_text());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    latencies.sort();
    eprintln!(
        "attach latency over {pairs} veths (creation to visible in /api/v1/interfaces, incl. `ip` runtime): \
         p50 {:?}, p95 {:?}, max {:?}",
        latencies[pairs / 2],
        latencies[pairs * 95 / 100],
        latencies[pairs - 1]
    );
    let m =
        agent.wait_metrics("all attached", |m| m.value("datapath_interfaces_attached", &[]) == base + pairs as f64)?;
    drop(m);
    assert_eq!(count_programs("tc_ingress")?, programs_before + 1, "one program, many links");
    assert_eq!(
        count_tc_attachments(&host)?,
        links_before + 2 * (base as usize + pairs),
        "{}{}",
        sh(&["bpftool", "link", "show"])?,
        host.exec(&["bpftool", "net", "show"])?
    );

    for name in &names {
        host.exec(&["ip", "link", "del", name])?;
    }
    agent.wait_metrics("all detached", |m| m.value("datapath_interfaces_attached", &[]) == base)?;
    // Removed interfaces keep their series for the grace period (2 s here), then lose them.
    let first = [("interface", names[0].as_str())];
    agent
        .wait_metrics("removed series dropped after the grace period", |m| !m.has("datapath_packets_total", &first))?;
    let status = agent.stop()?;
    assert!(status.success(), "agent exit: {status}\n{}", agent.log_text());
    assert_eq!(
        count_programs("tc_ingress")?,
        programs_before,
        "programs leaked:\n{}",
        sh(&["bpftool", "prog", "show"])?
    );
    assert_eq!(count_tc_attachments(&host)?, links_before, "links leaked:\n{}", sh(&["bpftool", "link", "show"])?);
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn metrics_are_valid_openmetrics_with_every_family() -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, 5)?;
    let cni = TempDir::new("dmcni")?;
    std::fs::write(
        cni.join("10-a.conflist"),
        r#"{"cniVersion": "0.3.1", "name": "a", "plugins": [{"type": "bridge"}]}"#,
    )?;
    let cni_dir = cni.display();
    // The program cost families exist only with the opt-in statistics.
    let agent = Agent::start(&host, &["--cni-dir", &cni_dir, "--sdn-process", "dm-none", "--bpf-stats", "true"])?;
    send_udp(&pod.ns, addr(&pod.host_ip, 6003), 3)?;
    std::fs::write(cni.join("20-bad.conf"), "{")?;
    agent.wait_metrics("a CNI change", |m| m.has("datapath_cni_config_changes_total", &[("change", "invalid")]))?;
    agent.wait_metrics("drops", |m| m.has("datapath_drops_total", &[("interface", &pod.veth)]))?;
    let (status, body) = agent.get("/metrics")?;
    assert_eq!(status, 200);
    let exposition = openmetrics_parser::openmetrics::parse_openmetrics(&body)
        .map_err(|error| anyhow::anyhow!("invalid OpenMetrics: {error:?}\n{body}"))?;
    for family in [
        "datapath_packets",
        "datapath_bytes",
        "datapath_drops",
        "datapath_tcp_resets",
        "datapath_tcp_syn_retransmits",
        "datapath_tcp_retransmits",
        "datapath_tcp_handshakes",
        "datapath_tcp_handshakes_answered",
        "datapath_tcp_handshakes_unseen_service",
        "datapath_unanswered_packets",
        "datapath_interfaces_attached",
        "datapath_tc_programs_removed",
        "datapath_tc_reattach_failures",
        "datapath_bpf_program_runs",
        "datapath_bpf_program_run_seconds",
        "datapath_probe_loaded",
        "datapath_cni_default_network_present",
        "datapath_cni_config_changes",
        "datapath_sdn_process_running",
        "datapath_sdn_process_restarts",
        "datapath_lifecycle_events",
        "datapath_cni_cache_files_skipped",
    ] {
        ensure!(exposition.families.contains_key(family), "family {family} missing:\n{body}");
    }
    let m = agent.metrics()?;
    ensure!(m.value("datapath_bpf_program_runs_total", &[("program", "tc_ingress")]) >= 3.0, "{body}");
    Ok(())
}

#[test]
#[ignore = "needs root: run through cargo xtask test"]
fn forcing_tcx_reports_the_tc_probe_as_this_kernel_supports_it_and_drops_still_count() -> Result<()> {
    require_root();
    let host = Netns::new("dmth")?;
    let pod = Pod::new(&host, 8)?;
    let agent = Agent::start(&host, &["--tc-attach", "tcx"])?;
    let tcx = expected_tc_attach()? == "tcx";
    // Attached, the veth owns its drops; unattached (no tcx), they are counted under "other".
    let drops_at = if tcx { pod.veth.as_str() } else { "other" };
    let no_socket = [("interface", drops_at), ("reason", "NO_SOCKET")];
    let before = agent.metrics()?.value("datapath_drops_total", &no_socket);

    // The drop tracer does not depend on tc: it counts on every kernel.
    send_udp(&pod.ns, addr(&pod.host_ip, 6001), 20)?;
    agent.wait_metrics("host-side drops", |m| m.value("datapath_drops_total", &no_socket) >= before + 20.0)?;
    settle();
    let m = agent.metrics()?;
    assert_eq!(m.value("datapath_drops_total", &no_socket), before + 20.0, "{}", m.text);
    assert_eq!(m.value("datapath_probe_loaded", &[("probe", "kfree_skb")]), 1.0, "{}", m.text);

    let readyz = agent.get_json("/readyz")?;
    let interfaces = agent.get_json("/api/v1/interfaces")?;
    let ours = interfaces
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["interface"] == pod.veth.as_str())
        .with_context(|| format!("{} not in {interfaces}", pod.veth))?;
    let ingress = [("interface", pod.veth.as_str()), ("direction", "ingress")];
    if tcx {
        ensure!(readyz["probes"]["probes"]["tc"] == "tcx", "{readyz}");
        ensure!(ours["attach_mode"] == "tcx", "{ours}");
        assert_eq!(m.value("datapath_probe_loaded", &[("probe", "tc")]), 1.0, "{}", m.text);
        assert_eq!(m.value("datapath_packets_total", &ingress), 20.0, "{}", m.text);
    } else {
        // No tcx before 6.6 and no fallback allowed: reported and skipped, never a silent zero.
        ensure!(readyz["probes"]["probes"]["tc"].is_null(), "{readyz}");
        ensure!(readyz["probes"]["errors"]["tc"].as_str().is_some_and(|e| e.contains("tcx")), "{readyz}");
        ensure!(ours["attach_mode"].is_null(), "{ours}");
        ensure!(ours["attach_error"].as_str().is_some_and(|e| e.contains("tcx")), "{ours}");
        assert_eq!(m.value("datapath_probe_loaded", &[("probe", "tc")]), 0.0, "{}", m.text);
        ensure!(!m.has("datapath_packets_total", &ingress), "no packet series without a tc program:\n{}", m.text);
        ensure!(
            agent.log_text().lines().any(|l| l.contains("WARN") && l.contains("tc probe unsupported")),
            "{}",
            agent.log_text()
        );
    }
    Ok(())
}
