//! The tc programs on watched interfaces: attached through tcx (kernels >= 6.6) or a clsact
//! qdisc, each interface's counters in a per-CPU slot (or a hash map entry when two attached
//! interfaces share a slot), detached when the interface goes.

use std::collections::BTreeMap;

use aya::{
    maps::MapError,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::FdLink,
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    },
};
use monitor_common::{
    INTERFACE_COUNTERS_MAP, INTERFACE_SLOTS_MAP, INTERFACE_SLOTS_MAX, InterfaceCounters, InterfaceSlot,
    TC_EGRESS_PROGRAM, TC_INGRESS_PROGRAM,
};
use tracing::{debug, info, warn};

use super::{AttachMode, Datapath, DatapathError, per_cpu, probes::TC_PROBE, program_mut, sum};
use crate::errors;

/// The tc programs' links on one interface (owned: dropping one detaches it).
pub(super) struct AttachedInterface {
    pub(super) name: String,
    pub(super) links: Vec<(&'static str, SchedClassifierLink)>,
    /// Programs found removed whose attach again failed: tried at the next check.
    pub(super) pending: Vec<&'static str>,
    pub(super) mode: AttachMode,
    /// Its counters live in slot `ifindex % INTERFACE_SLOTS_MAX` of INTERFACE_SLOTS (else in
    /// INTERFACE_COUNTERS, when another attached interface holds that slot).
    slot: bool,
    /// Its counters were a previous agent's (`keep_attached`) and go on from there.
    pub(super) taken_over: bool,
}

/// The name of the pin of `program`'s tcx link on `ifindex`.
pub(super) fn link_pin(program: &str, ifindex: u32) -> String {
    format!("{program}@{ifindex}")
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
        let (slot, taken_over) = match self.claim_slot(ifindex)? {
            Some(taken_over) => (true, taken_over),
            None => (false, self.ensure_counters_entry(ifindex)?),
        };
        let mut links = Vec::with_capacity(2);
        let mut mode = self.tc_mode.unwrap_or(AttachMode::Tcx);
        for (program_name, attach_type) in
            [(TC_INGRESS_PROGRAM, TcAttachType::Ingress), (TC_EGRESS_PROGRAM, TcAttachType::Egress)]
        {
            match self.attach_one(program_name, ifindex, name, attach_type, mode) {
                Ok(link) => links.push((program_name, link)),
                Err(error) => {
                    self.detach_links(ifindex, &mut links);
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
        self.attached.insert(
            ifindex,
            AttachedInterface { name: name.to_string(), links, pending: Vec::new(), mode, slot, taken_over },
        );
        Ok(mode)
    }

    /// Whether `ifindex`'s counters were taken over from a previous agent (`keep_attached`).
    pub fn taken_over(&self, ifindex: u32) -> bool {
        self.attached.get(&ifindex).is_some_and(|attached| attached.taken_over)
    }

    pub(super) fn attach_one(
        &mut self,
        program_name: &'static str,
        ifindex: u32,
        interface: &str,
        attach_type: TcAttachType,
        mode: AttachMode,
    ) -> Result<SchedClassifierLink, DatapathError> {
        let program: &mut SchedClassifier = program_mut(&mut self.ebpf, program_name)?;
        let owned = |program: &mut SchedClassifier, id| {
            program
                .take_link(id)
                .map_err(|source| DatapathError::Program { name: program_name, source: Box::new(source) })
        };
        let tcx_error = if mode == AttachMode::Tcx {
            let pin = link_pin(program_name, ifindex);
            // A previous agent's link (`keep_attached`): this program swapped in, atomically.
            if let Some(keeper) = self.keeper.as_mut()
                && let Some(link) = keeper.pins.take_over(&pin)
            {
                match SchedClassifierLink::try_from(link)
                    .map_err(|error| error.to_string())
                    .and_then(|link| program.attach_to_link(link).map_err(|error| errors::chain(&error)))
                {
                    Ok(id) => {
                        self.tc_mode.get_or_insert(AttachMode::Tcx);
                        debug!(interface, program = program_name, "took over the previous agent's tcx link");
                        return owned(program, id);
                    }
                    Err(error) => {
                        debug!(interface, %error, "the pinned tcx link went with its device; attaching afresh");
                        keeper.pins.unpin(&pin);
                    }
                }
            }
            match program.attach_with_options(interface, attach_type, TcAttachOptions::TcxOrder(LinkOrder::first())) {
                Ok(id) => {
                    self.tc_mode.get_or_insert(AttachMode::Tcx);
                    let link = owned(program, id)?;
                    let Some(keeper) = self.keeper.as_mut() else { return Ok(link) };
                    // A previous agent that ran on clsact (forced) left its filters: they go,
                    // or both would count every packet.
                    if tc::qdisc_detach_program(interface, attach_type, program_name).is_ok() {
                        info!(interface, program = program_name, "removed a previous agent's clsact filter");
                    }
                    let kept = FdLink::try_from(link)
                        .map_err(|error| error.to_string())
                        .and_then(|link| keeper.pins.pin(&pin, link))
                        .and_then(|link| SchedClassifierLink::try_from(link).map_err(|error| error.to_string()));
                    return match kept {
                        Ok(link) => Ok(link),
                        // The link is gone with the failed pin: attached again, unpinned.
                        Err(_) => program
                            .attach_with_options(interface, attach_type, TcAttachOptions::TcxOrder(LinkOrder::first()))
                            .map_err(|source| DatapathError::Program { name: program_name, source: Box::new(source) })
                            .and_then(|id| owned(program, id)),
                    };
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
        // A clsact filter stays when its agent exits: left on purpose (`keep_attached`), or
        // after a SIGKILL, an OOM kill, a crash. Filters of this program's name on this hook
        // are such (this agent attaches once per interface): this program replaces the first
        // in place (the hook never runs without one), and any other is removed, so that each
        // interface runs it exactly once.
        // And a previous agent's pinned tcx link (it ran on tcx) goes: both would count.
        if let Some(keeper) = &self.keeper {
            keeper.pins.unpin(&link_pin(program_name, ifindex));
        }
        let ingress = attach_type == TcAttachType::Ingress;
        let leftovers =
            super::attachments::clsact_filters_named(ifindex, ingress, program_name).unwrap_or_else(|error| {
                debug!(interface, %error, "looking for leftover tc filters");
                Vec::new()
            });
        let mut replaced = None;
        for (priority, handle) in leftovers {
            let Ok(link) =
                SchedClassifierLink::attached(interface, attach_type, priority, TcHandle::from(handle), None)
            else {
                continue;
            };
            if replaced.is_none() {
                match program.attach_to_link(link) {
                    Ok(id) => {
                        info!(
                            interface,
                            program = program_name,
                            "replaced a tc filter a previous agent left, in place"
                        );
                        replaced = Some(id);
                    }
                    Err(error) => debug!(interface, error = %errors::chain(&error), "replacing a leftover tc filter"),
                }
            } else {
                // Dropping it deletes the filter.
                drop(link);
                info!(interface, program = program_name, "removed a duplicate tc filter a previous agent left");
            }
        }
        let attached = match replaced {
            Some(id) => Ok(id),
            None => program.attach_with_options(interface, attach_type, TcAttachOptions::Netlink(NlOptions::default())),
        };
        match attached {
            Ok(id) => {
                if self.tc_mode.is_none() {
                    warn!(interface, %tcx_error, "tcx attach failed; using clsact for all interfaces");
                    self.tc_mode = Some(AttachMode::Clsact);
                }
                owned(program, id)
            }
            Err(clsact) => Err(DatapathError::Attach {
                interface: interface.to_string(),
                tcx: tcx_error,
                clsact: errors::chain(&clsact),
            }),
        }
    }

    /// Gives `ifindex` its slot in INTERFACE_SLOTS (zeroed counters on every CPU) unless
    /// another attached interface holds it. Returns None when it did not, else whether the
    /// slot was a previous agent's (`keep_attached`), kept with its counters.
    fn claim_slot(&mut self, ifindex: u32) -> Result<Option<bool>, DatapathError> {
        let index = ifindex % INTERFACE_SLOTS_MAX;
        let taken = self.attached.iter().any(|(other, attached)| attached.slot && other % INTERFACE_SLOTS_MAX == index);
        if taken {
            debug!(ifindex, index, "slot taken: counters in the hash map");
            return Ok(None);
        }
        if self.keeper.as_ref().is_some_and(|keeper| keeper.pins.taken_over) && self.read_slot(ifindex).is_some() {
            return Ok(Some(true));
        }
        let values = per_cpu(InterfaceSlot { ifindex, ..InterfaceSlot::default() }, self.nr_cpus, INTERFACE_SLOTS_MAP)?;
        self.interface_slots
            .set(index, values, 0)
            .map_err(|source| DatapathError::Map { name: INTERFACE_SLOTS_MAP, source: Box::new(source) })?;
        Ok(Some(false))
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
    /// Returns whether it was there already, a previous agent's (`keep_attached`).
    fn ensure_counters_entry(&mut self, ifindex: u32) -> Result<bool, DatapathError> {
        let zeros = per_cpu(InterfaceCounters::default(), self.nr_cpus, INTERFACE_COUNTERS_MAP)?;
        match self.interface_counters.insert(ifindex, zeros, BPF_NOEXIST) {
            Ok(()) => Ok(false),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {
                Ok(self.keeper.as_ref().is_some_and(|keeper| keeper.pins.taken_over))
            }
            Err(source) => Err(DatapathError::Map { name: INTERFACE_COUNTERS_MAP, source: Box::new(source) }),
        }
    }

    /// Detaches `links` (dropping one detaches it; harmless when the device is gone), and
    /// removes their pins.
    pub(super) fn detach_links(&mut self, ifindex: u32, links: &mut Vec<(&'static str, SchedClassifierLink)>) {
        for (program_name, link) in links.drain(..) {
            if let Some(keeper) = &self.keeper {
                keeper.pins.unpin(&link_pin(program_name, ifindex));
            }
            drop(link);
        }
    }

    /// At exit with `keep_attached`: leaves every tc program where it is, for the next
    /// agent (tcx links stay by their pins, clsact filters by themselves).
    pub fn leave_attached(&mut self) -> usize {
        let attached = std::mem::take(&mut self.attached);
        for interface in attached.values() {
            debug!(interface = interface.name, "left attached");
        }
        let count = attached.len();
        // Dropping the links would detach them.
        std::mem::forget(attached);
        count
    }

    /// Whether the programs stay attached when the agent exits (`keep_attached`), which
    /// they do while their pin directory is there: `datapath-monitor detach` (uninstall)
    /// removes it, and the agent then detaches everything at exit.
    pub fn keeps_attached(&self) -> bool {
        self.keeper.as_ref().is_some_and(|keeper| keeper.pins.dir().exists())
    }

    /// Once the interfaces present at start-up are attached: forgets what a previous agent
    /// left for interfaces that are gone (their slots, counters entries and link pins), and
    /// removes another build's pins (its programs ran until now).
    pub fn finish_takeover(&mut self) {
        let Some(keeper) = self.keeper.as_ref() else { return };
        if keeper.pins.taken_over {
            for name in keeper.pins.links() {
                let Some((_, ifindex)) = name.split_once('@') else { continue };
                if ifindex.parse().is_ok_and(|ifindex: u32| !self.attached.contains_key(&ifindex)) {
                    keeper.pins.unpin(&name);
                }
            }
            let stale: Vec<u32> = self
                .interface_counters
                .keys()
                .filter_map(Result::ok)
                .filter(|i| !self.attached.contains_key(i))
                .collect();
            for ifindex in stale {
                let _ = self.interface_counters.remove(&ifindex);
            }
            for index in 0..INTERFACE_SLOTS_MAX {
                let owner =
                    self.interface_slots.get(&index, 0).ok().and_then(|values| values.iter().next().map(|s| s.ifindex));
                let held = owner
                    .is_some_and(|owner| owner == 0 || self.attached.get(&owner).is_some_and(|attached| attached.slot));
                if !held && let Ok(free) = per_cpu(InterfaceSlot::default(), self.nr_cpus, INTERFACE_SLOTS_MAP) {
                    let _ = self.interface_slots.set(index, free, 0);
                }
            }
        }
        keeper.pins.remove_other_builds();
    }

    /// Detaches from `ifindex` and returns its final counters (the kernel entry is removed).
    pub fn detach(&mut self, ifindex: u32) -> Option<InterfaceCounters> {
        let mut attached = self.attached.remove(&ifindex)?;
        self.detach_links(ifindex, &mut attached.links);
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
