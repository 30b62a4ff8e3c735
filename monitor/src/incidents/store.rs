//! Incident history that survives agent restarts: closed incidents are appended, one JSON
//! object per line, to `<state_dir>/incidents.jsonl`. When that file would grow past a byte
//! cap it is renamed to `incidents.jsonl.1` (replacing the previous one) and a new file is
//! started, so the history never takes more than about twice the cap on disk.
//!
//! Reading back is forgiving: a line cut short by a crash or any other line that is not an
//! incident is skipped and counted, never fatal. Writing is not: a failed write (disk full,
//! read-only file system) is returned to the caller, who logs and counts it.

use std::{
    collections::VecDeque,
    fs::{self, File, OpenOptions},
    io::{self, BufRead as _, BufReader, Read as _, Seek as _, SeekFrom, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use tracing::warn;

use crate::incidents::record::Incident;

/// The file name of the current history file inside the state dir.
pub const FILE_NAME: &str = "incidents.jsonl";
/// The file name the current file is renamed to when it reaches the cap.
pub const ROTATED_FILE_NAME: &str = "incidents.jsonl.1";
/// The default cap of one history file: 8 MiB (a few thousand incidents).
pub const DEFAULT_MAX_BYTES: u64 = 8 << 20;

/// What [`IncidentStore::load`] read back.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// The most recent incidents, oldest first.
    pub incidents: Vec<Incident>,
    /// Lines that were not an incident (torn by a crash, garbage), skipped.
    pub skipped_lines: u64,
}

/// The append-only incident history file of one agent (single writer).
#[derive(Debug)]
pub struct IncidentStore {
    path: PathBuf,
    rotated: PathBuf,
    max_bytes: u64,
    /// None after a failed rotation: reopened on the next append.
    file: Option<File>,
    /// Bytes in the current file.
    size: u64,
    /// The current file may not end with a newline (a torn line from a crash or a failed
    /// write): the next record starts with one so that it is not glued to the fragment.
    needs_newline: bool,
}

impl IncidentStore {
    /// Creates the state dir if needed (mode 0o750) and opens the history file for appending.
    /// `max_bytes` is the cap of one file ([`DEFAULT_MAX_BYTES`] is a good default).
    pub fn open(state_dir: &Path, max_bytes: u64) -> anyhow::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(state_dir)
            .with_context(|| format!("creating the incident state dir {}", state_dir.display()))?;
        let path = state_dir.join(FILE_NAME);
        let (file, size, needs_newline) = open_for_append(&path)?;
        Ok(Self {
            path,
            rotated: state_dir.join(ROTATED_FILE_NAME),
            max_bytes: max_bytes.max(1),
            file: Some(file),
            size,
            needs_newline,
        })
    }

    /// The current history file (`<state_dir>/incidents.jsonl`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads back at most `keep` of the most recent incidents, oldest first: the rotated file
    /// first, then the current one. Lines that do not parse are skipped, counted and logged
    /// once with their count; a file that cannot be read is logged and treated as empty.
    pub fn load(&self, keep: usize) -> LoadReport {
        let mut recent = VecDeque::with_capacity(keep.min(4096));
        let mut skipped_lines = 0;
        for path in [&self.rotated, &self.path] {
            match read_into(path, keep, &mut recent) {
                Ok(skipped) => skipped_lines += skipped,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => warn!(path = %path.display(), %error, "cannot read incident history; skipping it"),
            }
        }
        if skipped_lines > 0 {
            warn!(
                path = %self.path.display(),
                skipped_lines,
                "skipped incident history lines that are not incidents (torn by a crash or corrupted)"
            );
        }
        LoadReport { incidents: recent.into(), skipped_lines }
    }

    /// Appends one incident as one line, written with a single `write_all` (no fsync). When the
    /// line would take the file past the cap, the file is first rotated to `incidents.jsonl.1`.
    /// A single incident larger than the cap still gets written, alone in a fresh file.
    pub fn append(&mut self, incident: &Incident) -> anyhow::Result<()> {
        let mut record = serde_json::to_vec(incident).context("serializing an incident")?;
        record.push(b'\n');
        if self.file.is_none() {
            self.reopen()?;
        }
        let needed = record.len() as u64 + u64::from(self.needs_newline);
        if self.size > 0 && self.size.saturating_add(needed) > self.max_bytes {
            // A torn fragment, if any, goes with the rotated file.
            self.rotate()?;
        }
        let line = if self.needs_newline { [b"\n".as_slice(), &record].concat() } else { record };
        let Some(file) = &mut self.file else {
            anyhow::bail!("incident history {} is not open", self.path.display());
        };
        match file.write_all(&line) {
            Ok(()) => {
                self.size += line.len() as u64;
                self.needs_newline = false;
                Ok(())
            }
            Err(error) => {
                // Part of the line may have reached the file: learn its real size and make sure
                // the next record starts on a line of its own.
                self.size = file.metadata().map(|m| m.len()).unwrap_or(self.size);
                self.needs_newline = true;
                Err(error).with_context(|| format!("appending an incident to {}", self.path.display()))
            }
        }
    }

    /// Opens the current file again (after a failed rotation).
    fn reopen(&mut self) -> anyhow::Result<()> {
        let (file, size, needs_newline) = open_for_append(&self.path)?;
        self.file = Some(file);
        self.size = size;
        self.needs_newline = needs_newline;
        Ok(())
    }

    /// Renames the current file to the rotated name (replacing it) and starts a new one.
    fn rotate(&mut self) -> anyhow::Result<()> {
        fs::rename(&self.path, &self.rotated).with_context(|| {
            format!("rotating incident history {} to {}", self.path.display(), self.rotated.display())
        })?;
        // Never write to the renamed file again, even if the new one cannot be created.
        self.file = None;
        self.reopen()
    }
}

/// Opens (creating, mode 0o640) `path` for appending: the file, its size and whether it ends
/// without a newline.
fn open_for_append(path: &Path) -> anyhow::Result<(File, u64, bool)> {
    let open = || -> io::Result<(File, u64, bool)> {
        let mut file = OpenOptions::new().read(true).append(true).create(true).mode(0o640).open(path)?;
        let size = file.metadata()?.len();
        let mut needs_newline = false;
        if size > 0 && file.metadata()?.is_file() {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(size - 1))?;
            file.read_exact(&mut last)?;
            needs_newline = last[0] != b'\n';
        }
        Ok((file, size, needs_newline))
    };
    open().with_context(|| format!("opening the incident history {} for appending", path.display()))
}

/// Appends the incidents of one file to `recent`, keeping only the last `keep`; returns the
/// number of non-empty lines that were not incidents.
fn read_into(path: &Path, keep: usize, recent: &mut VecDeque<Incident>) -> io::Result<u64> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut skipped = 0;
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(skipped);
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Incident>(&line) {
            Ok(incident) if keep > 0 => {
                if recent.len() == keep {
                    recent.pop_front();
                }
                recent.push_back(incident);
            }
            Ok(_) => {}
            Err(_) => skipped += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        incidents::record::{Cause, IncidentInterface, IncidentTotals, LostPackets},
        test_support::TempDir,
    };

    fn incident(seq: u32) -> Incident {
        let start = format!("2026-01-12T20:58:{:02}.100Z", seq % 60);
        Incident {
            id: format!("{start}-{seq}"),
            start: start.clone(),
            end: Some("2026-01-12T20:58:56.500Z".into()),
            active: false,
            duration_seconds: 9.4,
            totals: IncidentTotals {
                drops: 4210,
                tcp_resets: 3,
                syn_retransmits: 37,
                interfaces: 1,
                lost_packets: 46,
                lost: LostPackets { retransmitted: 6, unanswered: 40, ..LostPackets::default() },
            },
            interfaces: vec![IncidentInterface {
                interface: "veth1a2b3c4d".into(),
                pod_namespace: "openshift-apiserver".into(),
                pod: "apiserver-zg25k".into(),
                drops: 310,
                drop_reasons: BTreeMap::from([("NO_SOCKET".into(), 300), ("NOT_SPECIFIED".into(), 10)]),
                tcp_resets: 1,
                syn_retransmits: 6,
                silent_directions: vec!["egress".into()],
                lost_packets: 46,
                lost: LostPackets { retransmitted: 6, unanswered: 40, ..LostPackets::default() },
            }],
            causes: vec![Cause {
                kind: "process_restart".into(),
                subject: "ovs-vswitchd".into(),
                at: "2026-01-12T20:58:46.000Z".into(),
                offset_seconds: -1.1,
                confidence: 0.8,
                detail: "exited (SIGKILL), started again after 2.0 s".into(),
            }],
            message: format!("incident number {seq}"),
            detected_at: "2026-01-12T20:58:47.000Z".into(),
            close_reason: None,
        }
    }

    fn ids(incidents: &[Incident]) -> Vec<String> {
        incidents.iter().map(|i| i.id.clone()).collect()
    }

    #[test]
    fn round_trip_survives_reopening() {
        let dir = TempDir::new("store-roundtrip");
        let state = dir.0.join("state");
        let written: Vec<Incident> = (1..=5).map(incident).collect();
        {
            let mut store = IncidentStore::open(&state, DEFAULT_MAX_BYTES).unwrap();
            assert_eq!(store.path(), state.join(FILE_NAME));
            for i in &written[..3] {
                store.append(i).unwrap();
            }
        }
        let mut store = IncidentStore::open(&state, DEFAULT_MAX_BYTES).unwrap();
        for i in &written[3..] {
            store.append(i).unwrap();
        }
        let report = store.load(100);
        assert_eq!(report.incidents, written);
        assert_eq!(report.skipped_lines, 0);
        // `keep` takes the most recent, still oldest first.
        assert_eq!(ids(&store.load(2).incidents), ids(&written[3..]));
        assert!(store.load(0).incidents.is_empty());
        // One line per incident.
        assert_eq!(fs::read_to_string(store.path()).unwrap().lines().count(), 5);

        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o750);
    }

    #[test]
    fn torn_last_line_is_skipped_and_the_next_append_starts_a_new_line() {
        let dir = TempDir::new("store-torn");
        let mut store = IncidentStore::open(&dir.0, DEFAULT_MAX_BYTES).unwrap();
        store.append(&incident(1)).unwrap();
        store.append(&incident(2)).unwrap();
        drop(store);
        // A crash in the middle of writing the third line.
        let full = serde_json::to_string(&incident(3)).unwrap();
        let mut file = OpenOptions::new().append(true).open(dir.0.join(FILE_NAME)).unwrap();
        file.write_all(&full.as_bytes()[..full.len() / 2]).unwrap();
        drop(file);

        let mut store = IncidentStore::open(&dir.0, DEFAULT_MAX_BYTES).unwrap();
        let report = store.load(10);
        assert_eq!(ids(&report.incidents), ids(&[incident(1), incident(2)]));
        assert_eq!(report.skipped_lines, 1);

        // The record after the restart is not glued to the fragment.
        store.append(&incident(4)).unwrap();
        let report = store.load(10);
        assert_eq!(ids(&report.incidents), ids(&[incident(1), incident(2), incident(4)]));
        assert_eq!(report.skipped_lines, 1);
    }

    #[test]
    fn garbage_lines_are_skipped_and_counted() {
        let dir = TempDir::new("store-garbage");
        let mut store = IncidentStore::open(&dir.0, DEFAULT_MAX_BYTES).unwrap();
        store.append(&incident(1)).unwrap();
        drop(store);
        let mut file = OpenOptions::new().append(true).open(dir.0.join(FILE_NAME)).unwrap();
        file.write_all(b"not json at all\n{\"id\": \"x\"}\n\n\xff\xfe\x00binary\n[1,2]\n").unwrap();
        drop(file);
        let mut store = IncidentStore::open(&dir.0, DEFAULT_MAX_BYTES).unwrap();
        store.append(&incident(2)).unwrap();
        let report = store.load(10);
        assert_eq!(ids(&report.incidents), ids(&[incident(1), incident(2)]));
        // The blank line is not counted; the other four are.
        assert_eq!(report.skipped_lines, 4);
    }

    #[test]
    fn rotation_at_the_cap_keeps_the_newest_across_both_files() {
        let dir = TempDir::new("store-rotate");
        let line_len = serde_json::to_string(&incident(10)).unwrap().len() as u64 + 1;
        // Room for three lines (ids 10..=99 serialize to the same length).
        let max_bytes = line_len * 3;
        let mut store = IncidentStore::open(&dir.0, max_bytes).unwrap();
        let written: Vec<Incident> = (10..20).map(incident).collect();
        for i in &written {
            store.append(i).unwrap();
            let current = fs::metadata(store.path()).unwrap().len();
            let rotated = fs::metadata(dir.0.join(ROTATED_FILE_NAME)).map(|m| m.len()).unwrap_or(0);
            assert!(current <= max_bytes && rotated <= max_bytes, "{current} {rotated} > {max_bytes}");
        }
        // 10 lines, 3 per file: 10-12, 13-15 (gone), 16-18 in .1, 19 in the current file.
        assert_eq!(fs::read_to_string(store.path()).unwrap().lines().count(), 1);
        assert_eq!(fs::read_to_string(dir.0.join(ROTATED_FILE_NAME)).unwrap().lines().count(), 3);
        let report = store.load(100);
        assert_eq!(ids(&report.incidents), ids(&written[6..]));
        assert_eq!(ids(&store.load(2).incidents), ids(&written[8..]));
        assert_eq!(report.skipped_lines, 0);

        // A restart reads the same history back.
        drop(store);
        let store = IncidentStore::open(&dir.0, max_bytes).unwrap();
        assert_eq!(ids(&store.load(3).incidents), ids(&written[7..]));
    }

    #[test]
    fn a_torn_line_before_rotation_does_not_leak_into_the_new_file() {
        let dir = TempDir::new("store-torn-rotate");
        let line_len = serde_json::to_string(&incident(10)).unwrap().len() as u64 + 1;
        let mut store = IncidentStore::open(&dir.0, line_len * 2).unwrap();
        store.append(&incident(10)).unwrap();
        drop(store);
        let mut file = OpenOptions::new().append(true).open(dir.0.join(FILE_NAME)).unwrap();
        file.write_all(b"{\"id\": \"2026-").unwrap();
        drop(file);
        let mut store = IncidentStore::open(&dir.0, line_len * 2).unwrap();
        store.append(&incident(11)).unwrap();
        // The new line starts with no stray newline in the fresh file.
        let current = fs::read_to_string(store.path()).unwrap();
        assert!(current.starts_with('{'), "{current:?}");
        let report = store.load(10);
        assert_eq!(ids(&report.incidents), ids(&[incident(10), incident(11)]));
        assert_eq!(report.skipped_lines, 1);
    }

    #[test]
    fn an_oversized_incident_is_still_written_alone() {
        let dir = TempDir::new("store-oversized");
        let mut store = IncidentStore::open(&dir.0, 10).unwrap();
        store.append(&incident(10)).unwrap();
        store.append(&incident(11)).unwrap();
        assert_eq!(ids(&store.load(10).incidents), ids(&[incident(10), incident(11)]));
        assert_eq!(fs::read_to_string(store.path()).unwrap().lines().count(), 1);
    }

    #[test]
    fn an_unusable_state_dir_is_an_error_naming_the_path() {
        // Root ignores permission bits, so use paths that cannot be directories at all.
        let dir = TempDir::new("store-unwritable");
        let not_a_dir = dir.0.join("plain-file");
        fs::write(&not_a_dir, "x").unwrap();
        for state in [not_a_dir.clone(), not_a_dir.join("sub")] {
            let error = crate::errors::chain(IncidentStore::open(&state, DEFAULT_MAX_BYTES).unwrap_err().as_ref());
            assert!(error.contains(&state.display().to_string()), "{error}");
        }
        // The history file's name is taken by a directory.
        let state = dir.0.join("state");
        fs::create_dir_all(state.join(FILE_NAME)).unwrap();
        let error = crate::errors::chain(IncidentStore::open(&state, DEFAULT_MAX_BYTES).unwrap_err().as_ref());
        assert!(error.contains(FILE_NAME), "{error}");
    }

    #[test]
    fn a_full_disk_is_an_error_not_a_panic() {
        let dir = TempDir::new("store-full");
        if !Path::new("/dev/full").exists() {
            return;
        }
        std::os::unix::fs::symlink("/dev/full", dir.0.join(FILE_NAME)).unwrap();
        let mut store = IncidentStore::open(&dir.0, DEFAULT_MAX_BYTES).unwrap();
        let error = crate::errors::chain(store.append(&incident(1)).unwrap_err().as_ref());
        assert!(error.contains(FILE_NAME), "{error}");
        assert!(store.append(&incident(2)).is_err());
    }

    #[test]
    fn missing_files_load_as_empty() {
        let dir = TempDir::new("store-empty");
        let store = IncidentStore::open(&dir.0, DEFAULT_MAX_BYTES).unwrap();
        let report = store.load(10);
        assert!(report.incidents.is_empty());
        assert_eq!(report.skipped_lines, 0);
    }
}
