//! Lifecycle signals: the changes to a node's network plumbing, on one clock ([`clock`]) in
//! one bounded [`timeline`]: CNI config dirs ([`cni`], over [`dirwatch`]), SDN processes
//! ([`processes`]), interface events ([`interface_events`]); and the CNI result cache that
//! names the pod behind each veth ([`pods`]). [`Lifecycle`] holds a handle on every source
//! and serves `/api/v1/lifecycle`; [`sources`] says which of them work.

pub mod clock;
pub mod cni;
pub mod dirwatch;
pub mod files;
pub mod interface_events;
pub mod pods;
pub mod processes;
pub mod sources;
pub mod timeline;

use std::{path::PathBuf, sync::Arc};

use serde::Serialize;

use crate::lifecycle::{
    cni::{CniSnapshot, CniWatcher},
    pods::SharedPods,
    processes::{ProcessState, ProcessWatcher},
    sources::Sources,
    timeline::Timeline,
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
    /// Whether each signal source works.
    pub sources: Arc<Sources>,
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
