//! Links as netlink describes them: the facts of one link from its RTM_NEWLINK message, the
//! table of this network namespace's links (which are watched, what changed), and the
//! message encoding both netlink sockets use.

use std::collections::{HashMap, HashSet};

use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage},
};
use rtnetlink::packet_core::{NetlinkBuffer, NetlinkMessage};
use tracing::warn;

use super::InterfaceFilter;

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
    /// IFLA_MASTER: the device this link is a port of (a bridge, OVS's `ovs-system`, a bond).
    pub master: Option<u32>,
    /// IFLA_INFO_SLAVE_KIND: the master's kind, e.g. "bridge", "openvswitch", "bond", "vrf".
    pub port_kind: Option<String>,
}

impl LinkFacts {
    /// Administratively and operationally up.
    pub fn is_up(&self) -> bool {
        self.up && self.oper_up
    }

    /// A host-side veth whose peer lives in another network namespace (a pod's).
    pub fn is_pod_veth(&self) -> bool {
        self.kind.as_deref() == Some("veth") && self.peer.as_ref().is_some_and(|peer| peer.netnsid.is_some())
    }

    /// Reads an RTM_NEWLINK/RTM_DELLINK message; None when it carries no name.
    pub(super) fn from_message(message: &LinkMessage) -> Option<Self> {
        let (mut name, mut kind, mut link, mut netnsid, mut master) = (None, None, None, None, None);
        let mut port_kind = None;
        for attribute in &message.attributes {
            match attribute {
                LinkAttribute::IfName(value) => name = Some(value.clone()),
                LinkAttribute::Link(ifindex) => link = Some(*ifindex),
                LinkAttribute::LinkNetNsId(id) => netnsid = Some(*id),
                LinkAttribute::Controller(ifindex) if *ifindex != 0 => master = Some(*ifindex),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(value) => kind = Some(value.to_string()),
                            LinkInfo::PortKind(value) => port_kind = Some(value.to_string()),
                            _ => {}
                        }
                    }
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
            master,
            port_kind,
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

/// Every link of this netns as last reported, and which of them are watched.
pub(super) struct LinkTable {
    pub(super) filter: InterfaceFilter,
    pub(super) links: HashMap<u32, LinkFacts>,
}

impl LinkTable {
    pub(super) fn new(filter: InterfaceFilter) -> Self {
        Self { filter, links: HashMap::new() }
    }

    pub(super) fn get(&self, ifindex: u32) -> Option<&LinkFacts> {
        self.links.get(&ifindex)
    }

    pub(super) fn upsert(&mut self, link: LinkFacts) -> Option<LinkEvent> {
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

    pub(super) fn remove(&mut self, ifindex: u32) -> Option<LinkEvent> {
        let old = self.links.remove(&ifindex)?;
        self.filter.watches(&old).then_some(LinkEvent::Removed { ifindex, name: old.name })
    }

    /// Forgets links a full dump did not report.
    pub(super) fn retain(&mut self, seen: &HashSet<u32>) -> Vec<LinkEvent> {
        let mut gone: Vec<u32> = self.links.keys().filter(|ifindex| !seen.contains(ifindex)).copied().collect();
        gone.sort_unstable();
        gone.into_iter().filter_map(|ifindex| self.remove(ifindex)).collect()
    }

    pub(super) fn watched(&self) -> Vec<LinkFacts> {
        let mut watched: Vec<LinkFacts> =
            self.links.values().filter(|link| self.filter.watches(link)).cloned().collect();
        watched.sort_unstable_by_key(|link| link.ifindex);
        watched
    }

    /// Veths of this netns whose peer is `ifindex`, also in this netns.
    pub(super) fn same_netns_peers_of(&self, ifindex: u32) -> Vec<u32> {
        self.links
            .values()
            .filter(|link| link.peer.as_ref().is_some_and(|peer| peer.ifindex == ifindex && peer.netnsid.is_none()))
            .map(|link| link.ifindex)
            .collect()
    }

    /// Watched links whose peer netns has an nsid but no known inode: (ifindex, nsid).
    pub(super) fn unresolved(&self) -> Vec<(u32, i32)> {
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

pub(super) fn request_bytes(message: RouteNetlinkMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut request = NetlinkMessage::from(message);
    request.header.flags = flags;
    request.header.sequence_number = seq;
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    bytes
}

/// Splits a datagram into its netlink messages, skipping ones this crate cannot decode.
pub(super) fn parse_datagram(datagram: &[u8]) -> Vec<NetlinkMessage<RouteNetlinkMessage>> {
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

/// Links and filters for the unit tests of this stage.
#[cfg(test)]
pub(super) mod fixtures {
    use super::{InterfaceFilter, LinkFacts, PeerLink};

    pub(in crate::sampling) fn filter(include: &[&str], exclude: &[&str]) -> InterfaceFilter {
        let owned = |globs: &[&str]| globs.iter().map(|glob| glob.to_string()).collect::<Vec<_>>();
        InterfaceFilter::new(&owned(include), &owned(exclude)).expect("valid globs")
    }

    /// An Ethernet link, up, without a kind or a peer.
    pub(in crate::sampling) fn link(ifindex: u32, name: &str) -> LinkFacts {
        LinkFacts {
            ifindex,
            name: name.to_string(),
            kind: None,
            is_ethernet: true,
            up: true,
            oper_up: true,
            peer: None,
            master: None,
            port_kind: None,
        }
    }

    /// A veth whose peer is in the netns `netnsid` names (None: in this one).
    pub(in crate::sampling) fn veth(ifindex: u32, name: &str, netnsid: Option<i32>) -> LinkFacts {
        LinkFacts {
            kind: Some("veth".to_string()),
            peer: Some(PeerLink { ifindex: 2, netnsid, netns_inode: netnsid.map(|_| 4026532000) }),
            ..link(ifindex, name)
        }
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{InfoKind, InfoPortKind, LinkHeader};

    use super::{
        fixtures::{filter, link, veth},
        *,
    };

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
        let attributes = vec![
            LinkAttribute::Link(4),
            LinkAttribute::LinkNetNsId(2),
            LinkAttribute::Controller(3),
            LinkAttribute::LinkInfo(vec![LinkInfo::PortKind(InfoPortKind::Other("openvswitch".into()))]),
        ];
        let message = link_message(9, "veth1", Some(InfoKind::Veth), attributes);
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
                master: Some(3),
                port_kind: Some("openvswitch".into()),
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
