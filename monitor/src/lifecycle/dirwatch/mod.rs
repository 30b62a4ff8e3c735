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
//! A directory that exists but cannot be watched (`ENOSPC`: `fs.inotify.max_user_watches` used
//! up) is retried with [`Backoff`] and rescanned once watched; until then, and after a failed
//! read of the inotify fd, the watcher's [`SourceHandle`] (see [`DirWatcher::report_health`])
//! says the source is down.
//!
//! Changes are queued in memory in order. If the consumer falls more than [`MAX_QUEUED`]
//! changes behind, the queue is collapsed into one Rescan (or Gone) per dir, like an inotify
//! queue overflow: memory stays bounded and nothing is lost.

mod fence;
mod watch_table;

use std::{
    collections::VecDeque,
    ffi::OsString,
    io,
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use anyhow::Context as _;
use inotify::Inotify;
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::Notify,
    task::JoinHandle,
};
use tracing::warn;

pub use self::fence::{ReadFence, ReadToken, Unsettled, open_for_writing};
use self::watch_table::WatchTable;
use crate::{
    lifecycle::{
        clock::Stamp,
        sources::{Backoff, SourceHandle},
    },
    sync,
};

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
struct InotifyState {
    inotify: Inotify,
    buffer: Vec<u8>,
    table: WatchTable,
    queue: VecDeque<DirChange>,
    /// Reading inotify failed: no more changes will come.
    failed: bool,
    /// Where this watch reports whether it works.
    health: Option<SourceHandle>,
}

impl InotifyState {
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
                let changes = self.table.handle(event.mask, wd, event.name, stamp);
                self.queue.extend(changes);
            }
            if self.queue.len() > MAX_QUEUED {
                warn!(queued = self.queue.len(), "directory changes piling up; collapsing them into rescans");
                self.queue.clear();
                self.queue.extend(self.table.current_state(stamp));
            }
        }
    }

    /// Down when reading failed or a directory cannot be watched; up otherwise.
    fn report_health(&self) {
        let Some(health) = &self.health else { return };
        if self.failed {
            health.down("reading inotify events failed");
        } else if let Some((path, error)) = self.table.unwatchable.first() {
            health.down(format!("cannot watch {}: {error}", path.display()));
        } else {
            health.up();
        }
    }

    /// Tries again to watch what could not be watched; queues what that finds. Returns whether
    /// something is still unwatchable.
    fn retry_unwatchable(&mut self) -> bool {
        let changes = self.table.reconcile(false, Stamp::now());
        self.queue.extend(changes);
        self.report_health();
        !self.table.unwatchable.is_empty()
    }
}

/// The inotify state shared by the watcher, its reader task and the read fences, and the
/// wake-up of the consumer.
pub(super) struct SharedInotify {
    state: Mutex<InotifyState>,
    /// Signalled when changes were queued (or reading failed).
    queued: Notify,
    /// The inotify fd, for readiness polling (owned by `state`, which outlives every user).
    fd: RawFd,
}

impl SharedInotify {
    fn lock(&self) -> MutexGuard<'_, InotifyState> {
        sync::lock(&self.state)
    }

    /// Drains the kernel queue and wakes the consumer if anything was queued.
    fn drain(&self) -> io::Result<()> {
        let (result, queued) = {
            let mut state = self.lock();
            let before = state.queue.len();
            let result = state.drain();
            state.report_health();
            (result, state.queue.len() != before || state.failed)
        };
        if queued {
            self.queued.notify_one();
        }
        result
    }
}

/// Registers the inotify fd with the reactor; holds the fd's owner alive while registered.
struct InotifyFd(Arc<SharedInotify>);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd
    }
}

/// A running directory watcher: the receiving end of [`watch_dirs`]. Dropping it stops the
/// inotify task.
pub struct DirWatcher {
    dirs: Vec<PathBuf>,
    shared: Arc<SharedInotify>,
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
                let mut state = self.shared.lock();
                if let Some(change) = state.queue.pop_front() {
                    return Some(change);
                }
                if state.failed {
                    return None;
                }
            }
            // notify_one keeps a permit when nobody waits: no wake-up is lost.
            self.shared.queued.notified().await;
        }
    }

    /// Reports, from now on, whether this watch works to `health`: down while reading failed
    /// or an existing directory cannot be watched.
    pub fn report_health(&self, health: SourceHandle) {
        let mut state = self.shared.lock();
        state.health = Some(health);
        state.report_health();
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
    let mut table = WatchTable::new(inotify.watches(), targets.clone());
    let queue = table.reconcile(false, Stamp::now()).into();
    let state = InotifyState { inotify, buffer: vec![0; READ_BUFFER], table, queue, failed: false, health: None };
    let shared = Arc::new(SharedInotify { state: Mutex::new(state), queued: Notify::new(), fd });
    // SAFETY: the fd belongs to the `Inotify` inside `shared`, which `InotifyFd` keeps alive: it
    // stays open, and is the same fd, for as long as the AsyncFd exists.
    let readiness = unsafe { AsyncFd::register_with_interest(InotifyFd(shared.clone()), Interest::READABLE) }
        .map_err(io::Error::from)
        .context("cannot poll the inotify fd")?;
    let task = tokio::spawn(run(readiness));
    Ok(DirWatcher { dirs: targets, shared, task })
}

/// Watches `dirs` again after a watcher failed (its `recv` returned None): tries with
/// backoff until a new watcher runs, reporting to `health` meanwhile. The new watcher's first
/// changes are the start-up state of every dir, a full resync for the consumer.
pub async fn rewatch(dirs: &[PathBuf], health: &SourceHandle) -> DirWatcher {
    let mut backoff = Backoff::default();
    loop {
        backoff.wait().await;
        match watch_dirs(dirs.to_vec()) {
            Ok(watcher) => {
                watcher.report_health(health.clone());
                return watcher;
            }
            Err(error) => health.down(format!("{error:#}")),
        }
    }
}

/// Absolute and lexically normalized: `std::path::absolute`, then `.` and trailing `/` dropped.
pub fn normalize(dir: &Path) -> anyhow::Result<PathBuf> {
    let absolute = std::path::absolute(dir).with_context(|| format!("bad directory path {dir:?}"))?;
    Ok(absolute.components().collect())
}

/// Reads inotify events as they come; retries, with backoff, directories that could not be
/// watched.
async fn run(readiness: AsyncFd<InotifyFd>) {
    let shared = Arc::clone(&readiness.get_ref().0);
    let mut backoff = Backoff::default();
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        // Something is unwatchable: retry at the backoff's pace, however many events come.
        let unwatchable = !shared.lock().table.unwatchable.is_empty();
        match (unwatchable, retry_at) {
            (true, None) => retry_at = Some(tokio::time::Instant::now() + backoff.next_wait()),
            (false, Some(_)) => {
                retry_at = None;
                backoff.reset();
            }
            _ => {}
        }
        let readable = tokio::select! {
            readable = readiness.readable() => readable,
            () = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)), if retry_at.is_some() => {
                let (still, queued) = {
                    let mut state = shared.lock();
                    (state.retry_unwatchable(), !state.queue.is_empty())
                };
                if queued {
                    shared.queued.notify_one();
                }
                retry_at = still.then(|| tokio::time::Instant::now() + backoff.next_wait());
                continue;
            }
        };
        let mut guard = match readable {
            Ok(guard) => guard,
            Err(error) => {
                warn!(%error, "polling the inotify fd failed; directory watch stopped");
                let mut state = shared.lock();
                state.failed = true;
                state.report_health();
                drop(state);
                shared.queued.notify_one();
                return;
            }
        };
        // Drained until the kernel queue was empty: wait for the next edge. (A readiness edge
        // that arrives meanwhile is not cleared: tokio compares readiness ticks.)
        if shared.drain().is_err() {
            return;
        }
        guard.clear_ready();
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::symlink, time::Duration};

    use std::ffi::OsStr;

    use inotify::EventMask;

    use super::{
        watch_table::{next_component, prefixes},
        *,
    };

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
            let mut state = watcher.shared.lock();
            let changes = state.table.handle(EventMask::Q_OVERFLOW, -1, None, Stamp::now());
            state.queue.extend(changes);
        }
        assert!(fence.end(token).all);
        until(&mut watcher, "rescan after overflow", |c| matches!(c, DirChange::Rescan { .. })).await;
        assert!(!fence.end(fence.begin(&tmp.0)).all, "only overflows after begin count");
        // Bookkeeping is dropped with the last open read.
        let state = watcher.shared.lock();
        assert!(state.table.readers.is_empty() && state.table.touched.is_empty());
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
        let mut table = WatchTable::new(inotify.watches(), vec![inner.clone(), tmp.0.join("missing")]);
        let initial = table.reconcile(false, Stamp::now());
        assert!(matches!(initial.as_slice(), [DirChange::Rescan { .. }, DirChange::Gone { .. }]), "{initial:?}");
        assert!(table.reconcile(false, Stamp::now()).is_empty(), "nothing changed");
        let after = table.handle(EventMask::Q_OVERFLOW, -1, None, Stamp::now());
        assert!(matches!(after.as_slice(), [DirChange::Rescan { dir, .. }] if *dir == inner), "{after:?}");
    }
}
