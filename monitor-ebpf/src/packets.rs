//! tc programs on watched interfaces: packets, bytes, TCP resets and SYN retransmits.

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::bpf_ktime_get_ns,
    macros::{classifier, map},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::TcContext,
};
use monitor_common::{
    AF_INET, AF_INET6, DirectionCounters, FLOWS_MAX, FlowKey, FlowState, INTERFACE_COUNTERS_MAX, INTERFACE_SLOTS_MAX,
    InterfaceCounters, InterfaceSlot, MAP_ERROR_FLOWS_INSERT, MAP_ERROR_INTERFACE_INSERT, MAP_ERROR_SLOTS,
    SYN_RETRANSMIT_WINDOW_NS,
};

#[map(name = "INTERFACE_COUNTERS")]
static INTERFACE_COUNTERS: PerCpuHashMap<u32, InterfaceCounters> =
    PerCpuHashMap::with_max_entries(INTERFACE_COUNTERS_MAX, 0);

#[map(name = "INTERFACE_SLOTS")]
static INTERFACE_SLOTS: PerCpuArray<InterfaceSlot> = PerCpuArray::with_max_entries(INTERFACE_SLOTS_MAX, 0);

#[map(name = "FLOWS")]
static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(FLOWS_MAX, 0);

#[map(name = "MAP_ERRORS")]
pub(crate) static MAP_ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAP_ERROR_SLOTS, 0);

/// Let the next program (a CNI's, say) or the default action decide: we only observe.
const TC_ACT_UNSPEC: i32 = -1;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const IPPROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

#[classifier]
pub fn tc_ingress(ctx: TcContext) -> i32 {
    observe(&ctx, true);
    TC_ACT_UNSPEC
}

#[classifier]
pub fn tc_egress(ctx: TcContext) -> i32 {
    observe(&ctx, false);
    TC_ACT_UNSPEC
}

pub(crate) fn count_map_error(slot: u32) {
    if let Some(counter) = MAP_ERRORS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *counter += 1 };
    }
}

// Inlined: as a BPF subprogram LLVM may leave a stack pointer in r0 at its exit, which the
// verifier rejects.
#[inline(always)]
fn observe(ctx: &TcContext, ingress: bool) {
    // SAFETY: ctx.skb is the program's context pointer.
    let ifindex = unsafe { (*ctx.skb.skb.cast::<__sk_buff>()).ifindex };
    let Some(counters) = interface_counters(ifindex) else {
        return;
    };
    // SAFETY: per-CPU value; this CPU is its only writer while we run.
    let counters = unsafe { &mut *counters };
    let direction = if ingress { &mut counters.ingress } else { &mut counters.egress };
    direction.packets += 1;
    direction.bytes += u64::from(ctx.len());
    let _ = observe_tcp(ctx, ifindex, direction);
}

/// The interface's slot when the agent gave it one (an array lookup, inlined by the
/// verifier), else its hash entry, which the agent creates when it attaches; create it here
/// only if it raced us.
#[inline(always)]
fn interface_counters(ifindex: u32) -> Option<*mut InterfaceCounters> {
    if let Some(slot) = INTERFACE_SLOTS.get_ptr_mut(ifindex % INTERFACE_SLOTS_MAX) {
        // SAFETY: per-CPU value; this CPU is its only writer while we run.
        let slot = unsafe { &mut *slot };
        if slot.ifindex == ifindex {
            return Some(&raw mut slot.counters);
        }
    }
    if let Some(counters) = INTERFACE_COUNTERS.get_ptr_mut(ifindex) {
        return Some(counters);
    }
    if INTERFACE_COUNTERS.insert(ifindex, InterfaceCounters::default(), 0).is_err() {
        count_map_error(MAP_ERROR_INTERFACE_INSERT);
        return None;
    }
    INTERFACE_COUNTERS.get_ptr_mut(ifindex)
}

/// Reads a `T` at `offset` from the packet: straight from the linear data when it is there
/// (the common case, and far cheaper than a helper call), else through bpf_skb_load_bytes.
/// Whole headers are read at once: one bounds check each, and never a 1-byte read, whose
/// check LLVM rewrites into a form the verifier cannot use.
#[inline(always)]
fn read<T: Copy>(ctx: &TcContext, offset: usize) -> Result<T, i64> {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + offset + size_of::<T>() <= end {
        // SAFETY: bounds checked against data_end just above (the verifier checks it too).
        return Ok(unsafe { ((start + offset) as *const T).read_unaligned() });
    }
    ctx.load(offset)
}

const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;

fn observe_tcp(ctx: &TcContext, ifindex: u32, direction: &mut DirectionCounters) -> Result<(), i64> {
    // skb->protocol: the ethertype, without touching the packet.
    // SAFETY: ctx.skb.skb is the program's context pointer.
    let protocol = u16::from_be(unsafe { (*ctx.skb.skb.cast::<__sk_buff>()).protocol } as u16);
    // Every packet pays for what is read before the flags test, so only the bytes that
    // decide "TCP, and SYN or RST?" are read there; addresses, ports and the flow key (a
    // 40-byte stack fill) only for SYN and RST packets.
    let (family, l4) = match protocol {
        ETH_P_IP => {
            // Version/IHL, .., flags/fragment offset, TTL, protocol.
            let ip: [u8; 10] = read(ctx, ETH_HLEN)?;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let fragment_offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            if ihl < IPV4_HLEN || ip[9] != IPPROTO_TCP || fragment_offset != 0 {
                return Ok(());
            }
            (AF_INET, ETH_HLEN + ihl)
        }
        ETH_P_IPV6 => {
            // Extension headers before TCP are rare on pod networks and not followed.
            let fixed: [u8; 8] = read(ctx, ETH_HLEN)?;
            if fixed[6] != IPPROTO_TCP {
                return Ok(());
            }
            (AF_INET6, ETH_HLEN + IPV6_HLEN)
        }
        _ => return Ok(()),
    };
    // Data offset/reserved, flags.
    let flags = read::<[u8; 2]>(ctx, l4 + 12)?[1];
    // Most packets are neither SYN nor RST: no flow key and no flow-table access for them.
    if flags & (TCP_SYN | TCP_RST) == 0 {
        return Ok(());
    }
    let mut key = FlowKey { ifindex, family, ..FlowKey::default() };
    if family == AF_INET {
        let addresses: [u8; 8] = read(ctx, ETH_HLEN + 12)?;
        key.saddr[..4].copy_from_slice(&addresses[..4]);
        key.daddr[..4].copy_from_slice(&addresses[4..]);
    } else {
        key.saddr = read(ctx, ETH_HLEN + 8)?;
        key.daddr = read(ctx, ETH_HLEN + 24)?;
    }
    // Source port, destination port, sequence number.
    let tcp: [u8; 8] = read(ctx, l4)?;
    key.sport = u16::from_ne_bytes([tcp[0], tcp[1]]);
    key.dport = u16::from_ne_bytes([tcp[2], tcp[3]]);

    if flags & TCP_RST != 0 {
        direction.tcp_resets += 1;
        // A reset answers the handshake it refuses.
        let _ = FLOWS.remove(reversed(&key));
    } else if flags & TCP_ACK == 0 {
        syn_seen(&key, u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]), direction);
    } else {
        // SYN-ACK: the handshake is answered.
        let _ = FLOWS.remove(reversed(&key));
    }
    Ok(())
}

fn syn_seen(key: &FlowKey, seq: u32, direction: &mut DirectionCounters) {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(state) = FLOWS.get_ptr_mut(key) {
        // SAFETY: a concurrent writer can only make us miss one retransmit, never corrupt.
        let state = unsafe { &mut *state };
        if state.syn_seq == seq && now.wrapping_sub(state.last_syn_ns) < SYN_RETRANSMIT_WINDOW_NS {
            direction.syn_retransmits += 1;
            state.syns += 1;
        } else {
            state.syn_seq = seq;
            state.syns = 1;
        }
        state.last_syn_ns = now;
        return;
    }
    let state = FlowState { last_syn_ns: now, syn_seq: seq, syns: 1 };
    if FLOWS.insert(key, state, 0).is_err() {
        count_map_error(MAP_ERROR_FLOWS_INSERT);
    }
}

fn reversed(key: &FlowKey) -> FlowKey {
    FlowKey { saddr: key.daddr, daddr: key.saddr, sport: key.dport, dport: key.sport, ..*key }
}
