//! The kernel programs: [`Datapath::load`] loads them and attaches the drop tracer,
//! [`Datapath::attach`] hangs the tc programs on an interface (`tc.rs`), [`Datapath::read`]
//! sums their per-CPU maps (packet, drop and TCP retransmit counters), and [`Datapath::start_process_probe`] starts the process tracer,
//! whose ring buffer records come out decoded ([`process_probe`]). Which probe variant each
//! kernel supports is said in [`probes`]; struct offsets and drop reason names come from the
//! kernel's BTF ([`kernel_layout`]).
//!
//! The one place that talks to aya: everything downstream sees plain counters and events.

mod attachments;
pub mod kernel_layout;
pub mod mounts;
mod pins;
mod pod_addresses;
pub mod probes;
pub mod process_probe;
mod tc;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::{fd::OwnedFd, unix::fs::MetadataExt},
    path::PathBuf,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as KernelHashMap, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues},
    programs::{ProgramError, SchedClassifier},
    sys::{Stats, enable_stats},
};
use monitor_common::{
    DROP_BASELINES_MAP, DROPS_MAP, DropKey, FLOW_TABLE_INSERTED, FLOW_TABLE_MAP, FLOW_TABLE_REMOVED, FLOWS_MAP,
    FlowKey, FlowState, GLOBAL_DEV_IFINDEX_OFFSET, GLOBAL_DEV_NET_OFFSET, GLOBAL_HAS_REASON, GLOBAL_HOST_NETNS,
    GLOBAL_NET_INUM_OFFSET, GLOBAL_NOT_SPECIFIED_REASON, GLOBAL_RETRANSMIT_HAS_ERR, GLOBAL_SK_DADDR_OFFSET,
    GLOBAL_SK_FAMILY_OFFSET, GLOBAL_SK_NET_OFFSET, GLOBAL_SK_STATE_OFFSET, GLOBAL_SK_V6_DADDR_OFFSET,
    GLOBAL_SKB_CB_OFFSET, GLOBAL_SKB_DEV_OFFSET, GLOBAL_SKB_HEAD_OFFSET, GLOBAL_SKB_NETWORK_HEADER_OFFSET,
    GLOBAL_SKB_PROTOCOL_OFFSET, GLOBAL_TCP_CB_GSO_SEGS_OFFSET, GLOBAL_TP_REASON_OFFSET, GLOBAL_TP_SKBADDR_OFFSET,
    INTERFACE_COUNTERS_MAP, INTERFACE_SLOTS_MAP, InterfaceCounters, InterfaceSlot, KFREE_SKB_BTF_PROGRAM,
    KFREE_SKB_TRACEPOINT_PROGRAM, MAP_ERROR_SLOTS, MAP_ERRORS_MAP, OVS_UPCALL_PROGRAM, POD_ADDRESSES_MAP,
    POD_VETHS_MAP, PROCESS_EXEC_PROGRAM, PROCESS_EXIT_PROGRAM, PodAddress, RETRANSMITS_MAP, RetransmitKey,
    TC_EGRESS_PROGRAM, TC_INGRESS_PROGRAM, TCP_RETRANSMIT_PROGRAM,
};
use tracing::{debug, info, warn};

pub use self::attachments::Reattachment;
pub use self::pins::detach_everything;
pub use self::pod_addresses::pod_address;
pub use self::probes::{AttachMode, DisabledProbe, DropTracerChoice, ProbeReport, TcAttachChoice};
use self::{
    kernel_layout::{KernelLayout, read_kfree_skb_format},
    pins::{Keeper, Pins},
    pod_addresses::PodAddressMaps,
    probes::{
        CONTINUITY_PROBE, DISABLED, DROP_PROBE, OVS_REASONS_PROBE, RETRANSMIT_PROBE, TC_PROBE, UPCALL_PROBE,
        attach_drop_tracer, attach_retransmit_tracer, attach_upcall_tracer,
    },
    process_probe::ProcessTracerOffsets,
    tc::AttachedInterface,
};
use crate::errors;

/// The kernel programs, built by build.rs from monitor-ebpf.
static PROGRAMS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/monitor-ebpf"));

/// Empty programs of each type the agent loads (monitor-ebpf/src/baselines.rs), for
/// `cargo xtask bench`: their run time on the same hooks is the baseline it subtracts.
#[doc(hidden)]
pub static BASELINE_PROGRAMS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/baselines"));

/// What went wrong in the kernel side. Messages leave their sources out: print errors with
/// [`crate::errors::chain`].
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("kernel BTF: {what}")]
    Btf { what: String, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("skb:kfree_skb tracepoint: {what}")]
    Tracepoint { what: String },
    #[error("mounting {fstype} on {target}{hint}")]
    Mount { target: &'static str, fstype: &'static str, hint: &'static str, source: std::io::Error },
    #[error("loading the kernel programs")]
    Load(#[from] Box<aya::EbpfError>),
    #[error("program {name}")]
    Program { name: &'static str, source: Box<ProgramError> },
    #[error("map {name}")]
    Map { name: &'static str, source: Box<MapError> },
    #[error("{0} is missing from the kernel object")]
    Missing(&'static str),
    #[error("attaching to {interface}: tcx: {tcx}; clsact: {clsact}")]
    Attach { interface: String, tcx: String, clsact: String },
    #[error("process tracer: {0}")]
    ProcessTracer(String),
}

/// Which kernel mechanisms to use; `Auto` picks the best this kernel supports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatapathOptions {
    pub tc_attach: TcAttachChoice,
    pub drop_tracer: DropTracerChoice,
    /// Turn on the kernel's BPF run-time statistics (for the program cost metrics). They
    /// time every run of every BPF program on the node, not only ours: off by default.
    pub bpf_stats: bool,
    /// Probes not to load (their names, see [`DisabledProbe`]).
    pub disabled: Vec<&'static str>,
    /// Keep the programs attached across restarts, pinned under this bpffs directory
    /// (`keep_attached`, see `pins.rs`); None: they go with the agent.
    pub pin_dir: Option<PathBuf>,
}

/// Run-time statistics of one loaded program, from the kernel (BPF_ENABLE_STATS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramRunStats {
    pub program: &'static str,
    pub runs: u64,
    pub run_nanos: u64,
}

/// Everything the kernel counted, summed over CPUs, at one instant.
#[derive(Clone, Debug, Default)]
pub struct KernelCounters {
    pub interfaces: BTreeMap<u32, InterfaceCounters>,
    pub drops: Vec<(DropKey, u64)>,
    /// TCP data segments retransmitted, by (socket netns, destination); empty when the
    /// retransmit tracer is unsupported.
    pub retransmits: Vec<(RetransmitKey, u64)>,
    pub programs: Vec<ProgramRunStats>,
    /// Kernel-side map updates that failed, by `MAP_ERROR_*` slot.
    pub map_errors: [u64; MAP_ERROR_SLOTS as usize],
}

/// The LRU flow table of handshakes awaiting an answer (see [`Datapath::read_flow_table`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowTableState {
    pub inserted: u64,
    pub removed: u64,
    pub entries: u64,
}

impl FlowTableState {
    /// Inserted, neither answered nor still held: evicted by the LRU (to make room).
    pub fn evicted(&self) -> u64 {
        self.inserted.saturating_sub(self.removed).saturating_sub(self.entries)
    }
}

pub struct Datapath {
    ebpf: Ebpf,
    interface_counters: PerCpuHashMap<MapData, u32, InterfaceCounters>,
    interface_slots: PerCpuArray<MapData, InterfaceSlot>,
    drops: PerCpuHashMap<MapData, DropKey, u64>,
    drop_baselines: KernelHashMap<MapData, DropKey, u64>,
    retransmits: PerCpuHashMap<MapData, RetransmitKey, u64>,
    map_errors: PerCpuArray<MapData, u64>,
    flows: KernelHashMap<MapData, FlowKey, FlowState>,
    flow_table: PerCpuArray<MapData, u64>,
    attached: BTreeMap<u32, AttachedInterface>,
    /// The kernel's ids of the two tc programs, to recognise them on an interface.
    program_ids: BTreeMap<&'static str, u32>,
    /// Probes the operator turned off.
    disabled: Vec<&'static str>,
    /// None until the first attach tells whether tcx works here.
    tc_mode: Option<AttachMode>,
    /// Set by the operator: no fallback to the other mode.
    tc_mode_forced: bool,
    probes: ProbeReport,
    drop_reasons: BTreeMap<u32, String>,
    nr_cpus: usize,
    /// What the process tracer needs from this kernel, or why it cannot run.
    process_offsets: Result<ProcessTracerOffsets, String>,
    /// Keeps the kernel's run-time statistics on while the agent runs.
    stats: Option<OwnedFd>,
    pod_addresses: PodAddressMaps,
    /// /proc/kallsyms, opened at start-up: where failed upcalls' packets are freed, read
    /// when openvswitch.ko appears.
    kallsyms: Option<std::fs::File>,
    /// The pins and links kept for the next agent (`keep_attached`); None: all goes with this one.
    keeper: Option<Keeper>,
}

impl Datapath {
    /// Loads every program, attaches the drop tracer (tp_btf, else the classic tracepoint),
    /// and readies the tc programs for [`Datapath::attach`].
    pub fn load(options: DatapathOptions) -> Result<Self, DatapathError> {
        let layout = KernelLayout::from_vmlinux()?;
        let has_reason = u32::from(layout.has_drop_reasons());
        // Parsed kernel BTF takes tens of MiB: one parse each (btf-rs for offsets, aya's for
        // loading), each freed as soon as it has served, keeps the start-up peak down.
        let KernelLayout { offsets, socket_offsets, drop_reasons, btf } = layout;
        let tracepoint_layout = read_kfree_skb_format();
        let (tp_skbaddr, tp_reason) = match &tracepoint_layout {
            Ok(tp) => (tp.skbaddr, tp.reason.unwrap_or(0)),
            Err(_) => (0, 0),
        };
        debug!(?offsets, drop_reasons = drop_reasons.len(), "kernel layout from BTF");
        // u32::MAX (no reason matches it) on kernels without drop reasons.
        let not_specified =
            drop_reasons.iter().find(|(_, name)| *name == "NOT_SPECIFIED").map_or(u32::MAX, |(value, _)| *value);
        // Its failure only disables the process tracer (see start_process_probe).
        let process_offsets = ProcessTracerOffsets::resolve(&btf).map_err(|error| errors::chain(&error));
        drop(btf);
        let zero_offsets = ProcessTracerOffsets::default();
        // Unresolved, they only disable the retransmit tracer (its globals stay zero).
        let sock = socket_offsets.as_ref().copied().unwrap_or_default();
        let retransmit_has_err = u32::from(sock.has_err);

        // Devices of this netns other than pod veths credit drops to the destination pod.
        let host_netns = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |meta| meta.ino() as u32);

        let kernel_btf = aya::Btf::from_sys_fs();
        let mut loader = EbpfLoader::new();
        let mut probes = ProbeReport::default();
        let pins = options.pin_dir.as_deref().map(|root| Pins::open(root, PROGRAMS_OBJECT));
        let mut keeper = match pins {
            Some(Ok(pins)) => {
                for name in pins::PINNED_MAPS {
                    loader.map_pin_path(name, pins.map_path(name));
                }
                let variant = if pins.taken_over { "taken over" } else { "pinned" };
                info!(dir = %pins.dir().display(), variant, "the kernel programs stay attached across restarts");
                probes.record(CONTINUITY_PROBE, &Ok(variant));
                Some(Keeper::new(pins))
            }
            Some(Err(error)) => {
                let reason = format!(
                    "pin dir {}: {error}",
                    options.pin_dir.as_deref().unwrap_or(std::path::Path::new("")).display()
                );
                warn!(%reason, "cannot pin: the kernel programs go with the agent, and a restart is blind until it attaches");
                probes.record(CONTINUITY_PROBE, &Err(reason));
                None
            }
            None => None,
        };
        loader.btf(kernel_btf.as_ref().ok());
        // A map this kernel cannot create (the process tracer's ring buffer before 5.8) must
        // not stop the rest from loading: only the programs using it then fail, and say so.
        loader.allow_unsupported_maps();
        process_offsets.as_ref().unwrap_or(&zero_offsets).override_globals(&mut loader);
        let mut ebpf = loader
            .override_global(GLOBAL_SKB_DEV_OFFSET, &offsets.skb_dev, true)
            .override_global(GLOBAL_DEV_IFINDEX_OFFSET, &offsets.dev_ifindex, true)
            .override_global(GLOBAL_DEV_NET_OFFSET, &offsets.dev_net, true)
            .override_global(GLOBAL_NET_INUM_OFFSET, &offsets.net_inum, true)
            .override_global(GLOBAL_SKB_HEAD_OFFSET, &offsets.skb_head, true)
            .override_global(GLOBAL_SKB_NETWORK_HEADER_OFFSET, &offsets.skb_network_header, true)
            .override_global(GLOBAL_SKB_PROTOCOL_OFFSET, &offsets.skb_protocol, true)
            .override_global(GLOBAL_HOST_NETNS, &host_netns, true)
            .override_global(GLOBAL_TP_SKBADDR_OFFSET, &tp_skbaddr, true)
            .override_global(GLOBAL_TP_REASON_OFFSET, &tp_reason, true)
            .override_global(GLOBAL_HAS_REASON, &has_reason, true)
            .override_global(GLOBAL_NOT_SPECIFIED_REASON, &not_specified, true)
            .override_global(GLOBAL_SK_NET_OFFSET, &sock.net, true)
            .override_global(GLOBAL_SK_STATE_OFFSET, &sock.state, true)
            .override_global(GLOBAL_SK_FAMILY_OFFSET, &sock.family, true)
            .override_global(GLOBAL_SK_DADDR_OFFSET, &sock.daddr, true)
            .override_global(GLOBAL_SK_V6_DADDR_OFFSET, &sock.v6_daddr, true)
            .override_global(GLOBAL_SKB_CB_OFFSET, &sock.skb_cb, true)
            .override_global(GLOBAL_TCP_CB_GSO_SEGS_OFFSET, &sock.gso_segs, true)
            .override_global(GLOBAL_RETRANSMIT_HAS_ERR, &retransmit_has_err, true)
            .load(PROGRAMS_OBJECT)
            .map_err(Box::new)?;

        let mut program_ids = BTreeMap::new();
        for name in [TC_INGRESS_PROGRAM, TC_EGRESS_PROGRAM] {
            let program: &mut SchedClassifier = program_mut(&mut ebpf, name)?;
            program.load().map_err(|source| DatapathError::Program { name, source: Box::new(source) })?;
            match program.info() {
                Ok(info) => {
                    program_ids.insert(name, info.id());
                }
                Err(error) => warn!(program = name, %error, "program id unknown; its attachments are not verified"),
            }
        }
        // Becomes "tcx" or "clsact" at the first attach.
        probes.probes.insert(TC_PROBE, Some("loaded".into()));

        let disabled = |probe: &str| options.disabled.contains(&probe);
        // A previous agent's tracers that this one turned off go.
        if let Some(keeper) = &keeper {
            for (probe, programs) in [
                (DROP_PROBE, &[KFREE_SKB_BTF_PROGRAM, KFREE_SKB_TRACEPOINT_PROGRAM][..]),
                (RETRANSMIT_PROBE, &[TCP_RETRANSMIT_PROGRAM]),
                (UPCALL_PROBE, &[OVS_UPCALL_PROGRAM]),
                (probes::PROCESS_PROBE, &[PROCESS_EXEC_PROGRAM, PROCESS_EXIT_PROGRAM]),
            ] {
                if disabled(probe) {
                    programs.iter().for_each(|program| keeper.pins.unpin(program));
                }
            }
        }
        let retransmit_tracer = match &socket_offsets {
            _ if disabled(RETRANSMIT_PROBE) => Err(DISABLED.to_string()),
            Ok(_) => attach_retransmit_tracer(&mut ebpf, kernel_btf.as_ref(), keeper.as_mut()),
            Err(error) => Err(format!("socket offsets: {error}")),
        };
        match &retransmit_tracer {
            Ok(variant) => info!(variant, "retransmit tracer attached"),
            Err(reasons) => {
                warn!(%reasons, "retransmit tracer unsupported on this kernel; TCP retransmits are not counted")
            }
        }
        probes.record(RETRANSMIT_PROBE, &retransmit_tracer);
        // Opened now, while the agent holds every capability: the kernel decides at open
        // whether this reader sees addresses, and openvswitch.ko may only load much later.
        let mut kallsyms = std::fs::File::open("/proc/kallsyms")
            .inspect_err(
                |error| warn!(%error, "cannot open /proc/kallsyms: failed upcalls are named by address and time"),
            )
            .ok();
        let upcall_tracer = if disabled(UPCALL_PROBE) {
            Err(DISABLED.to_string())
        } else {
            attach_upcall_tracer(&mut ebpf, kallsyms.as_mut(), keeper.as_mut())
        };
        match &upcall_tracer {
            Ok(variant) => info!(variant, "OVS upcall tracer attached"),
            Err(reason) => info!(%reason, "OVS upcall tracer not attached; retried while the agent runs"),
        }
        probes.record(UPCALL_PROBE, &upcall_tracer);
        probes.record(OVS_REASONS_PROBE, &kernel_layout::ovs_drop_reasons(&drop_reasons));
        let drop_tracer = if disabled(DROP_PROBE) {
            Err(DISABLED.to_string())
        } else {
            attach_drop_tracer(&mut ebpf, kernel_btf.as_ref(), options.drop_tracer, keeper.as_mut())
        };
        match &drop_tracer {
            Ok(variant) => info!(variant, "drop tracer attached"),
            Err(reasons) => warn!(%reasons, "drop tracer unsupported on this kernel; drops are not counted"),
        }
        probes.record(DROP_PROBE, &drop_tracer);

        let stats = if options.bpf_stats {
            match enable_stats(Stats::RunTime) {
                Ok(fd) => Some(fd),
                Err(error) => {
                    warn!(%error, "kernel BPF run-time statistics unavailable; no program cost metrics");
                    None
                }
            }
        } else {
            None
        };

        let interface_counters = take_map(&mut ebpf, INTERFACE_COUNTERS_MAP)?;
        let interface_slots = take_map(&mut ebpf, INTERFACE_SLOTS_MAP)?;
        let drops = take_map(&mut ebpf, DROPS_MAP)?;
        let drop_baselines = take_map(&mut ebpf, DROP_BASELINES_MAP)?;
        let retransmits = take_map(&mut ebpf, RETRANSMITS_MAP)?;
        let map_errors = take_map(&mut ebpf, MAP_ERRORS_MAP)?;
        let flows = take_map(&mut ebpf, FLOWS_MAP)?;
        let flow_table = take_map(&mut ebpf, FLOW_TABLE_MAP)?;
        let pod_addresses =
            PodAddressMaps::new(take_map(&mut ebpf, POD_ADDRESSES_MAP)?, take_map(&mut ebpf, POD_VETHS_MAP)?);
        let nr_cpus = aya::util::nr_cpus().map_err(|(_, error)| DatapathError::Map {
            name: "nr_cpus",
            source: Box::new(MapError::SyscallError(aya::sys::SyscallError { call: "nr_cpus", io_error: error })),
        })?;
        Ok(Self {
            ebpf,
            interface_counters,
            interface_slots,
            drops,
            drop_baselines,
            retransmits,
            map_errors,
            flows,
            flow_table,
            attached: BTreeMap::new(),
            program_ids,
            disabled: options.disabled.clone(),
            tc_mode: match options.tc_attach {
                TcAttachChoice::Auto => None,
                TcAttachChoice::Tcx => Some(AttachMode::Tcx),
                TcAttachChoice::Clsact => Some(AttachMode::Clsact),
            },
            tc_mode_forced: options.tc_attach != TcAttachChoice::Auto,
            probes,
            drop_reasons,
            nr_cpus,
            process_offsets,
            stats,
            pod_addresses,
            kallsyms,
            keeper,
        })
    }

    /// The drop reason names of this kernel, by value (from BTF).
    pub fn drop_reason_names(&self) -> &BTreeMap<u32, String> {
        &self.drop_reasons
    }

    /// Attaches the OVS upcall tracer if it is not yet (openvswitch.ko loaded since the
    /// last try), and then names the module's drop reasons; cheap when it is attached, or
    /// when the module is still absent. True when it was attached just now.
    pub fn retry_upcall_tracer(&mut self) -> bool {
        if self.probes.probes.get(UPCALL_PROBE).is_some_and(Option::is_some) || self.disabled.contains(&UPCALL_PROBE) {
            return false;
        }
        let result = attach_upcall_tracer(&mut self.ebpf, self.kallsyms.as_mut(), self.keeper.as_mut());
        match &result {
            Ok(variant) => info!(variant, "OVS upcall tracer attached (openvswitch.ko appeared)"),
            Err(reason) => debug!(%reason, "OVS upcall tracer still not attached"),
        }
        self.probes.record(UPCALL_PROBE, &result);
        if result.is_ok() {
            // openvswitch.ko appeared: its drop reasons get their names from its BTF.
            for (value, name) in kernel_layout::module_reason_names() {
                self.drop_reasons.entry(value).or_insert(name);
            }
            self.probes.record(OVS_REASONS_PROBE, &kernel_layout::ovs_drop_reasons(&self.drop_reasons));
        }
        result.is_ok()
    }

    pub fn probes(&self) -> &ProbeReport {
        &self.probes
    }

    pub fn is_attached(&self, ifindex: u32) -> bool {
        self.attached.contains_key(&ifindex)
    }

    pub fn attached_count(&self) -> usize {
        self.attached.len()
    }

    /// Removes drop entries of devices that no longer exist, after their final read.
    pub fn forget_drops<F: Fn(&DropKey) -> bool>(&mut self, gone: F) {
        if self.keeper.is_some() {
            let keys: Vec<DropKey> = self.drop_baselines.keys().filter_map(Result::ok).filter(|k| gone(k)).collect();
            for key in keys {
                let _ = self.drop_baselines.remove(&key);
            }
        }
        forget_keys(&mut self.drops, gone);
    }

    /// Records the count `key` had when its interface became watched, for the next agent
    /// (`keep_attached`); nothing otherwise.
    pub fn keep_drop_baseline(&mut self, key: &DropKey, count: u64) {
        if self.keeper.is_some()
            && let Err(error) = self.drop_baselines.insert(key, count, 0)
        {
            debug!(%error, "keeping a drop baseline");
        }
    }

    /// The count `key` had when a previous agent began to watch its interface (0 when it had
    /// none then): for interfaces taken over from it ([`Datapath::taken_over`]).
    pub fn kept_drop_baseline(&self, key: &DropKey) -> u64 {
        self.drop_baselines.get(key, 0).unwrap_or(0)
    }

    /// Drop counters by (netns, ifindex, reason), summed over CPUs.
    pub fn read_drops(&self) -> Vec<(DropKey, u64)> {
        read_summed(&self.drops, "drop")
    }

    /// Tells the drop tracer the watched pod veths and every pod address with its veth (see
    /// `monitor_ebpf::drops`); only changes reach the kernel.
    pub fn set_pods(&mut self, veths: HashSet<u32>, addresses: HashMap<PodAddress, u32>) {
        self.pod_addresses.sync(veths, addresses);
    }

    /// Pod veths and addresses the kernel's maps refused (full), in total.
    pub fn pod_address_failures(&self) -> u64 {
        self.pod_addresses.failures
    }

    /// Removes retransmit entries that no longer belong to anyone, after their final read.
    pub fn forget_retransmits<F: Fn(&RetransmitKey) -> bool>(&mut self, gone: F) {
        forget_keys(&mut self.retransmits, gone);
    }

    /// TCP data retransmit counters by (socket netns, family, destination), summed over CPUs.
    pub fn read_retransmits(&self) -> Vec<(RetransmitKey, u64)> {
        read_summed(&self.retransmits, "retransmit")
    }

    /// The LRU flow table's state: handshakes inserted and answered (summed over CPUs) and
    /// the entries it holds now (one syscall per entry: call it seldom).
    pub fn read_flow_table(&self) -> FlowTableState {
        let slot = |index: u32| self.flow_table.get(&index, 0).map_or(0, |values| values.iter().sum());
        // Inserted before the entries are counted, answered after: a handshake inserted or
        // answered meanwhile can then only lower the evictions computed, never raise them.
        let inserted = slot(FLOW_TABLE_INSERTED);
        let entries = self.flows.keys().filter(Result::is_ok).count() as u64;
        let removed = slot(FLOW_TABLE_REMOVED);
        FlowTableState { inserted, removed, entries }
    }

    /// Reads every counter the kernel keeps, summed over CPUs.
    pub fn read(&self) -> KernelCounters {
        let mut counters = KernelCounters { interfaces: self.read_interfaces(), ..KernelCounters::default() };
        counters.drops = self.read_drops();
        counters.retransmits = self.read_retransmits();
        for (slot, total) in counters.map_errors.iter_mut().enumerate() {
            if let Ok(values) = self.map_errors.get(&(slot as u32), 0) {
                *total = values.iter().sum();
            }
        }
        // Without statistics the kernel counts nothing: no series rather than zeros.
        if self.stats.is_none() {
            return counters;
        }
        for (name, program) in self.ebpf.programs() {
            let Some(program_name) = known_program(name) else { continue };
            if let Ok(info) = program.info() {
                counters.programs.push(ProgramRunStats {
                    program: program_name,
                    runs: info.run_count(),
                    run_nanos: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                });
            }
        }
        counters
    }
}

/// Loading parses the kernel's BTF (tens of MiB, freed right after); glibc keeps freed heap
/// pages mapped, so without this the agent's resident memory never comes back down.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; no pointer is invalidated.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Every entry of a per-CPU counter map, summed over CPUs; unreadable entries are logged.
fn read_summed<K: aya::Pod>(map: &PerCpuHashMap<MapData, K, u64>, what: &str) -> Vec<(K, u64)> {
    let mut counts = Vec::new();
    for entry in map.iter() {
        match entry {
            Ok((key, values)) => counts.push((key, values.iter().sum())),
            Err(error) => debug!(%error, "reading {what} counters"),
        }
    }
    counts
}

/// Removes the entries of a per-CPU counter map whose keys are `gone`.
fn forget_keys<K: aya::Pod>(map: &mut PerCpuHashMap<MapData, K, u64>, gone: impl Fn(&K) -> bool) {
    let keys: Vec<K> = map.keys().filter_map(Result::ok).filter(|k| gone(k)).collect();
    for key in keys {
        let _ = map.remove(&key);
    }
}

/// `value` for every possible CPU, as per-CPU map writes take it.
fn per_cpu<T: aya::Pod>(value: T, nr_cpus: usize, map: &'static str) -> Result<PerCpuValues<T>, DatapathError> {
    PerCpuValues::try_from(vec![value; nr_cpus]).map_err(|error| DatapathError::Map {
        name: map,
        source: Box::new(MapError::SyscallError(aya::sys::SyscallError { call: "per-cpu values", io_error: error })),
    })
}

fn known_program(name: &str) -> Option<&'static str> {
    [
        TC_INGRESS_PROGRAM,
        TC_EGRESS_PROGRAM,
        KFREE_SKB_BTF_PROGRAM,
        KFREE_SKB_TRACEPOINT_PROGRAM,
        PROCESS_EXEC_PROGRAM,
        PROCESS_EXIT_PROGRAM,
        TCP_RETRANSMIT_PROGRAM,
    ]
    .into_iter()
    .find(|known| *known == name)
}

fn sum<'a>(values: impl Iterator<Item = &'a InterfaceCounters>) -> InterfaceCounters {
    values.fold(InterfaceCounters::default(), |mut total, cpu| {
        total.add(cpu);
        total
    })
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, DatapathError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(DatapathError::Missing(name))?;
    program.try_into().map_err(|source| DatapathError::Program { name, source: Box::new(source) })
}

fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, DatapathError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(DatapathError::Missing(name))?;
    T::try_from(map).map_err(|source| DatapathError::Map { name, source: Box::new(source) })
}
