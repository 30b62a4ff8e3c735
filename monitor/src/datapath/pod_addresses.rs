//! The drop tracer's view of the node's pods: the host-side ifindex of every watched pod veth
//! (drops on it stay its own) and every pod address with its veth (a packet for that address
//! dropped on another host device counts for the pod). The sampler hands over the wanted
//! state each sample; only the differences reach the kernel.

use std::collections::{HashMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData};
use monitor_common::PodAddress;
use tracing::debug;

pub(super) struct PodAddressMaps {
    addresses: BpfHashMap<MapData, PodAddress, u32>,
    veths: BpfHashMap<MapData, u32, u32>,
    /// What the kernel maps hold.
    current_addresses: HashMap<PodAddress, u32>,
    current_veths: HashSet<u32>,
    /// Updates the kernel refused (a full map), in total: reported as map errors
    /// ([`monitor_common::MAP_ERROR_POD_ADDRESSES`]), with a warning and a metric.
    pub(super) failures: u64,
}

impl PodAddressMaps {
    pub(super) fn new(addresses: BpfHashMap<MapData, PodAddress, u32>, veths: BpfHashMap<MapData, u32, u32>) -> Self {
        // What a previous agent left in them (pinned maps, `keep_attached`): the first sync
        // removes what is no longer so.
        let current_addresses = addresses.iter().filter_map(Result::ok).collect();
        let current_veths = veths.keys().filter_map(Result::ok).collect();
        Self { addresses, veths, current_addresses, current_veths, failures: 0 }
    }

    /// Makes the kernel maps hold exactly `veths` and `addresses` (address → veth ifindex).
    /// What the kernel refuses is not recorded as held, so it is tried again at the next sync.
    pub(super) fn sync(&mut self, mut veths: HashSet<u32>, mut addresses: HashMap<PodAddress, u32>) {
        // Veths first: a new veth's own drops must never be credited elsewhere.
        let mut refused = Vec::new();
        for veth in veths.difference(&self.current_veths) {
            if let Err(error) = self.veths.insert(veth, 1, 0) {
                refused.push((*veth, error));
            }
        }
        for veth in self.current_veths.difference(&veths) {
            let _ = self.veths.remove(veth);
        }
        let mut refused_addresses = Vec::new();
        for (address, veth) in &addresses {
            if self.current_addresses.get(address) != Some(veth)
                && let Err(error) = self.addresses.insert(address, veth, 0)
            {
                refused_addresses.push((*address, error));
            }
        }
        for address in self.current_addresses.keys().filter(|a| !addresses.contains_key(a)) {
            let _ = self.addresses.remove(address);
        }
        if self.failures == 0
            && let Some(error) = refused.first().map(|(_, e)| e).or(refused_addresses.first().map(|(_, e)| e))
        {
            debug!(%error, "pod map update failed");
        }
        self.failures += (refused.len() + refused_addresses.len()) as u64;
        for (veth, _) in refused {
            veths.remove(&veth);
        }
        for (address, _) in refused_addresses {
            addresses.remove(&address);
        }
        self.current_veths = veths;
        self.current_addresses = addresses;
    }
}

/// The key of a pod address as the CNI cache writes it ("10.128.0.5/23", or bare); None when
/// it does not parse.
pub fn pod_address(ip: &str) -> Option<PodAddress> {
    let address: std::net::IpAddr = ip.split('/').next().unwrap_or_default().parse().ok()?;
    let mut key = PodAddress::default();
    match address {
        std::net::IpAddr::V4(v4) => {
            key.family = monitor_common::AF_INET;
            key.addr[..4].copy_from_slice(&v4.octets());
        }
        std::net::IpAddr::V6(v6) => {
            key.family = monitor_common::AF_INET6;
            key.addr = v6.octets();
        }
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_cache_addresses_parse_with_or_without_prefix() {
        let v4 = pod_address("10.128.0.5/23").unwrap();
        assert_eq!((v4.family, &v4.addr[..5]), (monitor_common::AF_INET, &[10, 128, 0, 5, 0][..]));
        assert_eq!(pod_address("10.128.0.5"), Some(v4));
        let v6 = pod_address("fd01:0:0:1::5/64").unwrap();
        assert_eq!(v6.family, monitor_common::AF_INET6);
        assert_eq!(v6.addr[15], 5);
        assert_eq!(pod_address("not-an-ip/24"), None);
        assert_eq!(pod_address(""), None);
    }
}
