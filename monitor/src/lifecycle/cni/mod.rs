//! CNI config dirs: which network configs each dir holds, which are valid, which one is the
//! dir's default network, and the lifecycle events when any of that changes
//! (`cni_config_added|changed|removed|invalid`, `cni_default_network_missing|restored`).
//!
//! Rules follow libcni (`ConfFiles`, `ConfFromBytes`, `ConfListFromBytes`) and CRI-O's ocicni:
//! a config is an entry named `*.conf`, `*.conflist` or `*.json` (other names are ignored
//! entirely); the default network of a dir is the first *valid* config by file name (byte
//! order), so an invalid file sorting first never hides a valid one.
//!
//! The module has two halves: a pure state machine (`DirState`: facts about files in, events
//! out) and the I/O around it (`examine`, `list_dir`, [`start`]), fed by [`crate::lifecycle::dirwatch`]
//! (inotify, no polling). A file read while it was being written, or changed while it was read,
//! is read again or left for its next change (see [`crate::lifecycle::dirwatch`]), so a config rewritten
//! in place does not flap through "invalid".
//!
//! Events and their subjects: a file's events have the file's full path as subject.
//! `cni_default_network_missing` has the dir's previous default file as subject (the dir itself
//! at start-up), `cni_default_network_restored` the new default file. Only the transitions
//! "had a default → has none" and back are reported: a default switching from one valid file
//! to another is told by the added/removed events alone. At start-up existing files are
//! current state, not changes (no `added`), but invalid files are reported, and so is a dir
//! that exists with no valid config. A dir that appears later without a valid config is not
//! reported missing (it never had a default).

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::{OsStr, OsString},
    fs::{self, File},
    hash::{DefaultHasher, Hasher},
    io,
    os::unix::{ffi::OsStrExt, fs::OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::Context as _;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::lifecycle::{
    dirwatch::{self, DirChange, EntryEvent, ReadFence, Unsettled},
    files,
    timeline::{Event, EventKind, Stamp, Timeline},
};

/// Largest config read. Larger files are invalid; never more than this plus one byte is read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// At most this many distinct `file` label values per dir in the change counters; changes of
/// further files are counted under [`OTHER_FILE_LABEL`]. Keeps the metric's cardinality
/// bounded when something floods a dir with files.
pub const MAX_FILE_LABELS: usize = 256;

/// The `file` label of changes beyond [`MAX_FILE_LABELS`] distinct files.
pub const OTHER_FILE_LABEL: &str = "_other";

/// Whether libcni would consider an entry of this name (`.conf`, `.conflist`, `.json`).
pub fn is_config_name(name: &OsStr) -> bool {
    let name = name.as_bytes();
    [b".conf".as_slice(), b".conflist", b".json"].iter().any(|suffix| name.ends_with(suffix))
}

// ---------------------------------------------------------------------------------------------
// Validation

/// What one config file amounts to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Loadable; `network` is the network name ("" when a `.conf` has none).
    Valid { network: String },
    /// Not loadable, and why.
    Invalid { reason: String },
}

/// Everything the state machine needs to know about one config entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileFacts {
    /// Hash of the content and its length; None when the content was not read.
    pub(crate) fingerprint: Option<u64>,
    pub(crate) verdict: Verdict,
}

impl FileFacts {
    fn invalid(reason: impl Into<String>) -> Self {
        Self { fingerprint: None, verdict: Verdict::Invalid { reason: reason.into() } }
    }
}

/// Validates config bytes as libcni would load them, `.conflist` as a network list, anything
/// else as a single network config.
pub(crate) fn validate(name: &OsStr, bytes: &[u8]) -> Verdict {
    let checked = match serde_json::from_slice::<Value>(bytes) {
        Err(error) => Err(format!("not valid JSON: {error}")),
        Ok(Value::Object(object)) => {
            if name.as_bytes().ends_with(b".conflist") {
                check_list(&object)
            } else {
                check_conf(&object)
            }
        }
        Ok(_) => Err("not a JSON object".to_string()),
    };
    match checked {
        Ok(network) => Verdict::Valid { network },
        Err(reason) => Verdict::Invalid { reason },
    }
}

fn check_list(object: &Map<String, Value>) -> Result<String, String> {
    check_version(object)?;
    let network = match object.get("name") {
        None | Some(Value::Null) => return Err("missing name".into()),
        Some(Value::String(name)) if name.is_empty() => return Err("empty name".into()),
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err("name is not a string".into()),
    };
    let plugins = match object.get("plugins") {
        None | Some(Value::Null) => return Err("missing plugins".into()),
        Some(Value::Array(plugins)) if plugins.is_empty() => return Err("empty plugins".into()),
        Some(Value::Array(plugins)) => plugins,
        Some(_) => return Err("plugins is not an array".into()),
    };
    for (index, plugin) in plugins.iter().enumerate() {
        let Value::Object(plugin) = plugin else { return Err(format!("plugin {index} is not an object")) };
        check_type(plugin).map_err(|reason| format!("plugin {index}: {reason}"))?;
    }
    Ok(network)
}

fn check_conf(object: &Map<String, Value>) -> Result<String, String> {
    check_version(object)?;
    check_type(object)?;
    match object.get("name") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(name)) => Ok(name.clone()),
        Some(_) => Err("name is not a string".into()),
    }
}

fn check_type(object: &Map<String, Value>) -> Result<(), String> {
    match object.get("type") {
        None | Some(Value::Null) => Err("missing type".into()),
        Some(Value::String(kind)) if kind.is_empty() => Err("empty type".into()),
        Some(Value::String(_)) => Ok(()),
        Some(_) => Err("type is not a string".into()),
    }
}

fn check_version(object: &Map<String, Value>) -> Result<(), String> {
    match object.get("cniVersion") {
        None | Some(Value::Null | Value::String(_)) => Ok(()),
        Some(_) => Err("cniVersion is not a string".into()),
    }
}

fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write_usize(bytes.len());
    hasher.write(bytes);
    hasher.finish()
}

/// An I/O error as short text: "Permission denied", without the "(os error 13)".
fn describe(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_string(),
        None => error.to_string(),
    }
}

/// What [`examine`] found at a config entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Examined {
    /// No such entry.
    Absent,
    /// Someone has it open for writing: what could be read may be partial; its close is
    /// reported later.
    BeingWritten,
    /// `checked`: nobody had it open for writing once it was read (false: could not tell, see
    /// [`dirwatch::open_for_writing`]).
    Found { facts: FileFacts, checked: bool },
}

/// Looks at one config entry `dir/name` (following symlinks). Never blocks on a fifo or device
/// (metadata first, then `O_NONBLOCK`), never reads more than [`MAX_CONFIG_BYTES`] + 1 bytes.
pub(crate) fn examine(dir: &Path, name: &OsStr) -> Examined {
    let path = dir.join(name);
    let invalid = |reason: String| Examined::Found { facts: FileFacts::invalid(reason), checked: true };
    let unreadable = |error: &io::Error| invalid(format!("unreadable: {}", describe(error)));
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Examined::Absent,
        Err(error) => return unreadable(&error),
    };
    let meta = if meta.file_type().is_symlink() {
        match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return invalid("symlink loop".into()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return invalid("dangling symlink".into()),
            Err(error) => return unreadable(&error),
        }
    } else {
        meta
    };
    if !meta.is_file() {
        return invalid(format!("not a regular file ({})", files::kind(meta.file_type())));
    }
    let file = match File::options().read(true).custom_flags(libc::O_NONBLOCK).open(&path) {
        Ok(file) => file,
        // Gone since the metadata: its removal event follows.
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Examined::Absent,
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return invalid("symlink loop".into()),
        Err(error) => return unreadable(&error),
    };
    // What the fd refers to: the path may have been swapped since the metadata.
    let meta = match file.metadata() {
        Ok(meta) if meta.is_file() => meta,
        Ok(meta) => return invalid(format!("not a regular file ({})", files::kind(meta.file_type()))),
        Err(error) => return unreadable(&error),
    };
    let verdict = if meta.len() > MAX_CONFIG_BYTES {
        FileFacts::invalid(format!("over 1 MiB ({} bytes)", meta.len()))
    } else {
        match files::read_at_most(&file, meta.len(), MAX_CONFIG_BYTES) {
            Err(error) => FileFacts::invalid(format!("unreadable: {}", describe(&error))),
            Ok(None) => FileFacts::invalid(format!("over 1 MiB (more than {MAX_CONFIG_BYTES} bytes)")),
            Ok(Some(bytes)) => FileFacts { fingerprint: Some(fingerprint(&bytes)), verdict: validate(name, &bytes) },
        }
    };
    // Asked after reading: a writer that overlapped the read either still has the file open, or
    // has closed it and its events are queued (see `dirwatch`).
    match dirwatch::open_for_writing(&file) {
        Some(true) => Examined::BeingWritten,
        Some(false) => Examined::Found { facts: verdict, checked: true },
        None => Examined::Found { facts: verdict, checked: false },
    }
}

/// A dir's config entries, as listed now.
#[derive(Debug)]
pub(crate) enum Listing {
    /// Every config entry found (never [`Examined::Absent`]).
    Entries(BTreeMap<OsString, Examined>),
    /// The dir does not exist (or is not a dir).
    Missing,
    /// It exists but cannot be listed.
    Unreadable(String),
}

/// Lists and examines every config entry of `dir`.
pub(crate) fn list_dir(dir: &Path) -> Listing {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => return Listing::Missing,
        Err(error) => return Listing::Unreadable(describe(&error)),
    };
    let mut files = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !is_config_name(&name) {
            continue;
        }
        match examine(dir, &name) {
            Examined::Absent => {}
            examined => {
                files.insert(name, examined);
            }
        }
    }
    Listing::Entries(files)
}

/// Reads of an entry that changed while it was read, before leaving it to its next change.
const READ_AGAIN: usize = 3;

/// Pauses before looking again at an entry open for writing but not modified since its last
/// close: the microseconds between a writer's `IN_CLOSE_WRITE` and the kernel dropping its
/// write access, or between an `open(O_TRUNC)` emptying the file and its `IN_MODIFY`. After the
/// last, the writer is taken to be idle with the file open: its close is reported later.
const WRITER_PAUSES: [Duration; 4] =
    [Duration::from_millis(1), Duration::from_millis(5), Duration::from_millis(25), Duration::from_millis(100)];

/// What to make of one read of an entry.
#[derive(Debug, PartialEq, Eq)]
enum Take {
    /// Settled: this is the entry (None: there is none).
    Use(Option<FileFacts>),
    /// It changed while it was read: read it again.
    Again,
    /// Open for writing, not modified since its last close: look again after a pause.
    Wait,
    /// Being written (its close is reported later), or events were lost (a rescan is queued):
    /// leave what is known of it as it is.
    Leave,
}

fn judge(name: &OsStr, examined: Examined, unsettled: &Unsettled) -> Take {
    match examined {
        _ if unsettled.all => Take::Leave,
        Examined::BeingWritten if unsettled.writing.contains(name) => Take::Leave,
        Examined::BeingWritten => Take::Wait,
        _ if unsettled.changed.contains(name) => Take::Again,
        Examined::Found { checked: false, .. } if unsettled.writing.contains(name) => Take::Leave,
        Examined::Absent => Take::Use(None),
        Examined::Found { facts, .. } => Take::Use(Some(facts)),
    }
}

/// Reads entry `name` of `dir` until the read is settled. None: leave it as known.
async fn read_settled(fence: &ReadFence, dir: &Path, name: &OsStr) -> Option<Option<FileFacts>> {
    let (mut again, mut pauses) = (0, WRITER_PAUSES.iter());
    loop {
        let token = fence.begin(dir);
        let examined = {
            let (dir, name) = (dir.to_path_buf(), name.to_owned());
            tokio::task::spawn_blocking(move || examine(&dir, &name)).await
        };
        let unsettled = fence.end(token);
        let examined = match examined {
            Ok(examined) => examined,
            Err(error) => {
                warn!(dir = %dir.display(), ?name, %error, "examining CNI config failed");
                return None;
            }
        };
        match judge(name, examined, &unsettled) {
            Take::Use(facts) => return Some(facts),
            Take::Again if again < READ_AGAIN => again += 1,
            Take::Again => {
                debug!(dir = %dir.display(), ?name, "CNI config keeps changing while read; left for its next change");
                return None;
            }
            Take::Wait => match pauses.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return None,
            },
            Take::Leave => return None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The state machine

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

    fn snapshot(&self) -> CniDirSnapshot {
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
    /// The dir, absolute and normalized (see [`dirwatch::DirWatcher::dirs`]).
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

// ---------------------------------------------------------------------------------------------
// The watcher

/// Shared handle on the CNI config state; cheap to clone.
#[derive(Clone)]
pub struct CniWatcher {
    dirs: Arc<Mutex<Vec<DirState>>>,
}

impl CniWatcher {
    /// The current state of every watched dir, in the order of [`CniWatcher::dirs`].
    pub fn snapshot(&self) -> CniSnapshot {
        let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        CniSnapshot { dirs: dirs.iter().map(DirState::snapshot).collect() }
    }

    /// The watched dirs (absolute, normalized, deduplicated).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|dir| dir.dir.clone()).collect()
    }

    fn with_dir(&self, dir: &Path, apply: impl FnOnce(&mut DirState) -> Vec<Event>) -> Vec<Event> {
        let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.iter_mut().find(|state| state.dir == dir).map(apply).unwrap_or_default()
    }

    /// Applies one directory change: examines the files (off the async threads), updates the
    /// state and records the resulting events.
    async fn apply(&self, change: DirChange, fence: &ReadFence, timeline: &Timeline) {
        let events = match change {
            DirChange::Rescan { dir, stamp } => self.rescan(&dir, stamp, fence).await,
            DirChange::Gone { dir, stamp } => self.with_dir(&dir, |state| state.apply_listing(None, stamp)),
            DirChange::Entry { dir, name, event, stamp } => {
                if !is_config_name(&name) {
                    return;
                }
                let Some(facts) = read_settled(fence, &dir, &name).await else { return };
                let removal = match event {
                    EntryEvent::Deleted => Removal::Deleted,
                    EntryEvent::MovedOut => Removal::MovedAway,
                    // Written, created, moved in or touched, but gone by now: its own removal
                    // event follows and tells how.
                    _ if facts.is_none() => return,
                    _ => Removal::Gone,
                };
                self.with_dir(&dir, |state| state.apply_entry(&name, facts, removal, stamp))
            }
        };
        for event in events {
            timeline.record(event);
        }
    }

    async fn rescan(&self, dir: &Path, stamp: Stamp, fence: &ReadFence) -> Vec<Event> {
        let token = fence.begin(dir);
        let listing = {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || list_dir(&dir)).await
        };
        let unsettled = fence.end(token);
        let entries = match listing {
            // Events were lost while listing: the rescan queued after it tells.
            Ok(Listing::Entries(_)) if unsettled.all => return Vec::new(),
            Ok(Listing::Entries(entries)) => entries,
            Ok(Listing::Missing) => return self.with_dir(dir, |state| state.apply_listing(None, stamp)),
            Ok(Listing::Unreadable(reason)) => {
                warn!(dir = %dir.display(), reason, "cannot list CNI config dir");
                return Vec::new();
            }
            Err(error) => {
                warn!(dir = %dir.display(), %error, "listing CNI config dir failed");
                return Vec::new();
            }
        };
        let mut files = BTreeMap::new();
        let mut leave = BTreeSet::new();
        // Entries that changed during the listing, listed or not (created or removed meanwhile).
        let mut again: BTreeSet<OsString> =
            unsettled.changed.iter().filter(|name| is_config_name(name)).cloned().collect();
        for (name, examined) in entries {
            match judge(&name, examined, &unsettled) {
                Take::Use(Some(facts)) => {
                    files.insert(name, facts);
                }
                Take::Use(None) => {}
                Take::Again | Take::Wait => {
                    again.insert(name);
                }
                Take::Leave => {
                    leave.insert(name);
                }
            }
        }
        for name in again {
            match read_settled(fence, dir, &name).await {
                Some(Some(facts)) => {
                    files.insert(name, facts);
                }
                // Gone meanwhile (its removal event tells how), or still unsettled.
                Some(None) | None => {
                    leave.insert(name);
                }
            }
        }
        self.with_dir(dir, |state| {
            for name in leave {
                if let Some(known) = state.files.get(&name) {
                    files.insert(name, known.clone());
                }
            }
            state.apply_listing(Some(files), stamp)
        })
    }
}

/// Starts watching the CNI config `dirs` (which need not exist), recording lifecycle events on
/// `timeline`. Returns once the start-up scan is done (state populated, start-up events
/// recorded), with the shared state and the task that follows changes (abort it to stop).
/// Must be called inside a tokio runtime.
pub async fn start(dirs: Vec<PathBuf>, timeline: Arc<Timeline>) -> anyhow::Result<(CniWatcher, JoinHandle<()>)> {
    let mut watcher = dirwatch::watch_dirs(dirs).context("cannot watch the CNI config dirs")?;
    let fence = watcher.read_fence();
    let states = watcher.dirs().iter().cloned().map(DirState::new).collect();
    let cni = CniWatcher { dirs: Arc::new(Mutex::new(states)) };
    for _ in 0..watcher.dirs().len() {
        let change = watcher.recv().await.context("CNI config dir watch ended during start-up")?;
        cni.apply(change, &fence, &timeline).await;
    }
    let task = tokio::spawn({
        let cni = cni.clone();
        async move {
            while let Some(change) = watcher.recv().await {
                cni.apply(change, &fence, &timeline).await;
            }
            warn!("CNI config dir watch ended; CNI config changes are no longer followed");
        }
    });
    Ok((cni, task))
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    // --- pure state machine -------------------------------------------------------------------

    fn valid(network: &str, content: u64) -> FileFacts {
        FileFacts { fingerprint: Some(content), verdict: Verdict::Valid { network: network.into() } }
    }

    fn invalid(reason: &str, content: u64) -> FileFacts {
        FileFacts { fingerprint: Some(content), verdict: Verdict::Invalid { reason: reason.into() } }
    }

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

    // --- validation -----------------------------------------------------------------------------

    #[test]
    fn names_that_count() {
        for name in ["a.conf", "a.conflist", "a.json", ".conf", "10-x.y.conf"] {
            assert!(is_config_name(OsStr::new(name)), "{name}");
        }
        for name in ["a.conf.tmp", "a.CONF", "a.yaml", ".a.conf.swp", "conf", "a.conflist~"] {
            assert!(!is_config_name(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn validation_rules() {
        let ok_list = r#"{"cniVersion":"0.4.0","name":"openshift-sdn","plugins":[{"type":"openshift-sdn"}]}"#;
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            ("a.conflist", ok_list, Ok("openshift-sdn")),
            ("a.conf", r#"{"cniVersion":"0.3.1","name":"n","type":"bridge"}"#, Ok("n")),
            ("a.json", r#"{"type":"bridge"}"#, Ok("")),
            ("a.conf", "", Err("not valid JSON: EOF while parsing a value at line 1 column 0")),
            ("a.conf", "garbage", Err("not valid JSON: expected value at line 1 column 1")),
            ("a.conf", r#"{"type":"x"} trailing"#, Err("not valid JSON: trailing characters at line 1 column 14")),
            ("a.conf", "[1]", Err("not a JSON object")),
            ("a.conf", r#"{"name":"n"}"#, Err("missing type")),
            ("a.conf", r#"{"type":""}"#, Err("empty type")),
            ("a.conf", r#"{"type":5}"#, Err("type is not a string")),
            ("a.conf", r#"{"type":"x","name":5}"#, Err("name is not a string")),
            ("a.conf", r#"{"type":"x","cniVersion":1}"#, Err("cniVersion is not a string")),
            // A single config named .conflist is not a list.
            ("a.conflist", r#"{"name":"n","type":"bridge"}"#, Err("missing plugins")),
            ("a.conflist", r#"{"plugins":[{"type":"x"}]}"#, Err("missing name")),
            ("a.conflist", r#"{"name":"","plugins":[{"type":"x"}]}"#, Err("empty name")),
            ("a.conflist", r#"{"name":["n"],"plugins":[{"type":"x"}]}"#, Err("name is not a string")),
            ("a.conflist", r#"{"name":"n","plugins":[]}"#, Err("empty plugins")),
            ("a.conflist", r#"{"name":"n","plugins":{"type":"x"}}"#, Err("plugins is not an array")),
            ("a.conflist", r#"{"name":"n","plugins":[{"type":"x"},"y"]}"#, Err("plugin 1 is not an object")),
            (
                "a.conflist",
                r#"{"name":"n","plugins":[{"type":"x"},{"type":7}]}"#,
                Err("plugin 1: type is not a string"),
            ),
            ("a.conflist", r#"{"name":"n","plugins":[{}]}"#, Err("plugin 0: missing type")),
        ];
        for (name, content, want) in cases {
            let want = match want {
                Ok(network) => Verdict::Valid { network: network.to_string() },
                Err(reason) => Verdict::Invalid { reason: reason.to_string() },
            };
            assert_eq!(validate(OsStr::new(name), content.as_bytes()), want, "{name}: {content}");
        }
        // Deep nesting is an error, not a stack overflow.
        let deep = "[".repeat(100_000);
        assert!(matches!(validate(OsStr::new("a.conf"), deep.as_bytes()), Verdict::Invalid { .. }));
    }

    #[test]
    fn judging_reads() {
        let facts = valid("a", 1);
        let found = |checked| Examined::Found { facts: facts.clone(), checked };
        let name = OsStr::new("a.conf");
        let set = |names: &[&str]| names.iter().map(OsString::from).collect::<std::collections::HashSet<_>>();
        let settled = Unsettled::default();
        let changed = Unsettled { changed: set(&["a.conf"]), ..Unsettled::default() };
        let writing = Unsettled { writing: set(&["a.conf"]), ..Unsettled::default() };
        let other = Unsettled { changed: set(&["b.conf"]), writing: set(&["b.conf"]), all: false };
        let lost = Unsettled { all: true, ..Unsettled::default() };
        let cases = [
            (found(true), &settled, Take::Use(Some(facts.clone()))),
            (Examined::Absent, &settled, Take::Use(None)),
            (found(true), &other, Take::Use(Some(facts.clone()))),
            (found(true), &changed, Take::Again),
            (Examined::Absent, &changed, Take::Again),
            // inotify says "being written": trusted only when the write-access probe could not tell.
            (found(true), &writing, Take::Use(Some(facts.clone()))),
            (found(false), &writing, Take::Leave),
            (found(false), &settled, Take::Use(Some(facts.clone()))),
            // Open for writing: modified since its last close, the close is coming; not modified,
            // the writer is at its open or its close: look again shortly.
            (Examined::BeingWritten, &writing, Take::Leave),
            (Examined::BeingWritten, &settled, Take::Wait),
            (Examined::BeingWritten, &changed, Take::Wait),
            (found(true), &lost, Take::Leave),
        ];
        for (index, (examined, unsettled, want)) in cases.into_iter().enumerate() {
            assert_eq!(judge(name, examined, unsettled), want, "case {index}");
        }
    }

    #[test]
    fn io_errors_read_short() {
        assert_eq!(describe(&io::Error::from_raw_os_error(libc::EACCES)), "Permission denied");
    }

    /// What `touch` does to an existing file: set both times (IN_ATTRIB).
    fn touch(path: &Path) {
        let now = std::time::SystemTime::now();
        File::open(path).unwrap().set_times(fs::FileTimes::new().set_accessed(now).set_modified(now)).unwrap();
    }

    // --- real files -----------------------------------------------------------------------------

    use crate::test_support::TempDir;

    const VALID: &str = r#"{"cniVersion":"0.4.0","name":"openshift-sdn","plugins":[{"type":"openshift-sdn"}]}"#;

    fn reason(examined: Examined) -> Option<String> {
        match examined {
            Examined::Absent => None,
            Examined::BeingWritten => Some("being written".into()),
            Examined::Found { facts, checked } => {
                assert!(checked, "leases work here");
                match facts.verdict {
                    Verdict::Valid { network } => Some(format!("valid {network}")),
                    Verdict::Invalid { reason } => Some(reason),
                }
            }
        }
    }

    #[test]
    fn examines_odd_entries_without_blocking() {
        let tmp = TempDir::new("examine");
        let dir = &tmp.0;
        fs::write(dir.join("ok.conflist"), VALID).unwrap();
        fs::write(dir.join("big.conf"), vec![b' '; 5 << 20]).unwrap();
        fs::create_dir(dir.join("x.conf")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo.conf"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink("loop.conf", dir.join("loop.conf")).unwrap();
        std::os::unix::fs::symlink("nowhere", dir.join("dangling.conf")).unwrap();
        std::os::unix::fs::symlink("ok.conflist", dir.join("link.conflist")).unwrap();
        let check = |name: &str| reason(examine(dir, OsStr::new(name)));
        assert_eq!(check("ok.conflist").as_deref(), Some("valid openshift-sdn"));
        assert_eq!(check("link.conflist").as_deref(), Some("valid openshift-sdn"));
        assert_eq!(check("big.conf").as_deref(), Some("over 1 MiB (5242880 bytes)"));
        assert_eq!(check("x.conf").as_deref(), Some("not a regular file (directory)"));
        assert_eq!(check("fifo.conf").as_deref(), Some("not a regular file (fifo)"));
        assert_eq!(check("loop.conf").as_deref(), Some("symlink loop"));
        assert_eq!(check("dangling.conf").as_deref(), Some("dangling symlink"));
        assert_eq!(check("absent.conf"), None);
        let busy = |dir: &Path| {
            let Listing::Entries(files) = list_dir(dir) else { panic!("listing failed") };
            let busy = files.iter().filter(|(_, e)| **e == Examined::BeingWritten).map(|(name, _)| name.clone());
            (files.len(), busy.collect::<Vec<_>>())
        };
        assert_eq!(busy(dir), (7, vec![]));
        // A file someone has open for writing is not taken at its word.
        let writer = File::options().append(true).open(dir.join("ok.conflist")).unwrap();
        assert_eq!(check("ok.conflist").as_deref(), Some("being written"));
        assert_eq!(check("big.conf").as_deref(), Some("over 1 MiB (5242880 bytes)"));
        assert_eq!(busy(dir), (7, vec![OsString::from("link.conflist"), OsString::from("ok.conflist")]));
        drop(writer);
        assert!(matches!(list_dir(&dir.join("absent")), Listing::Missing));
        assert!(matches!(list_dir(&dir.join("ok.conflist")), Listing::Missing));
        // Identical bytes, identical fingerprint; different bytes, different fingerprint.
        let first = examine(dir, OsStr::new("ok.conflist"));
        fs::write(dir.join("ok.conflist"), VALID).unwrap();
        assert_eq!(examine(dir, OsStr::new("ok.conflist")), first);
        fs::write(dir.join("ok.conflist"), VALID.replace("0.4.0", "1.0.0")).unwrap();
        assert_ne!(examine(dir, OsStr::new("ok.conflist")), first);
    }

    // --- end to end: real dir, real inotify -----------------------------------------------------

    /// Polls the timeline until `pred` holds for the events recorded after the first `from`.
    async fn wait_for(timeline: &Timeline, from: usize, what: &str, pred: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let events: Vec<Event> = timeline.events(None).into_iter().skip(from).collect();
            if pred(&events) {
                return events;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for {what}; events: {events:#?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn summary(events: &[Event]) -> Vec<(EventKind, String, String)> {
        events
            .iter()
            .map(|e| {
                let file = Path::new(&e.subject).file_name().unwrap_or_default().to_string_lossy().into_owned();
                (e.kind, file, e.detail.clone())
            })
            .collect()
    }

    fn has(events: &[Event], kind: EventKind) -> bool {
        events.iter().any(|e| e.kind == kind)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn follows_a_real_dir() {
        let tmp = TempDir::new("follow");
        let dir = tmp.0.join("net.d");
        fs::create_dir(&dir).unwrap();
        let timeline = Arc::new(Timeline::new(1000));
        let (cni, task) = start(vec![dir.clone()], timeline.clone()).await.unwrap();
        let dir_name = dir.file_name().unwrap().to_string_lossy().into_owned();

        // Start-up state is there when start returns.
        let events = timeline.events(None);
        assert_eq!(
            summary(&events),
            [(Missing, dir_name.clone(), format!("no valid network config in {} at start-up", dir.display()))]
        );
        assert_eq!(events[0].subject, dir.to_string_lossy());
        let seen = events.len();

        let a = dir.join("10-a.conflist");
        fs::write(&a, VALID).unwrap();
        let events = wait_for(&timeline, seen, "added + restored", |e| has(e, Restored)).await;
        let net = "network \"openshift-sdn\"".to_string();
        assert_eq!(
            summary(&events),
            [(Added, "10-a.conflist".into(), net.clone()), (Restored, "10-a.conflist".into(), net.clone())]
        );
        assert_eq!(events[0].subject, a.to_string_lossy());
        let seen = seen + events.len();

        // touch, then an identical rewrite: nothing; then a real change.
        touch(&a);
        fs::write(&a, VALID).unwrap();
        fs::write(&a, VALID.replace("0.4.0", "1.0.0")).unwrap();
        let events = wait_for(&timeline, seen, "changed", |e| has(e, Changed)).await;
        assert_eq!(summary(&events), [(Changed, "10-a.conflist".into(), net.clone())]);
        let seen = seen + events.len();

        fs::write(dir.join("05-bad.conf"), "{ garbage").unwrap();
        let events = wait_for(&timeline, seen, "invalid", |e| has(e, Invalid)).await;
        assert_eq!(
            summary(&events),
            [(Invalid, "05-bad.conf".into(), "not valid JSON: key must be a string at line 1 column 3".into())]
        );
        let seen = seen + events.len();
        let snapshot = cni.snapshot();
        assert_eq!(snapshot.dirs[0].default_network.as_ref().map(|d| d.file.as_str()), Some("10-a.conflist"));

        fs::remove_file(&a).unwrap();
        let events = wait_for(&timeline, seen, "removed + missing", |e| has(e, Missing)).await;
        assert_eq!(
            summary(&events),
            [
                (Removed, "10-a.conflist".into(), "deleted".into()),
                (
                    Missing,
                    "10-a.conflist".into(),
                    format!("no valid network config in {} (10-a.conflist removed)", dir.display())
                ),
            ]
        );
        let seen = seen + events.len();

        // Written elsewhere and renamed in (the atomic way), then the dir goes.
        let staging = tmp.0.join("staging.tmp");
        fs::write(&staging, VALID).unwrap();
        fs::rename(&staging, dir.join("20-b.conflist")).unwrap();
        let events = wait_for(&timeline, seen, "restored by rename", |e| has(e, Restored)).await;
        assert_eq!(
            summary(&events),
            [(Added, "20-b.conflist".into(), net.clone()), (Restored, "20-b.conflist".into(), net)]
        );
        let seen = seen + events.len();
        fs::rename(&dir, tmp.0.join("moved-away")).unwrap();
        let events = wait_for(&timeline, seen, "dir gone", |e| has(e, Missing)).await;
        let gone = "directory gone".to_string();
        assert_eq!(
            summary(&events),
            [
                (Removed, "05-bad.conf".into(), gone.clone()),
                (Removed, "20-b.conflist".into(), gone),
                (
                    Missing,
                    "20-b.conflist".into(),
                    format!("no valid network config in {} (directory gone)", dir.display())
                ),
            ]
        );
        let snapshot = cni.snapshot();
        assert!(!snapshot.dirs[0].exists && snapshot.dirs[0].seen && snapshot.dirs[0].files.is_empty());
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dir_missing_at_start_is_not_reported_missing() {
        let tmp = TempDir::new("absent");
        let dir = tmp.0.join("a").join("net.d");
        let timeline = Arc::new(Timeline::new(100));
        let (cni, task) = start(vec![dir.clone(), dir.clone()], timeline.clone()).await.unwrap();
        assert!(timeline.events(None).is_empty());
        let snapshot = cni.snapshot();
        assert_eq!(snapshot.dirs.len(), 1);
        assert!(!snapshot.dirs[0].exists && !snapshot.dirs[0].seen);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("10-a.conflist"), VALID).unwrap();
        wait_for(&timeline, 0, "restored", |e| has(e, Restored)).await;
        assert!(cni.snapshot().dirs[0].seen);
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_place_rewrites_never_flap_through_invalid() {
        let tmp = TempDir::new("rewrites");
        let dir = tmp.0.join("net.d");
        fs::create_dir(&dir).unwrap();
        let a = dir.join("10-a.conflist");
        fs::write(&a, VALID).unwrap();
        let timeline = Arc::new(Timeline::new(10_000));
        let (cni, task) = start(vec![dir.clone()], timeline.clone()).await.unwrap();
        let other = VALID.replace("0.4.0", "1.0.0");
        // Truncate-then-write in place, as ioutil.WriteFile does, back to back: every read the
        // watcher makes races a later rewrite.
        for round in 0..300 {
            fs::write(&a, if round % 2 == 0 { other.as_str() } else { VALID }).unwrap();
            // And an mtime-only touch now and then (IN_MODIFY without a close).
            if round % 50 == 0 {
                File::open(&a).unwrap().set_modified(std::time::SystemTime::now()).unwrap();
            }
        }
        fs::write(dir.join("99-marker.conflist"), VALID).unwrap();
        let events =
            wait_for(&timeline, 0, "marker", |e| e.iter().any(|e| e.subject.ends_with("99-marker.conflist"))).await;
        let flaps: Vec<&Event> = events.iter().filter(|e| e.kind != Changed && e.kind != Added).collect();
        assert!(flaps.is_empty(), "{flaps:#?}");
        assert!(events.iter().filter(|e| e.kind == Added).all(|e| e.subject.ends_with("99-marker.conflist")));
        // The last content (VALID: round 299 is odd) is what the state holds.
        let expected = examine(&dir, OsStr::new("10-a.conflist"));
        let Examined::Found { facts, .. } = expected else { panic!("{expected:?}") };
        let state = cni.dirs.lock().unwrap();
        assert_eq!(state[0].files.get(OsStr::new("10-a.conflist")), Some(&facts));
        drop(state);
        task.abort();
    }

    /// Tiny deterministic generator for garbage.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_thousand_malformed_files() {
        let tmp = TempDir::new("malformed");
        let dir = tmp.0.join("net.d");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("50-valid.conflist"), VALID).unwrap();
        let timeline = Arc::new(Timeline::new(10_000));
        let started = std::time::Instant::now();
        let (cni, task) = start(vec![dir.clone()], timeline.clone()).await.unwrap();
        assert!(timeline.events(None).is_empty());

        let mut random = XorShift(0x9E37_79B9_7F4A_7C15);
        let mut expected: BTreeMap<String, Option<&str>> = BTreeMap::new();
        let special: [(&str, Option<&str>); 5] = [
            ("00-huge.conf", Some("over 1 MiB (5242880 bytes)")),
            ("00-loop.conf", Some("symlink loop")),
            ("00-fifo.conf", Some("not a regular file (fifo)")),
            ("00-dangling.json", Some("dangling symlink")),
            ("x.conf", Some("not a regular file (directory)")),
        ];
        fs::write(dir.join("00-huge.conf"), vec![b'{'; 5 << 20]).unwrap();
        std::os::unix::fs::symlink("00-loop.conf", dir.join("00-loop.conf")).unwrap();
        nix::unistd::mkfifo(&dir.join("00-fifo.conf"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink("nowhere", dir.join("00-dangling.json")).unwrap();
        fs::create_dir(dir.join("x.conf")).unwrap();
        expected.extend(special.iter().map(|(name, reason)| (name.to_string(), *reason)));
        let wrong_types = [
            r#"{"type":5}"#,
            r#"{"type":null,"name":"n"}"#,
            r#"{"name":"n","plugins":"x"}"#,
            r#"{"name":1,"plugins":[{"type":"x"}]}"#,
            r#"{"name":"n","plugins":[{"type":["x"]}]}"#,
            r#"[]"#,
            r#""string""#,
            r#"{"cniVersion":4,"type":"x"}"#,
        ];
        for index in 0..(1000 - special.len()) {
            let (name, content): (String, Vec<u8>) = match index % 3 {
                0 => {
                    let length = (random.next() % 512) as usize;
                    let mut bytes: Vec<u8> = (0..length).map(|_| random.next() as u8).collect();
                    bytes.insert(0, b'#'); // never valid JSON
                    (format!("{index:04}-random.conf"), bytes)
                }
                1 => {
                    let cut = 1 + (random.next() as usize % (VALID.len() - 1));
                    (format!("{index:04}-truncated.conflist"), VALID.as_bytes()[..cut].to_vec())
                }
                _ => {
                    let content = wrong_types[index % wrong_types.len()];
                    let name = if content.contains("plugins") {
                        format!("{index:04}-types.conflist")
                    } else {
                        format!("{index:04}-types.json")
                    };
                    (name, content.as_bytes().to_vec())
                }
            };
            fs::write(dir.join(&name), content).unwrap();
            expected.insert(name, None);
        }
        assert_eq!(expected.len(), 1000);

        wait_for(&timeline, 0, "1000 invalid", |e| e.iter().filter(|e| e.kind == Invalid).count() >= 1000).await;
        // A marker after everything: once it is seen, every earlier change has been handled.
        fs::write(dir.join("99-marker.conflist"), VALID).unwrap();
        let events = wait_for(&timeline, 0, "marker", |e| e.iter().any(|e| e.subject.ends_with("99-marker.conflist")))
            .await
            .into_iter()
            .filter(|e| !e.subject.ends_with("99-marker.conflist"))
            .collect::<Vec<_>>();
        assert!(events.len() >= 1000);
        let mut report = String::new();
        let mut per_file: BTreeMap<String, Vec<&Event>> = BTreeMap::new();
        for event in &events {
            let file = Path::new(&event.subject).file_name().unwrap_or_default().to_string_lossy().into_owned();
            per_file.entry(file).or_default().push(event);
        }
        for (name, want) in &expected {
            match per_file.get(name).map(Vec::as_slice) {
                Some([event]) if event.kind == Invalid && want.is_none_or(|want| event.detail == want) => {}
                other => writeln!(report, "{name}: {other:?}").unwrap(),
            }
        }
        assert!(report.is_empty(), "files not reported invalid exactly once:\n{report}");
        assert_eq!(per_file.len(), 1000, "events only for the malformed files");
        let snapshot = cni.snapshot();
        let dir_state = &snapshot.dirs[0];
        assert_eq!(dir_state.default_network.as_ref().map(|d| d.file.as_str()), Some("50-valid.conflist"));
        assert_eq!(dir_state.files.iter().filter(|f| !f.valid).count(), 1000);
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
        task.abort();
    }
}
