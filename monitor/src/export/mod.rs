//! What the agent serves: every Prometheus metric family, and the HTTP API.

pub mod api;
pub mod metrics;
