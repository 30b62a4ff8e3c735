//! Interface lifecycle events (`interface_added|removed|up|down`) from the netlink link watch,
//! which also tells the sampler what to attach to.

use std::sync::{Arc, Mutex};

use tokio::{sync::mpsc, task::JoinHandle};

use crate::{
    lifecycle::{
        clock::Stamp,
        timeline::{Event, EventKind, Timeline},
    },
    sampling::{LinkEvent, LinkFacts, sampler::Sampler},
    sync::lock,
};

/// Follows the link watch's events: each one attaches or detaches in the sampler, and is
/// recorded on the timeline as the interface events it means. Ends when the watch does (it
/// restarts itself when its socket fails, see [`crate::sampling::watch_links`]).
pub fn follow_links(
    sampler: Arc<Mutex<Sampler>>,
    mut events: mpsc::Receiver<LinkEvent>,
    timeline: Arc<Timeline>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let stamp = Stamp::now();
            let changes = {
                let mut sampler = lock(&sampler);
                let changes = interface_events(sampler.watched_link(event.ifindex()), &event, stamp);
                sampler.apply(event);
                changes
            };
            for change in changes {
                timeline.record(change);
            }
        }
    })
}

fn describe(link: &LinkFacts) -> String {
    let mut text = format!("ifindex {}", link.ifindex);
    if let Some(kind) = &link.kind {
        text.push_str(&format!(", {kind}"));
    }
    if let Some(peer) = &link.peer
        && let Some(netns) = peer.netns_inode
    {
        text.push_str(&format!(", peer ifindex {} in netns {netns}", peer.ifindex));
    }
    text.push_str(if link.is_up() { ", up" } else { ", down" });
    text
}

/// The lifecycle events a link event means, given the link's previous facts (None if it was
/// not watched), stamped `stamp`.
pub fn interface_events(previous: Option<&LinkFacts>, event: &LinkEvent, stamp: Stamp) -> Vec<Event> {
    let change = |kind, interface: &str, detail: String| Event::new(stamp, kind, interface, detail);
    match (previous, event) {
        (None, LinkEvent::Added(link) | LinkEvent::Changed(link)) => {
            vec![change(EventKind::InterfaceAdded, &link.name, describe(link))]
        }
        (Some(before), LinkEvent::Added(link) | LinkEvent::Changed(link)) => {
            let mut changes = Vec::new();
            if before.name != link.name {
                changes.push(change(EventKind::InterfaceRemoved, &before.name, format!("renamed to {}", link.name)));
                changes.push(change(EventKind::InterfaceAdded, &link.name, format!("renamed from {}", before.name)));
            }
            match (before.is_up(), link.is_up()) {
                (false, true) => changes.push(change(EventKind::InterfaceUp, &link.name, describe(link))),
                (true, false) => changes.push(change(EventKind::InterfaceDown, &link.name, describe(link))),
                _ => {}
            }
            changes
        }
        (Some(before), LinkEvent::Removed { name, .. }) => {
            vec![change(EventKind::InterfaceRemoved, name, format!("ifindex {} deleted", before.ifindex))]
        }
        (None, LinkEvent::Removed { .. }) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::PeerLink;

    fn link(name: &str, up: bool) -> LinkFacts {
        LinkFacts {
            ifindex: 7,
            name: name.into(),
            kind: Some("veth".into()),
            is_ethernet: true,
            up,
            oper_up: up,
            peer: Some(PeerLink { ifindex: 2, netnsid: Some(0), netns_inode: Some(4026532000) }),
            master: None,
            port_kind: None,
        }
    }

    fn kinds(changes: &[Event]) -> Vec<(EventKind, &str)> {
        changes.iter().map(|c| (c.kind, c.subject.as_str())).collect()
    }

    fn interface_changes(previous: Option<&LinkFacts>, event: &LinkEvent) -> Vec<Event> {
        interface_events(previous, event, Stamp::now())
    }

    #[test]
    fn link_events_become_lifecycle_events() {
        let added = interface_changes(None, &LinkEvent::Added(link("veth1", true)));
        assert_eq!(kinds(&added), [(EventKind::InterfaceAdded, "veth1")]);
        assert_eq!(added[0].detail, "ifindex 7, veth, peer ifindex 2 in netns 4026532000, up");

        let before = link("veth1", true);
        let down = interface_changes(Some(&before), &LinkEvent::Changed(link("veth1", false)));
        assert_eq!(kinds(&down), [(EventKind::InterfaceDown, "veth1")]);
        let up = interface_changes(Some(&link("veth1", false)), &LinkEvent::Changed(link("veth1", true)));
        assert_eq!(kinds(&up), [(EventKind::InterfaceUp, "veth1")]);
        // Admin up but carrier down (peer down) counts as down.
        let mut no_carrier = link("veth1", true);
        no_carrier.oper_up = false;
        assert_eq!(
            kinds(&interface_changes(Some(&before), &LinkEvent::Changed(no_carrier))),
            [(EventKind::InterfaceDown, "veth1")]
        );
        // Other changes (peer moved, MTU, ...) are not lifecycle events.
        assert!(interface_changes(Some(&before), &LinkEvent::Changed(link("veth1", true))).is_empty());

        let renamed = interface_changes(Some(&before), &LinkEvent::Changed(link("veth2", true)));
        assert_eq!(kinds(&renamed), [(EventKind::InterfaceRemoved, "veth1"), (EventKind::InterfaceAdded, "veth2")]);

        let removed = interface_changes(Some(&before), &LinkEvent::Removed { ifindex: 7, name: "veth1".into() });
        assert_eq!(kinds(&removed), [(EventKind::InterfaceRemoved, "veth1")]);
        assert!(interface_changes(None, &LinkEvent::Removed { ifindex: 7, name: "veth1".into() }).is_empty());
    }
}
