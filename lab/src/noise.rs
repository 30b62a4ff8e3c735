//! Steady background traffic that loses packets by design, for the harder decoys: a lifecycle
//! event while it runs must not be taken for a disruption, since nothing more is lost than
//! before. Run as `dm-lab noise --kind ... --target IP` in the client pod, sending to the web pod:
//! - `rejects`: TCP connects to a closed port (answered by a reset) and UDP datagrams to a
//!   closed port (answered by ICMP port unreachable), [`NOISE_RATE`] of each a second;
//! - `scan`: SYNs to [`SCAN_PORTS`], which the web pod filters (an iptables DROP rule, as a
//!   NetworkPolicy does), [`NOISE_RATE`] a second, each connect abandoned after 800 ms like a
//!   scanner's (so the kernel never retransmits the SYN).

use std::{
    collections::VecDeque,
    io::ErrorKind,
    net::{IpAddr, SocketAddr, TcpStream, UdpSocket},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;
use socket2::{Domain, Socket, Type};

use crate::{
    Lab, Scenario,
    daemons::now_text,
    soak::{CLOSED_TCP_PORT, CLOSED_UDP_PORT},
    sys,
};

/// Requests a second of each kind.
pub const NOISE_RATE: u32 = 10;
/// The web pod's filtered ports the scan walks through.
pub const SCAN_PORTS: (u16, u16) = (20_000, 20_999);
/// How long a scanner waits for an answer before it gives up a port.
const SCAN_GIVE_UP: Duration = Duration::from_millis(800);
/// How long noise runs before a decoy's lifecycle event when nobody started it earlier.
pub const NOISE_LEAD: Duration = Duration::from_secs(10);
/// The noise daemon's pid-file name.
const DAEMON: &str = "noise";

/// What the noise daemon sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoiseKind {
    Rejects,
    Scan,
}

impl NoiseKind {
    pub fn name(self) -> &'static str {
        match self {
            NoiseKind::Rejects => "rejects",
            NoiseKind::Scan => "scan",
        }
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "rejects" => Ok(NoiseKind::Rejects),
            "scan" => Ok(NoiseKind::Scan),
            other => Err(format!("unknown noise {other:?}: rejects or scan")),
        }
    }

    /// The noise a scenario runs under, if any.
    pub fn of(scenario: Scenario) -> Option<Self> {
        match scenario {
            Scenario::RejectsRestart => Some(NoiseKind::Rejects),
            Scenario::ScanFlap => Some(NoiseKind::Scan),
            _ => None,
        }
    }
}

/// `dm-lab noise`: sends `kind` to `target` until killed; logs a tally every 10 s.
pub fn run(kind: NoiseKind, target: IpAddr) -> anyhow::Result<()> {
    let udp = UdpSocket::bind("0.0.0.0:0").context("binding a UDP socket")?;
    let interval = Duration::from_secs(1) / NOISE_RATE;
    let mut pending: VecDeque<(Instant, Socket)> = VecDeque::new();
    let (mut sent, mut answered) = (0u64, 0u64);
    let mut port = SCAN_PORTS.0;
    let mut next = Instant::now();
    let mut report = Instant::now() + Duration::from_secs(10);
    loop {
        match kind {
            NoiseKind::Rejects => {
                let _ = udp.send_to(b"anyone?", SocketAddr::new(target, CLOSED_UDP_PORT));
                let refused = matches!(
                    TcpStream::connect_timeout(&SocketAddr::new(target, CLOSED_TCP_PORT), Duration::from_secs(1)),
                    Err(error) if error.kind() == ErrorKind::ConnectionRefused
                );
                sent += 1;
                answered += u64::from(refused);
            }
            NoiseKind::Scan => {
                while pending.front().is_some_and(|(at, _)| at.elapsed() >= SCAN_GIVE_UP) {
                    pending.pop_front();
                }
                let socket = Socket::new(Domain::IPV4, Type::STREAM, None).context("a TCP socket")?;
                socket.set_nonblocking(true)?;
                // In progress (EINPROGRESS) is the expected outcome: nobody will answer.
                let _ = socket.connect(&SocketAddr::new(target, port).into());
                pending.push_back((Instant::now(), socket));
                port = if port >= SCAN_PORTS.1 { SCAN_PORTS.0 } else { port + 1 };
                sent += 1;
            }
        }
        if Instant::now() >= report {
            println!("{} noise {}: {sent} sent, {answered} answered by a reset", now_text(), kind.name());
            report += Duration::from_secs(10);
        }
        next += interval;
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

impl Lab {
    /// Starts the noise `scenario` runs under (none: nothing to do), unless it already runs;
    /// returns whether it was started now.
    pub fn start_noise(&self, scenario: Scenario) -> anyhow::Result<bool> {
        let Some(kind) = NoiseKind::of(scenario) else { return Ok(false) };
        if self.noise_running() {
            return Ok(false);
        }
        let client = self.pod("client").context("no client pod")?;
        let web = self.pod("web").context("no web pod")?;
        if kind == NoiseKind::Scan {
            let ports = format!("{}:{}", SCAN_PORTS.0, SCAN_PORTS.1);
            sys::run(
                sys::in_netns(&web.netns, "iptables")
                    .args(["-w", "5", "-I", "INPUT", "-p", "tcp", "--dport", &ports, "-j", "DROP"]),
            )?;
        }
        let bin = self.bin.clone();
        self.spawn(DAEMON, &client.netns, &bin, &["noise", "--kind", kind.name(), "--target", &web.ip])?;
        Ok(true)
    }

    /// Whether the noise daemon runs.
    pub fn noise_running(&self) -> bool {
        self.daemon_pid(DAEMON).is_some()
    }

    /// Stops the noise daemon and removes the scan's DROP rule; idempotent.
    pub fn stop_noise(&self) {
        self.stop_daemon(DAEMON);
        if let Some(web) = self.pod("web") {
            let ports = format!("{}:{}", SCAN_PORTS.0, SCAN_PORTS.1);
            let rule = ["-w", "5", "-D", "INPUT", "-p", "tcp", "--dport", &ports, "-j", "DROP"];
            while sys::run(sys::in_netns(&web.netns, "iptables").args(rule)).is_ok() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_belong_to_the_decoys() {
        assert_eq!(NoiseKind::parse("scan"), Ok(NoiseKind::Scan));
        assert_eq!(NoiseKind::parse(NoiseKind::Rejects.name()), Ok(NoiseKind::Rejects));
        assert!(NoiseKind::parse("flood").is_err());
        assert_eq!(NoiseKind::of(Scenario::ScanFlap), Some(NoiseKind::Scan));
        assert_eq!(NoiseKind::of(Scenario::SdnUpgrade), None);
    }
}
