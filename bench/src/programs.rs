//! Section 1, per-packet cost of each kernel program: the kernel's BPF run-time statistics
//! of the agent's programs, minus those of empty programs of the same type on the same
//! hooks, measured over the same packets.

use std::{
    collections::BTreeMap,
    net::UdpSocket,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{
    Bench,
    kernel::{self, Baselines, RunStats},
    progress,
    report::{Figure, Section, table},
    traffic,
};

const IPERF_PORT: u16 = 5301;

struct Row {
    program: String,
    hook: &'static str,
    workload: String,
    agent: RunStats,
    empty: RunStats,
}

impl Row {
    fn added_ns(&self) -> Option<f64> {
        Some(self.agent.ns_per_run()? - self.empty.ns_per_run()?)
    }
}

pub fn measure(bench: &Bench) -> Result<Section> {
    let topology = &bench.topology;
    let agent = bench.start_agent(2)?;
    let pid = agent.pid().context("agent pid")?;
    let agent_ids = kernel::agent_programs(pid)?;
    let _stats = kernel::stats_enabled()?;
    let mut baselines = Baselines::load()?;
    for veth in [&topology.a.veth, &topology.b.veth] {
        baselines.attach_tc(veth)?;
    }
    let empty_ids = baselines.ids()?;
    let id_of = |name: &str| agent_ids.get(name).copied().with_context(|| format!("the agent has no {name} program"));
    let mut all_ids: Vec<u32> = agent_ids.values().chain(empty_ids.values()).copied().collect();
    all_ids.sort_unstable();
    let snapshot = || kernel::run_stats(&all_ids);
    let during = |work: &mut dyn FnMut() -> Result<()>| -> Result<BTreeMap<u32, RunStats>> {
        let before = snapshot()?;
        work()?;
        let after = snapshot()?;
        Ok(after.into_iter().map(|(id, stats)| (id, stats.since(before[&id]))).collect())
    };
    let run = bench.plan.program_run;
    let mut rows = Vec::new();

    for flows in [1u32, 1_000, 65_000] {
        progress(&format!("  tc program, SYNs over {flows} flows"));
        let syns = traffic::syn_flows(&topology.a, flows, None)?;
        // Every flow is in the table before measuring.
        let deadline = Instant::now() + Duration::from_secs(30);
        while syns.sent.load(std::sync::atomic::Ordering::Relaxed) < 2 * u64::from(flows) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let delta = during(&mut || {
            thread::sleep(run);
            Ok(())
        })?;
        syns.stop()?;
        rows.push(Row {
            program: "tc_ingress".into(),
            hook: "tcx ingress (from the pod)",
            workload: format!("TCP SYNs round-robin over {} flows", thousands(u64::from(flows))),
            agent: delta[&id_of("tc_ingress")?],
            empty: delta[&empty_ids["empty_tc_ingress"]],
        });
    }

    progress("  tc programs, UDP pod to pod");
    let server = traffic::Iperf3Server::start(&topology.b.ns, IPERF_PORT)?;
    let delta = during(&mut || traffic::udp64(&topology.a.ns, &topology.b.pod_ip, IPERF_PORT, run).map(drop))?;
    drop(server);
    for (program, empty, hook) in [
        ("tc_ingress", "empty_tc_ingress", "tcx ingress (from the pod)"),
        ("tc_egress", "empty_tc_egress", "tcx egress (to the pod)"),
    ] {
        rows.push(Row {
            program: program.into(),
            hook,
            workload: "UDP, 64-byte payloads, pod to pod (no flow-table access)".into(),
            agent: delta[&id_of(program)?],
            empty: delta[&empty_ids[empty]],
        });
    }

    progress("  drop tracer, UDP to a closed port");
    let target = format!("{}:9", topology.a.host_ip);
    let delta = during(&mut || {
        let target = target.clone();
        topology.a.ns.run(move || -> Result<()> {
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            let started = Instant::now();
            while started.elapsed() < run {
                for _ in 0..64 {
                    // ICMP port-unreachable answers make some sends fail: that is fine here.
                    let _ = socket.send_to(&[0u8; 64], &target);
                }
            }
            Ok(())
        })?
    })?;
    let (drop_program, empty_drop) = if delta.get(&id_of("kfree_skb_btf").unwrap_or(0)).is_some_and(|s| s.count > 0) {
        ("kfree_skb_btf", kernel::EMPTY_KFREE_BTF)
    } else {
        ("kfree_skb_tp", kernel::EMPTY_KFREE_TP)
    };
    rows.push(Row {
        program: drop_program.into(),
        hook: if drop_program.ends_with("btf") { "tp_btf skb:kfree_skb" } else { "tracepoint skb:kfree_skb" },
        workload: "UDP to a closed port (NO_SOCKET drops), node-wide".into(),
        agent: delta[&id_of(drop_program)?],
        empty: delta[&empty_ids[empty_drop]],
    });

    progress("  process tracer, short-lived processes");
    let execs = bench.plan.execs;
    let delta = during(&mut || {
        for _ in 0..execs {
            Command::new("/bin/true").status()?;
        }
        Ok(())
    })?;
    for (program, empty, hook) in [
        ("process_exec", kernel::EMPTY_EXEC, "tracepoint sched:sched_process_exec"),
        ("process_exit", kernel::EMPTY_EXIT, "tracepoint sched:sched_process_exit"),
    ] {
        rows.push(Row {
            program: program.into(),
            hook,
            workload: format!("{execs} runs of /bin/true (unwatched names), node-wide"),
            agent: delta[&id_of(program)?],
            empty: delta[&empty_ids[empty]],
        });
    }
    drop(agent);

    let ns = |value: Option<f64>| value.map_or_else(|| "—".into(), |ns| format!("{ns:.0}"));
    let body_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                format!("`{}`", row.program),
                row.hook.into(),
                row.workload.clone(),
                thousands(row.agent.count),
                ns(row.agent.ns_per_run()),
                ns(row.empty.ns_per_run()),
                format!("**{}**", ns(row.added_ns())),
            ]
        })
        .collect();
    let tc_flows: Vec<String> = rows.iter().take(3).map(|row| ns(row.added_ns())).collect();
    let mut figures = vec![Figure::info(
        "tc program, added ns per packet, SYNs over 1 / 1,000 / 65,000 flows",
        format!("{} ns", tc_flows.join(" / ")),
    )];
    for row in &rows[3..] {
        figures.push(Figure::info(
            format!("`{}` added ns per run ({})", row.program, row.workload.split(',').next().unwrap_or_default()),
            format!("{} ns", ns(row.added_ns())),
        ));
    }
    let body = format!(
        "The kernel's BPF run-time statistics (`BPF_ENABLE_STATS`) give each program's total run time and \
         run count. Beside each of the agent's programs the bench attaches an empty program of the same type \
         on the same hook (monitor-ebpf/src/baselines.rs; tcx programs go after the agent's), so both run on \
         exactly the same packets and events. In a VM the two clock reads the statistics add to every run \
         dominate the raw figures; only the difference, *added*, is the agent's own work. The SYN workload \
         sends raw SYNs from a pod, round-robin over N flows, to an address the host routes to an ifb \
         interface that consumes them: no answer, no drop, so every flow stays in the flow table (65,536 \
         entries, LRU) and every packet is a flow-table lookup and in-place update; the UDP rows are the common \
         case, packets that touch only the per-interface counters. Measured over {} s per row with the agent \
         attached to the two pod veths.\n\n{}",
        run.as_secs(),
        table(&["program", "hook", "workload", "runs", "agent ns/run", "empty ns/run", "added ns/run"], &body_rows)
    );
    Ok(Section { title: "1. Per-packet cost of each program".into(), figures, body })
}

pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
