//! datapath-monitor's kernel programs: packet counters on watched interfaces, a drop
//! tracer, a process tracer and a TCP retransmit tracer. Per-packet work is O(1): look up,
//! increment in place.
#![no_std]
#![no_main]

mod drops;
mod packets;
mod process;
mod retransmits;
mod upcalls;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// bpf_probe_read_kernel is GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
