//! The netlink link watch: reports the watched links of this network namespace appearing,
//! changing and disappearing.
//!
//! One rtnetlink socket carries both the link subscription and the link dump, and its
//! messages are applied in the order the kernel queued them (events that arrive during the
//! dump update the same table), so no change between subscribing and dumping is lost. The
//! kernel names a veth peer's network namespace only by an nsid relative to ours; the
//! resolver in [`super::netns`] maps nsids to netns inodes.

use std::{collections::HashSet, io, os::fd::AsRawFd};

use netlink_packet_route::{AddressFamily, RouteNetlinkMessage, link::LinkMessage, nsid::NsidAttribute};
use rtnetlink::{
    packet_core::{NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkPayload},
    sys::{AsyncSocket, AsyncSocketExt, Socket, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE},
};
use tokio::{sync::mpsc, time::Instant};
use tracing::{debug, info, warn};

use super::{
    InterfaceError, InterfaceFilter, LinkEvent, LinkFacts,
    links::{LinkTable, parse_datagram, request_bytes},
    netlink_error,
    netns::NetnsResolver,
};
use crate::{
    errors,
    lifecycle::sources::{Backoff, SourceHandle},
};

/// rtnetlink multicast groups (`RTNLGRP_*` in `linux/rtnetlink.h`).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NSID: u32 = 28;
/// Events buffered for a slow consumer; beyond this the socket queue fills and we resync.
const EVENT_QUEUE: usize = 1024;
/// Room for a burst of link notifications (a node starting hundreds of pods).
const RECEIVE_BUFFER: usize = 4 << 20;

/// Subscribes to RTNLGRP_LINK *first*, then dumps all links (so nothing is missed between
/// the two), and returns the current watched links plus a receiver of subsequent events
/// about watched links. Changed = a link already known got new facts; a link that stops
/// matching (e.g. renamed to an excluded name) is reported as Removed, one that starts
/// matching as Added. A pod veth whose peer netns cannot be resolved yet is reported with
/// `netns_inode: None`, and a Changed event follows when a (rate-limited) rescan finds it.
/// Sockets are opened in the calling thread's netns. The task ends when the receiver is
/// dropped; when the netlink socket fails, it reports `health` down and starts over.
pub async fn watch_links(
    filter: InterfaceFilter,
    health: SourceHandle,
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
    tokio::spawn(watch.run(events_tx, health));
    Ok((initial, events_rx))
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
    /// Link events were lost (the receive queue overflowed) and the dump that repairs the
    /// table has not finished yet: the source is down meanwhile.
    events_lost: bool,
    /// A peer netns lookup missed while rescans were rate-limited.
    rescan_at: Option<Instant>,
}

impl LinkWatch {
    fn open(filter: InterfaceFilter) -> Result<Self, InterfaceError> {
        Ok(Self {
            socket: subscribed_socket()?,
            seq: 0,
            table: LinkTable::new(filter),
            netns: NetnsResolver::open()?,
            dump: None,
            resync_wanted: false,
            events_lost: false,
            rescan_at: None,
        })
    }

    /// Follows events until the receiver is dropped. When the socket fails, reports the
    /// source down and starts over with a new socket and a full dump (with backoff): links
    /// that came, changed or went meanwhile are reported then.
    async fn run(mut self, events_tx: mpsc::Sender<LinkEvent>, health: SourceHandle) {
        loop {
            if let Err(error) = self.follow(&events_tx, &health).await {
                health.down(format!("link watch failed: {}", errors::chain(&error)));
            } else {
                return;
            }
            let mut backoff = Backoff::default();
            loop {
                tokio::select! {
                    () = events_tx.closed() => return,
                    () = backoff.wait() => {}
                }
                match self.restart().await {
                    Ok(()) => break,
                    Err(error) => health.down(format!("restarting the link watch: {}", errors::chain(&error))),
                }
            }
            info!("link watch restarted: dumping every link again");
            health.up();
        }
    }

    /// A new socket, subscribed first, then a full dump applied to the table kept so far.
    async fn restart(&mut self) -> Result<(), InterfaceError> {
        self.socket = subscribed_socket()?;
        self.netns.clear();
        self.dump = None;
        self.resync_wanted = false;
        self.events_lost = false;
        self.start_dump().await
    }

    /// Follows events; Ok when the receiver is dropped, Err when the socket failed. Lost
    /// events (an overflowed receive queue) count as a failure of `health` until the dump
    /// that repairs the table has been applied.
    async fn follow(
        &mut self,
        events_tx: &mpsc::Sender<LinkEvent>,
        health: &SourceHandle,
    ) -> Result<(), InterfaceError> {
        let mut reported_lost = false;
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
                    return Ok(());
                }
                Wake::Received(received) => self.on_received(received, &mut events).await,
                Wake::Rescan => {
                    self.rescan(None, &mut events).await;
                    Ok(())
                }
            };
            for event in events {
                if events_tx.send(event).await.is_err() {
                    return Ok(());
                }
            }
            if self.events_lost != reported_lost {
                reported_lost = self.events_lost;
                if reported_lost {
                    health.down("link events lost: the netlink receive queue overflowed; dumping every link again");
                } else {
                    health.up();
                }
            }
            outcome?;
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
        self.events_lost = true;
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
        } else {
            // The table is whole again: what the lost events said, this dump said too.
            self.events_lost = false;
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

/// A route netlink socket subscribed to link and nsid events.
fn subscribed_socket() -> Result<TokioSocket, InterfaceError> {
    let mut socket = TokioSocket::new(NETLINK_ROUTE).map_err(netlink_error("opening the link socket"))?;
    let raw = socket.socket_mut();
    raw.bind_auto().map_err(netlink_error("binding the link socket"))?;
    enlarge_receive_buffer(raw);
    for group in [RTNLGRP_LINK, RTNLGRP_NSID] {
        raw.add_membership(group).map_err(netlink_error("subscribing to link and nsid events"))?;
    }
    Ok(socket)
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

/// Real netlink in real network namespaces (root): `cargo xtask test`.
#[cfg(test)]
mod netns_tests {
    use std::{
        future::Future,
        process::{Child, Command, Stdio},
    };

    use std::{fs::File, os::unix::fs::MetadataExt, time::Duration};

    use nix::sched::{CloneFlags, setns};

    use super::*;
    use crate::sampling::OwnNetns;

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

    /// The Changed event that reports `name` up (or down), skipping late Changed events that
    /// still report the previous state: linkwatch's operstate event for the step before can
    /// arrive after this step (seen in the 6.1 guest: an "up" event after "link set down").
    async fn changed_to(events: &mut mpsc::Receiver<LinkEvent>, name: &str, up: bool) -> LinkFacts {
        loop {
            let link = changed(next_event_of(events, name).await, name);
            if link.up == up {
                return link;
            }
        }
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
            assert_eq!(OwnNetns::of_this_thread().expect("own netns").inode, host_inode, "the calling thread's netns");
            let include: Vec<String> = InterfaceFilter::DEFAULT_INCLUDE.iter().map(|glob| glob.to_string()).collect();
            let filter = InterfaceFilter::new(&include, &["vethexcl*".to_string()]).expect("filter");
            let (initial, mut events) = watch_links(
                filter,
                crate::lifecycle::sources::Sources::new().handle(crate::lifecycle::sources::LINK_WATCH),
            )
            .await
            .expect("watch_links");

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
            assert!(changed_to(&mut events, "vethbbbb0002", true).await.up);
            ip(&["-n", &host, "link", "set", "vethbbbb0002", "down"]);
            assert!(!changed_to(&mut events, "vethbbbb0002", false).await.up);
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

            // Not watched: a local pair, an excluded pod veth, the bridge. A watched link joining
            // and leaving a bridge changes its switch (the master): two Changed events.
            ip(&["-n", &host, "link", "add", "other2", "type", "veth", "peer", "name", "other3"]);
            ip(&["-n", &host, "link", "add", "vethexcl0003", "type", "veth", "peer", "name", "eth2", "netns", &pod2]);
            ip(&["-n", &host, "link", "add", "br-test", "type", "bridge"]);
            let bridge = ifindex_in(&host, "br-test");
            ip(&["-n", &host, "link", "set", "vethaaaa0001", "master", "br-test"]);
            ip(&["-n", &host, "link", "set", "vethaaaa0001", "nomaster"]);
            ip(&["-n", &host, "link", "add", "vethcccc0004", "type", "veth", "peer", "name", "eth3", "netns", &pod]);
            let mut masters = Vec::new();
            let sentinel = loop {
                match next_event(&mut events).await {
                    LinkEvent::Changed(link) if link.name == "vethaaaa0001" => {
                        if masters.last() != Some(&link.master) {
                            masters.push(link.master);
                        }
                    }
                    other => break added(other, "vethcccc0004"),
                }
            };
            // (A late operstate change may add a Changed event without a master first.)
            assert!(masters.contains(&Some(bridge)) && masters.last() == Some(&None), "{masters:?}");
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
            let sources = crate::lifecycle::sources::Sources::new();
            tokio::spawn(watch.run(events_tx, sources.handle(crate::lifecycle::sources::LINK_WATCH)));
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
            // The lost events were a failure of the source, repaired by the dump.
            tokio::time::timeout(TIMEOUT, async {
                while !sources.down().is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("the link watch is up again once the dump is applied");
            let state = &sources.snapshot()[crate::lifecycle::sources::LINK_WATCH];
            assert!(state.failures >= 1, "{state:?}");
            assert!(state.error.as_deref().is_some_and(|e| e.contains("overflowed")), "{state:?}");
        });
    }
}
