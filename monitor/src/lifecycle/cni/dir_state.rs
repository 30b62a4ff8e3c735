//! One CNI config dir as a pure state machine: facts about its entries in, lifecycle events
//! and change counters out; its snapshot for `/api/v1/lifecycle` and the metrics.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
};

use serde::{Serialize, Serializer};

use super::rules::{FileFacts, Verdict};
use crate::lifecycle::{
    clock::Stamp,
    timeline::{Event, EventKind},
};

/// At most this many distinct `file` label values per dir in the change counters; changes of
/// further files are counted under [`OTHER_FILE_LABEL`]. Keeps the metric's cardinality
/// bounded when something floods a dir with files.
pub const MAX_FILE_LABELS: usize = 256;

/// The `file` label of changes beyond [`MAX_FILE_LABELS`] distinct files.
pub const OTHER_FILE_LABEL: &str = "_other";

/// A counted kind of change (the `change` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Change {
    Added,
    Changed,
    Removed,
    Invalid,
}

impl Change {
    fn as_str(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Changed => "changed",
            Self::Removed => "removed",
            Self::Invalid => "invalid",
        }
    }
}

/// How a file went away, for the removed event's detail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    Deleted,
    MovedAway,
    /// Found missing (e.g. by a rescan): how is unknown.
    Gone,
    /// Its whole directory went.
    DirGone,
}

impl Removal {
    fn detail(self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::MovedAway => "moved away",
            Self::Gone => "gone",
            Self::DirGone => "directory gone",
        }
    }
}

fn network_detail(network: &str) -> String {
    if network.is_empty() { "unnamed network".to_string() } else { format!("network {network:?}") }
}

/// One CNI config dir: its files, default network and change counters; pure (no I/O).
pub(crate) struct DirState {
    dir: PathBuf,
    /// Whether the start-up listing has been applied.
    started: bool,
    exists: bool,
    seen: bool,
    files: BTreeMap<OsString, FileFacts>,
    /// The default network last reported: (file name, network name).
    default: Option<(OsString, String)>,
    file_labels: BTreeSet<String>,
    changes: BTreeMap<(String, Change), u64>,
}

impl DirState {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            started: false,
            exists: false,
            seen: false,
            files: BTreeMap::new(),
            default: None,
            file_labels: BTreeSet::new(),
            changes: BTreeMap::new(),
        }
    }

    /// The dir, absolute and normalized.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// What is known of entry `name`.
    pub(super) fn known(&self, name: &OsStr) -> Option<&FileFacts> {
        self.files.get(name)
    }

    fn subject(&self, name: &OsStr) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// Applies a full listing of the dir (None: the dir does not exist). The first listing is
    /// the start-up state.
    pub(crate) fn apply_listing(&mut self, listing: Option<BTreeMap<OsString, FileFacts>>, stamp: Stamp) -> Vec<Event> {
        let startup = !self.started;
        self.started = true;
        self.exists = listing.is_some();
        self.seen |= self.exists;
        let removal = if self.exists { Removal::Gone } else { Removal::DirGone };
        let mut listing = listing.unwrap_or_default();
        let names: BTreeSet<OsString> = self.files.keys().chain(listing.keys()).cloned().collect();
        let mut events = Vec::new();
        for name in names {
            let facts = listing.remove(&name);
            self.update_file(&name, facts, removal, startup, stamp, &mut events);
        }
        self.update_default(startup, removal, stamp, &mut events);
        events
    }

    /// Applies what is now at entry `name` (None: nothing); `removal` says how it went, if gone.
    pub(crate) fn apply_entry(
        &mut self,
        name: &OsStr,
        facts: Option<FileFacts>,
        removal: Removal,
        stamp: Stamp,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        self.update_file(name, facts, removal, false, stamp, &mut events);
        self.update_default(false, removal, stamp, &mut events);
        events
    }

    fn update_file(
        &mut self,
        name: &OsStr,
        facts: Option<FileFacts>,
        removal: Removal,
        startup: bool,
        stamp: Stamp,
        events: &mut Vec<Event>,
    ) {
        let old = self.files.get(name);
        let outcome = match (old, &facts) {
            (None, None) => None,
            (Some(_), None) => Some((EventKind::CniConfigRemoved, Change::Removed, removal.detail().to_string())),
            (Some(old), Some(new)) if old == new => None,
            (_, Some(FileFacts { verdict: Verdict::Invalid { reason }, .. })) => {
                Some((EventKind::CniConfigInvalid, Change::Invalid, reason.clone()))
            }
            (
                Some(FileFacts { verdict: Verdict::Valid { network: was }, .. }),
                Some(FileFacts { verdict: Verdict::Valid { network }, .. }),
            ) => {
                let detail = if was == network {
                    network_detail(network)
                } else {
                    format!("{} (was {})", network_detail(network), network_detail(was))
                };
                Some((EventKind::CniConfigChanged, Change::Changed, detail))
            }
            (None, Some(_)) if startup => None,
            (_, Some(FileFacts { verdict: Verdict::Valid { network }, .. })) => {
                Some((EventKind::CniConfigAdded, Change::Added, network_detail(network)))
            }
        };
        if let Some((kind, change, detail)) = outcome {
            self.count(name, change);
            let event = Event::new(stamp, kind, self.subject(name), detail);
            events.push(if startup { event.found_at_startup() } else { event });
        }
        match facts {
            Some(facts) => self.files.insert(name.to_owned(), facts),
            None => self.files.remove(name),
        };
    }

    fn update_default(&mut self, startup: bool, removal: Removal, stamp: Stamp, events: &mut Vec<Event>) {
        let current = self.files.iter().find_map(|(name, facts)| match &facts.verdict {
            Verdict::Valid { network } => Some((name.clone(), network.clone())),
            Verdict::Invalid { .. } => None,
        });
        match (&self.default, &current) {
            (Some((previous, _)), None) => {
                let file = previous.to_string_lossy();
                let what = match self.files.get(previous) {
                    _ if !self.exists => "directory gone".to_string(),
                    None if removal == Removal::MovedAway => format!("{file} moved away"),
                    None => format!("{file} removed"),
                    Some(FileFacts { verdict: Verdict::Invalid { reason }, .. }) => format!("{file} invalid: {reason}"),
                    Some(_) => format!("{file} changed"),
                };
                let detail = format!("no valid network config in {} ({what})", self.dir.display());
                events.push(Event::new(stamp, EventKind::CniDefaultNetworkMissing, self.subject(previous), detail));
            }
            (None, Some((name, network))) if !startup => {
                events.push(Event::new(
                    stamp,
                    EventKind::CniDefaultNetworkRestored,
                    self.subject(name),
                    network_detail(network),
                ));
            }
            (None, None) if startup && self.exists => {
                let detail = format!("no valid network config in {} at start-up", self.dir.display());
                let event = Event::new(stamp, EventKind::CniDefaultNetworkMissing, self.dir.to_string_lossy(), detail);
                events.push(event.found_at_startup());
            }
            _ => {}
        }
        self.default = current;
    }

    fn count(&mut self, name: &OsStr, change: Change) {
        let file = name.to_string_lossy().into_owned();
        let label = if self.file_labels.contains(&file) || self.file_labels.len() < MAX_FILE_LABELS {
            self.file_labels.insert(file.clone());
            file
        } else {
            OTHER_FILE_LABEL.to_string()
        };
        *self.changes.entry((label, change)).or_default() += 1;
    }

    pub(super) fn snapshot(&self) -> CniDirSnapshot {
        CniDirSnapshot {
            dir: self.dir.clone(),
            exists: self.exists,
            seen: self.seen,
            default_network: self.default.as_ref().map(|(file, network)| CniDefault {
                file: file.to_string_lossy().into_owned(),
                network: network.clone(),
            }),
            files: self
                .files
                .iter()
                .map(|(file, facts)| {
                    let file = file.to_string_lossy().into_owned();
                    match &facts.verdict {
                        Verdict::Valid { network } => CniFileSnapshot {
                            file,
                            valid: true,
                            network: (!network.is_empty()).then(|| network.clone()),
                            detail: None,
                        },
                        Verdict::Invalid { reason } => {
                            CniFileSnapshot { file, valid: false, network: None, detail: Some(reason.clone()) }
                        }
                    }
                })
                .collect(),
            changes: self
                .changes
                .iter()
                .map(|((file, change), count)| CniChangeCount {
                    file: file.clone(),
                    change: change.as_str(),
                    count: *count,
                })
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshot (for /metrics and JSON)

fn lossy_path<S: Serializer>(path: &Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// The state of every watched CNI config dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CniSnapshot {
    pub dirs: Vec<CniDirSnapshot>,
}

/// One CNI config dir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CniDirSnapshot {
    /// The dir, absolute and normalized (see [`crate::lifecycle::dirwatch::DirWatcher::dirs`]).
    #[serde(serialize_with = "lossy_path")]
    pub dir: PathBuf,
    pub exists: bool,
    /// Whether this dir has been seen existing since the agent started (gauge exported only then).
    pub seen: bool,
    /// The first valid config by file name, if any.
    pub default_network: Option<CniDefault>,
    /// Every config entry (by name, byte order), valid or not.
    pub files: Vec<CniFileSnapshot>,
    /// Counter `datapath_cni_config_changes_total{dir,file,change}`; change is one of
    /// added|changed|removed|invalid. At most [`MAX_FILE_LABELS`] distinct `file` values per
    /// dir, further files' changes are counted under [`OTHER_FILE_LABEL`]. Counts of files
    /// since removed are kept (counters never go down).
    pub changes: Vec<CniChangeCount>,
}

/// A dir's default network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CniDefault {
    /// File name within the dir.
    pub file: String,
    /// Network name ("" when a `.conf` has no name).
    pub network: String,
}

/// One config entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CniFileSnapshot {
    /// File name within the dir.
    pub file: String,
    pub valid: bool,
    /// Network name of a valid config (None when invalid or unnamed).
    pub network: Option<String>,
    /// Why it is invalid.
    pub detail: Option<String>,
}

/// One counter value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CniChangeCount {
    pub file: String,
    pub change: &'static str,
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::{
        super::rules::fixtures::{invalid, valid},
        *,
    };

    enum Step {
        /// A full listing (None: the dir is gone).
        List(Option<Vec<(&'static str, FileFacts)>>),
        /// One entry's facts now.
        Entry(&'static str, Option<FileFacts>, Removal),
    }

    /// Expected events: (kind, subject relative to the dir ("" = the dir), detail).
    type Expect = Vec<(EventKind, &'static str, &'static str)>;

    fn at(step: usize) -> Stamp {
        Stamp::from_monotonic(1_000_000 + step as u64)
    }

    fn run(case: &str, steps: Vec<(Step, Expect)>) -> DirState {
        let dir = PathBuf::from("/etc/cni/net.d");
        let mut state = DirState::new(dir.clone());
        for (index, (step, expected)) in steps.into_iter().enumerate() {
            let events = match step {
                Step::List(listing) => state.apply_listing(
                    listing.map(|files| files.into_iter().map(|(name, facts)| (OsString::from(name), facts)).collect()),
                    at(index),
                ),
                Step::Entry(name, facts, removal) => state.apply_entry(OsStr::new(name), facts, removal, at(index)),
            };
            let got: Vec<(EventKind, String, String)> =
                events.iter().map(|e| (e.kind, e.subject.clone(), e.detail.clone())).collect();
            let want: Vec<(EventKind, String, String)> = expected
                .iter()
                .map(|(kind, file, detail)| {
                    let subject = if file.is_empty() { dir.clone() } else { dir.join(file) };
                    (*kind, subject.to_string_lossy().into_owned(), detail.to_string())
                })
                .collect();
            assert_eq!(got, want, "{case}: step {index}");
            assert!(events.iter().all(|e| e.stamp.mono_ns == at(index).mono_ns), "{case}: stamps");
        }
        state
    }

    fn default_file(state: &DirState) -> Option<String> {
        state.snapshot().default_network.map(|default| default.file)
    }

    use EventKind::{
        CniConfigAdded as Added, CniConfigChanged as Changed, CniConfigInvalid as Invalid, CniConfigRemoved as Removed,
        CniDefaultNetworkMissing as Missing, CniDefaultNetworkRestored as Restored,
    };

    const NET_A: &str = "network \"a\"";

    #[test]
    fn start_up_cases() {
        let state =
            run("existing valid config", vec![(Step::List(Some(vec![("10-a.conflist", valid("a", 1))])), vec![])]);
        assert_eq!(default_file(&state).as_deref(), Some("10-a.conflist"));
        let snapshot = state.snapshot();
        assert!(snapshot.exists && snapshot.seen);

        run(
            "empty dir",
            vec![(
                Step::List(Some(vec![])),
                vec![(Missing, "", "no valid network config in /etc/cni/net.d at start-up")],
            )],
        );
        let state = run("no dir", vec![(Step::List(None), vec![])]);
        let snapshot = state.snapshot();
        assert!(!snapshot.exists && !snapshot.seen);
        run(
            "only an invalid file",
            vec![(
                Step::List(Some(vec![("05-bad.conf", invalid("missing type", 1))])),
                vec![
                    (Invalid, "05-bad.conf", "missing type"),
                    (Missing, "", "no valid network config in /etc/cni/net.d at start-up"),
                ],
            )],
        );
        run(
            "invalid file before a valid one",
            vec![(
                Step::List(Some(vec![("05-bad.conf", invalid("missing type", 1)), ("10-a.conflist", valid("a", 1))])),
                vec![(Invalid, "05-bad.conf", "missing type")],
            )],
        );
        // A dir that appears later without a valid config never had a default: not "missing".
        run(
            "dir appears later",
            vec![
                (Step::List(None), vec![]),
                (Step::List(Some(vec![])), vec![]),
                (
                    Step::Entry("10-a.conflist", Some(valid("a", 1)), Removal::Gone),
                    vec![(Added, "10-a.conflist", NET_A), (Restored, "10-a.conflist", NET_A)],
                ),
            ],
        );
    }

    #[test]
    fn file_lifecycle() {
        let state = run(
            "add, touch, change, garbage, remove",
            vec![
                (
                    Step::List(Some(vec![])),
                    vec![(Missing, "", "no valid network config in /etc/cni/net.d at start-up")],
                ),
                (
                    Step::Entry("10-a.conflist", Some(valid("a", 1)), Removal::Gone),
                    vec![(Added, "10-a.conflist", NET_A), (Restored, "10-a.conflist", NET_A)],
                ),
                (Step::Entry("10-a.conflist", Some(valid("a", 1)), Removal::Gone), vec![]),
                (
                    Step::Entry("10-a.conflist", Some(valid("a", 2)), Removal::Gone),
                    vec![(Changed, "10-a.conflist", NET_A)],
                ),
                (
                    Step::Entry("10-a.conflist", Some(valid("b", 3)), Removal::Gone),
                    vec![(Changed, "10-a.conflist", "network \"b\" (was network \"a\")")],
                ),
                (
                    Step::Entry("05-bad.conf", Some(invalid("not valid JSON: x", 4)), Removal::Gone),
                    vec![(Invalid, "05-bad.conf", "not valid JSON: x")],
                ),
                // Same reason, same content: nothing; different content: again.
                (Step::Entry("05-bad.conf", Some(invalid("not valid JSON: x", 4)), Removal::Gone), vec![]),
                (
                    Step::Entry("05-bad.conf", Some(invalid("not valid JSON: x", 5)), Removal::Gone),
                    vec![(Invalid, "05-bad.conf", "not valid JSON: x")],
                ),
                // Unread content (e.g. too big): same reason is nothing new.
                (
                    Step::Entry("05-bad.conf", Some(FileFacts::invalid("over 1 MiB (2000000 bytes)")), Removal::Gone),
                    vec![(Invalid, "05-bad.conf", "over 1 MiB (2000000 bytes)")],
                ),
                (
                    Step::Entry("05-bad.conf", Some(FileFacts::invalid("over 1 MiB (2000000 bytes)")), Removal::Gone),
                    vec![],
                ),
                (Step::Entry("05-bad.conf", None, Removal::Deleted), vec![(Removed, "05-bad.conf", "deleted")]),
                (Step::Entry("05-bad.conf", None, Removal::Deleted), vec![]),
                (
                    Step::Entry("10-a.conflist", None, Removal::MovedAway),
                    vec![
                        (Removed, "10-a.conflist", "moved away"),
                        (
                            Missing,
                            "10-a.conflist",
                            "no valid network config in /etc/cni/net.d (10-a.conflist moved away)",
                        ),
                    ],
                ),
            ],
        );
        let changes: Vec<(String, &str, u64)> =
            state.snapshot().changes.into_iter().map(|c| (c.file, c.change, c.count)).collect();
        assert_eq!(
            changes,
            [
                ("05-bad.conf".to_string(), "removed", 1),
                ("05-bad.conf".to_string(), "invalid", 3),
                ("10-a.conflist".to_string(), "added", 1),
                ("10-a.conflist".to_string(), "changed", 2),
                ("10-a.conflist".to_string(), "removed", 1),
            ]
        );
    }

    #[test]
    fn default_network_transitions() {
        let state = run(
            "invalid before valid never hides it; switching is no missing/restored",
            vec![
                (Step::List(Some(vec![("10-a.conflist", valid("a", 1)), ("20-b.conflist", valid("b", 1))])), vec![]),
                (
                    Step::Entry("05-bad.conf", Some(invalid("missing type", 1)), Removal::Gone),
                    vec![(Invalid, "05-bad.conf", "missing type")],
                ),
                (Step::Entry("10-a.conflist", None, Removal::Deleted), vec![(Removed, "10-a.conflist", "deleted")]),
            ],
        );
        assert_eq!(default_file(&state).as_deref(), Some("20-b.conflist"));

        let state = run(
            "invalid becomes valid: added, and the default switches to it",
            vec![
                (
                    Step::List(Some(vec![("05-x.conf", invalid("missing type", 1)), ("10-a.conflist", valid("a", 1))])),
                    vec![(Invalid, "05-x.conf", "missing type")],
                ),
                (
                    Step::Entry("05-x.conf", Some(valid("x", 2)), Removal::Gone),
                    vec![(Added, "05-x.conf", "network \"x\"")],
                ),
            ],
        );
        assert_eq!(default_file(&state).as_deref(), Some("05-x.conf"));

        run(
            "the only valid file becomes invalid, then valid again",
            vec![
                (Step::List(Some(vec![("10-a.conflist", valid("a", 1))])), vec![]),
                (
                    Step::Entry("10-a.conflist", Some(invalid("empty plugins", 2)), Removal::Gone),
                    vec![
                        (Invalid, "10-a.conflist", "empty plugins"),
                        (
                            Missing,
                            "10-a.conflist",
                            "no valid network config in /etc/cni/net.d (10-a.conflist invalid: empty plugins)",
                        ),
                    ],
                ),
                (
                    Step::Entry("10-a.conflist", Some(valid("a", 1)), Removal::Gone),
                    vec![(Added, "10-a.conflist", NET_A), (Restored, "10-a.conflist", NET_A)],
                ),
                (
                    Step::Entry("10-a.conflist", None, Removal::Deleted),
                    vec![
                        (Removed, "10-a.conflist", "deleted"),
                        (Missing, "10-a.conflist", "no valid network config in /etc/cni/net.d (10-a.conflist removed)"),
                    ],
                ),
                (
                    Step::Entry("20-c.conf", Some(FileFacts::invalid("symlink loop")), Removal::Gone),
                    vec![(Invalid, "20-c.conf", "symlink loop")],
                ),
                (
                    Step::Entry("30-u.conf", Some(valid("", 3)), Removal::Gone),
                    vec![(Added, "30-u.conf", "unnamed network"), (Restored, "30-u.conf", "unnamed network")],
                ),
            ],
        );
    }

    #[test]
    fn rescans_and_a_dir_that_goes() {
        let state = run(
            "rescan diff, dir gone, dir back",
            vec![
                (
                    Step::List(Some(vec![
                        ("05-bad.conf", invalid("missing type", 1)),
                        ("10-a.conflist", valid("a", 1)),
                        ("20-b.conflist", valid("b", 1)),
                    ])),
                    vec![(Invalid, "05-bad.conf", "missing type")],
                ),
                (
                    Step::List(Some(vec![
                        ("05-bad.conf", invalid("missing type", 1)),
                        ("20-b.conflist", valid("b", 2)),
                        ("30-c.conf", valid("c", 1)),
                    ])),
                    vec![
                        (Removed, "10-a.conflist", "gone"),
                        (Changed, "20-b.conflist", "network \"b\""),
                        (Added, "30-c.conf", "network \"c\""),
                    ],
                ),
                (
                    Step::List(None),
                    vec![
                        (Removed, "05-bad.conf", "directory gone"),
                        (Removed, "20-b.conflist", "directory gone"),
                        (Removed, "30-c.conf", "directory gone"),
                        (Missing, "20-b.conflist", "no valid network config in /etc/cni/net.d (directory gone)"),
                    ],
                ),
                (Step::List(None), vec![]),
                (
                    Step::List(Some(vec![("10-a.conflist", valid("a", 1))])),
                    vec![(Added, "10-a.conflist", NET_A), (Restored, "10-a.conflist", NET_A)],
                ),
            ],
        );
        let snapshot = state.snapshot();
        assert!(snapshot.exists && snapshot.seen);
        assert_eq!(snapshot.default_network, Some(CniDefault { file: "10-a.conflist".into(), network: "a".into() }));
    }

    #[test]
    fn file_labels_are_bounded() {
        let mut state = DirState::new(PathBuf::from("/d"));
        state.apply_listing(Some(BTreeMap::new()), at(0));
        for index in 0..300 {
            let name = OsString::from(format!("{index:03}.conf"));
            state.apply_entry(&name, Some(invalid("missing type", 1)), Removal::Gone, at(1));
            state.apply_entry(&name, None, Removal::Deleted, at(2));
        }
        let changes = state.snapshot().changes;
        let files: BTreeSet<&str> = changes.iter().map(|c| c.file.as_str()).collect();
        assert_eq!(files.len(), MAX_FILE_LABELS + 1);
        let other: Vec<(&str, u64)> =
            changes.iter().filter(|c| c.file == OTHER_FILE_LABEL).map(|c| (c.change, c.count)).collect();
        assert_eq!(other, [("removed", 44), ("invalid", 44)]);
        // A labelled file keeps its label.
        state.apply_entry(OsStr::new("000.conf"), Some(invalid("missing type", 1)), Removal::Gone, at(3));
        let count =
            state.snapshot().changes.iter().find(|c| c.file == "000.conf" && c.change == "invalid").map(|c| c.count);
        assert_eq!(count, Some(2));
    }

    #[test]
    fn snapshot_serializes() {
        let mut state = DirState::new(PathBuf::from("/etc/cni/net.d"));
        state.apply_listing(
            Some(
                [("05-bad.conf", invalid("missing type", 1)), ("10-a.conflist", valid("a", 1))]
                    .into_iter()
                    .map(|(name, facts)| (OsString::from(name), facts))
                    .collect(),
            ),
            at(0),
        );
        let json = serde_json::to_value(CniSnapshot { dirs: vec![state.snapshot()] }).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"dirs": [{
                "dir": "/etc/cni/net.d", "exists": true, "seen": true,
                "default_network": {"file": "10-a.conflist", "network": "a"},
                "files": [
                    {"file": "05-bad.conf", "valid": false, "network": null, "detail": "missing type"},
                    {"file": "10-a.conflist", "valid": true, "network": "a", "detail": null}
                ],
                "changes": [{"file": "05-bad.conf", "change": "invalid", "count": 1}]
            }]})
        );
    }
}
