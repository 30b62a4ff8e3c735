//! What the agent serves: every Prometheus metric family ([`metrics`]), and the HTTP API
//! ([`api`]: `/metrics`, `/healthz`, `/readyz`, `/api/v1/*`) over bounded connections
//! ([`connections`]).

pub mod api;
pub mod connections;
pub mod metrics;
