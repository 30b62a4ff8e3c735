//! What the agent serves: every Prometheus metric family ([`metrics`]), and the HTTP API
//! ([`api`]: `/metrics`, `/healthz`, `/readyz`, `/api/v1/*`).

pub mod api;
pub mod metrics;
