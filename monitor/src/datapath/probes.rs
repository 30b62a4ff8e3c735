//! The probes the agent loads, which variant of each a kernel supports, and what loaded here:
//!
//! | probe | variants, best first | kernels |
//! |---|---|---|
//! | `tc` | tcx link, first in the chain; clsact qdisc filter | tcx >= 6.6; clsact on all |
//! | `kfree_skb` | `tp_btf/kfree_skb`; classic `skb:kfree_skb` tracepoint | tp_btf with BTF; drop reasons >= 5.17 |
//! | `sched_process` | classic `sched:sched_process_exec`/`exit` tracepoints | ring buffer >= 5.8; `group_dead` on recent kernels, else `signal->live` |
//! | `tcp_retransmit` | `tp_btf/tcp_retransmit_skb` only | tp_btf with BTF (>= 5.5); failed retransmits told apart (`err`) >= 6.13 |
//!
//! A probe this kernel cannot run is reported (`/readyz`, `datapath_probe_loaded`) and
//! skipped; the others keep working.

use std::collections::BTreeMap;

use aya::{
    Ebpf,
    maps::Array,
    programs::{BtfTracePoint, TracePoint, links::FdLink},
};
use monitor_common::{
    KFREE_SKB_BTF_PROGRAM, KFREE_SKB_TRACEPOINT_PROGRAM, OVS_UPCALL_PROGRAM, TCP_RETRANSMIT_PROGRAM, UPCALL_CONFIG_MAP,
    UPCALL_SITE_MAP,
};
use serde::Serialize;
use tracing::{debug, info, warn};

use super::{DatapathError, pins::Keeper, program_mut};
use crate::errors;

/// The tc classifier on watched interfaces.
pub const TC_PROBE: &str = "tc";
/// The drop tracer.
pub const DROP_PROBE: &str = "kfree_skb";
/// The SDN process tracer.
pub const PROCESS_PROBE: &str = "sched_process";
/// The TCP data retransmit tracer.
pub const RETRANSMIT_PROBE: &str = "tcp_retransmit";
/// `openvswitch:ovs_dp_upcall`: names failed OVS upcalls (once openvswitch.ko is loaded).
pub const UPCALL_PROBE: &str = "ovs_upcall";
/// Not a program: whether OVS's own drop reasons have names on this kernel.
pub const OVS_REASONS_PROBE: &str = "ovs_drop_reasons";
/// Not a program: whether the programs stay attached across restarts (`keep_attached`):
/// "pinned", "taken over" (from a previous agent), or why they cannot.
pub const CONTINUITY_PROBE: &str = "continuity";
const UPCALL_CATEGORY: &str = "openvswitch";
const UPCALL_EVENT: &str = "ovs_dp_upcall";

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

/// A probe the operator turned off (`--disable-probe`): the agent runs without its signal
/// and reports it unsupported, as on a kernel that lacks it (also how that path is tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DisabledProbe {
    #[value(name = "kfree_skb")]
    KfreeSkb,
    #[value(name = "sched_process")]
    SchedProcess,
    #[value(name = "tcp_retransmit")]
    TcpRetransmit,
    #[value(name = "ovs_upcall")]
    OvsUpcall,
}

impl DisabledProbe {
    /// The probe's name as `/readyz` and `datapath_probe_loaded` give it.
    pub fn name(self) -> &'static str {
        match self {
            Self::KfreeSkb => DROP_PROBE,
            Self::SchedProcess => PROCESS_PROBE,
            Self::TcpRetransmit => RETRANSMIT_PROBE,
            Self::OvsUpcall => UPCALL_PROBE,
        }
    }
}

/// Why a disabled probe is not loaded.
pub const DISABLED: &str = "disabled by configuration (disable_probes)";

/// How the tc programs hang on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// BPF links (kernel >= 6.6): detached by the kernel when the agent exits, unless pinned
    /// (`keep_attached`).
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

impl ProbeReport {
    /// Records an attach attempt of `probe`: the variant in use, or unsupported and why.
    pub fn record(&mut self, probe: &'static str, result: &Result<&'static str, String>) {
        match result {
            Ok(variant) => {
                self.probes.insert(probe, Some(variant.to_string()));
                self.errors.remove(probe);
            }
            Err(reason) => {
                self.probes.insert(probe, None);
                self.errors.insert(probe, reason.clone());
            }
        }
    }
}

/// tp_btf first (cheaper, typed), else the classic tracepoint. Returns the variant used.
pub(super) fn attach_drop_tracer(
    ebpf: &mut Ebpf,
    kernel_btf: Result<&aya::Btf, &aya::BtfError>,
    choice: DropTracerChoice,
    mut keeper: Option<&mut Keeper>,
) -> Result<&'static str, String> {
    let attached = attach_either_drop_tracer(ebpf, kernel_btf, choice, keeper.as_deref_mut());
    // A previous agent's other variant goes: both would count every drop.
    if let (Some(keeper), Ok(variant)) = (keeper, &attached) {
        keeper.pins.unpin(if *variant == "tp_btf" { KFREE_SKB_TRACEPOINT_PROGRAM } else { KFREE_SKB_BTF_PROGRAM });
    }
    attached
}

fn attach_either_drop_tracer(
    ebpf: &mut Ebpf,
    kernel_btf: Result<&aya::Btf, &aya::BtfError>,
    choice: DropTracerChoice,
    mut keeper: Option<&mut Keeper>,
) -> Result<&'static str, String> {
    let btf_error = match kernel_btf {
        _ if choice == DropTracerChoice::Tracepoint => "not tried (--drop-tracer tracepoint)".to_string(),
        Ok(btf) => {
            let attached = attach_btf_tracer(ebpf, KFREE_SKB_BTF_PROGRAM, "kfree_skb", btf, keeper.as_deref_mut());
            match attached {
                Ok(()) => return Ok("tp_btf"),
                Err(error) => errors::chain(&error),
            }
        }
        Err(error) => errors::chain(error),
    };
    if choice == DropTracerChoice::TpBtf {
        return Err(format!("tp_btf: {btf_error}"));
    }
    debug!(%btf_error, "tp_btf kfree_skb unavailable, trying the classic tracepoint");
    match attach_tracepoint(ebpf, KFREE_SKB_TRACEPOINT_PROGRAM, "skb", "kfree_skb", keeper) {
        Ok(()) => Ok("tracepoint"),
        Err(error) => Err(format!("tp_btf: {btf_error}; tracepoint: {}", errors::chain(&error))),
    }
}

/// The tracer on `openvswitch:ovs_dp_upcall`; fails while openvswitch.ko is not loaded (the
/// caller retries). Its record's `skbaddr` offset comes from the format file, into
/// [`UPCALL_CONFIG_MAP`] (the program was loaded before the module was there).
pub(super) fn attach_upcall_tracer(
    ebpf: &mut Ebpf,
    kallsyms: Option<&mut std::fs::File>,
    keeper: Option<&mut Keeper>,
) -> Result<&'static str, String> {
    if !std::path::Path::new("/sys/module/openvswitch").exists() {
        return Err("openvswitch.ko is not loaded (no OVS kernel datapath on this node yet)".into());
    }
    let format = super::kernel_layout::read_tracepoint_format(UPCALL_CATEGORY, UPCALL_EVENT)?;
    let offset = super::kernel_layout::tracepoint_field_offset(&format, "skbaddr")
        .ok_or_else(|| format!("no skbaddr in the {UPCALL_CATEGORY}:{UPCALL_EVENT} record"))?;
    let config = ebpf.map_mut(UPCALL_CONFIG_MAP).ok_or_else(|| format!("no {UPCALL_CONFIG_MAP} map"))?;
    let mut config: Array<_, u32> = Array::try_from(config).map_err(|error| error.to_string())?;
    config.set(0, offset, 0).map_err(|error| format!("{UPCALL_CONFIG_MAP}: {error}"))?;
    // Where the failed upcalls' packets are freed: without it they are told by address and
    // time alone, and a packet reusing the address of an upcall that succeeded may pass for one.
    let site = kallsyms
        .ok_or_else(|| "/proc/kallsyms could not be opened at start-up".to_string())
        .and_then(super::kernel_layout::ovs_upcall_site);
    match site {
        Ok(bounds) => {
            let site = ebpf.map_mut(UPCALL_SITE_MAP).ok_or_else(|| format!("no {UPCALL_SITE_MAP} map"))?;
            let mut site: Array<_, u64> = Array::try_from(site).map_err(|error| error.to_string())?;
            for (index, bound) in (0..).zip(bounds) {
                site.set(index, bound, 0).map_err(|error| format!("{UPCALL_SITE_MAP}: {error}"))?;
            }
            info!(site = ?bounds.map(|bound| format!("{bound:#x}")), "failed upcalls are named by where the kernel frees them");
        }
        Err(reason) => warn!(
            %reason,
            "failed upcalls are named by packet address and time only: a drop of a packet that reuses the address of \
             an upcall that succeeded may be named OVS_UPCALL_FAILED"
        ),
    }
    attach_tracepoint(ebpf, OVS_UPCALL_PROGRAM, UPCALL_CATEGORY, UPCALL_EVENT, keeper)
        .map_err(|error| format!("tracepoint {UPCALL_CATEGORY}:{UPCALL_EVENT}: {}", errors::chain(&error)))?;
    Ok("tracepoint")
}

/// tp_btf only: the classic tracepoint's record has no network namespace. Returns the variant.
pub(super) fn attach_retransmit_tracer(
    ebpf: &mut Ebpf,
    kernel_btf: Result<&aya::Btf, &aya::BtfError>,
    keeper: Option<&mut Keeper>,
) -> Result<&'static str, String> {
    let btf = kernel_btf.map_err(|error| format!("tp_btf: {}", errors::chain(error)))?;
    attach_btf_tracer(ebpf, TCP_RETRANSMIT_PROGRAM, "tcp_retransmit_skb", btf, keeper)
        .map(|()| "tp_btf")
        .map_err(|error| format!("tp_btf: {}", errors::chain(&error)))
}

/// Attaches the tp_btf program `name` on `event`; with a keeper, takes over the link a
/// previous agent pinned instead (its program is this one, byte for byte: see `pins.rs`), or
/// pins the new one.
fn attach_btf_tracer(
    ebpf: &mut Ebpf,
    name: &'static str,
    event: &str,
    btf: &aya::Btf,
    mut keeper: Option<&mut Keeper>,
) -> Result<(), DatapathError> {
    if keeper.as_deref_mut().is_some_and(|keeper| keeper.adopt(name)) {
        return Ok(());
    }
    let error = |source| DatapathError::Program { name, source: Box::new(source) };
    let program = program_mut::<BtfTracePoint>(ebpf, name)?;
    program.load(event, btf).map_err(error)?;
    let link = program.attach().map_err(error)?;
    if let Some(keeper) = keeper {
        let link = program.take_link(link).map_err(error)?;
        if !keeper.keep(name, FdLink::from(link)) {
            program.attach().map_err(error)?;
        }
    }
    Ok(())
}

/// As [`attach_btf_tracer`], for the classic tracepoint program `name` on `category:event`
/// (loaded if it is not yet: the upcall tracer is retried).
pub(super) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    event: &str,
    mut keeper: Option<&mut Keeper>,
) -> Result<(), DatapathError> {
    if keeper.as_deref_mut().is_some_and(|keeper| keeper.adopt(name)) {
        return Ok(());
    }
    let error = |source| DatapathError::Program { name, source: Box::new(source) };
    let program = program_mut::<TracePoint>(ebpf, name)?;
    if program.fd().is_err() {
        program.load().map_err(error)?;
    }
    let link = program.attach(category, event).map_err(error)?;
    if let Some(keeper) = keeper {
        // A perf event link (kernels before 5.15) cannot be pinned: it is attached again,
        // and goes with this agent.
        let pinned = program
            .take_link(link)
            .map_err(error)
            .map(|link| FdLink::try_from(link).is_ok_and(|link| keeper.keep(name, link)))?;
        if !pinned {
            program.attach(category, event).map_err(error)?;
        }
    }
    Ok(())
}
