//! EVALUATION.md: the summary against the goals, per scenario, per run, and the soak.

use std::fmt::Write as _;

use dm_lab::{Scenario, probe_log::seconds_between, soak};
use jiff::Timestamp;

use super::{
    assess::*,
    stats::{bootstrap_percentile, poisson_upper_per_hour, rate_interval, seconds_interval, wilson},
};

/// Runs whose fault came this soon after the agent was ready count as early: the benign-class
/// drop baselines need 5 calm seconds.
const EARLY_SECONDS: f64 = 5.0;

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

/// Where a section that `eval --vm KERNEL` added begins.
fn vm_marker(kernel: &str) -> String {
    format!("<!-- cargo xtask eval --vm {kernel} -->")
}

const VM_MARKER_PREFIX: &str = "<!-- cargo xtask eval --vm ";

/// EVALUATION.md with its host part (everything before the first VM section) replaced by
/// `host`; the VM sections stay as they were.
pub fn with_host_part(existing: &str, host: &str) -> String {
    match existing.find(VM_MARKER_PREFIX) {
        Some(at) => format!("{}\n{}", host.trim_end(), &existing[at..]),
        None => host.to_string(),
    }
}

/// EVALUATION.md with the section of the `kernel` VM replaced by (or, new, followed by) the
/// guest's report, its title made the section's.
pub fn with_vm_section(existing: &str, kernel: &str, report: &str) -> String {
    let marker = vm_marker(kernel);
    let body = report.strip_prefix("# Detection quality\n").unwrap_or(report).trim();
    let section = format!(
        "{marker}\n\n# Detection quality on OVS's kernel datapath, in a Linux {kernel} test VM\n\n\
         The same eval inside `cargo xtask vm`'s Linux {kernel} guest (software-emulated CPUs, so \
         every figure is slower than on a node), its lab on `openvswitch.ko`.\n\n{body}\n"
    );
    let Some(start) = existing.find(&marker) else {
        return format!("{}\n\n{section}", existing.trim_end());
    };
    let rest = &existing[start + marker.len()..];
    let end = rest.find(VM_MARKER_PREFIX).map_or(existing.len(), |at| start + marker.len() + at);
    format!(
        "{}{section}{}",
        &existing[..start],
        if end < existing.len() { format!("\n{}", &existing[end..]) } else { String::new() }
    )
}

/// How the evaluation was produced.
pub struct Meta {
    pub command: String,
    pub date: Timestamp,
    pub kernel: String,
    pub commit: String,
    pub repeat: u32,
    /// The seed of the fault plans (and of the bootstrap's resamples).
    pub seed: u64,
    /// OVS's datapath under the lab's bridge.
    pub datapath: dm_lab::Datapath,
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
        "Produced by `{}` on {:.0} (kernel `{}`, OVS {} datapath, commit `{}`): {} run(s) per scenario, {}; {:.0} s in all. \
         Regenerate with `sudo -E cargo xtask eval`; the raw runs are in `target/eval/results.json`.\n",
        meta.command,
        meta.date,
        meta.kernel,
        meta.datapath,
        meta.commit,
        meta.repeat,
        meta.soak_minutes.map_or("no soak".to_string(), |m| format!("{m} min soak")),
        meta.total_seconds
    );
    let _ = writeln!(
        out,
        "Ground truth comes from the lab, which the agent never sees: the kubelet-like prober (an HTTP \
         probe with a 1 s timeout started every {} ms, 4 times kubelet's rate so that an outage is \
         measured to 250 ms, not to 1 s; outage = first failed probe → first successful one) and a UDP stream \
         between two pods (20 datagrams/s, each numbered and echoed; a datagram not echoed within 1 s is lost). Each run \
         starts a fresh agent (empty state dir) and draws its fault's plan from seed {}: which pod the \
         node probes and which two pods stream (any of the 3 × 6 layouts; `silent-drop` drops in the \
         stream's server), the delay from \
         the agent's readiness to the fault ({:.1}–{:.0} s), how long the fault is held ({:.0}–{:.0} s), \
         SIGTERM or SIGKILL for the sdn, and in the seed whether the CNI config goes before or after \
         the OVS restart. The same seed replays the same plans. Intervals are 95 %: Wilson score \
         intervals for rates, percentile bootstrap ({} resamples) for p95s, and an exact Poisson upper \
         bound for false incidents per hour of soak.\n",
        super::PROBE_PERIOD.as_millis(),
        meta.seed,
        dm_lab::plan::DELAY_MS.0 as f64 / 1000.0,
        dm_lab::plan::DELAY_MS.1 as f64 / 1000.0,
        dm_lab::plan::HOLD_MS.0 as f64 / 1000.0,
        dm_lab::plan::HOLD_MS.1 as f64 / 1000.0,
        super::stats::BOOTSTRAP_RESAMPLES,
    );
    render_summary(&mut out, &assessed, soak, meta.seed);
    render_scenarios(&mut out, &assessed);
    render_runs(&mut out, &assessed);
    render_soak(&mut out, soak);
    out
}

fn render_summary(out: &mut String, assessed: &[(&RunRecord, Assessment)], soak: Option<&SoakRecord>, seed: u64) {
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
    let mut pods = PodScore::default();
    for (_, a) in assessed {
        if let Some(score) = &a.pods {
            pods.add(score);
        }
    }
    let p95_interval = |values: &[f64]| seconds_interval(bootstrap_percentile(values, 95.0, seed));

    let _ = writeln!(out, "## Summary\n");
    let _ = writeln!(out, "| measure | result | 95 % interval | goal | |\n|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| recall (runs of scenarios expecting an incident that got one) | {} | {} | 100 % | {} |",
        ratio(detected, expecting.len()),
        rate_interval(wilson(detected, expecting.len())),
        verdict(recall.map(|r| r >= GOAL_RECALL))
    );
    let _ = writeln!(
        out,
        "| top-1 cause accuracy (of those runs) | {} | {} | ≥ 95 % | {} |",
        ratio(top1, expecting.len()),
        rate_interval(wilson(top1, expecting.len())),
        verdict(top1_rate.map(|r| r >= GOAL_TOP1))
    );
    let _ = writeln!(
        out,
        "| pod precision (pods the matched incidents name that lost traffic in truth) | {} | {} | | reported |",
        ratio(pods.right, pods.named),
        rate_interval(wilson(pods.right, pods.named)),
    );
    let _ = writeln!(
        out,
        "| pod recall (pods that lost traffic in truth that the matched incidents name) | {} | {} | | reported |",
        ratio(pods.right, pods.truth),
        rate_interval(wilson(pods.right, pods.truth)),
    );
    let _ = writeln!(
        out,
        "| duration error vs the prober, p95 of \\|error\\| ({} runs with an outage) | {} | {} | ≤ 1 s | {} |",
        duration_errors.len(),
        plain(duration_p95),
        p95_interval(&abs_all(&duration_errors)),
        verdict(duration_p95.map(|d| d <= GOAL_DURATION_ERROR))
    );
    let _ = writeln!(
        out,
        "| duration error vs the lab's outage on either path (first failed probe or lost datagram → \
         the later of the prober's recovery and the last lost datagram), p95 of \\|error\\| ({} runs) | {} | {} | ≤ 1 s | {} |",
        either_errors.len(),
        plain(either_p95),
        p95_interval(&abs_all(&either_errors)),
        verdict(either_p95.map(|d| d <= GOAL_DURATION_ERROR))
    );
    let _ = writeln!(
        out,
        "| detection latency p95 (first seen − first loss, {} runs) | {} | {} | ≤ 1 s | {} |",
        latencies.len(),
        plain(latency_p95),
        p95_interval(&latencies),
        verdict(latency_p95.map(|l| l <= GOAL_LATENCY))
    );
    let decoy_runs = assessed.iter().filter(|(_, a)| !a.expects_incident).count();
    let decoy_runs_false = assessed.iter().filter(|(_, a)| !a.expects_incident && a.false_incidents > 0).count();
    let (soak_text, soak_bound) = match soak {
        Some(soak) => {
            let per_hour = if soak.hours() > 0.0 { soak_false as f64 / soak.hours() } else { 0.0 };
            let bound = poisson_upper_per_hour(soak_false as u64, soak.hours())
                .map_or_else(|| "—".to_string(), |b| format!("soak: ≤ {b:.1} false incidents/h"));
            (format!("{soak_false} in the soak ({per_hour:.1}/h)"), bound)
        }
        None => ("no soak".to_string(), "no soak".to_string()),
    };
    let _ = writeln!(
        out,
        "| false incidents | {total_false}: {decoy_false} in decoy runs ({decoy_runs_false} of {decoy_runs} decoy runs), {extra_false} extra in incident runs, {soak_text} | decoy runs with one: {}; {soak_bound} | 0 | {} |",
        rate_interval(wilson(decoy_runs_false, decoy_runs)),
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
        "| scenario | expected | runs | with incident | top-1 correct | false | onset error p50 / max | duration error p50 / max | latency p50 / p95 | lost packets reported / truth | pods right / named / truth | early / late with incident |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
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
        let mut pods = PodScore::default();
        for (_, a) in &rows {
            if let Some(score) = &a.pods {
                pods.add(score);
            }
        }
        let split = |early: bool| {
            let group: Vec<&&(&RunRecord, Assessment)> =
                rows.iter().filter(|(run, _)| (run.plan.delay_seconds < EARLY_SECONDS) == early).collect();
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
            "| {scenario} | {} | {runs} | {with_incident} | {} | {falses} | {} | {} | {} / {} | {lost} | {} / {} / {} | {} / {} |",
            expected_text(expected(scenario)),
            if expects { format!("{top1}/{runs}") } else { "—".to_string() },
            pair(&onset, &onset_udp),
            pair(&duration, &duration_udp),
            plain(percentile(&latency, 50.0)),
            plain(percentile(&latency, 95.0)),
            pods.right,
            pods.named,
            pods.truth,
            split(true),
            split(false),
        );
    }
    out.push_str(
        "\n(early / late: runs with an incident, of those whose fault came less than 5 s after the agent was \
         ready and of the rest; for decoys that is a false alarm. Pods: summed over the runs' matched \
         incidents.)\n\n",
    );
}

fn render_runs(out: &mut String, assessed: &[(&RunRecord, Assessment)]) {
    let _ = writeln!(out, "## Per run\n");
    let _ = writeln!(
        out,
        "| scenario | # | plan (delay to the fault; the fault) | prober outage | UDP lost | incident | start error (prober / UDP) | duration | duration error (prober / UDP / either) | latency | top cause | lost_packets / truth | other incidents |"
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
        let plan =
            format!("{:.1} s; {}; {}", run.plan.delay_seconds, run.plan.describe(run.scenario), run.roles.describe());
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
            "| {} | {} | {plan} | {outage} | {udp} | {} | {} / {} | {} | {} / {} / {} | {} | {} | {lost} | {} |",
            run.scenario,
            run.repeat,
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
        "| duration | incidents | false incidents | false per hour | 95 % upper bound per hour | soak incidents with real loss |\n|---|---|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| {:.1} min | {} | {false_} | {:.1} | {} | {real} |\n",
        hours * 60.0,
        soak.incidents.len(),
        if hours > 0.0 { false_ as f64 / hours } else { 0.0 },
        poisson_upper_per_hour(false_ as u64, hours).map_or("—".to_string(), |b| format!("{b:.1}")),
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
    fn vm_sections_are_kept_and_replaced_in_place() {
        let host = "# Detection quality\n\nhost one\n";
        let guest = "# Detection quality\n\nguest one\n";
        let with_vm = with_vm_section(host, "6.12", guest);
        assert!(with_vm.starts_with("# Detection quality\n\nhost one"), "{with_vm}");
        assert!(with_vm.contains("<!-- cargo xtask eval --vm 6.12 -->\n\n# Detection quality on OVS's kernel datapath, in a Linux 6.12 test VM"));
        assert!(with_vm.contains("guest one") && !with_vm.contains("guest one\n# Detection quality\n"));
        // A new host run keeps the VM's section; a new VM run replaces only its own.
        let rerun = with_host_part(&with_vm, "# Detection quality\n\nhost two\n");
        assert!(rerun.contains("host two") && !rerun.contains("host one") && rerun.contains("guest one"), "{rerun}");
        let both = with_vm_section(&rerun, "6.1", "# Detection quality\n\nold kernel\n");
        let replaced = with_vm_section(&both, "6.12", "# Detection quality\n\nguest two\n");
        assert!(replaced.contains("guest two") && !replaced.contains("guest one"), "{replaced}");
        assert!(replaced.contains("old kernel") && replaced.contains("host two"), "{replaced}");
        assert_eq!(replaced.matches("<!-- cargo xtask eval --vm 6.12 -->").count(), 1);
        assert_eq!(with_host_part("", host), host);
    }

    #[test]
    fn the_report_has_every_section_and_judges_the_goals() {
        let mut good = incident(
            "g",
            "2026-01-12T20:58:41.3Z",
            Some("2026-01-12T20:58:49.6Z"),
            8.3,
            &[("process_restart", "ovs-vswitchd")],
        );
        // Two pods named, both right; the web pod (lost traffic too) missing; tun0 has no pod.
        good["interfaces"] = serde_json::json!([
            {"interface": "veth1", "pod_namespace": "openshift-apiserver", "pod": "apiserver-zg25k"},
            {"interface": "veth2", "pod_namespace": "client", "pod": "client-1"},
            {"interface": "tun0"},
        ]);
        let good = seen(good, "2026-01-12T20:58:41.8Z");
        let runs = vec![run(Scenario::SdnUpgrade, vec![good]), run(Scenario::BenignRestart, vec![])];
        let meta = Meta {
            command: "cargo xtask eval --repeat 1".into(),
            date: ts("2026-01-12T21:00:00Z"),
            kernel: "6.12.0".into(),
            commit: "abc1234".into(),
            repeat: 1,
            seed: 7,
            datapath: dm_lab::Datapath::Userspace,
            soak_minutes: None,
            total_seconds: 95.0,
        };
        let text = render(&meta, &runs, None);
        for needle in [
            "# Detection quality",
            "kernel `6.12.0`, OVS userspace datapath, commit `abc1234`",
            "## Summary",
            "draws its fault's plan from seed 7",
            "| recall (runs of scenarios expecting an incident that got one) | 100 % (1/1) | [21 %, 100 %] | 100 % | met |",
            "| top-1 cause accuracy (of those runs) | 100 % (1/1) | [21 %, 100 %] | ≥ 95 % | met |",
            "| pod precision (pods the matched incidents name that lost traffic in truth) | 100 % (2/2) |",
            "| pod recall (pods that lost traffic in truth that the matched incidents name) | 67 % (2/3) |",
            "| false incidents | 0: 0 in decoy runs (0 of 1 decoy runs), 0 extra in incident runs, no soak | decoy runs with one: [0 %, 79 %]; no soak | 0 | met |",
            "| 2 / 2 / 3 | 1/1 / 0/0 |",
            "| 2.0 s; hold 9.0 s, SIGTERM, CNI config removed, then OVS restarted; probe → apiserver, stream client → web |",
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
        assert!(text.contains("| 0.30 s | [0.30 s, 0.30 s] | ≤ 1 s | met |"), "{text}");
        assert!(text.contains("| 0.60 s | [0.60 s, 0.60 s] | ≤ 1 s | met |"), "{text}");
        // A missed run is called out.
        let missed = render(&meta, &[run(Scenario::OvsRestart, vec![])], None);
        assert!(missed.contains("0 % (0/1) | [0 %, 79 %] | 100 % | **missed** |"), "{missed}");
        assert!(missed.contains("**none**"), "{missed}");
    }
}
