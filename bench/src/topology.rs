//! The bench's node: a host namespace with two pods routed through it like a CNI's, an
//! interface that silently consumes forwarded SYNs (flows that stay "active" in the flow
//! table), and scaled-out pod veths for the agent-cost runs.

use std::{io::Write as _, process::Command};

use anyhow::{Context as _, Result, ensure};
use datapath_monitor_tests::{Netns, Pod, sh};

/// Destination of the generated SYNs: routed to [`SYN_SINK_DEVICE`], which consumes them (no answer, no drop).
pub const SYN_SINK_NET: &str = "10.201.0.0/16";
pub const SYN_SINK_ADDR: [u8; 4] = [10, 201, 0, 1];
const SYN_SINK_DEVICE: &str = "sink0";
const HOST_PREFIX: &str = "dmbh";
const PODS_PREFIX: &str = "dmbp";

pub struct Topology {
    pub host: Netns,
    /// Client pod: iperf3 client, SYN and request generator.
    pub a: Pod,
    /// Server pod: iperf3 server, request/response server.
    pub b: Pod,
    scaled: Option<Scaled>,
}

/// Extra host-side veths whose peers live in one other namespace (so the agent sees pods).
struct Scaled {
    pods: Netns,
    count: usize,
}

impl Topology {
    pub fn new() -> Result<Self> {
        // An interrupted run leaves its namespaces (and their veths) behind.
        for prefix in [HOST_PREFIX, PODS_PREFIX] {
            for leftover in dm_lab::sys::netns_with_prefix(prefix) {
                eprintln!("dm-bench: removing network namespace {leftover}, left by an interrupted run");
                let _ = Command::new("ip").args(["netns", "del", &leftover]).status();
            }
        }
        let host = Netns::new(HOST_PREFIX)?;
        let a = Pod::new(&host, 1)?;
        let b = Pod::new(&host, 2)?;
        host.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        for pod in [&a, &b] {
            pod.ns.exec(&["ip", "route", "add", "default", "via", &pod.host_ip])?;
        }
        // Many short connections: a wide port range, and no client-side TIME_WAIT pile-up.
        a.ns.exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000"])?;
        a.ns.exec(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
        // An ifb device frees what is routed to it (not redirected by tc) with consume_skb: a
        // silent sink, no answer and no kfree_skb drop; noqueue so no qdisc overflows first.
        host.exec(&["ip", "link", "add", SYN_SINK_DEVICE, "type", "ifb"])?;
        host.exec(&["ip", "link", "set", SYN_SINK_DEVICE, "up"])?;
        host.exec(&["tc", "qdisc", "replace", "dev", SYN_SINK_DEVICE, "root", "noqueue"])?;
        host.exec(&["ip", "route", "add", SYN_SINK_NET, "dev", SYN_SINK_DEVICE])?;
        Ok(Self { host, a, b, scaled: None })
    }

    /// TSO/GSO (and GRO) on or off on every device the pod-to-pod path crosses.
    pub fn offloads(&self, on: bool) -> Result<()> {
        let state = if on { "on" } else { "off" };
        for (ns, dev) in
            [(&self.a.ns, "eth0"), (&self.b.ns, "eth0"), (&self.host, &self.a.veth), (&self.host, &self.b.veth)]
        {
            ns.exec(&["ethtool", "-K", dev, "tso", state, "gso", state, "gro", state])?;
        }
        Ok(())
    }

    /// Makes the host hold `count` more pod veths than the two pods' (created or removed as needed).
    pub fn scale_to(&mut self, count: usize) -> Result<()> {
        let scaled = match &mut self.scaled {
            Some(scaled) => scaled,
            None => self.scaled.insert(Scaled { pods: Netns::new(PODS_PREFIX)?, count: 0 }),
        };
        let mut host_batch = String::new();
        let mut pods_batch = String::new();
        for index in scaled.count..count {
            let (host_ip, peer_ip) = scaled_addresses(index);
            host_batch.push_str(&format!(
                "link add {} type veth peer name p{index} netns {}\naddr add {host_ip}/30 dev {0}\nlink set {0} up\n",
                scaled_name(index),
                scaled.pods.name
            ));
            pods_batch.push_str(&format!("addr add {peer_ip}/30 dev p{index}\nlink set p{index} up\n"));
        }
        for index in count..scaled.count {
            host_batch.push_str(&format!("link del {}\n", scaled_name(index)));
        }
        ip_batch(&self.host, &host_batch)?;
        ip_batch(&scaled.pods, &pods_batch)?;
        scaled.count = count;
        Ok(())
    }

    /// The namespace holding the scaled veths' peers, and the host-side address of each.
    pub fn scaled_peers(&self) -> Option<(&Netns, Vec<String>)> {
        let scaled = self.scaled.as_ref()?;
        Some((&scaled.pods, (0..scaled.count).map(|index| scaled_addresses(index).0).collect()))
    }
}

fn scaled_name(index: usize) -> String {
    format!("vethbench{index:04}")
}

/// (host side, peer side) of scaled veth `index`: a /30 in 10.200.0.0/16.
fn scaled_addresses(index: usize) -> (String, String) {
    let base = index * 4;
    let (high, low) = (base / 256, base % 256);
    (format!("10.200.{high}.{}", low + 1), format!("10.200.{high}.{}", low + 2))
}

fn ip_batch(ns: &Netns, batch: &str) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let mut child = Command::new("ip")
        .args(["-n", &ns.name, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    child.stdin.take().context("ip stdin")?.write_all(batch.as_bytes())?;
    let status = child.wait()?;
    ensure!(status.success(), "ip -n {} -batch failed ({status})", ns.name);
    Ok(())
}

/// The kernel release and CPU of this machine, for the report's header.
pub fn machine() -> String {
    let kernel = sh(&["uname", "-r"]).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name")?.split(':').nth(1).map(str::trim).map(String::from))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| info.lines().next()?.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!("Linux {}, {cpus} × {model}, {memory_gib:.0} GiB RAM", kernel.trim())
}
