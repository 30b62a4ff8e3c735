//! Sections 3 and 5: agent cost (CPU, RSS, kernel map memory) at 10, 100 and 250 watched
//! interfaces with 1,000 and 10,000 active flows, and /metrics latency and size at 250.

use std::{
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use datapath_monitor_tests::AGENT_PORT;

use crate::{
    Bench, get,
    kernel::{self, MapMemory},
    programs::thousands,
    progress,
    report::{Figure, Section, table},
    stats::percentile,
    traffic,
};

const BACKGROUND_PORT: u16 = 7100;
const INTERFACES: [usize; 3] = [10, 100, 250];
const FLOWS: [u32; 2] = [1_000, 10_000];

struct Cost {
    interfaces: usize,
    flows: u32,
    cpu_share: f64,
    rss_mib: f64,
    peak_rss_mib: f64,
    maps: Vec<MapMemory>,
}

struct Scrape {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    bytes: usize,
    series: usize,
}

pub fn measure(bench: &mut Bench) -> Result<Vec<Section>> {
    let mut costs = Vec::new();
    let mut scrape = None;
    for interfaces in INTERFACES {
        // The two pods' veths are watched too.
        bench.topology.scale_to(interfaces - 2)?;
        for flows in FLOWS {
            progress(&format!("  {interfaces} interfaces, {} flows", thousands(u64::from(flows))));
            let (peers, targets) = bench.topology.scaled_peers().context("scaled veths")?;
            let background = traffic::scaled_background(peers, &bench.topology.host, targets, BACKGROUND_PORT)?;
            // Each flow sends one SYN a second.
            let syns = traffic::syn_flows(&bench.topology.a, flows, Some(u64::from(flows)))?;
            let agent = bench.start_agent(interfaces)?;
            let pid = agent.pid().context("agent pid")?;
            // Past start-up and the incident engine's warm-up.
            thread::sleep(Duration::from_secs(8));
            let (ticks_before, started) = (cpu_ticks(pid)?, Instant::now());
            thread::sleep(bench.plan.steady);
            let ticks = cpu_ticks(pid)? - ticks_before;
            let elapsed = started.elapsed().as_secs_f64();
            // SAFETY: sysconf has no preconditions.
            let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            let (rss_mib, peak_rss_mib) = rss_mib(pid)?;
            costs.push(Cost {
                interfaces,
                flows,
                cpu_share: ticks as f64 / ticks_per_second / elapsed,
                rss_mib,
                peak_rss_mib,
                maps: kernel::agent_maps(pid)?,
            });
            if interfaces == 250 && flows == 10_000 {
                progress("  /metrics at 250 interfaces");
                scrape = Some(scrape_latency(bench.plan.scrapes)?);
            }
            drop(agent);
            syns.stop()?;
            background.stop()?;
        }
    }
    bench.topology.scale_to(0)?;
    Ok(vec![cost_section(bench, &costs), scrape_section(scrape.context("no scrape measured")?)])
}

fn cost_section(bench: &Bench, costs: &[Cost]) -> Section {
    let map_total = |cost: &Cost| cost.maps.iter().map(|map| map.bytes).sum::<u64>() as f64 / 1024.0 / 1024.0;
    let rows: Vec<Vec<String>> = costs
        .iter()
        .map(|cost| {
            vec![
                cost.interfaces.to_string(),
                thousands(u64::from(cost.flows)),
                format!("{:.2} %", cost.cpu_share * 100.0),
                format!("{:.1} MiB", cost.rss_mib),
                format!("{:.1} MiB", cost.peak_rss_mib),
                format!("{:.1} MiB", map_total(cost)),
            ]
        })
        .collect();
    let mut figures = Vec::new();
    if let Some(cost) = costs.iter().find(|cost| cost.interfaces == 100 && cost.flows == 10_000) {
        figures.push(Figure::goal(
            "Agent CPU at 100 interfaces, 10,000 flows",
            format!("{:.2} % of a core", cost.cpu_share * 100.0),
            "< 1 % of a core",
            cost.cpu_share < 0.01,
        ));
        figures.push(Figure::goal(
            "Agent RSS at 100 interfaces, 10,000 flows",
            format!("{:.1} MiB", cost.rss_mib),
            "< 30 MiB",
            cost.rss_mib < 30.0,
        ));
        figures.push(Figure::info("Kernel map memory (all configurations)", format!("{:.1} MiB", map_total(cost))));
    }
    if let Some(cost) = costs.iter().find(|cost| cost.interfaces == 250 && cost.flows == 10_000) {
        figures.push(Figure::info(
            "Agent CPU / RSS at 250 interfaces, 10,000 flows",
            format!("{:.2} % of a core / {:.1} MiB", cost.cpu_share * 100.0, cost.rss_mib),
        ));
    }
    let map_rows: Vec<Vec<String>> = costs
        .last()
        .map(|cost| {
            cost.maps
                .iter()
                .map(|map| {
                    vec![
                        format!("`{}`", map.name),
                        map.kind.clone(),
                        thousands(u64::from(map.max_entries)),
                        format!("{:.1} KiB", map.bytes as f64 / 1024.0),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let body = format!(
        "The agent runs as deployed (release build, defaults, RUST_LOG=info) in the host namespace. Watched \
         interfaces: the two pods' veths plus host-side veths whose peers live in another namespace; each of \
         those gets one 64-byte datagram every 100 ms, delivered to a socket on the host. Active flows: one pod \
         sends one SYN a second per flow, round-robin, each to an address the host routes to an ifb interface \
         that consumes it, so every flow stays in the kernel's flow table. After 8 s of start-up the agent's CPU \
         time (utime + stime of all its threads, /proc/PID/stat) is measured over {} s; RSS is VmRSS at the end \
         and the peak VmHWM; kernel map memory is the sum of `memlock` over the agent's map fds, as the kernel \
         reports it (fdinfo).\n\n{}\nThe agent's maps (the last configuration; their size does not depend on \
         the load: hash maps are preallocated):\n\n{}",
        bench.plan.steady.as_secs(),
        table(&["interfaces", "flows", "CPU (share of one core)", "RSS", "peak RSS", "kernel map memory"], &rows),
        table(&["map", "type", "max entries", "memory"], &map_rows),
    );
    Section { title: "3. Agent cost".into(), figures, body }
}

fn scrape_latency(requests: usize) -> Result<Scrape> {
    let mut latencies = Vec::with_capacity(requests);
    let mut bytes = 0;
    let mut series = 0;
    for _ in 0..requests {
        let started = Instant::now();
        let (status, body) = get(AGENT_PORT, "/metrics")?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        bytes = body.len();
        series = body.lines().filter(|line| !line.starts_with('#') && !line.is_empty()).count();
        thread::sleep(Duration::from_millis(10));
    }
    Ok(Scrape {
        p50_ms: percentile(&latencies, 50.0).unwrap_or_default(),
        p99_ms: percentile(&latencies, 99.0).unwrap_or_default(),
        max_ms: percentile(&latencies, 100.0).unwrap_or_default(),
        bytes,
        series,
    })
}

fn scrape_section(scrape: Scrape) -> Section {
    let figures = vec![
        Figure::goal(
            "/metrics latency at 250 interfaces, p50 / p99",
            format!("{:.1} / {:.1} ms", scrape.p50_ms, scrape.p99_ms),
            "p99 ≤ 10 ms",
            scrape.p99_ms <= 10.0,
        ),
        Figure::info(
            "/metrics body at 250 interfaces",
            format!("{} KiB, {} series", thousands(scrape.bytes as u64 / 1024), thousands(scrape.series as u64)),
        ),
    ];
    let body = format!(
        "During the 250-interface, 10,000-flow configuration, after its CPU measurement: sequential GET \
         /metrics requests, each on a new connection, 10 ms apart, timed from connect to the last byte. \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; body {} bytes ({} series).",
        scrape.p50_ms,
        scrape.p99_ms,
        scrape.max_ms,
        thousands(scrape.bytes as u64),
        thousands(scrape.series as u64)
    );
    Section { title: "5. Scrape".into(), figures, body }
}

/// utime + stime of the whole process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').context("malformed stat")?.1.split_whitespace().collect();
    // After the comm: field 3 (state) is index 0; utime is field 14, stime field 15.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// (VmRSS, VmHWM) in MiB.
fn rss_mib(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> Result<f64> {
        let line = status.lines().find(|line| line.starts_with(key)).with_context(|| format!("no {key}"))?;
        Ok(line.split_whitespace().nth(1).context("value")?.parse::<f64>()?)
    };
    Ok((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
}
