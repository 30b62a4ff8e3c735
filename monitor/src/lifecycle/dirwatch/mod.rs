//! Watches directories with inotify (no polling) and reports what changed in them, as
//! [`DirChange`]s: used for the CNI config dirs and the CNI result cache.
//!
//! A directory may not exist yet: then its nearest existing ancestor is watched for the next
//! path component, walking down as components appear, and the directory is reported with a
//! [`DirChange::Rescan`] once it exists (the watch is added *before* the rescan is reported, so
//! no file created in between is lost). When a watched directory is removed, moved away or
//! replaced, it is reported [`DirChange::Gone`] (or rescanned, when already replaced) and its
//! ancestors are watched again. Every existing ancestor of a directory stays watched (for its
//! next component only), so renaming a parent of a watched directory is noticed too.
//!
//! Partial writes: a regular file being written shows up as `IN_CREATE` and later
//! `IN_CLOSE_WRITE`; the create is not reported (the close is). Non-regular entries (symlinks,
//! fifos, dirs) and hard links never get a close, so their creation is reported. Known gap: a
//! file published with `O_TMPFILE` + `linkat` (one link, no close in the dir) is only seen at
//! its next event or rescan; write-then-rename (`IN_MOVED_TO`) is the usual way and is seen.
//!
//! Writes in progress: changes are consumed some time after inotify reported them, so when the
//! consumer reads a file it may be in the middle of a later in-place rewrite (truncate, then
//! write). Two tools tell a consumer whether a read can be trusted:
//! - [`open_for_writing`], asked on the consumer's read-only fd *after* reading: whether anyone
//!   has the file open for writing now (then its `IN_CLOSE_WRITE`, reported later, tells). A
//!   writer holds write access from before its truncation until just after its
//!   `IN_CLOSE_WRITE` is queued, so if nobody does, every write that overlapped the read has its
//!   events queued... (and for a few microseconds after a close event, or right after an
//!   `open(O_TRUNC)`, the probe sees a writer that inotify shows no modification from: a consumer
//!   looks again shortly then)
//! - ...which [`ReadFence::begin`] / [`ReadFence::end`] catch: `end` names the entries that had
//!   any event since `begin` (read them again), and those inotify says are being written
//!   (modified or created as a regular file and not yet closed, renamed or deleted: the fallback
//!   where leases are unavailable; the watcher watches `IN_MODIFY` for this without reporting
//!   it). Both read every event the kernel has queued first.
//!
//! Measured on ext4: after `open(O_TRUNC)` the file reads empty *before* the truncation's
//! `IN_MODIFY` is queued, long enough for a read and a drain of the queue to fit in between; the
//! fence alone cannot see that, the write-access probe does. Changes made without an open for
//! writing (`truncate(2)`; `touch -m`, which the kernel reports as `IN_MODIFY`) leave an entry
//! "being written" per inotify until its next close, rename or deletion; the probe tells better.
//!
//! Changes are queued in memory in order. If the consumer falls more than [`MAX_QUEUED`]
//! changes behind, the queue is collapsed into one Rescan (or Gone) per dir, like an inotify
//! queue overflow: memory stays bounded and nothing is lost.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ffi::{OsStr, OsString},
    fs::File,
    io,
    os::{
        fd::{AsRawFd, RawFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use anyhow::Context as _;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::Notify,
    task::JoinHandle,
};
use tracing::{debug, warn};

use crate::lifecycle::timeline::Stamp;

/// Changes queued for the consumer before the queue is collapsed into one rescan per dir.
pub const MAX_QUEUED: usize = 16 * 1024;

/// Bytes of inotify events read at once.
const READ_BUFFER: usize = 64 * 1024;

/// What happened to one entry, from the inotify event that reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryEvent {
    /// Closed after being opened for writing (`IN_CLOSE_WRITE`).
    Written,
    /// Created: a symlink, fifo, socket, directory or hard link (`IN_CREATE`).
    Created,
    /// Renamed into the directory (`IN_MOVED_TO`).
    MovedIn,
    /// Renamed out of the directory, or away from this name (`IN_MOVED_FROM`).
    MovedOut,
    /// Unlinked (`IN_DELETE`).
    Deleted,
    /// Metadata changed: permissions, owner, both timestamps (`IN_ATTRIB`), e.g. `touch`.
    Attrib,
}

/// One change to report about a watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirChange {
    /// Re-examine every entry of `dir`: at start-up for a dir that exists, when the dir appears
    /// (or was replaced by another one), or after an inotify queue overflow. Entries the
    /// consumer knows of that are no longer listed are gone.
    Rescan { dir: PathBuf, stamp: Stamp },
    /// Something happened to entry `name` of `dir` (`event` says what); re-examine it (it may
    /// be gone).
    Entry { dir: PathBuf, name: OsString, event: EntryEvent, stamp: Stamp },
    /// `dir` does not exist (at start-up) or has just disappeared/been moved away: treat all its
    /// entries as gone.
    Gone { dir: PathBuf, stamp: Stamp },
}

impl DirChange {
    /// The watched directory this change is about (as listed by [`DirWatcher::dirs`]).
    pub fn dir(&self) -> &Path {
        match self {
            Self::Rescan { dir, .. } | Self::Entry { dir, .. } | Self::Gone { dir, .. } => dir,
        }
    }

    /// When the change was seen (when its inotify event was read).
    pub fn stamp(&self) -> Stamp {
        match self {
            Self::Rescan { stamp, .. } | Self::Entry { stamp, .. } | Self::Gone { stamp, .. } => *stamp,
        }
    }
}

/// The inotify instance, what its watches are for, and the changes not yet received.
struct Core {
    inotify: Inotify,
    buffer: Vec<u8>,
    tracker: Tracker,
    queue: VecDeque<DirChange>,
    /// Reading inotify failed: no more changes will come.
    failed: bool,
}

impl Core {
    /// Reads and handles every event the kernel has queued. Ok once the queue is empty.
    fn drain(&mut self) -> io::Result<()> {
        if self.failed {
            return Ok(());
        }
        loop {
            let events = match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => events,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    warn!(%error, "reading inotify events failed; directory watch stopped");
                    self.failed = true;
                    return Err(error);
                }
            };
            let stamp = Stamp::now();
            for event in events {
                let wd = event.wd.get_watch_descriptor_id();
                let changes = self.tracker.handle(event.mask, wd, event.name, stamp);
                self.queue.extend(changes);
            }
            if self.queue.len() > MAX_QUEUED {
                warn!(queued = self.queue.len(), "directory changes piling up; collapsing them into rescans");
                self.queue.clear();
                self.queue.extend(self.tracker.current_state(stamp));
            }
        }
    }
}

struct Shared {
    core: Mutex<Core>,
    /// Signalled when changes were queued (or reading failed).
    queued: Notify,
    /// The inotify fd, for readiness polling (owned by `core`, which outlives every user).
    fd: RawFd,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drains the kernel queue and wakes the consumer if anything was queued.
    fn drain(&self) -> io::Result<()> {
        let (result, queued) = {
            let mut core = self.lock();
            let before = core.queue.len();
            let result = core.drain();
            (result, core.queue.len() != before || core.failed)
        };
        if queued {
            self.queued.notify_one();
        }
        result
    }
}

/// Registers the inotify fd with the reactor; holds the fd's owner alive while registered.
struct SharedFd(Arc<Shared>);

impl AsRawFd for SharedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd
    }
}

/// Tells a consumer which entries it may have read half-written or stale (see the module doc).
/// Cheap to clone (shared with the watcher).
#[derive(Clone)]
pub struct ReadFence(Arc<Shared>);

/// An open read of a watched dir's entries, from [`ReadFence::begin`] to [`ReadFence::end`].
pub struct ReadToken {
    shared: Arc<Shared>,
    dir: PathBuf,
    /// Events on entries up to this one had been seen when the read began.
    seq: u64,
}

impl ReadFence {
    /// Call before reading entries of watched dir `dir`.
    pub fn begin(&self, dir: &Path) -> ReadToken {
        let _ = self.0.drain();
        let mut core = self.0.lock();
        *core.tracker.readers.entry(dir.to_path_buf()).or_default() += 1;
        ReadToken { shared: self.0.clone(), dir: dir.to_path_buf(), seq: core.tracker.event_seq }
    }

    /// Call after reading: which entries of the dir cannot be taken as read (see [`Unsettled`]).
    pub fn end(&self, token: ReadToken) -> Unsettled {
        let _ = token.shared.drain();
        let unsettled = {
            let core = token.shared.lock();
            let tracker = &core.tracker;
            let touched = tracker.touched.get(&token.dir).into_iter().flatten();
            let changed = touched.filter(|(_, seq)| **seq > token.seq).map(|(name, _)| name.clone()).collect();
            let writing =
                tracker.pending.iter().filter(|(dir, _)| *dir == token.dir).map(|(_, name)| name.clone()).collect();
            Unsettled { changed, writing, all: tracker.lost_at > token.seq }
        };
        drop(token); // takes the lock again
        unsettled
    }
}

/// What [`ReadFence::end`] found: entries whose read may be partial or stale.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unsettled {
    /// Entries with events since the read began: what was read may be stale or partial; read
    /// them again.
    pub changed: HashSet<OsString>,
    /// Entries being written as far as inotify tells (modified or created, not yet closed,
    /// renamed or deleted). Use when [`open_for_writing`] cannot tell.
    pub writing: HashSet<OsString>,
    /// Events were lost meanwhile (inotify queue overflow): trust nothing that was read; a
    /// Rescan of every dir is queued.
    pub all: bool,
}

impl Drop for ReadToken {
    fn drop(&mut self) {
        let mut core = self.shared.lock();
        let tracker = &mut core.tracker;
        let done = match tracker.readers.get_mut(&self.dir) {
            Some(readers) => {
                *readers = readers.saturating_sub(1);
                *readers == 0
            }
            None => false,
        };
        if done {
            tracker.readers.remove(&self.dir);
            tracker.touched.remove(&self.dir);
        }
    }
}

/// A running directory watcher: the receiving end of [`watch_dirs`]. Dropping it stops the
/// inotify task.
pub struct DirWatcher {
    dirs: Vec<PathBuf>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl DirWatcher {
    /// The watched directories: absolute, lexically normalized (no `.`, no trailing `/`),
    /// duplicates removed, in the order first given. Every [`DirChange::dir`] is one of these.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The next change. The first `dirs().len()` changes are the start-up state, exactly one
    /// [`DirChange::Rescan`] (dir exists) or [`DirChange::Gone`] (it does not) per dir, in
    /// `dirs()` order. Returns None only if reading inotify failed (logged).
    pub async fn recv(&mut self) -> Option<DirChange> {
        loop {
            {
                let mut core = self.shared.lock();
                if let Some(change) = core.queue.pop_front() {
                    return Some(change);
                }
                if core.failed {
                    return None;
                }
            }
            // notify_one keeps a permit when nobody waits: no wake-up is lost.
            self.shared.queued.notified().await;
        }
    }

    /// The fence for reads of the watched dirs' entries (shared with the watcher).
    pub fn read_fence(&self) -> ReadFence {
        ReadFence(self.shared.clone())
    }
}

impl Drop for DirWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts watching `dirs` (which need not exist). Must be called inside a tokio runtime with
/// I/O enabled. Returns once every watch is in place and the start-up state is known (see
/// [`DirWatcher::recv`]). Errors: no tokio runtime, an empty path, or inotify unavailable.
pub fn watch_dirs(dirs: Vec<PathBuf>) -> anyhow::Result<DirWatcher> {
    tokio::runtime::Handle::try_current().context("watch_dirs must be called inside a tokio runtime")?;
    let mut targets: Vec<PathBuf> = Vec::with_capacity(dirs.len());
    for dir in &dirs {
        let dir = normalize(dir)?;
        if !targets.contains(&dir) {
            targets.push(dir);
        }
    }
    let inotify = Inotify::init().context("inotify_init1 failed")?;
    let fd = inotify.as_raw_fd();
    let mut tracker = Tracker::new(inotify.watches(), targets.clone());
    let queue = tracker.reconcile(false, Stamp::now()).into();
    let core = Core { inotify, buffer: vec![0; READ_BUFFER], tracker, queue, failed: false };
    let shared = Arc::new(Shared { core: Mutex::new(core), queued: Notify::new(), fd });
    // SAFETY: the fd belongs to the `Inotify` inside `shared`, which `SharedFd` keeps alive: it
    // stays open, and is the same fd, for as long as the AsyncFd exists.
    let readiness = unsafe { AsyncFd::register_with_interest(SharedFd(shared.clone()), Interest::READABLE) }
        .map_err(io::Error::from)
        .context("cannot poll the inotify fd")?;
    let task = tokio::spawn(run(readiness));
    Ok(DirWatcher { dirs: targets, shared, task })
}

/// `F_SETSIG` (asm-generic/fcntl.h, not overridden by any architecture; the libc crate lacks
/// it for glibc targets).
const F_SETSIG: libc::c_int = 10;

/// Whether anyone has `file` (a regular file opened read-only) open for writing right now.
/// Probes for a read lease (`F_SETLEASE F_RDLCK` fails with EAGAIN while the file is open for
/// writing) and releases it at once. None when that cannot tell: leases unavailable (neither
/// the file's owner nor CAP_LEASE, `fs.leases-enable=0`, a filesystem without leases).
///
/// Side effects, both tiny: a writer opening the file during the microseconds the lease is held
/// waits for its release; and the lease-break signal goes to this process, so it is set to
/// SIGURG first (ignored by default; the default SIGIO would terminate the process).
pub fn open_for_writing(file: &File) -> Option<bool> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on an fd owned by `file`, with integer arguments only.
    unsafe {
        if libc::fcntl(fd, F_SETSIG, libc::SIGURG) != 0 {
            return None;
        }
        if libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) == 0 {
            libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
            return Some(false);
        }
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => Some(true),
        _ => None,
    }
}

/// Absolute and lexically normalized: `std::path::absolute`, then `.` and trailing `/` dropped.
pub fn normalize(dir: &Path) -> anyhow::Result<PathBuf> {
    let absolute = std::path::absolute(dir).with_context(|| format!("bad directory path {dir:?}"))?;
    Ok(absolute.components().collect())
}

/// Reads inotify events as they come.
async fn run(readiness: AsyncFd<SharedFd>) {
    loop {
        let mut guard = match readiness.readable().await {
            Ok(guard) => guard,
            Err(error) => {
                warn!(%error, "polling the inotify fd failed; directory watch stopped");
                let shared = &readiness.get_ref().0;
                shared.lock().failed = true;
                shared.queued.notify_one();
                return;
            }
        };
        // Drained until the kernel queue was empty: wait for the next edge. (A readiness edge
        // that arrives meanwhile is not cleared: tokio compares readiness ticks.)
        if readiness.get_ref().0.drain().is_err() {
            return;
        }
        guard.clear_ready();
    }
}

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
struct Tracker {
    watches: Watches,
    targets: Vec<Target>,
    /// Every watched path (targets and their existing ancestors) → its watch descriptor.
    path_wd: HashMap<PathBuf, i32>,
    /// Live watch descriptors (several paths may share one inode, hence one descriptor).
    wds: HashMap<i32, WatchDescriptor>,
    /// Paths already warned about (a failing watch is warned about once).
    warned: HashSet<PathBuf>,
    /// Entries being written: (target dir, name).
    pending: HashSet<(PathBuf, OsString)>,
    /// Events on entries of watched dirs seen so far.
    event_seq: u64,
    /// Open reads per dir ([`ReadToken`]s).
    readers: HashMap<PathBuf, u32>,
    /// For dirs with open reads: each entry's last event (`event_seq`).
    touched: HashMap<PathBuf, HashMap<OsString, u64>>,
    /// The `event_seq` of the last inotify queue overflow (events lost).
    lost_at: u64,
}

impl Tracker {
    fn new(watches: Watches, dirs: Vec<PathBuf>) -> Self {
        let targets = dirs.into_iter().map(|dir| Target { dir, state: TargetState::Unknown }).collect();
        Self {
            watches,
            targets,
            path_wd: HashMap::new(),
            wds: HashMap::new(),
            warned: HashSet::new(),
            pending: HashSet::new(),
            event_seq: 0,
            readers: HashMap::new(),
            touched: HashMap::new(),
            lost_at: 0,
        }
    }

    /// One inotify event → the changes to report.
    fn handle(&mut self, mask: EventMask, wd: i32, name: Option<&OsStr>, stamp: Stamp) -> Vec<DirChange> {
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
    fn current_state(&mut self, stamp: Stamp) -> Vec<DirChange> {
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
    fn reconcile(&mut self, rescan_all: bool, stamp: Stamp) -> Vec<DirChange> {
        let mut desired: HashMap<PathBuf, i32> = HashMap::new();
        let mut changes = Vec::new();
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
                    warn!(path = %path.display(), %error, "cannot watch directory; its changes will be missed");
                }
                Some(None)
            }
        }
    }
}

/// `/a/b/c` → `/`, `/a`, `/a/b`, `/a/b/c`.
fn prefixes(dir: &Path) -> Vec<PathBuf> {
    let mut prefix = PathBuf::new();
    dir.components()
        .map(|component| {
            prefix.push(component);
            prefix.clone()
        })
        .collect()
}

/// The component of `target` right below `ancestor`, if `ancestor` is a strict prefix of it.
fn next_component<'a>(target: &'a Path, ancestor: &Path) -> Option<&'a OsStr> {
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

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::symlink, time::Duration};

    use super::*;

    use crate::test_support::TempDir;

    /// Receives changes until one matches, failing after a deadline; returns all received.
    async fn until(watcher: &mut DirWatcher, what: &str, mut pred: impl FnMut(&DirChange) -> bool) -> Vec<DirChange> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, watcher.recv()).await {
                Ok(Some(change)) => {
                    let done = pred(&change);
                    seen.push(change);
                    if done {
                        return seen;
                    }
                }
                Ok(None) => panic!("watcher ended while waiting for {what}; got {seen:#?}"),
                Err(_) => panic!("timed out waiting for {what}; got {seen:#?}"),
            }
        }
    }

    /// What `touch` does to an existing file: set both times (IN_ATTRIB).
    fn touch(path: &Path) {
        let now = std::time::SystemTime::now();
        let times = std::fs::FileTimes::new().set_accessed(now).set_modified(now);
        std::fs::File::open(path).unwrap().set_times(times).unwrap();
    }

    fn is_entry(change: &DirChange, want: &str, want_event: EntryEvent) -> bool {
        matches!(change, DirChange::Entry { name, event, .. } if name == want && *event == want_event)
    }

    fn entries(changes: &[DirChange]) -> Vec<(String, EntryEvent)> {
        changes
            .iter()
            .filter_map(|change| match change {
                DirChange::Entry { name, event, .. } => Some((name.to_string_lossy().into_owned(), *event)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn prefixes_and_components() {
        assert_eq!(prefixes(Path::new("/a/b")), [PathBuf::from("/"), PathBuf::from("/a"), PathBuf::from("/a/b")]);
        assert_eq!(next_component(Path::new("/a/b/c"), Path::new("/a")), Some(OsStr::new("b")));
        assert_eq!(next_component(Path::new("/a/b"), Path::new("/a/b")), None);
        assert_eq!(next_component(Path::new("/ab/c"), Path::new("/a")), None);
        assert_eq!(normalize(Path::new("/a/./b/")).unwrap(), PathBuf::from("/a/b"));
        assert!(normalize(Path::new("")).is_err());
    }

    #[tokio::test]
    async fn reports_files_created_rewritten_deleted_renamed_and_symlinked() {
        let tmp = TempDir::new("files");
        let dir = tmp.0.join("d");
        let outside = tmp.0.join("outside");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let mut watcher = watch_dirs(vec![dir.clone(), dir.join("."), dir.clone()]).unwrap();
        assert_eq!(watcher.dirs(), std::slice::from_ref(&dir), "duplicates are removed");
        let first = watcher.recv().await.unwrap();
        assert!(matches!(&first, DirChange::Rescan { dir: d, .. } if *d == dir), "{first:?}");

        std::fs::write(dir.join("a.conf"), b"{}").unwrap();
        let got = until(&mut watcher, "a.conf written", |c| is_entry(c, "a.conf", EntryEvent::Written)).await;
        assert_eq!(entries(&got), [("a.conf".to_string(), EntryEvent::Written)], "no entry for the regular create");

        std::fs::write(dir.join("a.conf"), b"{\"x\":1}").unwrap();
        until(&mut watcher, "a.conf rewritten", |c| is_entry(c, "a.conf", EntryEvent::Written)).await;

        std::fs::rename(dir.join("a.conf"), outside.join("a.conf")).unwrap();
        until(&mut watcher, "a.conf moved out", |c| is_entry(c, "a.conf", EntryEvent::MovedOut)).await;

        std::fs::rename(outside.join("a.conf"), dir.join("b.conf")).unwrap();
        until(&mut watcher, "b.conf moved in", |c| is_entry(c, "b.conf", EntryEvent::MovedIn)).await;

        symlink("b.conf", dir.join("link.conf")).unwrap();
        until(&mut watcher, "symlink created", |c| is_entry(c, "link.conf", EntryEvent::Created)).await;

        std::fs::remove_file(dir.join("b.conf")).unwrap();
        until(&mut watcher, "b.conf deleted", |c| is_entry(c, "b.conf", EntryEvent::Deleted)).await;

        std::fs::create_dir(dir.join("sub")).unwrap();
        until(&mut watcher, "subdir created", |c| is_entry(c, "sub", EntryEvent::Created)).await;

        // Writes outside the watched dir are not reported.
        std::fs::write(outside.join("c.conf"), b"{}").unwrap();
        std::fs::write(dir.join("marker"), b"").unwrap();
        let got = until(&mut watcher, "marker", |c| is_entry(c, "marker", EntryEvent::Written)).await;
        assert_eq!(entries(&got), [("marker".to_string(), EntryEvent::Written)]);
    }

    #[tokio::test]
    async fn fences_reads_against_writes_in_progress() {
        use std::io::Write as _;
        let tmp = TempDir::new("fence");
        let mut watcher = watch_dirs(vec![tmp.0.clone()]).unwrap();
        let fence = watcher.read_fence();
        assert!(matches!(watcher.recv().await.unwrap(), DirChange::Rescan { .. }));
        let unsettled = |fence: &ReadFence| {
            let token = fence.begin(&tmp.0);
            let unsettled = fence.end(token);
            let mut names: Vec<String> = (unsettled.changed.into_iter().chain(unsettled.writing))
                .map(|name| name.to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let mut file = std::fs::File::create(tmp.0.join("w.conf")).unwrap();
        file.write_all(b"{\"partial\":").unwrap();
        // Known at once (the fence reads the kernel queue itself), and nothing reported.
        assert_eq!(unsettled(&fence), ["w.conf"]);
        std::fs::write(tmp.0.join("marker"), b"").unwrap();
        let got = until(&mut watcher, "marker", |c| is_entry(c, "marker", EntryEvent::Written)).await;
        assert_eq!(entries(&got), [("marker".to_string(), EntryEvent::Written)]);
        file.write_all(b"1}").unwrap();
        drop(file);
        assert!(unsettled(&fence).is_empty());
        until(&mut watcher, "w.conf closed", |c| is_entry(c, "w.conf", EntryEvent::Written)).await;

        // A whole rewrite, or a touch, between begin and end: unsettled although nothing is
        // being written by the time of `end`.
        let token = fence.begin(&tmp.0);
        std::fs::write(tmp.0.join("w.conf"), b"{}").unwrap();
        touch(&tmp.0.join("marker"));
        let after = fence.end(token);
        let mut names: Vec<OsString> = after.changed.into_iter().collect();
        names.sort();
        assert_eq!(names, [OsString::from("marker"), OsString::from("w.conf")]);
        assert!(after.writing.is_empty());
        assert!(unsettled(&fence).is_empty(), "only events after begin count");
        until(&mut watcher, "touch", |c| is_entry(c, "marker", EntryEvent::Attrib)).await;
        // Events lost to a queue overflow during a read: nothing read is trusted, and every
        // dir is rescanned.
        let token = fence.begin(&tmp.0);
        {
            let mut core = watcher.shared.lock();
            let changes = core.tracker.handle(EventMask::Q_OVERFLOW, -1, None, Stamp::now());
            core.queue.extend(changes);
        }
        assert!(fence.end(token).all);
        until(&mut watcher, "rescan after overflow", |c| matches!(c, DirChange::Rescan { .. })).await;
        assert!(!fence.end(fence.begin(&tmp.0)).all, "only overflows after begin count");
        // Bookkeeping is dropped with the last open read.
        let core = watcher.shared.lock();
        assert!(core.tracker.readers.is_empty() && core.tracker.touched.is_empty());
    }

    #[tokio::test]
    async fn follows_a_dir_that_appears_later_two_levels_deep() {
        let tmp = TempDir::new("later");
        let dir = tmp.0.join("a").join("b");
        let mut watcher = watch_dirs(vec![dir.clone()]).unwrap();
        let first = watcher.recv().await.unwrap();
        assert!(matches!(&first, DirChange::Gone { dir: d, .. } if *d == dir), "{first:?}");

        // Unrelated activity in the ancestors is not reported.
        std::fs::write(tmp.0.join("noise"), b"x").unwrap();
        std::fs::create_dir(tmp.0.join("a")).unwrap();
        std::fs::write(tmp.0.join("a").join("noise"), b"x").unwrap();
        std::fs::create_dir(&dir).unwrap();
        // A file written right after the dir appears is never lost: either the rescan lists it
        // or its entry is reported after the rescan.
        std::fs::write(dir.join("early.conf"), b"{}").unwrap();
        let got = until(&mut watcher, "rescan", |c| matches!(c, DirChange::Rescan { .. })).await;
        assert_eq!(got.len(), 1, "only the rescan: {got:?}");

        std::fs::write(dir.join("late.conf"), b"{}").unwrap();
        until(&mut watcher, "late.conf", |c| is_entry(c, "late.conf", EntryEvent::Written)).await;
    }

    #[tokio::test]
    async fn reports_a_removed_dir_gone_and_follows_its_recreation() {
        let tmp = TempDir::new("removed");
        let dir = tmp.0.join("a").join("b");
        std::fs::create_dir_all(&dir).unwrap();
        let mut watcher = watch_dirs(vec![dir.clone()]).unwrap();
        assert!(matches!(watcher.recv().await.unwrap(), DirChange::Rescan { .. }));

        std::fs::remove_dir(&dir).unwrap();
        until(&mut watcher, "gone", |c| matches!(c, DirChange::Gone { .. })).await;

        std::fs::create_dir(&dir).unwrap();
        until(&mut watcher, "rescan after recreation", |c| matches!(c, DirChange::Rescan { .. })).await;
        std::fs::write(dir.join("x.conf"), b"{}").unwrap();
        until(&mut watcher, "x.conf in the new dir", |c| is_entry(c, "x.conf", EntryEvent::Written)).await;

        // Removing a whole ancestor tree, then renaming a parent of a recreated dir.
        std::fs::remove_dir_all(tmp.0.join("a")).unwrap();
        until(&mut watcher, "gone with its parent", |c| matches!(c, DirChange::Gone { .. })).await;
        std::fs::create_dir_all(&dir).unwrap();
        until(&mut watcher, "rescan", |c| matches!(c, DirChange::Rescan { .. })).await;
        std::fs::rename(tmp.0.join("a"), tmp.0.join("a-old")).unwrap();
        until(&mut watcher, "gone after parent rename", |c| matches!(c, DirChange::Gone { .. })).await;
        std::fs::write(tmp.0.join("a-old").join("b").join("y.conf"), b"{}").unwrap();
        std::fs::rename(tmp.0.join("a-old"), tmp.0.join("a")).unwrap();
        let got = until(&mut watcher, "rescan after rename back", |c| matches!(c, DirChange::Rescan { .. })).await;
        assert!(entries(&got).is_empty(), "writes in the moved-away dir are not reported: {got:?}");
    }

    #[tokio::test]
    async fn watches_nested_targets_and_reports_overflow_as_rescan() {
        let tmp = TempDir::new("nested");
        let outer = tmp.0.join("x");
        let inner = outer.join("y");
        std::fs::create_dir(&outer).unwrap();
        let mut watcher = watch_dirs(vec![inner.clone(), outer.clone()]).unwrap();
        assert!(matches!(watcher.recv().await.unwrap(), DirChange::Gone { dir, .. } if dir == inner));
        assert!(matches!(watcher.recv().await.unwrap(), DirChange::Rescan { dir, .. } if dir == outer));

        std::fs::create_dir(&inner).unwrap();
        let got =
            until(&mut watcher, "inner rescan", |c| matches!(c, DirChange::Rescan { dir, .. } if *dir == inner)).await;
        assert!(entries(&got).contains(&("y".to_string(), EntryEvent::Created)), "{got:?}");

        // A simulated overflow rescans every existing dir.
        let inotify = Inotify::init().unwrap();
        let mut tracker = Tracker::new(inotify.watches(), vec![inner.clone(), tmp.0.join("missing")]);
        let initial = tracker.reconcile(false, Stamp::now());
        assert!(matches!(initial.as_slice(), [DirChange::Rescan { .. }, DirChange::Gone { .. }]), "{initial:?}");
        assert!(tracker.reconcile(false, Stamp::now()).is_empty(), "nothing changed");
        let after = tracker.handle(EventMask::Q_OVERFLOW, -1, None, Stamp::now());
        assert!(matches!(after.as_slice(), [DirChange::Rescan { dir, .. }] if *dir == inner), "{after:?}");
    }
}
