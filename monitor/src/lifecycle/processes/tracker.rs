//! The pure bookkeeping of the watched processes: kernel reports and `/proc` scans in, state
//! (running pids, counters) and timeline events out. No I/O.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    time::Duration,
};

use monitor_common::{COMM_LEN, PROCESS_EVENT_EXEC, PROCESS_EVENT_EXIT, ProcessEvent};
use tracing::debug;

use super::{
    ProcessSnapshot, ProcessState,
    exit_status::ExitStatus,
    instances::{MAX_INSTANCES, comm_of},
};
use crate::lifecycle::{
    clock::{Stamp, rfc3339},
    timeline::{Event, EventKind},
};

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

/// A process found by a rescan that took over an exit: a daemon's child after its parent left.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Handoff {
    pub(super) name: String,
    pub(super) parent: u32,
    pub(super) child: u32,
}

/// A kernel report, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Observation {
    name: String,
    pub(super) pid: u32,
    stamp: Stamp,
    change: Change,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Exec,
    Exit(ExitStatus),
}

impl Observation {
    pub(super) fn from_kernel(event: &ProcessEvent, stamp: Stamp) -> Option<Self> {
        let change = match event.kind {
            PROCESS_EVENT_EXEC => Change::Exec,
            PROCESS_EVENT_EXIT => Change::Exit(ExitStatus::from_wait_status(event.exit_code)),
            _ => return None,
        };
        let end = event.comm.iter().position(|b| *b == 0).unwrap_or(COMM_LEN);
        let name = String::from_utf8_lossy(&event.comm[..end]).into_owned();
        Some(Self { name, pid: event.tgid, stamp, change })
    }

    /// The comm, or the instance name an exec's command line gave.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn is_exec(&self) -> bool {
        self.change == Change::Exec
    }

    /// Names this report by the process's instance (`comm(instance)`).
    pub(super) fn named(self, name: String) -> Self {
        Self { name, ..self }
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
pub(super) struct ProcessTracker {
    window_ns: u64,
    names: Vec<NameState>,
    /// Kernel reports of processes outside the agent's PID namespace (pods' processes), by comm.
    foreign: BTreeMap<String, u64>,
}

impl ProcessTracker {
    pub(super) fn new(names: &[String], restart_window: Duration) -> Self {
        Self {
            window_ns: u64::try_from(restart_window.as_nanos()).unwrap_or(u64::MAX),
            names: names.iter().map(|name| NameState::new(name)).collect(),
            foreign: BTreeMap::new(),
        }
    }

    /// Counts a report of `comm` from a process outside the agent's PID namespace (a pod's),
    /// which changes no state; true the first time for that comm (to log it once).
    pub(super) fn ignore_foreign(&mut self, comm: &str) -> bool {
        let count = self.foreign.entry(comm.to_string()).or_default();
        *count += 1;
        *count == 1
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|state| state.name == name)
    }

    /// The index of `name`; an instance (`comm(instance)`) of a watched comm gets its own
    /// state the first time it is seen (at most [`MAX_INSTANCES`] + 1 per comm).
    fn index_or_add(&mut self, name: &str) -> Option<usize> {
        if let Some(index) = self.index(name) {
            return Some(index);
        }
        let comm = comm_of(name);
        let instances = self.names.iter().filter(|state| comm_of(&state.name) == comm && state.name != comm).count();
        if comm == name || self.index(comm).is_none() || instances > MAX_INSTANCES {
            return None;
        }
        self.names.push(NameState::new(name));
        Some(self.names.len() - 1)
    }

    /// The names known for watched comm `comm`: itself and its instances seen so far.
    pub(super) fn names_of(&self, comm: &str) -> Vec<String> {
        self.names.iter().filter(|state| comm_of(&state.name) == comm).map(|state| state.name.clone()).collect()
    }

    /// Applies one kernel report; returns the timeline events it makes (oldest first). An
    /// exit report carries the comm only: it goes to the instance that runs (or just ran) the pid.
    pub(super) fn observe(&mut self, observation: Observation) -> Vec<Event> {
        let Observation { name, pid, stamp, change } = observation;
        let index = match change {
            Change::Exit(_) => self
                .names
                .iter()
                .position(|state| {
                    comm_of(&state.name) == name
                        && (state.running.contains_key(&pid) || state.exited.contains_key(&pid))
                })
                .or_else(|| self.index(&name)),
            Change::Exec => self.index_or_add(&name),
        };
        let Some(index) = index else {
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
    pub(super) fn resync(&mut self, name: &str, found: &BTreeSet<u32>, seen_ns: u64, take_over: bool) -> Vec<Handoff> {
        let window_ns = self.window_ns;
        let mut handoffs = Vec::new();
        let Some(index) = self.index_or_add(name) else { return handoffs };
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

    pub(super) fn snapshot(&self) -> ProcessSnapshot {
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
        ProcessSnapshot { processes, foreign_reports: self.foreign.clone() }
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

    fn tracker(names: &[&str]) -> ProcessTracker {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        ProcessTracker::new(&names, Duration::from_secs(60))
    }

    /// (kind, subject, detail) of every event, in order.
    fn run(tracker: &mut ProcessTracker, observations: Vec<Observation>) -> Vec<(EventKind, String, String)> {
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
    fn instances_of_one_comm_start_exit_and_restart_apart() {
        let mut tracker = tracker(&["ovsdb-server"]);
        // Three databases running at start-up, found by the scan under their instance names.
        for (name, pid) in [("ovsdb-server(conf)", 10), ("ovsdb-server(ovnnb_db)", 11), ("ovsdb-server(ovnsb_db)", 12)]
        {
            tracker.resync(name, &BTreeSet::from([pid]), SEC, false);
        }
        // The northbound database is killed (the kernel reports the comm) and started again
        // (the watcher named the exec from its command line).
        let events = run(
            &mut tracker,
            vec![exit("ovsdb-server", 11, 5 * SEC, SIGTERM), exec("ovsdb-server(ovnnb_db)", 13, 6 * SEC)],
        );
        assert_eq!(
            events,
            [
                (EventKind::ProcessExit, "ovsdb-server(ovnnb_db)".into(), "pid 11 killed by SIGTERM".into()),
                (EventKind::ProcessStart, "ovsdb-server(ovnnb_db)".into(), "pid 13".into()),
                (
                    EventKind::ProcessRestart,
                    "ovsdb-server(ovnnb_db)".into(),
                    "started again 1.00 s after pid 11 was killed by SIGTERM".into()
                ),
            ]
        );
        // A repeated exit report of the old pid is still recognised as one.
        assert!(run(&mut tracker, vec![exit("ovsdb-server", 11, 6 * SEC, SIGTERM)]).is_empty());
        let snapshot = tracker.snapshot();
        let names: Vec<&str> = snapshot.processes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ovsdb-server", "ovsdb-server(conf)", "ovsdb-server(ovnnb_db)", "ovsdb-server(ovnsb_db)"]);
        let nb = state(&snapshot, "ovsdb-server(ovnnb_db)");
        assert_eq!((nb.running.clone(), nb.exits, nb.restarts), (vec![13], 1, 1));
        assert_eq!(state(&snapshot, "ovsdb-server(conf)").restarts, 0);
        // Names of comms not watched never get a state; instances stay bounded.
        assert!(run(&mut tracker, vec![exec("ovn-northd(x)", 20, 7 * SEC)]).is_empty());
        for i in 0..2 * MAX_INSTANCES as u32 {
            run(&mut tracker, vec![exec(&format!("ovsdb-server(db{i})"), 100 + i, 8 * SEC)]);
        }
        assert_eq!(tracker.snapshot().processes.len(), 1 + MAX_INSTANCES + 1);
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
    fn kernel_records_become_observations() {
        let event = ProcessEvent {
            ktime_ns: 0x0102_0304_0506_0708,
            kind: PROCESS_EVENT_EXIT,
            tgid: 4242,
            ppid: 1,
            exit_code: 9,
            comm: *b"ovs-vswitchd\0\0\0\0",
            pid_ns: monitor_common::PID_NS_AGENTS,
            reserved: 0,
        };
        let observation = Observation::from_kernel(&event, at(SEC)).unwrap();
        assert_eq!(observation.name, "ovs-vswitchd");
        assert_eq!(observation.pid, 4242);
        assert_eq!(observation.change, Change::Exit(ExitStatus::Killed { signal: 9, core_dumped: false }));
        let full = ProcessEvent { comm: *b"openshift-sdn-n\0", kind: PROCESS_EVENT_EXEC, ..event };
        assert_eq!(Observation::from_kernel(&full, at(SEC)).unwrap().name, "openshift-sdn-n");
        assert_eq!(Observation::from_kernel(&ProcessEvent { kind: 7, ..event }, at(SEC)), None);
    }
}
