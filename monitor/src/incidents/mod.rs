//! Incidents: disruptions found in each interface's samples ([`detection`]), joined into
//! incidents ([`engine`]), attributed to lifecycle events ([`attribution`]), told in words
//! ([`message`]), served as records ([`record`]) and kept across restarts ([`store`]).

pub mod attribution;
pub mod detection;
pub mod engine;
pub mod history;
pub mod message;
pub mod record;
#[cfg(test)]
mod scenarios;
pub mod store;

use std::time::Duration;

pub use self::{
    engine::{IncidentEngine, IncidentUpdate, SharedEngine},
    record::{Cause, Incident, IncidentInterface, IncidentTotals, LostPackets},
};

/// Detection and attribution settings (flags `--incident-*`).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Lost packets in one second, above the baseline, that start a disruption.
    pub floor: u64,
    /// How long a disruption must stay calm to end (hysteresis).
    pub quiet: Duration,
    /// The longest an incident lasts: one still going then is closed, and the loss rate of
    /// its interfaces becomes their baseline (a steady loss is that interface's normal).
    pub max_duration: Duration,
    /// How far before an incident's start lifecycle events are candidate causes.
    pub lookback: Duration,
    /// Seconds of history in an interface's baseline.
    pub baseline_seconds: usize,
    /// Closed incidents kept in memory (and read back at start-up).
    pub history: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            floor: 3,
            quiet: Duration::from_secs(4),
            max_duration: Duration::from_secs(300),
            lookback: Duration::from_secs(30),
            baseline_seconds: 60,
            history: 1000,
        }
    }
}
