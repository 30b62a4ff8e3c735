//! Switches whose ports are watched: packets that entered a switch and left on no port.
//!
//! A port's switch is its IFLA_MASTER (a Linux bridge, or OVS's kernel datapath
//! `ovs-system`). Every packet a switch forwards enters on one watched port and leaves on
//! another, so over a sample the packets that entered minus those that left are packets the
//! switch dropped (a missing flow, a failed upcall, a disabled port), whatever the kernel
//! says about them. A packet enters through tc ingress on a veth or a tunnel (the pod or the
//! remote node sends it), through tc egress on an OVS internal port (the host sends it).
//! Flooding makes more leave than entered: such samples count nothing (a lower bound), and
//! packets in flight across a sample boundary are noise the detector's baseline absorbs.

use std::collections::{BTreeMap, HashMap};

use monitor_common::InterfaceCounters;

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
}

/// Keeps each switch's count of unforwarded packets across samples.
#[derive(Debug, Default)]
pub struct Switches {
    switches: BTreeMap<u32, Switch>,
}

/// (entered the switch, left it) through this port.
fn through(link: &LinkFacts, counters: &InterfaceCounters) -> [u64; 2] {
    if link.kind.as_deref() == Some("openvswitch") {
        [counters.egress.packets, counters.ingress.packets]
    } else {
        [counters.ingress.packets, counters.egress.packets]
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
        let mut now: BTreeMap<u32, HashMap<u32, [u64; 2]>> = BTreeMap::new();
        for (link, counters) in ports {
            if let Some(master) = link.master {
                now.entry(master).or_default().insert(link.ifindex, through(link, &counters));
            }
        }
        self.switches.retain(|master, _| now.contains_key(master));
        let mut series = Vec::new();
        for (master, ports) in now {
            let switch = self.switches.entry(master).or_insert_with(|| Switch {
                name: name_of(master).unwrap_or_else(|| format!("switch-{master}")),
                ..Switch::default()
            });
            // Ports seen at both samples only: a port that joins brings its history along.
            let (mut entered, mut left) = (0u64, 0u64);
            for (ifindex, packets) in &ports {
                if let Some(before) = switch.ports.get(ifindex) {
                    entered += packets[0].saturating_sub(before[0]);
                    left += packets[1].saturating_sub(before[1]);
                }
            }
            switch.entered += entered;
            switch.unforwarded += entered.saturating_sub(left);
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

    fn port(ifindex: u32, kind: &str, master: u32) -> LinkFacts {
        LinkFacts { kind: Some(kind.to_string()), master: Some(master), ..link(ifindex, &format!("p{ifindex}")) }
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
    fn packets_that_enter_and_leave_on_no_port_are_counted() {
        let (a, b, internal) = (port(10, "veth", 3), port(11, "veth", 3), port(12, "openvswitch", 3));
        let lone = port(20, "veth", 4);
        let name = |ifindex: u32| (ifindex == 3).then(|| "ovs-system".to_string());
        let mut switches = Switches::default();
        // First sample: history only.
        let first =
            [(&a, counters(100, 90)), (&b, counters(90, 100)), (&internal, counters(5, 5)), (&lone, counters(1, 1))];
        assert_eq!(unforwarded(&switches.observe(first.into_iter(), name)), [("ovs-system".to_string(), 0)]);
        // a sends 50 into the switch, b gets 20 of them; the host sends 10 through the internal
        // port (its egress), a gets them: 60 entered, 30 left.
        let second =
            [(&a, counters(150, 100)), (&b, counters(90, 120)), (&internal, counters(5, 15)), (&lone, counters(9, 1))];
        assert_eq!(unforwarded(&switches.observe(second.into_iter(), name)), [("ovs-system".to_string(), 30)]);
        // Flooding (more left than entered) counts nothing, and takes nothing back.
        let third =
            [(&a, counters(151, 110)), (&b, counters(90, 130)), (&internal, counters(5, 15)), (&lone, counters(9, 1))];
        assert_eq!(unforwarded(&switches.observe(third.into_iter(), name)), [("ovs-system".to_string(), 30)]);
        // A port that joins brings no history; a switch left with one watched port is not reported.
        let c = port(13, "veth", 3);
        let fourth = [(&a, counters(151, 110)), (&c, counters(1_000, 0))];
        assert_eq!(unforwarded(&switches.observe(fourth.into_iter(), name)), [("ovs-system".to_string(), 30)]);
        assert!(switches.observe([(&a, counters(200, 110))].into_iter(), name).is_empty());
    }

    #[test]
    fn the_loopback_has_a_name_and_nonsense_has_none() {
        assert_eq!(link_name(1).as_deref(), Some("lo"));
        assert_eq!(link_name(u32::MAX), None);
    }
}
