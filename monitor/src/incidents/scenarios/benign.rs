//! Benign-class evidence in the engine: drops healthy nodes see all the time, scans and ports
//! filtered all along, late answers after a recovery. What the kernel would count, replayed
//! tick by tick as in [`super`].

use super::{Rates, Sim, burst, one_sided, steady};
use crate::lifecycle::timeline::EventKind;

#[test]
fn steady_benign_drops_are_absorbed_by_the_baseline() {
    let mut sim = Sim::new();
    let benign =
        Rates { interface: "br0", from: 0.0, to: 60.0, drops: 30, packets_in: 20, packets_out: 20, ..Rates::default() };
    sim.run(&["br0"], &[benign], 0.0, 60.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}

/// A scan of ports a pod filters, from before the agent started: 10 SYNs a second to services
/// never seen answering, each dropped by netfilter and left unanswered.
fn scan(from: f64, to: f64) -> [Rates; 2] {
    let client = Rates { interface: "veth0001", from, to, unseen_syns: 10, packets_in: 10, ..Rates::default() };
    let web =
        Rates { drops: 10, reason: "NETFILTER_DROP:unseen_service", packets_out: 10, ..burst("veth0002", from, to, 0) };
    [client, web]
}

#[test]
fn late_answers_after_a_recovery_do_not_stretch_the_incident() {
    // 10 s without answers, then, in the second after recovery, SYN-ACKs a restarting switch
    // held for sockets that gave up: NO_SOCKET drops (benign class) well above the baseline.
    let mut sim = Sim::new();
    let late = Rates { drops: 20, reason: "NO_SOCKET", ..burst("veth0001", 20.0, 21.0, 0) };
    let rates = [steady("veth0001", 60.0), one_sided("veth0001", 10.0, 20.0), late];
    sim.run(&["veth0001"], &rates, 0.0, 60.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    let duration = incidents[0].duration_seconds;
    assert!((duration - 10.0).abs() <= 0.5, "ends with the loss, not with the late answers: {duration} s");
    // They still count as what the incident cost.
    let veth = &incidents[0].interfaces[0];
    assert_eq!(veth.drop_reasons.get("NO_SOCKET"), Some(&20), "{veth:#?}");
}

#[test]
fn a_steady_scan_of_filtered_ports_is_no_incident_across_a_cni_flap() {
    let mut sim = Sim::new();
    sim.event(30.0, EventKind::CniConfigRemoved, "/etc/cni/net.d/80-openshift-network.conf", "deleted");
    sim.event(45.0, EventKind::CniConfigAdded, "/etc/cni/net.d/80-openshift-network.conf", "written");
    let [client, web] = scan(0.0, 90.0);
    let rates = [steady("veth0001", 90.0), steady("veth0002", 90.0), client, web];
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 90.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());

    // The same SYNs and drops to a service that answered before are lost packets.
    let mut sim = Sim::new();
    let client = Rates { interface: "veth0001", from: 30.0, to: 40.0, syns: 10, packets_in: 10, ..Rates::default() };
    let web = Rates { drops: 10, reason: "NETFILTER_DROP", packets_out: 10, ..burst("veth0002", 30.0, 40.0, 0) };
    let rates = [steady("veth0001", 90.0), steady("veth0002", 90.0), client, web];
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 90.0);
    let incidents = sim.engine.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    assert!((incidents[0].duration_seconds - 10.0).abs() <= 1.0, "{}", incidents[0].duration_seconds);
}

#[test]
fn a_scan_or_a_closed_port_called_from_mid_run_opens_no_incident() {
    // 10 s of calm, then a scan of filtered ports: far above a warm baseline of zero, but its
    // flows never worked, so nothing was lost.
    let mut sim = Sim::new();
    let [client, web] = scan(20.0, 60.0);
    let rates = [steady("veth0001", 60.0), steady("veth0002", 60.0), client, web];
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 60.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());

    // As in the soak: from 10 s on, a pod connects to a closed port every 2 s (answered by a
    // reset, its SYN dropped as NO_SOCKET) and sends UDP to one every second (NO_SOCKET).
    let mut sim = Sim::new();
    let rejects = Rates {
        drops: 2,
        reason: "NO_SOCKET",
        syns: 1,
        answered: 1,
        packets_in: 3,
        ..burst("veth0002", 10.0, 60.0, 0)
    };
    sim.run(&["veth0001", "veth0002"], &[steady("veth0001", 60.0), steady("veth0002", 60.0), rejects], 0.0, 60.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}

#[test]
fn bursty_benign_drops_at_agent_start_open_no_incident() {
    // As in the lab: one burst of OTHERHOST drops per probe every second, 20/s on others.
    let mut sim = Sim::new();
    let otherhost = |interface, from, to| Rates {
        interface,
        from,
        to,
        drops: 20,
        reason: "OTHERHOST",
        packets_in: 20,
        packets_out: 20,
        ..Rates::default()
    };
    let mut rates = vec![otherhost("veth0002", 0.0, 60.0)];
    for second in 0..60 {
        let from = second as f64 + 0.5;
        rates.push(otherhost("veth0001", from, from + 0.25));
    }
    sim.run(&["veth0001", "veth0002"], &rates, 0.0, 60.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}

#[test]
fn benign_drops_that_grow_or_shrink_with_the_traffic_open_no_incident() {
    // A userspace switch's OTHERHOST: one per frame, so five times the traffic is five times
    // the drops; then broadcasts that go on while the pod's own traffic stops.
    let mut sim = Sim::new();
    let otherhost = |from, to, rate| Rates {
        interface: "veth0001",
        from,
        to,
        drops: rate,
        reason: "OTHERHOST",
        packets_in: rate,
        packets_out: rate,
        ..Rates::default()
    };
    let broadcasts = Rates { drops: 5, reason: "OTHERHOST", ..burst("veth0001", 0.0, 80.0, 0) };
    let rates = [otherhost(0.0, 20.0, 40), otherhost(20.0, 40.0, 200), otherhost(40.0, 50.0, 40), broadcasts];
    sim.run(&["veth0001"], &rates, 0.0, 80.0);
    assert!(sim.engine.incidents().is_empty(), "{:#?}", sim.engine.incidents());
}
