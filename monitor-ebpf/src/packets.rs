//! tc programs on watched interfaces: packets, bytes, TCP resets, handshakes (started,
//! answered, retransmitted) and unanswered conversations.
//!
//! Every packet pays for the per-interface counters; IPv4/IPv6 TCP, UDP and ICMP packets and
//! ARP also for one array slot of [`CONVERSATIONS`] (no hash map, no lock); only SYN and RST
//! segments touch the flow table.

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    macros::{classifier, map},
    maps::{Array, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::TcContext,
};
use monitor_common::{
    AF_INET, AF_INET6, CONVERSATION_NS, CONVERSATIONS_MAX, Conversation, ConversationSide, DirectionCounters,
    FLOW_TABLE_INSERTED, FLOW_TABLE_REMOVED, FLOW_TABLE_SLOTS, FLOW_TO_UNSEEN_SERVICE, FLOWS_MAX, FlowKey, FlowState,
    INTERFACE_COUNTERS_MAX, INTERFACE_SLOTS_MAX, InterfaceCounters, InterfaceSlot, MAP_ERROR_FLOWS_INSERT,
    MAP_ERROR_INTERFACE_INSERT, MAP_ERROR_SERVICES_INSERT, MAP_ERROR_SLOTS, SERVICES_MAX, STRETCH_COUNTED,
    STRETCH_EXPECTS_ANSWER, SYN_RETRANSMIT_WINDOW_NS, ServiceKey, UNANSWERED_AFTER_NS,
};

#[map(name = "INTERFACE_COUNTERS")]
static INTERFACE_COUNTERS: PerCpuHashMap<u32, InterfaceCounters> =
    PerCpuHashMap::with_max_entries(INTERFACE_COUNTERS_MAX, 0);

#[map(name = "INTERFACE_SLOTS")]
static INTERFACE_SLOTS: PerCpuArray<InterfaceSlot> = PerCpuArray::with_max_entries(INTERFACE_SLOTS_MAX, 0);

#[map(name = "FLOWS")]
static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(FLOWS_MAX, 0);

/// TCP services seen answering a handshake (see `monitor_common::ServiceKey`); read by the
/// drop tracer too.
#[map(name = "SERVICES")]
pub(crate) static SERVICES: LruHashMap<ServiceKey, u64> = LruHashMap::with_max_entries(SERVICES_MAX, 0);

#[map(name = "FLOW_TABLE")]
static FLOW_TABLE: PerCpuArray<u64> = PerCpuArray::with_max_entries(FLOW_TABLE_SLOTS, 0);

#[map(name = "CONVERSATIONS")]
static CONVERSATIONS: Array<Conversation> = Array::with_max_entries(CONVERSATIONS_MAX, 0);

#[map(name = "MAP_ERRORS")]
pub(crate) static MAP_ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAP_ERROR_SLOTS, 0);

/// A new interface's counters.
static NO_COUNTS: InterfaceCounters =
    InterfaceCounters { ingress: DirectionCounters::ZERO, egress: DirectionCounters::ZERO };

/// Let the next program (a CNI's, say) or the default action decide: we only observe.
const TC_ACT_UNSPEC: i32 = -1;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_ARP: u16 = 0x0806;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const ARP_REQUEST: u16 = 1;
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
    // The I/G bit of the destination MAC (the first bit on the wire, the lowest of the first
    // byte): a broadcast or multicast frame. Read in place, a register's worth: a stack copy
    // would take the programs past Linux 6.1's 512-byte combined stack.
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + 4 <= end {
        // SAFETY: 4 bytes, bounds checked against data_end just above.
        let first = unsafe { (start as *const u32).read_unaligned() };
        if u32::from_le(first) & 1 == 1 {
            direction.group += 1;
        }
    }
    let _ = observe_packet(ctx, ifindex, counters, ingress);
}

/// The interface's slot when the agent gave it one (an array lookup, inlined by the
/// verifier), else its hash entry, which the agent creates when it attaches; create it here
/// only if it raced us.
#[inline(always)]
#[expect(clippy::needless_borrows_for_generic_args, reason = "by value, the zeroed counters are copied to the stack")]
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
    // From a zeroed global, not a stack copy: the programs' frames stay within Linux 6.1's
    // 512-byte combined stack.
    if INTERFACE_COUNTERS.insert(ifindex, &NO_COUNTS, 0).is_err() {
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

/// One endpoint of a conversation: address (IPv4 in the first word) and port (0 for ICMP
/// and ARP), as read from the wire.
#[derive(Clone, Copy)]
struct Endpoint {
    address: [u64; 2],
    port: u16,
}

impl Endpoint {
    fn sorts_before(&self, other: &Endpoint) -> bool {
        (self.address[0], self.address[1], self.port) < (other.address[0], other.address[1], other.port)
    }
}

/// What the answer to a one-sided stretch of this packet's conversation is expected from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expects {
    /// TCP: the other side acknowledges whatever it gets, so once it spoke at all, silence
    /// from it while this side sends is loss.
    OnceAnswered,
    /// UDP, ICMP: only if it spoke just before the stretch (many UDP streams are one-way).
    JustAnswered,
    /// An ARP request always expects its reply.
    Always,
    /// ARP replies expect nothing.
    Nothing,
}

fn observe_packet(ctx: &TcContext, ifindex: u32, counters: &mut InterfaceCounters, ingress: bool) -> Result<(), i64> {
    // skb->protocol: the ethertype, without touching the packet.
    // SAFETY: ctx.skb.skb is the program's context pointer.
    let protocol = u16::from_be(unsafe { (*ctx.skb.skb.cast::<__sk_buff>()).protocol } as u16);
    let (family, proto, l4, source, destination) = match protocol {
        ETH_P_IP => {
            let ip: [u8; IPV4_HLEN] = read(ctx, ETH_HLEN)?;
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let fragment_offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            // Later fragments carry no ports: the first one stands for the datagram.
            if ihl < IPV4_HLEN || fragment_offset != 0 {
                return Ok(());
            }
            let word = |at: usize| u64::from(u32::from_ne_bytes([ip[at], ip[at + 1], ip[at + 2], ip[at + 3]]));
            let source = Endpoint { address: [word(12), 0], port: 0 };
            let destination = Endpoint { address: [word(16), 0], port: 0 };
            (AF_INET, ip[9], ETH_HLEN + ihl, source, destination)
        }
        ETH_P_IPV6 => {
            // Extension headers before the transport header are rare on pod networks and not followed.
            let ip: [u8; IPV6_HLEN] = read(ctx, ETH_HLEN)?;
            let half = |at: usize| {
                u64::from_ne_bytes([
                    ip[at],
                    ip[at + 1],
                    ip[at + 2],
                    ip[at + 3],
                    ip[at + 4],
                    ip[at + 5],
                    ip[at + 6],
                    ip[at + 7],
                ])
            };
            let source = Endpoint { address: [half(8), half(16)], port: 0 };
            let destination = Endpoint { address: [half(24), half(32)], port: 0 };
            (AF_INET6, ip[6], ETH_HLEN + IPV6_HLEN, source, destination)
        }
        ETH_P_ARP => return observe_arp(ctx, ifindex, counters, ingress),
        _ => return Ok(()),
    };
    let (mut source, mut destination) = (source, destination);
    let expects = match proto {
        IPPROTO_TCP => {
            // Ports, sequence number, acknowledgment number, data offset and flags.
            let tcp: [u8; 14] = read(ctx, l4)?;
            source.port = u16::from_ne_bytes([tcp[0], tcp[1]]);
            destination.port = u16::from_ne_bytes([tcp[2], tcp[3]]);
            let flags = tcp[13];
            // Most segments are neither SYN nor RST: no flow key and no flow-table access for them.
            if flags & (TCP_SYN | TCP_RST) != 0 {
                handshake(ctx, ifindex, family, &tcp, counters, ingress)?;
            }
            Expects::OnceAnswered
        }
        IPPROTO_UDP => {
            let ports: [u8; 4] = read(ctx, l4)?;
            source.port = u16::from_ne_bytes([ports[0], ports[1]]);
            destination.port = u16::from_ne_bytes([ports[2], ports[3]]);
            Expects::JustAnswered
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => Expects::JustAnswered,
        _ => return Ok(()),
    };
    let direction = if ingress { &mut counters.ingress } else { &mut counters.egress };
    converse(direction, ifindex, proto, &source, &destination, expects, false);
    Ok(())
}

/// ARP over Ethernet/IPv4: a request from its sender for its target, a reply the other way.
fn observe_arp(ctx: &TcContext, ifindex: u32, counters: &mut InterfaceCounters, ingress: bool) -> Result<(), i64> {
    // Hardware type .. opcode (8 bytes), sender MAC, sender IP, target MAC, target IP.
    let arp: [u8; 28] = read(ctx, ETH_HLEN)?;
    let opcode = u16::from_be_bytes([arp[6], arp[7]]);
    let sender = u64::from(u32::from_ne_bytes([arp[14], arp[15], arp[16], arp[17]]));
    let target = u64::from(u32::from_ne_bytes([arp[24], arp[25], arp[26], arp[27]]));
    // Gratuitous ARP and address probes (sender 0) ask nobody.
    if sender == target || sender == 0 {
        return Ok(());
    }
    let expects = if opcode == ARP_REQUEST { Expects::Always } else { Expects::Nothing };
    // A broadcast request resolves a neighbour not known yet: the sender's packets for it wait
    // in the neighbour's queue until the reply, so the request answered is where their outage
    // ends. A unicast request re-checks a known neighbour while traffic goes on using it.
    let destination_mac: [u8; 6] = read(ctx, 0)?;
    let holds_traffic = opcode == ARP_REQUEST && destination_mac == [0xff; 6];
    let direction = if ingress { &mut counters.ingress } else { &mut counters.egress };
    let source = Endpoint { address: [sender, 0], port: 0 };
    let destination = Endpoint { address: [target, 0], port: 0 };
    converse(direction, ifindex, 0, &source, &destination, expects, holds_traffic);
    Ok(())
}

#[inline(always)]
fn mix(value: u64) -> u64 {
    let value = (value ^ (value >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    value ^ (value >> 29)
}

/// Updates the conversation of this packet and counts its packets as unanswered once this
/// side has sent for [`UNANSWERED_AFTER_NS`] with nothing back, where an answer is expected.
/// `holds_traffic`: other packets wait for this one's answer (see [`observe_arp`]), so the
/// stretch's outage lasts up to this packet, answered or not.
#[inline(always)]
fn converse(
    direction: &mut DirectionCounters,
    ifindex: u32,
    proto: u8,
    source: &Endpoint,
    destination: &Endpoint,
    expects: Expects,
    holds_traffic: bool,
) {
    let (low, high, side) =
        if source.sorts_before(destination) { (source, destination, 0) } else { (destination, source, 1) };
    let mut hash = mix((u64::from(ifindex) << 8) | u64::from(proto));
    hash = mix(hash ^ low.address[0]);
    hash = mix(hash ^ low.address[1]);
    hash = mix(hash ^ high.address[0]);
    hash = mix(hash ^ high.address[1]);
    let tag = mix(hash ^ ((u64::from(low.port) << 16) | u64::from(high.port))) | 1;
    let Some(slot) = CONVERSATIONS.get_ptr_mut((tag >> 32) as u32 & (CONVERSATIONS_MAX - 1)) else {
        return;
    };
    // SAFETY: a shared array slot; concurrent writers can only make us miss or delay a count.
    let slot = unsafe { &mut *slot };
    if slot.tag != tag {
        *slot = Conversation { tag, sides: [ConversationSide::default(); 2] };
    }
    // SAFETY: bpf_ktime_get_coarse_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let [zero, one] = &mut slot.sides;
    let (this, other_last) = if side == 0 { (zero, one.last_ns) } else { (one, zero.last_ns) };
    if this.since_ns == 0 || other_last >= this.since_ns {
        // The other side spoke since this side's stretch began: a new stretch.
        let expected = match expects {
            Expects::OnceAnswered => other_last != 0,
            Expects::JustAnswered => other_last != 0 && now.saturating_sub(other_last) <= CONVERSATION_NS,
            Expects::Always => true,
            Expects::Nothing => false,
        };
        *this = ConversationSide {
            last_ns: now,
            since_ns: now,
            packets: 0,
            flags: if expected { STRETCH_EXPECTS_ANSWER } else { 0 },
        };
    }
    // The stretch's packet before this one: this one may yet be answered, that one was not.
    // Unless packets wait for this one's answer: they were held until it came.
    let before = if holds_traffic { now } else { this.last_ns };
    this.packets += 1;
    this.last_ns = now;
    if this.flags & STRETCH_EXPECTS_ANSWER != 0 && now.saturating_sub(this.since_ns) >= UNANSWERED_AFTER_NS {
        if this.flags & STRETCH_COUNTED == 0 {
            // The whole stretch so far, once: it is as old as its first packet.
            this.flags |= STRETCH_COUNTED;
            direction.unanswered += u64::from(this.packets);
            direction.unanswered_since_ns = direction.unanswered_since_ns.max(this.since_ns);
        } else {
            direction.unanswered += 1;
        }
        direction.unanswered_last_ns = direction.unanswered_last_ns.max(before);
    }
}

/// SYN and RST segments: handshakes started, answered and retransmitted, resets.
/// `tcp` holds the TCP header's first 14 bytes.
fn handshake(
    ctx: &TcContext,
    ifindex: u32,
    family: u16,
    tcp: &[u8; 14],
    counters: &mut InterfaceCounters,
    ingress: bool,
) -> Result<(), i64> {
    let mut key = FlowKey { ifindex, family, ..FlowKey::default() };
    if family == AF_INET {
        let addresses: [u8; 8] = read(ctx, ETH_HLEN + 12)?;
        key.saddr[..4].copy_from_slice(&addresses[..4]);
        key.daddr[..4].copy_from_slice(&addresses[4..]);
    } else {
        key.saddr = read(ctx, ETH_HLEN + 8)?;
        key.daddr = read(ctx, ETH_HLEN + 24)?;
    }
    key.sport = u16::from_ne_bytes([tcp[0], tcp[1]]);
    key.dport = u16::from_ne_bytes([tcp[2], tcp[3]]);
    let flags = tcp[13];
    let (this, other) = if ingress {
        (&mut counters.ingress, &mut counters.egress)
    } else {
        (&mut counters.egress, &mut counters.ingress)
    };
    if flags & TCP_RST != 0 {
        this.tcp_resets += 1;
    }
    if flags & TCP_RST != 0 || flags & TCP_ACK != 0 {
        // A SYN-ACK or a reset answers the handshake the other direction started.
        let reversed = reversed(&key);
        // SAFETY: a plain lookup; the value is plain data.
        let unseen = unsafe { FLOWS.get(reversed) }.map(|state| state.flags & FLOW_TO_UNSEEN_SERVICE != 0);
        if let Some(unseen) = unseen
            && FLOWS.remove(reversed).is_ok()
        {
            other.syns_answered += 1;
            if unseen {
                other.unseen_syns_answered += 1;
            }
            count_flow_table(FLOW_TABLE_REMOVED);
        }
        if flags & TCP_RST == 0 {
            // A SYN-ACK: its sender is a service that works.
            service_answered(&key);
        }
    } else {
        syn_seen(&key, u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]), this);
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
            if state.flags & FLOW_TO_UNSEEN_SERVICE != 0 {
                direction.unseen_syn_retransmits += 1;
            }
            state.syns += 1;
        } else {
            // The same ports again with a new sequence number: a new handshake.
            state.flags = service_flags(key);
            count_syn(direction, state.flags);
            state.syn_seq = seq;
            state.syns = 1;
        }
        state.last_syn_ns = now;
        return;
    }
    let flags = service_flags(key);
    count_syn(direction, flags);
    let state = FlowState { last_syn_ns: now, syn_seq: seq, syns: 1, flags, _pad: 0 };
    if FLOWS.insert(key, state, 0).is_err() {
        count_map_error(MAP_ERROR_FLOWS_INSERT);
    } else {
        count_flow_table(FLOW_TABLE_INSERTED);
    }
}

#[inline(always)]
fn count_syn(direction: &mut DirectionCounters, flags: u32) {
    direction.syns += 1;
    if flags & FLOW_TO_UNSEEN_SERVICE != 0 {
        direction.unseen_syns += 1;
    }
}

/// The service a SYN of `key` goes to, as [`ServiceKey`].
#[inline(always)]
fn service_of(family: u16, addr: &[u8; 16], port: u16) -> ServiceKey {
    ServiceKey { family, port, addr: *addr }
}

/// [`FLOW_TO_UNSEEN_SERVICE`] when the SYN's destination never answered a handshake.
#[inline(always)]
fn service_flags(key: &FlowKey) -> u32 {
    let service = service_of(key.family, &key.daddr, key.dport);
    // SAFETY: a plain lookup; the value is plain data.
    if unsafe { SERVICES.get(service) }.is_some() { 0 } else { FLOW_TO_UNSEEN_SERVICE }
}

/// A SYN-ACK from `key`'s source: that service works. A lookup first: most SYN-ACKs come from
/// services already known, and an LRU update costs more than a lookup.
#[inline(always)]
fn service_answered(key: &FlowKey) {
    let service = service_of(key.family, &key.saddr, key.sport);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(seen) = SERVICES.get_ptr_mut(service) {
        // SAFETY: a plain u64; a racing writer only moves the time.
        unsafe { *seen = now };
        return;
    }
    if SERVICES.insert(service, now, 0).is_err() {
        count_map_error(MAP_ERROR_SERVICES_INSERT);
    }
}

fn count_flow_table(slot: u32) {
    if let Some(counter) = FLOW_TABLE.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *counter += 1 };
    }
}

fn reversed(key: &FlowKey) -> FlowKey {
    FlowKey { saddr: key.daddr, daddr: key.saddr, sport: key.dport, dport: key.sport, ..*key }
}
