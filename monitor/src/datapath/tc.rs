//! The tc programs on watched interfaces: attached through tcx (kernels >= 6.6) or a clsact
//! qdisc, each interface's counters in a per-CPU slot (or a hash map entry when two attached
//! interfaces share a slot), detached when the interface goes.

use std::collections::BTreeMap;

use aya::{
    maps::MapError,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions},
    },
};
use monitor_common::{
    INTERFACE_COUNTERS_MAP, INTERFACE_SLOTS_MAP, INTERFACE_SLOTS_MAX, InterfaceCounters, InterfaceSlot,
    TC_EGRESS_PROGRAM, TC_INGRESS_PROGRAM,
};
use tracing::{debug, info, warn};

use super::{AttachMode, Datapath, DatapathError, per_cpu, probes::TC_PROBE, program_mut, sum};
use crate::errors;

/// The tc programs' links on one interface.
pub(super) struct AttachedInterface {
    pub(super) name: String,
    pub(super) links: Vec<(&'static str, SchedClassifierLinkId)>,
    /// Programs found removed whose attach again failed: tried at the next check.
    pub(super) pending: Vec<&'static str>,
    pub(super) mode: AttachMode,
    /// Its counters live in slot `ifindex % INTERFACE_SLOTS_MAX` of INTERFACE_SLOTS (else in
    /// INTERFACE_COUNTERS, when another attached interface holds that slot).
    slot: bool,
}

const BPF_NOEXIST: u64 = 1;

impl Datapath {
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
            match self.attach_one(program_name, ifindex, name, attach_type, mode) {
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
        self.probes.probes.insert(TC_PROBE, Some(format!("{mode:?}").to_lowercase()));
        self.attached
            .insert(ifindex, AttachedInterface { name: name.to_string(), links, pending: Vec::new(), mode, slot });
        Ok(mode)
    }

    pub(super) fn attach_one(
        &mut self,
        program_name: &'static str,
        ifindex: u32,
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
                    let error = errors::chain(&error);
                    // Nothing attached through tcx yet: this kernel has no tcx (before 6.6), so the
                    // tc probe is unsupported, not "loaded" (--tc-attach tcx forbids the fallback).
                    if self.attached.is_empty() && !self.probes.errors.contains_key(TC_PROBE) {
                        warn!(interface, %error, "tc probe unsupported: tcx attach failed and --tc-attach tcx forbids clsact");
                        self.probes.probes.insert(TC_PROBE, None);
                        self.probes
                            .errors
                            .insert(TC_PROBE, format!("tcx attach failed ({error}); --tc-attach tcx forbids clsact"));
                    }
                    return Err(DatapathError::Attach {
                        interface: interface.to_string(),
                        tcx: error,
                        clsact: "not tried (--tc-attach tcx)".into(),
                    });
                }
                Err(error) => errors::chain(&error),
            }
        } else {
            "not tried".to_string()
        };
        // Kernels before 6.6 have no tcx: fall back to a clsact qdisc.
        if let Err(error) = tc::qdisc_add_clsact(interface) {
            debug!(interface, %error, "clsact qdisc not added (usually: already there)");
        }
        // A classic ingress qdisc in its place would take the egress program into its one
        // (ingress) block and count ingress packets as egress: refuse, and say why.
        match super::attachments::ingress_qdisc_kind(ifindex) {
            Ok(Some(kind)) if kind != "clsact" => {
                return Err(DatapathError::Attach {
                    interface: interface.to_string(),
                    tcx: tcx_error,
                    clsact: format!("a qdisc of kind {kind:?} holds the ingress handle ffff: (clsact cannot be added)"),
                });
            }
            Ok(_) => {}
            Err(error) => debug!(interface, %error, "reading the interface's qdiscs"),
        }
        // A tcx link goes with its agent; a clsact filter stays when the agent is killed
        // (SIGKILL, OOM, a crash) and runs the dead agent's program for ever. Filters of this
        // program's name on this interface are such leftovers (this agent attaches once per
        // interface): removed before attaching, so that each interface runs it exactly once.
        match tc::qdisc_detach_program(interface, attach_type, program_name) {
            Ok(()) => {
                info!(interface, program = program_name, "removed a tc filter a previous agent left behind");
            }
            Err(tc::TcError::IoError(error)) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => debug!(interface, error = %errors::chain(&error), "looking for leftover tc filters"),
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
                clsact: errors::chain(&clsact),
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

    /// Every attached interface's counters (slot or hash map entry), summed over CPUs.
    pub(super) fn read_interfaces(&self) -> BTreeMap<u32, InterfaceCounters> {
        let mut interfaces = BTreeMap::new();
        for entry in self.interface_counters.iter() {
            match entry {
                Ok((ifindex, values)) => {
                    interfaces.insert(ifindex, sum(values.iter()));
                }
                Err(error) => debug!(%error, "reading interface counters"),
            }
        }
        for (&ifindex, attached) in &self.attached {
            if attached.slot
                && let Some(slot) = self.read_slot(ifindex)
            {
                interfaces.entry(ifindex).or_default().add(&slot);
            }
        }
        interfaces
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
}
