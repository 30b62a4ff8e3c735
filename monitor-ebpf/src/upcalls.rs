//! OVS upcalls that fail, named: the `openvswitch:ovs_dp_upcall` tracepoint (openvswitch.ko)
//! fires for each packet OVS's kernel datapath sends to ovs-vswitchd (a flow miss, a
//! userspace action), never per forwarded packet.
//!
//! When the upcall fails (no handler: `-ENOTCONN`; ovs-vswitchd gone: `-ECONNREFUSED`), the
//! kernel frees the packet right away with `kfree_skb` (reason `NOT_SPECIFIED`), on the same
//! CPU: the drop tracer records that drop as [`UPCALL_FAILED_REASON`] instead. With
//! `-ECONNREFUSED` the netlink message built for the upcall is freed first, also as
//! `NOT_SPECIFIED` (no device, no protocol): the tracer counts it nowhere. An upcall that
//! fails on a full queue (`-EAGAIN`) is freed with `consume_skb`, which no drop tracer sees;
//! the datapath's `lost` counter (`ovs-dpctl show`) counts both. `ovs_dp_upcall` itself
//! cannot be probed: it is inlined into its caller on the kernels tested.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{Array, PerCpuArray},
    programs::TracePointContext,
};

/// This CPU's latest upcall: the packet and when.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Upcall {
    skb: u64,
    at_ns: u64,
}

#[map(name = "UPCALL_INFLIGHT")]
static UPCALL_INFLIGHT: PerCpuArray<Upcall> = PerCpuArray::with_max_entries(1, 0);

/// Slot 0: the offset of `skbaddr` in the tracepoint's record, from its format file (the
/// agent writes it when openvswitch.ko appears, after the programs were loaded).
#[map(name = "UPCALL_CONFIG")]
static UPCALL_CONFIG: Array<u32> = Array::with_max_entries(1, 0);

/// [start, end) of `ovs_dp_process_packet`'s code (the agent writes it from /proc/kallsyms when
/// openvswitch.ko appears). Its one `kfree_skb` frees the packet of a failed upcall: a drop
/// called from there is one, and a drop called from anywhere else is not, even of a packet
/// that reuses the address of an upcall that succeeded (its packet consumed, unseen).
/// Two ranges, [0, 1) and [2, 3): the function and its cold part, which the compiler may
/// have moved the failure path to (an empty range when there is none).
#[map(name = "UPCALL_SITE")]
static UPCALL_SITE: Array<u64> = Array::with_max_entries(4, 0);

/// Whether a drop called from `location` was called from the failed-upcall site; None when
/// the site or the location is unknown (the classic tracepoint, addresses hidden).
pub(crate) fn at_upcall_site(location: u64) -> Option<bool> {
    let bound = |index: u32| UPCALL_SITE.get(index).copied().unwrap_or(0);
    let (start, end) = (bound(0), bound(1));
    if location == 0 || start == 0 || end <= start {
        return None;
    }
    let (cold_start, cold_end) = (bound(2), bound(3));
    Some((location >= start && location < end) || (location >= cold_start && location < cold_end))
}

/// A failed upcall's `kfree_skb` of its packet follows the tracepoint on the same CPU within
/// microseconds, but under software emulation it has taken over 5 ms (the 6.1 guest in CI:
/// 49 of 50 named). The packet is matched by its address, so the window only has to keep
/// a much later drop of a packet that reuses the address from counting.
const UPCALL_PACKET_WINDOW_NS: u64 = 100_000_000;
/// The refused netlink message, which has no address to match, is freed before the packet:
/// only deviceless, protocol-less frees this soon after the upcall are taken for it.
const UPCALL_MESSAGE_WINDOW_NS: u64 = 20_000_000;

#[tracepoint(category = "openvswitch", name = "ovs_dp_upcall")]
pub fn ovs_upcall(ctx: TracePointContext) -> u32 {
    let Some(offset) = UPCALL_CONFIG.get(0).copied().filter(|offset| *offset != 0) else { return 0 };
    // SAFETY: the offset comes from the tracepoint's own format file.
    let Ok(skb) = (unsafe { ctx.read_at::<u64>(offset as usize) }) else { return 0 };
    if let Some(slot) = UPCALL_INFLIGHT.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; this CPU is its only writer while we run. bpf_ktime_get_ns
        // has no preconditions.
        unsafe { *slot = Upcall { skb, at_ns: bpf_ktime_get_ns() } };
    }
    0
}

/// What a `NOT_SPECIFIED` drop is to the upcall that just went out on this CPU.
pub(crate) enum UpcallPart {
    /// The upcall's packet: the upcall failed (the slot is cleared).
    Packet,
    /// The netlink message built for the upcall, refused (ovs-vswitchd's socket is gone) and
    /// freed by `netlink_unicast` before the packet itself is: no packet at all.
    Message,
    /// Unrelated.
    Neither,
}

/// What `skb`, dropped now as `NOT_SPECIFIED`, is to this CPU's latest upcall. `packet_like`:
/// it has a device or a protocol, which a netlink message never has. `site`: whether the
/// drop was called from the failed-upcall site ([`at_upcall_site`]); when that is unknown,
/// the packet is recognised by its address and time alone.
pub(crate) fn upcall_part(skb: *const u8, packet_like: bool, site: Option<bool>) -> UpcallPart {
    let Some(slot) = UPCALL_INFLIGHT.get_ptr_mut(0) else {
        return if site == Some(true) { UpcallPart::Packet } else { UpcallPart::Neither };
    };
    // SAFETY: as above.
    let upcall = unsafe { &mut *slot };
    if site == Some(true) {
        if upcall.skb == skb as u64 {
            upcall.skb = 0;
        }
        return UpcallPart::Packet;
    }
    if upcall.skb == 0 {
        return UpcallPart::Neither;
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let age = unsafe { bpf_ktime_get_ns() }.saturating_sub(upcall.at_ns);
    if upcall.skb == skb as u64 {
        upcall.skb = 0;
        // Freed elsewhere (site known): the upcall succeeded and this packet reuses its address.
        return if site.is_none() && age <= UPCALL_PACKET_WINDOW_NS { UpcallPart::Packet } else { UpcallPart::Neither };
    }
    if age <= UPCALL_MESSAGE_WINDOW_NS && !packet_like { UpcallPart::Message } else { UpcallPart::Neither }
}
