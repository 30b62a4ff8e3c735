//! Section 2, datapath throughput with and without the monitor attached, in interleaved rounds.

use std::{thread, time::Duration};

use anyhow::Result;

use crate::{
    Bench, progress,
    report::{Figure, Section, table},
    stats::{Ratio, median, paired_ratio, range},
    traffic,
};

const IPERF_PORT: u16 = 5201;
const CRR_PORT: u16 = 7001;
const SETTLE: Duration = Duration::from_secs(3);

#[derive(Clone, Copy)]
enum Test {
    TcpBulk,
    TcpBulkNoOffload,
    Udp64,
    ConnectRequestClose,
}

impl Test {
    const ALL: [Self; 4] = [Self::TcpBulk, Self::TcpBulkNoOffload, Self::Udp64, Self::ConnectRequestClose];

    fn name(self) -> &'static str {
        match self {
            Self::TcpBulk => "TCP bulk (iperf3), TSO/GSO/GRO on",
            Self::TcpBulkNoOffload => "TCP bulk (iperf3), TSO/GSO/GRO off",
            Self::Udp64 => "UDP 64-byte datagrams received/s (iperf3 -u -l 64 -b 0)",
            Self::ConnectRequestClose => "TCP connect-request-close/s (one client)",
        }
    }

    fn goal(self) -> Option<(f64, &'static str)> {
        match self {
            Self::TcpBulk | Self::TcpBulkNoOffload => Some((0.99, "≥ 99 %")),
            Self::Udp64 => Some((0.97, "≥ 97 %")),
            Self::ConnectRequestClose => None,
        }
    }

    /// Value in the unit shown, and the unit.
    fn show(self, value: f64) -> String {
        match self {
            Self::TcpBulk | Self::TcpBulkNoOffload => format!("{:.2} Gbit/s", value / 1e9),
            Self::Udp64 => format!("{:.0} kpps", value / 1e3),
            Self::ConnectRequestClose => format!("{value:.0}/s"),
        }
    }

    fn run(self, bench: &Bench, duration: Duration) -> Result<f64> {
        let topology = &bench.topology;
        let (client, server) = (&topology.a.ns, topology.b.pod_ip.as_str());
        topology.offloads(!matches!(self, Self::TcpBulkNoOffload))?;
        match self {
            Self::TcpBulk | Self::TcpBulkNoOffload => traffic::tcp_bulk(client, server, IPERF_PORT, duration),
            Self::Udp64 => traffic::udp64(client, server, IPERF_PORT, duration),
            Self::ConnectRequestClose => traffic::crr_rate(client, server, CRR_PORT, duration),
        }
    }
}

pub fn measure(bench: &Bench) -> Result<Section> {
    let topology = &bench.topology;
    let plan = &bench.plan;
    let _iperf = traffic::Iperf3Server::start(&topology.b.ns, IPERF_PORT)?;
    let crr = traffic::crr_server(&topology.b.ns, CRR_PORT)?;
    // Unrecorded warm-up: first-run effects (page cache, neighbour entries) land here.
    for test in Test::ALL {
        test.run(bench, Duration::from_secs(1))?;
    }
    // results[test][monitored] = one value per round.
    let mut results = vec![[Vec::new(), Vec::new()]; Test::ALL.len()];
    for round in 0..plan.rounds {
        let order = if round.is_multiple_of(2) { [false, true] } else { [true, false] };
        for monitored in order {
            progress(&format!("  round {}/{}, {}", round + 1, plan.rounds, if monitored { "with" } else { "without" }));
            let agent = if monitored { Some(bench.start_agent(2)?) } else { None };
            // Both modes wait alike; with the agent this lets its start-up work (parsing the
            // kernel's BTF, the first netlink dump) finish before traffic starts.
            thread::sleep(SETTLE);
            for (index, test) in Test::ALL.into_iter().enumerate() {
                results[index][usize::from(monitored)].push(test.run(bench, plan.run)?);
            }
            drop(agent);
        }
    }
    topology.offloads(true)?;
    traffic::stop_crr_server(crr, &topology.b.ns, topology.b.pod_ip.clone(), CRR_PORT)?;

    let mut figures = Vec::new();
    let mut rows = Vec::new();
    for (index, test) in Test::ALL.into_iter().enumerate() {
        let [without, with] = &results[index];
        let ratio = paired_ratio(with, without);
        let shown = |values: &[f64]| match (median(values), range(values)) {
            (Some(median), Some((low, high))) => {
                format!("{} ({} – {})", test.show(median), test.show(low), test.show(high))
            }
            _ => "—".into(),
        };
        let ratio_text = ratio.as_ref().map_or_else(|| "—".into(), percent_range);
        rows.push(vec![test.name().into(), shown(without), shown(with), ratio_text.clone()]);
        let name = format!("{}: with / without the monitor", test.name());
        figures.push(match (test.goal(), &ratio) {
            (Some((goal, goal_text)), Some(ratio)) => Figure::goal(name, ratio_text, goal_text, ratio.median >= goal),
            _ => Figure::info(name, ratio_text),
        });
    }
    let body = format!(
        "Two pods, each a network namespace behind a host-side veth, routed through the host namespace as a \
         CNI's routed mode does; the traffic goes pod to pod, so it crosses two watched veths (ingress on one, \
         egress on the other). *With* means the agent runs with its defaults and is attached to both veths; \
         *without* means no agent at all; each mode waits {settle} s before its first run, so the agent's start-up is \
         not measured. {rounds} rounds of each, interleaved (without-with, then \
         with-without) so drift on this shared machine hits both alike; each run lasts {secs} s. Shown: \
         median (min – max) of the runs, and the median of the per-round ratios (min – max).\n\n{}",
        table(&["test", "without the monitor", "with the monitor", "ratio"], &rows),
        rounds = plan.rounds,
        settle = SETTLE.as_secs(),
        secs = plan.run.as_secs(),
    );
    Ok(Section { title: "2. Datapath throughput with and without the monitor".into(), figures, body })
}

fn percent_range(ratio: &Ratio) -> String {
    format!("{:.1} % ({:.1} – {:.1} %)", ratio.median * 100.0, ratio.low * 100.0, ratio.high * 100.0)
}
