//! Traffic generators: raw SYNs over N flows, connect-request-close, iperf3, and a light
//! UDP background on the scaled veths.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use datapath_monitor_tests::{Netns, Pod};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, sendto, socket};

use crate::topology::SYN_SINK_ADDR;

/// Background threads stopped (and joined) on [`Background::stop`] or drop.
pub struct Background {
    stop: Arc<AtomicBool>,
    pub sent: Arc<AtomicU64>,
    threads: Vec<JoinHandle<Result<Result<()>>>>,
}

impl Background {
    fn new() -> Self {
        Self { stop: Arc::new(AtomicBool::new(false)), sent: Arc::new(AtomicU64::new(0)), threads: Vec::new() }
    }

    pub fn stop(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread.join().map_err(|_| anyhow::anyhow!("a traffic thread panicked"))???;
        }
        Ok(self.sent.load(Ordering::Relaxed))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sends `count` SYNs a second (None: as fast as one thread can), round-robin over `flows`
/// distinct 4-tuples, from `pod` to [`SYN_SINK_ADDR`]: they cross the pod's host veth
/// (ingress) and are consumed by the host's sink0 (an ifb device), unanswered, so each flow stays in the
/// tc program's flow table. Each pass over the flows uses a new sequence number, so the
/// program updates the entry in place and counts no retransmit.
pub fn syn_flows(pod: &Pod, flows: u32, rate: Option<u64>) -> Result<Background> {
    ensure!(flows > 0, "at least one flow");
    let source: std::net::Ipv4Addr = pod.pod_ip.parse()?;
    let mut background = Background::new();
    let (stop, sent) = (Arc::clone(&background.stop), Arc::clone(&background.sent));
    background.threads.push(pod.ns.spawn(move || -> Result<()> {
        let fd = socket(AddressFamily::Inet, SockType::Raw, SockFlag::empty(), SockProtocol::Tcp)
            .context("raw TCP socket")?;
        let [a, b, c, d] = SYN_SINK_ADDR;
        let destination = SockaddrIn::new(a, b, c, d, 0);
        let started = Instant::now();
        let mut packet = [0u8; 20];
        let (mut flow, mut pass, mut total) = (0u32, 0u32, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let due = rate.map_or(total + 256, |rate| (started.elapsed().as_secs_f64() * rate as f64) as u64);
            while total < due {
                let (sport, dport) = flow_ports(flow);
                syn_header(&mut packet, source.octets(), SYN_SINK_ADDR, sport, dport, pass);
                if let Err(error) =
                    sendto(std::os::fd::AsRawFd::as_raw_fd(&fd), &packet, &destination, MsgFlags::empty())
                {
                    // A full device queue is the kernel's back-pressure: try again on the next turn.
                    if error == nix::errno::Errno::ENOBUFS {
                        break;
                    }
                    bail!("sending a SYN: {error}");
                }
                total += 1;
                flow += 1;
                if flow == flows {
                    flow = 0;
                    pass = pass.wrapping_add(1);
                }
            }
            sent.store(total, Ordering::Relaxed);
            if rate.is_some() {
                thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    })?);
    Ok(background)
}

/// Flow `index`'s (source port, destination port): 60,000 source ports per destination port.
fn flow_ports(index: u32) -> (u16, u16) {
    ((1024 + index % 60_000) as u16, (80 + index / 60_000) as u16)
}

/// A TCP SYN header with a correct checksum (the kernel adds the IPv4 header).
fn syn_header(packet: &mut [u8; 20], source: [u8; 4], destination: [u8; 4], sport: u16, dport: u16, seq: u32) {
    packet.fill(0);
    packet[0..2].copy_from_slice(&sport.to_be_bytes());
    packet[2..4].copy_from_slice(&dport.to_be_bytes());
    packet[4..8].copy_from_slice(&seq.wrapping_mul(2_654_435_761).to_be_bytes());
    packet[12] = 5 << 4;
    packet[13] = 0x02;
    packet[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let mut sum: u32 = 0;
    for chunk in source.chunks(2).chain(destination.chunks(2)) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    sum += 6 + 20;
    for chunk in packet.chunks(2) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    packet[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// One datagram to each of `targets` (port `port`) every 100 ms, from `ns`, and a sink for
/// them on the host so they are delivered, not dropped.
pub fn scaled_background(ns: &Netns, host: &Netns, targets: Vec<String>, port: u16) -> Result<Background> {
    let mut background = Background::new();
    let stop = Arc::clone(&background.stop);
    background.threads.push(host.spawn(move || -> Result<()> {
        let socket = UdpSocket::bind(("0.0.0.0", port))?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let mut buffer = [0u8; 256];
        while !stop.load(Ordering::Relaxed) {
            let _ = socket.recv(&mut buffer);
        }
        Ok(())
    })?);
    thread::sleep(Duration::from_millis(100));
    let (stop, sent) = (Arc::clone(&background.stop), Arc::clone(&background.sent));
    background.threads.push(ns.spawn(move || -> Result<()> {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        while !stop.load(Ordering::Relaxed) {
            for target in &targets {
                // The first datagrams may meet an unresolved neighbour; later ones go through.
                if socket.send_to(&[0x5a; 64], (target.as_str(), port)).is_ok() {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    })?);
    Ok(background)
}

/// A request/response server in `ns`: per connection, read a request, answer, close.
pub fn crr_server(ns: &Netns, port: u16) -> Result<Background> {
    let mut background = Background::new();
    let stop = Arc::clone(&background.stop);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    background.threads.push(ns.spawn(move || -> Result<()> {
        let listener = TcpListener::bind(("0.0.0.0", port))?;
        let _ = ready_tx.send(());
        let mut request = [0u8; 256];
        for stream in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Ok(mut stream) = stream else { continue };
            if stream.read(&mut request).is_ok() {
                let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n");
            }
        }
        Ok(())
    })?);
    ready_rx.recv_timeout(Duration::from_secs(5)).context("request server did not start")?;
    Ok(background)
}

/// Stops a [`crr_server`]: its accept loop notices the flag at the next connection.
pub fn stop_crr_server(server: Background, ns: &Netns, address: String, port: u16) -> Result<()> {
    server.stop.store(true, Ordering::Relaxed);
    ns.run(move || TcpStream::connect((address.as_str(), port)).map(drop))??;
    server.stop().map(drop)
}

/// Connect-request-close from `ns` to `address:port` for `duration`, one at a time, the
/// pattern of readiness probes: completed exchanges per second.
pub fn crr_rate(ns: &Netns, address: &str, port: u16, duration: Duration) -> Result<f64> {
    let address = address.to_string();
    ns.run(move || -> Result<f64> {
        let started = Instant::now();
        let mut done = 0u64;
        let mut response = Vec::with_capacity(64);
        while started.elapsed() < duration {
            let mut stream = TcpStream::connect((address.as_str(), port)).context("connect")?;
            stream.write_all(b"GET /healthz HTTP/1.0\r\n\r\n")?;
            response.clear();
            stream.read_to_end(&mut response)?;
            ensure!(response.ends_with(b"ok\n"), "short response");
            done += 1;
        }
        Ok(done as f64 / started.elapsed().as_secs_f64())
    })?
}

/// `iperf3 -s` in `ns`, killed on drop.
pub struct Iperf3Server(Child);

impl Iperf3Server {
    pub fn start(ns: &Netns, port: u16) -> Result<Self> {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "iperf3", "-s", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 (run `cargo xtask setup`)")?;
        thread::sleep(Duration::from_millis(300));
        Ok(Self(child))
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn iperf3(ns: &Netns, server: &str, port: u16, duration: Duration, extra: &[&str]) -> Result<serde_json::Value> {
    let seconds = duration.as_secs().max(1).to_string();
    let port = port.to_string();
    // Client on CPU 0, server on the last CPU: less scheduler noise between rounds.
    let last_cpu = thread::available_parallelism().map_or(1, usize::from).saturating_sub(1);
    let affinity = format!("0,{last_cpu}");
    let mut args = vec!["iperf3", "-c", server, "-p", &port, "-t", &seconds, "-J", "-A", &affinity];
    args.extend_from_slice(extra);
    let output = ns.exec(&args)?;
    let json: serde_json::Value = serde_json::from_str(&output).context("iperf3 -J output")?;
    if let Some(error) = json.get("error") {
        bail!("iperf3: {error}");
    }
    Ok(json)
}

/// TCP bulk: received bits per second.
pub fn tcp_bulk(ns: &Netns, server: &str, port: u16, duration: Duration) -> Result<f64> {
    let json = iperf3(ns, server, port, duration, &[])?;
    json["end"]["sum_received"]["bits_per_second"].as_f64().context("no sum_received.bits_per_second")
}

/// UDP with 64-byte payloads, sent as fast as iperf3 can: datagrams received per second.
pub fn udp64(ns: &Netns, server: &str, port: u16, duration: Duration) -> Result<f64> {
    let json = iperf3(ns, server, port, duration, &["-u", "-l", "64", "-b", "0"])?;
    let sum = &json["end"]["sum"];
    let packets = sum["packets"].as_f64().context("no sum.packets")?;
    let lost = sum["lost_packets"].as_f64().context("no sum.lost_packets")?;
    let seconds = sum["seconds"].as_f64().context("no sum.seconds")?;
    ensure!(seconds > 0.0, "iperf3 ran for 0 s");
    Ok((packets - lost) / seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syn_checksum_verifies() {
        let mut packet = [0u8; 20];
        syn_header(&mut packet, [10, 77, 1, 2], [10, 201, 0, 1], 1024, 80, 7);
        // Summing the pseudo-header and the header including its checksum gives 0xffff.
        let mut sum: u32 = 0;
        for chunk in [10u8, 77, 1, 2, 10, 201, 0, 1].chunks(2).chain(packet.chunks(2)) {
            sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
        }
        sum += 6 + 20;
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_eq!(packet[13], 0x02, "SYN only");
    }

    #[test]
    fn flows_map_to_distinct_ports() {
        let ports: std::collections::BTreeSet<_> = (0..65_000).map(flow_ports).collect();
        assert_eq!(ports.len(), 65_000);
    }
}
