//! Attribution: which lifecycle events near an incident's start most likely caused it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{message::round, record::Cause};
use crate::lifecycle::{
    clock::{Stamp, rfc3339},
    timeline::{Event, EventKind},
};

/// How likely each kind of event is to break pod traffic.
pub fn kind_weight(kind: EventKind) -> f64 {
    match kind {
        EventKind::ProcessRestart | EventKind::ProcessExit => 1.0,
        EventKind::CniDefaultNetworkMissing => 0.9,
        EventKind::InterfaceDown | EventKind::InterfaceRemoved => 0.8,
        EventKind::CniConfigRemoved => 0.7,
        EventKind::CniConfigChanged | EventKind::CniConfigInvalid => 0.6,
        EventKind::ProcessStart => 0.5,
        EventKind::CniConfigAdded | EventKind::InterfaceAdded => 0.3,
        EventKind::InterfaceUp => 0.2,
        EventKind::CniDefaultNetworkRestored => 0.1,
    }
}

/// Events up to this long after the detected start count as at the start: the start is only
/// as precise as the sample interval, and a silence starts at the last packet seen.
const AT_START_SECONDS: f64 = 1.0;

/// Seconds over which closeness in time decays by a factor e.
const CLOSENESS_SECONDS: f64 = 10.0;

/// Ranks lifecycle events as causes of an incident that started at `start`.
///
/// Candidates are the events from `lookback` before the start until the end (the caller
/// passes those), except states found at agent start-up (those are not changes) and a
/// daemon's parent exiting after its fork (the daemon carries on). Interface events count only for the incident's own interfaces and for
/// non-pod interfaces (bridges, tunnels), not for other pods' veths. For each subject only
/// its strongest event is kept, and a process restart stands for the exit and start it
/// pairs (one cause, timed at the exit: when the process went down).
/// `confidence = kind weight × closeness`, where closeness is `e^(−|offset|/10 s)` for an
/// event up to 1 s after the start or any time before it, and `0.5 × e^(−offset/10 s)` later
/// (an event well into the disruption is more likely a consequence or a fix). Sorted by confidence, then
/// closeness. No candidate → empty: a cause is never invented.
pub fn attribute(
    events: &[Event],
    start: Stamp,
    incident_interfaces: &BTreeSet<String>,
    pod_veths: &HashMap<String, Option<u64>>,
) -> Vec<Cause> {
    let mut best: BTreeMap<(u8, String), Cause> = BTreeMap::new();
    for event in events.iter().filter(|e| !e.never_a_cause) {
        // A restart is timed at the exit it follows: that is when the process went down.
        let stamp = match event.kind {
            EventKind::ProcessRestart => events
                .iter()
                .filter(|e| {
                    e.kind == EventKind::ProcessExit
                        && e.subject == event.subject
                        && e.stamp.mono_ns <= event.stamp.mono_ns
                })
                .map(|e| e.stamp)
                .next_back()
                .unwrap_or(event.stamp),
            _ => event.stamp,
        };
        let family = match event.kind {
            EventKind::ProcessStart | EventKind::ProcessExit | EventKind::ProcessRestart => 0,
            EventKind::InterfaceAdded
            | EventKind::InterfaceRemoved
            | EventKind::InterfaceUp
            | EventKind::InterfaceDown => {
                if pod_veths.contains_key(&event.subject) && !incident_interfaces.contains(&event.subject) {
                    continue;
                }
                1
            }
            _ => 2,
        };
        let offset = start.seconds_until(&stamp);
        let closeness = if offset <= AT_START_SECONDS {
            (-offset.abs() / CLOSENESS_SECONDS).exp()
        } else {
            0.5 * (-offset / CLOSENESS_SECONDS).exp()
        };
        let cause = Cause {
            kind: event.kind.as_str().to_string(),
            subject: event.subject.clone(),
            at: rfc3339(stamp.wall),
            offset_seconds: round(offset, 1_000.0),
            confidence: round(kind_weight(event.kind) * closeness, 100.0),
            detail: event.detail.clone(),
        };
        let key = (family, event.subject.clone());
        // Per subject the strongest event; a restart stands for its exit and start.
        let rank = |c: &Cause| (c.kind == "process_restart", c.confidence);
        let stronger = best.get(&key).is_none_or(|kept| {
            let (new, old) = (rank(&cause), rank(kept));
            (new.0 && !old.0)
                || (new.0 == old.0 && new.1 > old.1)
                || (new == old && cause.offset_seconds.abs() < kept.offset_seconds.abs())
        });
        if stronger {
            best.insert(key, cause);
        }
    }
    let mut causes: Vec<Cause> = best.into_values().collect();
    causes.sort_by(|a, b| {
        b.confidence.total_cmp(&a.confidence).then(a.offset_seconds.abs().total_cmp(&b.offset_seconds.abs()))
    });
    causes
}
