//! Which network interfaces of this network namespace are watched, and a netlink watch
//! that reports them appearing, changing and disappearing.
//!
//! One rtnetlink socket carries both the link subscription and the link dump, and its
//! messages are applied in the order the kernel queued them (events that arrive during the
//! dump update the same table), so no change between subscribing and dumping is lost. The
//! kernel names a veth peer's network namespace only by an nsid relative to ours; the
//! resolver below maps nsids to netns inodes by asking the kernel about netns files.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    time::Duration,
};

use globset::{Glob, GlobSet, GlobSetBuilder};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::{LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage},
    nsid::{NsidAttribute, NsidMessage},
};
use rtnetlink::{
    packet_core::{NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage, NetlinkPayload},
    sys::{AsyncSocket, AsyncSocketExt, Socket, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE},
};
use tokio::{sync::mpsc, time::Instant};
use tracing::{debug, error, info, warn};

/// rtnetlink multicast groups (`RTNLGRP_*` in `linux/rtnetlink.h`).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NSID: u32 = 28;
/// Events buffered for a slow consumer; beyond this the socket queue fills and we resync.
const EVENT_QUEUE: usize = 1024;
/// Room for a burst of link notifications (a node starting hundreds of pods).
const RECEIVE_BUFFER: usize = 4 << 20;
/// At most one netns rescan per interval, so a flood of veths cannot make it spin.
const RESCAN_INTERVAL: Duration = Duration::from_secs(1);
/// Where `ip netns` and container runtimes pin network namespaces.
const PINNED_NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];
/// This thread's netns: `/proc/self` would name the main thread's, which differs in tests.
const OWN_NETNS: &str = "/proc/thread-self/ns/net";

#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    #[error("invalid interface glob {glob:?}")]
    Glob {
        glob: String,
        #[source]
        source: globset::Error,
    },
    #[error("building the interface glob set")]
    GlobSet(#[source] globset::Error),
    #[error("netlink: {op}")]
    Netlink {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("reading network namespace {path}")]
    Netns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn netlink_error(op: &'static str) -> impl FnOnce(io::Error) -> InterfaceError {
    move |source| InterfaceError::Netlink { op, source }
}

/// Decides which links are watched: pod veths and include globs, minus exclude globs.
#[derive(Clone, Debug)]
pub struct InterfaceFilter {
    include: GlobSet,
    exclude: GlobSet,
}

impl InterfaceFilter {
    /// Default include globs: veth*, br0, tun0, vxlan_sys_*, genev_sys_*, br-int, br-ex, ovn-k8s-mp*.
    pub const DEFAULT_INCLUDE: &'static [&'static str] =
        &["veth*", "br0", "tun0", "vxlan_sys_*", "genev_sys_*", "br-int", "br-ex", "ovn-k8s-mp*"];

    /// `include` is used as given: an empty list watches pod veths only.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, InterfaceError> {
        Ok(Self { include: glob_set(include)?, exclude: glob_set(exclude)? })
    }

    /// Watched = (host-side veth whose peer is in another netns) OR name matches an include
    /// glob; AND name matches no exclude glob.
    pub fn watches(&self, link: &LinkFacts) -> bool {
        (link.is_pod_veth() || self.include.is_match(&link.name)) && !self.exclude.is_match(&link.name)
    }
}

fn glob_set(globs: &[String]) -> Result<GlobSet, InterfaceError> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        let parsed = Glob::new(glob).map_err(|source| InterfaceError::Glob { glob: glob.clone(), source })?;
        builder.add(parsed);
    }
    builder.build().map_err(InterfaceError::GlobSet)
}

/// What netlink says about one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkFacts {
    pub ifindex: u32,
    pub name: String,
    /// IFLA_INFO_KIND, e.g. "veth", "openvswitch", "vxlan"; None for devices without one.
    pub kind: Option<String>,
    /// Link layer type ARPHRD_ETHER (tc programs parse Ethernet).
    pub is_ethernet: bool,
    /// IFF_UP: administratively up.
    pub up: bool,
    /// IFF_RUNNING: operationally up (RFC 2863 state UP, or UNKNOWN for devices that do not track it).
    pub oper_up: bool,
    /// For a veth: its peer, from IFLA_LINK (+ IFLA_LINK_NETNSID when in another netns).
    pub peer: Option<PeerLink>,
}

impl LinkFacts {
    /// A host-side veth whose peer lives in another network namespace (a pod's).
    pub fn is_pod_veth(&self) -> bool {
        self.kind.as_deref() == Some("veth") && self.peer.as_ref().is_some_and(|peer| peer.netnsid.is_some())
    }

    /// Reads an RTM_NEWLINK/RTM_DELLINK message; None when it carries no name.
    fn from_message(message: &LinkMessage) -> Option<Self> {
        let (mut name, mut kind, mut link, mut netnsid) = (None, None, None, None);
        for attribute in &message.attributes {
            match attribute {
                LinkAttribute::IfName(value) => name = Some(value.clone()),
                LinkAttribute::Link(ifindex) => link = Some(*ifindex),
                LinkAttribute::LinkNetNsId(id) => netnsid = Some(*id),
                LinkAttribute::LinkInfo(infos) => {
                    kind = infos.iter().find_map(|info| match info {
                        LinkInfo::Kind(kind) => Some(kind.to_string()),
                        _ => None,
                    });
                }
                _ => {}
            }
        }
        // IFLA_LINK also names the lower device of vlans and tunnels: only a veth's is a peer.
        let peer = match (kind.as_deref(), link) {
            (Some("veth"), Some(ifindex)) if ifindex != 0 => Some(PeerLink { ifindex, netnsid, netns_inode: None }),
            _ => None,
        };
        let header = &message.header;
        Some(Self {
            ifindex: header.index,
            name: name?,
            kind,
            is_ethernet: header.link_layer_type == LinkLayerType::Ether,
            up: header.flags.contains(LinkFlags::Up),
            oper_up: header.flags.contains(LinkFlags::Running),
            peer,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLink {
    /// IFLA_LINK: the peer's ifindex in its own netns.
    pub ifindex: u32,
    /// IFLA_LINK_NETNSID: Some when the peer is in another netns.
    pub netnsid: Option<i32>,
    /// That netns's inode number; None if in this netns or unresolvable.
    pub netns_inode: Option<u64>,
}

/// A change to the set of watched links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link became watched: it appeared, or was renamed into the include globs.
    Added(LinkFacts),
    /// A watched link's facts changed (name, up state, peer, ...).
    Changed(LinkFacts),
    /// A watched link disappeared or stopped matching; `name` is the last one reported.
    Removed { ifindex: u32, name: String },
}

impl LinkEvent {
    pub fn ifindex(&self) -> u32 {
        match self {
            Self::Added(link) | Self::Changed(link) => link.ifindex,
            Self::Removed { ifindex, .. } => *ifindex,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::Added(link) | Self::Changed(link) => &link.name,
            Self::Removed { name, .. } => name,
        }
    }
}

/// The inode number of this thread's network namespace.
pub fn own_netns_inode() -> Result<u64, InterfaceError> {
    std::fs::metadata(OWN_NETNS)
        .map(|metadata| metadata.ino())
        .map_err(|source| InterfaceError::Netns { path: OWN_NETNS.into(), source })
}

/// Subscribes to RTNLGRP_LINK *first*, then dumps all links (so nothing is missed between
/// the two), and returns the current watched links plus a receiver of subsequent events
/// about watched links. Changed = a link already known got new facts; a link that stops
/// matching (e.g. renamed to an excluded name) is reported as Removed, one that starts
/// matching as Added. A pod veth whose peer netns cannot be resolved yet is reported with
/// `netns_inode: None`, and a Changed event follows when a (rate-limited) rescan finds it.
/// Sockets are opened in the calling thread's netns. The task ends when the receiver is
/// dropped; the channel closes early only if the netlink socket fails.
pub async fn watch_links(
    filter: InterfaceFilter,
) -> Result<(Vec<LinkFacts>, mpsc::Receiver<LinkEvent>), InterfaceError> {
    let mut watch = LinkWatch::open(filter)?;
    watch.start_dump().await?;
    let mut before_start = Vec::new();
    while watch.dump.is_some() {
        let received = watch.socket.recv_from_full().await;
        watch.on_received(received, &mut before_start).await?;
        before_start.clear();
    }
    let initial = watch.table.watched();
    info!(watched = initial.len(), links = watch.table.links.len(), "link watch started");
    let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
    tokio::spawn(watch.run(events_tx));
    Ok((initial, events_rx))
}

/// Every link of this netns as last reported, and which of them are watched.
struct LinkTable {
    filter: InterfaceFilter,
    links: HashMap<u32, LinkFacts>,
}

impl LinkTable {
    fn new(filter: InterfaceFilter) -> Self {
        Self { filter, links: HashMap::new() }
    }

    fn get(&self, ifindex: u32) -> Option<&LinkFacts> {
        self.links.get(&ifindex)
    }

    fn upsert(&mut self, link: LinkFacts) -> Option<LinkEvent> {
        let before = self.links.get(&link.ifindex).filter(|old| self.filter.watches(old));
        let event = match (before, self.filter.watches(&link)) {
            (Some(old), true) => (*old != link).then(|| LinkEvent::Changed(link.clone())),
            (Some(old), false) => Some(LinkEvent::Removed { ifindex: old.ifindex, name: old.name.clone() }),
            (None, true) => Some(LinkEvent::Added(link.clone())),
            (None, false) => None,
        };
        self.links.insert(link.ifindex, link);
        event
    }

    fn remove(&mut self, ifindex: u32) -> Option<LinkEvent> {
        let old = self.links.remove(&ifindex)?;
        self.filter.watches(&old).then_some(LinkEvent::Removed { ifindex, name: old.name })
    }

    /// Forgets links a full dump did not report.
    fn retain(&mut self, seen: &HashSet<u32>) -> Vec<LinkEvent> {
        let mut gone: Vec<u32> = self.links.keys().filter(|ifindex| !seen.contains(ifindex)).copied().collect();
        gone.sort_unstable();
        gone.into_iter().filter_map(|ifindex| self.remove(ifindex)).collect()
    }

    fn watched(&self) -> Vec<LinkFacts> {
        let mut watched: Vec<LinkFacts> =
            self.links.values().filter(|link| self.filter.watches(link)).cloned().collect();
        watched.sort_unstable_by_key(|link| link.ifindex);
        watched
    }

    /// Veths of this netns whose peer is `ifindex`, also in this netns.
    fn same_netns_peers_of(&self, ifindex: u32) -> Vec<u32> {
        self.links
            .values()
            .filter(|link| link.peer.as_ref().is_some_and(|peer| peer.ifindex == ifindex && peer.netnsid.is_none()))
            .map(|link| link.ifindex)
            .collect()
    }

    /// Watched links whose peer netns has an nsid but no known inode: (ifindex, nsid).
    fn unresolved(&self) -> Vec<(u32, i32)> {
        self.links
            .values()
            .filter(|link| self.filter.watches(link))
            .filter_map(|link| {
                let peer = link.peer.as_ref()?;
                match (peer.netnsid, peer.netns_inode) {
                    (Some(nsid), None) => Some((link.ifindex, nsid)),
                    _ => None,
                }
            })
            .collect()
    }
}

struct Dump {
    seq: u32,
    /// Links reported while the dump ran, by the dump or by events.
    seen: HashSet<u32>,
    interrupted: bool,
}

enum Wake {
    Closed,
    Received(io::Result<(Vec<u8>, SocketAddr)>),
    Rescan,
}

struct LinkWatch {
    socket: TokioSocket,
    seq: u32,
    table: LinkTable,
    netns: NetnsResolver,
    dump: Option<Dump>,
    /// The receive queue overflowed during a dump: dump again when it ends.
    resync_wanted: bool,
    /// A peer netns lookup missed while rescans were rate-limited.
    rescan_at: Option<Instant>,
}

impl LinkWatch {
    fn open(filter: InterfaceFilter) -> Result<Self, InterfaceError> {
        let mut socket = TokioSocket::new(NETLINK_ROUTE).map_err(netlink_error("opening the link socket"))?;
        let raw = socket.socket_mut();
        raw.bind_auto().map_err(netlink_error("binding the link socket"))?;
        enlarge_receive_buffer(raw);
        for group in [RTNLGRP_LINK, RTNLGRP_NSID] {
            raw.add_membership(group).map_err(netlink_error("subscribing to link and nsid events"))?;
        }
        Ok(Self {
            socket,
            seq: 0,
            table: LinkTable::new(filter),
            netns: NetnsResolver::open()?,
            dump: None,
            resync_wanted: false,
            rescan_at: None,
        })
    }

    async fn run(mut self, events_tx: mpsc::Sender<LinkEvent>) {
        loop {
            let rescan_at = self.rescan_at;
            let wake = tokio::select! {
                () = events_tx.closed() => Wake::Closed,
                received = self.socket.recv_from_full() => Wake::Received(received),
                () = tokio::time::sleep_until(rescan_at.unwrap_or_else(Instant::now)), if rescan_at.is_some() => Wake::Rescan,
            };
            let mut events = Vec::new();
            let outcome = match wake {
                Wake::Closed => {
                    debug!("link event receiver dropped: link watch ends");
                    return;
                }
                Wake::Received(received) => self.on_received(received, &mut events).await,
                Wake::Rescan => {
                    self.rescan(None, &mut events).await;
                    Ok(())
                }
            };
            for event in events {
                if events_tx.send(event).await.is_err() {
                    return;
                }
            }
            if let Err(error) = outcome {
                error!(error = %error, source = ?std::error::Error::source(&error), "link watch failed: no more interface events");
                return;
            }
        }
    }

    async fn request(&mut self, message: RouteNetlinkMessage, flags: u16) -> Result<u32, InterfaceError> {
        self.seq = self.seq.wrapping_add(1);
        let request = request_bytes(message, flags, self.seq);
        self.socket.send_to(&request, &SocketAddr::new(0, 0)).await.map_err(netlink_error("sending a link request"))?;
        Ok(self.seq)
    }

    async fn start_dump(&mut self) -> Result<(), InterfaceError> {
        let seq =
            self.request(RouteNetlinkMessage::GetLink(LinkMessage::default()), NLM_F_REQUEST | NLM_F_DUMP).await?;
        self.dump = Some(Dump { seq, seen: HashSet::new(), interrupted: false });
        Ok(())
    }

    /// Asks for one link again; its answer is applied like an event, in order.
    async fn refresh_link(&mut self, ifindex: u32) -> Result<(), InterfaceError> {
        let mut message = LinkMessage::default();
        message.header.index = ifindex;
        self.request(RouteNetlinkMessage::GetLink(message), NLM_F_REQUEST).await.map(drop)
    }

    async fn on_received(
        &mut self,
        received: io::Result<(Vec<u8>, SocketAddr)>,
        events: &mut Vec<LinkEvent>,
    ) -> Result<(), InterfaceError> {
        match received {
            Ok((datagram, from)) => self.on_datagram(&datagram, from, events).await,
            Err(error) if error.raw_os_error() == Some(libc::ENOBUFS) => self.on_overrun().await,
            Err(source) => Err(InterfaceError::Netlink { op: "receiving link events", source }),
        }
    }

    async fn on_overrun(&mut self) -> Result<(), InterfaceError> {
        warn!("netlink receive queue overflowed: link events were lost, dumping all links again");
        // nsid deletions may have been lost with them.
        self.netns.clear();
        if self.dump.is_some() {
            self.resync_wanted = true;
            Ok(())
        } else {
            self.start_dump().await
        }
    }

    async fn on_datagram(
        &mut self,
        datagram: &[u8],
        from: SocketAddr,
        events: &mut Vec<LinkEvent>,
    ) -> Result<(), InterfaceError> {
        let broadcast = from.multicast_groups() != 0;
        for message in parse_datagram(datagram) {
            let seq = message.header.sequence_number;
            let dump = self.dump.as_mut().filter(|dump| !broadcast && dump.seq == seq);
            let in_dump = dump.is_some();
            if let Some(dump) = dump
                && message.header.flags & NLM_F_DUMP_INTR != 0
                && !std::mem::replace(&mut dump.interrupted, true)
            {
                // The changes that interrupted it are queued as events on this same socket.
                debug!("link dump interrupted by concurrent changes");
            }
            match message.payload {
                // Bridges report port state in AF_BRIDGE messages to the same group, even
                // RTM_DELLINK when a port leaves: only AF_UNSPEC ones describe links.
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link))
                    if link.header.interface_family == AddressFamily::Unspec =>
                {
                    self.on_new_link(&link, events).await?;
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link))
                    if link.header.interface_family == AddressFamily::Unspec =>
                {
                    self.on_del_link(&link, events).await?;
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelNsId(nsid)) => {
                    for attribute in &nsid.attributes {
                        if let NsidAttribute::Id(id) = attribute {
                            self.netns.forget(*id);
                        }
                    }
                }
                NetlinkPayload::Done(done) if in_dump => {
                    if done.code != 0 {
                        let source = io::Error::from_raw_os_error(done.code.saturating_abs());
                        return Err(InterfaceError::Netlink { op: "dumping links", source });
                    }
                    self.finish_dump(events).await?;
                }
                NetlinkPayload::Error(error) if error.code.is_some() => {
                    if in_dump {
                        return Err(InterfaceError::Netlink { op: "dumping links", source: error.to_io() });
                    }
                    debug!(error = %error, "link refresh failed: the link is gone");
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn finish_dump(&mut self, events: &mut Vec<LinkEvent>) -> Result<(), InterfaceError> {
        if let Some(dump) = self.dump.take() {
            events.extend(self.table.retain(&dump.seen));
        }
        if std::mem::take(&mut self.resync_wanted) {
            self.start_dump().await?;
        }
        Ok(())
    }

    async fn on_new_link(&mut self, message: &LinkMessage, events: &mut Vec<LinkEvent>) -> Result<(), InterfaceError> {
        let Some(mut link) = LinkFacts::from_message(message) else {
            warn!(ifindex = message.header.index, "link message without a name skipped");
            return Ok(());
        };
        if let Some(dump) = &mut self.dump {
            dump.seen.insert(link.ifindex);
        }
        let stale_peer = self.stale_same_netns_peer(&link);
        self.resolve_peer_netns(&mut link, events).await;
        events.extend(self.table.upsert(link));
        if let Some(peer) = stale_peer {
            self.refresh_link(peer).await?;
        }
        Ok(())
    }

    async fn on_del_link(&mut self, message: &LinkMessage, events: &mut Vec<LinkEvent>) -> Result<(), InterfaceError> {
        let ifindex = message.header.index;
        // A veth end moved to another netns is reported deleted here, and its peer that
        // stays gets no message of its own: ask for the peer again to learn its new nsid.
        let orphans = self.table.same_netns_peers_of(ifindex);
        events.extend(self.table.remove(ifindex));
        for peer in orphans {
            self.refresh_link(peer).await?;
        }
        Ok(())
    }

    /// A veth end that arrives in this netns makes the stored peer facts of its partner
    /// stale, and the partner gets no message of its own: returns that partner.
    fn stale_same_netns_peer(&self, link: &LinkFacts) -> Option<u32> {
        if self.table.get(link.ifindex).is_some() {
            return None;
        }
        let peer = link.peer.as_ref().filter(|peer| peer.netnsid.is_none())?;
        let partner = self.table.get(peer.ifindex).filter(|partner| partner.kind == link.kind)?;
        // The end registered first of a new pair was reported without a peer.
        let current = partner.peer.as_ref().is_some_and(|back| back.ifindex == link.ifindex && back.netnsid.is_none());
        (!current).then_some(peer.ifindex)
    }

    async fn resolve_peer_netns(&mut self, link: &mut LinkFacts, events: &mut Vec<LinkEvent>) {
        let Some(nsid) = link.peer.as_ref().and_then(|peer| peer.netnsid) else {
            return;
        };
        // Same nsid as before: same netns, which cannot have been freed while our veth's
        // peer lived in it.
        let known = self
            .table
            .get(link.ifindex)
            .and_then(|old| old.peer.as_ref())
            .filter(|old| old.netnsid == Some(nsid))
            .and_then(|old| old.netns_inode);
        let inode = match known.or_else(|| self.netns.lookup(nsid)) {
            Some(inode) => Some(inode),
            None if self.table.filter.watches(link) => self.resolve_missing(nsid, events).await,
            None => None,
        };
        if let Some(peer) = link.peer.as_mut() {
            peer.netns_inode = inode;
        }
    }

    async fn resolve_missing(&mut self, nsid: i32, events: &mut Vec<LinkEvent>) -> Option<u64> {
        let allowed_at = self.netns.next_scan_allowed_at();
        if allowed_at > Instant::now() {
            debug!(nsid, "unknown peer nsid: rescanning network namespaces shortly");
            self.rescan_at.get_or_insert(allowed_at);
            return None;
        }
        self.rescan(Some(nsid), events).await;
        self.netns.lookup(nsid)
    }

    /// Rescans netns files and fills in the peer netns of links that waited for it.
    async fn rescan(&mut self, also_wanted: Option<i32>, events: &mut Vec<LinkEvent>) {
        self.rescan_at = None;
        let unresolved = self.table.unresolved();
        let wanted: HashSet<i32> = unresolved.iter().map(|&(_, nsid)| nsid).chain(also_wanted).collect();
        self.netns.rescan(&wanted).await;
        for (ifindex, nsid) in unresolved {
            let Some(inode) = self.netns.lookup(nsid) else {
                debug!(ifindex, nsid, "no network namespace file found for a veth peer's nsid");
                continue;
            };
            let Some(mut link) = self.table.get(ifindex).cloned() else {
                continue;
            };
            if let Some(peer) = link.peer.as_mut() {
                peer.netns_inode = Some(inode);
            }
            events.extend(self.table.upsert(link));
        }
    }
}

/// Best effort: a bigger queue means fewer overflows, and an overflow only costs a resync.
fn enlarge_receive_buffer(socket: &Socket) {
    let size = libc::c_int::try_from(RECEIVE_BUFFER).unwrap_or(libc::c_int::MAX);
    let length = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(libc::socklen_t::MAX);
    // SAFETY: the fd is an open socket; the option value is a c_int that outlives the call
    // and `length` is its size. SO_RCVBUFFORCE (CAP_NET_ADMIN) may exceed net.core.rmem_max.
    let forced = unsafe {
        libc::setsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&raw const size).cast(), length)
    } == 0;
    if !forced && let Err(error) = socket.set_rx_buf_sz(RECEIVE_BUFFER) {
        debug!(%error, "could not enlarge the netlink receive buffer");
    }
}

fn request_bytes(message: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut request = NetlinkMessage::from(message);
    request.header.flags = flags;
    request.header.sequence_number = seq;
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    bytes
}

/// Splits a datagram into its netlink messages, skipping ones this crate cannot decode.
fn parse_datagram(datagram: &[u8]) -> Vec<NetlinkMessage<RouteNetlinkMessage>> {
    let mut messages = Vec::new();
    let mut offset = 0;
    while let Some(rest) = datagram.get(offset..).filter(|rest| !rest.is_empty()) {
        let length = match NetlinkBuffer::new_checked(rest) {
            Ok(buffer) => buffer.length() as usize,
            Err(error) => {
                warn!(%error, "malformed netlink datagram: rest skipped");
                break;
            }
        };
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..length]) {
            Ok(message) => messages.push(message),
            Err(error) => warn!(%error, "undecodable rtnetlink message skipped"),
        }
        offset += length.next_multiple_of(4);
    }
    messages
}

/// Maps nsids (the kernel's names for other network namespaces, relative to ours) to netns
/// inodes, by asking the kernel the nsid of each netns file it can find.
struct NetnsResolver {
    /// Non-blocking: the kernel answers RTM_GETNSID inside sendmsg(2), so the reply is
    /// already queued when send returns.
    socket: Socket,
    seq: u32,
    /// Device of nsfs: files elsewhere (e.g. a stale /run/netns entry) are no netns.
    nsfs_dev: u64,
    by_nsid: HashMap<i32, u64>,
    last_scan: Option<Instant>,
}

impl NetnsResolver {
    fn open() -> Result<Self, InterfaceError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(netlink_error("opening the nsid socket"))?;
        socket.bind_auto().map_err(netlink_error("binding the nsid socket"))?;
        socket.set_non_blocking(true).map_err(netlink_error("configuring the nsid socket"))?;
        let nsfs_dev = std::fs::metadata(OWN_NETNS)
            .map_err(|source| InterfaceError::Netns { path: OWN_NETNS.into(), source })?
            .dev();
        Ok(Self { socket, seq: 0, nsfs_dev, by_nsid: HashMap::new(), last_scan: None })
    }

    fn lookup(&self, nsid: i32) -> Option<u64> {
        self.by_nsid.get(&nsid).copied()
    }

    /// The kernel deleted this nsid (its netns is gone); the number may be reused.
    fn forget(&mut self, nsid: i32) {
        self.by_nsid.remove(&nsid);
    }

    fn clear(&mut self) {
        self.by_nsid.clear();
    }

    fn next_scan_allowed_at(&self) -> Instant {
        self.last_scan.map_or_else(Instant::now, |last| last + RESCAN_INTERVAL)
    }

    /// Pinned netns files first (cheap, and where CNI runtimes keep pod namespaces), then
    /// every process's, unless the pinned ones already answered all `wanted` nsids.
    async fn rescan(&mut self, wanted: &HashSet<i32>) {
        let started = Instant::now();
        self.last_scan = Some(started);
        let mut skip: HashSet<u64> = self.by_nsid.values().copied().collect();
        let pinned = PINNED_NETNS_DIRS.iter().flat_map(|dir| dir_entries(Path::new(dir)));
        let pinned = unique_netns_files(pinned, self.nsfs_dev, &mut skip);
        self.ask_nsids(&pinned);
        let mut processes = 0;
        if !wanted.iter().all(|nsid| self.by_nsid.contains_key(nsid)) {
            let nsfs_dev = self.nsfs_dev;
            let listed = tokio::task::spawn_blocking(move || {
                let files = dir_entries(Path::new("/proc"))
                    .into_iter()
                    .filter(|path| {
                        path.file_name().is_some_and(|name| name.as_encoded_bytes().iter().all(u8::is_ascii_digit))
                    })
                    .map(|path| path.join("ns/net"));
                unique_netns_files(files, nsfs_dev, &mut skip)
            })
            .await;
            match listed {
                Ok(files) => {
                    processes = files.len();
                    self.ask_nsids(&files);
                }
                Err(error) => warn!(%error, "listing process network namespaces failed"),
            }
        }
        debug!(
            pinned = pinned.len(),
            processes,
            known = self.by_nsid.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rescanned network namespaces"
        );
    }

    fn ask_nsids(&mut self, files: &[PathBuf]) {
        for path in files {
            let file = match File::open(path) {
                Ok(file) => file,
                Err(error) => {
                    debug!(path = %path.display(), %error, "netns file vanished");
                    continue;
                }
            };
            // The path may name another netns by now (pid reuse): trust the open file.
            let inode = match file.metadata() {
                Ok(metadata) if metadata.dev() == self.nsfs_dev => metadata.ino(),
                Ok(_) => continue,
                Err(error) => {
                    debug!(path = %path.display(), %error, "netns file unreadable");
                    continue;
                }
            };
            match self.query_nsid(&file) {
                Ok(Some(nsid)) => {
                    self.by_nsid.insert(nsid, inode);
                }
                Ok(None) => {}
                Err(error) => debug!(path = %path.display(), %error, "RTM_GETNSID failed"),
            }
        }
    }

    /// RTM_GETNSID with NETNSA_FD; None for NETNSA_NSID_NOT_ASSIGNED (-1).
    fn query_nsid(&mut self, netns: &File) -> io::Result<Option<i32>> {
        let fd = u32::try_from(netns.as_raw_fd()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.seq = self.seq.wrapping_add(1);
        let mut message = NsidMessage::default();
        message.attributes.push(NsidAttribute::Fd(fd));
        let request = request_bytes(RouteNetlinkMessage::GetNsId(message), NLM_F_REQUEST, self.seq);
        self.socket.send_to(&request, &SocketAddr::new(0, 0), 0)?;
        loop {
            // WouldBlock here means no reply: reported as an error, never waited for.
            let (datagram, _) = self.socket.recv_from_full()?;
            for reply in parse_datagram(&datagram) {
                if reply.header.sequence_number != self.seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(reply)) => {
                        return Ok(reply.attributes.iter().find_map(|attribute| match attribute {
                            NsidAttribute::Id(nsid) if *nsid >= 0 => Some(*nsid),
                            _ => None,
                        }));
                    }
                    NetlinkPayload::Error(error) if error.code.is_some() => {
                        return Err(error.to_io());
                    }
                    _ => {}
                }
            }
        }
    }
}

fn dir_entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|entry| entry.ok().map(|entry| entry.path())).collect(),
        Err(error) => {
            if error.kind() != io::ErrorKind::NotFound {
                debug!(dir = %dir.display(), %error, "cannot list network namespace files");
            }
            Vec::new()
        }
    }
}

/// Netns files among `paths`, one per netns, skipping the inodes in `skip` (and adding theirs).
fn unique_netns_files(
    paths: impl IntoIterator<Item = PathBuf>,
    nsfs_dev: u64,
    skip: &mut HashSet<u64>,
) -> Vec<PathBuf> {
    paths
        .into_iter()
        .filter(|path| {
            std::fs::metadata(path).is_ok_and(|metadata| metadata.dev() == nsfs_dev && skip.insert(metadata.ino()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{InfoKind, LinkHeader};

    use super::*;

    fn defaults() -> Vec<String> {
        InterfaceFilter::DEFAULT_INCLUDE.iter().map(|glob| glob.to_string()).collect()
    }

    fn filter(include: &[&str], exclude: &[&str]) -> InterfaceFilter {
        let owned = |globs: &[&str]| globs.iter().map(|glob| glob.to_string()).collect::<Vec<_>>();
        InterfaceFilter::new(&owned(include), &owned(exclude)).expect("valid globs")
    }

    fn link(ifindex: u32, name: &str) -> LinkFacts {
        LinkFacts {
            ifindex,
            name: name.to_string(),
            kind: None,
            is_ethernet: true,
            up: true,
            oper_up: true,
            peer: None,
        }
    }

    fn veth(ifindex: u32, name: &str, netnsid: Option<i32>) -> LinkFacts {
        LinkFacts {
            kind: Some("veth".to_string()),
            peer: Some(PeerLink { ifindex: 2, netnsid, netns_inode: netnsid.map(|_| 4026532000) }),
            ..link(ifindex, name)
        }
    }

    #[test]
    fn default_globs_watch_sdn_devices_and_nothing_else() {
        let filter = InterfaceFilter::new(&defaults(), &[]).expect("defaults are valid");
        for name in
            ["veth1a2b3c4d", "br0", "tun0", "vxlan_sys_4789", "genev_sys_6081", "br-int", "br-ex", "ovn-k8s-mp0"]
        {
            assert!(filter.watches(&link(1, name)), "{name} should be watched");
        }
        for name in ["lo", "eth0", "ens3", "br-test", "br00", "tun1", "docker0", "xveth0"] {
            assert!(!filter.watches(&link(1, name)), "{name} should not be watched");
        }
    }

    #[test]
    fn exclude_wins_over_include_and_over_the_pod_veth_rule() {
        let filter = filter(&["veth*"], &["veth9*", "0123*"]);
        assert!(filter.watches(&link(1, "veth1234")));
        assert!(!filter.watches(&link(1, "veth9abc")));
        assert!(!filter.watches(&veth(1, "0123456789abcde", Some(3))), "exclude beats the pod-veth rule");
    }

    #[test]
    fn a_veth_is_watched_by_name_only_when_its_peer_is_local() {
        let filter = filter(&[], &[]);
        // OVN-Kubernetes names pod veths after the container ID: no include glob matches.
        assert!(filter.watches(&veth(7, "0123456789abcde", Some(3))));
        assert!(!filter.watches(&veth(7, "0123456789abcde", None)), "both ends in this netns");
        let tunnel = LinkFacts {
            kind: Some("vxlan".to_string()),
            peer: Some(PeerLink { ifindex: 2, netnsid: Some(3), netns_inode: None }),
            ..link(7, "0123456789abcde")
        };
        assert!(!filter.watches(&tunnel), "only veths have pod peers");
    }

    #[test]
    fn a_bad_glob_is_named_in_the_error() {
        for (include, exclude) in [(&["veth["][..], &[][..]), (&["veth*"][..], &["br-[x"][..])] {
            let owned = |globs: &[&str]| globs.iter().map(|glob| glob.to_string()).collect::<Vec<_>>();
            let error = InterfaceFilter::new(&owned(include), &owned(exclude)).expect_err("invalid glob");
            let bad = include.iter().chain(exclude).find(|glob| glob.contains('[')).copied().unwrap_or_default();
            assert!(matches!(&error, InterfaceError::Glob { glob, .. } if glob == bad), "{error:?}");
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    fn link_message(ifindex: u32, name: &str, kind: Option<InfoKind>, extra: Vec<LinkAttribute>) -> LinkMessage {
        let mut message = LinkMessage::default();
        message.header = LinkHeader {
            index: ifindex,
            link_layer_type: LinkLayerType::Ether,
            flags: LinkFlags::Up | LinkFlags::Broadcast,
            ..LinkHeader::default()
        };
        message.attributes.push(LinkAttribute::IfName(name.to_string()));
        message.attributes.extend(kind.map(|kind| LinkAttribute::LinkInfo(vec![LinkInfo::Kind(kind)])));
        message.attributes.extend(extra);
        message
    }

    #[test]
    fn facts_come_from_the_link_message() {
        let message =
            link_message(9, "veth1", Some(InfoKind::Veth), vec![LinkAttribute::Link(4), LinkAttribute::LinkNetNsId(2)]);
        let facts = LinkFacts::from_message(&message).expect("has a name");
        assert_eq!(
            facts,
            LinkFacts {
                ifindex: 9,
                name: "veth1".into(),
                kind: Some("veth".into()),
                is_ethernet: true,
                up: true,
                oper_up: false,
                peer: Some(PeerLink { ifindex: 4, netnsid: Some(2), netns_inode: None }),
            }
        );
        let vlan = link_message(10, "eth0.5", Some(InfoKind::Vlan), vec![LinkAttribute::Link(2)]);
        let vlan = LinkFacts::from_message(&vlan).expect("has a name");
        assert_eq!((vlan.kind.as_deref(), vlan.peer), (Some("vlan"), None), "a vlan's lower device is no peer");
        let mut nameless = link_message(11, "x", None, vec![]);
        nameless.attributes.clear();
        assert_eq!(LinkFacts::from_message(&nameless), None);
    }

    #[test]
    fn parse_datagram_splits_packed_messages() {
        let first = request_bytes(RouteNetlinkMessage::NewLink(link_message(1, "a", None, vec![])), 0, 7);
        let second = request_bytes(RouteNetlinkMessage::NewLink(link_message(2, "bcdef", None, vec![])), 0, 8);
        let mut datagram = first.clone();
        datagram.resize(first.len().next_multiple_of(4), 0);
        datagram.extend(&second);
        let seqs: Vec<u32> = parse_datagram(&datagram).iter().map(|message| message.header.sequence_number).collect();
        assert_eq!(seqs, [7, 8]);
        assert!(parse_datagram(&datagram[..10]).is_empty(), "a truncated header is skipped");
    }

    #[test]
    fn table_reports_only_watched_links_and_real_changes() {
        let mut table = LinkTable::new(filter(&["veth*"], &["vethx*"]));
        let mut veth1 = link(5, "veth1");
        assert_eq!(table.upsert(veth1.clone()), Some(LinkEvent::Added(veth1.clone())));
        assert_eq!(table.upsert(veth1.clone()), None, "same facts, no event");
        veth1.up = false;
        assert_eq!(table.upsert(veth1.clone()), Some(LinkEvent::Changed(veth1.clone())));
        assert_eq!(table.upsert(link(6, "eth0")), None);
        assert_eq!(table.remove(6), None, "unwatched links leave silently");

        let excluded = LinkFacts { name: "vethx1".into(), ..veth1.clone() };
        assert_eq!(table.upsert(excluded), Some(LinkEvent::Removed { ifindex: 5, name: "veth1".into() }));
        assert_eq!(table.upsert(veth1.clone()), Some(LinkEvent::Added(veth1.clone())), "renamed back");
        assert_eq!(table.watched(), vec![veth1.clone()]);
        assert_eq!(table.remove(5), Some(LinkEvent::Removed { ifindex: 5, name: "veth1".into() }));
        assert!(table.watched().is_empty());
    }

    #[test]
    fn a_resync_removes_links_the_dump_did_not_report() {
        let mut table = LinkTable::new(filter(&["veth*"], &[]));
        for facts in [link(3, "veth3"), link(4, "veth4"), link(5, "eth5")] {
            table.upsert(facts);
        }
        let removed = table.retain(&HashSet::from([4]));
        assert_eq!(removed, vec![LinkEvent::Removed { ifindex: 3, name: "veth3".into() }]);
        assert_eq!(table.links.keys().copied().collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn table_finds_local_peers_and_unresolved_pod_peers() {
        let mut table = LinkTable::new(filter(&["veth*"], &[]));
        table.upsert(veth(3, "veth3", None));
        let mut pod = veth(4, "veth4", Some(1));
        table.upsert(pod.clone());
        assert_eq!(table.same_netns_peers_of(2), vec![3], "only the veth whose peer is local");
        assert!(table.unresolved().is_empty());
        if let Some(peer) = pod.peer.as_mut() {
            peer.netns_inode = None;
        }
        table.upsert(pod);
        assert_eq!(table.unresolved(), vec![(4, 1)]);
    }
}

/// Real netlink in real network namespaces (root): `cargo xtask test`.
#[cfg(test)]
mod netns_tests {
    use std::{
        future::Future,
        process::{Child, Command, Stdio},
    };

    use nix::sched::{CloneFlags, setns};

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    /// Deletes the named network namespaces on drop, even when the test panics.
    struct Namespaces(Vec<String>);

    impl Namespaces {
        fn create(names: &[String]) -> Self {
            let mut namespaces = Self(Vec::new());
            for name in names {
                ip(&["netns", "add", name]);
                namespaces.0.push(name.clone());
            }
            namespaces
        }
    }

    impl Drop for Namespaces {
        fn drop(&mut self) {
            for name in self.0.iter().rev() {
                let _ = Command::new("ip").args(["netns", "del", name]).stderr(Stdio::null()).status();
            }
        }
    }

    /// A process in a network namespace of its own that no file in /run/netns pins.
    struct NetnsHolder(Child);

    impl NetnsHolder {
        fn spawn() -> (Self, u64) {
            let own = inode_of_path("/proc/self/ns/net");
            let child = Command::new("unshare").args(["--net", "sleep", "60"]).spawn().expect("unshare");
            let holder = Self(child);
            let path = format!("/proc/{}/ns/net", holder.0.id());
            for _ in 0..200 {
                let inode = inode_of_path(&path);
                if inode != own {
                    return (holder, inode);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("unshare did not enter a new netns");
        }

        fn pid(&self) -> String {
            self.0.id().to_string()
        }
    }

    impl Drop for NetnsHolder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn inode_of_path(path: &str) -> u64 {
        std::fs::metadata(path).map(|metadata| metadata.ino()).expect("stat netns file")
    }

    fn ip(args: &[&str]) -> String {
        let output = Command::new("ip").args(args).output().expect("running ip");
        assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn ifindex_in(netns: &str, name: &str) -> u32 {
        let line = ip(&["-n", netns, "-o", "link", "show", name]);
        let index = line.split(':').next().unwrap_or_default();
        index.trim().parse().unwrap_or_else(|_| panic!("no ifindex in {line:?}"))
    }

    fn inode_of(netns: &str) -> u64 {
        let output =
            Command::new("stat").args(["-L", "-c", "%i", &format!("/run/netns/{netns}")]).output().expect("stat");
        String::from_utf8_lossy(&output.stdout).trim().parse().expect("stat prints an inode")
    }

    /// The Added event for `name`, followed by the Changed event that resolves its peer
    /// netns when the lookup had to wait for the rescan rate limit. Changed events of other
    /// links before either are skipped: the kernel's linkwatch reports an operstate change up to
    /// a second late, on a slow machine (a test VM) after the test's next step.
    async fn added_with_peer_netns(events: &mut mpsc::Receiver<LinkEvent>, name: &str) -> LinkFacts {
        let link = added(next_event_of(events, name).await, name);
        if link.peer.as_ref().and_then(|peer| peer.netns_inode).is_some() {
            return link;
        }
        changed(next_event_of(events, name).await, name)
    }

    /// The next event, skipping late Changed events of links other than `name`.
    async fn next_event_of(events: &mut mpsc::Receiver<LinkEvent>, name: &str) -> LinkEvent {
        let mut event = next_event(events).await;
        while matches!(&event, LinkEvent::Changed(link) if link.name != name) {
            event = next_event(events).await;
        }
        event
    }

    /// Runs `body` on a thread inside `netns`, with its own runtime: netlink sockets belong
    /// to the netns of the thread that creates them.
    fn in_netns<F: Future<Output = ()>>(netns: &str, body: impl FnOnce() -> F + Send) {
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                let file = File::open(format!("/run/netns/{netns}")).expect("netns file");
                setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(body());
            });
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        });
    }

    async fn next_event(events: &mut mpsc::Receiver<LinkEvent>) -> LinkEvent {
        match tokio::time::timeout(TIMEOUT, events.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("link watch ended"),
            Err(_) => panic!("no link event within {TIMEOUT:?}"),
        }
    }

    fn added(event: LinkEvent, name: &str) -> LinkFacts {
        match event {
            LinkEvent::Added(link) if link.name == name => link,
            other => panic!("expected {name} added, got {other:?}"),
        }
    }

    fn changed(event: LinkEvent, name: &str) -> LinkFacts {
        match event {
            LinkEvent::Changed(link) if link.name == name => link,
            other => panic!("expected {name} changed, got {other:?}"),
        }
    }

    #[test]
    #[ignore = "needs root: run through cargo xtask test"]
    fn watch_links_follows_pod_veths_in_a_real_netns() {
        let base = format!("dmtest-ifc-{}", std::process::id());
        let (host, pod, pod2) = (base.clone(), format!("{base}-pod"), format!("{base}-pod2"));
        let _namespaces = Namespaces::create(&[host.clone(), pod.clone(), pod2.clone()]);
        let (pod_inode, pod2_inode) = (inode_of(&pod), inode_of(&pod2));

        // Before the watch: a pod veth whose pod end was moved into the pod, and a local pair.
        ip(&["-n", &host, "link", "add", "vethaaaa0001", "type", "veth", "peer", "name", "eth0"]);
        ip(&["-n", &host, "link", "set", "eth0", "netns", &pod]);
        ip(&["-n", &host, "link", "set", "vethaaaa0001", "up"]);
        ip(&["-n", &host, "link", "add", "other0", "type", "veth", "peer", "name", "other1"]);
        let pod_eth0 = ifindex_in(&pod, "eth0");
        let host_inode = inode_of(&host);
        let (holder, holder_inode) = NetnsHolder::spawn();

        in_netns(&host, || async {
            assert_eq!(own_netns_inode().expect("own netns"), host_inode, "the calling thread's netns");
            let include: Vec<String> = InterfaceFilter::DEFAULT_INCLUDE.iter().map(|glob| glob.to_string()).collect();
            let filter = InterfaceFilter::new(&include, &["vethexcl*".to_string()]).expect("filter");
            let (initial, mut events) = watch_links(filter).await.expect("watch_links");

            let names: Vec<&str> = initial.iter().map(|link| link.name.as_str()).collect();
            assert_eq!(names, ["vethaaaa0001"], "{initial:?}");
            let first = &initial[0];
            assert_eq!((first.kind.as_deref(), first.is_ethernet, first.up), (Some("veth"), true, true));
            let peer = first.peer.as_ref().expect("a veth has a peer");
            assert_eq!(peer.ifindex, pod_eth0);
            assert!(peer.netnsid.is_some(), "{peer:?}");
            assert_eq!(peer.netns_inode, Some(pod_inode));

            // A pod veth created after the watch started, into a netns with no nsid yet.
            ip(&["-n", &host, "link", "add", "vethbbbb0002", "type", "veth", "peer", "name", "eth0", "netns", &pod2]);
            let second = added_with_peer_netns(&mut events, "vethbbbb0002").await;
            let peer = second.peer.as_ref().expect("peer");
            assert_eq!(peer.ifindex, ifindex_in(&pod2, "eth0"));
            assert_eq!(peer.netns_inode, Some(pod2_inode));
            assert_ne!(peer.netnsid, first.peer.as_ref().and_then(|peer| peer.netnsid));

            ip(&["-n", &host, "link", "set", "vethbbbb0002", "up"]);
            assert!(changed(next_event(&mut events).await, "vethbbbb0002").up);
            ip(&["-n", &host, "link", "set", "vethbbbb0002", "down"]);
            assert!(!changed(next_event(&mut events).await, "vethbbbb0002").up);
            ip(&["-n", &host, "link", "del", "vethbbbb0002"]);
            assert_eq!(
                next_event(&mut events).await,
                LinkEvent::Removed { ifindex: second.ifindex, name: "vethbbbb0002".into() }
            );

            // When a veth end moves to another netns, the kernel reports it deleted here
            // and sends nothing for the end that stays: the watch asks for that one again.
            ip(&["-n", &host, "link", "add", "vetheeee0006", "type", "veth", "peer", "name", "eth4"]);
            let local = added(next_event(&mut events).await, "vetheeee0006");
            assert_eq!(local.peer.as_ref().map(|peer| peer.netnsid), Some(None), "{local:?}");
            ip(&["-n", &host, "link", "set", "eth4", "netns", &pod]);
            let moved = changed(next_event(&mut events).await, "vetheeee0006");
            let peer = moved.peer.as_ref().expect("peer");
            assert_eq!((peer.ifindex, peer.netns_inode), (ifindex_in(&pod, "eth4"), Some(pod_inode)));

            // A veth named like OVN-Kubernetes's (no include glob matches) becomes watched
            // when its other end moves into a pod, though the kernel sends nothing for it
            // (nor for the end registered first, here the host one, once its peer exists).
            ip(&["-n", &host, "link", "add", "eth1", "type", "veth", "peer", "name", "0123456789abcde"]);
            ip(&["-n", &host, "link", "set", "eth1", "netns", &pod]);
            let ovn = added(next_event(&mut events).await, "0123456789abcde");
            let peer = ovn.peer.as_ref().expect("peer");
            assert_eq!((peer.ifindex, peer.netns_inode), (ifindex_in(&pod, "eth1"), Some(pod_inode)));

            // Not watched: a local pair, an excluded pod veth, bridge port changes.
            ip(&["-n", &host, "link", "add", "other2", "type", "veth", "peer", "name", "other3"]);
            ip(&["-n", &host, "link", "add", "vethexcl0003", "type", "veth", "peer", "name", "eth2", "netns", &pod2]);
            ip(&["-n", &host, "link", "add", "br-test", "type", "bridge"]);
            ip(&["-n", &host, "link", "set", "vethaaaa0001", "master", "br-test"]);
            ip(&["-n", &host, "link", "set", "vethaaaa0001", "nomaster"]);
            ip(&["-n", &host, "link", "add", "vethcccc0004", "type", "veth", "peer", "name", "eth3", "netns", &pod]);
            let sentinel = added(next_event(&mut events).await, "vethcccc0004");
            assert_eq!(sentinel.peer.and_then(|peer| peer.netns_inode), Some(pod_inode));

            // Renamed into an exclude glob: Removed under its old name; renamed back: Added.
            ip(&["-n", &host, "link", "set", "0123456789abcde", "name", "vethexcl0009"]);
            assert_eq!(
                next_event(&mut events).await,
                LinkEvent::Removed { ifindex: ovn.ifindex, name: "0123456789abcde".into() }
            );
            ip(&["-n", &host, "link", "set", "vethexcl0009", "name", "0123456789abcde"]);
            assert_eq!(added(next_event(&mut events).await, "0123456789abcde"), ovn);

            // Deleting the pod netns deletes its veths with it. The kernel first reports
            // each host end closed and peerless, then deleted.
            ip(&["netns", "del", &pod]);
            let mut removed: Vec<String> = Vec::new();
            while removed.len() < 4 {
                match next_event(&mut events).await {
                    LinkEvent::Removed { name, .. } => removed.push(name),
                    LinkEvent::Changed(link) if !link.up && link.peer.is_none() => {}
                    other => panic!("expected a removal, got {other:?}"),
                }
            }
            removed.sort();
            assert_eq!(removed, ["0123456789abcde", "vethaaaa0001", "vethcccc0004", "vetheeee0006"]);

            // A netns only a process holds is found through /proc. The kernel hands it the
            // nsid the deleted pod had: a cache that missed RTM_DELNSID would name the pod.
            ip(&[
                "-n",
                &host,
                "link",
                "add",
                "vethdddd0005",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &holder.pid(),
            ]);
            let held = added_with_peer_netns(&mut events, "vethdddd0005").await;
            let held_peer = held.peer.expect("peer");
            assert_eq!(held_peer.netnsid, first.peer.as_ref().and_then(|peer| peer.netnsid), "nsid reused");
            assert_eq!(held_peer.netns_inode, Some(holder_inode));

            drop(events);
            let runtime = tokio::runtime::Handle::current();
            tokio::time::timeout(TIMEOUT, async {
                while runtime.metrics().num_alive_tasks() > 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("the watch task ends when the receiver is dropped");
        });
    }

    #[test]
    #[ignore = "needs root: run through cargo xtask test"]
    fn an_overflowed_event_queue_is_repaired_by_dumping_again() {
        let host = format!("dmtest-ifc-{}-overflow", std::process::id());
        let _namespaces = Namespaces::create(std::slice::from_ref(&host));
        in_netns(&host, || async {
            let filter = InterfaceFilter::new(&["veth*".to_string()], &[]).expect("filter");
            let mut watch = LinkWatch::open(filter).expect("open");
            // The kernel rounds this up to its minimum: room for one or two messages.
            watch.socket.socket_mut().set_rx_buf_sz(1).expect("shrink the receive buffer");
            watch.start_dump().await.expect("dump");
            let mut ignored = Vec::new();
            while watch.dump.is_some() {
                let received = watch.socket.recv_from_full().await;
                watch.on_received(received, &mut ignored).await.expect("initial dump");
            }
            assert!(watch.table.watched().is_empty());

            let mut expected: Vec<String> = Vec::new();
            for pair in 0..10 {
                let (a, b) = (format!("vethov{pair}a"), format!("vethov{pair}b"));
                ip(&["-n", &host, "link", "add", &a, "type", "veth", "peer", "name", &b]);
                expected.extend([a, b]);
            }
            let (events_tx, mut events) = mpsc::channel(EVENT_QUEUE);
            tokio::spawn(watch.run(events_tx));
            let mut added_names: Vec<String> = Vec::new();
            while added_names.len() < expected.len() {
                match next_event(&mut events).await {
                    LinkEvent::Added(link) => added_names.push(link.name),
                    LinkEvent::Changed(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            added_names.sort();
            expected.sort();
            assert_eq!(added_names, expected);
        });
    }
}
