//! The watches and what each one is for: every watched directory and its existing
//! ancestors, kept in step with the file system as paths appear and disappear. Pure
//! bookkeeping around `inotify_add_watch`: inotify events in, [`DirChange`]s out.

use std::{
    collections::{HashMap, HashSet},
    ffi::{OsStr, OsString},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use inotify::{EventMask, WatchDescriptor, WatchMask, Watches};
use tracing::{debug, warn};

use super::{DirChange, EntryEvent};
use crate::lifecycle::clock::Stamp;

/// Everything reported for a watched directory's entries, plus `IN_MODIFY` (not reported) to
/// know which entries are being written.
fn dir_mask() -> WatchMask {
    WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::CREATE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// Enough to follow the next path component of an ancestor. Added with `MASK_ADD`, so an
/// inode that is also a watched dir (through another path) keeps its full mask.
fn ancestor_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::MASK_ADD
}

/// Events about an ancestor's entry that can change whether the next component exists.
fn structural_events() -> EventMask {
    EventMask::CREATE | EventMask::MOVED_TO | EventMask::MOVED_FROM | EventMask::DELETE
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TargetState {
    /// Nothing reported yet.
    Unknown,
    /// Reported gone.
    Gone,
    /// Reported present, watched with this watch descriptor (None: exists but cannot be watched).
    Present(Option<i32>),
}

struct Target {
    dir: PathBuf,
    state: TargetState,
}

/// The watches and what each one is for. Pure bookkeeping around `inotify_add_watch`.
pub(super) struct WatchTable {
    watches: Watches,
    targets: Vec<Target>,
    /// Every watched path (targets and their existing ancestors) → its watch descriptor.
    path_wd: HashMap<PathBuf, i32>,
    /// Live watch descriptors (several paths may share one inode, hence one descriptor).
    wds: HashMap<i32, WatchDescriptor>,
    /// Paths already warned about (a failing watch is warned about once).
    warned: HashSet<PathBuf>,
    /// Existing directories that could not be watched at the last reconcile, and why
    /// (`ENOSPC`: the user's `fs.inotify.max_user_watches` is used up). Retried until empty.
    pub(super) unwatchable: Vec<(PathBuf, String)>,
    /// Entries being written: (target dir, name).
    pub(super) pending: HashSet<(PathBuf, OsString)>,
    /// Events on entries of watched dirs seen so far.
    pub(super) event_seq: u64,
    /// Open reads per dir ([`ReadToken`]s).
    pub(super) readers: HashMap<PathBuf, u32>,
    /// For dirs with open reads: each entry's last event (`event_seq`).
    pub(super) touched: HashMap<PathBuf, HashMap<OsString, u64>>,
    /// The `event_seq` of the last inotify queue overflow (events lost).
    pub(super) lost_at: u64,
}

impl WatchTable {
    pub(super) fn new(watches: Watches, dirs: Vec<PathBuf>) -> Self {
        let targets = dirs.into_iter().map(|dir| Target { dir, state: TargetState::Unknown }).collect();
        Self {
            watches,
            targets,
            path_wd: HashMap::new(),
            wds: HashMap::new(),
            warned: HashSet::new(),
            unwatchable: Vec::new(),
            pending: HashSet::new(),
            event_seq: 0,
            readers: HashMap::new(),
            touched: HashMap::new(),
            lost_at: 0,
        }
    }

    /// One inotify event → the changes to report.
    pub(super) fn handle(&mut self, mask: EventMask, wd: i32, name: Option<&OsStr>, stamp: Stamp) -> Vec<DirChange> {
        if mask.contains(EventMask::Q_OVERFLOW) {
            warn!("inotify queue overflowed; rescanning every watched directory");
            self.event_seq += 1;
            self.lost_at = self.event_seq;
            return self.reconcile(true, stamp);
        }
        if mask.contains(EventMask::IGNORED) {
            // The kernel dropped the watch (inode deleted, fs unmounted) or we removed it.
            if self.wds.remove(&wd).is_some() {
                self.path_wd.retain(|_, w| *w != wd);
                return self.reconcile(false, stamp);
            }
            return Vec::new();
        }
        if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF) {
            return if self.wds.contains_key(&wd) { self.reconcile(false, stamp) } else { Vec::new() };
        }
        let Some(name) = name else { return Vec::new() };
        let paths: Vec<&PathBuf> = self.path_wd.iter().filter(|(_, w)| **w == wd).map(|(path, _)| path).collect();
        let mut changes = Vec::new();
        let mut structural = false;
        for path in paths {
            for target in &self.targets {
                if target.dir == *path && target.state == TargetState::Present(Some(wd)) {
                    self.event_seq += 1;
                    if self.readers.contains_key(path) {
                        self.touched.entry(path.clone()).or_default().insert(name.to_owned(), self.event_seq);
                    }
                    match classify(mask, path, name) {
                        Classified::Report(event) => {
                            if !matches!(event, EntryEvent::Created | EntryEvent::Attrib) {
                                self.pending.remove(&(path.clone(), name.to_owned()));
                            }
                            changes.push(DirChange::Entry {
                                dir: target.dir.clone(),
                                name: name.to_owned(),
                                event,
                                stamp,
                            });
                        }
                        Classified::Writing => {
                            self.pending.insert((path.clone(), name.to_owned()));
                        }
                        Classified::Ignore => {}
                    }
                }
                if mask.intersects(structural_events()) && next_component(&target.dir, path) == Some(name) {
                    structural = true;
                }
            }
        }
        if structural {
            changes.extend(self.reconcile(false, stamp));
        }
        changes
    }

    /// Every target as it stands, for a consumer that lost track: Rescan (present) or Gone.
    pub(super) fn current_state(&mut self, stamp: Stamp) -> Vec<DirChange> {
        self.pending.clear();
        self.targets
            .iter()
            .map(|target| match target.state {
                TargetState::Present(_) => DirChange::Rescan { dir: target.dir.clone(), stamp },
                TargetState::Gone | TargetState::Unknown => DirChange::Gone { dir: target.dir.clone(), stamp },
            })
            .collect()
    }

    /// Walks every target's path from `/` down, watching each existing prefix, and reports
    /// targets that appeared (Rescan), were replaced (Rescan) or disappeared (Gone). With
    /// `rescan_all`, every existing target is reported Rescan. Watches no longer needed are
    /// removed.
    pub(super) fn reconcile(&mut self, rescan_all: bool, stamp: Stamp) -> Vec<DirChange> {
        let mut desired: HashMap<PathBuf, i32> = HashMap::new();
        let mut changes = Vec::new();
        self.unwatchable.clear();
        for index in 0..self.targets.len() {
            let dir = self.targets[index].dir.clone();
            let prefixes = prefixes(&dir);
            let mut found = None;
            for (position, prefix) in prefixes.iter().enumerate() {
                let is_target = position + 1 == prefixes.len();
                let Some(wd) = self.watch(prefix, is_target) else { break };
                if let Some(wd) = wd {
                    desired.insert(prefix.clone(), wd);
                }
                if is_target {
                    found = Some(wd);
                }
            }
            let target = &mut self.targets[index];
            match (found, target.state) {
                (Some(wd), TargetState::Present(old)) if old == wd && !rescan_all => {}
                (Some(wd), _) => {
                    debug!(dir = %dir.display(), "watched directory present; rescanning");
                    target.state = TargetState::Present(wd);
                    self.pending.retain(|(pending, _)| *pending != dir);
                    changes.push(DirChange::Rescan { dir, stamp });
                }
                (None, TargetState::Gone) => {}
                (None, _) => {
                    debug!(dir = %dir.display(), "watched directory absent");
                    target.state = TargetState::Gone;
                    self.pending.retain(|(pending, _)| *pending != dir);
                    changes.push(DirChange::Gone { dir, stamp });
                }
            }
        }
        let live: HashSet<i32> = desired.values().copied().collect();
        let stale: Vec<i32> = self.wds.keys().filter(|wd| !live.contains(wd)).copied().collect();
        for wd in stale {
            if let Some(descriptor) = self.wds.remove(&wd) {
                // Fails harmlessly when the kernel already dropped it.
                let _ = self.watches.remove(descriptor);
            }
        }
        self.path_wd = desired;
        changes
    }

    /// Watches `path` if it is an existing directory. None: it is not (or no longer) one.
    /// Some(None): it is one but cannot be watched (warned once).
    fn watch(&mut self, path: &Path, is_target: bool) -> Option<Option<i32>> {
        let mask = if is_target { dir_mask() } else { ancestor_mask() };
        match self.watches.add(path, mask) {
            Ok(descriptor) => {
                let wd = descriptor.get_watch_descriptor_id();
                self.wds.insert(wd, descriptor);
                self.warned.remove(path);
                Some(Some(wd))
            }
            Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => None,
            Err(error) => {
                if !path.is_dir() {
                    return None;
                }
                if self.warned.insert(path.to_path_buf()) {
                    warn!(path = %path.display(), %error, "cannot watch directory: its changes are missed until a retry succeeds");
                }
                if !self.unwatchable.iter().any(|(p, _)| p == path) {
                    self.unwatchable.push((path.to_path_buf(), error.to_string()));
                }
                Some(None)
            }
        }
    }
}

/// `/a/b/c` → `/`, `/a`, `/a/b`, `/a/b/c`.
pub(super) fn prefixes(dir: &Path) -> Vec<PathBuf> {
    let mut prefix = PathBuf::new();
    dir.components()
        .map(|component| {
            prefix.push(component);
            prefix.clone()
        })
        .collect()
}

/// The component of `target` right below `ancestor`, if `ancestor` is a strict prefix of it.
pub(super) fn next_component<'a>(target: &'a Path, ancestor: &Path) -> Option<&'a OsStr> {
    target.strip_prefix(ancestor).ok()?.components().next().map(|component| component.as_os_str())
}

/// What an event on a watched dir's entry means.
#[derive(Debug, PartialEq, Eq)]
enum Classified {
    Report(EntryEvent),
    /// Being written: not reported (its IN_CLOSE_WRITE will be), but pending.
    Writing,
    Ignore,
}

fn classify(mask: EventMask, dir: &Path, name: &OsStr) -> Classified {
    if mask.contains(EventMask::DELETE) {
        Classified::Report(EntryEvent::Deleted)
    } else if mask.contains(EventMask::MOVED_FROM) {
        Classified::Report(EntryEvent::MovedOut)
    } else if mask.contains(EventMask::MOVED_TO) {
        Classified::Report(EntryEvent::MovedIn)
    } else if mask.contains(EventMask::CLOSE_WRITE) {
        Classified::Report(EntryEvent::Written)
    } else if mask.contains(EventMask::MODIFY) {
        Classified::Writing
    } else if mask.contains(EventMask::CREATE) {
        if !mask.contains(EventMask::ISDIR)
            && let Ok(meta) = std::fs::symlink_metadata(dir.join(name))
            && meta.file_type().is_file()
            && meta.nlink() <= 1
        {
            // A regular file being written: wait for its IN_CLOSE_WRITE.
            return Classified::Writing;
        }
        Classified::Report(EntryEvent::Created)
    } else if mask.contains(EventMask::ATTRIB) {
        Classified::Report(EntryEvent::Attrib)
    } else {
        Classified::Ignore
    }
}
