//! `datapath-monitor run`: wires the stages together and runs until SIGTERM or SIGINT.

use std::{
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::Context as _;
use tokio::{signal::unix, sync::mpsc, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    config::Config,
    datapath::{Datapath, mounts},
    export::{
        api::{self, ApiState},
        metrics::{Metrics, SharedSample},
    },
    incidents::{
        engine::{self as incidents, IncidentCollector, IncidentEngine, IncidentUpdate, SharedEngine},
        record::Incident,
        store::IncidentStore,
    },
    lifecycle::{
        Lifecycle, LifecycleCollector, cni,
        pods::{self, SharedPods},
        processes,
        timeline::{Event, Stamp, Timeline},
    },
    sampling::{
        link_watch::{self as interfaces, InterfaceFilter, LinkEvent},
        sampler::{Sample, Sampler},
    },
};

pub async fn run(config: Config) -> anyhow::Result<()> {
    let started = Instant::now();
    let mounted = mounts::ensure_mounted().context("preparing tracefs and bpffs")?;
    if !mounted.is_empty() {
        info!(?mounted, "mounted missing pseudo filesystems");
    }
    let filter = InterfaceFilter::new(&config.interfaces, &config.exclude).context("interface globs")?;
    let mut datapath =
        Datapath::load(config.datapath_options()).context("loading the kernel programs (are you root, with BTF?)")?;
    // Logged and reported as probe "sched_process" when the kernel cannot run it.
    let (process_probe, process_tracer_error) = match datapath.start_process_probe(&config.sdn_processes) {
        Ok(probe) => (Some(probe), None),
        Err(error) => (None, Some(error.to_string())),
    };
    release_freed_memory();
    let own_netns = interfaces::own_netns_inode().context("reading this network namespace")?;
    let timeline = Arc::new(Timeline::new(config.event_capacity));

    let (process_watcher, processes_task) = processes::start(
        process_probe,
        config.sdn_processes.clone(),
        config.process_restart_window(),
        Arc::clone(&timeline),
    )
    .context("watching SDN processes")?;
    let (cni_watcher, cni_task) =
        cni::start(config.cni_dirs.clone(), Arc::clone(&timeline)).await.context("watching CNI config dirs")?;
    let pods = Arc::new(SharedPods::default());
    let pods_task = pods::watch_cache_dir(config.cni_cache_dir.clone(), Arc::clone(&pods))
        .await
        .context("watching the CNI result cache")?;
    let lifecycle = Arc::new(Lifecycle {
        cni: cni_watcher,
        processes: process_watcher,
        process_tracer_error,
        pods: Arc::clone(&pods),
        cni_cache_dir: config.cni_cache_dir.clone(),
        timeline: Arc::clone(&timeline),
    });

    // Incident history survives restarts; a state dir we cannot write is logged, not fatal.
    let (store, history) = match IncidentStore::open(&config.state_dir, INCIDENT_FILE_MAX_BYTES) {
        Ok(store) => {
            let loaded = store.load(config.incident_history);
            info!(
                path = %store.path().display(),
                incidents = loaded.incidents.len(),
                skipped_lines = loaded.skipped_lines,
                "incident history read back"
            );
            (Some(store), loaded.incidents)
        }
        Err(error) => {
            warn!(error = %format!("{error:#}"), "incident history is not kept across restarts");
            (None, Vec::new())
        }
    };
    let engine: SharedEngine =
        Arc::new(Mutex::new(IncidentEngine::new(config.engine_config(), Arc::clone(&timeline), history)));

    let mut sampler = Sampler::new(datapath, own_netns, config.removed_interface_grace());
    sampler.set_pod_source(pods);
    let sampler = Arc::new(Mutex::new(sampler));

    let listener = api::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let shared_sample: SharedSample = Arc::new(RwLock::new(Arc::new(Sample::default())));
    let state = Arc::new(ApiState {
        metrics: Metrics::new(Arc::clone(&shared_sample))
            .with_collector(LifecycleCollector(Arc::clone(&lifecycle)))
            .with_collector(IncidentCollector(Arc::clone(&engine))),
        engine: Arc::clone(&engine),
        lifecycle,
        sampler: Arc::clone(&sampler),
        timeline: Arc::clone(&timeline),
        ready: AtomicBool::new(false),
    });
    let (shutdown_tx, mut shutdown_rx) = tokio::sync::watch::channel(false);
    let server = {
        let router = api::router(Arc::clone(&state));
        let mut shutdown = shutdown_tx.subscribe();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = shutdown.changed().await;
                })
                .await
        })
    };
    info!(listen = %config.listen, "serving /metrics, /healthz, /readyz, /api/v1");

    let (initial, link_events) = interfaces::watch_links(filter).await.context("watching network interfaces")?;
    {
        let mut sampler = lock(&sampler);
        for link in initial {
            // Present at start-up: state, not a change.
            let _ = sampler.apply(LinkEvent::Added(link));
        }
        publish(&shared_sample, sampler.sample());
        info!(attached = sampler.attached_count(), elapsed_ms = started.elapsed().as_millis() as u64, "ready");
    }
    state.ready.store(true, Ordering::Release);

    let links_task = spawn_link_watch(Arc::clone(&sampler), link_events, Arc::clone(&timeline));
    let store = Arc::new(Mutex::new(store));
    let sampler_task = {
        let sampler = Arc::clone(&sampler);
        let shared_sample = Arc::clone(&shared_sample);
        let engine = Arc::clone(&engine);
        let store = Arc::clone(&store);
        let interval = config.sample_interval();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let sample = lock(&sampler).sample();
                let now = Stamp::now();
                let updates = lock(&engine).observe(now, &sample.interfaces);
                publish(&shared_sample, sample);
                for update in updates {
                    incidents::log_update(&update);
                    if let IncidentUpdate::Closed(incident) = update {
                        persist(&store, &incident);
                    }
                }
            }
        })
    };

    let signal = wait_for_signal().await?;
    info!(signal, "shutting down");
    state.ready.store(false, Ordering::Release);
    let _ = shutdown_tx.send(true);
    let _ = shutdown_rx.changed().await;
    for task in [links_task, sampler_task, processes_task, cni_task, pods_task] {
        task.abort();
    }
    if let Ok(Err(error)) = server.await {
        warn!(%error, "HTTP server");
    }
    if let Some(incident) = lock(&engine).close_now() {
        incidents::log_update(&IncidentUpdate::Closed(incident.clone()));
        persist(&store, &incident);
    }
    lock(&sampler).detach_all();
    info!("detached from all interfaces");
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not stop the agent from detaching at exit.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The incident file is rotated at this size (one older file is kept).
const INCIDENT_FILE_MAX_BYTES: u64 = 8 * 1024 * 1024;

fn persist(store: &Mutex<Option<IncidentStore>>, incident: &Incident) {
    if let Some(store) = lock(store).as_mut()
        && let Err(error) = store.append(incident)
    {
        warn!(id = incident.id, error = %format!("{error:#}"), "could not write the incident to the state dir");
    }
}

fn publish(shared: &SharedSample, sample: Sample) {
    let mut guard = shared.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    *guard = Arc::new(sample);
}

fn spawn_link_watch(
    sampler: Arc<Mutex<Sampler>>,
    mut events: mpsc::Receiver<LinkEvent>,
    timeline: Arc<Timeline>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let stamp = Stamp::now();
            let changes = lock(&sampler).apply(event);
            for change in changes {
                timeline.record(Event::new(stamp, change.kind, change.interface, change.detail));
            }
        }
        warn!("netlink link watch ended: new interfaces are no longer attached");
    })
}

async fn wait_for_signal() -> anyhow::Result<&'static str> {
    let mut terminate = unix::signal(unix::SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = unix::signal(unix::SignalKind::interrupt()).context("SIGINT handler")?;
    Ok(tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    })
}

/// Loading parses the kernel's BTF (tens of MiB, freed right after); glibc keeps freed heap
/// pages mapped, so without this the agent's resident memory never comes back down.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; no pointer is invalidated.
    unsafe {
        libc::malloc_trim(0);
    }
}
