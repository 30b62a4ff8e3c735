//! Map keys, values and global names shared by the kernel programs and the agent.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of implicit padding, so the bytes
//! the kernel writes are exactly the bytes user space reads.
#![no_std]

/// Per direction counters of one interface, incremented in place by the tc programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectionCounters {
    pub packets: u64,
    /// `skb->len` as tc sees it (L2 frame without FCS).
    pub bytes: u64,
    /// TCP segments with RST set.
    pub tcp_resets: u64,
    /// SYNs (without ACK) repeating the sequence number of an earlier unanswered SYN.
    pub syn_retransmits: u64,
}

impl DirectionCounters {
    pub fn add(&mut self, other: &Self) {
        let Self { packets, bytes, tcp_resets, syn_retransmits } = other;
        self.packets += packets;
        self.bytes += bytes;
        self.tcp_resets += tcp_resets;
        self.syn_retransmits += syn_retransmits;
    }
}

/// Value of [`INTERFACE_COUNTERS_MAP`], keyed by the host-side ifindex (`u32`).
///
/// Direction is tc's: `ingress` is traffic the interface hands to the host (what a pod
/// sends, on a pod veth), `egress` is what the host sends out through it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub ingress: DirectionCounters,
    pub egress: DirectionCounters,
}

impl InterfaceCounters {
    pub fn add(&mut self, other: &Self) {
        self.ingress.add(&other.ingress);
        self.egress.add(&other.egress);
    }
}

/// Key of [`FLOWS_MAP`]: one TCP handshake as seen on one interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub ifindex: u32,
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u16,
    pub _pad: u16,
    /// IPv4 addresses use the first four bytes; the rest stay zero.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Network byte order, as on the wire.
    pub sport: u16,
    pub dport: u16,
}

/// Value of [`FLOWS_MAP`]: the unanswered SYN of a handshake.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// `bpf_ktime_get_ns()` of the latest SYN.
    pub last_syn_ns: u64,
    /// Initial sequence number (host order): a retransmitted SYN repeats it.
    pub syn_seq: u32,
    pub syns: u32,
}

/// Key of [`DROPS_MAP`]: where the kernel freed a packet as dropped, and why.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    /// Inode number of the network namespace of `skb->dev` (0: no device).
    pub netns: u32,
    /// `skb->dev->ifindex` (0: no device).
    pub ifindex: u32,
    /// `enum skb_drop_reason` value, or [`DROP_REASON_UNKNOWN`].
    pub reason: u32,
    pub _pad: u32,
}

/// Reason recorded on kernels whose `kfree_skb` tracepoint has no reason field.
pub const DROP_REASON_UNKNOWN: u32 = u32::MAX;

/// `AF_INET` and `AF_INET6`, as the kernel numbers them.
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// A SYN older than this is a new attempt, not a retransmit (Linux gives up after ~127 s).
pub const SYN_RETRANSMIT_WINDOW_NS: u64 = 130_000_000_000;

/// Indexes into [`MAP_ERRORS_MAP`]: updates the kernel side could not make.
pub const MAP_ERROR_DROPS_FULL: u32 = 0;
pub const MAP_ERROR_INTERFACE_INSERT: u32 = 1;
pub const MAP_ERROR_FLOWS_INSERT: u32 = 2;
pub const MAP_ERROR_SLOTS: u32 = 4;

/// Map names, as the agent looks them up.
pub const INTERFACE_COUNTERS_MAP: &str = "INTERFACE_COUNTERS";
pub const FLOWS_MAP: &str = "FLOWS";
pub const DROPS_MAP: &str = "DROPS";
pub const MAP_ERRORS_MAP: &str = "MAP_ERRORS";

/// Default sizes; the agent may override them at load time.
pub const INTERFACE_COUNTERS_MAX: u32 = 4096;
pub const FLOWS_MAX: u32 = 65_536;
pub const DROPS_MAX: u32 = 16_384;

/// Program names, as the agent looks them up.
pub const TC_INGRESS_PROGRAM: &str = "tc_ingress";
pub const TC_EGRESS_PROGRAM: &str = "tc_egress";
pub const KFREE_SKB_BTF_PROGRAM: &str = "kfree_skb_btf";
pub const KFREE_SKB_TRACEPOINT_PROGRAM: &str = "kfree_skb_tp";

/// Globals set by the agent at load time with kernel offsets resolved from BTF.
pub const GLOBAL_SKB_DEV_OFFSET: &str = "SKB_DEV_OFFSET";
pub const GLOBAL_DEV_IFINDEX_OFFSET: &str = "DEV_IFINDEX_OFFSET";
pub const GLOBAL_DEV_NET_OFFSET: &str = "DEV_NET_OFFSET";
pub const GLOBAL_NET_INUM_OFFSET: &str = "NET_INUM_OFFSET";
/// Offsets of fields in the classic `skb:kfree_skb` tracepoint record (from its format file).
pub const GLOBAL_TP_SKBADDR_OFFSET: &str = "TP_SKBADDR_OFFSET";
pub const GLOBAL_TP_REASON_OFFSET: &str = "TP_REASON_OFFSET";
/// Non-zero when the tracepoint carries a drop reason.
pub const GLOBAL_HAS_REASON: &str = "HAS_REASON";

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all are repr(C), Copy, and have no implicit padding.
    unsafe impl aya::Pod for InterfaceCounters {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for DropKey {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<DirectionCounters>(), 32);
        assert_eq!(size_of::<InterfaceCounters>(), 64);
        assert_eq!(size_of::<FlowKey>(), 4 + 2 + 2 + 16 + 16 + 2 + 2);
        assert_eq!(size_of::<FlowState>(), 16);
        assert_eq!(size_of::<DropKey>(), 16);
    }
}
