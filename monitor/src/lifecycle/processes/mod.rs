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
//! Processes of one comm that are separate services (OVN-Kubernetes' three `ovsdb-server`s) are
//! named by instance, `ovsdb-server(ovnnb_db)`, from their command line (see [`instances`]).
//!
//! Reports alone do not see everything, so `/proc` fills the gaps: it gives the processes
//! already running at start-up (state, no events), the child a daemon leaves behind when its
//! parent exits after a fork (a rescan of the name after every exit), and, periodically,
//! processes that vanished or were renamed without a report (the ring buffer may overflow).

mod exit_status;
mod instances;
mod proc_scan;
mod tracker;

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use monitor_common::{COMM_LEN, PID_NS_OTHER, ProcessEvent};
use serde::Serialize;
use tokio::{sync::watch, task::JoinHandle};
use tracing::{debug, warn};

pub use self::{exit_status::ExitStatus, instances::comm_of};
use self::{
    instances::{InstanceNames, is_instanced},
    proc_scan::{PROC, own_pid_ns_depth, scan_proc},
    tracker::{Handoff, Observation, ProcessTracker},
};
use crate::{
    datapath::process_probe::{ProcessProbe, ProcessReports},
    lifecycle::{
        clock::{Stamp, monotonic_ns},
        sources::SourceHandle,
        timeline::{EventKind, Timeline},
    },
    sync::lock,
};

/// How often `/proc` is rescanned as a safety net while kernel reports flow.
const RESYNC_WITH_PROBE: Duration = Duration::from_secs(30);
/// How often `/proc` is rescanned when there are no kernel reports (state only, no events).
const RESYNC_WITHOUT_PROBE: Duration = Duration::from_secs(5);
/// The least time between two `/proc` walks after exits of watched processes.
const MIN_RESCAN_INTERVAL: Duration = Duration::from_millis(100);

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
    /// Kernel reports of watched names from processes outside the agent's PID namespace
    /// (pods' processes), by comm: counted, never taken as the node's SDN processes.
    pub foreign_reports: BTreeMap<String, u64>,
}

/// One watched process name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessState {
    /// Kernel comm name (at most 15 bytes), or `comm(instance)` for one instance of a comm
    /// that runs several services (`ovsdb-server(ovnnb_db)`).
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
/// periodically, so the running state stays right but no events are recorded. `lost_reports`
/// follows the total of reports the kernel could not queue (its ring buffer was full): each
/// rise is a failure of `health`, repaired by a /proc rescan at once.
///
/// Must be called inside a tokio runtime.
pub fn start(
    probe: Option<ProcessProbe>,
    names: Vec<String>,
    restart_window: Duration,
    timeline: Arc<Timeline>,
    health: SourceHandle,
    lost_reports: watch::Receiver<u64>,
) -> anyhow::Result<(ProcessWatcher, JoinHandle<()>)> {
    let mut watched: Vec<String> = Vec::new();
    for name in names {
        if !watched.contains(&name) {
            watched.push(name);
        }
    }
    let proc_root = PathBuf::from(PROC);
    let tracker = Mutex::new(ProcessTracker::new(&watched, restart_window));
    let mut instances = InstanceNames::default();
    let depth = own_pid_ns_depth(&proc_root);
    if depth.is_none() {
        warn!(
            "cannot read this process's PID namespace from {PROC}/self/status: /proc scans do not tell pods' processes apart"
        );
    }
    let found = scan_proc(&proc_root, &watched, depth).with_context(|| format!("scanning {PROC} for SDN processes"))?;
    apply_scan(&tracker, &mut instances, &proc_root, &watched, found, false);
    let (reports, resync_every) = match probe {
        Some(probe) => {
            let reports = probe.into_reports().context("polling the process event ring buffer")?;
            (Some(reports), RESYNC_WITH_PROBE)
        }
        None => (None, RESYNC_WITHOUT_PROBE),
    };
    let tracker = Arc::new(tracker);
    let scans = Arc::new(Scans { proc_root, depth });
    let follower = Follower { tracker: Arc::clone(&tracker), timeline, scans, names: watched, health };
    let task = tokio::spawn(follower.run(reports, instances, resync_every, Some(lost_reports)));
    Ok((ProcessWatcher { tracker }, task))
}

/// What the watcher's task works with.
struct Follower {
    tracker: Arc<Mutex<ProcessTracker>>,
    timeline: Arc<Timeline>,
    scans: Arc<Scans>,
    names: Vec<String>,
    health: SourceHandle,
}

impl Follower {
    /// The watcher's task: kernel reports as they come, /proc rescans as needed (after exits, at
    /// most one per [`MIN_RESCAN_INTERVAL`]; and at once when reports were lost).
    async fn run(
        self,
        mut reports: Option<ProcessReports>,
        mut instances: InstanceNames,
        resync_every: Duration,
        mut lost_reports: Option<watch::Receiver<u64>>,
    ) {
        if self.names.is_empty() {
            return;
        }
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + resync_every, resync_every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_exit_scan: Option<tokio::time::Instant> = None;
        let mut lost_seen = 0;
        loop {
            let batch = tokio::select! {
                batch = next_batch(&mut reports) => batch,
                _ = ticker.tick() => {
                    (instances, _) = rescan_off_runtime(&self.tracker, instances, &self.scans, self.names.clone(), false).await;
                    continue;
                }
                lost = lost_changed(&mut lost_reports) => {
                    if lost > lost_seen && reports.is_some() {
                        instances = self.repair(lost - lost_seen, &mut reports, instances, &mut last_exit_scan).await;
                    }
                    lost_seen = lost_seen.max(lost);
                    continue;
                }
            };
            match batch {
                Ok(batch) => instances = self.apply(batch, instances, &mut last_exit_scan).await,
                Err(error) => {
                    // /proc alone then keeps the running state right, without events.
                    self.health.down(format!("reading process events failed: {error}"));
                    reports = None;
                    ticker = tokio::time::interval(RESYNC_WITHOUT_PROBE);
                }
            }
        }
    }

    /// The kernel could not report `lost` starts or exits (its ring buffer was full): the
    /// source is down until what the ring still holds is applied and /proc rescanned, which
    /// makes the running processes right again (the lost starts and exits stay unrecorded).
    async fn repair(
        &self,
        lost: u64,
        reports: &mut Option<ProcessReports>,
        mut instances: InstanceNames,
        last_exit_scan: &mut Option<tokio::time::Instant>,
    ) -> InstanceNames {
        self.health.down(format!("{lost} process reports lost: the kernel's ring buffer was full; rescanning /proc"));
        if let Some(batch) = reports.as_mut().map(ProcessReports::drain_now) {
            instances = self.apply(batch, instances, last_exit_scan).await;
        }
        (instances, _) = rescan_off_runtime(&self.tracker, instances, &self.scans, self.names.clone(), false).await;
        self.health.up();
        instances
    }

    /// Applies one batch of kernel reports: state, and events into the timeline.
    async fn apply(
        &self,
        batch: Vec<ProcessEvent>,
        mut instances: InstanceNames,
        last_exit_scan: &mut Option<tokio::time::Instant>,
    ) -> InstanceNames {
        let Self { tracker, timeline, scans, .. } = self;
        let proc_root = &scans.proc_root;
        let mut exited: Vec<String> = Vec::new();
        let mut events = Vec::new();
        for raw in batch {
            // A pod may run a binary named like an SDN daemon, and kill it: only processes in
            // the agent's PID namespace (the host's) are the node's.
            if raw.pid_ns == PID_NS_OTHER {
                let comm = comm_name(&raw.comm);
                if lock(tracker).ignore_foreign(&comm) {
                    warn!(
                        process = comm,
                        pid = raw.tgid,
                        "a process named like a watched SDN process runs outside the host's PID namespace \
                         (in a pod): its starts and exits are counted as foreign reports and ignored"
                    );
                }
                continue;
            }
            let Some(observation) = Observation::from_kernel(&raw, Stamp::from_monotonic(raw.ktime_ns)) else {
                debug!(?raw, "unreadable process event");
                continue;
            };
            // An exec of an instanced comm is named by its command line, read now (outside
            // the lock); its exit finds the instance from the pid.
            let observation = if observation.is_exec() && is_instanced(observation.name()) {
                let name = instances.name(proc_root, observation.name(), observation.pid);
                observation.named(name)
            } else {
                observation
            };
            debug!(?observation, ppid = raw.ppid, "process event");
            let pid = observation.pid;
            for event in lock(tracker).observe(observation) {
                let comm = comm_of(&event.subject).to_string();
                if event.kind == EventKind::ProcessExit && !exited.contains(&comm) {
                    exited.push(comm);
                }
                events.push((pid, event));
            }
        }
        // Who carries on: a daemon's child that the exit left behind, or nobody. Its
        // parent's exit is recorded as a hand-off, never as a cause of an incident.
        let handoffs = if exited.is_empty() {
            Vec::new()
        } else {
            // A process that exits in a loop must not make /proc walks back to back.
            if let Some(last) = *last_exit_scan {
                tokio::time::sleep_until(last + MIN_RESCAN_INTERVAL).await;
            }
            *last_exit_scan = Some(tokio::time::Instant::now());
            let handoffs;
            (instances, handoffs) = rescan_off_runtime(tracker, instances, scans, exited, true).await;
            handoffs
        };
        for (pid, event) in events {
            let handoff = (event.kind == EventKind::ProcessExit)
                .then(|| handoffs.iter().find(|h| h.name == event.subject && h.parent == pid))
                .flatten();
            timeline.record(match handoff {
                Some(handoff) => event.daemon_handoff(handoff.child),
                None => event,
            });
        }
        instances
    }
}

/// A NUL-padded kernel comm as text.
fn comm_name(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|b| *b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// The next total of lost process reports; never, once its sender is gone.
async fn lost_changed(lost: &mut Option<watch::Receiver<u64>>) -> u64 {
    let Some(receiver) = lost else { return std::future::pending().await };
    if receiver.changed().await.is_err() {
        *lost = None;
        return std::future::pending().await;
    }
    *receiver.borrow_and_update()
}

/// The next reports of the kernel's process tracer; never, without one.
async fn next_batch(reports: &mut Option<ProcessReports>) -> io::Result<Vec<ProcessEvent>> {
    match reports {
        Some(reports) => reports.next_batch().await,
        None => std::future::pending().await,
    }
}

/// [`rescan`] on a blocking thread: a /proc walk reads a file per process, and must not hold
/// up the runtime that serves `/readyz` and `/metrics`.
async fn rescan_off_runtime(
    tracker: &Arc<Mutex<ProcessTracker>>,
    mut instances: InstanceNames,
    scans: &Arc<Scans>,
    comms: Vec<String>,
    take_over: bool,
) -> (InstanceNames, Vec<Handoff>) {
    let (tracker, scans) = (Arc::clone(tracker), Arc::clone(scans));
    let saved = instances.clone();
    let scan = tokio::task::spawn_blocking(move || {
        let handoffs = rescan(&tracker, &mut instances, &scans, &comms, take_over);
        (instances, handoffs)
    });
    match scan.await {
        Ok(done) => done,
        Err(error) => {
            warn!(%error, "the /proc scan for SDN processes failed");
            (saved, Vec::new())
        }
    }
}

/// Where /proc scans look, and the PID namespace depth of the processes they count (the
/// agent's own; None: unknown, all).
struct Scans {
    proc_root: PathBuf,
    depth: Option<usize>,
}

/// Rescans /proc for the processes of `comms` and makes the tracker match.
fn rescan(
    tracker: &Mutex<ProcessTracker>,
    instances: &mut InstanceNames,
    scans: &Scans,
    comms: &[String],
    take_over: bool,
) -> Vec<Handoff> {
    match scan_proc(&scans.proc_root, comms, scans.depth) {
        Ok(found) => apply_scan(tracker, instances, &scans.proc_root, comms, found, take_over),
        Err(error) => {
            warn!(%error, "scanning {} for SDN processes", scans.proc_root.display());
            Vec::new()
        }
    }
}

/// Applies a scan of `comms` (pids by comm): each pid under its instance name (command lines
/// read before the lock is taken), every known name of each comm resynced.
fn apply_scan(
    tracker: &Mutex<ProcessTracker>,
    instances: &mut InstanceNames,
    proc_root: &Path,
    comms: &[String],
    found: BTreeMap<String, BTreeSet<u32>>,
    take_over: bool,
) -> Vec<Handoff> {
    let seen_ns = monotonic_ns();
    let mut named: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (comm, pids) in found {
        for pid in pids {
            named.entry(instances.name(proc_root, &comm, pid)).or_default().insert(pid);
        }
    }
    let mut tracker = lock(tracker);
    let mut handoffs = Vec::new();
    let none = BTreeSet::new();
    for comm in comms {
        let mut names = tracker.names_of(comm);
        names.extend(
            named.keys().filter(|name| comm_of(name) == comm && !names.contains(name)).cloned().collect::<Vec<_>>(),
        );
        for name in names {
            handoffs.extend(tracker.resync(&name, named.get(&name).unwrap_or(&none), seen_ns, take_over));
        }
    }
    handoffs
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::lifecycle::{
        sources::{SDN_PROCESSES, Sources},
        timeline::EventKind,
    };

    /// A count of lost reports that never rises (its sender is gone).
    fn no_losses() -> watch::Receiver<u64> {
        watch::channel(0).1
    }

    fn test_health() -> SourceHandle {
        Sources::new().handle(SDN_PROCESSES)
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
        let (watcher, task) = start(
            Some(probe),
            vec![NAME.to_string()],
            Duration::from_secs(60),
            Arc::clone(&timeline),
            test_health(),
            no_losses(),
        )
        .unwrap();
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

    /// Real `ovsdb-server`s of two databases: the one killed and started again is named, the
    /// other is not touched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs root, BTF, tracefs and ovsdb-server (openvswitch-switch)"]
    async fn ovsdb_server_instances_are_told_apart() {
        use std::{
            process::{Child, Command, Stdio},
            time::Instant,
        };

        use nix::{
            sys::signal::{Signal, kill},
            unistd::Pid,
        };

        use crate::datapath::{Datapath, DatapathOptions, mounts};

        const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
        let root = std::env::temp_dir().join(format!("dm-ovsdb-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let (nb, sb) = ("dmtest_nb", "dmtest_sb");
        for db in [nb, sb] {
            let status = Command::new("ovsdb-tool")
                .args(["create", &root.join(format!("{db}.db")).to_string_lossy(), SCHEMA])
                .status()
                .expect("ovsdb-tool (openvswitch-switch)");
            assert!(status.success());
        }
        // In the foreground, as OVN-Kubernetes' containers run them.
        let serve = |db: &str| -> Child {
            Command::new("ovsdb-server")
                .arg(root.join(format!("{db}.db")))
                .arg(format!("--remote=punix:{}", root.join(format!("{db}.sock")).display()))
                .arg(format!("--unixctl={}", root.join(format!("{db}.ctl")).display()))
                .arg(format!("--log-file={}", root.join(format!("{db}.log")).display()))
                .args(["--no-chdir", "-vconsole:off"])
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        };
        let sb_server = serve(sb);

        mounts::ensure_mounted().unwrap();
        let mut datapath = Datapath::load(DatapathOptions::default()).unwrap();
        let probe = datapath.start_process_probe(&["ovsdb-server".to_string()]).unwrap();
        let timeline = Arc::new(Timeline::new(100));
        let (watcher, task) = start(
            Some(probe),
            vec!["ovsdb-server".to_string()],
            Duration::from_secs(60),
            Arc::clone(&timeline),
            test_health(),
            no_losses(),
        )
        .unwrap();
        let names = |watcher: &ProcessWatcher| -> Vec<String> {
            watcher.snapshot().processes.into_iter().map(|p| p.name).collect()
        };
        assert!(names(&watcher).contains(&format!("ovsdb-server({sb})")), "{:?}", names(&watcher));

        async fn events_of(timeline: &Timeline, subject: &str, count: usize) -> Vec<(EventKind, String)> {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let events: Vec<_> = timeline
                    .events(None)
                    .into_iter()
                    .filter(|event| event.subject == subject)
                    .map(|event| (event.kind, event.detail))
                    .collect();
                if events.len() >= count || Instant::now() > deadline {
                    return events;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        let subject = format!("ovsdb-server({nb})");
        let mut first = serve(nb);
        let a = first.id();
        events_of(&timeline, &subject, 1).await;
        kill(Pid::from_raw(a as i32), Signal::SIGTERM).unwrap();
        first.wait().unwrap();
        events_of(&timeline, &subject, 2).await;
        let second = serve(nb);
        let b = second.id();
        let events = events_of(&timeline, &subject, 4).await;
        eprintln!("{:#?}", timeline.events(None));
        assert_eq!(
            events[..3],
            [
                (EventKind::ProcessStart, format!("pid {a}")),
                (EventKind::ProcessExit, format!("pid {a} killed by SIGTERM")),
                (EventKind::ProcessStart, format!("pid {b}")),
            ]
        );
        assert_eq!(events[3].0, EventKind::ProcessRestart);
        assert!(events[3].1.ends_with(&format!("after pid {a} was killed by SIGTERM")), "{:?}", events[3]);
        // The other database's server: no event, still running under its own name.
        let sb_events = events_of(&timeline, &format!("ovsdb-server({sb})"), 1).await;
        assert!(sb_events.is_empty(), "{sb_events:?}");
        let snapshot = watcher.snapshot();
        let sb_state = snapshot.processes.iter().find(|p| p.name == format!("ovsdb-server({sb})")).unwrap();
        assert_eq!(sb_state.running, [sb_server.id()]);
        let nb_state = snapshot.processes.iter().find(|p| p.name == subject).unwrap();
        assert_eq!((nb_state.running.clone(), nb_state.restarts), (vec![b], 1));

        for mut child in [second, sb_server] {
            let _ = child.kill();
            let _ = child.wait();
        }
        task.abort();
        fs::remove_dir_all(&root).unwrap();
    }
}
