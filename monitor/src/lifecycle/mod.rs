//! The node's plumbing state, in one place: CNI config dirs, SDN processes and the CNI
//! result cache. Serves `/api/v1/lifecycle` and the lifecycle metric families.

pub mod cni;
pub mod dirwatch;
pub mod files;
pub mod interface_events;
pub mod pods;
pub mod processes;
pub mod timeline;

use std::{path::PathBuf, sync::Arc};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};
use serde::Serialize;

use crate::{
    export::metrics::{Labels, counter, gauge},
    lifecycle::{
        cni::{CniSnapshot, CniWatcher},
        pods::{PodIndex, SharedPods},
        processes::{ProcessState, ProcessWatcher},
        timeline::Timeline,
    },
};

/// Handles on every lifecycle source; cheap to share.
pub struct Lifecycle {
    pub cni: CniWatcher,
    pub processes: ProcessWatcher,
    /// Why the kernel process tracer is not running (events are then not seen).
    pub process_tracer_error: Option<String>,
    pub pods: Arc<SharedPods>,
    pub cni_cache_dir: PathBuf,
    pub timeline: Arc<Timeline>,
}

#[derive(Serialize)]
pub struct LifecycleSnapshot {
    pub cni: CniSnapshot,
    pub processes: ProcessesView,
    pub pod_cache: PodCacheView,
    pub events_recorded: usize,
    pub events_evicted: u64,
}

#[derive(Serialize)]
pub struct ProcessesView {
    pub processes: Vec<ProcessState>,
    /// Set when the kernel tracer could not be started: `running` then comes from /proc only.
    pub error: Option<String>,
}

#[derive(Serialize)]
pub struct PodCacheView {
    pub dir: PathBuf,
    pub entries: usize,
    /// Cache files that could not be read or parsed (each read counts).
    pub skipped: u64,
}

impl Lifecycle {
    pub fn snapshot(&self) -> LifecycleSnapshot {
        let (entries, skipped) = self.pods.read(|index| (index.len(), index.skipped()));
        LifecycleSnapshot {
            cni: self.cni.snapshot(),
            processes: ProcessesView {
                processes: self.processes.snapshot().processes,
                error: self.process_tracer_error.clone(),
            },
            pod_cache: PodCacheView { dir: self.cni_cache_dir.clone(), entries, skipped },
            events_recorded: self.timeline.len(),
            events_evicted: self.timeline.evicted(),
        }
    }
}

/// The lifecycle metric families, encoded from fresh snapshots at each scrape.
#[derive(Clone)]
pub struct LifecycleCollector(pub Arc<Lifecycle>);

impl std::fmt::Debug for LifecycleCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LifecycleCollector")
    }
}

impl Collector for LifecycleCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cni = self.0.cni.snapshot();
        let processes = self.0.processes.snapshot();
        let dirs: Vec<(String, &crate::lifecycle::cni::CniDirSnapshot)> =
            cni.dirs.iter().filter(|d| d.seen).map(|d| (d.dir.display().to_string(), d)).collect();
        gauge(
            &mut encoder,
            "datapath_cni_default_network_present",
            "1 when the CNI config dir has a valid default network (its first valid config by file name), else 0. \
             Only for dirs that existed at some point since the agent started.",
            dirs.iter().map(|(dir, d)| {
                let labels: Labels = vec![("dir", dir.as_str())];
                (labels, i64::from(d.default_network.is_some()))
            }),
        )?;
        counter(
            &mut encoder,
            "datapath_cni_config_changes",
            "CNI config file changes seen (added, changed, removed, invalid), since the agent started.",
            dirs.iter().flat_map(|(dir, d)| {
                d.changes.iter().map(move |c| {
                    let labels: Labels = vec![("dir", dir.as_str()), ("file", c.file.as_str()), ("change", c.change)];
                    (labels, c.count)
                })
            }),
        )?;
        gauge(
            &mut encoder,
            "datapath_sdn_process_running",
            "Running processes with this kernel comm name.",
            processes.processes.iter().map(|p| {
                let labels: Labels = vec![("process", p.name.as_str())];
                (labels, p.running.len() as i64)
            }),
        )?;
        counter(
            &mut encoder,
            "datapath_sdn_process_restarts",
            "Exits of this SDN process followed by a start of the same name within the restart window.",
            processes.processes.iter().map(|p| {
                let labels: Labels = vec![("process", p.name.as_str())];
                (labels, p.restarts)
            }),
        )?;
        counter(&mut encoder, "datapath_lifecycle_events", "Lifecycle events recorded on the timeline, by kind.", {
            let events = self.0.timeline.counts_by_kind();
            events.into_iter().map(|(kind, count)| {
                let labels: Labels = vec![("kind", kind.as_str())];
                (labels, count)
            })
        })?;
        let skipped = self.0.pods.read(PodIndex::skipped);
        counter(
            &mut encoder,
            "datapath_cni_cache_files_skipped",
            "CNI result cache files that could not be read or parsed (pod names unknown for them).",
            std::iter::once((Labels::new(), skipped)),
        )?;
        Ok(())
    }
}
