//! Empty programs for `cargo xtask bench`. Attached beside the real programs on the same
//! hooks, their run time is the cost of being called at all (dispatch, plus the two clock
//! reads that BPF run-time statistics add to every run): the bench subtracts it, so what
//! remains is the cost of the real programs' own work.
#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{btf_tracepoint, classifier, tracepoint},
    programs::{BtfTracePointContext, TcContext, TracePointContext},
};

/// TC_ACT_UNSPEC: like the real tc programs, decide nothing.
#[classifier]
pub fn empty_tc(_ctx: TcContext) -> i32 {
    -1
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn empty_kfree_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[tracepoint(category = "skb", name = "kfree_skb")]
pub fn empty_kfree_tp(_ctx: TracePointContext) -> u32 {
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn empty_exec(_ctx: TracePointContext) -> u32 {
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn empty_exit(_ctx: TracePointContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
