//! Drop tracer on `skb:kfree_skb`: counts per (netns of skb->dev, ifindex, reason).
//!
//! rustc emits no CO-RE relocations, so the agent resolves kernel struct offsets from
//! /sys/kernel/btf/vmlinux and hands them over as globals.

use core::ptr::read_volatile;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, map, tracepoint},
    maps::PerCpuHashMap,
    programs::{BtfTracePointContext, TracePointContext},
};
use monitor_common::{DROP_REASON_UNKNOWN, DROPS_MAX, DropKey, MAP_ERROR_DROPS_FULL, UPCALL_FAILED_REASON};

use crate::{packets::count_map_error, upcalls::is_failed_upcall};

/// `SKB_DROP_REASON_NOT_SPECIFIED` on this kernel (its value moved in 6.3).
#[unsafe(no_mangle)]
static NOT_SPECIFIED_REASON: u32 = 0;

#[map(name = "DROPS")]
static DROPS: PerCpuHashMap<DropKey, u64> = PerCpuHashMap::with_max_entries(DROPS_MAX, 0);

#[unsafe(no_mangle)]
static SKB_DEV_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_IFINDEX_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static DEV_NET_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
pub(crate) static NET_INUM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_SKBADDR_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_REASON_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HAS_REASON: u32 = 0;

fn global(value: &'static u32) -> u32 {
    // SAFETY: the agent fills these before load; volatile keeps rustc from folding the 0.
    unsafe { read_volatile(value) }
}

/// tp_btf: arguments are (struct sk_buff *skb, void *location, enum skb_drop_reason reason, …).
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_btf(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let reason = if global(&HAS_REASON) != 0 { ctx.arg::<u32>(2) } else { DROP_REASON_UNKNOWN };
    record_drop(skb, reason);
    0
}

/// Classic tracepoint, for kernels without tp_btf: field offsets come from its format file.
#[tracepoint(category = "skb", name = "kfree_skb")]
pub fn kfree_skb_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets come from the tracepoint's own format file.
    let Ok(skb) = (unsafe { ctx.read_at::<u64>(global(&TP_SKBADDR_OFFSET) as usize) }) else {
        return 0;
    };
    // Offset 0 holds common_type: a zero reason offset means the field does not exist.
    let reason = match global(&TP_REASON_OFFSET) {
        0 => DROP_REASON_UNKNOWN,
        // SAFETY: as above.
        offset => unsafe { ctx.read_at::<u32>(offset as usize) }.unwrap_or(DROP_REASON_UNKNOWN),
    };
    record_drop(skb as *const u8, reason);
    0
}

fn record_drop(skb: *const u8, mut reason: u32) {
    // The packet of an OVS upcall that just failed on this CPU: named by the failure.
    if (reason == global(&NOT_SPECIFIED_REASON) || reason == DROP_REASON_UNKNOWN) && is_failed_upcall(skb) {
        reason = UPCALL_FAILED_REASON;
    }
    let (netns, ifindex) = device_of(skb).unwrap_or((0, 0));
    record_drop_on(netns, ifindex, reason);
}

/// Counts one drop on (netns, ifindex) with `reason`.
fn record_drop_on(netns: u32, ifindex: u32, reason: u32) {
    let key = DropKey { netns, ifindex, reason, _pad: 0 };
    if let Some(count) = DROPS.get_ptr_mut(key) {
        // SAFETY: per-CPU value; this CPU is its only writer while we run.
        unsafe { *count += 1 };
        return;
    }
    if DROPS.insert(key, 1, 0).is_err() {
        count_map_error(MAP_ERROR_DROPS_FULL);
    }
}

/// (netns inode, ifindex) of skb->dev.
fn device_of(skb: *const u8) -> Option<(u32, u32)> {
    // SAFETY: bpf_probe_read_kernel checks the addresses; offsets come from the kernel's BTF.
    unsafe {
        let dev: *const u8 = bpf_probe_read_kernel(skb.add(global(&SKB_DEV_OFFSET) as usize).cast()).ok()?;
        if dev.is_null() {
            return None;
        }
        let ifindex: u32 = bpf_probe_read_kernel(dev.add(global(&DEV_IFINDEX_OFFSET) as usize).cast()).ok()?;
        let net: *const u8 = bpf_probe_read_kernel(dev.add(global(&DEV_NET_OFFSET) as usize).cast()).ok()?;
        let netns = if net.is_null() {
            0
        } else {
            bpf_probe_read_kernel(net.add(global(&NET_INUM_OFFSET) as usize).cast::<u32>()).unwrap_or(0)
        };
        Some((netns, ifindex))
    }
}
