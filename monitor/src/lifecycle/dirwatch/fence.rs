//! Fences reads of watched entries against writes in progress (see the parent module's doc):
//! [`ReadFence`] names the entries that changed or are being written during a read, and
//! [`open_for_writing`] asks the kernel whether anyone holds one open for writing.

use std::{
    collections::HashSet,
    ffi::OsString,
    fs::File,
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::SharedInotify;

/// Tells a consumer which entries it may have read half-written or stale (see the module doc).
/// Cheap to clone (shared with the watcher).
#[derive(Clone)]
pub struct ReadFence(pub(super) Arc<SharedInotify>);

/// An open read of a watched dir's entries, from [`ReadFence::begin`] to [`ReadFence::end`].
pub struct ReadToken {
    shared: Arc<SharedInotify>,
    dir: PathBuf,
    /// Events on entries up to this one had been seen when the read began.
    seq: u64,
}

impl ReadFence {
    /// Call before reading entries of watched dir `dir`.
    pub fn begin(&self, dir: &Path) -> ReadToken {
        let _ = self.0.drain();
        let mut state = self.0.lock();
        *state.table.readers.entry(dir.to_path_buf()).or_default() += 1;
        ReadToken { shared: self.0.clone(), dir: dir.to_path_buf(), seq: state.table.event_seq }
    }

    /// Call after reading: which entries of the dir cannot be taken as read (see [`Unsettled`]).
    pub fn end(&self, token: ReadToken) -> Unsettled {
        let _ = token.shared.drain();
        let unsettled = {
            let state = token.shared.lock();
            let table = &state.table;
            let touched = table.touched.get(&token.dir).into_iter().flatten();
            let changed = touched.filter(|(_, seq)| **seq > token.seq).map(|(name, _)| name.clone()).collect();
            let writing =
                table.pending.iter().filter(|(dir, _)| *dir == token.dir).map(|(_, name)| name.clone()).collect();
            Unsettled { changed, writing, all: table.lost_at > token.seq }
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
        let mut state = self.shared.lock();
        let table = &mut state.table;
        let done = match table.readers.get_mut(&self.dir) {
            Some(readers) => {
                *readers = readers.saturating_sub(1);
                *readers == 0
            }
            None => false,
        };
        if done {
            table.readers.remove(&self.dir);
            table.touched.remove(&self.dir);
        }
    }
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
