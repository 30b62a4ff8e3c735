//! The HTTP server: /metrics, /healthz, /readyz and the JSON API.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Json, Router,
    extract::{Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::{Deserialize, Serialize};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{
    datapath::ProbeReport,
    export::metrics::Metrics,
    incidents::engine::SharedEngine,
    lifecycle::{Lifecycle, clock::parse_rfc3339, timeline::Timeline},
    sampling::sampler::{Sampler, WatchedInterface},
    sync,
};

pub struct ApiState {
    pub metrics: Metrics,
    pub sampler: Arc<Mutex<Sampler>>,
    pub timeline: Arc<Timeline>,
    pub lifecycle: Arc<Lifecycle>,
    pub engine: SharedEngine,
    /// Programs loaded and the interfaces present at start-up attached.
    pub ready: AtomicBool,
}

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/interfaces", get(interfaces))
        .route("/api/v1/events", get(events))
        .route("/api/v1/lifecycle", get(lifecycle))
        .route("/api/v1/incidents", get(incidents))
        .with_state(state)
}

pub async fn bind(listen: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(listen).await
}

/// Serves the API on `listener` until `shutdown` turns true.
pub fn serve(
    listener: TcpListener,
    state: Arc<ApiState>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<std::io::Result<()>> {
    let router = router(state);
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = shutdown.changed().await;
            })
            .await
    })
}

async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    match state.metrics.render() {
        Ok(body) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed\n").into_response(),
    }
}

#[derive(Serialize)]
struct Readiness {
    ready: bool,
    interfaces_attached: usize,
    probes: ProbeReport,
}

async fn readyz(State(state): State<Arc<ApiState>>) -> Response {
    let ready = state.ready.load(Ordering::Acquire);
    let (interfaces_attached, probes) = match state.sampler.lock() {
        Ok(sampler) => (sampler.attached_count(), sampler.probes()),
        Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "sampler poisoned\n").into_response(),
    };
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(Readiness { ready, interfaces_attached, probes })).into_response()
}

async fn interfaces(State(state): State<Arc<ApiState>>) -> Response {
    let watched: Vec<WatchedInterface> = match state.sampler.lock() {
        Ok(sampler) => sampler.watched_interfaces(),
        Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "sampler poisoned\n").into_response(),
    };
    Json(watched).into_response()
}

#[derive(Deserialize)]
struct EventsQuery {
    since: Option<String>,
}

async fn events(State(state): State<Arc<ApiState>>, Query(query): Query<EventsQuery>) -> Response {
    let since = match query.since.as_deref().map(parse_rfc3339).transpose() {
        Ok(since) => since,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("since: {error}\n")).into_response(),
    };
    Json(state.timeline.events(since)).into_response()
}

async fn lifecycle(State(state): State<Arc<ApiState>>) -> Response {
    Json(state.lifecycle.snapshot()).into_response()
}

async fn incidents(State(state): State<Arc<ApiState>>) -> Response {
    let incidents = sync::lock(&state.engine).incidents();
    Json(incidents).into_response()
}
