//! Are the tc programs still where the agent put them? An operator's `tc filter del` or
//! `tc qdisc del dev X clsact`, `bpftool link detach`, or another tool that rebuilds an
//! interface's tc setup can take them off while the agent runs, and the interface would go
//! unwatched without a word. [`Datapath::verify_attachments`] asks the kernel which programs
//! run on each attached interface (tcx: `BPF_PROG_QUERY`; clsact: a netlink dump of the
//! filters with their program ids) and attaches again what is missing.

use std::io;

use aya::programs::TcAttachType;
use monitor_common::TC_INGRESS_PROGRAM;
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tracing::{debug, info, warn};

use super::{AttachMode, Datapath};
use crate::errors;

/// `BPF_PROG_QUERY` and the tcx attach types, from `include/uapi/linux/bpf.h`.
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
/// More programs than any interface carries; the kernel says how many there were.
const QUERY_CAPACITY: usize = 64;

/// The query part of `union bpf_attr` (kernel 6.6+ layout; older kernels read a prefix).
#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// One direction of one interface that was found without the agent's program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reattachment {
    pub interface: String,
    pub direction: &'static str,
    /// None when it is attached again; else why not (retried at the next check).
    pub error: Option<String>,
}

impl Datapath {
    /// Checks every attached interface for the agent's two programs and attaches again the
    /// ones someone removed. Returns what was missing; an interface whose state cannot be
    /// read (it is going away) is left to the link watch.
    pub fn verify_attachments(&mut self) -> Vec<Reattachment> {
        let mut missing = Vec::new();
        let mut socket = None;
        for (&ifindex, attached) in &self.attached {
            for (index, (program_name, _)) in attached.links.iter().enumerate() {
                let Some(&expected) = self.program_ids.get(program_name) else { continue };
                let ingress = *program_name == TC_INGRESS_PROGRAM;
                let running = match attached.mode {
                    AttachMode::Tcx => tcx_program_ids(ifindex, ingress),
                    AttachMode::Clsact => clsact_program_ids(&mut socket, ifindex, ingress),
                };
                match running {
                    Ok(ids) if !ids.contains(&expected) => missing.push((ifindex, index)),
                    Ok(_) => {}
                    Err(error) => debug!(ifindex, %error, "reading an interface's tc programs"),
                }
            }
        }
        // Highest index first, so that removing one leaves the others' indexes valid.
        missing.sort_by(|a, b| b.cmp(a));
        for (ifindex, index) in missing {
            let Some(attached) = self.attached.get_mut(&ifindex) else { continue };
            let (program_name, old_link) = attached.links.remove(index);
            attached.pending.push(program_name);
            let interface = attached.name.clone();
            warn!(interface, program = program_name, "the agent's tc program was removed from the interface");
            // What is left of the old attachment (a tcx link someone detached, and its pin;
            // a filter handle) is dropped; it is usually gone already.
            self.detach_links(ifindex, &mut vec![(program_name, old_link)]);
        }
        self.attach_pending()
    }

    /// Interfaces with a removed program not attached again yet (failed, retried).
    pub fn pending_reattach(&self) -> Vec<String> {
        self.attached.values().filter(|attached| !attached.pending.is_empty()).map(|a| a.name.clone()).collect()
    }

    /// Attaches again the programs found missing, now or at an earlier check (a failure is
    /// tried again at the next one).
    fn attach_pending(&mut self) -> Vec<Reattachment> {
        let mut results = Vec::new();
        let ifindexes: Vec<u32> =
            self.attached.iter().filter(|(_, attached)| !attached.pending.is_empty()).map(|(i, _)| *i).collect();
        for ifindex in ifindexes {
            let Some(attached) = self.attached.get_mut(&ifindex) else { continue };
            let pending = std::mem::take(&mut attached.pending);
            let (interface, mode) = (attached.name.clone(), attached.mode);
            for program_name in pending {
                let (attach_type, direction) = if program_name == TC_INGRESS_PROGRAM {
                    (TcAttachType::Ingress, "ingress")
                } else {
                    (TcAttachType::Egress, "egress")
                };
                let result = self.attach_one(program_name, ifindex, &interface, attach_type, mode);
                let Some(attached) = self.attached.get_mut(&ifindex) else { continue };
                let error = match result {
                    Ok(link) => {
                        attached.links.push((program_name, link));
                        info!(interface, direction, "the agent's tc program is attached again");
                        None
                    }
                    Err(error) => {
                        attached.pending.push(program_name);
                        let error = errors::chain(&error);
                        warn!(interface, direction, %error, "attaching the removed tc program again failed; retried");
                        Some(error)
                    }
                };
                results.push(Reattachment { interface: interface.clone(), direction, error });
            }
        }
        results
    }
}

/// The ids of the programs tcx runs on `ifindex` in one direction.
fn tcx_program_ids(ifindex: u32, ingress: bool) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; QUERY_CAPACITY];
    let mut attr = ProgQueryAttr {
        target_ifindex: ifindex,
        attach_type: if ingress { BPF_TCX_INGRESS } else { BPF_TCX_EGRESS },
        prog_ids: ids.as_mut_ptr() as u64,
        count: QUERY_CAPACITY as u32,
        ..ProgQueryAttr::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix for BPF_PROG_QUERY with its size; prog_ids
    // points to `count` u32s that live across the call.
    let result =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_QUERY, &raw mut attr, size_of::<ProgQueryAttr>() as u32) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    let count = (attr.count as usize).min(QUERY_CAPACITY);
    Ok(ids[..count].to_vec())
}

/// The program ids of the bpf filters on `ifindex`'s clsact ingress or egress hook.
fn clsact_program_ids(socket: &mut Option<Socket>, ifindex: u32, ingress: bool) -> io::Result<Vec<u32>> {
    let mut request = TcMessage::with_index(ifindex as i32);
    request.header.parent = TcHandle { major: TcHandle::INGRESS.major, minor: hook_minor(ingress) };
    let filters = tc_dump(socket, RouteNetlinkMessage::GetTrafficFilter(request), ifindex)?;
    Ok(filters.iter().flat_map(bpf_program_ids).collect())
}

/// (priority, handle) of the bpf filters named `program` on `ifindex`'s clsact ingress or
/// egress hook.
pub(super) fn clsact_filters_named(ifindex: u32, ingress: bool, program: &str) -> io::Result<Vec<(u16, u32)>> {
    let mut request = TcMessage::with_index(ifindex as i32);
    request.header.parent = TcHandle { major: TcHandle::INGRESS.major, minor: hook_minor(ingress) };
    let filters = tc_dump(&mut None, RouteNetlinkMessage::GetTrafficFilter(request), ifindex)?;
    let named = |filter: &TcMessage| {
        filter.attributes.iter().any(|attribute| match attribute {
            TcAttribute::Options(options) => options
                .iter()
                .any(|option| matches!(option, TcOption::Bpf(TcFilterBpfOption::ProgName(name)) if name == program)),
            _ => false,
        })
    };
    let mut found: Vec<(u16, u32)> = filters
        .iter()
        .filter(|filter| filter.header.handle != TcHandle::UNSPEC && named(filter))
        .map(|filter| ((filter.header.info >> 16) as u16, u32::from(filter.header.handle)))
        .collect();
    found.dedup();
    Ok(found)
}

/// The kind of the qdisc that holds `ifindex`'s ingress handle (ffff:), if any: "clsact",
/// or "ingress" (the classic one, whose single block would take the egress program too).
pub(super) fn ingress_qdisc_kind(ifindex: u32) -> io::Result<Option<String>> {
    let request = TcMessage::with_index(ifindex as i32);
    let qdiscs = tc_dump(&mut None, RouteNetlinkMessage::GetQueueDiscipline(request), ifindex)?;
    Ok(qdiscs
        .iter()
        .filter(|qdisc| qdisc.header.index == ifindex as i32 && qdisc.header.handle.major == TcHandle::INGRESS.major)
        .find_map(|qdisc| {
            qdisc.attributes.iter().find_map(|attribute| match attribute {
                TcAttribute::Kind(kind) => Some(kind.clone()),
                _ => None,
            })
        }))
}

/// A tc dump (filters or qdiscs) over a route netlink socket opened on first use.
fn tc_dump(socket: &mut Option<Socket>, request: RouteNetlinkMessage, sequence: u32) -> io::Result<Vec<TcMessage>> {
    if socket.is_none() {
        let mut opened = Socket::new(NETLINK_ROUTE)?;
        opened.bind_auto()?;
        opened.connect(&SocketAddr::new(0, 0))?;
        *socket = Some(opened);
    }
    let Some(socket) = socket.as_mut() else { return Err(io::Error::other("no netlink socket")) };
    let mut message = NetlinkMessage::from(request);
    message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.header.sequence_number = sequence;
    message.finalize();
    let mut buffer = vec![0; message.buffer_len()];
    message.serialize(&mut buffer);
    socket.send(&buffer, 0)?;

    let mut replies = Vec::new();
    let mut received = vec![0u8; 32 * 1024];
    loop {
        let length = socket.recv(&mut &mut received[..], 0)?;
        let mut offset = 0;
        while offset < length {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&received[offset..length])
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))?;
            let size = reply.header.length as usize;
            if size == 0 {
                return Ok(replies);
            }
            offset += size;
            match reply.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewTrafficFilter(message) | RouteNetlinkMessage::NewQueueDiscipline(message),
                ) => replies.push(message),
                NetlinkPayload::Done(_) => return Ok(replies),
                NetlinkPayload::Error(error) => {
                    return Err(match error.code {
                        Some(code) => io::Error::from_raw_os_error(-code.get()),
                        None => io::Error::other("netlink acknowledgement where a dump was expected"),
                    });
                }
                _ => {}
            }
        }
    }
}

/// clsact's ingress and egress hooks: parents ffff:fff2 and ffff:fff3.
fn hook_minor(ingress: bool) -> u16 {
    if ingress { TcHandle::MIN_INGRESS } else { TcHandle::MIN_EGRESS }
}

fn bpf_program_ids(filter: &TcMessage) -> impl Iterator<Item = u32> + '_ {
    filter.attributes.iter().flat_map(|attribute| match attribute {
        TcAttribute::Options(options) => options
            .iter()
            .filter_map(|option| match option {
                TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => Some(*id),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_attribute_has_the_kernels_layout() {
        // offsetof(union bpf_attr, query.revision) == 56 since 6.6.
        assert_eq!(std::mem::offset_of!(ProgQueryAttr, prog_ids), 16);
        assert_eq!(std::mem::offset_of!(ProgQueryAttr, count), 24);
        assert_eq!(std::mem::offset_of!(ProgQueryAttr, revision), 56);
    }

    #[test]
    fn the_clsact_hooks_are_ffff_fff2_and_ffff_fff3() {
        let ingress = TcHandle { major: TcHandle::INGRESS.major, minor: hook_minor(true) };
        let egress = TcHandle { major: TcHandle::INGRESS.major, minor: hook_minor(false) };
        assert_eq!(u32::from(ingress), 0xFFFF_FFF2);
        assert_eq!(u32::from(egress), 0xFFFF_FFF3);
    }

    #[test]
    fn program_ids_come_from_the_bpf_options_only() {
        let mut filter = TcMessage::default();
        filter.attributes.push(TcAttribute::Kind("bpf".into()));
        filter.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgName("tc_ingress".into())),
            TcOption::Bpf(TcFilterBpfOption::ProgId(42)),
        ]));
        assert_eq!(bpf_program_ids(&filter).collect::<Vec<_>>(), vec![42]);
    }
}
