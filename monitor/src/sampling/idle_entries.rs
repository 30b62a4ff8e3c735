//! Kernel counter entries nobody will increment again. The drop and retransmit maps are
//! keyed by network namespace (and device, or destination): when a pod is deleted, the
//! entries of its veth are removed with it (see `Sampler::unwatch`), but those of devices no
//! watched interface owns (a pod's loopback, a host device that went away) would stay for
//! ever and fill the map. [`IdleEntries`] remembers when each such entry last grew; one that
//! has not for the configured time is handed back, so that its count is folded into the
//! "other" total and the entry removed from the kernel.

use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

#[derive(Debug)]
pub(super) struct IdleEntries<K> {
    /// Per entry: its count when last seen, and when that count was first seen.
    seen: HashMap<K, (u64, Instant)>,
    idle: Duration,
}

impl<K: Copy + Eq + Hash> IdleEntries<K> {
    pub fn new(idle: Duration) -> Self {
        Self { seen: HashMap::new(), idle }
    }

    /// Notes the entries read now (those `eligible` only); forgets the ones gone from the
    /// kernel. Returns the entries idle for long enough, with their counts: the caller
    /// carries the counts and removes the entries.
    pub fn observe(&mut self, now: Instant, entries: &[(K, u64)], eligible: impl Fn(&K) -> bool) -> Vec<(K, u64)> {
        let mut present = HashMap::with_capacity(entries.len());
        let mut idle = Vec::new();
        for (key, count) in entries {
            if !eligible(key) {
                continue;
            }
            let since = match self.seen.get(key) {
                Some(&(previous, since)) if previous == *count => since,
                _ => now,
            };
            if now.duration_since(since) >= self.idle {
                idle.push((*key, *count));
            } else {
                present.insert(*key, (*count, since));
            }
        }
        self.seen = present;
        idle
    }

    /// Entries being watched for idleness.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_idle_once_its_count_has_not_changed_for_the_whole_time() {
        let start = Instant::now();
        let mut entries = IdleEntries::new(Duration::from_secs(10));
        assert!(entries.observe(start, &[(1u32, 5)], |_| true).is_empty());
        assert!(entries.observe(start + Duration::from_secs(6), &[(1, 6)], |_| true).is_empty());
        // Six seconds after it last grew: not yet.
        assert!(entries.observe(start + Duration::from_secs(12), &[(1, 6)], |_| true).is_empty());
        assert_eq!(entries.observe(start + Duration::from_secs(16), &[(1, 6)], |_| true), vec![(1, 6)]);
        // Handed back once: the caller removes it from the kernel.
        assert_eq!(entries.len(), 0);
    }

    #[test]
    fn entries_not_eligible_are_never_handed_back_and_vanished_ones_are_forgotten() {
        let start = Instant::now();
        let mut entries = IdleEntries::new(Duration::from_secs(1));
        entries.observe(start, &[(1u32, 5), (2, 7)], |key| *key == 2);
        assert_eq!(entries.len(), 1);
        assert!(entries.observe(start + Duration::from_secs(5), &[(1, 5)], |key| *key == 2).is_empty());
        assert_eq!(entries.len(), 0);
    }
}
