//! The HTTP server: /metrics, /healthz, /readyz and the JSON API.

use std::{
    collections::BTreeMap,
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
    export::{connections::BoundedListener, metrics::Metrics},
    incidents::engine::SharedEngine,
    lifecycle::{Lifecycle, clock::parse_rfc3339, sources::SourceState, timeline::Timeline},
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
        axum::serve(BoundedListener::new(listener), router)
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
    /// Signal sources that are down (restarting): their signals are not seen meanwhile.
    degraded: Vec<&'static str>,
    sources: BTreeMap<&'static str, SourceState>,
    interfaces_attached: usize,
    probes: ProbeReport,
}

/// 200 once started, 503 before. A source that is down leaves it 200 and is named in
/// `degraded`: an unready pod drops out of its Service, and Prometheus would stop scraping
/// the very `datapath_source_up` that alerts on it.
async fn readyz(State(state): State<Arc<ApiState>>) -> Response {
    let ready = state.ready.load(Ordering::Acquire);
    let (interfaces_attached, probes) = match state.sampler.lock() {
        Ok(sampler) => (sampler.attached_count(), sampler.probes()),
        Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "sampler poisoned\n").into_response(),
    };
    let sources = state.lifecycle.sources.snapshot();
    let degraded = state.lifecycle.sources.down();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(Readiness { ready, degraded, sources, interfaces_attached, probes })).into_response()
}

async fn interfaces(State(state): State<Arc<ApiState>>) -> Response {
    let watched: Vec<WatchedInterface> = match state.sampler.lock() {
        Ok(sampler) => sampler.watched_interfaces(),
        Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "sampler poisoned\n").into_response(),
    };
    Json(watched).into_response()
}

/// Events per page unless `limit` says otherwise, and the most `limit` may ask for.
pub const EVENTS_PAGE: usize = 1_000;
pub const EVENTS_PAGE_MAX: usize = 10_000;
/// Incidents per page unless `limit` says otherwise, and the most `limit` may ask for.
pub const INCIDENTS_PAGE: usize = 100;
pub const INCIDENTS_PAGE_MAX: usize = 1_000;
/// The response header naming where the next page starts, when there is one.
pub const NEXT_PAGE_HEADER: &str = "x-next-page";

/// The page size asked for, or the 400 answer to a bad one.
fn page_limit(limit: Option<usize>, default: usize, max: usize) -> Result<usize, Box<Response>> {
    match limit {
        None => Ok(default),
        Some(limit) if (1..=max).contains(&limit) => Ok(limit),
        Some(limit) => Err(Box::new(
            (StatusCode::BAD_REQUEST, format!("limit: {limit} is not between 1 and {max}\n")).into_response(),
        )),
    }
}

/// A JSON array, with the query that fetches the next page in [`NEXT_PAGE_HEADER`].
fn paged<T: Serialize>(page: Vec<T>, next: Option<String>) -> Response {
    let mut response = Json(page).into_response();
    if let Some(next) = next.and_then(|next| header::HeaderValue::from_str(&next).ok()) {
        response.headers_mut().insert(NEXT_PAGE_HEADER, next);
    }
    response
}

#[derive(Deserialize)]
struct EventsQuery {
    since: Option<String>,
    limit: Option<usize>,
}

/// `?since=` (RFC 3339): the first `limit` events at or after it, oldest first, and the next
/// page's query in `x-next-page`; without: the newest `limit` events.
async fn events(State(state): State<Arc<ApiState>>, Query(query): Query<EventsQuery>) -> Response {
    let since = match query.since.as_deref().map(parse_rfc3339).transpose() {
        Ok(since) => since,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("since: {error}\n")).into_response(),
    };
    let limit = match page_limit(query.limit, EVENTS_PAGE, EVENTS_PAGE_MAX) {
        Ok(limit) => limit,
        Err(response) => return *response,
    };
    let (page, next) = state.timeline.page(since, limit);
    // Full precision: the page's last event and the next one may be a millisecond apart.
    paged(page, next.map(|next| format!("since={}&limit={limit}", next.to_string().replace('+', "%2B"))))
}

async fn lifecycle(State(state): State<Arc<ApiState>>) -> Response {
    Json(state.lifecycle.snapshot()).into_response()
}

#[derive(Deserialize)]
struct IncidentsQuery {
    before: Option<String>,
    limit: Option<usize>,
}

/// Newest first: `limit` incidents (older than the one with id `before`), and the next page's
/// query in `x-next-page`.
async fn incidents(State(state): State<Arc<ApiState>>, Query(query): Query<IncidentsQuery>) -> Response {
    let limit = match page_limit(query.limit, INCIDENTS_PAGE, INCIDENTS_PAGE_MAX) {
        Ok(limit) => limit,
        Err(response) => return *response,
    };
    let (page, next) = sync::lock(&state.engine).incidents_page(query.before.as_deref(), limit);
    paged(page, next.map(|id| format!("before={id}&limit={limit}")))
}
