//! The per-interface view of the kernel's counters: attaches and detaches as watched
//! links come and go, attributes drops and TCP retransmits ([`super::retransmits`]) to
//! interfaces, and keeps a removed interface's
//! final counts for a grace period so its last increments are not lost.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime},
};

use monitor_common::{
    DROP_REASON_UNKNOWN, DROPS_MAP, DropKey, INTERFACE_COUNTERS_MAP, InterfaceCounters, MAP_ERROR_SLOTS,
    RETRANSMITS_MAP, RetransmitKey,
};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::{
    datapath::{AttachMode, Datapath, FlowTableState, ProbeReport, ProgramRunStats},
    errors,
    sampling::{
        LinkEvent, LinkFacts,
        idle_entries::IdleEntries,
        ovs_datapaths::{OvsDatapathStats, OvsDatapaths, OvsDatapathsState},
        retransmits::{RetransmitAttribution, RetransmitOwners, RetransmitTotals},
        switches::{Switches, link_name},
    },
    sync,
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
    /// TCP data segments retransmitted by sockets of this pod's netns, or by the node's
    /// sockets to this pod's addresses (SYN and SYN-ACK retransmits excluded).
    pub tcp_retransmits: u64,
    pub removed: bool,
    /// A host-side veth whose peer is in another netns (a pod's).
    pub is_pod_veth: bool,
}

/// Everything exported, read from the kernel at one instant.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub at: Option<SystemTime>,
    /// Samples the incident engine has judged since start, this one included (set by the
    /// sampling loop): what a test waits on to know the agent has looked, not just that time
    /// passed.
    pub judged: u64,
    pub interfaces: Vec<InterfaceSeries>,
    /// Drops on devices that are not watched, by reason.
    pub other_drops: BTreeMap<String, u64>,
    /// Switches with two watched ports or more: their unforwarded packets, as drops under
    /// [`super::switches::UNFORWARDED_REASON`] (see [`super::switches`]).
    pub switches: Vec<InterfaceSeries>,
    /// TCP data retransmits credited to no watched interface.
    pub other_tcp_retransmits: u64,
    pub programs: Vec<ProgramRunStats>,
    pub map_errors: [u64; MAP_ERROR_SLOTS as usize],
    pub attached: usize,
    /// tc programs found removed from an interface by someone else (each attached again),
    /// and attempts to attach them again that failed, since start.
    pub tc_programs_removed: u64,
    pub tc_reattach_failures: u64,
    /// Interfaces whose removed tc program could not be attached again yet.
    pub tc_pending: Vec<String>,
    /// The LRU flow table (handshakes awaiting an answer): entries at the last count, and
    /// handshakes evicted to make room since start (their retransmits go uncounted).
    pub flow_table_entries: u64,
    pub flow_table_evictions: u64,
    /// Entries in the kernel's counter maps now, by map name.
    pub map_entries: Vec<(&'static str, u64)>,
    /// Idle entries nobody owns, folded into "other" and removed, since start, by map name.
    pub entries_collected: Vec<(&'static str, u64)>,
    pub probes: ProbeReport,
    /// OVS kernel datapaths' own counters (`ovs-dpctl show`); whether they could be read is
    /// the probe [`OVS_DP_STATS_PROBE`].
    pub ovs_datapaths: Vec<OvsDatapathStats>,
}

/// The latest sample: published by the sampling loop, read by every scrape.
#[derive(Debug, Default)]
pub struct LatestSample(RwLock<Arc<Sample>>);

impl LatestSample {
    pub fn publish(&self, sample: Sample) {
        *sync::write(&self.0) = Arc::new(sample);
    }

    pub fn get(&self) -> Arc<Sample> {
        Arc::clone(&sync::read(&self.0))
    }
}

/// A watched link as served by `/api/v1/interfaces`: netlink facts, pod and attach state.
#[derive(Clone, Debug, Serialize)]
pub struct WatchedInterface {
    pub interface: String,
    pub ifindex: u32,
    pub kind: Option<String>,
    /// Administratively and operationally up.
    pub up: bool,
    /// Inode of the network namespace the interface lives in (the agent's).
    pub netns: u64,
    /// For a veth: its peer (the pod's eth0) and the peer's network namespace inode.
    pub peer: Option<PeerView>,
    /// From the CNI result cache; empty when unknown.
    pub pod_namespace: String,
    pub pod: String,
    pub ips: Vec<String>,
    /// "tcx" or "clsact"; null when not attached (see attach_error).
    pub attach_mode: Option<AttachMode>,
    pub attach_error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PeerView {
    pub ifindex: u32,
    pub netns: Option<u64>,
}

/// The pod behind a watched interface, as the CNI cache tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLabels {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<String>,
}

/// Where pod names come from (the CNI cache).
pub trait PodSource: Send + Sync {
    /// Changes whenever an answer of `lookup` may have changed; lets callers cache answers.
    fn generation(&self) -> u64;
    /// The pod of a host-side pod veth (name, peer netns inode); None when unknown.
    fn lookup(&self, interface: &str, peer_netns: Option<u64>) -> Option<PodLabels>;
}

type PodCache = HashMap<(u32, String), (u64, Option<PodLabels>)>;

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
    retransmits: RetransmitAttribution,
    grace: Duration,
    map_errors_reported: [u64; MAP_ERROR_SLOTS as usize],
    pods: Option<Arc<dyn PodSource>>,
    /// Answers of `pods` per (ifindex, name), valid while its generation holds.
    pod_cache: Mutex<PodCache>,
    switches: Switches,
    /// When the OVS upcall tracer was last tried (it waits for openvswitch.ko).
    upcalls_tried: Instant,
    /// The OVS datapaths' counters as last read (by the sampling task, outside this lock).
    ovs_datapaths: Vec<OvsDatapathStats>,
    ovs_datapaths_state: OvsDatapathsState,
    /// When the attachments were last verified, and what the checks found.
    attachments_checked: Instant,
    tc_programs_removed: u64,
    tc_reattach_failures: u64,
    /// Kernel entries of devices and namespaces no watched interface owns, by last growth.
    idle_drops: IdleEntries<DropKey>,
    idle_retransmits: IdleEntries<RetransmitKey>,
    drops_collected: u64,
    retransmits_collected: u64,
    /// The flow table as last counted, and when.
    flow_table: FlowTableState,
    flow_table_evictions: u64,
    flow_table_counted: Instant,
}

/// The probe name under which the OVS datapaths' own counters are reported.
pub const OVS_DP_STATS_PROBE: &str = "ovs_dp_stats";

/// How often the OVS upcall tracer is tried again while openvswitch.ko is absent.
const UPCALL_RETRY: Duration = Duration::from_secs(10);

/// How often the kernel is asked whether the tc programs still run on every attached
/// interface (two cheap syscalls per interface).
const ATTACHMENT_CHECK: Duration = Duration::from_secs(5);

/// How often the flow table's entries are counted (one syscall per entry, 65536 at most).
const FLOW_TABLE_COUNT: Duration = Duration::from_secs(10);

impl Sample {
    /// What the incident engine judges: every interface, and every switch, whose unforwarded
    /// packets are drops. A switch whose own device is watched too (a Linux bridge, see
    /// [`super::switches`]) is that device: its unforwarded packets join the device's series.
    pub fn judged(&self) -> Vec<InterfaceSeries> {
        super::switches::judged(&self.interfaces, &self.switches)
    }
}

impl Sampler {
    pub fn new(datapath: Datapath, own_netns: u64, grace: Duration, entry_idle: Duration) -> Self {
        let reason_names = datapath.drop_reason_names().clone();
        Self {
            datapath,
            own_netns,
            reason_names,
            watched: BTreeMap::new(),
            retired: Vec::new(),
            attribution: DropAttribution::default(),
            other_carried: BTreeMap::new(),
            retransmits: RetransmitAttribution::default(),
            grace,
            map_errors_reported: [0; MAP_ERROR_SLOTS as usize],
            pods: None,
            pod_cache: Mutex::new(HashMap::new()),
            switches: Switches::default(),
            upcalls_tried: Instant::now(),
            ovs_datapaths: Vec::new(),
            ovs_datapaths_state: OvsDatapathsState::NoModule,
            attachments_checked: Instant::now(),
            tc_programs_removed: 0,
            tc_reattach_failures: 0,
            idle_drops: IdleEntries::new(entry_idle),
            idle_retransmits: IdleEntries::new(entry_idle),
            drops_collected: 0,
            retransmits_collected: 0,
            flow_table: FlowTableState::default(),
            flow_table_evictions: 0,
            // Counted at the first sample.
            flow_table_counted: Instant::now() - FLOW_TABLE_COUNT,
        }
    }

    /// Where pod names come from (the CNI cache); without one, pod labels stay empty.
    pub fn set_pod_source(&mut self, pods: Arc<dyn PodSource>) {
        self.pods = Some(pods);
    }

    /// The pod behind a pod veth; None for other interfaces and when the cache does not say.
    fn pod_of(&self, link: &LinkFacts) -> Option<PodLabels> {
        let pods = self.pods.as_ref()?;
        if !link.is_pod_veth() {
            return None;
        }
        let generation = pods.generation();
        let mut cache = sync::lock(&self.pod_cache);
        let key = (link.ifindex, link.name.clone());
        if let Some((cached, labels)) = cache.get(&key)
            && *cached == generation
        {
            return labels.clone();
        }
        let labels = pods.lookup(&link.name, link.peer.as_ref().and_then(|peer| peer.netns_inode));
        cache.insert(key, (generation, labels.clone()));
        labels
    }

    pub fn reason_name(&self, reason: u32) -> String {
        reason_name(&self.reason_names, reason)
    }

    pub fn watched_interfaces(&self) -> Vec<WatchedInterface> {
        self.watched
            .values()
            .map(|(link, mode, error)| {
                let pod = self.pod_of(link);
                WatchedInterface {
                    interface: link.name.clone(),
                    ifindex: link.ifindex,
                    kind: link.kind.clone(),
                    up: link.is_up(),
                    netns: self.own_netns,
                    peer: link.peer.as_ref().map(|peer| PeerView { ifindex: peer.ifindex, netns: peer.netns_inode }),
                    pod_namespace: pod.as_ref().map(|p| p.namespace.clone()).unwrap_or_default(),
                    pod: pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
                    ips: pod.map(|p| p.ips).unwrap_or_default(),
                    attach_mode: *mode,
                    attach_error: error.clone(),
                }
            })
            .collect()
    }

    pub fn attached_count(&self) -> usize {
        self.datapath.attached_count()
    }

    /// Takes the OVS datapaths' counters for the next samples. They are read over netlink
    /// outside this lock, which `/readyz` also takes.
    pub fn set_ovs_datapaths(&mut self, datapaths: &OvsDatapaths) {
        self.ovs_datapaths.clone_from(&datapaths.latest);
        self.ovs_datapaths_state = datapaths.state.clone();
    }

    /// The kernel programs' probes, and the OVS datapath counters as probe
    /// [`OVS_DP_STATS_PROBE`] (read over netlink, or why not).
    pub fn probes(&self) -> ProbeReport {
        let mut report = self.datapath.probes().clone();
        let result = match &self.ovs_datapaths_state {
            OvsDatapathsState::Read => Ok("netlink"),
            OvsDatapathsState::NoModule => {
                Err("openvswitch.ko is not loaded (looked for again every 10 s)".to_string())
            }
            OvsDatapathsState::Failed(error) => Err(format!("reading over netlink failed: {error}")),
        };
        report.record(OVS_DP_STATS_PROBE, &result);
        report
    }

    /// The facts of watched link `ifindex` as last applied.
    pub fn watched_link(&self, ifindex: u32) -> Option<&LinkFacts> {
        self.watched.get(&ifindex).map(|(link, _, _)| link)
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
        // Retransmits so far stay with their owners before this link changes who owns what.
        self.credit_retransmits(&self.datapath.read_retransmits());
        sync::get_mut(&mut self.pod_cache).retain(|(i, _), _| *i != ifindex);
        if !link.is_ethernet {
            warn!(interface = link.name, "not an Ethernet device: skipped (the tc programs parse Ethernet)");
            self.watched.insert(ifindex, (link, None, Some("not an Ethernet device".into())));
            self.credit_retransmits(&self.datapath.read_retransmits());
            return;
        }
        let started = Instant::now();
        let newly = !self.datapath.is_attached(ifindex);
        let (mode, error) = match self.datapath.attach(ifindex, &link.name) {
            Ok(mode) => (Some(mode), None),
            Err(error) => {
                let error = errors::chain(&error);
                warn!(interface = link.name, %error, "attach failed; interface skipped");
                (None, Some(error))
            }
        };
        if newly && mode.is_some() {
            info!(interface = link.name, ifindex, mode = ?mode, latency_us = started.elapsed().as_micros() as u64, "attached");
        }
        if mode.is_some() {
            self.set_owners(&link);
        } else {
            // Not attached, so no series: its drops stay with "other" rather than vanish.
            self.attribution.owners.retain(|_, owner| *owner != ifindex);
        }
        self.watched.insert(ifindex, (link, mode, error));
        self.credit_retransmits(&self.datapath.read_retransmits());
    }

    /// Who owns retransmit keys now (see [`super::retransmits`]).
    fn retransmit_owners(&self) -> RetransmitOwners {
        let mut owners = RetransmitOwners::default();
        for (&(netns, _), &host) in &self.attribution.owners {
            if netns != self.own_netns {
                owners.add_netns(netns, host);
            }
        }
        for (link, mode, _) in self.watched.values() {
            if mode.is_none() {
                continue;
            }
            for ip in self.pod_of(link).map(|pod| pod.ips).unwrap_or_default() {
                owners.add_address(&ip, link.ifindex);
            }
        }
        owners
    }

    fn credit_retransmits(&mut self, kernel: &[(monitor_common::RetransmitKey, u64)]) -> RetransmitTotals {
        let owners = self.retransmit_owners();
        self.retransmits.credit(kernel, &owners)
    }

    /// Tells the drop tracer the watched pod veths and the pods' addresses (as `owners` has
    /// them), so that a packet for a pod dropped on a host device (tun0, a management port)
    /// counts for the pod.
    fn sync_pods(&mut self, owners: &RetransmitOwners) {
        let veths = self
            .watched
            .values()
            .filter(|(link, mode, _)| mode.is_some() && link.is_pod_veth())
            .map(|(link, _, _)| link.ifindex)
            .collect();
        self.datapath.set_pods(veths, owners.addresses());
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
        // Drops counted before we watched stay with "other". An interface taken over from a
        // previous agent (`keep_attached`) keeps that agent's baselines: its drops go on.
        let taken_over = self.datapath.taken_over(host);
        for (drop_key, count) in self.datapath.read_drops() {
            if new_keys.contains(&(u64::from(drop_key.netns), drop_key.ifindex))
                && !self.attribution.baselines.contains_key(&drop_key)
            {
                let baseline = if taken_over {
                    self.datapath.kept_drop_baseline(&drop_key)
                } else {
                    self.datapath.keep_drop_baseline(&drop_key, count);
                    count
                };
                self.attribution.baselines.insert(drop_key, baseline);
            }
        }
        for key in new_keys {
            self.attribution.owners.insert(key, host);
        }
    }

    fn unwatch(&mut self, ifindex: u32, name: &str) {
        // Credited while still watched: its retransmit keys are its own one last time.
        let retransmits = self.credit_retransmits(&self.datapath.read_retransmits());
        let Some((link, mode, _)) = self.watched.remove(&ifindex) else { return };
        if mode.is_none() {
            return;
        }
        let drops = self.datapath.read_drops();
        let final_counters = self.datapath.detach(ifindex).unwrap_or_default();
        let mut series = self.series_for(&link, final_counters, &drops, &retransmits);
        series.removed = true;
        series.interface = name.to_string();
        sync::get_mut(&mut self.pod_cache).retain(|(i, _), _| *i != ifindex);
        // The kernel entries of a vanished device get no more increments: fold and forget them.
        let owned: Vec<(u64, u32)> =
            self.attribution.owners.iter().filter(|(_, owner)| **owner == ifindex).map(|(k, _)| *k).collect();
        for (key, count) in &drops {
            if owned.contains(&(u64::from(key.netns), key.ifindex))
                && let Some(baseline) = self.attribution.baselines.remove(key)
            {
                *self.other_carried.entry(drop_name(&self.reason_names, key)).or_default() += baseline.min(*count);
            }
        }
        self.datapath.forget_drops(|key| owned.contains(&(u64::from(key.netns), key.ifindex)));
        self.attribution.owners.retain(|_, owner| *owner != ifindex);
        // Its retransmit keys too: the pod's netns is gone, or its address may go to another pod.
        let keys = self.retransmits.owned_by(ifindex);
        self.datapath.forget_retransmits(|key| keys.contains(key));
        self.retransmits.retire(ifindex, &keys);
        info!(interface = name, ifindex, "detached");
        self.retired.push(Retired { series, until: Instant::now() + self.grace });
    }

    fn series_for(
        &self,
        link: &LinkFacts,
        counters: InterfaceCounters,
        kernel_drops: &[(DropKey, u64)],
        retransmits: &RetransmitTotals,
    ) -> InterfaceSeries {
        let mut drops = BTreeMap::new();
        for (key, count) in kernel_drops {
            if self.attribution.owners.get(&(u64::from(key.netns), key.ifindex)) == Some(&link.ifindex) {
                let since_watched = count.saturating_sub(self.attribution.baselines.get(key).copied().unwrap_or(0));
                *drops.entry(drop_name(&self.reason_names, key)).or_default() += since_watched;
            }
        }
        let pod = self.pod_of(link).unwrap_or_default();
        InterfaceSeries {
            interface: link.name.clone(),
            ifindex: link.ifindex,
            pod_namespace: pod.namespace,
            pod: pod.name,
            counters,
            drops,
            tcp_retransmits: retransmits.get(&Some(link.ifindex)).copied().unwrap_or(0),
            removed: false,
            is_pod_veth: link.is_pod_veth(),
        }
    }

    /// Reads the kernel and builds the exported view.
    pub fn sample(&mut self) -> Sample {
        let now = Instant::now();
        self.retired.retain(|r| r.until > now);
        if now.duration_since(self.upcalls_tried) >= UPCALL_RETRY {
            self.upcalls_tried = now;
            if self.datapath.retry_upcall_tracer() {
                // openvswitch.ko appeared: its drop reasons get their names from its BTF.
                for (value, name) in self.datapath.drop_reason_names() {
                    self.reason_names.entry(*value).or_insert_with(|| name.clone());
                }
            }
        }
        if now.duration_since(self.attachments_checked) >= ATTACHMENT_CHECK {
            self.attachments_checked = now;
            for reattachment in self.datapath.verify_attachments() {
                match reattachment.error {
                    None => self.tc_programs_removed += 1,
                    Some(_) => self.tc_reattach_failures += 1,
                }
            }
        }
        if now.duration_since(self.flow_table_counted) >= FLOW_TABLE_COUNT {
            self.flow_table_counted = now;
            self.flow_table = self.datapath.read_flow_table();
            // Monotonic: a count taken while handshakes come and go may come out lower.
            self.flow_table_evictions = self.flow_table_evictions.max(self.flow_table.evicted());
        }
        let owners = self.retransmit_owners();
        self.sync_pods(&owners);
        let mut kernel = self.datapath.read();
        kernel.map_errors[monitor_common::MAP_ERROR_POD_ADDRESSES as usize] = self.datapath.pod_address_failures();
        self.report_map_errors(&kernel.map_errors);
        let retransmits = self.retransmits.credit(&kernel.retransmits, &owners);

        let mut interfaces = Vec::with_capacity(self.watched.len() + self.retired.len());
        for (link, mode, _) in self.watched.values() {
            if mode.is_none() {
                continue;
            }
            let counters = kernel.interfaces.get(&link.ifindex).copied().unwrap_or_default();
            interfaces.push(self.series_for(link, counters, &kernel.drops, &retransmits));
        }
        interfaces.extend(self.retired.iter().map(|r| r.series.clone()));
        let ports = self
            .watched
            .values()
            .filter(|(_, mode, _)| mode.is_some())
            .map(|(link, _, _)| (link, kernel.interfaces.get(&link.ifindex).copied().unwrap_or_default()));
        let switches = self.switches.observe(ports, link_name);

        let mut other_drops = self.other_carried.clone();
        for (key, count) in &kernel.drops {
            let owned = self.attribution.owners.contains_key(&(u64::from(key.netns), key.ifindex));
            let other = if owned { self.attribution.baselines.get(key).copied().unwrap_or(0) } else { *count };
            if other > 0 {
                *other_drops.entry(drop_name(&self.reason_names, key)).or_default() += other;
            }
        }
        let (drops_removed, retransmits_removed) =
            self.collect_idle_entries(now, &kernel.drops, &kernel.retransmits, &owners);
        let map_entries = vec![
            (DROPS_MAP, (kernel.drops.len() - drops_removed) as u64),
            (RETRANSMITS_MAP, (kernel.retransmits.len() - retransmits_removed) as u64),
            (INTERFACE_COUNTERS_MAP, kernel.interfaces.len() as u64),
        ];
        Sample {
            at: Some(SystemTime::now()),
            judged: 0,
            interfaces,
            other_drops,
            switches,
            other_tcp_retransmits: retransmits.get(&None).copied().unwrap_or(0),
            programs: kernel.programs,
            map_errors: kernel.map_errors,
            attached: self.datapath.attached_count(),
            tc_programs_removed: self.tc_programs_removed,
            tc_reattach_failures: self.tc_reattach_failures,
            tc_pending: self.datapath.pending_reattach(),
            flow_table_entries: self.flow_table.entries,
            flow_table_evictions: self.flow_table_evictions,
            map_entries,
            entries_collected: vec![(DROPS_MAP, self.drops_collected), (RETRANSMITS_MAP, self.retransmits_collected)],
            probes: self.probes(),
            ovs_datapaths: self.ovs_datapaths.clone(),
        }
    }

    /// Drop and retransmit entries no watched interface owns that have not grown for the
    /// idle time (a deleted namespace's, a vanished device's): their counts are carried in
    /// "other" (read just now, so the exported totals stay the same) and the entries removed,
    /// so that such entries cannot fill the maps. Returns how many of each were removed.
    fn collect_idle_entries(
        &mut self,
        now: Instant,
        drops: &[(DropKey, u64)],
        retransmits: &[(RetransmitKey, u64)],
        owners: &RetransmitOwners,
    ) -> (usize, usize) {
        let owned = &self.attribution.owners;
        let idle = self.idle_drops.observe(now, drops, |key| !owned.contains_key(&(u64::from(key.netns), key.ifindex)));
        if !idle.is_empty() {
            for (key, count) in &idle {
                *self.other_carried.entry(drop_name(&self.reason_names, key)).or_default() += count;
            }
            let keys: HashSet<DropKey> = idle.iter().map(|(key, _)| *key).collect();
            self.datapath.forget_drops(|key| keys.contains(key));
            self.drops_collected += idle.len() as u64;
            debug!(entries = idle.len(), "idle drop entries folded into other and removed");
        }
        let drops_removed = idle.len();
        let idle = self.idle_retransmits.observe(now, retransmits, |key| owners.owner(key).is_none());
        if !idle.is_empty() {
            self.retransmits.fold(&idle);
            let keys: HashSet<RetransmitKey> = idle.iter().map(|(key, _)| *key).collect();
            self.datapath.forget_retransmits(|key| keys.contains(key));
            self.retransmits_collected += idle.len() as u64;
            debug!(entries = idle.len(), "idle retransmit entries folded into other and removed");
        }
        (drops_removed, idle.len())
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
        monitor_common::MAP_ERROR_RETRANSMITS => Some("retransmits"),
        monitor_common::MAP_ERROR_POD_ADDRESSES => Some("pod_addresses"),
        monitor_common::MAP_ERROR_SERVICES_INSERT => Some("services"),
        _ => None,
    }
}

/// Appended to the reason of a dropped TCP SYN to a service never seen answering a handshake
/// (`monitor_common::DROP_TO_UNSEEN_SERVICE`): `NETFILTER_DROP:unseen_service` is a firewall
/// dropping a scan or a port closed all along, benign-class evidence.
pub const UNSEEN_SERVICE_SUFFIX: &str = ":unseen_service";

/// The name of a drop entry's reason, with [`UNSEEN_SERVICE_SUFFIX`] when it carries that flag.
fn drop_name(names: &BTreeMap<u32, String>, key: &DropKey) -> String {
    let name = reason_name(names, key.reason);
    if key.flags & monitor_common::DROP_TO_UNSEEN_SERVICE != 0 { name + UNSEEN_SERVICE_SUFFIX } else { name }
}

fn reason_name(names: &BTreeMap<u32, String>, reason: u32) -> String {
    if reason == DROP_REASON_UNKNOWN {
        return "unknown".into();
    }
    if reason == monitor_common::UPCALL_FAILED_REASON {
        return monitor_common::UPCALL_FAILED_NAME.into();
    }
    names
        .get(&reason)
        .cloned()
        .or_else(|| crate::datapath::kernel_layout::subsystem_reason_name(reason))
        .unwrap_or_else(|| format!("REASON_{reason}"))
}

impl Sampler {
    /// Whether the kernel programs stay attached at exit (`keep_attached`).
    pub fn keeps_attached(&self) -> bool {
        self.datapath.keeps_attached()
    }

    /// At exit with `keep_attached`: leaves every program attached for the next agent.
    pub fn leave_attached(&mut self) -> usize {
        self.datapath.leave_attached()
    }

    /// Once the interfaces present at start-up are attached (see [`Datapath::finish_takeover`]).
    pub fn finish_takeover(&mut self) {
        self.datapath.finish_takeover();
    }

    /// Detaches from every interface; used at shutdown so nothing stays attached.
    pub fn detach_all(&mut self) {
        let attached: Vec<u32> = self.watched.keys().copied().collect();
        for ifindex in attached {
            self.datapath.detach(ifindex);
        }
        self.watched.clear();
    }
}
