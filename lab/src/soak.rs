//! Natural traffic with no fault, for measuring false incidents: pods that talk the way real
//! pods do, alongside the lab's always-on prober and UDP stream. Every behaviour here is
//! healthy, yet each looks like trouble to a naive detector: traffic that stops, datagrams
//! nobody answers, slow answers, resets and port-unreachables, bursts that come and go.
//!
//! Two internal daemons, run from the `dm-lab` binary inside the pods' network namespaces:
//! `soak-serve` (the servers, in the apiserver and web pods) and `soak-traffic --behaviours ...`
//! (the clients, in every pod). [`Lab::start_soak`] starts them all, [`Lab::stop_soak`] stops
//! them, and [`Lab::down`] removes them with everything else (they run from the lab's binary).

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::{Lab, daemons::now_text, sys};

/// Fast HTTP server (keep-alive): `GET /` → 200 with a small body.
pub const HTTP_PORT: u16 = 8080;
/// Slow HTTP server: answers after 600–900 ms.
pub const SLOW_PORT: u16 = 8081;
/// Bulk TCP server: sends the number of bytes asked for (`<n>\n`), then closes.
pub const BULK_PORT: u16 = 8082;
/// The bulk server's pause between 64 KiB chunks.
const BULK_PACE: Duration = Duration::from_millis(16);
/// DNS-like UDP responder.
pub const DNS_PORT: u16 = 5353;
/// UDP sink: reads everything, never replies (a syslog/metrics collector).
pub const SINK_PORT: u16 = 5514;
/// A TCP port nobody listens on (connects get RST).
pub const CLOSED_TCP_PORT: u16 = 8099;
/// A UDP port nobody listens on (datagrams get ICMP port unreachable).
pub const CLOSED_UDP_PORT: u16 = 5599;

/// A client behaviour of `soak-traffic`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Request/response for ~15 s (a GET every 200 ms), then silence for 10–40 s, in a loop.
    OnOff,
    /// One-way UDP to the sink (10/s, never answered) plus a GET every 5 s, from one pod.
    Push,
    /// Keep-alive sessions and new-connection GETs with 0–3 s think times, and requests to the
    /// slow server (600–900 ms answers).
    Bursty,
    /// TCP connects to a closed port (RST, every 2 s) and UDP to a closed port (ICMP port
    /// unreachable, every 1 s).
    Rejects,
    /// A 2–6 MB TCP transfer (~4 MB/s), then a pause of 10–30 s, in a loop.
    Bulk,
    /// DNS-like UDP queries from a fresh source port every 0.5–2 s (1 s timeout).
    Dns,
}

impl Behaviour {
    /// Every behaviour.
    pub const ALL: [Behaviour; 6] =
        [Behaviour::OnOff, Behaviour::Push, Behaviour::Bursty, Behaviour::Rejects, Behaviour::Bulk, Behaviour::Dns];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Behaviour::OnOff => "onoff",
            Behaviour::Push => "push",
            Behaviour::Bursty => "bursty",
            Behaviour::Rejects => "rejects",
            Behaviour::Bulk => "bulk",
            Behaviour::Dns => "dns",
        }
    }

    /// The behaviour named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|behaviour| behaviour.name() == name.trim())
    }

    /// One line on what it does.
    pub fn description(self) -> &'static str {
        match self {
            Behaviour::OnOff => "request/response (a GET every 200 ms) for ~15 s, then idle 10–40 s, in a loop",
            Behaviour::Push => {
                "one-way UDP push (10/s) to an open port that never answers, plus a GET every 5 s from the same pod"
            }
            Behaviour::Bursty => {
                "bursty HTTP: keep-alive sessions and new-connection GETs with 0–3 s think times; a slow server answering after 600–900 ms"
            }
            Behaviour::Rejects => {
                "TCP connects to a closed port every 2 s (RST) and UDP to a closed port every 1 s (ICMP port unreachable)"
            }
            Behaviour::Bulk => "a 2–6 MB TCP bulk transfer (~4 MB/s), then a 10–30 s pause, in a loop",
            Behaviour::Dns => "DNS-like UDP request/response from a fresh source port every 0.5–2 s",
        }
    }
}

/// Parses a comma-separated behaviour list.
pub fn parse_behaviours(list: &str) -> anyhow::Result<Vec<Behaviour>> {
    list.split(',')
        .filter(|name| !name.trim().is_empty())
        .map(|name| {
            Behaviour::parse(name).with_context(|| {
                let names: Vec<&str> = Behaviour::ALL.iter().map(|b| b.name()).collect();
                format!("unknown behaviour {name:?} (one of: {})", names.join(", "))
            })
        })
        .collect()
}

/// `soak-traffic`'s behaviours (comma-separated) and the pod they talk to.
type Traffic = Option<(&'static str, &'static str)>;

/// Which soak daemons run where: (pid-file name, pod, [`Traffic`]; None for the servers).
const LAYOUT: [(&str, &str, Traffic); 5] = [
    ("soak-serve-apiserver", "apiserver", None),
    ("soak-serve-web", "web", None),
    ("soak-client", "client", Some(("onoff,bursty,rejects,bulk,dns", "web"))),
    ("soak-apiserver", "apiserver", Some(("push,dns", "web"))),
    ("soak-web", "web", Some(("onoff,dns", "apiserver"))),
];

/// One soak behaviour's results over a soak, as its daemon logged them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrafficTally {
    /// The daemon's pid-file name, e.g. `soak-client`.
    pub daemon: &'static str,
    pub behaviour: &'static str,
    /// Requests answered as they should be (for `rejects`: refused as expected).
    pub ok: u64,
    pub failed: u64,
}

/// Every soak behaviour's tally, read from the daemons' logs in `logs_dir`; a behaviour that
/// logged nothing (its daemon died, or never started) is there with 0 and 0.
pub fn traffic_tallies(logs_dir: &std::path::Path) -> Vec<TrafficTally> {
    let mut tallies = Vec::new();
    for (daemon, _, traffic) in LAYOUT {
        let Some((behaviours, _)) = traffic else { continue };
        let log = std::fs::read_to_string(logs_dir.join(format!("{daemon}.log"))).unwrap_or_default();
        for behaviour in
            Behaviour::ALL.iter().map(|b| b.name()).filter(|name| behaviours.split(',').any(|b| b == *name))
        {
            let (ok, failed) = tally_in_log(&log, behaviour);
            tallies.push(TrafficTally { daemon, behaviour, ok, failed });
        }
    }
    tallies
}

/// The sums of `behaviour`'s report lines (`<time> <name>: <ok> ok, <failed> failed since the
/// last report`; the name may say more after the behaviour's, as `rejects (ok = …)` does).
fn tally_in_log(log: &str, behaviour: &str) -> (u64, u64) {
    let mut sums = (0, 0);
    for line in log.lines() {
        let Some((head, counts)) = line.split_once(": ") else { continue };
        let name = head.split_once(' ').map_or("", |(_, name)| name);
        if name.split_whitespace().next() != Some(behaviour) {
            continue;
        }
        let Some(counts) = counts.strip_suffix(" failed since the last report") else { continue };
        let Some((ok, failed)) = counts.split_once(" ok, ") else { continue };
        if let (Ok(ok), Ok(failed)) = (ok.trim().parse::<u64>(), failed.trim().parse::<u64>()) {
            sums.0 += ok;
            sums.1 += failed;
        }
    }
    sums
}

/// What the soak runs, one line per daemon (for reports).
pub fn layout() -> Vec<String> {
    LAYOUT
        .iter()
        .map(|(_, pod, traffic)| match traffic {
            None => format!(
                "{pod} pod serves HTTP :{HTTP_PORT} (keep-alive), slow HTTP :{SLOW_PORT}, bulk TCP :{BULK_PORT}, DNS-like UDP :{DNS_PORT}, UDP sink :{SINK_PORT}"
            ),
            Some((behaviours, to)) => format!("{pod} pod → {to} pod: {}", behaviours.replace(',', ", ")),
        })
        .collect()
}

impl Lab {
    /// Starts the soak daemons (servers first); returns their pids.
    pub fn start_soak(&self) -> anyhow::Result<Vec<i32>> {
        self.stop_soak();
        let bin = self.bin.clone();
        let mut pids = Vec::new();
        for (name, pod, traffic) in LAYOUT {
            let pod = self.pod(pod).with_context(|| format!("no {pod} pod"))?;
            let pid = match traffic {
                None => self.spawn(name, &pod.netns, &bin, &["soak-serve"])?,
                Some((behaviours, to)) => {
                    let target = self.pod(to).with_context(|| format!("no {to} pod"))?;
                    self.spawn(
                        name,
                        &pod.netns,
                        &bin,
                        &["soak-traffic", "--target", &target.ip, "--behaviours", behaviours],
                    )?
                }
            };
            pids.push(pid);
        }
        Ok(pids)
    }

    /// Stops the soak daemons (SIGTERM, SIGKILL after 2 s); idempotent.
    pub fn stop_soak(&self) {
        for (name, _, _) in LAYOUT {
            self.stop_daemon(name);
        }
    }
}

/// A small xorshift generator: the soak needs variety, not cryptography.
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock, the pid and `salt`.
    pub fn new(salt: u64) -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        Self::seeded((nanos as u64) ^ (u64::from(std::process::id()) << 32) ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A fixed seed (tests).
    pub fn seeded(seed: u64) -> Self {
        Rng(seed | 1)
    }

    /// A replayable stream for a user's seed: every seed its own (splitmix64's finaliser first,
    /// so that seeds 42 and 43 do not share a stream as they would in [`Rng::seeded`]).
    pub fn from_seed(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self::seeded(z ^ (z >> 31))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `[low, high]`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low { low } else { low + self.next_u64() % (high - low + 1) }
    }

    /// A duration uniform in `[low_ms, high_ms]` milliseconds.
    pub fn millis(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(self.range(low_ms, high_ms))
    }
}

/// `soak-serve`: the soak's servers, one thread each (plus one per connection).
pub fn serve() -> anyhow::Result<()> {
    let http = TcpListener::bind(("0.0.0.0", HTTP_PORT)).with_context(|| format!("binding :{HTTP_PORT}"))?;
    let slow = TcpListener::bind(("0.0.0.0", SLOW_PORT)).with_context(|| format!("binding :{SLOW_PORT}"))?;
    let bulk = TcpListener::bind(("0.0.0.0", BULK_PORT)).with_context(|| format!("binding :{BULK_PORT}"))?;
    let dns = UdpSocket::bind(("0.0.0.0", DNS_PORT)).with_context(|| format!("binding udp :{DNS_PORT}"))?;
    let sink = UdpSocket::bind(("0.0.0.0", SINK_PORT)).with_context(|| format!("binding udp :{SINK_PORT}"))?;
    println!(
        "{} soak servers: http :{HTTP_PORT}, slow :{SLOW_PORT}, bulk :{BULK_PORT}, dns :{DNS_PORT}, sink :{SINK_PORT}",
        now_text()
    );
    thread::spawn(move || accept_loop(http, |stream| serve_http(stream, None)));
    thread::spawn(move || {
        let mut rng = Rng::new(SLOW_PORT.into());
        accept_loop(slow, move |stream| serve_http(stream, Some(rng.millis(600, 900))))
    });
    thread::spawn(move || accept_loop(bulk, serve_bulk));
    thread::spawn(move || {
        let mut buf = [0u8; 512];
        let mut count = 0u64;
        loop {
            if sink.recv_from(&mut buf).is_ok() {
                count += 1;
                if count.is_power_of_two() && count >= 1024 {
                    println!("{} sink: {count} datagrams received, none answered", now_text());
                }
            }
        }
    });
    let mut buf = [0u8; 512];
    loop {
        match dns.recv_from(&mut buf) {
            Ok((n, peer)) => {
                // The answer: the query's id and question, plus a fixed "answer".
                let mut answer = buf[..n].to_vec();
                answer.extend_from_slice(b"\x00\x01\x0a\x81\x00\x2c");
                let _ = dns.send_to(&answer, peer);
            }
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn accept_loop(listener: TcpListener, mut handle: impl FnMut(TcpStream) -> std::io::Result<()>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                // The handler serves the connection on a thread of its own.
                if let Err(error) = handle(stream) {
                    eprintln!("{} soak server: {error}", now_text());
                }
            }
            Err(error) => {
                eprintln!("{} accept: {error}", now_text());
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Serves HTTP/1.1 requests on one connection, on a thread of its own (keep-alive until the
/// client closes or asks to), each answered after `delay`.
fn serve_http(stream: TcpStream, delay: Option<Duration>) -> std::io::Result<()> {
    thread::spawn(move || {
        let _ = http_session(stream, delay);
    });
    Ok(())
}

fn http_session(mut stream: TcpStream, delay: Option<Duration>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut pending = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let head_end = loop {
            if let Some(end) = pending.windows(4).position(|window| window == b"\r\n\r\n") {
                break end + 4;
            }
            let n = stream.read(&mut buf)?;
            if n == 0 || pending.len() > 16 * 1024 {
                return Ok(());
            }
            pending.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).to_ascii_lowercase();
        pending.drain(..head_end);
        let close = head.contains("connection: close");
        if let Some(delay) = delay {
            thread::sleep(delay);
        }
        let body = "{\"items\":[1,2,3],\"ok\":true}\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{body}",
            body.len(),
            if close { "close" } else { "keep-alive" }
        );
        stream.write_all(response.as_bytes())?;
        if close {
            return Ok(());
        }
    }
}

/// Reads `<bytes>\n` and sends that many bytes (at most 16 MB), then closes.
fn serve_bulk(stream: TcpStream) -> std::io::Result<()> {
    thread::spawn(move || {
        let _ = bulk_session(stream);
    });
    Ok(())
}

fn bulk_session(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 32 {
        if stream.read(&mut byte)? == 0 || byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    let wanted: usize = String::from_utf8_lossy(&line).trim().parse().unwrap_or(0).min(16 << 20);
    let chunk = [0x5au8; 64 * 1024];
    let mut left = wanted;
    // Paced at ~4 MB/s (a 64 KiB chunk every 16 ms): a bulk transfer, not a flood that starves
    // the lab's userspace switch (which then really loses the prober's and the UDP stream's
    // packets, i.e. a fault).
    while left > 0 {
        let n = left.min(chunk.len());
        stream.write_all(&chunk[..n])?;
        left -= n;
        thread::sleep(BULK_PACE);
    }
    Ok(())
}

/// Counters of one behaviour, logged once a minute.
#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
}

impl Tally {
    fn count(&mut self, ok: bool) {
        if ok { self.ok += 1 } else { self.failed += 1 }
    }
}

/// How often a daemon logs its tallies: a soak's tallies miss at most its last this long.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Logs `tally` after the first result, then every [`REPORT_EVERY`] (to stdout, the daemon's
/// log; [`traffic_tallies`] reads it back).
struct Reporter {
    name: &'static str,
    tally: Tally,
    next: Instant,
}

impl Reporter {
    fn new(name: &'static str) -> Self {
        Reporter { name, tally: Tally::default(), next: Instant::now() }
    }

    fn count(&mut self, ok: bool) {
        self.tally.count(ok);
        if Instant::now() >= self.next {
            println!(
                "{} {}: {} ok, {} failed since the last report",
                now_text(),
                self.name,
                self.tally.ok,
                self.tally.failed
            );
            self.tally = Tally::default();
            self.next = Instant::now() + REPORT_EVERY;
        }
    }
}

/// `soak-traffic`: runs `behaviours` toward `target` (an IP), one thread each, forever.
pub fn traffic(target: &str, behaviours: &[Behaviour]) -> anyhow::Result<()> {
    let ip: std::net::IpAddr = target.parse().with_context(|| format!("bad target IP {target}"))?;
    if behaviours.is_empty() {
        bail!("no behaviours");
    }
    let names: Vec<&str> = behaviours.iter().map(|b| b.name()).collect();
    println!("{} soak traffic to {ip}: {}", now_text(), names.join(", "));
    let mut handles = Vec::new();
    for (index, behaviour) in behaviours.iter().copied().enumerate() {
        handles.push(thread::spawn(move || {
            let mut rng = Rng::new(index as u64 + 1);
            // Start at different moments, as pods do.
            thread::sleep(rng.millis(0, 3000));
            match behaviour {
                Behaviour::OnOff => on_off(ip, &mut rng),
                Behaviour::Push => push(ip, &mut rng),
                Behaviour::Bursty => bursty(ip, &mut rng),
                Behaviour::Rejects => rejects(ip),
                Behaviour::Bulk => bulk(ip, &mut rng),
                Behaviour::Dns => dns(ip, &mut rng),
            }
        }));
    }
    for handle in handles {
        let _ = handle.join();
    }
    Ok(())
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// One GET on a new connection (`Connection: close`); true on a 200.
fn get_once(addr: SocketAddr, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT) else { return false };
    request(&mut stream, addr, path, true)
}

/// One request on `stream`, reading the whole response (Content-Length framed).
fn request(stream: &mut TcpStream, addr: SocketAddr, path: &str, close: bool) -> bool {
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: soak/1\r\nConnection: {}\r\n\r\n",
        if close { "close" } else { "keep-alive" }
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return false;
    }
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = response.windows(4).position(|window| window == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
            let length = text
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if response.len() >= end + 4 + length {
                return text.starts_with("http/1.1 200");
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

fn on_off(ip: std::net::IpAddr, rng: &mut Rng) -> ! {
    let addr = SocketAddr::new(ip, HTTP_PORT);
    let mut reporter = Reporter::new("onoff");
    loop {
        let until = Instant::now() + rng.millis(13_000, 17_000);
        while Instant::now() < until {
            reporter.count(get_once(addr, "/api/items"));
            thread::sleep(Duration::from_millis(200));
        }
        thread::sleep(rng.millis(10_000, 40_000));
    }
}

fn push(ip: std::net::IpAddr, rng: &mut Rng) -> ! {
    let sink = SocketAddr::new(ip, SINK_PORT);
    let http = SocketAddr::new(ip, HTTP_PORT);
    let socket = loop {
        match UdpSocket::bind("0.0.0.0:0") {
            Ok(socket) => break socket,
            Err(_) => thread::sleep(Duration::from_secs(1)),
        }
    };
    let mut reporter = Reporter::new("push");
    let mut next_get = Instant::now() + rng.millis(0, 5000);
    let mut line = 0u64;
    loop {
        line += 1;
        let message = format!("<134>1 {} client-1 app - - - metric requests_total {line}", now_text());
        let _ = socket.send_to(message.as_bytes(), sink);
        if Instant::now() >= next_get {
            reporter.count(get_once(http, "/metrics"));
            next_get += Duration::from_secs(5);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn bursty(ip: std::net::IpAddr, rng: &mut Rng) -> ! {
    let fast = SocketAddr::new(ip, HTTP_PORT);
    let slow = SocketAddr::new(ip, SLOW_PORT);
    let mut reporter = Reporter::new("bursty");
    loop {
        match rng.range(0, 2) {
            // A keep-alive session of 1–20 requests with think times.
            0 => {
                if let Ok(mut stream) = TcpStream::connect_timeout(&fast, REQUEST_TIMEOUT) {
                    for _ in 0..rng.range(1, 20) {
                        let ok = request(&mut stream, fast, "/api/items", false);
                        reporter.count(ok);
                        if !ok {
                            break;
                        }
                        thread::sleep(rng.millis(0, 3000));
                    }
                } else {
                    reporter.count(false);
                }
            }
            // A burst of new connections.
            1 => {
                for _ in 0..rng.range(1, 8) {
                    reporter.count(get_once(fast, "/api/items"));
                }
            }
            // The slow server.
            _ => reporter.count(get_once(slow, "/api/report")),
        }
        thread::sleep(rng.millis(0, 3000));
    }
}

fn rejects(ip: std::net::IpAddr) -> ! {
    let closed_tcp = SocketAddr::new(ip, CLOSED_TCP_PORT);
    let closed_udp = SocketAddr::new(ip, CLOSED_UDP_PORT);
    let socket = loop {
        match UdpSocket::bind("0.0.0.0:0") {
            Ok(socket) => break socket,
            Err(_) => thread::sleep(Duration::from_secs(1)),
        }
    };
    let mut reporter = Reporter::new("rejects (ok = refused as expected)");
    let mut tick = 0u64;
    loop {
        let _ = socket.send_to(b"hello?", closed_udp);
        if tick.is_multiple_of(2) {
            let refused = matches!(
                TcpStream::connect_timeout(&closed_tcp, REQUEST_TIMEOUT),
                Err(error) if error.kind() == ErrorKind::ConnectionRefused
            );
            reporter.count(refused);
        }
        tick += 1;
        thread::sleep(Duration::from_secs(1));
    }
}

fn bulk(ip: std::net::IpAddr, rng: &mut Rng) -> ! {
    let addr = SocketAddr::new(ip, BULK_PORT);
    let mut reporter = Reporter::new("bulk");
    loop {
        let wanted = rng.range(2 << 20, 6 << 20) as usize;
        let ok = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)
            .and_then(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                stream.write_all(format!("{wanted}\n").as_bytes())?;
                let mut got = 0usize;
                let mut buf = [0u8; 64 * 1024];
                loop {
                    let n = stream.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                Ok(got == wanted)
            })
            .unwrap_or(false);
        reporter.count(ok);
        thread::sleep(rng.millis(10_000, 30_000));
    }
}

fn dns(ip: std::net::IpAddr, rng: &mut Rng) -> ! {
    let server = SocketAddr::new(ip, DNS_PORT);
    let mut reporter = Reporter::new("dns");
    loop {
        // A fresh socket (source port) per query, as stub resolvers do.
        let ok = UdpSocket::bind("0.0.0.0:0")
            .and_then(|socket| {
                socket.set_read_timeout(Some(Duration::from_secs(1)))?;
                let id = (rng.next_u64() & 0xffff) as u16;
                let mut query = id.to_be_bytes().to_vec();
                query.extend_from_slice(b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03web\x03svc\x00\x00\x01\x00\x01");
                socket.send_to(&query, server)?;
                let mut buf = [0u8; 512];
                let (n, _) = socket.recv_from(&mut buf)?;
                Ok(n >= 2 && buf[..2] == id.to_be_bytes())
            })
            .unwrap_or(false);
        reporter.count(ok);
        thread::sleep(rng.millis(500, 2000));
    }
}

/// Writes the daemon's pid when asked (the soak daemons are spawned like the lab's others).
pub fn write_pid(pidfile: Option<&Path>) -> anyhow::Result<()> {
    match pidfile {
        Some(path) => sys::write_own_pid(path),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_sum_each_behaviours_report_lines() {
        let log = "2026-12-07T06:50:00.000Z soak traffic to 10.0.0.2: onoff, rejects\n\
                   2026-12-07T06:50:00.100Z onoff: 1 ok, 0 failed since the last report\n\
                   2026-12-07T06:50:00.200Z rejects (ok = refused as expected): 1 ok, 0 failed since the last report\n\
                   2026-12-07T06:50:10.100Z onoff: 49 ok, 2 failed since the last report\n\
                   2026-12-07T06:50:10.300Z onoffish: 7 ok, 7 failed since the last report\n";
        assert_eq!(tally_in_log(log, "onoff"), (50, 2));
        assert_eq!(tally_in_log(log, "rejects"), (1, 0));
        assert_eq!(tally_in_log(log, "dns"), (0, 0));
    }

    #[test]
    fn a_daemon_without_a_log_has_every_behaviour_at_zero() {
        let tallies = traffic_tallies(std::path::Path::new("/nonexistent"));
        assert!(tallies.iter().all(|t| t.ok == 0 && t.failed == 0));
        // One per (daemon, behaviour) of the layout: 5 + 2 + 2.
        assert_eq!(tallies.len(), 9);
        assert!(tallies.contains(&TrafficTally { daemon: "soak-client", behaviour: "bulk", ok: 0, failed: 0 }));
    }

    #[test]
    fn behaviours_parse_and_the_layout_uses_them_all() {
        assert_eq!(parse_behaviours("onoff, dns").unwrap(), vec![Behaviour::OnOff, Behaviour::Dns]);
        assert!(parse_behaviours("onoff,meteor").is_err());
        let mut used: Vec<Behaviour> = LAYOUT
            .iter()
            .filter_map(|(_, _, traffic)| traffic.map(|(list, _)| parse_behaviours(list).unwrap()))
            .flatten()
            .collect();
        used.sort_by_key(|b| b.name());
        used.dedup();
        assert_eq!(used.len(), Behaviour::ALL.len());
        assert_eq!(layout().len(), LAYOUT.len());
    }

    #[test]
    fn rng_ranges_stay_in_bounds() {
        let mut rng = Rng::seeded(42);
        for _ in 0..1000 {
            let x = rng.range(10, 40);
            assert!((10..=40).contains(&x));
        }
        assert_eq!(rng.range(5, 5), 5);
        assert_eq!(rng.range(7, 3), 7);
    }

    #[test]
    fn servers_and_clients_talk() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for stream in listener.incoming().take(2).flatten() {
                let _ = http_session(stream, None);
            }
        });
        assert!(get_once(addr, "/x"));
        let mut stream = TcpStream::connect(addr).unwrap();
        assert!(request(&mut stream, addr, "/a", false));
        assert!(request(&mut stream, addr, "/b", false));

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let _ = bulk_session(stream);
        });
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(b"200000\n").unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 200_000);
    }
}
