//! tc programs on watched interfaces: packets, bytes, TCP resets and SYN retransmits.

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::bpf_ktime_get_ns,
    macros::{classifier, map},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::TcContext,
};
use monitor_common::{
    AF_INET, AF_INET6, DirectionCounters, FLOWS_MAX, FlowKey, FlowState, INTERFACE_COUNTERS_MAX, InterfaceCounters,
    MAP_ERROR_FLOWS_INSERT, MAP_ERROR_INTERFACE_INSERT, MAP_ERROR_SLOTS, SYN_RETRANSMIT_WINDOW_NS,
};

#[map(name = "INTERFACE_COUNTERS")]
static INTERFACE_COUNTERS: PerCpuHashMap<u32, InterfaceCounters> =
    PerCpuHashMap::with_max_entries(INTERFACE_COUNTERS_MAX, 0);

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

/// The agent creates each entry when it attaches; create it here only if it raced us.
fn interface_counters(ifindex: u32) -> Option<*mut InterfaceCounters> {
    if let Some(counters) = INTERFACE_COUNTERS.get_ptr_mut(ifindex) {
        return Some(counters);
    }
    if INTERFACE_COUNTERS.insert(ifindex, InterfaceCounters::default(), 0).is_err() {
        count_map_error(MAP_ERROR_INTERFACE_INSERT);
        return None;
    }
    INTERFACE_COUNTERS.get_ptr_mut(ifindex)
}

fn observe_tcp(ctx: &TcContext, ifindex: u32, direction: &mut DirectionCounters) -> Result<(), i64> {
    let mut key = FlowKey { ifindex, ..FlowKey::default() };
    let l4 = match u16::from_be(ctx.load::<u16>(12)?) {
        ETH_P_IP => {
            let version_ihl: u8 = ctx.load(ETH_HLEN)?;
            let ihl = usize::from(version_ihl & 0x0f) * 4;
            let protocol: u8 = ctx.load(ETH_HLEN + 9)?;
            let fragment_offset = u16::from_be(ctx.load::<u16>(ETH_HLEN + 6)?) & 0x1fff;
            if ihl < 20 || protocol != IPPROTO_TCP || fragment_offset != 0 {
                return Ok(());
            }
            key.family = AF_INET;
            let saddr: [u8; 4] = ctx.load(ETH_HLEN + 12)?;
            let daddr: [u8; 4] = ctx.load(ETH_HLEN + 16)?;
            key.saddr[..4].copy_from_slice(&saddr);
            key.daddr[..4].copy_from_slice(&daddr);
            ETH_HLEN + ihl
        }
        ETH_P_IPV6 => {
            // Extension headers before TCP are rare on pod networks and not followed.
            let next_header: u8 = ctx.load(ETH_HLEN + 6)?;
            if next_header != IPPROTO_TCP {
                return Ok(());
            }
            key.family = AF_INET6;
            key.saddr = ctx.load(ETH_HLEN + 8)?;
            key.daddr = ctx.load(ETH_HLEN + 24)?;
            ETH_HLEN + 40
        }
        _ => return Ok(()),
    };
    let ports: [u16; 2] = ctx.load(l4)?;
    key.sport = ports[0];
    key.dport = ports[1];
    let flags: u8 = ctx.load(l4 + 13)?;

    if flags & TCP_RST != 0 {
        direction.tcp_resets += 1;
        // A reset answers the handshake it refuses.
        let _ = FLOWS.remove(reversed(&key));
    } else if flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        let seq = u32::from_be(ctx.load::<u32>(l4 + 4)?);
        syn_seen(&key, seq, direction);
    } else if flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK {
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
