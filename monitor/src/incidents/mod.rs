//! Incidents: disruptions found in the samples, attributed to lifecycle events, kept.

pub mod engine;
pub mod record;
pub mod store;
