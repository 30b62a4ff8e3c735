//! datapath-monitor: the agent as a library, one folder per stage of the data flow.

pub mod agent;
pub mod cli;
pub mod config;
pub mod datapath;
pub mod errors;
pub mod export;
pub mod incidents;
pub mod lifecycle;
pub mod sampling;
pub mod sync;

#[cfg(test)]
mod test_support;
