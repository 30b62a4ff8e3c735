//! The lab's small daemons, run from the `dm-lab` binary inside the lab's network namespaces:
//! the apiserver pod's `/healthz` server, a UDP echo server and a steady UDP client (so every pod
//! veth carries packets both ways), and a kubelet-like readiness prober. None of them panics on a
//! network error: each logs it and carries on. They exit on SIGTERM (its default action).

use std::{
    fs::OpenOptions,
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use jiff::Timestamp;

use crate::probe_log::{Probe, seconds_between};

/// Now, RFC 3339 with milliseconds, for log lines.
pub fn now_text() -> String {
    format!("{:.3}", Timestamp::now())
}

/// Appends one line to `path` in a single write (so concurrent readers never see half a line
/// unless the write itself is torn); errors are logged, not fatal.
pub fn append_line(path: &Path, line: &str) {
    let result = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(error) = result {
        eprintln!("{} cannot append to {}: {error}", now_text(), path.display());
    }
}

/// Serves `GET /healthz` → 200 "ok" (anything else → 404) on `0.0.0.0:port`.
pub fn serve_healthz(port: u16) -> anyhow::Result<()> {
    let listener = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("binding 0.0.0.0:{port}"))?;
    println!("{} serving /healthz on 0.0.0.0:{port}", now_text());
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                std::thread::spawn(move || {
                    if let Err(error) = answer_healthz(stream) {
                        eprintln!("{} request from {peer}: {error}", now_text());
                    }
                });
            }
            Err(error) => {
                eprintln!("{} accept: {error}", now_text());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reads one request head and answers it.
fn answer_healthz(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let request = String::from_utf8_lossy(&head);
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, body) = if method == "GET" && path == "/healthz" { ("200 OK", "ok") } else { ("404 Not Found", "") };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes())
}

/// Echoes every UDP datagram on `0.0.0.0:port` back to its sender.
pub fn udp_echo(port: u16) -> anyhow::Result<()> {
    let socket = UdpSocket::bind(("0.0.0.0", port)).with_context(|| format!("binding udp 0.0.0.0:{port}"))?;
    println!("{} echoing udp on 0.0.0.0:{port}", now_text());
    let mut buf = [0u8; 2048];
    let mut errors = 0u64;
    loop {
        let result = socket.recv_from(&mut buf).and_then(|(n, peer)| socket.send_to(&buf[..n], peer));
        if let Err(error) = result {
            errors += 1;
            if errors.is_power_of_two() {
                eprintln!("{} udp echo error #{errors}: {error}", now_text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How long the UDP client waits for an echo before it declares a datagram lost.
pub const UDP_LOSS_TIMEOUT: Duration = Duration::from_secs(1);

/// Datagrams sent and not yet echoed: sequence number → send time.
#[derive(Default)]
struct Pending {
    sent: std::collections::BTreeMap<u64, (Instant, Timestamp)>,
}

/// Datagrams declared lost at one check.
#[derive(Debug, Default, PartialEq)]
struct Lost {
    count: u64,
    first: Option<Timestamp>,
    last: Option<Timestamp>,
}

impl Pending {
    /// Removes and returns the datagrams sent more than `timeout` before `now`.
    fn expire(&mut self, now: Instant, timeout: Duration) -> Lost {
        let mut lost = Lost::default();
        while let Some(entry) = self.sent.first_entry() {
            let (sent_at, stamp) = *entry.get();
            if now.saturating_duration_since(sent_at) <= timeout {
                break;
            }
            entry.remove();
            lost.count += 1;
            lost.first = Some(lost.first.map_or(stamp, |first: Timestamp| first.min(stamp)));
            lost.last = Some(lost.last.map_or(stamp, |last: Timestamp| last.max(stamp)));
        }
        lost
    }
}

/// The per-second JSON line of the UDP client.
fn udp_second_line(sent: u64, received: u64, lost: &Lost) -> String {
    let mut line = serde_json::json!({ "at": now_text(), "sent": sent, "received": received, "lost": lost.count });
    if let (Some(first), Some(last)) = (lost.first, lost.last) {
        line["first_lost_at"] = serde_json::Value::String(format!("{first:.3}"));
        line["last_lost_at"] = serde_json::Value::String(format!("{last:.3}"));
    }
    line.to_string()
}

/// Sends `rate` datagrams per second to `target`, each carrying its sequence number (8 bytes,
/// big-endian), and matches the echoes to them: a datagram not echoed within
/// [`UDP_LOSS_TIMEOUT`] is lost. Appends one JSON line per second to `log`
/// (`{"at","sent","received","lost"}`, plus `first_lost_at`/`last_lost_at`, the send times of the
/// first and last datagram declared lost in that second, when any was).
pub fn udp_client(target: &str, rate: u32, log: &Path) -> anyhow::Result<()> {
    let target: SocketAddr = target
        .to_socket_addrs()
        .with_context(|| format!("bad target {target}"))?
        .next()
        .with_context(|| format!("target {target} resolves to nothing"))?;
    let socket = UdpSocket::bind("0.0.0.0:0").context("binding a udp socket")?;
    socket.set_read_timeout(Some(Duration::from_millis(200))).context("setting a read timeout")?;
    let receiver = socket.try_clone().context("cloning the udp socket")?;
    let received = Arc::new(AtomicU64::new(0));
    let pending = Arc::new(std::sync::Mutex::new(Pending::default()));
    let counter = Arc::clone(&received);
    let answered = Arc::clone(&pending);
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        loop {
            match receiver.recv_from(&mut buf) {
                Ok((n, peer)) if peer == target => {
                    counter.fetch_add(1, Ordering::Relaxed);
                    if n >= 8 {
                        let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
                        answered.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).sent.remove(&seq);
                    }
                }
                Ok(_) => {}
                Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(error) => {
                    eprintln!("{} udp receive: {error}", now_text());
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    });
    println!("{} sending {rate} datagrams/s to {target}", now_text());
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now();
    let mut next_send = start;
    let mut next_report = start + Duration::from_secs(1);
    let (mut seq, mut sent, mut reported_received, mut errors) = (0u64, 0u64, 0u64, 0u64);
    loop {
        let now = Instant::now();
        if now >= next_report {
            let total = received.load(Ordering::Relaxed);
            let lost = pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).expire(now, UDP_LOSS_TIMEOUT);
            append_line(log, &udp_second_line(sent, total - reported_received, &lost));
            reported_received = total;
            sent = 0;
            next_report += Duration::from_secs(1);
        }
        if now >= next_send {
            seq += 1;
            pending
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .sent
                .insert(seq, (Instant::now(), Timestamp::now()));
            match socket.send_to(&seq.to_be_bytes(), target) {
                Ok(_) => sent += 1,
                Err(error) => {
                    sent += 1;
                    errors += 1;
                    if errors.is_power_of_two() {
                        eprintln!("{} udp send error #{errors}: {error}", now_text());
                    }
                }
            }
            next_send += interval;
            if next_send + interval < Instant::now() {
                next_send = Instant::now();
            }
        }
        let wake = next_send.min(next_report);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
}

/// A parsed `http://host:port/path` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpUrl {
    /// `host:port`.
    pub authority: String,
    /// Path (with query), `/` when empty.
    pub path: String,
}

/// Parses a plain `http://` URL (port defaults to 80).
pub fn parse_url(url: &str) -> anyhow::Result<HttpUrl> {
    let Some(rest) = url.strip_prefix("http://") else { bail!("only http:// URLs are supported: {url}") };
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        bail!("no host in {url}");
    }
    let authority = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
    Ok(HttpUrl { authority, path: path.to_string() })
}

/// One HTTP GET with a total `timeout`; Err is the failure in kubelet's words.
pub fn http_get(url: &str, target: &HttpUrl, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let addr: SocketAddr = target
        .authority
        .to_socket_addrs()
        .map_err(|error| format!("Get \"{url}\": {error}"))?
        .next()
        .ok_or_else(|| format!("Get \"{url}\": no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|error| {
        if matches!(error.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) {
            format!("Get \"{url}\": dial tcp {addr}: i/o timeout")
        } else {
            format!("Get \"{url}\": dial tcp {addr}: connect: {error}")
        }
    })?;
    let deadline_exceeded =
        || format!("Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)");
    let remaining = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kube-probe/1.31\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        target.path, target.authority
    );
    stream.set_write_timeout(Some(remaining())).map_err(|error| format!("Get \"{url}\": {error}"))?;
    stream.write_all(request.as_bytes()).map_err(|error| match error.kind() {
        ErrorKind::TimedOut | ErrorKind::WouldBlock => deadline_exceeded(),
        _ => format!("Get \"{url}\": write tcp {addr}: {error}"),
    })?;
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if Instant::now() >= deadline {
            return Err(deadline_exceeded());
        }
        stream.set_read_timeout(Some(remaining())).map_err(|error| format!("Get \"{url}\": {error}"))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                response.extend_from_slice(&buf[..n]);
                if response.windows(2).any(|window| window == b"\r\n") {
                    break;
                }
            }
            Err(error) if matches!(error.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                return Err(deadline_exceeded());
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(format!("Get \"{url}\": read tcp {addr}: {error}")),
        }
    }
    let status_line = String::from_utf8_lossy(&response);
    let code = status_line.split_whitespace().nth(1).and_then(|code| code.parse::<u16>().ok());
    match code {
        Some(code) if (200..400).contains(&code) => Ok(()),
        Some(code) => Err(format!("HTTP probe failed with statuscode: {code}")),
        None => Err(format!("Get \"{url}\": malformed HTTP response")),
    }
}

/// Probes `url` every `period` with a total `timeout`, appending one JSON line per probe to
/// `log` (when it finishes) and printing readiness transitions the way kubelet logs them.
///
/// With `period` at least `timeout` (kubelet's default: 1 s and 1 s) it probes like kubelet: one
/// probe at a time, a probe that ran past its tick followed at once, missed ticks skipped. With a
/// shorter period every tick starts a probe of its own, so that probes overlap during an outage
/// and both the first failure and the first success after it fall within one period of the
/// outage's start and end.
pub fn prober(url: &str, period: Duration, timeout: Duration, log: &Path) -> anyhow::Result<()> {
    let target = parse_url(url)?;
    println!(
        "{} probing {url} every {:.2} s (timeout {:.1} s{})",
        now_text(),
        period.as_secs_f64(),
        timeout.as_secs_f64(),
        if period < timeout { ", overlapping" } else { "" }
    );
    let (results, finished) = std::sync::mpsc::channel::<Probe>();
    let log = log.to_path_buf();
    std::thread::spawn(move || {
        let mut failing_since: Option<Timestamp> = None;
        for probe in finished {
            append_line(&log, &probe.to_line());
            match (&probe.error, failing_since) {
                (Some(error), None) => {
                    println!("{:.3} Readiness probe failed: {error}", probe.at);
                    failing_since = Some(probe.at);
                }
                (Some(error), Some(_)) => println!("{:.3} Readiness probe failed: {error}", probe.at),
                (None, Some(since)) if probe.at > since => {
                    println!(
                        "{:.3} Readiness probe succeeded: ready again after {:.1} s",
                        probe.at,
                        seconds_between(since, probe.at)
                    );
                    failing_since = None;
                }
                (None, _) => {}
            }
        }
    });
    let probe_once = move |url: &str, target: &HttpUrl| {
        let at = Timestamp::now();
        let result = http_get(url, target, timeout);
        Probe { at, ok: result.is_ok(), error: result.err() }
    };
    let overlapping = period < timeout;
    let start = Instant::now();
    let mut tick = 0u32;
    loop {
        if overlapping {
            let (url, target, results) = (url.to_string(), target.clone(), results.clone());
            std::thread::spawn(move || {
                let _ = results.send(probe_once(&url, &target));
            });
        } else if results.send(probe_once(url, &target)).is_err() {
            anyhow::bail!("the prober's log writer stopped");
        }
        // The next tick on the period grid; a probe that ran past it (a timeout) is followed at
        // once, like kubelet's ticker, and ticks missed entirely are skipped.
        let elapsed = start.elapsed();
        tick = tick.saturating_add(1).max((elapsed.as_secs_f64() / period.as_secs_f64()).floor() as u32);
        let next = start + period * tick;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// Parses a duration like `1s`, `500ms`, `0.5s` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 0.001)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("bad duration `{text}` (e.g. 1s, 500ms)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("bad duration `{text}`"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(
            parse_url("http://10.129.0.43:8443/healthz").unwrap(),
            HttpUrl { authority: "10.129.0.43:8443".into(), path: "/healthz".into() }
        );
        assert_eq!(parse_url("http://host").unwrap(), HttpUrl { authority: "host:80".into(), path: "/".into() });
        assert!(parse_url("https://x/").is_err());
        assert!(parse_url("http:///x").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn udp_datagrams_unanswered_for_a_second_are_lost() {
        let base = Instant::now();
        let stamp = |ms: i64| Timestamp::from_millisecond(1_768_251_520_000 + ms).unwrap();
        let mut pending = Pending::default();
        for (seq, ms) in [(1u64, 0u64), (2, 50), (3, 100), (4, 900)] {
            pending.sent.insert(seq, (base + Duration::from_millis(ms), stamp(ms as i64)));
        }
        pending.sent.remove(&2); // echoed
        assert_eq!(pending.expire(base + Duration::from_millis(900), UDP_LOSS_TIMEOUT), Lost::default());
        let lost = pending.expire(base + Duration::from_millis(1500), UDP_LOSS_TIMEOUT);
        assert_eq!(lost, Lost { count: 2, first: Some(stamp(0)), last: Some(stamp(100)) });
        assert_eq!(pending.sent.len(), 1);
        let line = udp_second_line(20, 18, &lost);
        let second: crate::probe_log::UdpSecond = serde_json::from_str(&line).unwrap();
        assert_eq!((second.sent, second.received, second.lost), (20, 18, 2));
        assert_eq!((second.first_lost_at, second.last_lost_at), (Some(stamp(0)), Some(stamp(100))));
        assert!(!udp_second_line(20, 20, &Lost::default()).contains("first_lost_at"));
    }

    #[test]
    fn healthz_server_and_probe_talk_http() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(2).flatten() {
                let _ = answer_healthz(stream);
            }
        });
        let ok_url = format!("http://{addr}/healthz");
        assert_eq!(http_get(&ok_url, &parse_url(&ok_url).unwrap(), Duration::from_secs(1)), Ok(()));
        let missing = format!("http://{addr}/nope");
        assert_eq!(
            http_get(&missing, &parse_url(&missing).unwrap(), Duration::from_secs(1)),
            Err("HTTP probe failed with statuscode: 404".to_string())
        );
    }
}
