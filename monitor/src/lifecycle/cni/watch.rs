//! Follows the CNI config dirs with inotify: reads each changed entry until the read is
//! settled (not torn by a write in progress), applies it to its dir's state, and records the
//! events on the timeline.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::{
    dir_state::{CniSnapshot, DirState, Removal},
    rules::{Examined, FileFacts, Listing, examine, is_config_name, list_dir},
};
use crate::{
    lifecycle::{
        clock::Stamp,
        dirwatch::{self, DirChange, EntryEvent, ReadFence, Unsettled},
        sources::SourceHandle,
        timeline::{Event, Timeline},
    },
    sync,
};

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
enum ReadOutcome {
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

fn judge(name: &OsStr, examined: Examined, unsettled: &Unsettled) -> ReadOutcome {
    match examined {
        _ if unsettled.all => ReadOutcome::Leave,
        Examined::BeingWritten if unsettled.writing.contains(name) => ReadOutcome::Leave,
        Examined::BeingWritten => ReadOutcome::Wait,
        _ if unsettled.changed.contains(name) => ReadOutcome::Again,
        Examined::Found { checked: false, .. } if unsettled.writing.contains(name) => ReadOutcome::Leave,
        Examined::Absent => ReadOutcome::Use(None),
        Examined::Found { facts, .. } => ReadOutcome::Use(Some(facts)),
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
            ReadOutcome::Use(facts) => return Some(facts),
            ReadOutcome::Again if again < READ_AGAIN => again += 1,
            ReadOutcome::Again => {
                debug!(dir = %dir.display(), ?name, "CNI config keeps changing while read; left for its next change");
                return None;
            }
            ReadOutcome::Wait => match pauses.next() {
                Some(pause) => tokio::time::sleep(*pause).await,
                None => return None,
            },
            ReadOutcome::Leave => return None,
        }
    }
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
        let dirs = sync::lock(&self.dirs);
        CniSnapshot { dirs: dirs.iter().map(DirState::snapshot).collect() }
    }

    /// The watched dirs (absolute, normalized, deduplicated).
    pub fn dirs(&self) -> Vec<PathBuf> {
        sync::lock(&self.dirs).iter().map(|dir| dir.dir().to_path_buf()).collect()
    }

    fn with_dir(&self, dir: &Path, apply: impl FnOnce(&mut DirState) -> Vec<Event>) -> Vec<Event> {
        let mut dirs = sync::lock(&self.dirs);
        dirs.iter_mut().find(|state| state.dir() == dir).map(apply).unwrap_or_default()
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
                ReadOutcome::Use(Some(facts)) => {
                    files.insert(name, facts);
                }
                ReadOutcome::Use(None) => {}
                ReadOutcome::Again | ReadOutcome::Wait => {
                    again.insert(name);
                }
                ReadOutcome::Leave => {
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
                if let Some(known) = state.known(&name) {
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
pub async fn start(
    dirs: Vec<PathBuf>,
    timeline: Arc<Timeline>,
    health: SourceHandle,
) -> anyhow::Result<(CniWatcher, JoinHandle<()>)> {
    let mut watcher = dirwatch::watch_dirs(dirs).context("cannot watch the CNI config dirs")?;
    watcher.report_health(health.clone());
    let mut fence = watcher.read_fence();
    let states = watcher.dirs().iter().cloned().map(DirState::new).collect();
    let cni = CniWatcher { dirs: Arc::new(Mutex::new(states)) };
    for _ in 0..watcher.dirs().len() {
        let change = watcher.recv().await.context("CNI config dir watch ended during start-up")?;
        cni.apply(change, &fence, &timeline).await;
    }
    let task = tokio::spawn({
        let cni = cni.clone();
        async move {
            loop {
                while let Some(change) = watcher.recv().await {
                    cni.apply(change, &fence, &timeline).await;
                }
                // Its first changes rescan every dir: what changed meanwhile is recorded then.
                watcher = dirwatch::rewatch(watcher.dirs(), &health).await;
                fence = watcher.read_fence();
            }
        }
    });
    Ok((cni, task))
}

#[cfg(test)]
mod tests {
    use std::{fmt::Write as _, fs, fs::File};

    use super::{
        super::rules::fixtures::{VALID, valid},
        *,
    };
    use crate::{
        lifecycle::{
            sources::{CNI_CONFIG, Sources},
            timeline::EventKind,
        },
        test_support::TempDir,
    };

    use EventKind::{
        CniConfigAdded as Added, CniConfigChanged as Changed, CniConfigInvalid as Invalid, CniConfigRemoved as Removed,
        CniDefaultNetworkMissing as Missing, CniDefaultNetworkRestored as Restored,
    };

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
            (found(true), &settled, ReadOutcome::Use(Some(facts.clone()))),
            (Examined::Absent, &settled, ReadOutcome::Use(None)),
            (found(true), &other, ReadOutcome::Use(Some(facts.clone()))),
            (found(true), &changed, ReadOutcome::Again),
            (Examined::Absent, &changed, ReadOutcome::Again),
            // inotify says "being written": trusted only when the write-access probe could not tell.
            (found(true), &writing, ReadOutcome::Use(Some(facts.clone()))),
            (found(false), &writing, ReadOutcome::Leave),
            (found(false), &settled, ReadOutcome::Use(Some(facts.clone()))),
            // Open for writing: modified since its last close, the close is coming; not modified,
            // the writer is at its open or its close: look again shortly.
            (Examined::BeingWritten, &writing, ReadOutcome::Leave),
            (Examined::BeingWritten, &settled, ReadOutcome::Wait),
            (Examined::BeingWritten, &changed, ReadOutcome::Wait),
            (found(true), &lost, ReadOutcome::Leave),
        ];
        for (index, (examined, unsettled, want)) in cases.into_iter().enumerate() {
            assert_eq!(judge(name, examined, unsettled), want, "case {index}");
        }
    }

    /// What `touch` does to an existing file: set both times (IN_ATTRIB).
    fn touch(path: &Path) {
        let now = std::time::SystemTime::now();
        File::open(path).unwrap().set_times(fs::FileTimes::new().set_accessed(now).set_modified(now)).unwrap();
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
        let (cni, task) = start(vec![dir.clone()], timeline.clone(), Sources::new().handle(CNI_CONFIG)).await.unwrap();
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
        let (cni, task) =
            start(vec![dir.clone(), dir.clone()], timeline.clone(), Sources::new().handle(CNI_CONFIG)).await.unwrap();
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
        let (cni, task) = start(vec![dir.clone()], timeline.clone(), Sources::new().handle(CNI_CONFIG)).await.unwrap();
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
        let state = sync::lock(&cni.dirs);
        assert_eq!(state[0].known(OsStr::new("10-a.conflist")), Some(&facts));
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
        let (cni, task) = start(vec![dir.clone()], timeline.clone(), Sources::new().handle(CNI_CONFIG)).await.unwrap();
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
