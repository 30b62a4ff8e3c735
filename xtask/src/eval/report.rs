//! EVALUATION.md: the summary against the goals, per scenario, per run, and the soak.

use std::fmt::Write as _;

use dm_lab::{Scenario, probe_log::seconds_between, soak};
use jiff::Timestamp;

use super::assess::*;

/// The goals the summary judges against.
const GOAL_RECALL: f64 = 1.0;
const GOAL_TOP1: f64 = 0.95;
const GOAL_DURATION_ERROR: f64 = 1.0;
const GOAL_LATENCY: f64 = 1.0;

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "no data",
    }
}

// ---------------------------------------------------------------------------------------------
// EVALUATION.md.

/// How the evaluation was produced.
pub struct Meta {
    pub command: String,
    pub date: Timestamp,
    pub kernel: String,
    pub commit: String,
    pub repeat: u32,
    pub soak_minutes: Option<f64>,
    pub total_seconds: f64,
}

/// The whole report.
pub fn render(meta: &Meta, runs: &[RunRecord], soak: Option<&SoakRecord>) -> String {
    let assessed: Vec<(&RunRecord, Assessment)> = runs.iter().map(|run| (run, assess(run))).collect();
    let mut out = String::new();
    let _ = writeln!(out, "# Detection quality\n");
    let _ = writeln!(
        out,
        "Produced by `{}` on {:.0} (kernel `{}`, commit `{}`): {} run(s) per scenario, {}; {:.0} s in all. \
         Regenerate with `sudo -E cargo xtask eval`; the raw runs are in `target/eval/results.json`.\n",
        meta.command,
        meta.date,
        meta.kernel,
        meta.commit,
        meta.repeat,
        meta.soak_minutes.map_or("no soak".to_string(), |m| format!("{m} min soak")),
        meta.total_seconds
    );
    let _ = writeln!(
        out,
        "Ground truth comes from the lab, which the agent never sees: the kubelet-like prober (an HTTP \
         probe with a 1 s timeout started every {} ms, 4 times kubelet's rate so that an outage is \
         measured to 250 ms, not to 1 s; outage = first failed probe → first successful one) and the client pod's UDP stream \
         (20 datagrams/s, each numbered and echoed; a datagram not echoed within 1 s is lost). Each run \
         starts a fresh agent (empty state dir) and disrupts 2 s after it is ready (cold, odd repeats) or \
         12 s after (warm, even repeats).\n",
        super::PROBE_PERIOD.as_millis()
    );
    render_summary(&mut out, &assessed, soak);
    render_scenarios(&mut out, &assessed);
    render_runs(&mut out, &assessed);
    render_soak(&mut out, soak);
    out
}

fn render_summary(out: &mut String, assessed: &[(&RunRecord, Assessment)], soak: Option<&SoakRecord>) {
    let expecting: Vec<&Assessment> = assessed.iter().map(|(_, a)| a).filter(|a| a.expects_incident).collect();
    let detected = expecting.iter().filter(|a| a.matched.is_some()).count();
    let top1 = expecting.iter().filter(|a| a.top1_correct == Some(true)).count();
    let duration_errors: Vec<f64> = assessed.iter().filter_map(|(_, a)| a.duration_error_prober).collect();
    let either_errors: Vec<f64> = assessed.iter().filter_map(|(_, a)| a.duration_error_either).collect();
    let latencies: Vec<f64> = assessed.iter().filter_map(|(_, a)| a.latency).collect();
    let decoy_false: usize = assessed.iter().filter(|(_, a)| !a.expects_incident).map(|(_, a)| a.false_incidents).sum();
    let extra_false: usize = assessed.iter().filter(|(_, a)| a.expects_incident).map(|(_, a)| a.false_incidents).sum();
    let soak_counts = soak.map(SoakRecord::counts);
    let soak_false = soak_counts.map_or(0, |(false_, _)| false_);
    let total_false = decoy_false + extra_false + soak_false;

    let fraction = |n: usize, d: usize| (d > 0).then(|| n as f64 / d as f64);
    let recall = fraction(detected, expecting.len());
    let top1_rate = fraction(top1, expecting.len());
    let duration_p95 = percentile(&abs_all(&duration_errors), 95.0);
    let either_p95 = percentile(&abs_all(&either_errors), 95.0);
    let latency_p95 = percentile(&latencies, 95.0);

    let _ = writeln!(out, "## Summary\n");
    let _ = writeln!(out, "| measure | result | goal | |\n|---|---|---|---|");
    let _ = writeln!(
        out,
        "| recall (runs of scenarios expecting an incident that got one) | {} | 100 % | {} |",
        ratio(detected, expecting.len()),
        verdict(recall.map(|r| r >= GOAL_RECALL))
    );
    let _ = writeln!(
        out,
        "| top-1 cause accuracy (of those runs) | {} | ≥ 95 % | {} |",
        ratio(top1, expecting.len()),
        verdict(top1_rate.map(|r| r >= GOAL_TOP1))
    );
    let _ = writeln!(
        out,
        "| duration error vs the prober, p95 of \\|error\\| ({} runs with an outage) | {} | ≤ 1 s | {} |",
        duration_errors.len(),
        plain(duration_p95),
        verdict(duration_p95.map(|d| d <= GOAL_DURATION_ERROR))
    );
    let _ = writeln!(
        out,
        "| duration error vs the lab's outage on either path (first failed probe or lost datagram → \
         the later of the prober's recovery and the last lost datagram), p95 of \\|error\\| ({} runs) | {} | ≤ 1 s | {} |",
        either_errors.len(),
        plain(either_p95),
        verdict(either_p95.map(|d| d <= GOAL_DURATION_ERROR))
    );
    let _ = writeln!(
        out,
        "| detection latency p95 (first seen − first loss, {} runs) | {} | ≤ 1 s | {} |",
        latencies.len(),
        plain(latency_p95),
        verdict(latency_p95.map(|l| l <= GOAL_LATENCY))
    );
    let soak_text = match soak {
        Some(soak) => {
            let per_hour = if soak.hours() > 0.0 { soak_false as f64 / soak.hours() } else { 0.0 };
            format!("{soak_false} in the soak ({per_hour:.1}/h)")
        }
        None => "no soak".to_string(),
    };
    let _ = writeln!(
        out,
        "| false incidents | {total_false}: {decoy_false} in decoy runs, {extra_false} extra in incident runs, {soak_text} | 0 | {} |",
        verdict(Some(total_false == 0))
    );
    out.push('\n');
}

fn render_scenarios(out: &mut String, assessed: &[(&RunRecord, Assessment)]) {
    let _ = writeln!(out, "## Per scenario\n");
    let _ = writeln!(
        out,
        "Onset error = incident start − first failed probe; duration error = incident duration − prober \
         outage; the same against the UDP loss window (first → last lost datagram's send time) in \
         brackets; per run also against the outage on either path (first loss on either → the later \
         of the prober's recovery and the last lost datagram): the node-to-pod path the prober \
         takes and the pod-to-pod path of the UDP stream can recover up to a second apart. Latency = when the poller (every 100 ms) first saw the incident − the first loss \
         (failed probe or lost datagram). Lost packets: the incident's `totals.lost_packets` vs the lab's \
         lost datagrams + failed probes, summed over the runs (reported, not judged).\n"
    );
    let _ = writeln!(
        out,
        "| scenario | expected | runs | with incident | top-1 correct | false | onset error p50 / max | duration error p50 / max | latency p50 / p95 | lost packets reported / truth | cold / warm detected |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let mut order: Vec<Scenario> = Vec::new();
    for (run, _) in assessed {
        if !order.contains(&run.scenario) {
            order.push(run.scenario);
        }
    }
    for scenario in order {
        let rows: Vec<&(&RunRecord, Assessment)> =
            assessed.iter().filter(|(run, _)| run.scenario == scenario).collect();
        let runs = rows.len();
        let with_incident = rows.iter().filter(|(run, a)| a.matched.is_some() || !run.incidents.is_empty()).count();
        let falses: usize = rows.iter().map(|(_, a)| a.false_incidents).sum();
        let expects = rows.first().is_some_and(|(_, a)| a.expects_incident);
        let top1 = rows.iter().filter(|(_, a)| a.top1_correct == Some(true)).count();
        let collect = |f: fn(&Assessment) -> Option<f64>| rows.iter().filter_map(|(_, a)| f(a)).collect::<Vec<f64>>();
        let onset = collect(|a| a.onset_error_prober);
        let onset_udp = collect(|a| a.onset_error_udp);
        let duration = collect(|a| a.duration_error_prober);
        let duration_udp = collect(|a| a.duration_error_udp);
        let latency = collect(|a| a.latency);
        let matched: Vec<&Assessment> = rows.iter().map(|(_, a)| a).filter(|a| a.matched.is_some()).collect();
        let reported: Option<u64> = if matched.iter().any(|a| a.lost_reported.is_some()) {
            Some(matched.iter().filter_map(|a| a.lost_reported).sum())
        } else {
            None
        };
        let truth: u64 = rows.iter().map(|(_, a)| a.lost_truth).sum();
        let lost = match reported {
            Some(reported) if truth > 0 => format!("{reported} / {truth} ({:.2}×)", reported as f64 / truth as f64),
            Some(reported) => format!("{reported} / {truth}"),
            None => format!("— / {truth}"),
        };
        let split = |cold: bool| {
            let group: Vec<&&(&RunRecord, Assessment)> = rows.iter().filter(|(run, _)| run.cold == cold).collect();
            let hit = group
                .iter()
                .filter(|(run, a)| if expects { a.matched.is_some() } else { !run.incidents.is_empty() })
                .count();
            format!("{hit}/{}", group.len())
        };
        let pair = |a: &[f64], b: &[f64]| {
            let p50 = |v: &[f64]| percentile(v, 50.0);
            if a.is_empty() && b.is_empty() {
                "—".to_string()
            } else {
                format!("{} / {} [{} / {}]", signed(p50(a)), signed(max_abs(a)), signed(p50(b)), signed(max_abs(b)))
            }
        };
        let _ = writeln!(
            out,
            "| {scenario} | {} | {runs} | {with_incident} | {} | {falses} | {} | {} | {} / {} | {lost} | {} / {} |",
            expected_text(expected(scenario)),
            if expects { format!("{top1}/{runs}") } else { "—".to_string() },
            pair(&onset, &onset_udp),
            pair(&duration, &duration_udp),
            plain(percentile(&latency, 50.0)),
            plain(percentile(&latency, 95.0)),
            split(true),
            split(false),
        );
    }
    out.push_str(
        "\n(cold / warm: runs with an incident, of the cold and the warm runs; for decoys that is a false alarm.)\n\n",
    );
}

fn render_runs(out: &mut String, assessed: &[(&RunRecord, Assessment)]) {
    let _ = writeln!(out, "## Per run\n");
    let _ = writeln!(
        out,
        "| scenario | # | start | prober outage | UDP lost | incident | start error (prober / UDP) | duration | duration error (prober / UDP / either) | latency | top cause | lost_packets / truth | other incidents |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (run, a) in assessed {
        let incident = a.matched.map(|index| &run.incidents[index].view);
        let outage = run
            .outage
            .as_ref()
            .map_or("none".to_string(), |o| format!("{:.1} s ({} probes)", o.seconds, o.failed_probes));
        let udp = match &run.udp_loss {
            Some(l) => format!("{} of {} ({:.1} s)", l.lost, run.udp_sent, l.seconds()),
            None => format!("0 of {} ({} echoed)", run.udp_sent, run.udp_received),
        };
        let lost = format!("{} / {}", a.lost_reported.map_or("—".to_string(), |n| n.to_string()), a.lost_truth);
        let others: Vec<String> = run
            .incidents
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != a.matched)
            .map(|(_, seen)| {
                format!("`{}` {:.1} s, {}", seen.view.id, seen.view.duration_seconds, seen.view.top_cause())
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {outage} | {udp} | {} | {} / {} | {} | {} / {} / {} | {} | {} | {lost} | {} |",
            run.scenario,
            run.repeat,
            if run.cold { "cold" } else { "warm" },
            incident.map_or("**none**".to_string(), |i| format!("`{}`", i.id)),
            signed(a.onset_error_prober),
            signed(a.onset_error_udp),
            incident.map_or("—".to_string(), |i| format!("{:.2} s", i.duration_seconds)),
            signed(a.duration_error_prober),
            signed(a.duration_error_udp),
            signed(a.duration_error_either),
            plain(a.latency),
            incident.map_or("—".to_string(), |i| i.top_cause()),
            if others.is_empty() { "—".to_string() } else { others.join("; ") },
        );
    }
    out.push('\n');
}

fn render_soak(out: &mut String, soak: Option<&SoakRecord>) {
    let _ = writeln!(out, "## Soak: natural traffic, no fault\n");
    let Some(soak) = soak else {
        let _ = writeln!(out, "Not run (`--no-soak`).");
        return;
    };
    let (false_, real) = soak.counts();
    let hours = soak.hours();
    let _ = writeln!(
        out,
        "A fresh agent, 2 s to warm up, then {:.1} min of pod traffic that is healthy but looks like \
         trouble to a naive detector, alongside the prober and the UDP stream:\n",
        hours * 60.0
    );
    for behaviour in soak::Behaviour::ALL {
        let _ = writeln!(out, "- `{}`: {}", behaviour.name(), behaviour.description());
    }
    let _ = writeln!(out, "\nWhere it runs:\n");
    for line in soak::layout() {
        let _ = writeln!(out, "- {line}");
    }
    let lost: u64 = soak.udp.iter().map(|s| s.lost).sum();
    let _ = writeln!(
        out,
        "\nDuring it the prober failed {} probe(s) and the UDP client lost {lost} of {} datagrams.\n",
        soak.failed_probes.len(),
        soak.udp_sent
    );
    let _ = writeln!(
        out,
        "| duration | incidents | false incidents | false per hour | soak incidents with real loss |\n|---|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| {:.1} min | {} | {false_} | {:.1} | {real} |\n",
        hours * 60.0,
        soak.incidents.len(),
        if hours > 0.0 { false_ as f64 / hours } else { 0.0 }
    );
    if !soak.incidents.is_empty() {
        let _ = writeln!(out, "| incident | start | duration | top cause | real loss near it |\n|---|---|---|---|---|");
        for seen in &soak.incidents {
            let _ = writeln!(
                out,
                "| `{}` | {:+.1} s into the soak | {:.2} s | {} | {} |",
                seen.view.id,
                seconds_between(soak.started, seen.view.start),
                seen.view.duration_seconds,
                seen.view.top_cause(),
                if soak_incident_had_loss(&seen.view, &soak.failed_probes, &soak.udp) { "yes" } else { "no" }
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::{super::assess::fixtures::*, *};

    #[test]
    fn the_report_has_every_section_and_judges_the_goals() {
        let good = seen(
            incident(
                "g",
                "2026-01-12T20:58:41.3Z",
                Some("2026-01-12T20:58:49.6Z"),
                8.3,
                &[("process_restart", "ovs-vswitchd")],
            ),
            "2026-01-12T20:58:41.8Z",
        );
        let runs = vec![run(Scenario::SdnUpgrade, vec![good]), run(Scenario::BenignRestart, vec![])];
        let meta = Meta {
            command: "cargo xtask eval --repeat 1".into(),
            date: ts("2026-01-12T21:00:00Z"),
            kernel: "6.12.0".into(),
            commit: "abc1234".into(),
            repeat: 1,
            soak_minutes: None,
            total_seconds: 95.0,
        };
        let text = render(&meta, &runs, None);
        for needle in [
            "# Detection quality",
            "kernel `6.12.0`, commit `abc1234`",
            "## Summary",
            "| recall (runs of scenarios expecting an incident that got one) | 100 % (1/1) | 100 % | met |",
            "| top-1 cause accuracy (of those runs) | 100 % (1/1) | ≥ 95 % | met |",
            "| false incidents | 0: 0 in decoy runs, 0 extra in incident runs, no soak | 0 | met |",
            "## Per scenario",
            "| sdn-upgrade | incident, process_restart ovs-vswitchd | 1 | 1 | 1/1 | 0 |",
            "| benign-restart | no incident | 1 | 0 | — | 0 |",
            "## Per run",
            "`g`",
            "— / 168",
            "## Soak: natural traffic, no fault",
            "Not run",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        // Latency 0.6 s (first loss 41.2, seen 41.8) meets the goal; duration error 0.3 s too.
        assert!(text.contains("| 0.30 s | ≤ 1 s | met |"), "{text}");
        assert!(text.contains("| 0.60 s | ≤ 1 s | met |"), "{text}");
        // A missed run is called out.
        let missed = render(&meta, &[run(Scenario::OvsRestart, vec![])], None);
        assert!(missed.contains("0 % (0/1) | 100 % | **missed** |"), "{missed}");
        assert!(missed.contains("**none**"), "{missed}");
    }
}
