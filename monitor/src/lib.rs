//! datapath-monitor: the agent as a library, one folder per stage of the data flow. In the
//! order data moves:
//!
//! 1. [`datapath`]: the kernel programs: load, attach, read their maps, decode their records (the only code that talks to aya).
//! 2. [`sampling`]: which interfaces are watched (globs, netlink link watch, netns) and each one's counters, every 250 ms.
//! 3. [`lifecycle`]: the node's plumbing changes on one clock: CNI config, SDN processes, interfaces; pod names from the CNI cache.
//! 4. [`incidents`]: disruptions detected in the samples, joined into incidents, attributed to lifecycle events, kept.
//! 5. [`export`]: every Prometheus metric family, and the HTTP API.
//! 6. [`cli`]: `status` and `incidents`, printed from a running agent's API.
//!
//! [`agent`] only wires the stages together; [`config`] is the configuration (flags,
//! environment, TOML file). Across stages: [`errors`] prints error chains, [`sync`] takes
//! locks that outlive a panic, [`privileges`] drops the capabilities the agent no longer needs
//! once started.

pub mod agent;
pub mod cli;
pub mod config;
pub mod datapath;
pub mod errors;
pub mod export;
pub mod incidents;
pub mod lifecycle;
pub mod privileges;
pub mod sampling;
pub mod sync;

#[cfg(test)]
mod test_support;
