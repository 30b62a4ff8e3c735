//! The per-interface view of the kernel's counters: attaches and detaches as watched
//! links come and go, attributes drops to interfaces, and keeps a removed interface's
//! final counts for a grace period so its last increments are not lost.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant, SystemTime},
};

use monitor_common::{DROP_REASON_UNKNOWN, DropKey, InterfaceCounters, MAP_ERROR_SLOTS};
use serde::Serialize;
use tracing::{info, warn};

use crate::{
    datapath::{AttachMode, Datapath, ProbeReport, ProgramRunStats},
    interfaces::{LinkEvent, LinkFacts},
};

/// Label used for drops on devices that are not watched.
pub const OTHER_INTERFACE: &str = "other";

/// One watched interface as exported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceSeries {
    pub interface: String,
    pub ifindex: u32,
    pub pod_namespace: String,
    pub pod: String,
    pub counters: InterfaceCounters,
    /// Drops by reason name, on the host side or the pod side of this interface.
    pub drops: BTreeMap<String, u64>,
    pub removed: bool,
}

/// Everything exported, read from the kernel at one instant.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub at: Option<SystemTime>,
    pub interfaces: Vec<InterfaceSeries>,
    /// Drops on devices that are not watched, by reason.
    pub other_drops: BTreeMap<String, u64>,
    pub programs: Vec<ProgramRunStats>,
    pub map_errors: [u64; MAP_ERROR_SLOTS as usize],
    pub attached: usize,
    pub probes: ProbeReport,
}

/// A watched link and whether the programs hang on it.
#[derive(Clone, Debug, Serialize)]
pub struct WatchedInterface {
    pub link: LinkFactsView,
    pub attach_mode: Option<AttachMode>,
    pub attach_error: Option<String>,
}

/// Serializable copy of the netlink facts.
#[derive(Clone, Debug, Serialize)]
pub struct LinkFactsView {
    pub name: String,
    pub ifindex: u32,
    pub kind: Option<String>,
    pub up: bool,
    pub peer_ifindex: Option<u32>,
    pub peer_netns: Option<u64>,
}

impl From<&LinkFacts> for LinkFactsView {
    fn from(link: &LinkFacts) -> Self {
        Self {
            name: link.name.clone(),
            ifindex: link.ifindex,
            kind: link.kind.clone(),
            up: link.up,
            peer_ifindex: link.peer.as_ref().map(|p| p.ifindex),
            peer_netns: link.peer.as_ref().and_then(|p| p.netns_inode),
        }
    }
}

struct Retired {
    series: InterfaceSeries,
    until: Instant,
}

/// Where a drop key's counts belong, and what part of them happened before we watched.
#[derive(Default)]
struct DropAttribution {
    /// (netns inode, ifindex) of a watched interface's host side and pod side → host ifindex.
    owners: HashMap<(u64, u32), u32>,
    /// Counts a key had when its interface became watched: they stay with "other".
    baselines: HashMap<DropKey, u64>,
}

pub struct Sampler {
    datapath: Datapath,
    own_netns: u64,
    reason_names: BTreeMap<u32, String>,
    watched: BTreeMap<u32, (LinkFacts, Option<AttachMode>, Option<String>)>,
    retired: Vec<Retired>,
    attribution: DropAttribution,
    /// Drops of removed interfaces' pre-watch baselines, kept so "other" never goes down.
    other_carried: BTreeMap<String, u64>,
    grace: Duration,
    map_errors_reported: [u64; MAP_ERROR_SLOTS as usize],
}

impl Sampler {
    pub fn new(datapath: Datapath, own_netns: u64, grace: Duration) -> Self {
        let reason_names = datapath.drop_reason_names().clone();
        Self {
            datapath,
            own_netns,
            reason_names,
            watched: BTreeMap::new(),
            retired: Vec::new(),
            attribution: DropAttribution::default(),
            other_carried: BTreeMap::new(),
            grace,
            map_errors_reported: [0; MAP_ERROR_SLOTS as usize],
        }
    }

    pub fn reason_name(&self, reason: u32) -> String {
        reason_name(&self.reason_names, reason)
    }

    pub fn watched_interfaces(&self) -> Vec<WatchedInterface> {
        self.watched
            .values()
            .map(|(link, mode, error)| WatchedInterface {
                link: link.into(),
                attach_mode: *mode,
                attach_error: error.clone(),
            })
            .collect()
    }

    pub fn attached_count(&self) -> usize {
        self.datapath.attached_count()
    }

    pub fn probes(&self) -> &ProbeReport {
        self.datapath.probes()
    }

    /// Applies one netlink event: attach, re-key, or detach and retire.
    pub fn apply(&mut self, event: LinkEvent) {
        match event {
            LinkEvent::Added(link) | LinkEvent::Changed(link) => self.watch(link),
            LinkEvent::Removed { ifindex, name } => self.unwatch(ifindex, &name),
        }
    }

    fn watch(&mut self, link: LinkFacts) {
        let ifindex = link.ifindex;
        if !link.is_ethernet {
            warn!(interface = link.name, "not an Ethernet device: skipped (the tc programs parse Ethernet)");
            self.watched.insert(ifindex, (link, None, Some("not an Ethernet device".into())));
            return;
        }
        let started = Instant::now();
        let newly = !self.datapath.is_attached(ifindex);
        let (mode, error) = match self.datapath.attach(ifindex, &link.name) {
            Ok(mode) => (Some(mode), None),
            Err(error) => {
                warn!(interface = link.name, %error, "attach failed; interface skipped");
                (None, Some(error.to_string()))
            }
        };
        if newly && mode.is_some() {
            info!(interface = link.name, ifindex, mode = ?mode, latency_us = started.elapsed().as_micros() as u64, "attached");
        }
        self.set_owners(&link);
        self.watched.insert(ifindex, (link, mode, error));
    }

    fn set_owners(&mut self, link: &LinkFacts) {
        let host = link.ifindex;
        let mut keys = vec![(self.own_netns, host)];
        if let Some(peer) = &link.peer
            && let Some(netns) = peer.netns_inode
        {
            keys.push((netns, peer.ifindex));
        }
        let new_keys: Vec<(u64, u32)> =
            keys.iter().copied().filter(|key| self.attribution.owners.get(key) != Some(&host)).collect();
        self.attribution.owners.retain(|key, owner| *owner != host || keys.contains(key));
        if new_keys.is_empty() {
            return;
        }
        // Drops counted before we watched stay with "other".
        for (drop_key, count) in self.datapath.read_drops() {
            if new_keys.contains(&(u64::from(drop_key.netns), drop_key.ifindex)) {
                self.attribution.baselines.entry(drop_key).or_insert(count);
            }
        }
        for key in new_keys {
            self.attribution.owners.insert(key, host);
        }
    }

    fn unwatch(&mut self, ifindex: u32, name: &str) {
        let Some((link, mode, _)) = self.watched.remove(&ifindex) else { return };
        if mode.is_none() {
            return;
        }
        let drops = self.datapath.read_drops();
        let final_counters = self.datapath.detach(ifindex).unwrap_or_default();
        let mut series = self.series_for(&link, final_counters, &drops);
        series.removed = true;
        series.interface = name.to_string();
        // The kernel entries of a vanished device get no more increments: fold and forget them.
        let owned: Vec<(u64, u32)> =
            self.attribution.owners.iter().filter(|(_, owner)| **owner == ifindex).map(|(k, _)| *k).collect();
        for (key, count) in &drops {
            if owned.contains(&(u64::from(key.netns), key.ifindex))
                && let Some(baseline) = self.attribution.baselines.remove(key)
            {
                *self.other_carried.entry(reason_name(&self.reason_names, key.reason)).or_default() +=
                    baseline.min(*count);
            }
        }
        self.datapath.forget_drops(|key| owned.contains(&(u64::from(key.netns), key.ifindex)));
        self.attribution.owners.retain(|_, owner| *owner != ifindex);
        info!(interface = name, ifindex, "detached");
        self.retired.push(Retired { series, until: Instant::now() + self.grace });
    }

    fn series_for(
        &self,
        link: &LinkFacts,
        counters: InterfaceCounters,
        kernel_drops: &[(DropKey, u64)],
    ) -> InterfaceSeries {
        let mut drops = BTreeMap::new();
        for (key, count) in kernel_drops {
            if self.attribution.owners.get(&(u64::from(key.netns), key.ifindex)) == Some(&link.ifindex) {
                let since_watched = count.saturating_sub(self.attribution.baselines.get(key).copied().unwrap_or(0));
                *drops.entry(reason_name(&self.reason_names, key.reason)).or_default() += since_watched;
            }
        }
        InterfaceSeries {
            interface: link.name.clone(),
            ifindex: link.ifindex,
            pod_namespace: String::new(),
            pod: String::new(),
            counters,
            drops,
            removed: false,
        }
    }

    /// Reads the kernel and builds the exported view.
    pub fn sample(&mut self) -> Sample {
        let now = Instant::now();
        self.retired.retain(|r| r.until > now);
        let kernel = self.datapath.read();
        self.report_map_errors(&kernel.map_errors);

        let mut interfaces = Vec::with_capacity(self.watched.len() + self.retired.len());
        for (link, mode, _) in self.watched.values() {
            if mode.is_none() {
                continue;
            }
            let counters = kernel.interfaces.get(&link.ifindex).copied().unwrap_or_default();
            interfaces.push(self.series_for(link, counters, &kernel.drops));
        }
        interfaces.extend(self.retired.iter().map(|r| r.series.clone()));

        let mut other_drops = self.other_carried.clone();
        for (key, count) in &kernel.drops {
            let owned = self.attribution.owners.contains_key(&(u64::from(key.netns), key.ifindex));
            let other = if owned { self.attribution.baselines.get(key).copied().unwrap_or(0) } else { *count };
            if other > 0 {
                *other_drops.entry(reason_name(&self.reason_names, key.reason)).or_default() += other;
            }
        }
        Sample {
            at: Some(SystemTime::now()),
            interfaces,
            other_drops,
            programs: kernel.programs,
            map_errors: kernel.map_errors,
            attached: self.datapath.attached_count(),
            probes: self.datapath.probes().clone(),
        }
    }

    fn report_map_errors(&mut self, now: &[u64; MAP_ERROR_SLOTS as usize]) {
        for (slot, (reported, current)) in self.map_errors_reported.iter_mut().zip(now).enumerate() {
            if current > reported {
                warn!(
                    map = map_error_name(slot).unwrap_or("spare"),
                    new = current - *reported,
                    "kernel map full: updates lost (counted)"
                );
                *reported = *current;
            }
        }
    }
}

/// Name of a `MAP_ERROR_*` slot, as exported (None for spare slots).
pub fn map_error_name(slot: usize) -> Option<&'static str> {
    match u32::try_from(slot).ok()? {
        monitor_common::MAP_ERROR_DROPS_FULL => Some("drops"),
        monitor_common::MAP_ERROR_INTERFACE_INSERT => Some("interface_counters"),
        monitor_common::MAP_ERROR_FLOWS_INSERT => Some("flows"),
        monitor_common::MAP_ERROR_PROCESS_EVENTS => Some("process_events"),
        _ => None,
    }
}

fn reason_name(names: &BTreeMap<u32, String>, reason: u32) -> String {
    if reason == DROP_REASON_UNKNOWN {
        return "unknown".into();
    }
    names.get(&reason).cloned().unwrap_or_else(|| format!("REASON_{reason}"))
}

impl Sampler {
    /// Detaches from every interface; used at shutdown so nothing stays attached.
    pub fn detach_all(&mut self) {
        let attached: Vec<u32> = self.watched.keys().copied().collect();
        for ifindex in attached {
            self.datapath.detach(ifindex);
        }
        self.watched.clear();
    }
}
