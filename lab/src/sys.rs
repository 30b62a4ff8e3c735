//! Running the real parts: external commands (ip, ovs-*, ethtool, iptables) with clear errors,
//! the lab's private OVS instance (its own db/run/log dirs, never the system one), detached
//! daemons with pid files, and process liveness that does not mistake a zombie for a live process.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use nix::{sys::signal::Signal, unistd::Pid};

/// The directories of the lab's private OVS instance under the lab root.
#[derive(Clone, Debug)]
pub struct OvsDirs {
    /// OVS_RUNDIR: sockets, pid files, `br0.mgmt`.
    pub run: PathBuf,
    /// OVS_DBDIR: `conf.db`.
    pub db: PathBuf,
    /// OVS_LOGDIR.
    pub log: PathBuf,
    /// OVS_SYSCONFDIR.
    pub etc: PathBuf,
}

impl OvsDirs {
    /// The OVS dirs under lab root `root`.
    pub fn new(root: &Path) -> Self {
        let ovs = root.join("ovs");
        Self { run: ovs.join("run"), db: ovs.join("db"), log: ovs.join("log"), etc: ovs.join("etc") }
    }

    /// The ovsdb-server socket.
    pub fn db_sock(&self) -> PathBuf {
        self.run.join("db.sock")
    }

    /// Points an OVS command at this instance.
    pub fn env<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env("OVS_RUNDIR", &self.run)
            .env("OVS_DBDIR", &self.db)
            .env("OVS_LOGDIR", &self.log)
            .env("OVS_SYSCONFDIR", &self.etc)
    }

    /// `ovs-vsctl --db=unix:<sock> --timeout=5 <args>`.
    pub fn vsctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut command = Command::new("ovs-vsctl");
        self.env(&mut command).arg(format!("--db=unix:{}", self.db_sock().display())).arg("--timeout=5").args(args);
        run(&mut command)
    }

    /// `ovs-ofctl <args>` (finds the bridge via OVS_RUNDIR/<bridge>.mgmt), with `stdin` piped in.
    pub fn ofctl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut command = Command::new("ovs-ofctl");
        self.env(&mut command).arg("--timeout=5").args(args);
        match stdin {
            None => run(&mut command),
            Some(input) => run_with_input(&mut command, input),
        }
    }

    /// The pid file of an OVS daemon (`ovsdb-server`, `ovs-vswitchd`).
    pub fn pidfile(&self, daemon: &str) -> PathBuf {
        self.run.join(format!("{daemon}.pid"))
    }
}

/// Describes a command for error messages.
fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Runs `command`, returning its stdout; a failure says which command and its stderr.
pub fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{}` (is it installed?)", describe(command)))?;
    if !output.status.success() {
        bail!("`{}` failed ({}): {}", describe(command), output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `command` with `input` on its stdin, returning its stdout.
pub fn run_with_input(command: &mut Command, input: &str) -> anyhow::Result<String> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run `{}` (is it installed?)", describe(command)))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).with_context(|| format!("writing to `{}`", describe(command)))?;
    }
    let output = child.wait_with_output().with_context(|| format!("waiting for `{}`", describe(command)))?;
    if !output.status.success() {
        bail!("`{}` failed ({}): {}", describe(command), output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `program args` run in network namespace `netns` (via `ip netns exec`).
pub fn in_netns(netns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", netns]).arg(program);
    command
}

/// Runs `ip <args>` in netns `netns`.
pub fn ip_in(netns: &str, args: &[&str]) -> anyhow::Result<String> {
    run(in_netns(netns, "ip").args(args))
}

/// Reads a pid file (None when missing or garbage).
pub fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok().filter(|pid| *pid > 0)
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised comm, which may itself contain ')'.
    stat.rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next())
        .is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
}

/// The kernel comm of `pid`.
pub fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|comm| comm.trim().to_string())
}

/// Sends `signal` to `pid` (errors ignored: it may be gone already).
pub fn signal(pid: i32, signal: Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
}

/// Waits up to `timeout` for `pid` to exit; true when it did.
pub fn wait_exit(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// SIGTERM, then SIGKILL after `grace`; waits for the exit.
pub fn stop(pid: i32, grace: Duration) {
    signal(pid, Signal::SIGTERM);
    if !wait_exit(pid, grace) {
        signal(pid, Signal::SIGKILL);
        wait_exit(pid, Duration::from_secs(2));
    }
}

/// Polls `check` every 50 ms until it gives Some or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A daemon to start detached from the caller.
pub struct Daemon<'a> {
    /// Name for its pid and log files.
    pub name: &'a str,
    /// Network namespace to run in.
    pub netns: &'a str,
    /// The executable (its basename becomes the kernel comm).
    pub program: &'a Path,
    /// Arguments (the daemon must write its pid to `--pidfile`, which is appended).
    pub args: Vec<String>,
}

/// Starts `daemon` in its own session (`setsid -f`, so it is nobody's child and the caller never
/// has to reap it), stdout and stderr appended to `<logs>/<name>.log`; waits for the pid file the
/// daemon writes and returns its pid.
pub fn spawn_daemon(daemon: &Daemon<'_>, pids: &Path, logs: &Path, env: &[(&str, &Path)]) -> anyhow::Result<i32> {
    let pidfile = pids.join(format!("{}.pid", daemon.name));
    let _ = fs::remove_file(&pidfile);
    let log_path = logs.join(format!("{}.log", daemon.name));
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut command = Command::new("setsid");
    command
        .args(["-f", "ip", "netns", "exec", daemon.netns])
        .arg(daemon.program)
        .args(&daemon.args)
        .arg("--pidfile")
        .arg(&pidfile)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("duplicating a log fd")?)
        .stderr(log);
    for (key, value) in env {
        command.env(key, value);
    }
    let status = command.status().with_context(|| format!("cannot start `{}`", describe(&command)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", describe(&command));
    }
    wait_for(Duration::from_secs(5), || read_pid(&pidfile).filter(|pid| alive(*pid))).with_context(|| {
        format!(
            "{} did not start (no live pid in {}); its log {} ends with:\n{}",
            daemon.name,
            pidfile.display(),
            log_path.display(),
            tail(&log_path, 10)
        )
    })
}

/// The last `lines` lines of a text file (empty when unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes `pid` (this process) to `path`, creating its directory.
pub fn write_own_pid(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(path, format!("{}\n", std::process::id())).with_context(|| format!("writing {}", path.display()))
}

/// Writes `contents` to `path` atomically (temp file in the same dir's parent, then rename), so
/// a watcher never sees half a file. The temp file lives in `tmp_dir` (same filesystem).
pub fn write_atomic(path: &Path, tmp_dir: &Path, contents: &str) -> anyhow::Result<()> {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = tmp_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Every process (not this one) whose executable or argv[0] lies under `root`, or an OVS daemon
/// whose command line names a path under `root`.
pub fn processes_under(root: &Path) -> Vec<i32> {
    let own = std::process::id() as i32;
    let root_text = root.to_string_lossy().into_owned();
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        if pid == own || !alive(pid) {
            continue;
        }
        let exe = fs::read_link(format!("/proc/{pid}/exe")).ok();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> =
            cmdline.split(|byte| *byte == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect();
        let exe_under = exe.is_some_and(|exe| exe.starts_with(root));
        let argv0_under = args.first().is_some_and(|arg| Path::new(arg).starts_with(root));
        let ovs_daemon = comm(pid).is_some_and(|comm| comm.starts_with("ovs") || comm.starts_with("ovsdb"))
            && args.iter().any(|arg| arg.contains(&root_text));
        if exe_under || argv0_under || ovs_daemon {
            pids.push(pid);
        }
    }
    pids
}

/// Names of the network namespaces under /run/netns starting with `prefix`.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir("/run/netns") else { return Vec::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
        .filter(|name| name.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Whether `program` is on PATH (or the sbin dirs, which a non-login root PATH may lack).
pub fn have(program: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':').chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"]).any(|dir| Path::new(dir).join(program).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_zombie_states_are_not() {
        assert!(alive(std::process::id() as i32));
        assert!(!alive(i32::MAX));
    }

    #[test]
    fn pid_files_are_read_forgivingly() {
        let dir = std::env::temp_dir().join(format!("dm-lab-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.pid");
        fs::write(&path, "123\n").unwrap();
        assert_eq!(read_pid(&path), Some(123));
        fs::write(&path, "garbage").unwrap();
        assert_eq!(read_pid(&path), None);
        assert_eq!(read_pid(&dir.join("missing.pid")), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
