//! `datapath-monitor run`: wires the stages together, in the order data moves (datapath →
//! sampling → lifecycle → incidents → export; see the crate documentation), and runs until
//! SIGTERM or SIGINT.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{signal::unix, sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    config::Config,
    datapath::{self, Datapath, mounts},
    errors,
    export::{
        api::{self, ApiState},
        metrics::Metrics,
    },
    incidents::{IncidentEngine, IncidentUpdate, SharedEngine, history::IncidentHistory, message::log_update},
    lifecycle::{
        Lifecycle,
        clock::Stamp,
        cni, interface_events,
        pods::{self, SharedPods},
        processes,
        sources::{CNI_CACHE, CNI_CONFIG, LINK_WATCH, SDN_PROCESSES, SourceHandle, Sources, TC_PROGRAMS},
        timeline::Timeline,
    },
    privileges,
    sampling::{
        InterfaceFilter, LinkEvent, OwnNetns,
        ovs_datapaths::OvsDatapaths,
        sampler::{LatestSample, Sampler},
        watch_links,
    },
    sync::lock,
};

pub async fn run(config: Config) -> anyhow::Result<()> {
    let started = Instant::now();
    privileges::check_required()?;
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
        Err(error) => (None, Some(errors::chain(&error))),
    };
    datapath::release_freed_memory();
    let own_netns = OwnNetns::of_this_thread().context("reading this network namespace")?.inode;
    let timeline = Arc::new(Timeline::new(config.event_capacity));
    let sources = Sources::new();

    // The sampler reads the kernel's count of process reports its ring buffer had no room for.
    let (lost_process_reports, lost_reports_rx) = watch::channel(0);
    let (process_watcher, processes_task) = processes::start(
        process_probe,
        config.sdn_processes.clone(),
        config.process_restart_window(),
        Arc::clone(&timeline),
        sources.handle(SDN_PROCESSES),
        lost_reports_rx,
    )
    .context("watching SDN processes")?;
    let (cni_watcher, cni_task) =
        cni::start(config.cni_dirs.clone(), Arc::clone(&timeline), sources.handle(CNI_CONFIG))
            .await
            .context("watching CNI config dirs")?;
    let pods = Arc::new(SharedPods::default());
    let pods_task = pods::watch_cache_dir(config.cni_cache_dir.clone(), Arc::clone(&pods), sources.handle(CNI_CACHE))
        .await
        .context("watching the CNI result cache")?;
    let lifecycle = Arc::new(Lifecycle {
        cni: cni_watcher,
        processes: process_watcher,
        process_tracer_error,
        pods: Arc::clone(&pods),
        cni_cache_dir: config.cni_cache_dir.clone(),
        timeline: Arc::clone(&timeline),
        sources: Arc::clone(&sources),
    });

    let (history, past_incidents) = IncidentHistory::open(&config.state_dir, config.incident_history);
    let history = Arc::new(history);
    let engine: SharedEngine =
        Arc::new(Mutex::new(IncidentEngine::new(config.engine_config(), Arc::clone(&timeline), past_incidents)));

    let mut sampler = Sampler::new(datapath, own_netns, config.removed_interface_grace(), config.kernel_entry_idle());
    sampler.set_pod_source(pods);
    let sampler = Arc::new(Mutex::new(sampler));

    let listener = api::bind(config.listen).await.with_context(|| format!("listening on {}", config.listen))?;
    let latest = Arc::new(LatestSample::default());
    let state = Arc::new(ApiState {
        metrics: Metrics::new(Arc::clone(&latest), Arc::clone(&lifecycle), Arc::clone(&engine), Arc::clone(&history)),
        engine: Arc::clone(&engine),
        lifecycle,
        sampler: Arc::clone(&sampler),
        timeline: Arc::clone(&timeline),
        ready: AtomicBool::new(false),
    });
    let (shutdown_tx, mut shutdown_rx) = watch::channel(false);
    let server = api::serve(listener, Arc::clone(&state), shutdown_tx.subscribe());
    info!(listen = %config.listen, "serving /metrics, /healthz, /readyz, /api/v1");

    let (initial, link_events) =
        watch_links(filter, sources.handle(LINK_WATCH)).await.context("watching network interfaces")?;
    {
        let mut sampler = lock(&sampler);
        for link in initial {
            // Present at start-up: state, not a change.
            sampler.apply(LinkEvent::Added(link));
        }
        sampler.finish_takeover();
        latest.publish(sampler.sample());
        info!(attached = sampler.attached_count(), elapsed_ms = started.elapsed().as_millis() as u64, "ready");
    }
    // Loaded, mounted, attached: what is left needs far less (see crate::privileges).
    match privileges::drop_unneeded() {
        Ok((kept, dropped)) => info!(
            kept = ?privileges::names(kept),
            dropped = format!("{dropped:#x}"),
            "dropped the capabilities no longer needed"
        ),
        Err(error) => warn!(error = %errors::chain(error.as_ref()), "could not drop capabilities; running with all"),
    }
    state.ready.store(true, Ordering::Release);

    let links_task = interface_events::follow_links(Arc::clone(&sampler), link_events, Arc::clone(&timeline));
    let sampler_task = spawn_sampling(
        config.sample_interval(),
        Arc::clone(&sampler),
        Arc::clone(&engine),
        Arc::clone(&latest),
        Arc::clone(&history),
        sources.handle(TC_PROGRAMS),
        lost_process_reports,
    );

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
        log_update(&IncidentUpdate::Closed(incident.clone()));
        history.persist(&incident);
    }
    let mut sampler = lock(&sampler);
    if sampler.keeps_attached() {
        let left = sampler.leave_attached();
        info!(interfaces = left, "left the kernel programs attached and counting, for the next agent");
    } else {
        sampler.detach_all();
        info!("detached from all interfaces");
    }
    Ok(())
}

/// How often the incident in progress is checkpointed to the state dir.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Every `interval`: the kernel's counters into a sample, the sample into the incident engine
/// and to the scrapes, the engine's updates into the log and the incident history.
fn spawn_sampling(
    interval: Duration,
    sampler: Arc<Mutex<Sampler>>,
    engine: SharedEngine,
    latest: Arc<LatestSample>,
    history: Arc<IncidentHistory>,
    tc_programs: SourceHandle,
    lost_process_reports: watch::Sender<u64>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ovs = OvsDatapaths::default();
        let mut last_checkpoint: Option<Instant> = None;
        let mut judged = 0u64;
        loop {
            ticker.tick().await;
            // Netlink I/O: on a blocking thread, and not under the sampler's lock.
            ovs = match tokio::task::spawn_blocking(move || {
                ovs.refresh();
                ovs
            })
            .await
            {
                Ok(ovs) => ovs,
                Err(error) => {
                    warn!(%error, "reading the OVS datapaths' counters");
                    OvsDatapaths::default()
                }
            };
            let mut sample = {
                let mut sampler = lock(&sampler);
                sampler.set_ovs_datapaths(&ovs);
                sampler.sample()
            };
            let lost = sample.map_errors[monitor_common::MAP_ERROR_PROCESS_EVENTS as usize];
            lost_process_reports.send_if_modified(|total| std::mem::replace(total, lost) != lost);
            if sample.tc_pending.is_empty() {
                tc_programs.up();
            } else {
                tc_programs.down(format!(
                    "removed from {} and not attached again (retried every 5 s)",
                    sample.tc_pending.join(", ")
                ));
            }
            let now = Stamp::now();
            // Switches are judged like interfaces: their unforwarded packets are drops.
            let observed = sample.judged();
            let (updates, open) = {
                let mut engine = lock(&engine);
                let updates = engine.observe(now, &observed);
                // The incident in progress, checkpointed once a second for a restart after a crash.
                let due = last_checkpoint.is_none_or(|at: Instant| at.elapsed() >= CHECKPOINT_EVERY);
                (updates, if due { engine.open_incident() } else { None })
            };
            judged += 1;
            sample.judged = judged;
            latest.publish(sample);
            let mut closed = Vec::new();
            for update in updates {
                log_update(&update);
                if let IncidentUpdate::Closed(incident) = update {
                    closed.push(incident);
                }
            }
            if open.is_some() {
                last_checkpoint = Some(Instant::now());
            }
            if !closed.is_empty() || open.is_some() {
                // File writes: on a blocking thread.
                let history = Arc::clone(&history);
                let written = tokio::task::spawn_blocking(move || {
                    for incident in &closed {
                        history.persist(incident);
                    }
                    if let Some(open) = &open {
                        history.checkpoint(open);
                    }
                });
                if let Err(error) = written.await {
                    warn!(%error, "writing the incident history");
                }
            }
        }
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
