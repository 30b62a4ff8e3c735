//! Follows the CNI result cache dir: the index shared between its watcher (writer) and the
//! sampler (reader), kept up to date with inotify.

use std::{
    path::PathBuf,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::task::JoinHandle;
use tracing::{debug, info};

use super::PodIndex;
use crate::{
    lifecycle::{
        dirwatch::{self, DirChange},
        sources::SourceHandle,
    },
    sampling::sampler::{PodLabels, PodSource},
    sync,
};

/// The pod index shared between its watcher (writer) and the sampler (reader), with a
/// generation that moves on every change so readers can cache answers.
#[derive(Default)]
pub struct SharedPods {
    index: RwLock<PodIndex>,
    generation: AtomicU64,
}

impl SharedPods {
    /// Changes the index and moves the generation on.
    pub fn update<T>(&self, change: impl FnOnce(&mut PodIndex) -> T) -> T {
        let mut index = sync::write(&self.index);
        let result = change(&mut index);
        self.generation.fetch_add(1, Ordering::AcqRel);
        result
    }

    pub fn read<T>(&self, read: impl FnOnce(&PodIndex) -> T) -> T {
        read(&sync::read(&self.index))
    }
}

impl PodSource for SharedPods {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn lookup(&self, interface: &str, peer_netns: Option<u64>) -> Option<PodLabels> {
        self.read(|index| {
            index.lookup(interface, peer_netns).map(|pod| PodLabels {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                ips: pod.ips.clone(),
            })
        })
    }
}

/// Follows the CNI result cache dir with inotify: every file written, renamed, or deleted
/// updates the index. Returns once the start-up state is read.
pub async fn watch_cache_dir(
    dir: PathBuf,
    pods: Arc<SharedPods>,
    health: SourceHandle,
) -> anyhow::Result<JoinHandle<()>> {
    let mut watcher = dirwatch::watch_dirs(vec![dir])?;
    watcher.report_health(health.clone());
    // The first change per dir is its start-up state (Rescan, or Gone when it does not exist).
    if let Some(change) = watcher.recv().await {
        apply_cache_change(&pods, change);
    }
    let entries = pods.read(PodIndex::len);
    info!(dir = %watcher.dirs()[0].display(), entries, "following the CNI result cache for pod names");
    Ok(tokio::spawn(async move {
        loop {
            while let Some(change) = watcher.recv().await {
                apply_cache_change(&pods, change);
            }
            // Its first change rescans the dir.
            watcher = dirwatch::rewatch(watcher.dirs(), &health).await;
        }
    }))
}

fn apply_cache_change(pods: &SharedPods, change: DirChange) {
    match change {
        // A missing dir rescans to an empty index.
        DirChange::Rescan { dir, .. } | DirChange::Gone { dir, .. } => pods.update(|index| index.rescan(&dir)),
        DirChange::Entry { dir, name, .. } => {
            let outcome = pods.update(|index| index.read_file(&dir, &name));
            debug!(file = ?name, ?outcome, "CNI cache entry");
        }
    }
}
