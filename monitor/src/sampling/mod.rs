//! Which interfaces are watched, and what the kernel counted on each of them: the include
//! and exclude globs ([`filter`]), the links of this network namespace as netlink reports
//! them ([`links`], [`link_watch`]), the network namespaces of pod veth peers ([`netns`]),
//! the per-interface view of the kernel's counters ([`sampler`]), and OVS kernel datapaths'
//! own counters ([`ovs_datapaths`]).

pub mod filter;
mod idle_entries;
pub mod link_watch;
pub mod links;
pub mod netns;
pub mod ovs_datapaths;
mod retransmits;
pub mod sampler;
pub mod switches;

use std::{io, path::PathBuf};

pub use self::{
    filter::InterfaceFilter,
    link_watch::watch_links,
    links::{LinkEvent, LinkFacts, PeerLink},
    netns::OwnNetns,
};

/// Why interfaces cannot be watched. Messages leave their sources out: print errors with
/// [`crate::errors::chain`].
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    #[error("invalid interface glob {glob:?}")]
    Glob {
        glob: String,
        #[source]
        source: globset::Error,
    },
    #[error("building the interface glob set")]
    GlobSet(#[source] globset::Error),
    #[error("netlink: {op}")]
    Netlink {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("reading network namespace {path}")]
    Netns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(crate) fn netlink_error(op: &'static str) -> impl FnOnce(io::Error) -> InterfaceError {
    move |source| InterfaceError::Netlink { op, source }
}
