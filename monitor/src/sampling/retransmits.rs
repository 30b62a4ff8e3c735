//! Which watched interface the kernel's TCP data retransmits belong to. The retransmit
//! tracer counts per (socket netns, destination address); a key is credited to
//!
//! 1. the interface whose pod side lives in the key's netns (a netns other than the
//!    agent's own, behind exactly one watched interface): the pod's own sockets;
//! 2. else the interface of the watched pod that has the destination address: the node's
//!    own connections to a pod (kubelet probes, host-network clients);
//! 3. else "other".
//!
//! Totals never go down: when a key moves to another owner, what it counted so far stays
//! with the previous one (the counts a key had before its interface was watched stay with
//! "other").

use std::collections::HashMap;

use monitor_common::{PodAddress, RetransmitKey};

use crate::datapath::pod_address;

/// The current owners of retransmit keys: None means "other".
#[derive(Debug, Default)]
pub(super) struct RetransmitOwners {
    /// Pod netns inode → host ifindex; None when several watched interfaces lead to it.
    by_netns: HashMap<u64, Option<u32>>,
    /// (family, address as in the key) → host ifindex; None when several pods claim it.
    by_address: HashMap<(u16, [u8; 16]), Option<u32>>,
}

impl RetransmitOwners {
    pub fn add_netns(&mut self, netns: u64, host: u32) {
        claim(&mut self.by_netns, netns, host);
    }

    /// `ip` as the CNI cache has it, "10.128.0.5/23" or bare; unparsable ones are skipped.
    pub fn add_address(&mut self, ip: &str, host: u32) {
        let Some(address) = pod_address(ip) else { return };
        claim(&mut self.by_address, (address.family, address.addr), host);
    }

    /// The addresses exactly one watched pod claims, with its host ifindex: the drop tracer
    /// credits drops on host devices by them too.
    pub fn addresses(&self) -> HashMap<PodAddress, u32> {
        self.by_address
            .iter()
            .filter_map(|(&(family, addr), host)| host.map(|host| (PodAddress { family, _pad: 0, addr }, host)))
            .collect()
    }

    pub fn owner(&self, key: &RetransmitKey) -> Option<u32> {
        self.by_netns
            .get(&u64::from(key.netns))
            .copied()
            .flatten()
            .or_else(|| self.by_address.get(&(key.family, key.daddr)).copied().flatten())
    }
}

fn claim<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Option<u32>>, key: K, host: u32) {
    map.entry(key).and_modify(|owner| *owner = owner.filter(|o| *o == host)).or_insert(Some(host));
}

/// Totals by owner (None: "other").
pub(super) type RetransmitTotals = HashMap<Option<u32>, u64>;

/// What each key has been credited so far.
#[derive(Debug, Default)]
pub(super) struct RetransmitAttribution {
    /// Per key: its owner since `base`, the key's count when that owner began.
    keys: HashMap<RetransmitKey, (Option<u32>, u64)>,
    /// Counts of keys that moved away from their owner, kept with it.
    carried: RetransmitTotals,
}

impl RetransmitAttribution {
    /// Credits every key to its owner now; a key seen for the first time is credited whole.
    pub fn credit(&mut self, kernel: &[(RetransmitKey, u64)], owners: &RetransmitOwners) -> RetransmitTotals {
        let mut totals = self.carried.clone();
        for (key, count) in kernel {
            let owner = owners.owner(key);
            let (previous, base) = self.keys.entry(*key).or_insert((owner, 0));
            if *previous != owner {
                *self.carried.entry(*previous).or_default() += count.saturating_sub(*base);
                *totals.entry(*previous).or_default() += count.saturating_sub(*base);
                (*previous, *base) = (owner, *count);
            }
            *totals.entry(owner).or_default() += count.saturating_sub(*base);
        }
        totals
    }

    /// The keys credited to `host` now.
    pub fn owned_by(&self, host: u32) -> Vec<RetransmitKey> {
        self.keys.iter().filter(|(_, (owner, _))| *owner == Some(host)).map(|(key, _)| *key).collect()
    }

    /// Keys removed from the kernel as idle (see `idle_entries`), with their final counts:
    /// what they were credited stays with their owner.
    pub fn fold(&mut self, idle: &[(RetransmitKey, u64)]) {
        for (key, count) in idle {
            if let Some((owner, base)) = self.keys.remove(key) {
                *self.carried.entry(owner).or_default() += count.saturating_sub(base);
            }
        }
    }

    /// `host` is gone and its final total taken: its keys (removed from the kernel by the
    /// caller) and carried counts are forgotten.
    pub fn retire(&mut self, host: u32, keys: &[RetransmitKey]) {
        for key in keys {
            self.keys.remove(key);
        }
        self.carried.remove(&Some(host));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_common::AF_INET;

    fn key(netns: u32, ip: [u8; 4]) -> RetransmitKey {
        let mut daddr = [0; 16];
        daddr[..4].copy_from_slice(&ip);
        RetransmitKey { netns, family: AF_INET, _pad: 0, daddr }
    }

    #[test]
    fn credits_pod_netns_then_pod_address_then_other() {
        let mut owners = RetransmitOwners::default();
        owners.add_netns(100, 5);
        owners.add_address("10.0.0.7/24", 6);
        owners.add_netns(200, 7);
        owners.add_netns(200, 8);
        assert_eq!(owners.owner(&key(100, [10, 0, 0, 7])), Some(5), "the socket's own netns first");
        assert_eq!(owners.owner(&key(1, [10, 0, 0, 7])), Some(6), "else the pod it talks to");
        assert_eq!(owners.owner(&key(200, [1, 1, 1, 1])), None, "a netns behind two interfaces is nobody's");
        assert_eq!(owners.owner(&key(1, [1, 1, 1, 1])), None);
    }

    #[test]
    fn totals_stay_monotonic_when_a_key_changes_owner() {
        let pod_key = key(100, [10, 0, 0, 1]);
        let mut attribution = RetransmitAttribution::default();
        let nobody = RetransmitOwners::default();
        assert_eq!(attribution.credit(&[(pod_key, 3)], &nobody)[&None], 3);
        let mut owners = RetransmitOwners::default();
        owners.add_netns(100, 5);
        // Counted before the interface was watched: stays with "other".
        let totals = attribution.credit(&[(pod_key, 10)], &owners);
        assert_eq!((totals[&None], totals[&Some(5)]), (10, 0));
        let totals = attribution.credit(&[(pod_key, 14)], &owners);
        assert_eq!((totals[&None], totals[&Some(5)]), (10, 4));
        assert_eq!(attribution.owned_by(5), vec![pod_key]);
        attribution.retire(5, &[pod_key]);
        assert_eq!(attribution.credit(&[], &nobody)[&None], 10);
    }
}
