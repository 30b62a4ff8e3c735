//! Switches whose ports are watched: packets that entered a switch and left on no port.
//!
//! A port's switch is its IFLA_MASTER when that is a switch (IFLA_INFO_SLAVE_KIND `openvswitch`:
//! OVS's kernel datapath `ovs-system`; or `bridge`: a Linux bridge), never a bond, team or VRF,
//! whose ports forward nothing to each other. Every packet a switch forwards enters on one
//! port and leaves on another, so over a sample the packets that entered minus those that left
//! are packets the switch dropped (a missing flow, a failed upcall, a disabled port), whatever
//! the kernel says about them. A packet enters through tc ingress on a veth or a tunnel (the
//! pod or the remote node sends it), through tc egress on a port the host sends through: an
//! OVS internal port, or a Linux bridge's own device. Flooding makes more leave than entered:
//! such samples count nothing (a lower bound).
//!
//! A Linux bridge hands the host what is addressed to it through its own device, so the bridge
//! is accounted only while that device is watched too (`--interface cni0`); otherwise every
//! packet from a pod to the host or beyond would look unforwarded. That is said once in the
//! log. OVS's datapath device is no port that traffic uses (each bridge's LOCAL port is an
//! internal port of its own).
//!
//! Only unicast frames are counted. Frames to a group address (broadcast, multicast: ARP
//! requests, IPv6 router solicitations and MLD reports) are flooded to every port or none, and
//! a switch drops many by policy (openshift-sdn's and this lab's flows forward no IPv6): they
//! say nothing about forwarding. Three pods' router solicitations, dropped by such a flow
//! together, had looked like a 3-packet outage.
//!
//! Two artefacts of sampling are not drops and are kept out:
//! - a sample in which a port joins or leaves the switch counts nothing for it: the packets
//!   that port carried in that sample are unknown (a port attached between two samples has
//!   no history yet), so what entered elsewhere and left through it would look unforwarded;
//! - packets in flight across a sample boundary (read from one port before, from another
//!   after; a miss waiting for ovs-vswitchd's upcall) enter in one sample and leave in the
//!   next. A sample's excess is held for one sample and only what the next sample's surplus
//!   does not take back is counted, so the switch's evidence comes one sample late.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use monitor_common::InterfaceCounters;

use tracing::info;

use super::{LinkFacts, sampler::InterfaceSeries};

/// The drop reason the switch's unforwarded packets are reported under.
pub const UNFORWARDED_REASON: &str = "NO_OUTPUT_PORT";

#[derive(Debug, Default)]
struct Switch {
    name: String,
    /// Packets (entered, left) of each port at the last sample.
    ports: HashMap<u32, [u64; 2]>,
    /// Packets that entered, and those that left on no port, since it was first seen.
    entered: u64,
    unforwarded: u64,
    /// The last sample's excess of entered over left: in flight, or unforwarded if the next
    /// sample does not bring it out.
    pending: u64,
}

/// Keeps each switch's count of unforwarded packets across samples.
#[derive(Debug, Default)]
pub struct Switches {
    switches: BTreeMap<u32, Switch>,
    /// Linux bridges with watched ports whose own device is not watched (said once each).
    unaccounted: BTreeSet<u32>,
}

/// Unicast packets (entered the switch, left it) through this port: the other way round
/// for a port the host sends through.
fn through(counters: &InterfaceCounters, host_side: bool) -> [u64; 2] {
    let unicast = |d: &monitor_common::DirectionCounters| d.packets.saturating_sub(d.group);
    if host_side {
        [unicast(&counters.egress), unicast(&counters.ingress)]
    } else {
        [unicast(&counters.ingress), unicast(&counters.egress)]
    }
}

impl Switches {
    /// Takes one sample of the watched ports; returns, for each switch with two watched
    /// ports or more, a series named after the switch whose drops hold its unforwarded
    /// packets under [`UNFORWARDED_REASON`] and whose ingress packets are those that entered.
    pub fn observe<'a>(
        &mut self,
        ports: impl Iterator<Item = (&'a LinkFacts, InterfaceCounters)>,
        name_of: impl Fn(u32) -> Option<String>,
    ) -> Vec<InterfaceSeries> {
        let watched: Vec<(&LinkFacts, InterfaceCounters)> = ports.collect();
        let counters_of: HashMap<u32, &InterfaceCounters> =
            watched.iter().map(|(link, counters)| (link.ifindex, counters)).collect();
        let mut now: BTreeMap<u32, HashMap<u32, [u64; 2]>> = BTreeMap::new();
        let mut unwatched_bridges = BTreeSet::new();
        for (link, counters) in &watched {
            let Some(master) = link.master else { continue };
            match link.port_kind.as_deref() {
                Some("openvswitch") => {
                    let internal = link.kind.as_deref() == Some("openvswitch");
                    now.entry(master).or_default().insert(link.ifindex, through(counters, internal));
                }
                Some("bridge") => match counters_of.get(&master) {
                    Some(device) => {
                        let ports = now.entry(master).or_default();
                        ports.insert(link.ifindex, through(counters, false));
                        ports.insert(master, through(device, true));
                    }
                    None => {
                        unwatched_bridges.insert(master);
                    }
                },
                _ => {}
            }
        }
        for master in &unwatched_bridges {
            if !self.unaccounted.contains(master) {
                let name = name_of(*master).unwrap_or_else(|| format!("switch-{master}"));
                info!(
                    bridge = %name,
                    "bridge {name} has watched ports but its own device is not watched: what it hands the host \
                     cannot be told from what it drops, so it gets no NO_OUTPUT_PORT count (watch it with \
                     --interface {name} for one)"
                );
            }
        }
        self.unaccounted = unwatched_bridges;
        self.switches.retain(|master, _| now.contains_key(master));
        let mut series = Vec::new();
        for (master, ports) in now {
            let switch = self.switches.entry(master).or_insert_with(|| Switch {
                name: name_of(master).unwrap_or_else(|| format!("switch-{master}")),
                ..Switch::default()
            });
            // A sample in which the switch's ports changed counts nothing (the module's doc).
            let same_ports = ports.len() == switch.ports.len() && ports.keys().all(|i| switch.ports.contains_key(i));
            if same_ports {
                let (mut entered, mut left) = (0u64, 0u64);
                for (ifindex, packets) in &ports {
                    let before = switch.ports[ifindex];
                    entered += packets[0].saturating_sub(before[0]);
                    left += packets[1].saturating_sub(before[1]);
                }
                switch.entered += entered;
                // The last sample's excess, less what came out in this one, was not forwarded.
                let came_out = left.saturating_sub(entered);
                switch.unforwarded += switch.pending.saturating_sub(came_out);
                switch.pending = entered.saturating_sub(left);
            } else {
                switch.pending = 0;
            }
            let watched_ports = ports.len();
            switch.ports = ports;
            if watched_ports >= 2 {
                series.push(InterfaceSeries {
                    interface: switch.name.clone(),
                    ifindex: master,
                    drops: BTreeMap::from([(UNFORWARDED_REASON.to_string(), switch.unforwarded)]),
                    // What entered: the detector weighs unforwarded packets against it.
                    counters: InterfaceCounters {
                        ingress: monitor_common::DirectionCounters { packets: switch.entered, ..Default::default() },
                        ..InterfaceCounters::default()
                    },
                    ..InterfaceSeries::default()
                });
            }
        }
        series
    }
}

/// The interfaces and the switches, each judged once: a switch whose own device is watched
/// too (a Linux bridge) is that device, and its unforwarded packets join the device's series.
pub fn judged(interfaces: &[InterfaceSeries], switches: &[InterfaceSeries]) -> Vec<InterfaceSeries> {
    let mut judged = interfaces.to_vec();
    for switch in switches {
        match judged.iter_mut().find(|s| s.ifindex == switch.ifindex && !s.removed) {
            Some(device) => {
                for (reason, count) in &switch.drops {
                    *device.drops.entry(reason.clone()).or_default() += count;
                }
            }
            None => judged.push(switch.clone()),
        }
    }
    judged
}

/// The name of the link with this ifindex in the agent's netns.
pub fn link_name(ifindex: u32) -> Option<String> {
    let mut buffer = [0u8; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname requires.
    let name = unsafe { libc::if_indextoname(ifindex, buffer.as_mut_ptr().cast()) };
    if name.is_null() {
        return None;
    }
    let end = buffer.iter().position(|b| *b == 0).unwrap_or(buffer.len());
    Some(String::from_utf8_lossy(&buffer[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use monitor_common::DirectionCounters;

    use super::*;
    use crate::sampling::links::fixtures::link;

    /// A port of OVS's datapath `master`.
    fn port(ifindex: u32, kind: &str, master: u32) -> LinkFacts {
        port_of(ifindex, kind, master, "openvswitch")
    }

    fn port_of(ifindex: u32, kind: &str, master: u32, port_kind: &str) -> LinkFacts {
        LinkFacts {
            kind: Some(kind.to_string()),
            master: Some(master),
            port_kind: Some(port_kind.to_string()),
            ..link(ifindex, &format!("p{ifindex}"))
        }
    }

    fn counters(ingress: u64, egress: u64) -> InterfaceCounters {
        InterfaceCounters {
            ingress: DirectionCounters { packets: ingress, ..Default::default() },
            egress: DirectionCounters { packets: egress, ..Default::default() },
        }
    }

    fn unforwarded(series: &[InterfaceSeries]) -> Vec<(String, u64)> {
        series.iter().map(|s| (s.interface.clone(), s.drops[UNFORWARDED_REASON])).collect()
    }

    #[test]
    fn packets_that_enter_and_leave_on_no_port_are_counted_one_sample_late() {
        let (a, b, internal) = (port(10, "veth", 3), port(11, "veth", 3), port(12, "openvswitch", 3));
        let lone = port(20, "veth", 4);
        let name = |ifindex: u32| (ifindex == 3).then(|| "ovs-system".to_string());
        let mut switches = Switches::default();
        let mut sample = |a_: [u64; 2], b_: [u64; 2], internal_: [u64; 2]| {
            let ports = [
                (&a, counters(a_[0], a_[1])),
                (&b, counters(b_[0], b_[1])),
                (&internal, counters(internal_[0], internal_[1])),
                (&lone, counters(1, 1)),
            ];
            unforwarded(&switches.observe(ports.into_iter(), name))
        };
        let ovs = |n: u64| vec![("ovs-system".to_string(), n)];
        // First sample: history only.
        assert_eq!(sample([100, 90], [90, 100], [5, 5]), ovs(0));
        // a sends 50 into the switch, b gets 20 of them; the host sends 10 through the internal
        // port (its egress), a gets them: 60 entered, 30 left. Held for a sample...
        assert_eq!(sample([150, 100], [90, 120], [5, 15]), ovs(0));
        // ... and counted when the next one brings none of them out.
        assert_eq!(sample([150, 100], [90, 120], [5, 15]), ovs(30));
        // In flight: 10 enter, 7 leave; the next sample 5 enter and 8 leave. Nothing was lost.
        assert_eq!(sample([160, 100], [90, 127], [5, 15]), ovs(30));
        assert_eq!(sample([165, 100], [90, 135], [5, 15]), ovs(30));
        // Flooding (more left than entered, nothing held) counts nothing, and takes nothing back.
        assert_eq!(sample([166, 110], [90, 145], [5, 15]), ovs(30));
        assert_eq!(sample([166, 110], [90, 145], [5, 15]), ovs(30));
    }

    #[test]
    fn a_sample_in_which_ports_join_or_leave_counts_nothing() {
        let (a, b, c) = (port(10, "veth", 3), port(11, "veth", 3), port(13, "veth", 3));
        let name = |_: u32| None;
        let mut switches = Switches::default();
        let mut sample = |ports: &[(&LinkFacts, [u64; 2])]| {
            let ports = ports.iter().map(|(link, [i, e])| (*link, counters(*i, *e)));
            unforwarded(&switches.observe(ports, name))
        };
        let switch = |n: u64| vec![("switch-3".to_string(), n)];
        assert_eq!(sample(&[(&a, [0, 0]), (&b, [0, 0])]), switch(0));
        // 5 entered at a and are held; then c is attached: what left through c in that sample
        // is unknown, so the sample counts nothing and forgets what was held.
        assert_eq!(sample(&[(&a, [5, 0]), (&b, [0, 0])]), switch(0));
        assert_eq!(sample(&[(&a, [20, 0]), (&b, [0, 0]), (&c, [0, 0])]), switch(0));
        assert_eq!(sample(&[(&a, [30, 0]), (&b, [0, 0]), (&c, [0, 10])]), switch(0));
        // b goes: a's 10 that left through b before it went are unknown too.
        assert_eq!(sample(&[(&a, [40, 0]), (&c, [0, 10])]), switch(0));
        assert_eq!(sample(&[(&a, [40, 0]), (&c, [0, 10])]), switch(0));
        // A switch left with one watched port is not reported.
        assert!(sample(&[(&a, [50, 0])]).is_empty());
    }

    #[test]
    fn frames_to_a_group_address_are_not_counted() {
        let (a, b) = (port(10, "veth", 3), port(11, "veth", 3));
        let name = |_: u32| None;
        let mut switches = Switches::default();
        // (ingress packets, of them to a group address) at a; b takes nothing.
        let mut sample = |packets: u64, group: u64| {
            let a_counters = InterfaceCounters {
                ingress: DirectionCounters { packets, group, ..Default::default() },
                ..InterfaceCounters::default()
            };
            unforwarded(&switches.observe([(&a, a_counters), (&b, counters(0, 0))].into_iter(), name))
        };
        let switch = |n: u64| vec![("switch-3".to_string(), n)];
        assert_eq!(sample(0, 0), switch(0));
        // Three router solicitations that the switch's flows drop: not a forwarding failure.
        assert_eq!(sample(3, 3), switch(0));
        assert_eq!(sample(3, 3), switch(0));
        // Two unicast frames forwarded nowhere are.
        assert_eq!(sample(5, 3), switch(0));
        assert_eq!(sample(5, 3), switch(2));
    }

    #[test]
    fn a_linux_bridge_counts_with_its_own_device_and_a_bond_never() {
        let (a, b) = (port_of(10, "veth", 3, "bridge"), port_of(11, "veth", 3, "bridge"));
        let device = LinkFacts { kind: Some("bridge".into()), ..link(3, "cni0") };
        let (slave1, slave2) = (port_of(20, "veth", 5, "bond"), port_of(21, "veth", 5, "bond"));
        let name = |ifindex: u32| Some(format!("dev{ifindex}"));
        let mut switches = Switches::default();
        // a's ingress, the bridge device's (ingress, egress); b and the bond's slaves take nothing.
        let mut sample = |a_in: u64, device_: Option<[u64; 2]>| {
            let mut ports = vec![(&a, counters(a_in, 0)), (&b, counters(0, 0))];
            ports.extend(device_.map(|[i, e]| (&device, counters(i, e))));
            ports.extend([(&slave1, counters(a_in, 0)), (&slave2, counters(0, 0))]);
            unforwarded(&switches.observe(ports.into_iter(), name))
        };
        // Without its device the bridge is not accounted: a's packets may be the host's.
        assert!(sample(0, None).is_empty());
        assert!(sample(40, None).is_empty());
        // With it, what the bridge hands the host (the device's ingress) was forwarded...
        assert_eq!(sample(40, Some([0, 0])), vec![("dev3".to_string(), 0)]);
        assert_eq!(sample(70, Some([30, 0])), vec![("dev3".to_string(), 0)]);
        assert_eq!(sample(70, Some([30, 0])), vec![("dev3".to_string(), 0)]);
        // ... and what it hands no port and not the host was not; the host's own packets
        // enter through the device's egress.
        assert_eq!(sample(80, Some([30, 5])), vec![("dev3".to_string(), 0)]);
        assert_eq!(sample(80, Some([30, 5])), vec![("dev3".to_string(), 15)]);
    }

    #[test]
    fn a_watched_bridge_device_is_its_switch() {
        let series = |name: &str, ifindex: u32, drops: &[(&str, u64)]| InterfaceSeries {
            interface: name.to_string(),
            ifindex,
            drops: drops.iter().map(|(reason, n)| (reason.to_string(), *n)).collect(),
            ..InterfaceSeries::default()
        };
        let interfaces = [series("cni0", 3, &[("NO_SOCKET", 2)]), series("veth1", 10, &[])];
        let switches =
            [series("cni0", 3, &[(UNFORWARDED_REASON, 7)]), series("ovs-system", 5, &[(UNFORWARDED_REASON, 1)])];
        let judged = judged(&interfaces, &switches);
        let drops: Vec<(&str, Vec<(&str, u64)>)> = judged
            .iter()
            .map(|s| (s.interface.as_str(), s.drops.iter().map(|(r, n)| (r.as_str(), *n)).collect()))
            .collect();
        assert_eq!(
            drops,
            vec![
                ("cni0", vec![(UNFORWARDED_REASON, 7), ("NO_SOCKET", 2)]),
                ("veth1", vec![]),
                ("ovs-system", vec![(UNFORWARDED_REASON, 1)]),
            ]
        );
    }

    #[test]
    fn the_loopback_has_a_name_and_nonsense_has_none() {
        assert_eq!(link_name(1).as_deref(), Some("lo"));
        assert_eq!(link_name(u32::MAX), None);
    }
}
