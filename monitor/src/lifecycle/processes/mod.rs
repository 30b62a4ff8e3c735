//! SDN process lifecycle: which watched processes (by kernel comm name) run, and when they
//! start, exit and restart.
//!
//! The kernel's process tracer (`datapath::process_probe`) reports every exec of a watched
//! name and every whole-process exit through a ring buffer; this module turns those reports
//! into state (running pids per name, counters) and timeline events:
//!
//! - `process_start` on exec of a watched name (`pid 1234`);
//! - `process_exit` when the last thread of such a process exits (`pid 1234 killed by SIGTERM`);
//! - `process_restart` right after a start that follows an exit of the same name within the
//!   restart window (`started again 8.02 s after pid 1234 was killed by SIGTERM`).
//!
//! Reports alone do not see everything, so `/proc` fills the gaps: it gives the processes
//! already running at start-up (state, no events), the child a daemon leaves behind when its
//! parent exits after a fork (a rescan of the name after every exit), and, periodically,
//! processes that vanished or were renamed without a report (the ring buffer may overflow).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    fs, io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use monitor_common::{COMM_LEN, PROCESS_EVENT_EXEC, PROCESS_EVENT_EXIT, ProcessEvent};
use serde::Serialize;
use tokio::{
    io::{Interest, unix::AsyncFd},
    task::JoinHandle,
};
use tracing::{debug, warn};

use crate::{
    datapath::process_probe::{ProcessProbe, comm_name},
    lifecycle::timeline::{Event, EventKind, Stamp, Timeline, monotonic_ns, rfc3339},
};

/// Where processes are listed.
const PROC: &str = "/proc";
/// How often `/proc` is rescanned as a safety net while kernel reports flow.
const RESYNC_WITH_PROBE: Duration = Duration::from_secs(30);
/// How often `/proc` is rescanned when there are no kernel reports (state only, no events).
const RESYNC_WITHOUT_PROBE: Duration = Duration::from_secs(5);
/// A process a scan found whose exec report arrives with a kernel time up to this much after
/// the scan is the start that exec made: the name appears in /proc a little before the
/// tracepoint fires, and a scan can overtake the ring buffer.
const SCAN_RACE_SLACK_NS: u64 = 100_000_000;
/// How long an exited pid is remembered, to ignore a repeated exit report (two threads
/// exiting at once on kernels without `group_dead`) and a rescan still seeing the process
/// before it becomes a zombie.
const EXITED_MEMORY_NS: u64 = 10_000_000_000;
/// Bounds on per-name bookkeeping, against a watched name that runs very often.
const MAX_PENDING_EXITS: usize = 256;
const MAX_EXITED_PIDS: usize = 1024;

/// Current state of the watched processes; cheap to clone and share.
#[derive(Clone)]
pub struct ProcessWatcher {
    tracker: Arc<Mutex<Tracker>>,
}

impl ProcessWatcher {
    /// Every configured name, in configuration order, running or not.
    pub fn snapshot(&self) -> ProcessSnapshot {
        lock(&self.tracker).snapshot()
    }
}

/// All watched process names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessSnapshot {
    pub processes: Vec<ProcessState>,
}

/// One watched process name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessState {
    /// Kernel comm name (at most 15 bytes).
    pub name: String,
    /// Pids (thread group ids) running under this name, ascending.
    pub running: Vec<u32>,
    /// Starts (execs) seen since the agent started; processes found running at start-up
    /// are not counted.
    pub starts: u64,
    /// Whole-process exits seen.
    pub exits: u64,
    /// Starts that followed an exit of the same name within the restart window.
    pub restarts: u64,
    /// RFC 3339.
    pub last_start: Option<String>,
    pub last_exit: Option<String>,
    /// E.g. `pid 1234 killed by SIGTERM`.
    pub last_exit_detail: Option<String>,
}

/// Starts watching `names` (kernel comm names; longer names are truncated as the kernel
/// does). Scans /proc for the processes already running, then follows the kernel's
/// reports from `probe`; without a probe (unsupported kernel) only /proc is rescanned
/// periodically, so the running state stays right but no events are recorded.
///
/// Must be called inside a tokio runtime.
pub fn start(
    probe: Option<ProcessProbe>,
    names: Vec<String>,
    restart_window: Duration,
    timeline: Arc<Timeline>,
) -> anyhow::Result<(ProcessWatcher, JoinHandle<()>)> {
    let mut watched: Vec<String> = Vec::new();
    for name in &names {
        match comm_name(name) {
            Some(comm) if !watched.contains(&comm) => watched.push(comm),
            Some(_) => {}
            None => warn!(name, "not a usable process name (empty or with a NUL byte): ignored"),
        }
    }
    let proc_root = PathBuf::from(PROC);
    let mut tracker = Tracker::new(&watched, restart_window);
    let found = scan_proc(&proc_root, &watched).with_context(|| format!("scanning {PROC} for SDN processes"))?;
    let seen_ns = monotonic_ns();
    for name in &watched {
        tracker.resync(name, found.get(name).unwrap_or(&BTreeSet::new()), seen_ns, false);
    }
    let (ring, resync_every) = match probe {
        Some(probe) => {
            // SAFETY: the RingBuf owns its map's fd and neither closes nor replaces it while
            // the AsyncFd holds it.
            let ring = unsafe { AsyncFd::register_with_interest(probe.events, Interest::READABLE) }
                .map_err(|error| error.into_parts().1)
                .context("polling the process event ring buffer")?;
            (Some(ring), RESYNC_WITH_PROBE)
        }
        None => (None, RESYNC_WITHOUT_PROBE),
    };
    let tracker = Arc::new(Mutex::new(tracker));
    let task = tokio::spawn(follow(ring, Arc::clone(&tracker), timeline, proc_root, watched, resync_every));
    Ok((ProcessWatcher { tracker }, task))
}

/// The watcher's task: kernel reports as they come, /proc rescans as needed.
async fn follow(
    mut ring: Option<AsyncFd<RingBuf<MapData>>>,
    tracker: Arc<Mutex<Tracker>>,
    timeline: Arc<Timeline>,
    proc_root: PathBuf,
    names: Vec<String>,
    resync_every: Duration,
) {
    if names.is_empty() {
        return;
    }
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + resync_every, resync_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let batch = tokio::select! {
            batch = read_batch(&mut ring) => batch,
            _ = ticker.tick() => {
                rescan(&tracker, &proc_root, &names, false);
                continue;
            }
        };
        let batch = match batch {
            Ok(batch) => batch,
            Err(error) => {
                warn!(%error, "reading process events failed; SDN process events are no longer seen");
                ring = None;
                continue;
            }
        };
        let mut exited: Vec<String> = Vec::new();
        let mut events = Vec::new();
        for raw in batch {
            let Some(observation) = Observation::from_kernel(&raw, Stamp::from_monotonic(raw.ktime_ns)) else {
                debug!(?raw, "unreadable process event");
                continue;
            };
            debug!(?observation, ppid = raw.ppid, "process event");
            let pid = observation.pid;
            for event in lock(&tracker).observe(observation) {
                if event.kind == EventKind::ProcessExit && !exited.contains(&event.subject) {
                    exited.push(event.subject.clone());
                }
                events.push((pid, event));
            }
        }
        // Who carries on: a daemon's child that the exit left behind, or nobody. Its
        // parent's exit is recorded as a hand-off, never as a cause of an incident.
        let handoffs = if exited.is_empty() { Vec::new() } else { rescan(&tracker, &proc_root, &exited, true) };
        for (pid, event) in events {
            let handoff = (event.kind == EventKind::ProcessExit)
                .then(|| handoffs.iter().find(|h| h.name == event.subject && h.parent == pid))
                .flatten();
            timeline.record(match handoff {
                Some(handoff) => event.daemon_handoff(handoff.child),
                None => event,
            });
        }
    }
}

/// Every report the ring buffer holds now (waits for at least one readiness).
async fn read_batch(ring: &mut Option<AsyncFd<RingBuf<MapData>>>) -> io::Result<Vec<ProcessEvent>> {
    let Some(ring) = ring else {
        return std::future::pending().await;
    };
    let mut guard = ring.readable_mut().await?;
    let mut batch = Vec::new();
    while let Some(item) = guard.get_inner_mut().next() {
        match decode_event(&item) {
            Some(event) => batch.push(event),
            None => debug!(len = item.len(), "short process event"),
        }
    }
    guard.clear_ready();
    Ok(batch)
}

/// A process found by a rescan that took over an exit: a daemon's child after its parent left.
#[derive(Debug, PartialEq, Eq)]
struct Handoff {
    name: String,
    parent: u32,
    child: u32,
}

fn rescan(tracker: &Mutex<Tracker>, proc_root: &Path, names: &[String], take_over: bool) -> Vec<Handoff> {
    match scan_proc(proc_root, names) {
        Ok(found) => {
            let seen_ns = monotonic_ns();
            let mut tracker = lock(tracker);
            names
                .iter()
                .flat_map(|name| tracker.resync(name, found.get(name).unwrap_or(&BTreeSet::new()), seen_ns, take_over))
                .collect()
        }
        Err(error) => {
            warn!(%error, "scanning {} for SDN processes", proc_root.display());
            Vec::new()
        }
    }
}

fn lock(tracker: &Mutex<Tracker>) -> std::sync::MutexGuard<'_, Tracker> {
    tracker.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A [`ProcessEvent`] from its bytes in the ring buffer (layout of the `repr(C)` struct).
fn decode_event(bytes: &[u8]) -> Option<ProcessEvent> {
    let u32_at = |at: usize| Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    Some(ProcessEvent {
        ktime_ns: u64::from_ne_bytes(bytes.get(0..8)?.try_into().ok()?),
        kind: u32_at(8)?,
        tgid: u32_at(12)?,
        ppid: u32_at(16)?,
        exit_code: u32_at(20)?,
        comm: bytes.get(24..24 + COMM_LEN)?.try_into().ok()?,
    })
}

/// Pids of live (non-zombie) processes whose name is one of `names`, by name.
fn scan_proc(proc_root: &Path, names: &[String]) -> io::Result<BTreeMap<String, BTreeSet<u32>>> {
    let mut found: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    if names.is_empty() {
        return Ok(found);
    }
    for entry in fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        // Numeric entries are processes (thread group ids); threads hide under task/.
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        // Processes vanish during a scan: that is normal, skip them.
        let Ok(stat) = fs::read(entry.path().join("stat")) else { continue };
        let Some((comm, state)) = parse_stat(&stat) else { continue };
        // A zombie has exited already; its parent just has not reaped it.
        if matches!(state, b'Z' | b'X' | b'x') {
            continue;
        }
        let comm = String::from_utf8_lossy(comm);
        if let Some(name) = names.iter().find(|name| **name == comm) {
            found.entry(name.clone()).or_default().insert(pid);
        }
    }
    Ok(found)
}

/// (comm, state) from `/proc/<pid>/stat`: `pid (comm) S ppid …`, where comm may itself
/// contain spaces and parentheses.
fn parse_stat(stat: &[u8]) -> Option<(&[u8], u8)> {
    let open = stat.iter().position(|b| *b == b'(')?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    let comm = stat.get(open + 1..close)?;
    let state = *stat.get(close + 1..)?.iter().find(|b| !b.is_ascii_whitespace())?;
    Some((comm, state))
}

/// How a process ended, from its wait status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)`.
    Exited(u8),
    /// Terminated by a signal.
    Killed { signal: i32, core_dumped: bool },
}

impl ExitStatus {
    /// Decodes a wait status: low 7 bits the signal, bit 7 core dumped, bits 8..15 the code.
    pub fn from_wait_status(status: u32) -> Self {
        match (status & 0x7f) as i32 {
            0 => Self::Exited(((status >> 8) & 0xff) as u8),
            signal => Self::Killed { signal, core_dumped: status & 0x80 != 0 },
        }
    }

    /// `exited with code 3`, `killed by SIGKILL (core dumped)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Exited(code) => format!("exited with code {code}"),
            Self::Killed { signal, core_dumped } => {
                let core = if *core_dumped { " (core dumped)" } else { "" };
                format!("killed by {}{core}", signal_name(*signal))
            }
        }
    }

    /// As [`ExitStatus::describe`], after "pid N": `exited with code 3`, `was killed by SIGTERM`.
    fn describe_after_pid(&self) -> String {
        match self {
            Self::Exited(_) => self.describe(),
            Self::Killed { .. } => format!("was {}", self.describe()),
        }
    }
}

fn signal_name(signal: i32) -> String {
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(known) => known.as_str().to_string(),
        Err(_) => format!("signal {signal}"),
    }
}

/// A kernel report, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Observation {
    name: String,
    pid: u32,
    stamp: Stamp,
    change: Change,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Exec,
    Exit(ExitStatus),
}

impl Observation {
    fn from_kernel(event: &ProcessEvent, stamp: Stamp) -> Option<Self> {
        let change = match event.kind {
            PROCESS_EVENT_EXEC => Change::Exec,
            PROCESS_EVENT_EXIT => Change::Exit(ExitStatus::from_wait_status(event.exit_code)),
            _ => return None,
        };
        let end = event.comm.iter().position(|b| *b == 0).unwrap_or(COMM_LEN);
        let name = String::from_utf8_lossy(&event.comm[..end]).into_owned();
        Some(Self { name, pid: event.tgid, stamp, change })
    }
}

/// How a running pid became known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// Its exec was reported, at `at_ns`.
    Exec { at_ns: u64 },
    /// A /proc scan found it (at start-up, or a daemon's child left by an exit). After an
    /// exit it stands in for the process that exited: `took_over` is that exit, no longer
    /// waiting for a start.
    Scan { seen_ns: u64, took_over: Option<PendingExit> },
}

/// An exit waiting for a start of the same name, to make a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PendingExit {
    pid: u32,
    mono_ns: u64,
    status: ExitStatus,
    /// Exited with code 0 soon after its exec: the parent of a daemon that forked (`--detach`).
    daemonizing: bool,
}

/// A clean exit this soon after the exec looks like a daemon's parent leaving its child.
const DAEMONIZE_NS: u64 = 5_000_000_000;

#[derive(Debug)]
struct NameState {
    name: String,
    running: BTreeMap<u32, Origin>,
    /// Oldest first.
    pending: VecDeque<PendingExit>,
    /// Recently exited pids, with the exit's monotonic time.
    exited: HashMap<u32, u64>,
    starts: u64,
    exits: u64,
    restarts: u64,
    last_start: Option<Stamp>,
    last_exit: Option<Stamp>,
    last_exit_detail: Option<String>,
}

impl NameState {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            running: BTreeMap::new(),
            pending: VecDeque::new(),
            exited: HashMap::new(),
            starts: 0,
            exits: 0,
            restarts: 0,
            last_start: None,
            last_exit: None,
            last_exit_detail: None,
        }
    }

    fn forget_expired(&mut self, now_ns: u64, window_ns: u64) {
        self.pending.retain(|exit| now_ns.saturating_sub(exit.mono_ns) <= window_ns);
        self.exited.retain(|_, at| now_ns.saturating_sub(*at) <= EXITED_MEMORY_NS);
    }

    fn add_pending(&mut self, exit: PendingExit) {
        let at = self.pending.partition_point(|other| other.mono_ns <= exit.mono_ns);
        self.pending.insert(at, exit);
        while self.pending.len() > MAX_PENDING_EXITS {
            self.pending.pop_front();
        }
    }
}

/// The pure bookkeeping: observations and scans in, state and timeline events out.
#[derive(Debug)]
struct Tracker {
    window_ns: u64,
    names: Vec<NameState>,
}

impl Tracker {
    fn new(names: &[String], restart_window: Duration) -> Self {
        Self {
            window_ns: u64::try_from(restart_window.as_nanos()).unwrap_or(u64::MAX),
            names: names.iter().map(|name| NameState::new(name)).collect(),
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|state| state.name == name)
    }

    /// Applies one kernel report; returns the timeline events it makes (oldest first).
    fn observe(&mut self, observation: Observation) -> Vec<Event> {
        let Observation { name, pid, stamp, change } = observation;
        let Some(index) = self.index(&name) else {
            debug!(name, pid, "report for a name not watched");
            return Vec::new();
        };
        // A pid has one name: an exec or exit under this one ends any other.
        for (other, state) in self.names.iter_mut().enumerate() {
            if other != index {
                state.running.remove(&pid);
            }
        }
        match change {
            Change::Exec => self.exec(index, pid, stamp),
            Change::Exit(status) => self.exit(index, pid, stamp, status),
        }
    }

    fn exec(&mut self, index: usize, pid: u32, stamp: Stamp) -> Vec<Event> {
        let window_ns = self.window_ns;
        let state = &mut self.names[index];
        state.forget_expired(stamp.mono_ns, window_ns);
        // An exec means a live process: an earlier exit of this pid was another process.
        state.exited.remove(&pid);
        match state.running.get(&pid).copied() {
            Some(Origin::Exec { .. }) => {
                debug!(name = state.name, pid, "process re-executed itself: not a new start");
                return Vec::new();
            }
            Some(Origin::Scan { seen_ns, .. }) if stamp.mono_ns > seen_ns.saturating_add(SCAN_RACE_SLACK_NS) => {
                debug!(name = state.name, pid, "process found by a scan re-executed itself: not a new start");
                state.running.insert(pid, Origin::Exec { at_ns: stamp.mono_ns });
                return Vec::new();
            }
            // The scan saw the process this exec made before its report arrived: this is
            // its start, and the exit it stood in for waits for it again.
            Some(Origin::Scan { took_over: Some(exit), .. }) => state.add_pending(exit),
            Some(Origin::Scan { took_over: None, .. }) | None => {}
        }
        state.running.insert(pid, Origin::Exec { at_ns: stamp.mono_ns });
        state.starts += 1;
        state.last_start = Some(stamp);
        let mut events = vec![Event::new(stamp, EventKind::ProcessStart, &state.name, format!("pid {pid}"))];
        // The oldest exit still in the window is the one this start ends.
        if let Some(exit) = state.pending.pop_front() {
            state.restarts += 1;
            let downtime = stamp.mono_ns.saturating_sub(exit.mono_ns) as f64 / 1e9;
            events.push(Event::new(
                stamp,
                EventKind::ProcessRestart,
                &state.name,
                format!("started again {downtime:.2} s after pid {} {}", exit.pid, exit.status.describe_after_pid()),
            ));
        }
        events
    }

    fn exit(&mut self, index: usize, pid: u32, stamp: Stamp, status: ExitStatus) -> Vec<Event> {
        let window_ns = self.window_ns;
        let state = &mut self.names[index];
        state.forget_expired(stamp.mono_ns, window_ns);
        let origin = state.running.remove(&pid);
        let daemonizing = status == ExitStatus::Exited(0)
            && matches!(origin, Some(Origin::Exec { at_ns }) if stamp.mono_ns.saturating_sub(at_ns) < DAEMONIZE_NS);
        if origin.is_none() && state.exited.contains_key(&pid) {
            debug!(name = state.name, pid, "repeated exit report ignored");
            return Vec::new();
        }
        if state.exited.len() >= MAX_EXITED_PIDS {
            state.exited.clear();
        }
        state.exited.insert(pid, stamp.mono_ns);
        let detail = format!("pid {pid} {}", status.describe());
        state.exits += 1;
        state.last_exit = Some(stamp);
        state.last_exit_detail = Some(detail.clone());
        state.add_pending(PendingExit { pid, mono_ns: stamp.mono_ns, status, daemonizing });
        vec![Event::new(stamp, EventKind::ProcessExit, &state.name, detail)]
    }

    /// Makes `running` of `name` match a /proc scan that finished at `seen_ns`. With
    /// `take_over` (the scan after an exit), each process found that was not known takes
    /// over the latest exit still waiting for a start: a daemon's child carrying on after
    /// its parent exited is not a restart waiting to happen.
    fn resync(&mut self, name: &str, found: &BTreeSet<u32>, seen_ns: u64, take_over: bool) -> Vec<Handoff> {
        let window_ns = self.window_ns;
        let mut handoffs = Vec::new();
        let Some(index) = self.index(name) else { return handoffs };
        let state = &mut self.names[index];
        state.forget_expired(seen_ns, window_ns);
        // Gone or renamed without a report we saw.
        state.running.retain(|pid, _| found.contains(pid));
        for pid in found {
            // A process just reported exited may linger in /proc for a moment.
            if state.running.contains_key(pid) || state.exited.contains_key(pid) {
                continue;
            }
            let took_over = if take_over {
                state
                    .pending
                    .iter()
                    .rposition(|exit| exit.mono_ns <= seen_ns)
                    .and_then(|position| state.pending.remove(position))
            } else {
                None
            };
            debug!(name, pid, ?took_over, "process found in /proc");
            if let Some(exit) = took_over.as_ref().filter(|exit| exit.daemonizing) {
                handoffs.push(Handoff { name: name.to_string(), parent: exit.pid, child: *pid });
            }
            state.running.insert(*pid, Origin::Scan { seen_ns, took_over });
        }
        handoffs
    }

    fn snapshot(&self) -> ProcessSnapshot {
        let processes = self
            .names
            .iter()
            .map(|state| ProcessState {
                name: state.name.clone(),
                running: state.running.keys().copied().collect(),
                starts: state.starts,
                exits: state.exits,
                restarts: state.restarts,
                last_start: state.last_start.map(|stamp| rfc3339(stamp.wall)),
                last_exit: state.last_exit.map(|stamp| rfc3339(stamp.wall)),
                last_exit_detail: state.last_exit_detail.clone(),
            })
            .collect();
        ProcessSnapshot { processes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIGTERM: u32 = 15;
    const SIGKILL: u32 = 9;
    const SEC: u64 = 1_000_000_000;

    fn at(mono_ns: u64) -> Stamp {
        Stamp { mono_ns, wall: jiff::Timestamp::from_nanosecond(1_700_000_000_000_000_000 + mono_ns as i128).unwrap() }
    }

    fn exec(name: &str, pid: u32, mono_ns: u64) -> Observation {
        Observation { name: name.into(), pid, stamp: at(mono_ns), change: Change::Exec }
    }

    fn exit(name: &str, pid: u32, mono_ns: u64, wait_status: u32) -> Observation {
        let status = ExitStatus::from_wait_status(wait_status);
        Observation { name: name.into(), pid, stamp: at(mono_ns), change: Change::Exit(status) }
    }

    fn tracker(names: &[&str]) -> Tracker {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        Tracker::new(&names, Duration::from_secs(60))
    }

    /// (kind, subject, detail) of every event, in order.
    fn run(tracker: &mut Tracker, observations: Vec<Observation>) -> Vec<(EventKind, String, String)> {
        observations
            .into_iter()
            .flat_map(|observation| tracker.observe(observation))
            .map(|event| (event.kind, event.subject, event.detail))
            .collect()
    }

    fn state<'a>(snapshot: &'a ProcessSnapshot, name: &str) -> &'a ProcessState {
        snapshot.processes.iter().find(|p| p.name == name).unwrap()
    }

    use EventKind::{ProcessExit as Exit, ProcessRestart as Restart, ProcessStart as Start};

    #[test]
    fn lifecycles() {
        struct Case {
            what: &'static str,
            observations: Vec<Observation>,
            events: Vec<(EventKind, &'static str)>,
            /// (running, starts, exits, restarts) of "ovs-vswitchd".
            state: (Vec<u32>, u64, u64, u64),
        }
        let cases = [
            Case {
                what: "start",
                observations: vec![exec("ovs-vswitchd", 100, SEC)],
                events: vec![(Start, "pid 100")],
                state: (vec![100], 1, 0, 0),
            },
            Case {
                what: "SIGTERM exit",
                observations: vec![exec("ovs-vswitchd", 100, SEC), exit("ovs-vswitchd", 100, 2 * SEC, SIGTERM)],
                events: vec![(Start, "pid 100"), (Exit, "pid 100 killed by SIGTERM")],
                state: (vec![], 1, 1, 0),
            },
            Case {
                what: "SIGKILL exit with a core dump",
                observations: vec![exec("ovs-vswitchd", 100, SEC), exit("ovs-vswitchd", 100, 2 * SEC, SIGKILL | 0x80)],
                events: vec![(Start, "pid 100"), (Exit, "pid 100 killed by SIGKILL (core dumped)")],
                state: (vec![], 1, 1, 0),
            },
            Case {
                what: "exit code",
                observations: vec![exec("ovs-vswitchd", 100, SEC), exit("ovs-vswitchd", 100, 2 * SEC, 3 << 8)],
                events: vec![(Start, "pid 100"), (Exit, "pid 100 exited with code 3")],
                state: (vec![], 1, 1, 0),
            },
            Case {
                what: "restart within the window",
                observations: vec![
                    exec("ovs-vswitchd", 100, SEC),
                    exit("ovs-vswitchd", 100, 10 * SEC, SIGTERM),
                    exec("ovs-vswitchd", 200, 18 * SEC + 20_000_000),
                ],
                events: vec![
                    (Start, "pid 100"),
                    (Exit, "pid 100 killed by SIGTERM"),
                    (Start, "pid 200"),
                    (Restart, "started again 8.02 s after pid 100 was killed by SIGTERM"),
                ],
                state: (vec![200], 2, 1, 1),
            },
            Case {
                what: "restart after a non-zero exit, window edge included",
                observations: vec![exit("ovs-vswitchd", 100, SEC, 1 << 8), exec("ovs-vswitchd", 200, 61 * SEC)],
                events: vec![
                    (Exit, "pid 100 exited with code 1"),
                    (Start, "pid 200"),
                    (Restart, "started again 60.00 s after pid 100 exited with code 1"),
                ],
                state: (vec![200], 1, 1, 1),
            },
            Case {
                what: "start outside the window is no restart",
                observations: vec![exit("ovs-vswitchd", 100, SEC, SIGKILL), exec("ovs-vswitchd", 200, 61 * SEC + 1)],
                events: vec![(Exit, "pid 100 killed by SIGKILL"), (Start, "pid 200")],
                state: (vec![200], 1, 1, 0),
            },
            Case {
                what: "two instances: each exit waits for its own start",
                observations: vec![
                    exec("ovs-vswitchd", 100, SEC),
                    exec("ovs-vswitchd", 101, SEC),
                    exit("ovs-vswitchd", 100, 5 * SEC, SIGTERM),
                    exit("ovs-vswitchd", 101, 6 * SEC, SIGKILL),
                    exec("ovs-vswitchd", 200, 7 * SEC),
                    exec("ovs-vswitchd", 201, 9 * SEC),
                    exec("ovs-vswitchd", 202, 10 * SEC),
                ],
                events: vec![
                    (Start, "pid 100"),
                    (Start, "pid 101"),
                    (Exit, "pid 100 killed by SIGTERM"),
                    (Exit, "pid 101 killed by SIGKILL"),
                    (Start, "pid 200"),
                    (Restart, "started again 2.00 s after pid 100 was killed by SIGTERM"),
                    (Start, "pid 201"),
                    (Restart, "started again 3.00 s after pid 101 was killed by SIGKILL"),
                    (Start, "pid 202"),
                ],
                state: (vec![200, 201, 202], 5, 2, 2),
            },
            Case {
                what: "self-exec is not a new start",
                observations: vec![exec("ovs-vswitchd", 100, SEC), exec("ovs-vswitchd", 100, 2 * SEC)],
                events: vec![(Start, "pid 100")],
                state: (vec![100], 1, 0, 0),
            },
            Case {
                what: "a repeated exit report is ignored",
                observations: vec![
                    exec("ovs-vswitchd", 100, SEC),
                    exit("ovs-vswitchd", 100, 2 * SEC, SIGKILL),
                    exit("ovs-vswitchd", 100, 2 * SEC + 1000, SIGKILL),
                ],
                events: vec![(Start, "pid 100"), (Exit, "pid 100 killed by SIGKILL")],
                state: (vec![], 1, 1, 0),
            },
            Case {
                what: "a pid reused long after its exit is a new process",
                observations: vec![
                    exit("ovs-vswitchd", 100, SEC, SIGKILL),
                    exec("ovs-vswitchd", 100, 100 * SEC),
                    exit("ovs-vswitchd", 100, 101 * SEC, 0),
                ],
                events: vec![
                    (Exit, "pid 100 killed by SIGKILL"),
                    (Start, "pid 100"),
                    (Exit, "pid 100 exited with code 0"),
                ],
                state: (vec![], 1, 2, 0),
            },
            Case {
                what: "other names do not pair",
                observations: vec![exit("ovsdb-server", 100, SEC, SIGTERM), exec("ovs-vswitchd", 200, 2 * SEC)],
                events: vec![(Exit, "pid 100 killed by SIGTERM"), (Start, "pid 200")],
                state: (vec![200], 1, 0, 0),
            },
            Case {
                what: "exec into another watched name moves the pid",
                observations: vec![exec("ovsdb-server", 100, SEC), exec("ovs-vswitchd", 100, 2 * SEC)],
                events: vec![(Start, "pid 100"), (Start, "pid 100")],
                state: (vec![100], 1, 0, 0),
            },
            Case {
                what: "names not watched are ignored",
                observations: vec![exec("bash", 100, SEC), exit("bash", 100, 2 * SEC, 0)],
                events: vec![],
                state: (vec![], 0, 0, 0),
            },
        ];
        for case in cases {
            let mut tracker = tracker(&["ovs-vswitchd", "ovsdb-server"]);
            let events = run(&mut tracker, case.observations);
            let events: Vec<(EventKind, &str)> =
                events.iter().map(|(kind, _, detail)| (*kind, detail.as_str())).collect();
            assert_eq!(events, case.events, "{}", case.what);
            let snapshot = tracker.snapshot();
            let ovs = state(&snapshot, "ovs-vswitchd");
            assert_eq!((ovs.running.clone(), ovs.starts, ovs.exits, ovs.restarts), case.state, "{}", case.what);
        }
    }

    #[test]
    fn events_carry_the_name_and_the_kernel_time() {
        let mut tracker = tracker(&["flanneld"]);
        let events =
            [exec("flanneld", 7, 5 * SEC), exit("flanneld", 7, 6 * SEC, SIGTERM), exec("flanneld", 8, 7 * SEC)]
                .into_iter()
                .flat_map(|observation| tracker.observe(observation))
                .collect::<Vec<_>>();
        assert!(events.iter().all(|event| event.subject == "flanneld"));
        let stamps: Vec<u64> = events.iter().map(|event| event.stamp.mono_ns).collect();
        // The restart shares its start's stamp.
        assert_eq!(stamps, [5 * SEC, 6 * SEC, 7 * SEC, 7 * SEC]);
        let snapshot = tracker.snapshot();
        let flanneld = state(&snapshot, "flanneld");
        assert_eq!(flanneld.last_start.as_deref(), Some(rfc3339(at(7 * SEC).wall).as_str()));
        assert_eq!(flanneld.last_exit.as_deref(), Some(rfc3339(at(6 * SEC).wall).as_str()));
        assert_eq!(flanneld.last_exit_detail.as_deref(), Some("pid 7 killed by SIGTERM"));
    }

    #[test]
    fn every_name_is_in_the_snapshot() {
        let tracker = tracker(&["ovs-vswitchd", "ovsdb-server", "flanneld"]);
        let snapshot = tracker.snapshot();
        let names: Vec<&str> = snapshot.processes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ovs-vswitchd", "ovsdb-server", "flanneld"]);
        assert!(snapshot.processes.iter().all(|p| p.running.is_empty() && p.starts == 0 && p.restarts == 0));
        let json = serde_json::to_value(&snapshot).unwrap();
        assert_eq!(json["processes"][0]["name"], "ovs-vswitchd");
        assert_eq!(json["processes"][0]["last_start"], serde_json::Value::Null);
    }

    #[test]
    fn scans_at_start_up_are_state_not_events() {
        let mut tracker = tracker(&["ovs-vswitchd"]);
        tracker.resync("ovs-vswitchd", &BTreeSet::from([10, 11]), SEC, false);
        let ovs = tracker.snapshot().processes.remove(0);
        assert_eq!((ovs.running, ovs.starts, ovs.exits), (vec![10, 11], 0, 0));
        // Its exit is reported like any other; a later self-exec is not a start.
        let events =
            run(&mut tracker, vec![exit("ovs-vswitchd", 10, 5 * SEC, SIGTERM), exec("ovs-vswitchd", 11, 6 * SEC)]);
        assert_eq!(events.len(), 1);
        assert_eq!(tracker.snapshot().processes[0].running, [11]);
    }

    #[test]
    fn a_daemon_child_carries_on_after_its_parent_exits() {
        let mut tracker = tracker(&["ovs-vswitchd"]);
        // Exec, fork (no report), the parent exits 0; the rescan finds the child.
        run(&mut tracker, vec![exec("ovs-vswitchd", 100, SEC), exit("ovs-vswitchd", 100, 2 * SEC, 0)]);
        let handoffs = tracker.resync("ovs-vswitchd", &BTreeSet::from([101]), 2 * SEC + 1000, true);
        assert_eq!(handoffs, [Handoff { name: "ovs-vswitchd".into(), parent: 100, child: 101 }]);
        let ovs = tracker.snapshot().processes.remove(0);
        assert_eq!((ovs.running, ovs.starts, ovs.exits, ovs.restarts), (vec![101], 1, 1, 0));
        // A restart 10 s later pairs with the child's exit, not the parent's.
        let events =
            run(&mut tracker, vec![exit("ovs-vswitchd", 101, 12 * SEC, SIGTERM), exec("ovs-vswitchd", 300, 13 * SEC)]);
        assert_eq!(events.last().unwrap().2, "started again 1.00 s after pid 101 was killed by SIGTERM");
        assert_eq!(tracker.snapshot().processes[0].restarts, 1);
    }

    #[test]
    fn a_clean_exit_after_a_long_run_is_no_daemon_hand_off() {
        let mut tracker = tracker(&["ovs-vswitchd"]);
        run(&mut tracker, vec![exec("ovs-vswitchd", 100, SEC), exit("ovs-vswitchd", 100, 60 * SEC, 0)]);
        let handoffs = tracker.resync("ovs-vswitchd", &BTreeSet::from([200]), 60 * SEC + 1000, true);
        assert!(handoffs.is_empty());
    }

    #[test]
    fn a_scan_that_overtakes_an_exec_report_does_not_eat_the_start() {
        let mut tracker = tracker(&["ovs-vswitchd"]);
        run(&mut tracker, vec![exec("ovs-vswitchd", 100, SEC), exit("ovs-vswitchd", 100, 2 * SEC, SIGKILL)]);
        // The supervisor starts pid 200 at 2.001 s; the rescan at 2.002 s sees it first. A
        // killed process is no daemon's parent: no hand-off.
        let handoffs = tracker.resync("ovs-vswitchd", &BTreeSet::from([200]), 2 * SEC + 2_000_000, true);
        assert!(handoffs.is_empty());
        let events = run(&mut tracker, vec![exec("ovs-vswitchd", 200, 2 * SEC + 1_000_000)]);
        assert_eq!(
            events,
            [
                (Start, "ovs-vswitchd".to_string(), "pid 200".to_string()),
                (
                    Restart,
                    "ovs-vswitchd".to_string(),
                    "started again 0.00 s after pid 100 was killed by SIGKILL".to_string()
                ),
            ]
        );
        let ovs = tracker.snapshot().processes.remove(0);
        assert_eq!((ovs.running, ovs.starts, ovs.restarts), (vec![200], 2, 1));
    }

    #[test]
    fn rescans_drop_vanished_processes_and_ignore_the_just_exited() {
        let mut tracker = tracker(&["ovs-vswitchd"]);
        run(&mut tracker, vec![exec("ovs-vswitchd", 100, SEC), exec("ovs-vswitchd", 101, SEC)]);
        run(&mut tracker, vec![exit("ovs-vswitchd", 100, 2 * SEC, SIGTERM)]);
        // 100 still shows in /proc (not yet a zombie); 101 vanished without a report.
        tracker.resync("ovs-vswitchd", &BTreeSet::from([100]), 2 * SEC + 1000, true);
        assert_eq!(tracker.snapshot().processes[0].running, Vec::<u32>::new());
        // The exit of 100 is still waiting for a start.
        let events = run(&mut tracker, vec![exec("ovs-vswitchd", 102, 3 * SEC)]);
        assert_eq!(events.len(), 2);
        // 101's late exit report still counts.
        let events = run(&mut tracker, vec![exit("ovs-vswitchd", 101, 4 * SEC, 0)]);
        assert_eq!(events[0].2, "pid 101 exited with code 0");
    }

    #[test]
    fn wait_statuses_decode() {
        let cases = [
            (0, ExitStatus::Exited(0), "exited with code 0"),
            (3 << 8, ExitStatus::Exited(3), "exited with code 3"),
            (255 << 8, ExitStatus::Exited(255), "exited with code 255"),
            (15, ExitStatus::Killed { signal: 15, core_dumped: false }, "killed by SIGTERM"),
            (9, ExitStatus::Killed { signal: 9, core_dumped: false }, "killed by SIGKILL"),
            (0x80 | 11, ExitStatus::Killed { signal: 11, core_dumped: true }, "killed by SIGSEGV (core dumped)"),
            (0x80 | 6, ExitStatus::Killed { signal: 6, core_dumped: true }, "killed by SIGABRT (core dumped)"),
            (40, ExitStatus::Killed { signal: 40, core_dumped: false }, "killed by signal 40"),
        ];
        for (status, expected, text) in cases {
            let decoded = ExitStatus::from_wait_status(status);
            assert_eq!(decoded, expected, "{status:#x}");
            assert_eq!(decoded.describe(), text, "{status:#x}");
        }
    }

    #[test]
    fn kernel_records_decode() {
        let event = ProcessEvent {
            ktime_ns: 0x0102_0304_0506_0708,
            kind: PROCESS_EVENT_EXIT,
            tgid: 4242,
            ppid: 1,
            exit_code: 9,
            comm: *b"ovs-vswitchd\0\0\0\0",
        };
        // The same bytes the kernel writes for the repr(C) struct.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&event.ktime_ns.to_ne_bytes());
        for field in [event.kind, event.tgid, event.ppid, event.exit_code] {
            bytes.extend_from_slice(&field.to_ne_bytes());
        }
        bytes.extend_from_slice(&event.comm);
        assert_eq!(bytes.len(), size_of::<ProcessEvent>());
        assert_eq!(std::mem::offset_of!(ProcessEvent, comm), 24);
        assert_eq!(std::mem::offset_of!(ProcessEvent, exit_code), 20);
        assert_eq!(decode_event(&bytes), Some(event));
        assert_eq!(decode_event(&bytes[..30]), None);

        let observation = Observation::from_kernel(&event, at(SEC)).unwrap();
        assert_eq!(observation.name, "ovs-vswitchd");
        assert_eq!(observation.pid, 4242);
        assert_eq!(observation.change, Change::Exit(ExitStatus::Killed { signal: 9, core_dumped: false }));
        let full = ProcessEvent { comm: *b"openshift-sdn-n\0", kind: PROCESS_EVENT_EXEC, ..event };
        assert_eq!(Observation::from_kernel(&full, at(SEC)).unwrap().name, "openshift-sdn-n");
        assert_eq!(Observation::from_kernel(&ProcessEvent { kind: 7, ..event }, at(SEC)), None);
    }

    #[test]
    fn stat_lines_parse() {
        assert_eq!(parse_stat(b"1234 (ovs-vswitchd) S 1 1234 1234 0 -1"), Some((&b"ovs-vswitchd"[..], b'S')));
        assert_eq!(parse_stat(b"7 (a) b (c)) Z 1 7"), Some((&b"a) b (c)"[..], b'Z')));
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x)"), None);
    }

    #[test]
    fn proc_scans_find_live_processes_by_name() {
        let root = std::env::temp_dir().join(format!("dm-proc-scan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (pid, stat) in [
            ("100", "100 (ovs-vswitchd) S 1 100"),
            ("101", "101 (ovs-vswitchd) Z 1 101"),
            ("102", "102 (ovsdb-server) R 1 102"),
            ("103", "103 (bash) S 1 103"),
            ("self", "104 (ovs-vswitchd) S 1 104"),
        ] {
            fs::create_dir_all(root.join(pid)).unwrap();
            fs::write(root.join(pid).join("stat"), stat).unwrap();
        }
        // A process that vanished between readdir and read.
        fs::create_dir_all(root.join("105")).unwrap();
        let names = vec!["ovs-vswitchd".to_string(), "ovsdb-server".to_string(), "flanneld".to_string()];
        let found = scan_proc(&root, &names).unwrap();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            found,
            BTreeMap::from([
                ("ovs-vswitchd".to_string(), BTreeSet::from([100])),
                ("ovsdb-server".to_string(), BTreeSet::from([102]))
            ])
        );
    }

    #[test]
    fn this_machine_proc_scan_finds_this_process() {
        let Ok(comm) = fs::read_to_string("/proc/self/comm") else { return };
        let comm = comm.trim_end_matches('\n').to_string();
        let found = scan_proc(Path::new(PROC), std::slice::from_ref(&comm)).unwrap();
        assert!(found.get(&comm).is_some_and(|pids| pids.contains(&std::process::id())), "{comm}: {found:?}");
    }

    /// The kernel side end to end: real tracepoints, real processes, real signals.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs root, BTF and tracefs: loads and attaches the kernel programs"]
    async fn kernel_reports_starts_exits_and_restarts() {
        use std::{process::Command, time::Instant};

        use nix::{
            sys::signal::{Signal, kill},
            unistd::Pid,
        };

        use crate::datapath::{Datapath, DatapathOptions, mounts};

        const NAME: &str = "dm-sdn-test";
        let root = std::env::temp_dir().join(format!("dm-sdn-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (sleep_dir, sh_dir) = (root.join("sleep"), root.join("sh"));
        fs::create_dir_all(&sleep_dir).unwrap();
        fs::create_dir_all(&sh_dir).unwrap();
        let sleep = sleep_dir.join(NAME);
        let sh = sh_dir.join(NAME);
        fs::copy("/bin/sleep", &sleep).unwrap();
        fs::copy("/bin/sh", &sh).unwrap();
        let signal = |pid: u32, signal: Signal| kill(Pid::from_raw(pid as i32), signal).unwrap();

        // Running before the agent: found by the start-up scan, no event.
        let mut early = Command::new(&sleep).arg("30").spawn().unwrap();
        let early_pid = early.id();

        mounts::ensure_mounted().unwrap();
        // With statistics on, to check the process programs report theirs.
        let mut datapath = Datapath::load(DatapathOptions { bpf_stats: true, ..DatapathOptions::default() }).unwrap();
        let probe = datapath.start_process_probe(&[NAME.to_string()]).unwrap();
        assert_eq!(datapath.probes().probes.get("sched_process"), Some(&Some("tracepoint".to_string())));
        let timeline = Arc::new(Timeline::new(100));
        let (watcher, task) =
            start(Some(probe), vec![NAME.to_string()], Duration::from_secs(60), Arc::clone(&timeline)).unwrap();
        let snapshot = watcher.snapshot();
        assert_eq!(snapshot.processes[0].running, [early_pid]);
        assert_eq!(snapshot.processes[0].starts, 0);

        async fn events_after(timeline: &Timeline, count: usize) -> Vec<(EventKind, String)> {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let events = timeline.events(None);
                if events.len() >= count || Instant::now() > deadline {
                    assert!(events.iter().all(|event| event.subject == NAME), "{events:?}");
                    return events.into_iter().map(|event| (event.kind, event.detail)).collect();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        fn downtime(detail: &str) -> f64 {
            let seconds = detail.strip_prefix("started again ").and_then(|rest| rest.split(' ').next());
            seconds.and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no downtime in {detail:?}"))
        }

        // Start, SIGTERM.
        let mut first = Command::new(&sleep).arg("30").spawn().unwrap();
        let a = first.id();
        events_after(&timeline, 1).await;
        signal(a, Signal::SIGTERM);
        let killed = Instant::now();
        first.wait().unwrap();
        events_after(&timeline, 2).await;
        tokio::time::sleep(Duration::from_millis(300)).await;

        // Restart, SIGKILL.
        let started = Instant::now();
        let mut second = Command::new(&sleep).arg("30").spawn().unwrap();
        let first_downtime = started.duration_since(killed).as_secs_f64();
        let b = second.id();
        events_after(&timeline, 4).await;
        signal(b, Signal::SIGKILL);
        let killed = Instant::now();
        second.wait().unwrap();
        events_after(&timeline, 5).await;
        tokio::time::sleep(Duration::from_millis(500)).await;

        // Restart as a shell that exits 3.
        let started = Instant::now();
        let mut third = Command::new(&sh).args(["-c", "exit 3"]).spawn().unwrap();
        let second_downtime = started.duration_since(killed).as_secs_f64();
        let c = third.id();
        assert_eq!(third.wait().unwrap().code(), Some(3));
        events_after(&timeline, 8).await;

        // The process found at start-up exits like any other.
        signal(early_pid, Signal::SIGTERM);
        early.wait().unwrap();
        let events = events_after(&timeline, 9).await;
        eprintln!("{events:#?}");

        use EventKind::{ProcessExit as Exit, ProcessRestart as Restart, ProcessStart as Start};
        let expected = [
            (Start, format!("pid {a}")),
            (Exit, format!("pid {a} killed by SIGTERM")),
            (Start, format!("pid {b}")),
            (Restart, format!("started again {:.2} s after pid {a} was killed by SIGTERM", downtime(&events[3].1))),
            (Exit, format!("pid {b} killed by SIGKILL")),
            (Start, format!("pid {c}")),
            (Restart, format!("started again {:.2} s after pid {b} was killed by SIGKILL", downtime(&events[6].1))),
            (Exit, format!("pid {c} exited with code 3")),
            (Exit, format!("pid {early_pid} killed by SIGTERM")),
        ];
        assert_eq!(events, expected);
        for (reported, measured) in
            [(downtime(&events[3].1), first_downtime), (downtime(&events[6].1), second_downtime)]
        {
            assert!((reported - measured).abs() < 0.25, "reported {reported:.3} s, measured {measured:.3} s");
        }

        let state = watcher.snapshot().processes.remove(0);
        assert_eq!(state.name, NAME);
        assert_eq!((state.running.len(), state.starts, state.exits, state.restarts), (0, 3, 4, 2));
        assert_eq!(state.last_exit_detail, Some(format!("pid {early_pid} killed by SIGTERM")));
        assert!(state.last_start.is_some() && state.last_exit.is_some());

        // Their run statistics come with the other programs'.
        let programs = datapath.read().programs;
        assert!(programs.iter().any(|p| p.program == "process_exec"), "{programs:?}");
        assert!(programs.iter().any(|p| p.program == "process_exit"), "{programs:?}");

        task.abort();
        fs::remove_dir_all(&root).unwrap();
    }
}
