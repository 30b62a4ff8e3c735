//! datapath-monitor: the agent as a library, one module per stage of the data flow:
//! kernel programs (`datapath`) → per-interface samples (`sampler`) → exports (`metrics`, `api`).

pub mod agent;
pub mod api;
pub mod client;
pub mod cni;
pub mod config;
pub mod datapath;
pub mod dirwatch;
pub mod files;
pub mod incident;
pub mod incident_store;
pub mod incidents;
pub mod incidents_view;
pub mod interfaces;
pub mod lifecycle;
pub mod metrics;
pub mod pods;
pub mod processes;
pub mod sampler;
pub mod timeline;

#[cfg(test)]
mod test_support;
