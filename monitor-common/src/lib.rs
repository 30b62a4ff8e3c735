//! Map keys, values and global names shared by the kernel programs and the agent.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of implicit padding, so the bytes
//! the kernel writes are exactly the bytes user space reads.
#![no_std]

/// Per direction counters of one interface, incremented in place by the tc programs.
///
/// Every field but the two `unanswered_*_ns` times is a count; per-CPU copies are summed,
/// except those times, whose copies are combined by `max`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectionCounters {
    pub packets: u64,
    /// `skb->len` as tc sees it (L2 frame without FCS).
    pub bytes: u64,
    /// Frames to a group address (broadcast or multicast destination MAC): flooded, or
    /// dropped by a switch's policy, rather than forwarded one in, one out. Read from the
    /// linear part of the packet, where tc always finds the Ethernet header.
    pub group: u64,
    /// TCP segments with RST set.
    pub tcp_resets: u64,
    /// SYNs (without ACK) repeating the sequence number of an earlier unanswered SYN.
    pub syn_retransmits: u64,
    /// Handshakes started: SYNs (without ACK) that are not retransmits.
    pub syns: u64,
    /// Handshakes started in this direction that got their SYN-ACK or RST (seen in the other
    /// direction of the same interface).
    pub syns_answered: u64,
    /// Packets of conversations sending in this direction while nothing came back for
    /// [`UNANSWERED_AFTER_NS`] (see [`Conversation`]): counted from the start of the
    /// one-sided stretch once it is that long.
    pub unanswered: u64,
    /// `bpf_ktime_get_coarse_ns()` at which the latest counted one-sided stretch began.
    pub unanswered_since_ns: u64,
    /// `bpf_ktime_get_coarse_ns()` of the latest packet counted in `unanswered` that more of
    /// its one-sided stretch followed (the packet before the one just counted): where a
    /// disruption's evidence ends, to the jiffy rather than to the agent's sample. The packet
    /// counted last may be the one that is answered (a stretch ends only when the answer
    /// comes): a unicast ARP request re-checking a neighbour once a second after its path came
    /// back would otherwise stretch the end by up to a second. A broadcast ARP request is
    /// itself the latest: the packets for an unresolved neighbour wait for its answer.
    pub unanswered_last_ns: u64,
    /// Of `syns`: handshakes to a service (address and port) not seen answering a handshake
    /// before ([`SERVICES_MAP`]), a port scan's or a firewalled port's; likewise of
    /// `syns_answered` and `syn_retransmits` for those handshakes.
    pub unseen_syns: u64,
    pub unseen_syns_answered: u64,
    pub unseen_syn_retransmits: u64,
}

impl DirectionCounters {
    pub const ZERO: Self = Self {
        packets: 0,
        bytes: 0,
        group: 0,
        tcp_resets: 0,
        syn_retransmits: 0,
        syns: 0,
        syns_answered: 0,
        unanswered: 0,
        unanswered_since_ns: 0,
        unanswered_last_ns: 0,
        unseen_syns: 0,
        unseen_syns_answered: 0,
        unseen_syn_retransmits: 0,
    };

    /// Folds another CPU's copy in: counts add, the times are the latest.
    pub fn add(&mut self, other: &Self) {
        let Self {
            packets,
            bytes,
            group,
            tcp_resets,
            syn_retransmits,
            syns,
            syns_answered,
            unanswered,
            unanswered_since_ns,
            unanswered_last_ns,
            unseen_syns,
            unseen_syns_answered,
            unseen_syn_retransmits,
        } = other;
        self.packets += packets;
        self.bytes += bytes;
        self.group += group;
        self.tcp_resets += tcp_resets;
        self.syn_retransmits += syn_retransmits;
        self.syns += syns;
        self.syns_answered += syns_answered;
        self.unanswered += unanswered;
        self.unanswered_since_ns = self.unanswered_since_ns.max(*unanswered_since_ns);
        self.unanswered_last_ns = self.unanswered_last_ns.max(*unanswered_last_ns);
        self.unseen_syns += unseen_syns;
        self.unseen_syns_answered += unseen_syns_answered;
        self.unseen_syn_retransmits += unseen_syn_retransmits;
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

/// Value of [`INTERFACE_SLOTS_MAP`], a per-CPU array indexed by `ifindex % INTERFACE_SLOTS_MAX`: the
/// counters of the interface whose ifindex it holds (0: free). The agent gives each
/// interface it attaches to its slot when that slot is free, else an entry of
/// [`INTERFACE_COUNTERS_MAP`]: an array lookup is the cheapest a packet can pay.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterfaceSlot {
    pub ifindex: u32,
    pub _pad: u32,
    pub counters: InterfaceCounters,
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
    /// [`FLOW_TO_UNSEEN_SERVICE`], or 0.
    pub flags: u32,
    pub _pad: u32,
}

/// [`FlowState::flags`]: the handshake's service had not been seen answering when its first
/// SYN went out.
pub const FLOW_TO_UNSEEN_SERVICE: u32 = 1;

/// Key of [`SERVICES_MAP`]: a TCP service, the sender of a SYN-ACK (address and port, as on
/// the wire). The value is `bpf_ktime_get_ns()` of its latest SYN-ACK. A SYN to a service that
/// is not in it never worked since the agent (or the pinned maps) started: a scan, a port
/// filtered all along. Such handshakes and their drops are counted apart, as benign-class
/// evidence, so that a steadily firewalled port is no incident, while a service that
/// answered before and stops doing so is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u16,
    /// Network byte order.
    pub port: u16,
    /// IPv4 addresses use the first four bytes, the rest stay zero.
    pub addr: [u8; 16],
}

/// One side of a [`Conversation`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConversationSide {
    /// `bpf_ktime_get_coarse_ns()` of this side's latest packet (0: none yet).
    pub last_ns: u64,
    /// When this side's current one-sided stretch began: its first packet after the other
    /// side's latest one.
    pub since_ns: u64,
    /// Packets in the current stretch.
    pub packets: u32,
    /// [`STRETCH_EXPECTS_ANSWER`] | [`STRETCH_COUNTED`].
    pub flags: u32,
}

/// The stretch is one that normally gets an answer: TCP once the other side ever spoke,
/// UDP and ICMP when it spoke within [`CONVERSATION_NS`] before the stretch began, every
/// ARP request.
pub const STRETCH_EXPECTS_ANSWER: u32 = 1;
/// The stretch's packets so far were counted as unanswered.
pub const STRETCH_COUNTED: u32 = 2;

/// Value of [`CONVERSATIONS_MAP`], an array indexed by a hash of (ifindex, protocol, the two
/// endpoints): the last packets of each side of one conversation (TCP/UDP flow, ICMP or ARP
/// between two addresses). A slot is shared by whatever conversations hash to it; `tag`
/// tells whose it is, and a new owner starts it afresh. Racy by design (no locks): a lost
/// update can only miss or delay one count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conversation {
    /// The full hash of the conversation holding the slot (never 0 once used).
    pub tag: u64,
    /// Side 0 is the endpoint that sorts first (address, then port).
    pub sides: [ConversationSide; 2],
}

/// A stretch of packets with no answer for this long is loss, not latency: pod traffic on a
/// node is answered in well under a millisecond, and even a 300 ms path answers within it
/// (TCP acknowledges within a round trip).
pub const UNANSWERED_AFTER_NS: u64 = 400_000_000;
/// UDP and ICMP: the other side must have spoken this recently for silence to be unexpected.
pub const CONVERSATION_NS: u64 = 1_000_000_000;

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
    /// 0, or the ifindex of the host-side device (`tun0`, a management port, a bridge) that
    /// dropped a packet for a pod's address: then `netns` and `ifindex` are those of the pod's
    /// veth (host side), so that the drop counts for the pod it was meant for
    /// ([`POD_ADDRESSES_MAP`]).
    pub via: u32,
    /// [`DROP_TO_UNSEEN_SERVICE`], or 0.
    pub flags: u32,
}

/// [`DropKey::flags`]: the packet was a TCP SYN to a service not in [`SERVICES_MAP`].
pub const DROP_TO_UNSEEN_SERVICE: u32 = 1;

/// Key of [`POD_ADDRESSES_MAP`]: an address of a pod; the value is the ifindex of the pod's
/// veth on the host side. Filled by the agent from the CNI cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodAddress {
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u16,
    pub _pad: u16,
    /// IPv4 addresses use the first four bytes, the rest stay zero.
    pub addr: [u8; 16],
}

/// Reason recorded on kernels whose `kfree_skb` tracepoint has no reason field.
pub const DROP_REASON_UNKNOWN: u32 = u32::MAX;
/// Reason of a packet lost because its OVS upcall (a kernel datapath miss sent to
/// ovs-vswitchd) failed. Above every kernel reason (subsystems use `n << 16` for small n)
/// and below [`DROP_REASON_UNKNOWN`].
pub const UPCALL_FAILED_REASON: u32 = 0xfffe_0000;
/// Name of [`UPCALL_FAILED_REASON`] in metrics and incidents.
pub const UPCALL_FAILED_NAME: &str = "OVS_UPCALL_FAILED";

/// Key of [`RETRANSMITS_MAP`]: TCP data segments retransmitted by sockets of one network
/// namespace to one destination address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RetransmitKey {
    /// Inode number of the socket's network namespace (0: unreadable).
    pub netns: u32,
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u16,
    pub _pad: u16,
    /// The peer's address; IPv4 addresses use the first four bytes, the rest stay zero.
    pub daddr: [u8; 16],
}

/// `AF_INET` and `AF_INET6`, as the kernel numbers them.
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// A SYN older than this is a new attempt, not a retransmit (Linux gives up after ~127 s).
pub const SYN_RETRANSMIT_WINDOW_NS: u64 = 130_000_000_000;

/// Indexes into [`MAP_ERRORS_MAP`]: updates the kernel side could not make.
pub const MAP_ERROR_DROPS_FULL: u32 = 0;
pub const MAP_ERROR_INTERFACE_INSERT: u32 = 1;
pub const MAP_ERROR_FLOWS_INSERT: u32 = 2;
/// The process event ring buffer was full: a lifecycle event was lost.
pub const MAP_ERROR_PROCESS_EVENTS: u32 = 3;
pub const MAP_ERROR_RETRANSMITS: u32 = 4;
/// Counted by the agent, not the kernel: pod veths and addresses the drop tracer's maps refused.
pub const MAP_ERROR_POD_ADDRESSES: u32 = 5;
/// A SYN-ACK's service could not be remembered ([`SERVICES_MAP`]).
pub const MAP_ERROR_SERVICES_INSERT: u32 = 6;
pub const MAP_ERROR_SLOTS: u32 = 7;

/// Indexes into [`FLOW_TABLE_MAP`] (per-CPU counters of the LRU flow table): handshakes
/// inserted and entries removed when answered. The agent counts the table's entries; what
/// was inserted and is neither answered nor still there was evicted.
pub const FLOW_TABLE_INSERTED: u32 = 0;
pub const FLOW_TABLE_REMOVED: u32 = 1;
pub const FLOW_TABLE_SLOTS: u32 = 2;

/// Map names, as the agent looks them up.
pub const INTERFACE_COUNTERS_MAP: &str = "INTERFACE_COUNTERS";
pub const INTERFACE_SLOTS_MAP: &str = "INTERFACE_SLOTS";
pub const FLOWS_MAP: &str = "FLOWS";
pub const SERVICES_MAP: &str = "SERVICES";
pub const DROPS_MAP: &str = "DROPS";
pub const CONVERSATIONS_MAP: &str = "CONVERSATIONS";
pub const MAP_ERRORS_MAP: &str = "MAP_ERRORS";
pub const FLOW_TABLE_MAP: &str = "FLOW_TABLE";
pub const SDN_COMMS_MAP: &str = "SDN_COMMS";
pub const PROCESS_EVENTS_MAP: &str = "PROCESS_EVENTS";
pub const RETRANSMITS_MAP: &str = "RETRANSMITS";
pub const POD_ADDRESSES_MAP: &str = "POD_ADDRESSES";
/// Host-side ifindexes of the watched pod veths: drops on them stay theirs.
pub const POD_VETHS_MAP: &str = "POD_VETHS";
/// The agent's own state, kept with the maps when they are pinned (`keep_attached`): the count
/// each drop key had when its interface became watched, so that the next agent exports the
/// same drops-since-watched. No program reads it.
pub const DROP_BASELINES_MAP: &str = "DROP_BASELINES";
/// The upcall in flight on each CPU (between `ovs_dp_upcall` and its packet's free).
pub const UPCALL_INFLIGHT_MAP: &str = "UPCALL_INFLIGHT";

/// Default sizes; the agent may override them at load time.
pub const INTERFACE_COUNTERS_MAX: u32 = 4096;
/// Slots of [`INTERFACE_SLOTS_MAP`]: interface `i` may own slot `i % INTERFACE_SLOTS_MAX`
/// (a power of two, so the kernel's modulo is a mask).
pub const INTERFACE_SLOTS_MAX: u32 = 1024;
pub const FLOWS_MAX: u32 = 65_536;
/// TCP services remembered (LRU): far more than a node's pods serve.
pub const SERVICES_MAX: u32 = 16_384;
/// Slots of [`CONVERSATIONS_MAP`] (a power of two: the kernel's modulo is a mask).
pub const CONVERSATIONS_MAX: u32 = 16_384;
pub const DROPS_MAX: u32 = 16_384;
pub const RETRANSMITS_MAX: u32 = 4096;
/// Pod addresses (two per dual-stack pod) and pod veths the drop tracer knows.
pub const POD_ADDRESSES_MAX: u32 = 8192;
pub const POD_VETHS_MAX: u32 = 4096;
/// How many process names the kernel filter holds.
pub const SDN_COMMS_MAX: u32 = 64;
/// Bytes of the process event ring buffer (a power of two, a multiple of the page size).
pub const PROCESS_EVENTS_BYTES: u32 = 256 * 1024;

/// Program names, as the agent looks them up.
pub const TC_INGRESS_PROGRAM: &str = "tc_ingress";
pub const TC_EGRESS_PROGRAM: &str = "tc_egress";
pub const KFREE_SKB_BTF_PROGRAM: &str = "kfree_skb_btf";
pub const KFREE_SKB_TRACEPOINT_PROGRAM: &str = "kfree_skb_tp";
/// On `openvswitch:ovs_dp_upcall` (openvswitch.ko): names failed upcalls' drops.
pub const OVS_UPCALL_PROGRAM: &str = "ovs_upcall";
pub const UPCALL_CONFIG_MAP: &str = "UPCALL_CONFIG";
/// [start, end) of `ovs_dp_process_packet`'s code and of its cold part, from /proc/kallsyms:
/// where a failed upcall's packet is freed. Zeroes: unknown.
pub const UPCALL_SITE_MAP: &str = "UPCALL_SITE";
/// On `sched:sched_process_exec` and `sched:sched_process_exit`.
pub const PROCESS_EXEC_PROGRAM: &str = "process_exec";
pub const PROCESS_EXIT_PROGRAM: &str = "process_exit";
/// On `tp_btf/tcp_retransmit_skb`.
pub const TCP_RETRANSMIT_PROGRAM: &str = "tcp_retransmit";

/// Globals set by the agent at load time with kernel offsets resolved from BTF.
pub const GLOBAL_SKB_DEV_OFFSET: &str = "SKB_DEV_OFFSET";
pub const GLOBAL_DEV_IFINDEX_OFFSET: &str = "DEV_IFINDEX_OFFSET";
pub const GLOBAL_DEV_NET_OFFSET: &str = "DEV_NET_OFFSET";
pub const GLOBAL_NET_INUM_OFFSET: &str = "NET_INUM_OFFSET";
/// What the drop tracer reads to find a dropped packet's destination: `sk_buff.head`,
/// `sk_buff.network_header` and `sk_buff.protocol`; and the host's netns inode, whose
/// devices other than pod veths credit drops to the destination pod.
pub const GLOBAL_SKB_HEAD_OFFSET: &str = "SKB_HEAD_OFFSET";
pub const GLOBAL_SKB_NETWORK_HEADER_OFFSET: &str = "SKB_NETWORK_HEADER_OFFSET";
pub const GLOBAL_SKB_PROTOCOL_OFFSET: &str = "SKB_PROTOCOL_OFFSET";
pub const GLOBAL_HOST_NETNS: &str = "HOST_NETNS";
/// Offsets of fields in the classic `skb:kfree_skb` tracepoint record (from its format file).
pub const GLOBAL_TP_SKBADDR_OFFSET: &str = "TP_SKBADDR_OFFSET";
pub const GLOBAL_TP_REASON_OFFSET: &str = "TP_REASON_OFFSET";
/// Non-zero when the tracepoint carries a drop reason.
pub const GLOBAL_HAS_REASON: &str = "HAS_REASON";
/// `SKB_DROP_REASON_NOT_SPECIFIED`'s value on this kernel (1 before 6.3's `SKB_CONSUMED`, then 2).
pub const GLOBAL_NOT_SPECIFIED_REASON: &str = "NOT_SPECIFIED_REASON";
/// Offsets the process tracer follows from `struct task_struct *` (from BTF).
pub const GLOBAL_TASK_SIGNAL_OFFSET: &str = "TASK_SIGNAL_OFFSET";
pub const GLOBAL_SIGNAL_LIVE_OFFSET: &str = "SIGNAL_LIVE_OFFSET";
pub const GLOBAL_TASK_GROUP_LEADER_OFFSET: &str = "TASK_GROUP_LEADER_OFFSET";
pub const GLOBAL_TASK_COMM_OFFSET: &str = "TASK_COMM_OFFSET";
pub const GLOBAL_SIGNAL_GROUP_EXIT_CODE_OFFSET: &str = "SIGNAL_GROUP_EXIT_CODE_OFFSET";
pub const GLOBAL_TASK_REAL_PARENT_OFFSET: &str = "TASK_REAL_PARENT_OFFSET";
pub const GLOBAL_TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";
/// Offsets the retransmit tracer follows from `struct sock *` (its `struct sock_common`).
pub const GLOBAL_SK_NET_OFFSET: &str = "SK_NET_OFFSET";
pub const GLOBAL_SK_STATE_OFFSET: &str = "SK_STATE_OFFSET";
pub const GLOBAL_SK_FAMILY_OFFSET: &str = "SK_FAMILY_OFFSET";
pub const GLOBAL_SK_DADDR_OFFSET: &str = "SK_DADDR_OFFSET";
pub const GLOBAL_SK_V6_DADDR_OFFSET: &str = "SK_V6_DADDR_OFFSET";
/// Offsets to a retransmitted skb's segment count: `sk_buff.cb`, and `tcp_gso_segs` in the
/// `struct tcp_skb_cb` that TCP keeps there.
pub const GLOBAL_SKB_CB_OFFSET: &str = "SKB_CB_OFFSET";
pub const GLOBAL_TCP_CB_GSO_SEGS_OFFSET: &str = "TCP_CB_GSO_SEGS_OFFSET";
/// Non-zero when `tcp_retransmit_skb` carries an `err` argument (6.13+) and so also fires
/// for retransmits that failed.
pub const GLOBAL_RETRANSMIT_HAS_ERR: &str = "RETRANSMIT_HAS_ERR";
/// Offset of `group_dead` in the `sched:sched_process_exit` record, from its format file
/// (0: the field does not exist, as on 6.1; the program then reads `task->signal->live`).
pub const GLOBAL_TP_GROUP_DEAD_OFFSET: &str = "TP_GROUP_DEAD_OFFSET";
/// The agent's PID namespace as `stat /proc/self/ns/pid` gives it (device, inode): the
/// process tracer marks each report with whether its process is in it (u64 each; 0: unknown).
pub const GLOBAL_AGENT_PIDNS_DEV: &str = "AGENT_PIDNS_DEV";
pub const GLOBAL_AGENT_PIDNS_INO: &str = "AGENT_PIDNS_INO";

/// Length of a kernel task name (`TASK_COMM_LEN`), NUL included.
pub const COMM_LEN: usize = 16;

/// [`ProcessEvent::kind`] values.
pub const PROCESS_EVENT_EXEC: u32 = 1;
pub const PROCESS_EVENT_EXIT: u32 = 2;

/// One record of [`PROCESS_EVENTS_MAP`]: a watched process started (exec) or ended (the
/// last thread of its thread group exited).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the tracepoint.
    pub ktime_ns: u64,
    /// [`PROCESS_EVENT_EXEC`] or [`PROCESS_EVENT_EXIT`].
    pub kind: u32,
    /// Process id (thread group id).
    pub tgid: u32,
    /// Thread group id of the parent (`real_parent->tgid`), 0 if unreadable.
    pub ppid: u32,
    /// Exits: the wait status the parent sees (`signal->group_exit_code`): low 7 bits the
    /// terminating signal, bit 7 core dumped, bits 8..15 the exit status. 0 for exec.
    pub exit_code: u32,
    /// The process's name (the group leader's comm), NUL-padded.
    pub comm: [u8; COMM_LEN],
    /// [`PID_NS_AGENTS`] when the process is in the agent's PID namespace (the host's, with
    /// the DaemonSet's `hostPID`), [`PID_NS_OTHER`] when it is not (a pod's process), or
    /// [`PID_NS_UNCHECKED`] when the agent could not name its namespace.
    pub pid_ns: u32,
    pub reserved: u32,
}

/// [`ProcessEvent::pid_ns`]: the process is in the agent's PID namespace.
pub const PID_NS_AGENTS: u32 = 1;
/// [`ProcessEvent::pid_ns`]: the process is in another PID namespace (a container's).
pub const PID_NS_OTHER: u32 = 0;
/// [`ProcessEvent::pid_ns`]: not checked (the agent's namespace was unknown at load).
pub const PID_NS_UNCHECKED: u32 = 2;

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: all are repr(C), Copy, and have no implicit padding.
    unsafe impl aya::Pod for InterfaceCounters {}
    unsafe impl aya::Pod for InterfaceSlot {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowState {}
    unsafe impl aya::Pod for DropKey {}
    unsafe impl aya::Pod for Conversation {}
    unsafe impl aya::Pod for ProcessEvent {}
    unsafe impl aya::Pod for RetransmitKey {}
    unsafe impl aya::Pod for PodAddress {}
    unsafe impl aya::Pod for ServiceKey {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<DirectionCounters>(), 13 * 8);
        assert_eq!(size_of::<InterfaceCounters>(), 2 * 13 * 8);
        assert_eq!(size_of::<InterfaceSlot>(), 4 + 4 + 2 * 13 * 8);
        assert_eq!(size_of::<ConversationSide>(), 8 + 8 + 4 + 4);
        assert_eq!(size_of::<Conversation>(), 8 + 2 * 24);
        assert!(CONVERSATIONS_MAX.is_power_of_two());
        assert!(INTERFACE_SLOTS_MAX.is_power_of_two());
        assert_eq!(size_of::<FlowKey>(), 4 + 2 + 2 + 16 + 16 + 2 + 2);
        assert_eq!(size_of::<FlowState>(), 8 + 4 + 4 + 4 + 4);
        assert_eq!(size_of::<DropKey>(), 20);
        assert_eq!(size_of::<ServiceKey>(), 2 + 2 + 16);
        assert_eq!(size_of::<RetransmitKey>(), 4 + 2 + 2 + 16);
        assert_eq!(size_of::<PodAddress>(), 2 + 2 + 16);
        assert_eq!(size_of::<ProcessEvent>(), 8 + 4 * 4 + COMM_LEN + 4 + 4);
    }
}
