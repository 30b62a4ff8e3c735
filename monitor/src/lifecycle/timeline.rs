//! Every lifecycle signal on one clock: CNI config changes, SDN process starts and exits,
//! interface events. Each event carries the monotonic time (CLOCK_MONOTONIC, the clock of
//! `bpf_ktime_get_ns`) for ordering and the wall time for output. The timeline keeps the
//! most recent events in a bounded ring and logs each one; the incident engine reads the
//! window it needs with [`Timeline::between`].

use std::{collections::VecDeque, fmt, sync::Mutex};

use serde::{Serialize, Serializer};
use tracing::info;

use super::clock::{Stamp, rfc3339};
use crate::sync::lock;

/// The kinds of lifecycle event, as named in the JSON API and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    CniConfigAdded,
    CniConfigChanged,
    CniConfigRemoved,
    CniConfigInvalid,
    CniDefaultNetworkMissing,
    CniDefaultNetworkRestored,
    ProcessStart,
    ProcessExit,
    ProcessRestart,
    InterfaceAdded,
    InterfaceRemoved,
    InterfaceUp,
    InterfaceDown,
}

impl EventKind {
    pub const ALL: [EventKind; 13] = [
        Self::CniConfigAdded,
        Self::CniConfigChanged,
        Self::CniConfigRemoved,
        Self::CniConfigInvalid,
        Self::CniDefaultNetworkMissing,
        Self::CniDefaultNetworkRestored,
        Self::ProcessStart,
        Self::ProcessExit,
        Self::ProcessRestart,
        Self::InterfaceAdded,
        Self::InterfaceRemoved,
        Self::InterfaceUp,
        Self::InterfaceDown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CniConfigAdded => "cni_config_added",
            Self::CniConfigChanged => "cni_config_changed",
            Self::CniConfigRemoved => "cni_config_removed",
            Self::CniConfigInvalid => "cni_config_invalid",
            Self::CniDefaultNetworkMissing => "cni_default_network_missing",
            Self::CniDefaultNetworkRestored => "cni_default_network_restored",
            Self::ProcessStart => "process_start",
            Self::ProcessExit => "process_exit",
            Self::ProcessRestart => "process_restart",
            Self::InterfaceAdded => "interface_added",
            Self::InterfaceRemoved => "interface_removed",
            Self::InterfaceUp => "interface_up",
            Self::InterfaceDown => "interface_down",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn serialize_wall<S: Serializer>(stamp: &Stamp, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&rfc3339(stamp.wall))
}

/// One lifecycle event, as served by `/api/v1/events`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    #[serde(rename = "at", serialize_with = "serialize_wall")]
    pub stamp: Stamp,
    pub kind: EventKind,
    /// A file path, a process name or an interface name.
    pub subject: String,
    pub detail: String,
    /// Reported, but never a cause of an incident: a state found at start-up (e.g. no
    /// default network) rather than a change, or a daemon's parent exiting after it forked
    /// the process that carries on.
    #[serde(skip)]
    pub never_a_cause: bool,
}

impl Event {
    pub fn new(stamp: Stamp, kind: EventKind, subject: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { stamp, kind, subject: subject.into(), detail: detail.into(), never_a_cause: false }
    }

    /// Marks the event as a state found at start-up rather than a change.
    pub fn found_at_startup(mut self) -> Self {
        self.never_a_cause = true;
        self
    }

    /// Marks an exit as a daemon's hand-off to the child it forked, which carries on.
    pub fn daemon_handoff(mut self, child: u32) -> Self {
        self.detail.push_str(&format!("; its child pid {child} carries on (daemonized)"));
        self.never_a_cause = true;
        self
    }
}

/// The bounded, ordered record of lifecycle events.
pub struct Timeline {
    ring: Mutex<VecDeque<Event>>,
    capacity: usize,
    /// Events dropped from the front of the ring since start.
    evicted: Mutex<u64>,
    /// Events recorded since start, by kind.
    counts: Mutex<[u64; EventKind::ALL.len()]>,
}

impl Timeline {
    pub const DEFAULT_CAPACITY: usize = 10_000;

    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity,
            evicted: Mutex::new(0),
            counts: Mutex::new([0; EventKind::ALL.len()]),
        }
    }

    /// Records an event: one log line and a place in the ring (kept in monotonic order even
    /// when a source reports late).
    pub fn record(&self, event: Event) {
        info!(
            target: "datapath_monitor::event",
            at = %rfc3339(event.stamp.wall),
            kind = event.kind.as_str(),
            subject = %event.subject,
            detail = %event.detail,
            "lifecycle event"
        );
        if let Some(slot) = EventKind::ALL.iter().position(|kind| *kind == event.kind) {
            lock(&self.counts)[slot] += 1;
        }
        {
            let mut ring = lock(&self.ring);
            let position = ring.partition_point(|e| e.stamp.mono_ns <= event.stamp.mono_ns);
            ring.insert(position, event.clone());
            while ring.len() > self.capacity {
                ring.pop_front();
                *lock(&self.evicted) += 1;
            }
        }
    }

    /// Shorthand for `record(Event::new(Stamp::now(), ...))`.
    pub fn record_now(&self, kind: EventKind, subject: impl Into<String>, detail: impl Into<String>) {
        self.record(Event::new(Stamp::now(), kind, subject, detail));
    }

    /// Events at or after `since` (all when None), oldest first.
    pub fn events(&self, since: Option<jiff::Timestamp>) -> Vec<Event> {
        let ring = lock(&self.ring);
        ring.iter().filter(|e| since.is_none_or(|since| e.stamp.wall >= since)).cloned().collect()
    }

    /// One page of events, oldest first: with `since`, the first `limit` at or after it, and
    /// when more remain, the time of the next one (to ask `since` next: events that share that
    /// very time with the page's last come again, none is skipped); without, the newest `limit`.
    pub fn page(&self, since: Option<jiff::Timestamp>, limit: usize) -> (Vec<Event>, Option<jiff::Timestamp>) {
        let ring = lock(&self.ring);
        match since {
            None => (ring.iter().skip(ring.len().saturating_sub(limit)).cloned().collect(), None),
            Some(since) => {
                let mut page: Vec<Event> =
                    ring.iter().filter(|e| e.stamp.wall >= since).take(limit.saturating_add(1)).cloned().collect();
                let next = (page.len() > limit).then(|| page.pop().map(|e| e.stamp.wall)).flatten();
                (page, next)
            }
        }
    }

    /// Events with `from_mono_ns <= mono_ns <= to_mono_ns`, oldest first.
    pub fn between(&self, from_mono_ns: u64, to_mono_ns: u64) -> Vec<Event> {
        let ring = lock(&self.ring);
        let first = ring.partition_point(|e| e.stamp.mono_ns < from_mono_ns);
        ring.iter().skip(first).take_while(|e| e.stamp.mono_ns <= to_mono_ns).cloned().collect()
    }

    /// Events held in the ring now.
    pub fn len(&self) -> usize {
        lock(&self.ring).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events recorded since start (evicted ones included), for every kind.
    pub fn counts_by_kind(&self) -> Vec<(EventKind, u64)> {
        let counts = *lock(&self.counts);
        EventKind::ALL.into_iter().zip(counts).collect()
    }

    pub fn evicted(&self) -> u64 {
        *lock(&self.evicted)
    }
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(mono_ns: u64) -> Stamp {
        Stamp { mono_ns, wall: jiff::Timestamp::from_nanosecond(1_700_000_000_000_000_000 + mono_ns as i128).unwrap() }
    }

    #[test]
    fn ring_is_bounded_and_ordered_by_monotonic_time() {
        let timeline = Timeline::new(3);
        for (mono, subject) in [(10, "a"), (30, "c"), (20, "b"), (40, "d")] {
            timeline.record(Event::new(at(mono), EventKind::ProcessStart, subject, ""));
        }
        let subjects: Vec<String> = timeline.events(None).into_iter().map(|e| e.subject).collect();
        assert_eq!(subjects, ["b", "c", "d"]);
        let between: Vec<String> = timeline.between(20, 30).into_iter().map(|e| e.subject).collect();
        assert_eq!(between, ["b", "c"]);
        assert_eq!(timeline.evicted(), 1);
        assert_eq!(timeline.len(), 3);
        let counts = timeline.counts_by_kind();
        assert_eq!(counts.len(), EventKind::ALL.len());
        assert!(counts.contains(&(EventKind::ProcessStart, 4)));
    }

    #[test]
    fn since_filters_by_wall_time() {
        let timeline = Timeline::new(10);
        for mono in [1_000_000_000, 2_000_000_000, 3_000_000_000] {
            timeline.record(Event::new(at(mono), EventKind::InterfaceUp, "veth0", ""));
        }
        let since = at(2_000_000_000).wall;
        assert_eq!(timeline.events(Some(since)).len(), 2);
    }

    #[test]
    fn pages_walk_every_event_once_and_the_newest_come_without_since() {
        let timeline = Timeline::new(100);
        for second in 1..=7u64 {
            timeline.record(Event::new(at(second * 1_000_000_000), EventKind::InterfaceUp, second.to_string(), ""));
        }
        let subjects = |page: &[Event]| page.iter().map(|e| e.subject.clone()).collect::<Vec<_>>().join(",");
        let (newest, next) = timeline.page(None, 3);
        assert_eq!((subjects(&newest).as_str(), next), ("5,6,7", None));
        let mut since = Some(at(0).wall);
        let mut seen = Vec::new();
        while let Some(from) = since {
            let (page, next) = timeline.page(Some(from), 3);
            assert!(page.len() <= 3);
            seen.push(subjects(&page));
            since = next;
        }
        assert_eq!(seen, ["1,2,3", "4,5,6", "7"]);
        let (all, next) = timeline.page(Some(at(0).wall), 7);
        assert_eq!((all.len(), next), (7, None));
    }

    #[test]
    fn json_shape_matches_the_contract() {
        let event = Event::new(
            Stamp { mono_ns: 1, wall: "2026-01-12T20:58:46.23Z".parse().unwrap() },
            EventKind::CniConfigRemoved,
            "/etc/cni/net.d/80-openshift-network.conf",
            "deleted",
        );
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"at":"2026-01-12T20:58:46.230Z","kind":"cni_config_removed","subject":"/etc/cni/net.d/80-openshift-network.conf","detail":"deleted"}"#
        );
        for kind in EventKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }

    #[test]
    fn a_daemon_hand_off_says_so_and_is_never_a_cause() {
        let exit = Event::new(Stamp::now(), EventKind::ProcessExit, "ovs-vswitchd", "pid 10 exited with code 0");
        let handoff = exit.clone().daemon_handoff(11);
        assert!(!exit.never_a_cause && handoff.never_a_cause);
        assert_eq!(handoff.detail, "pid 10 exited with code 0; its child pid 11 carries on (daemonized)");
    }
}
