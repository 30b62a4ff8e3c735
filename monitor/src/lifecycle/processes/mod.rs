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

mod exit_status;
mod proc_scan;
mod tracker;

use std::{
    collections::BTreeSet,
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use monitor_common::ProcessEvent;
use serde::Serialize;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub use self::exit_status::ExitStatus;
use self::{
    proc_scan::{PROC, scan_proc},
    tracker::{Handoff, Observation, ProcessTracker},
};
use crate::{
    datapath::process_probe::{ProcessProbe, ProcessReports},
    lifecycle::{
        clock::{Stamp, monotonic_ns},
        timeline::{EventKind, Timeline},
    },
    sync::lock,
};

/// How often `/proc` is rescanned as a safety net while kernel reports flow.
const RESYNC_WITH_PROBE: Duration = Duration::from_secs(30);
/// How often `/proc` is rescanned when there are no kernel reports (state only, no events).
const RESYNC_WITHOUT_PROBE: Duration = Duration::from_secs(5);

/// Current state of the watched processes; cheap to clone and share.
#[derive(Clone)]
pub struct ProcessWatcher {
    tracker: Arc<Mutex<ProcessTracker>>,
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

/// Starts watching `names` (kernel comm names, as the configuration checked them). Scans /proc for the processes already running, then follows the kernel's
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
    for name in names {
        if !watched.contains(&name) {
            watched.push(name);
        }
    }
    let proc_root = PathBuf::from(PROC);
    let mut tracker = ProcessTracker::new(&watched, restart_window);
    let found = scan_proc(&proc_root, &watched).with_context(|| format!("scanning {PROC} for SDN processes"))?;
    let seen_ns = monotonic_ns();
    for name in &watched {
        tracker.resync(name, found.get(name).unwrap_or(&BTreeSet::new()), seen_ns, false);
    }
    let (reports, resync_every) = match probe {
        Some(probe) => {
            let reports = probe.into_reports().context("polling the process event ring buffer")?;
            (Some(reports), RESYNC_WITH_PROBE)
        }
        None => (None, RESYNC_WITHOUT_PROBE),
    };
    let tracker = Arc::new(Mutex::new(tracker));
    let task = tokio::spawn(follow(reports, Arc::clone(&tracker), timeline, proc_root, watched, resync_every));
    Ok((ProcessWatcher { tracker }, task))
}

/// The watcher's task: kernel reports as they come, /proc rescans as needed.
async fn follow(
    mut reports: Option<ProcessReports>,
    tracker: Arc<Mutex<ProcessTracker>>,
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
            batch = next_batch(&mut reports) => batch,
            _ = ticker.tick() => {
                rescan(&tracker, &proc_root, &names, false);
                continue;
            }
        };
        let batch = match batch {
            Ok(batch) => batch,
            Err(error) => {
                warn!(%error, "reading process events failed; SDN process events are no longer seen");
                reports = None;
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

/// The next reports of the kernel's process tracer; never, without one.
async fn next_batch(reports: &mut Option<ProcessReports>) -> io::Result<Vec<ProcessEvent>> {
    match reports {
        Some(reports) => reports.next_batch().await,
        None => std::future::pending().await,
    }
}

fn rescan(tracker: &Mutex<ProcessTracker>, proc_root: &Path, names: &[String], take_over: bool) -> Vec<Handoff> {
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

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::lifecycle::timeline::EventKind;

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
