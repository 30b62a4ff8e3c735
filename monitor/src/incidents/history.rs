//! The incident history of a running agent: closed incidents appended to its
//! [`IncidentStore`], and the incident in progress checkpointed beside it
//! (`<state_dir>/open-incident.jsonl`, rewritten at most once a second) so that an agent killed
//! or crashed during one closes it at its next start, as ended by the agent's stop, instead
//! of losing it. Failed writes are logged and counted (`datapath_incident_store_errors_total`),
//! never fatal.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use anyhow::Context as _;
use tracing::{info, warn};

use super::{
    record::Incident,
    store::{DEFAULT_MAX_BYTES, IncidentStore},
};
use crate::{errors, sync};

/// The checkpoint of the incident in progress, inside the state dir: one JSON line, named so
/// that no CNI config watcher takes it for a config (`.json` is one of CNI's extensions) when
/// the state dir is also watched.
pub const OPEN_FILE_NAME: &str = "open-incident.jsonl";
/// The close reason of an incident found open at start-up.
pub const CRASH_CLOSE_REASON: &str = "the agent stopped during it without closing it (killed or crashed); it ends at \
                                      its last checkpoint";

pub struct IncidentHistory {
    store: Mutex<Option<IncidentStore>>,
    /// `<state_dir>/open-incident.jsonl`, when the history is kept.
    checkpoint: Option<PathBuf>,
    /// Writes that failed (appends and checkpoints).
    errors: AtomicU64,
}

impl IncidentHistory {
    /// Opens the history in `state_dir` and reads back at most `keep` of its most recent
    /// incidents, oldest first; an incident left open by an agent that did not stop cleanly is
    /// closed now, appended, and returned last.
    pub fn open(state_dir: &Path, keep: usize) -> (Self, Vec<Incident>) {
        let store = match IncidentStore::open(state_dir, DEFAULT_MAX_BYTES) {
            Ok(store) => store,
            Err(error) => {
                warn!(error = %errors::chain(error.as_ref()), "incident history is not kept across restarts");
                let history = Self { store: Mutex::new(None), checkpoint: None, errors: AtomicU64::new(1) };
                return (history, Vec::new());
            }
        };
        let loaded = store.load(keep);
        info!(
            path = %store.path().display(),
            incidents = loaded.incidents.len(),
            skipped_lines = loaded.skipped_lines,
            "incident history read back"
        );
        let mut incidents = loaded.incidents;
        let checkpoint = state_dir.join(OPEN_FILE_NAME);
        let history =
            Self { store: Mutex::new(Some(store)), checkpoint: Some(checkpoint.clone()), errors: AtomicU64::new(0) };
        match read_checkpoint(&checkpoint) {
            Ok(None) => {}
            Ok(Some(mut incident)) => {
                incident.active = false;
                incident.close_reason = Some(CRASH_CLOSE_REASON.to_string());
                incident.message.push_str(" (the agent stopped during it without closing it)");
                warn!(
                    id = incident.id,
                    "an incident was open when the agent last stopped: closed as ended by that stop"
                );
                history.persist(&incident);
                incidents.push(incident);
                if incidents.len() > keep {
                    incidents.remove(0);
                }
            }
            Err(error) => {
                warn!(error = %errors::chain(error.as_ref()), "an open-incident checkpoint could not be read; skipped");
                history.clear_checkpoint();
            }
        }
        (history, incidents)
    }

    /// Appends a closed incident, when the history is kept, and drops the checkpoint of the
    /// incident in progress; a failed write is logged and counted.
    pub fn persist(&self, incident: &Incident) {
        if let Some(store) = sync::lock(&self.store).as_mut()
            && let Err(error) = store.append(incident)
        {
            self.failed(&error, "could not write the incident to the state dir");
        }
        self.clear_checkpoint();
    }

    /// Saves the incident in progress (written to a temporary file, then renamed over the last
    /// checkpoint: a crash leaves the old one or the new one, never half of one).
    pub fn checkpoint(&self, incident: &Incident) {
        let Some(path) = &self.checkpoint else { return };
        let write = || -> anyhow::Result<()> {
            let temporary = path.with_extension("jsonl.tmp");
            fs::write(&temporary, serde_json::to_vec(incident)?)
                .with_context(|| format!("writing {}", temporary.display()))?;
            fs::rename(&temporary, path).with_context(|| format!("renaming it to {}", path.display()))
        };
        if let Err(error) = write() {
            self.failed(&error, "could not checkpoint the incident in progress");
        }
    }

    /// Writes that failed since start (and 1 when the history could not be opened at all).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Whether incidents are kept across restarts.
    pub fn kept(&self) -> bool {
        self.checkpoint.is_some()
    }

    fn clear_checkpoint(&self) {
        if let Some(path) = &self.checkpoint
            && let Err(error) = fs::remove_file(path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            self.failed(&anyhow::Error::from(error), "could not remove the open-incident checkpoint");
        }
    }

    fn failed(&self, error: &anyhow::Error, what: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        warn!(error = %errors::chain(error.as_ref()), "{what}");
    }
}

fn read_checkpoint(path: &Path) -> anyhow::Result<Option<Incident>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(anyhow::Error::from(error).context(format!("reading {}", path.display()))),
    };
    Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TempDir;

    fn incident(id: &str) -> Incident {
        Incident { id: id.to_string(), active: true, message: "lost 9 packets".to_string(), ..Incident::default() }
    }

    #[test]
    fn an_incident_open_at_a_crash_is_closed_at_the_next_start() {
        let dir = TempDir::new("history");
        let (history, past) = IncidentHistory::open(&dir.0, 10);
        assert!(past.is_empty() && history.kept());
        history.persist(&Incident { active: false, ..incident("a") });
        history.checkpoint(&incident("b"));
        history.checkpoint(&Incident { message: "lost 12 packets".to_string(), ..incident("b") });
        drop(history); // killed: "b" never closed.

        let (history, past) = IncidentHistory::open(&dir.0, 10);
        let ids: Vec<&str> = past.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        let b = &past[1];
        assert!(!b.active);
        assert_eq!(b.close_reason.as_deref(), Some(CRASH_CLOSE_REASON));
        assert!(b.message.starts_with("lost 12 packets"), "{}", b.message);
        assert_eq!(history.errors(), 0);
        drop(history);
        // Closed once: the next start reads it from the history, not again from a checkpoint.
        let (_, past) = IncidentHistory::open(&dir.0, 10);
        assert_eq!(past.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn failed_writes_are_counted() {
        let dir = TempDir::new("history");
        let (history, _) = IncidentHistory::open(&dir.0, 10);
        // The state dir vanishes under the agent: every write fails, none is fatal.
        std::fs::remove_dir_all(&dir.0).unwrap();
        std::fs::write(&dir.0, b"a file where the dir was").unwrap();
        history.checkpoint(&incident("c"));
        history.persist(&Incident { active: false, ..incident("c") });
        assert!(history.errors() >= 2, "{}", history.errors());
        std::fs::remove_file(&dir.0).unwrap();
        std::fs::create_dir(&dir.0).unwrap();
        // Unusable from the start: not kept, counted once.
        let blocked = dir.0.join("blocked");
        std::fs::write(&blocked, b"").unwrap();
        let (history, past) = IncidentHistory::open(&blocked.join("state"), 10);
        assert!(past.is_empty() && !history.kept());
        assert_eq!(history.errors(), 1);
    }
}
