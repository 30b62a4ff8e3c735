//! Pod enrichment: which pod is behind a watched host interface, from libcni's result cache.
//!
//! libcni (the library CRI-O and containerd run CNI plugins through) caches every ADD as a
//! JSON file in its cache dir (default `/var/lib/cni/results`), named
//! `<networkName>-<containerID>-<ifName>`, with kind `cniCacheV1`, the runtime's `cniArgs`
//! (where kubelet's runtime puts `K8S_POD_NAMESPACE` and `K8S_POD_NAME`), the runtime's
//! `netns` (newer libcni) and the plugin's `result` in its own CNI version (0.1/0.2: `ip4`,
//! `ip6`; 0.3.x, 0.4.0, 1.x: `interfaces` and `ips`). This module parses those files and
//! indexes them by what the interface watch knows about a pod veth:
//! - its name, when the plugin lists the host-side veth in `result.interfaces` (an entry
//!   without `sandbox`, e.g. OVN-Kubernetes, the bridge and ptp plugins);
//! - its peer's network namespace inode, matched against the inode of each `sandbox` netns
//!   path (e.g. openshift-sdn, which lists only the container side).
//!
//! Unknown stays unknown: a file without both pod arguments gives no pod, nothing is inferred
//! from file names or container IDs, and a sandbox path is trusted only while it still names
//! the same network namespace.
//!
//! libcni writes cache files in place (truncate, then write), so a reader woken by
//! `IN_MODIFY` may see half a file: watch `IN_CLOSE_WRITE`, `IN_MOVED_TO`, `IN_DELETE` and
//! `IN_MOVED_FROM` and call [`PodIndex::read_file`] with the event's name.

mod cache_entry;
mod index;
mod watch;

pub use self::{
    cache_entry::{CacheEntry, MAX_CACHE_FILE_BYTES, PodCacheError, parse_cache_entry},
    index::{FileOutcome, PodIndex, PodInfo},
    watch::{SharedPods, watch_cache_dir},
};
