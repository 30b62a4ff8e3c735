//! Whether each signal source is working: the netlink link watch, the CNI config and CNI
//! cache directory watches, the SDN process reports. A source that fails says so here
//! (`datapath_source_up`, `/readyz`, `status`) and restarts itself with [`Backoff`], resyncing
//! in full, instead of going quiet while the agent looks healthy.

use std::{
    collections::BTreeMap,
    fmt::Display,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;
use tracing::{info, warn};

use crate::sync::lock;

/// The netlink link watch: which interfaces exist, so that new pod veths get attached.
pub const LINK_WATCH: &str = "link_watch";
/// The inotify watches of the CNI config dirs.
pub const CNI_CONFIG: &str = "cni_config";
/// The inotify watch of the CNI result cache (pod names and IPs).
pub const CNI_CACHE: &str = "cni_cache";
/// The kernel's SDN process reports (its ring buffer).
pub const SDN_PROCESSES: &str = "sdn_processes";
/// The tc programs on the watched interfaces: down while one someone removed cannot be
/// attached again (see `Datapath::verify_attachments`).
pub const TC_PROGRAMS: &str = "tc_programs";

/// One source's state.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SourceState {
    pub up: bool,
    /// Why it is down (or was, last).
    pub error: Option<String>,
    /// Times it failed since the agent started.
    pub failures: u64,
}

/// Every source's state; shared by the sources and the exporters.
#[derive(Debug, Default)]
pub struct Sources {
    states: Mutex<BTreeMap<&'static str, SourceState>>,
}

impl Sources {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The handle a source reports through; registers it as up.
    pub fn handle(self: &Arc<Self>, name: &'static str) -> SourceHandle {
        lock(&self.states).entry(name).or_insert(SourceState { up: true, error: None, failures: 0 });
        SourceHandle { sources: Arc::clone(self), name }
    }

    /// Every registered source, by name.
    pub fn snapshot(&self) -> BTreeMap<&'static str, SourceState> {
        lock(&self.states).clone()
    }

    /// The names of the sources that are down.
    pub fn down(&self) -> Vec<&'static str> {
        lock(&self.states).iter().filter(|(_, state)| !state.up).map(|(name, _)| *name).collect()
    }
}

/// One source's reporting handle.
#[derive(Clone, Debug)]
pub struct SourceHandle {
    sources: Arc<Sources>,
    name: &'static str,
}

impl SourceHandle {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The source works (again). Logs a recovery.
    pub fn up(&self) {
        let mut states = lock(&self.sources.states);
        let state = states.entry(self.name).or_insert(SourceState { up: true, error: None, failures: 0 });
        if !state.up {
            state.up = true;
            info!(source = self.name, "signal source recovered");
        }
    }

    /// The source failed: its signal is not seen until it is up again. Logs the first report
    /// of each failure.
    pub fn down(&self, error: impl Display) {
        let error = error.to_string();
        let mut states = lock(&self.sources.states);
        let state = states.entry(self.name).or_insert(SourceState { up: true, error: None, failures: 0 });
        if state.up {
            state.failures += 1;
            warn!(source = self.name, %error, "signal source down: its signal is not seen until it recovers");
        }
        state.up = false;
        state.error = Some(error);
    }

    /// Up when `result` is Ok, down with its error otherwise.
    pub fn set<E: Display>(&self, result: Result<(), E>) {
        match result {
            Ok(()) => self.up(),
            Err(error) => self.down(error),
        }
    }
}

/// Waits between restarts of a failed source: 1 s, doubling, at most 30 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    /// The wait before the next attempt; each call doubles the one after.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        wait
    }

    /// Sleeps for [`Self::next_wait`].
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_wait()).await;
    }

    /// An attempt succeeded: the next failure waits the least again.
    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_goes_down_and_up_and_counts_its_failures() {
        let sources = Sources::new();
        let links = sources.handle(LINK_WATCH);
        let cni = sources.handle(CNI_CONFIG);
        assert!(sources.down().is_empty());
        cni.down("cannot watch /etc/cni/net.d: No space left on device");
        cni.down("still");
        assert_eq!(sources.down(), [CNI_CONFIG]);
        let state = &sources.snapshot()[CNI_CONFIG];
        assert_eq!((state.up, state.failures, state.error.as_deref()), (false, 1, Some("still")));
        cni.set(Ok::<(), String>(()));
        links.set(Err("socket closed"));
        assert_eq!(sources.down(), [LINK_WATCH]);
        assert_eq!(sources.snapshot()[CNI_CONFIG].failures, 1);
        assert!(sources.snapshot()[CNI_CONFIG].up);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..7).map(|_| backoff.next_wait().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_secs(1));
    }
}
