//! Drop tracer on `skb:kfree_skb`: counts per (netns of skb->dev, ifindex, reason).
//!
//! A packet for a pod's address dropped on a host-side device (`tun0`, a management port, a
//! bridge: any device of the host's netns but a pod veth) counts for that pod: under the key
//! of the pod's veth, with the device in `via`. Drops on a pod's own veth stay the pod's,
//! whatever their destination.
//!
//! A dropped TCP SYN to a service never seen answering (`monitor_common::SERVICES_MAP`)
//! carries `DROP_TO_UNSEEN_SERVICE`: a firewalled port's or a scan's, not a lost packet of a
//! flow that worked.
//!
//! rustc emits no CO-RE relocations, so the agent resolves kernel struct offsets from
//! /sys/kernel/btf/vmlinux and hands them over as globals.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::{BtfTracePointContext, TracePointContext},
};
use monitor_common::{
    AF_INET, AF_INET6, DROP_REASON_UNKNOWN, DROP_TO_UNSEEN_SERVICE, DROPS_MAX, DropKey, MAP_ERROR_DROPS_FULL,
    POD_ADDRESSES_MAX, POD_VETHS_MAX, PodAddress, ServiceKey, UPCALL_FAILED_REASON,
};

use crate::{
    packets::{SERVICES, count_map_error},
    upcalls::{UpcallPart, at_upcall_site, upcall_part},
};

/// `SKB_DROP_REASON_NOT_SPECIFIED` on this kernel (its value moved in 6.3).
#[unsafe(no_mangle)]
static NOT_SPECIFIED_REASON: u32 = 0;

#[map(name = "DROPS")]
static DROPS: PerCpuHashMap<DropKey, u64> = PerCpuHashMap::with_max_entries(DROPS_MAX, 0);

#[map(name = "POD_ADDRESSES")]
static POD_ADDRESSES: HashMap<PodAddress, u32> = HashMap::with_max_entries(POD_ADDRESSES_MAX, 0);

/// Written by the agent only (see `monitor_common::DROP_BASELINES_MAP`); not preallocated, as
/// most agents never fill it.
#[map(name = "DROP_BASELINES")]
static DROP_BASELINES: HashMap<DropKey, u64> = HashMap::with_max_entries(DROPS_MAX, BPF_F_NO_PREALLOC);

#[map(name = "POD_VETHS")]
static POD_VETHS: HashMap<u32, u32> = HashMap::with_max_entries(POD_VETHS_MAX, 0);

#[unsafe(no_mangle)]
static SKB_DEV_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_HEAD_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_NETWORK_HEADER_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SKB_PROTOCOL_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static HOST_NETNS: u32 = 0;
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
    let location: u64 = ctx.arg(1);
    let reason = if global(&HAS_REASON) != 0 { ctx.arg::<u32>(2) } else { DROP_REASON_UNKNOWN };
    record_drop(skb, reason, location);
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
    // The location is left unread here: failed upcalls are then told by address and time.
    record_drop(skb as *const u8, reason, 0);
    0
}

/// `location`: the address the drop was called from (0: unknown).
fn record_drop(skb: *const u8, mut reason: u32, location: u64) {
    let device = device_of(skb);
    if reason == global(&NOT_SPECIFIED_REASON) || reason == DROP_REASON_UNKNOWN {
        match upcall_part(skb, device.is_some() || protocol_of(skb) != 0, at_upcall_site(location)) {
            // The packet of an OVS upcall that just failed on this CPU: named by the failure.
            UpcallPart::Packet => reason = UPCALL_FAILED_REASON,
            // The upcall's refused netlink message: no packet; the packet's drop follows.
            UpcallPart::Message => return,
            UpcallPart::Neither => {}
        }
    }
    let (netns, ifindex) = device.unwrap_or((0, 0));
    let packet = network_header(skb);
    let flags = match packet {
        Some((family, ip)) if syn_to_unseen_service(family, ip) => DROP_TO_UNSEEN_SERVICE,
        _ => 0,
    };
    let key = match packet.and_then(|(family, ip)| pod_destination(family, ip, netns, ifindex)) {
        Some(veth) => DropKey { netns, ifindex: veth, reason, via: ifindex, flags },
        None => DropKey { netns, ifindex, reason, via: 0, flags },
    };
    record_drop_on(key);
}

/// The packet's family and its network header, when it is IPv4 or IPv6 and the header is set.
fn network_header(skb: *const u8) -> Option<(u16, *const u8)> {
    // SAFETY: bpf_probe_read_kernel checks the addresses; offsets come from the kernel's BTF.
    unsafe {
        let family = match u16::from_be(protocol_of(skb)) {
            0x0800 => AF_INET,
            0x86dd => AF_INET6,
            _ => return None,
        };
        let head: *const u8 = bpf_probe_read_kernel(skb.add(global(&SKB_HEAD_OFFSET) as usize).cast()).ok()?;
        let network: u16 = bpf_probe_read_kernel(skb.add(global(&SKB_NETWORK_HEADER_OFFSET) as usize).cast()).ok()?;
        // An unset network header is all ones.
        if head.is_null() || network == u16::MAX {
            return None;
        }
        Some((family, head.add(usize::from(network))))
    }
}

const IPPROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// Whether the packet at `ip` is a TCP SYN (without ACK) to a service not in SERVICES. IPv6
/// extension headers are not followed (such a packet counts as seen).
fn syn_to_unseen_service(family: u16, ip: *const u8) -> bool {
    let mut service = ServiceKey { family, ..ServiceKey::default() };
    // SAFETY: bpf_probe_read_kernel checks the addresses.
    let tcp = unsafe {
        if family == AF_INET {
            // Version and IHL, ..., protocol at 9, destination at 16.
            let Ok(header) = bpf_probe_read_kernel(ip.cast::<[u8; 20]>()) else { return false };
            if header[9] != IPPROTO_TCP || u16::from_be_bytes([header[6], header[7]]) & 0x1fff != 0 {
                return false;
            }
            service.addr[..4].copy_from_slice(&header[16..20]);
            ip.add(usize::from(header[0] & 0x0f) * 4)
        } else {
            let Ok(next) = bpf_probe_read_kernel(ip.add(6)) else { return false };
            if next != IPPROTO_TCP {
                return false;
            }
            let Ok(daddr) = bpf_probe_read_kernel(ip.add(24).cast::<[u8; 16]>()) else { return false };
            service.addr = daddr;
            ip.add(40)
        }
    };
    // SAFETY: as above: ports (4 bytes), sequence and acknowledgment numbers, offset, flags.
    let Ok(header) = (unsafe { bpf_probe_read_kernel(tcp.cast::<[u8; 14]>()) }) else { return false };
    if header[13] & (TCP_SYN | TCP_ACK) != TCP_SYN {
        return false;
    }
    service.port = u16::from_ne_bytes([header[2], header[3]]);
    // SAFETY: a plain lookup; the value is plain data.
    unsafe { SERVICES.get(service) }.is_none()
}

/// The host-side veth of the pod a packet dropped on host device (`netns`, `ifindex`) was
/// addressed to; None for drops outside the host's netns, on pod veths, or not for a pod.
fn pod_destination(family: u16, ip: *const u8, netns: u32, ifindex: u32) -> Option<u32> {
    let host = global(&HOST_NETNS);
    // SAFETY: plain lookups; the maps hold plain data.
    if host == 0 || netns != host || unsafe { POD_VETHS.get(ifindex) }.is_some() {
        return None;
    }
    let mut key = PodAddress { family, ..PodAddress::default() };
    // SAFETY: bpf_probe_read_kernel checks the addresses.
    unsafe {
        if family == AF_INET {
            let daddr: [u8; 4] = bpf_probe_read_kernel(ip.add(16).cast()).ok()?;
            key.addr[..4].copy_from_slice(&daddr);
        } else {
            key.addr = bpf_probe_read_kernel(ip.add(24).cast()).ok()?;
        }
        POD_ADDRESSES.get(key).copied().filter(|veth| *veth != ifindex)
    }
}

/// Counts one drop under `key`.
fn record_drop_on(key: DropKey) {
    if let Some(count) = DROPS.get_ptr_mut(key) {
        // SAFETY: per-CPU value; this CPU is its only writer while we run.
        unsafe { *count += 1 };
        return;
    }
    if DROPS.insert(key, 1, 0).is_err() {
        count_map_error(MAP_ERROR_DROPS_FULL);
    }
}

/// skb->protocol (network byte order; 0 when unset, as in netlink messages).
fn protocol_of(skb: *const u8) -> u16 {
    // SAFETY: bpf_probe_read_kernel checks the address; the offset comes from the kernel's BTF.
    unsafe { bpf_probe_read_kernel(skb.add(global(&SKB_PROTOCOL_OFFSET) as usize).cast()) }.unwrap_or(0)
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
