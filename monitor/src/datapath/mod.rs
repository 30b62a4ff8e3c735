//! Loads the kernel programs, attaches them, and reads their maps.
//!
//! The one place that talks to aya: everything downstream sees plain counters.

pub mod kernel_layout;
pub mod mounts;
pub mod process_probe;

use std::{collections::BTreeMap, os::fd::OwnedFd};

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues},
    programs::{
        BtfTracePoint, LinkOrder, ProgramError, SchedClassifier, TcAttachType, TracePoint,
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions},
    },
    sys::{Stats, enable_stats},
};
use monitor_common::{
    DROPS_MAP, DropKey, GLOBAL_DEV_IFINDEX_OFFSET, GLOBAL_DEV_NET_OFFSET, GLOBAL_HAS_REASON, GLOBAL_NET_INUM_OFFSET,
    GLOBAL_SKB_DEV_OFFSET, GLOBAL_TP_REASON_OFFSET, GLOBAL_TP_SKBADDR_OFFSET, INTERFACE_COUNTERS_MAP,
    INTERFACE_SLOTS_MAP, INTERFACE_SLOTS_MAX, InterfaceCounters, InterfaceSlot, KFREE_SKB_BTF_PROGRAM,
    KFREE_SKB_TRACEPOINT_PROGRAM, MAP_ERROR_SLOTS, MAP_ERRORS_MAP, PROCESS_EXEC_PROGRAM, PROCESS_EXIT_PROGRAM,
    TC_EGRESS_PROGRAM, TC_INGRESS_PROGRAM,
};
use serde::Serialize;
use tracing::{debug, info, warn};

use self::{
    kernel_layout::{KernelLayout, read_kfree_skb_format},
    process_probe::ProcessTracerOffsets,
};

/// The kernel programs, built by build.rs from monitor-ebpf.
static PROGRAMS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/monitor-ebpf"));

/// Empty programs of each type the agent loads (monitor-ebpf/src/baselines.rs), for
/// `cargo xtask bench`: their run time on the same hooks is the baseline it subtracts.
#[doc(hidden)]
pub static BASELINE_PROGRAMS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/baselines"));

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("kernel BTF: {what}: {source}")]
    Btf { what: String, source: Box<dyn std::error::Error + Send + Sync> },
    #[error("skb:kfree_skb tracepoint: {what}")]
    Tracepoint { what: String },
    #[error("mounting {fstype} on {target}: {source}")]
    Mount { target: &'static str, fstype: &'static str, source: std::io::Error },
    #[error("loading the kernel programs: {0}")]
    Load(#[from] Box<aya::EbpfError>),
    #[error("program {name}: {source}")]
    Program { name: &'static str, source: Box<ProgramError> },
    #[error("map {name}: {source}")]
    Map { name: &'static str, source: Box<MapError> },
    #[error("{0} is missing from the kernel object")]
    Missing(&'static str),
    #[error("attaching to {interface}: tcx: {tcx}; clsact: {clsact}")]
    Attach { interface: String, tcx: String, clsact: String },
    #[error("process tracer: {0}")]
    ProcessTracer(String),
}

/// Which kernel mechanisms to use; `Auto` picks the best this kernel supports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathOptions {
    pub tc_attach: TcAttachChoice,
    pub drop_tracer: DropTracerChoice,
    /// Turn on the kernel's BPF run-time statistics (for the program cost metrics). They
    /// time every run of every BPF program on the node, not only ours: off by default.
    pub bpf_stats: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TcAttachChoice {
    /// tcx where the kernel has it (>= 6.6), else clsact.
    #[default]
    Auto,
    Tcx,
    Clsact,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DropTracerChoice {
    /// tp_btf, else the classic tracepoint.
    #[default]
    Auto,
    TpBtf,
    Tracepoint,
}

/// How the tc programs hang on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// BPF links (kernel >= 6.6): detached by the kernel when the agent exits.
    Tcx,
    /// Legacy clsact qdisc filters through netlink.
    Clsact,
}

/// Whether each probe loaded on this kernel, and how.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeReport {
    /// Keyed by probe name ("tc", "kfree_skb"): the variant in use, or None when unsupported.
    pub probes: BTreeMap<&'static str, Option<String>>,
    /// Why a probe is unsupported, for /readyz and the logs.
    pub errors: BTreeMap<&'static str, String>,
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
    pub programs: Vec<ProgramRunStats>,
    /// Kernel-side map updates that failed, by `MAP_ERROR_*` slot.
    pub map_errors: [u64; MAP_ERROR_SLOTS as usize],
}

struct AttachedInterface {
    name: String,
    links: Vec<(&'static str, SchedClassifierLinkId)>,
    mode: AttachMode,
    /// Its counters live in slot `ifindex % INTERFACE_SLOTS_MAX` of INTERFACE_SLOTS (else in
    /// INTERFACE_COUNTERS, when another attached interface holds that slot).
    slot: bool,
}

pub struct Datapath {
    ebpf: Ebpf,
    interface_counters: PerCpuHashMap<MapData, u32, InterfaceCounters>,
    interface_slots: PerCpuArray<MapData, InterfaceSlot>,
    drops: PerCpuHashMap<MapData, DropKey, u64>,
    map_errors: PerCpuArray<MapData, u64>,
    attached: BTreeMap<u32, AttachedInterface>,
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
}

const BPF_NOEXIST: u64 = 1;

impl Datapath {
    /// Loads every program, attaches the drop tracer (tp_btf, else the classic tracepoint),
    /// and readies the tc programs for [`Datapath::attach`].
    pub fn load(options: DatapathOptions) -> Result<Self, DatapathError> {
        let layout = KernelLayout::from_vmlinux()?;
        let has_reason = u32::from(layout.has_drop_reasons());
        // Parsed kernel BTF takes tens of MiB: one parse each (btf-rs for offsets, aya's for
        // loading), each freed as soon as it has served, keeps the start-up peak down.
        let KernelLayout { offsets, drop_reasons, btf } = layout;
        let tracepoint_layout = read_kfree_skb_format();
        let (tp_skbaddr, tp_reason) = match &tracepoint_layout {
            Ok(tp) => (tp.skbaddr, tp.reason.unwrap_or(0)),
            Err(_) => (0, 0),
        };
        debug!(?offsets, drop_reasons = drop_reasons.len(), "kernel layout from BTF");
        // Its failure only disables the process tracer (see start_process_probe).
        let process_offsets = ProcessTracerOffsets::resolve(&btf).map_err(|error| error.to_string());
        drop(btf);
        let zero_offsets = ProcessTracerOffsets::default();

        let kernel_btf = aya::Btf::from_sys_fs();
        let mut loader = EbpfLoader::new();
        loader.btf(kernel_btf.as_ref().ok());
        process_offsets.as_ref().unwrap_or(&zero_offsets).override_globals(&mut loader);
        let mut ebpf = loader
            .override_global(GLOBAL_SKB_DEV_OFFSET, &offsets.skb_dev, true)
            .override_global(GLOBAL_DEV_IFINDEX_OFFSET, &offsets.dev_ifindex, true)
            .override_global(GLOBAL_DEV_NET_OFFSET, &offsets.dev_net, true)
            .override_global(GLOBAL_NET_INUM_OFFSET, &offsets.net_inum, true)
            .override_global(GLOBAL_TP_SKBADDR_OFFSET, &tp_skbaddr, true)
            .override_global(GLOBAL_TP_REASON_OFFSET, &tp_reason, true)
            .override_global(GLOBAL_HAS_REASON, &has_reason, true)
            .load(PROGRAMS_OBJECT)
            .map_err(Box::new)?;

        let mut probes = ProbeReport::default();
        for name in [TC_INGRESS_PROGRAM, TC_EGRESS_PROGRAM] {
            let program: &mut SchedClassifier = program_mut(&mut ebpf, name)?;
            program.load().map_err(|source| DatapathError::Program { name, source: Box::new(source) })?;
        }
        // Becomes "tcx" or "clsact" at the first attach.
        probes.probes.insert("tc", Some("loaded".into()));

        match attach_drop_tracer(&mut ebpf, kernel_btf, options.drop_tracer) {
            Ok(variant) => {
                info!(variant, "drop tracer attached");
                probes.probes.insert("kfree_skb", Some(variant.to_string()));
            }
            Err(reasons) => {
                warn!(%reasons, "drop tracer unsupported on this kernel; drops are not counted");
                probes.probes.insert("kfree_skb", None);
                probes.errors.insert("kfree_skb", reasons);
            }
        }

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
        let map_errors = take_map(&mut ebpf, MAP_ERRORS_MAP)?;
        let nr_cpus = aya::util::nr_cpus().map_err(|(_, error)| DatapathError::Map {
            name: "nr_cpus",
            source: Box::new(MapError::SyscallError(aya::sys::SyscallError { call: "nr_cpus", io_error: error })),
        })?;
        Ok(Self {
            ebpf,
            interface_counters,
            interface_slots,
            drops,
            map_errors,
            attached: BTreeMap::new(),
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
        })
    }

    /// The drop reason names of this kernel, by value (from BTF).
    pub fn drop_reason_names(&self) -> &BTreeMap<u32, String> {
        &self.drop_reasons
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

    /// Attaches the tc programs on ingress and egress of `name`, before any other program.
    pub fn attach(&mut self, ifindex: u32, name: &str) -> Result<AttachMode, DatapathError> {
        if let Some(existing) = self.attached.get(&ifindex) {
            if existing.name == name {
                return Ok(existing.mode);
            }
            // Same ifindex under a new name: the links follow the device, keep them.
            let mode = existing.mode;
            if let Some(existing) = self.attached.get_mut(&ifindex) {
                existing.name = name.to_string();
            }
            return Ok(mode);
        }
        // Counters first, so no packet goes uncounted once a program runs.
        let slot = self.claim_slot(ifindex)?;
        if !slot {
            self.ensure_counters_entry(ifindex)?;
        }
        let mut links = Vec::with_capacity(2);
        let mut mode = self.tc_mode.unwrap_or(AttachMode::Tcx);
        for (program_name, attach_type) in
            [(TC_INGRESS_PROGRAM, TcAttachType::Ingress), (TC_EGRESS_PROGRAM, TcAttachType::Egress)]
        {
            match self.attach_one(program_name, name, attach_type, mode) {
                Ok(link) => links.push((program_name, link)),
                Err(error) => {
                    self.detach_links(&mut links);
                    if slot {
                        self.release_slot(ifindex);
                    }
                    return Err(error);
                }
            }
            // The first attach decides the mode for the rest of the run.
            mode = self.tc_mode.unwrap_or(mode);
        }
        let mode = self.tc_mode.unwrap_or(mode);
        self.probes.probes.insert("tc", Some(format!("{mode:?}").to_lowercase()));
        self.attached.insert(ifindex, AttachedInterface { name: name.to_string(), links, mode, slot });
        Ok(mode)
    }

    fn attach_one(
        &mut self,
        program_name: &'static str,
        interface: &str,
        attach_type: TcAttachType,
        mode: AttachMode,
    ) -> Result<SchedClassifierLinkId, DatapathError> {
        let program: &mut SchedClassifier = program_mut(&mut self.ebpf, program_name)?;
        let tcx_error = if mode == AttachMode::Tcx {
            match program.attach_with_options(interface, attach_type, TcAttachOptions::TcxOrder(LinkOrder::first())) {
                Ok(link) => {
                    self.tc_mode.get_or_insert(AttachMode::Tcx);
                    return Ok(link);
                }
                Err(error) if self.tc_mode_forced => {
                    // Nothing attached through tcx yet: this kernel has no tcx (before 6.6), so the
                    // tc probe is unsupported, not "loaded" (--tc-attach tcx forbids the fallback).
                    if self.attached.is_empty() && !self.probes.errors.contains_key("tc") {
                        warn!(interface, %error, "tc probe unsupported: tcx attach failed and --tc-attach tcx forbids clsact");
                        self.probes.probes.insert("tc", None);
                        self.probes
                            .errors
                            .insert("tc", format!("tcx attach failed ({error}); --tc-attach tcx forbids clsact"));
                    }
                    return Err(DatapathError::Attach {
                        interface: interface.to_string(),
                        tcx: error.to_string(),
                        clsact: "not tried (--tc-attach tcx)".into(),
                    });
                }
                Err(error) => error.to_string(),
            }
        } else {
            "not tried".to_string()
        };
        // Kernels before 6.6 have no tcx: fall back to a clsact qdisc.
        if let Err(error) = tc::qdisc_add_clsact(interface) {
            debug!(interface, %error, "clsact qdisc not added (usually: already there)");
        }
        let options = TcAttachOptions::Netlink(NlOptions::default());
        match program.attach_with_options(interface, attach_type, options) {
            Ok(link) => {
                if self.tc_mode.is_none() {
                    warn!(interface, %tcx_error, "tcx attach failed; using clsact for all interfaces");
                    self.tc_mode = Some(AttachMode::Clsact);
                }
                Ok(link)
            }
            Err(clsact) => Err(DatapathError::Attach {
                interface: interface.to_string(),
                tcx: tcx_error,
                clsact: clsact.to_string(),
            }),
        }
    }

    /// Gives `ifindex` its slot in INTERFACE_SLOTS (zeroed counters on every CPU) unless
    /// another attached interface holds it. Returns whether it did.
    fn claim_slot(&mut self, ifindex: u32) -> Result<bool, DatapathError> {
        let index = ifindex % INTERFACE_SLOTS_MAX;
        let taken = self.attached.iter().any(|(other, attached)| attached.slot && other % INTERFACE_SLOTS_MAX == index);
        if taken {
            debug!(ifindex, index, "slot taken: counters in the hash map");
            return Ok(false);
        }
        let values = per_cpu(InterfaceSlot { ifindex, ..InterfaceSlot::default() }, self.nr_cpus, INTERFACE_SLOTS_MAP)?;
        self.interface_slots
            .set(index, values, 0)
            .map_err(|source| DatapathError::Map { name: INTERFACE_SLOTS_MAP, source: Box::new(source) })?;
        Ok(true)
    }

    /// Frees `ifindex`'s slot; returns the counters it held, summed over CPUs.
    fn release_slot(&mut self, ifindex: u32) -> Option<InterfaceCounters> {
        let index = ifindex % INTERFACE_SLOTS_MAX;
        let last = self.read_slot(ifindex);
        match per_cpu(InterfaceSlot::default(), self.nr_cpus, INTERFACE_SLOTS_MAP) {
            Ok(free) => {
                if let Err(error) = self.interface_slots.set(index, free, 0) {
                    warn!(ifindex, %error, "freeing a counters slot");
                }
            }
            Err(error) => warn!(ifindex, %error, "freeing a counters slot"),
        }
        last
    }

    /// The counters in `ifindex`'s slot, summed over CPUs; None if the slot is not its.
    fn read_slot(&self, ifindex: u32) -> Option<InterfaceCounters> {
        let values = match self.interface_slots.get(&(ifindex % INTERFACE_SLOTS_MAX), 0) {
            Ok(values) => values,
            Err(error) => {
                debug!(ifindex, %error, "reading a counters slot");
                return None;
            }
        };
        let mut total = InterfaceCounters::default();
        for slot in values.iter() {
            if slot.ifindex != ifindex {
                return None;
            }
            total.add(&slot.counters);
        }
        Some(total)
    }

    /// The agent creates the counters entry so the hot path only ever increments in place.
    fn ensure_counters_entry(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        let zeros = per_cpu(InterfaceCounters::default(), self.nr_cpus, INTERFACE_COUNTERS_MAP)?;
        match self.interface_counters.insert(ifindex, zeros, BPF_NOEXIST) {
            Ok(()) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(source) => Err(DatapathError::Map { name: INTERFACE_COUNTERS_MAP, source: Box::new(source) }),
        }
    }

    fn detach_links(&mut self, links: &mut Vec<(&'static str, SchedClassifierLinkId)>) {
        for (program_name, link) in links.drain(..) {
            if let Ok(program) = program_mut::<SchedClassifier>(&mut self.ebpf, program_name) {
                // Fails harmlessly when the device is already gone (the kernel dropped the link).
                if let Err(error) = program.detach(link) {
                    debug!(program_name, %error, "detach");
                }
            }
        }
    }

    /// Detaches from `ifindex` and returns its final counters (the kernel entry is removed).
    pub fn detach(&mut self, ifindex: u32) -> Option<InterfaceCounters> {
        let mut attached = self.attached.remove(&ifindex)?;
        self.detach_links(&mut attached.links);
        let last = if attached.slot {
            self.release_slot(ifindex)
        } else {
            let last = self.interface_counters.get(&ifindex, 0).ok().map(|values| sum(values.iter()));
            if let Err(error) = self.interface_counters.remove(&ifindex) {
                debug!(ifindex, %error, "removing counters entry");
            }
            last
        };
        debug!(ifindex, name = attached.name, "detached");
        last
    }

    /// Removes drop entries of devices that no longer exist, after their final read.
    pub fn forget_drops<F: Fn(&DropKey) -> bool>(&mut self, gone: F) {
        let keys: Vec<DropKey> = self.drops.keys().filter_map(Result::ok).filter(|k| gone(k)).collect();
        for key in keys {
            let _ = self.drops.remove(&key);
        }
    }

    /// Drop counters by (netns, ifindex, reason), summed over CPUs.
    pub fn read_drops(&self) -> Vec<(DropKey, u64)> {
        let mut drops = Vec::new();
        for entry in self.drops.iter() {
            match entry {
                Ok((key, values)) => drops.push((key, values.iter().sum())),
                Err(error) => debug!(%error, "reading drop counters"),
            }
        }
        drops
    }

    /// Reads every counter the kernel keeps, summed over CPUs.
    pub fn read(&self) -> KernelCounters {
        let mut counters = KernelCounters::default();
        for entry in self.interface_counters.iter() {
            match entry {
                Ok((ifindex, values)) => {
                    counters.interfaces.insert(ifindex, sum(values.iter()));
                }
                Err(error) => debug!(%error, "reading interface counters"),
            }
        }
        for (&ifindex, attached) in &self.attached {
            if attached.slot
                && let Some(slot) = self.read_slot(ifindex)
            {
                counters.interfaces.entry(ifindex).or_default().add(&slot);
            }
        }
        counters.drops = self.read_drops();
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

/// tp_btf first (cheaper, typed), else the classic tracepoint. Returns the variant used.
fn attach_drop_tracer(
    ebpf: &mut Ebpf,
    kernel_btf: Result<aya::Btf, aya::BtfError>,
    choice: DropTracerChoice,
) -> Result<&'static str, String> {
    let btf_error = match kernel_btf {
        _ if choice == DropTracerChoice::Tracepoint => "not tried (--drop-tracer tracepoint)".to_string(),
        Ok(btf) => {
            let attached = program_mut::<BtfTracePoint>(ebpf, KFREE_SKB_BTF_PROGRAM).and_then(|program| {
                program
                    .load("kfree_skb", &btf)
                    .and_then(|()| program.attach().map(drop))
                    .map_err(|source| DatapathError::Program { name: KFREE_SKB_BTF_PROGRAM, source: Box::new(source) })
            });
            match attached {
                Ok(()) => return Ok("tp_btf"),
                Err(error) => error.to_string(),
            }
        }
        Err(error) => error.to_string(),
    };
    if choice == DropTracerChoice::TpBtf {
        return Err(format!("tp_btf: {btf_error}"));
    }
    debug!(%btf_error, "tp_btf kfree_skb unavailable, trying the classic tracepoint");
    let attached = program_mut::<TracePoint>(ebpf, KFREE_SKB_TRACEPOINT_PROGRAM).and_then(|program| {
        program
            .load()
            .and_then(|()| program.attach("skb", "kfree_skb").map(drop))
            .map_err(|source| DatapathError::Program { name: KFREE_SKB_TRACEPOINT_PROGRAM, source: Box::new(source) })
    });
    match attached {
        Ok(()) => Ok("tracepoint"),
        Err(error) => Err(format!("tp_btf: {btf_error}; tracepoint: {error}")),
    }
}
