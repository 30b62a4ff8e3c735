//! Harness for the end-to-end tests: network namespaces, veth pods, the real agent
//! binary, real traffic, and a reader for its /metrics.
//!
//! Tests using it are `#[ignore]`d so plain `cargo test` needs no root; `cargo xtask test`
//! runs them as root with `--ignored`, and fails in CI rather than skip them.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{Read as _, Write as _},
    net::TcpStream,
    os::fd::AsFd,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use nix::sched::{CloneFlags, setns};

pub const AGENT_PORT: u16 = 9781;

/// How much slower than the host this machine runs: `DM_TEST_TIME_SCALE` (default 1), set by
/// `cargo xtask test` for guests under software emulation. It stretches how long a test waits
/// for something to happen, never what the test asserts about it.
pub fn time_scale() -> u32 {
    std::env::var("DM_TEST_TIME_SCALE")
        .ok()
        .and_then(|scale| scale.parse().ok())
        .filter(|&scale| scale >= 1)
        .unwrap_or(1)
}

/// A wait's timeout on this machine: `timeout` times [`time_scale`].
pub fn scaled(timeout: Duration) -> Duration {
    timeout * time_scale()
}

/// The running kernel's (major, minor), from `uname -r`.
pub fn kernel_version() -> Result<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").context("reading the kernel release")?;
    parse_kernel_version(&release).with_context(|| format!("unexpected kernel release {release:?}"))
}

fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut numbers = release.trim().split(['.', '-', '+']);
    Some((numbers.next()?.parse().ok()?, numbers.next()?.parse().ok()?))
}

/// The tc attach mode the agent's `auto` must pick here: tcx links arrived in Linux 6.6,
/// older kernels get a clsact qdisc.
pub fn expected_tc_attach() -> Result<&'static str> {
    Ok(if kernel_version()? >= (6, 6) { "tcx" } else { "clsact" })
}

/// Runs a command, failing with its stderr when it fails.
pub fn sh(args: &[&str]) -> Result<String> {
    let output = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("running {args:?}"))?;
    ensure!(
        output.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whether this is a CI run (`CI=true`, as `.ci/run` exports it).
pub fn running_in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// A test that cannot run on this kernel: outside CI it says why and passes; under `CI=true` it
/// fails, since `cargo xtask test` excludes such tests by name where the kernel lacks what
/// they need (xtask's exclusions table), so one that gets here was not excluded.
pub fn not_applicable(why: &str) -> Result<()> {
    ensure!(
        !running_in_ci(),
        "not applicable here ({why}), and under CI=true a test never skips itself: the runner excludes \
         it by name where the kernel lacks what it needs (xtask/src/exclusions.rs)"
    );
    println!("not applicable here: {why}");
    Ok(())
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "end-to-end tests need root: run `sudo -E cargo xtask test`");
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short unique suffix: namespaces and interfaces of one test never collide with another's.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}x{}", std::process::id() % 100_000, COUNTER.fetch_add(1, Ordering::Relaxed))
}

static COMM_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique process name that fits the kernel's comm (15 bytes), however many `unique` names a
/// test made before it: a longer one would be refused by the agent's `--sdn-process` check.
pub fn unique_comm(prefix: &str) -> String {
    let count = COMM_COUNTER.fetch_add(1, Ordering::Relaxed) % 100;
    let name = format!("{prefix}{}x{count}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "{name} does not fit a comm: shorten the prefix {prefix:?}");
    name
}

/// A network namespace, deleted on drop when this harness created it.
pub struct Netns {
    pub name: String,
    owned: bool,
}

impl Netns {
    pub fn new(prefix: &str) -> Result<Self> {
        let name = unique(prefix);
        sh(&["ip", "netns", "add", &name])?;
        let ns = Self { name, owned: true };
        // Quiet namespaces: no IPv6 autoconfiguration noise in exact counts. Written from a
        // thread inside the namespace (/proc/sys/net is the opener's netns): no exec, which
        // costs ~0.1 s each in the emulated test VMs.
        ns.run(|| -> Result<()> {
            for scope in ["all", "default"] {
                let path = format!("/proc/sys/net/ipv6/conf/{scope}/disable_ipv6");
                std::fs::write(&path, "1").with_context(|| format!("writing {path}"))?;
            }
            Ok(())
        })??;
        ns.ip_batch(&["link set lo up".to_owned()])?;
        Ok(ns)
    }

    /// Runs `ip` commands (without the leading `ip`) in this namespace, all from one exec of
    /// `ip -batch`, which stops at the first that fails.
    pub fn ip_batch(&self, commands: &[String]) -> Result<()> {
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting ip -batch")?;
        let mut input = commands.join("\n");
        input.push('\n');
        child.stdin.take().context("ip -batch stdin")?.write_all(input.as_bytes())?;
        let output = child.wait_with_output()?;
        ensure!(
            output.status.success(),
            "ip -n {} -batch {commands:?} failed: {}{}",
            self.name,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        Ok(())
    }

    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// Runs `f` on a thread that has entered this namespace (sockets it opens live there).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let file = File::open(format!("/run/netns/{}", self.name)).context("opening netns")?;
        thread::spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).context("setns")?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns panicked"))?
    }

    pub fn inode(&self) -> Result<u64> {
        Ok(std::fs::metadata(format!("/run/netns/{}", self.name))?.ino())
    }
}

use std::os::unix::fs::MetadataExt as _;

impl Netns {
    /// A namespace someone else made (e.g. the lab's node); left alone on drop.
    pub fn existing(name: &str) -> Self {
        Self { name: name.to_string(), owned: false }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A pod: its own netns, linked to `host` by a veth named as CNI plugins name them.
pub struct Pod {
    pub ns: Netns,
    /// Host-side veth name.
    pub veth: String,
    pub host_ip: String,
    pub pod_ip: String,
}

impl Pod {
    /// `index` picks the /30 subnet 10.77.index.0 so pods of one test do not overlap.
    pub fn new(host: &Netns, index: u8) -> Result<Self> {
        Self::create(host, index, None)
    }

    /// As [`Pod::new`], with the host-side veth at ifindex `ifindex`.
    pub fn with_ifindex(host: &Netns, index: u8, ifindex: u32) -> Result<Self> {
        Self::create(host, index, Some(ifindex))
    }

    fn create(host: &Netns, index: u8, ifindex: Option<u32>) -> Result<Self> {
        let ns = Netns::new("dmtp")?;
        let veth = format!("veth{:08x}", u32::from(index) << 16 | (std::process::id() & 0xffff));
        let host_ip = format!("10.77.{index}.1");
        let pod_ip = format!("10.77.{index}.2");
        // Addresses chosen here (locally administered, unique per test process and index), so
        // the static neighbours below need no read-back of what the kernel picked.
        let pid = std::process::id() & 0xffff;
        let mac = |side: u8| format!("02:d0:{:02x}:{:02x}:{index:02x}:{side:02x}", pid >> 8, pid & 0xff);
        let (host_mac, pod_mac) = (mac(1), mac(2));
        let index_arg = ifindex.map(|ifindex| format!(" index {ifindex}")).unwrap_or_default();
        // Static neighbours: no ARP in exact counts.
        host.ip_batch(&[
            format!(
                "link add {veth}{index_arg} address {host_mac} type veth peer name eth0 address {pod_mac} netns {}",
                ns.name
            ),
            format!("addr add {host_ip}/30 dev {veth}"),
            format!("link set {veth} up"),
            format!("neigh replace {pod_ip} lladdr {pod_mac} dev {veth} nud permanent"),
        ])?;
        ns.ip_batch(&[
            format!("addr add {pod_ip}/30 dev eth0"),
            "link set eth0 up".to_owned(),
            format!("neigh replace {host_ip} lladdr {host_mac} dev eth0 nud permanent"),
        ])?;
        Ok(Self { ns, veth, host_ip, pod_ip })
    }
}

/// The ifindex of `dev` in `ns`.
pub fn ifindex_of(ns: &Netns, dev: &str) -> Result<u32> {
    Ok(ns.exec(&["cat", &format!("/sys/class/net/{dev}/ifindex")])?.trim().parse()?)
}

pub fn mac_of(ns: &Netns, dev: &str) -> Result<String> {
    Ok(ns.exec(&["cat", &format!("/sys/class/net/{dev}/address")])?.trim().to_string())
}

/// The agent binary under test (built by `cargo xtask test`).
pub fn agent_binary() -> Result<PathBuf> {
    let path = std::env::var_os("DATAPATH_MONITOR_BIN")
        .map(PathBuf::from)
        .context("DATAPATH_MONITOR_BIN is not set: run the end-to-end tests through `cargo xtask test`")?;
    ensure!(path.exists(), "{} does not exist", path.display());
    Ok(path)
}

/// The real agent, running inside `ns`; stopped with SIGTERM on drop.
pub struct Agent<'a> {
    pub ns: &'a Netns,
    child: Option<Child>,
    pub log: PathBuf,
}

impl<'a> Agent<'a> {
    pub fn start(ns: &'a Netns, extra: &[&str]) -> Result<Self> {
        Self::start_logging(ns, extra, "info,datapath_monitor=debug")
    }

    /// As [`Agent::start`], with `rust_log` as RUST_LOG (the benchmark runs it as deployed: `info`).
    pub fn start_logging(ns: &'a Netns, extra: &[&str], rust_log: &str) -> Result<Self> {
        let binary = agent_binary()?;
        let log = std::env::temp_dir().join(format!("{}-agent.log", ns.name));
        // Appended to: a test that restarts the agent keeps both runs' logs.
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let listen = format!("127.0.0.1:{AGENT_PORT}");
        let mut args: Vec<&str> = vec!["netns", "exec", &ns.name];
        let binary_str = binary.to_str().context("binary path")?;
        args.extend([binary_str, "run", "--listen", &listen, "--removed-interface-grace-seconds", "2"]);
        args.extend_from_slice(extra);
        let child = Command::new("ip")
            .args(&args)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting the agent")?;
        let mut agent = Self { ns, child: Some(child), log };
        agent.wait_ready(scaled(Duration::from_secs(30)))?;
        Ok(agent)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("agent exited during start-up with {status}:\n{}", self.log_text());
            }
            if let Ok((200, _)) = self.get("/readyz") {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "agent not ready after {timeout:?}:\n{}", self.log_text());
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's pid (`ip netns exec` execs it, so the child's pid is the agent's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// HTTP GET on the agent, from inside its namespace.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        let path = path.to_string();
        self.ns.run(move || http_get(&path))?
    }

    pub fn metrics(&self) -> Result<Metrics> {
        let (status, body) = self.get("/metrics")?;
        ensure!(status == 200, "/metrics answered {status}");
        Metrics::parse(&body)
    }

    /// Polls /metrics until `done` holds, then returns that scrape.
    pub fn wait_metrics(&self, what: &str, done: impl Fn(&Metrics) -> bool) -> Result<Metrics> {
        self.wait_metrics_within(what, Duration::from_secs(10), done)
    }

    /// Samples the agent's incident engine has judged since it started
    /// (`datapath_monitor_samples_judged_total`).
    pub fn samples_judged(&self) -> Result<u64> {
        Ok(self.metrics()?.value("datapath_monitor_samples_judged_total", &[]) as u64)
    }

    /// Waits until the agent has judged `count` more samples than now: the positive signal that
    /// it has looked at what happened meanwhile, where a fixed sleep only says time passed
    /// (on a loaded machine the agent may have sampled less, or late). Returns the scrape.
    pub fn wait_samples(&self, count: u64) -> Result<Metrics> {
        let from = self.samples_judged()?;
        // 250 ms samples: `count` of them take count / 4 s; allow four times that, and 10 s.
        let timeout = Duration::from_millis(count * 1000).max(Duration::from_secs(10));
        self.wait_metrics_within(&format!("{count} more judged samples (from {from})"), timeout, |m| {
            m.value("datapath_monitor_samples_judged_total", &[]) as u64 >= from + count
        })
    }

    /// As [`Agent::wait_metrics`], for what takes longer than its 10 s (`timeout`, scaled).
    pub fn wait_metrics_within(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Metrics) -> bool,
    ) -> Result<Metrics> {
        let deadline = Instant::now() + scaled(timeout);
        loop {
            let metrics = self.metrics()?;
            if done(&metrics) {
                return Ok(metrics);
            }
            ensure!(Instant::now() < deadline, "timed out waiting for {what}; last scrape:\n{}", metrics.text);
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("agent already stopped")?;
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + scaled(Duration::from_secs(10));
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!(
                    "agent did not exit within {:?} of SIGTERM:\n{}",
                    scaled(Duration::from_secs(10)),
                    self.log_text()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash or an OOM kill would end it: nothing of its shutdown runs.
    pub fn kill(&mut self) -> Result<()> {
        let mut child = self.child.take().context("agent already stopped")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

fn http_get(path: &str) -> Result<(u16, String)> {
    http_get_port(AGENT_PORT, path)
}

/// HTTP/1.0 GET on 127.0.0.1:`port` of the calling thread's network namespace.
pub fn http_get_port(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let status = head.split_whitespace().nth(1).context("no status")?.parse()?;
    Ok((status, body.to_string()))
}

/// One scrape of /metrics, as samples keyed by name and labels.
pub struct Metrics {
    pub text: String,
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Metrics {
    pub fn parse(text: &str) -> Result<Self> {
        let mut samples = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, value) = line.rsplit_once(' ').context("sample line without value")?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').context("label without =")?;
                map.insert(key.to_string(), value.trim_matches('"').to_string());
            }
            samples.push((name.to_string(), map, value.parse()?));
        }
        Ok(Self { text: text.to_string(), samples })
    }

    /// Sum of the samples named `name` whose labels include all of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, _, v)| v)
            .sum()
    }

    pub fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.samples
            .iter()
            .any(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
    }
}

/// Waits `settle`, then scrapes again: proves a count that reached its target stays there.
pub fn settle() {
    thread::sleep(Duration::from_millis(700));
}

/// A directory under the system temp dir, removed (with everything in it) on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn display(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One lifecycle event as served by /api/v1/events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleEvent {
    pub at: String,
    pub kind: String,
    pub subject: String,
    pub detail: String,
}

impl Agent<'_> {
    /// GETs a JSON document, failing on a non-200 answer.
    pub fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let (status, body) = self.get(path)?;
        ensure!(status == 200, "GET {path} answered {status}: {body}");
        serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON: {body}"))
    }

    /// /api/v1/events whose subject passes `keep`, oldest first.
    pub fn events(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<LifecycleEvent>> {
        let body = self.get_json("/api/v1/events")?;
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        Ok(body
            .as_array()
            .context("/api/v1/events is not an array")?
            .iter()
            .map(|e| LifecycleEvent {
                at: text(&e["at"]),
                kind: text(&e["kind"]),
                subject: text(&e["subject"]),
                detail: text(&e["detail"]),
            })
            .filter(|e| keep(&e.subject))
            .collect())
    }

    /// Polls /api/v1/events (filtered by subject) until `done` holds; returns those events.
    pub fn wait_events(
        &self,
        what: &str,
        keep: impl Fn(&str) -> bool,
        done: impl Fn(&[LifecycleEvent]) -> bool,
    ) -> Result<Vec<LifecycleEvent>> {
        let deadline = Instant::now() + scaled(Duration::from_secs(15));
        loop {
            let events = self.events(&keep)?;
            if done(&events) {
                return Ok(events);
            }
            ensure!(Instant::now() < deadline, "timed out waiting for {what}; events so far:\n{events:#?}");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The (kind, subject) pairs of events, for exact comparisons.
pub fn kinds(events: &[LifecycleEvent]) -> Vec<(String, String)> {
    events.iter().map(|e| (e.kind.clone(), e.subject.clone())).collect()
}

impl Netns {
    /// Runs `f` on a background thread inside this namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<thread::JoinHandle<Result<T>>> {
        let file = File::open(format!("/run/netns/{}", self.name)).context("opening netns")?;
        Ok(thread::spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).context("setns")?;
            Ok(f())
        }))
    }
}

/// A steady UDP stream from a pod to a listener on the host side of its veth: `rate`
/// datagrams of 64 bytes a second, until stopped (or dropped). One-way, or echoed back.
pub struct UdpStream {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Datagrams sent, and echoes the pod got back.
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    echoed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    threads: Vec<thread::JoinHandle<Result<Result<()>>>>,
}

impl UdpStream {
    /// A one-way stream: the listener never answers.
    pub fn start(host: &Netns, pod: &Pod, port: u16, rate: u64) -> Result<Self> {
        Self::start_with(host, pod, port, rate, false)
    }

    /// A request/response stream: the listener echoes every datagram.
    pub fn start_echo(host: &Netns, pod: &Pod, port: u16, rate: u64) -> Result<Self> {
        Self::start_with(host, pod, port, rate, true)
    }

    /// (datagrams sent, echoes received) so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.sent.load(Ordering::Relaxed), self.echoed.load(Ordering::Relaxed))
    }

    /// Stops sending; the listener (and the echo reader) go on until [`UdpStream::stop`].
    pub fn pause_sender(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }

    fn start_with(host: &Netns, pod: &Pod, port: u16, rate: u64, echo: bool) -> Result<Self> {
        use std::{
            net::UdpSocket,
            sync::{
                Arc,
                atomic::{AtomicBool, AtomicU64},
            },
        };
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let sent_count = Arc::new(AtomicU64::new(0));
        let echoed = Arc::new(AtomicU64::new(0));
        let listener = {
            let (stop, received, ip) = (Arc::clone(&stop), Arc::clone(&received), pod.host_ip.clone());
            host.spawn(move || -> Result<()> {
                let socket = UdpSocket::bind((ip.as_str(), port))?;
                socket.set_read_timeout(Some(Duration::from_millis(100)))?;
                let mut buffer = [0u8; 256];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = socket.recv_from(&mut buffer) {
                        received.fetch_add(1, Ordering::Relaxed);
                        if echo {
                            let _ = socket.send_to(&buffer[..n], peer);
                        }
                    }
                }
                Ok(())
            })?
        };
        thread::sleep(Duration::from_millis(200));
        let sender = {
            let (stop, paused, target) = (Arc::clone(&stop), Arc::clone(&paused), format!("{}:{port}", pod.host_ip));
            let (sent_count, echoed) = (Arc::clone(&sent_count), Arc::clone(&echoed));
            pod.ns.spawn(move || -> Result<()> {
                let socket = UdpSocket::bind("0.0.0.0:0")?;
                socket.set_nonblocking(true)?;
                let started = Instant::now();
                let mut sent = 0u64;
                let mut buffer = [0u8; 256];
                while !stop.load(Ordering::Relaxed) {
                    let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                    while sent < due {
                        if !paused.load(Ordering::Relaxed) {
                            socket.send_to(&[0x5a; 64], &target)?;
                            sent_count.fetch_add(1, Ordering::Relaxed);
                        }
                        sent += 1;
                    }
                    while socket.recv(&mut buffer).is_ok() {
                        echoed.fetch_add(1, Ordering::Relaxed);
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            })?
        };
        Ok(Self { stop, paused, received, sent: sent_count, echoed, threads: vec![listener, sender] })
    }

    /// Stops both ends; the number of datagrams the listener received.
    pub fn stop(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread.join().map_err(|_| anyhow::anyhow!("a UDP stream thread panicked"))???;
        }
        Ok(self.received.load(Ordering::Relaxed))
    }
}

impl Drop for UdpStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Payload of the datagrams [`send_udp`] sends.
pub const UDP_PAYLOAD: usize = 100;

pub fn addr(ip: &str, port: u16) -> std::net::SocketAddr {
    format!("{ip}:{port}").parse().expect("test address")
}

/// The fallbacks older kernels get, forced on this one: clsact instead of tcx, and the
/// classic tracepoint (offsets from its format file) instead of tp_btf.
pub const FALLBACKS: &[&str] = &["--tc-attach", "clsact", "--drop-tracer", "tracepoint"];

/// Packets matched so far by the INPUT rule on `dport` in `ns`, from iptables' own counters.
pub fn iptables_rule_packets(ns: &Netns, dport: &str) -> Result<u64> {
    let listing = ns.exec(&["iptables", "-L", "INPUT", "-v", "-x", "-n"])?;
    let line = listing
        .lines()
        .find(|l| l.contains(&format!("dpt:{dport}")))
        .ok_or_else(|| anyhow::anyhow!("no rule for {dport}:\n{listing}"))?;
    Ok(line.split_whitespace().next().unwrap_or_default().parse()?)
}

/// Writes at `path` an executable that exits with status 0 at once, for tests that only need
/// processes of a chosen comm to start and exit. On x86-64 a static ELF of one segment
/// (`xor edi, edi; mov eax, 60; syscall`): with no dynamic loader, an exec of it costs ~9 ms in
/// the emulated test VMs where `/bin/true` costs ~40 ms. Elsewhere a copy of `/bin/true`.
pub fn write_exit_at_once(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if cfg!(target_arch = "x86_64") {
        const BASE: u64 = 0x40_0000;
        const CODE: [u8; 9] = [0x31, 0xff, 0xb8, 0x3c, 0, 0, 0, 0x0f, 0x05];
        const HEADERS: u64 = 64 + 56;
        let size = HEADERS + CODE.len() as u64;
        let mut elf = Vec::with_capacity(size as usize);
        // ELF header: 64-bit, little-endian, version 1, an executable for x86-64.
        elf.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        elf.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
        elf.extend_from_slice(&0x3eu16.to_le_bytes()); // e_machine: EM_X86_64
        elf.extend_from_slice(&1u32.to_le_bytes()); // e_version
        elf.extend_from_slice(&(BASE + HEADERS).to_le_bytes()); // e_entry: the code
        elf.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf.extend_from_slice(&0u64.to_le_bytes()); // e_shoff: no sections
        elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        for half in [64u16, 56, 1, 0, 0, 0] {
            // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
            elf.extend_from_slice(&half.to_le_bytes());
        }
        // One PT_LOAD, read and execute, mapping the whole file at BASE.
        elf.extend_from_slice(&1u32.to_le_bytes());
        elf.extend_from_slice(&5u32.to_le_bytes());
        for word in [0, BASE, BASE, size, size, 0x1000] {
            // p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
            elf.extend_from_slice(&word.to_le_bytes());
        }
        elf.extend_from_slice(&CODE);
        std::fs::write(path, elf).with_context(|| format!("writing {}", path.display()))?;
    } else {
        std::fs::copy("/bin/true", path).with_context(|| format!("copying /bin/true to {}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Sends `count` UDP datagrams of [`UDP_PAYLOAD`] bytes from inside `from` to `to`.
pub fn send_udp(from: &Netns, to: std::net::SocketAddr, count: usize) -> Result<()> {
    from.run(move || -> Result<()> {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
        for _ in 0..count {
            socket.send_to(&[0x5a; UDP_PAYLOAD], to)?;
        }
        Ok(())
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_at_once_executable_runs_and_exits_zero() {
        let dir = TempDir::new("dmexit").unwrap();
        let path = dir.join("exit-at-once");
        write_exit_at_once(&path).unwrap();
        let status = Command::new(&path).status().unwrap();
        assert!(status.success(), "{status}");
    }

    #[test]
    fn kernel_versions_parse_from_debian_and_upstream_releases() {
        assert_eq!(parse_kernel_version("6.1.0-57-cloud-amd64\n"), Some((6, 1)));
        assert_eq!(parse_kernel_version("6.12.117+deb12-cloud-amd64"), Some((6, 12)));
        assert_eq!(parse_kernel_version("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(parse_kernel_version("garbage"), None);
    }
}
