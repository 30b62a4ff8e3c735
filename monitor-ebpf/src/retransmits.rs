//! Retransmit tracer on `tp_btf/tcp_retransmit_skb`: counts TCP data segments retransmitted
//! per (netns of the socket, family, destination address). It runs only when TCP
//! retransmits, never per packet.
//!
//! SYN and SYN-ACK retransmits (sockets in SYN_SENT or SYN_RECV) are left to the tc
//! programs, which count them per interface. Offsets come from the kernel's BTF through
//! globals, as for the drop tracer.

use core::ptr::read_volatile;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, map},
    maps::PerCpuHashMap,
    programs::BtfTracePointContext,
};
use monitor_common::{AF_INET, AF_INET6, MAP_ERROR_RETRANSMITS, RETRANSMITS_MAX, RetransmitKey};

use crate::{drops::NET_INUM_OFFSET, packets::count_map_error};

#[map(name = "RETRANSMITS")]
static RETRANSMITS: PerCpuHashMap<RetransmitKey, u64> = PerCpuHashMap::with_max_entries(RETRANSMITS_MAX, 0);

#[unsafe(no_mangle)]
static SK_NET_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SK_STATE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SK_FAMILY_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SK_DADDR_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SK_V6_DADDR_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_CB_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TCP_CB_GSO_SEGS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static RETRANSMIT_HAS_ERR: u32 = 0;

/// `enum tcp_state`: handshake states, whose retransmits are SYNs and SYN-ACKs.
const TCP_SYN_SENT: u8 = 2;
const TCP_SYN_RECV: u8 = 3;

fn global(value: &'static u32) -> u32 {
    // SAFETY: the agent fills these before load; volatile keeps rustc from folding the 0.
    unsafe { read_volatile(value) }
}

/// tp_btf: arguments are (const struct sock *sk, const struct sk_buff *skb[, int err]).
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn tcp_retransmit(ctx: BtfTracePointContext) -> i32 {
    // Since 6.13 the tracepoint also fires for retransmits that failed (err != 0), which
    // the kernel's own TcpRetransSegs does not count.
    if global(&RETRANSMIT_HAS_ERR) != 0 && ctx.arg::<u32>(2) != 0 {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let skb: *const u8 = ctx.arg(1);
    if let Some(key) = key_of(sk) {
        record_retransmit(key, segments_of(skb));
    }
    0
}

fn record_retransmit(key: RetransmitKey, segments: u64) {
    if let Some(count) = RETRANSMITS.get_ptr_mut(key) {
        // SAFETY: per-CPU value; this CPU is its only writer while we run.
        unsafe { *count += segments };
        return;
    }
    if RETRANSMITS.insert(key, segments, 0).is_err() {
        count_map_error(MAP_ERROR_RETRANSMITS);
    }
}

/// The key of a data retransmit by `sk`; None for handshake states and unreadable sockets.
fn key_of(sk: *const u8) -> Option<RetransmitKey> {
    if sk.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the addresses; offsets come from the kernel's BTF.
    unsafe {
        let state: u8 = bpf_probe_read_kernel(sk.add(global(&SK_STATE_OFFSET) as usize)).ok()?;
        if state == TCP_SYN_SENT || state == TCP_SYN_RECV {
            return None;
        }
        let family: u16 = bpf_probe_read_kernel(sk.add(global(&SK_FAMILY_OFFSET) as usize).cast()).ok()?;
        let mut daddr = [0u8; 16];
        if family == AF_INET {
            let v4: [u8; 4] = bpf_probe_read_kernel(sk.add(global(&SK_DADDR_OFFSET) as usize).cast()).ok()?;
            daddr[..4].copy_from_slice(&v4);
        } else if family == AF_INET6 {
            daddr = bpf_probe_read_kernel(sk.add(global(&SK_V6_DADDR_OFFSET) as usize).cast()).ok()?;
        } else {
            return None;
        }
        let net: *const u8 =
            bpf_probe_read_kernel(sk.add(global(&SK_NET_OFFSET) as usize).cast()).unwrap_or(core::ptr::null());
        let netns = if net.is_null() {
            0
        } else {
            bpf_probe_read_kernel(net.add(global(&NET_INUM_OFFSET) as usize).cast::<u32>()).unwrap_or(0)
        };
        Some(RetransmitKey { netns, family, _pad: 0, daddr })
    }
}

/// Segments in the retransmitted skb (`tcp_skb_pcount`), as TcpRetransSegs counts them;
/// 1 when unreadable.
fn segments_of(skb: *const u8) -> u64 {
    if skb.is_null() {
        return 1;
    }
    let offset = global(&SKB_CB_OFFSET) as usize + global(&TCP_CB_GSO_SEGS_OFFSET) as usize;
    // SAFETY: as above.
    let segments: u16 = unsafe { bpf_probe_read_kernel(skb.add(offset).cast()) }.unwrap_or(1);
    u64::from(segments.max(1))
}
