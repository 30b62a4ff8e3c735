//! `/metrics`: every metric family the agent exports, in this one file: the names and labels
//! that dashboards and alert rules (deploy/prometheus) depend on.
//!
//! Kernel counters are absolute, so each scrape encodes constant metrics from the latest
//! [`Sample`](crate::sampling::sampler::Sample) and from fresh snapshots of the lifecycle
//! state and the incident engine, instead of keeping a second set of counters in user space.
//! Three collectors, one per source:
//!
//! - the sample: `datapath_packets_total`, `datapath_bytes_total`, `datapath_group_packets_total`,
//!   `datapath_tcp_resets_total`,
//!   `datapath_tcp_syn_retransmits_total`, `datapath_tcp_retransmits_total`, `datapath_tcp_handshakes_total`,
//!   `datapath_tcp_handshakes_answered_total`,
//!   `datapath_tcp_handshakes_unseen_service_total`, `datapath_unanswered_packets_total`, `datapath_drops_total`,
//!   `datapath_switch_unforwarded_packets_total`,
//!   `datapath_interfaces_attached`, `datapath_bpf_program_runs_total`,
//!   `datapath_bpf_program_run_seconds_total`, `datapath_probe_loaded`,
//!   `datapath_bpf_map_update_errors_total`;
//! - the lifecycle state: `datapath_cni_default_network_present`,
//!   `datapath_cni_config_changes_total`, `datapath_sdn_process_running`,
//!   `datapath_sdn_process_restarts_total`, `datapath_lifecycle_events_total`,
//!   `datapath_cni_cache_files_skipped_total`, `datapath_source_up`, `datapath_source_failures_total`;
//! - the incident engine: `datapath_incidents_total`, `datapath_incident_lost_packets_total`,
//!   `datapath_incident_active`,
//!   `datapath_incident_duration_seconds`; the incident history: `datapath_incident_store_up`,
//!   `datapath_incident_store_errors_total`.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use crate::{
    datapath::probes::RETRANSMIT_PROBE,
    incidents::{engine::SharedEngine, history::IncidentHistory},
    lifecycle::{Lifecycle, cni::CniDirSnapshot, pods::PodIndex},
    sampling::sampler::{LatestSample, OTHER_INTERFACE, map_error_name},
    sync,
};

/// The registry of every family, encoded at each scrape.
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// Every family: from the latest sample, the lifecycle state and the incident engine.
    pub fn new(
        sample: Arc<LatestSample>,
        lifecycle: Arc<Lifecycle>,
        engine: SharedEngine,
        history: Arc<IncidentHistory>,
    ) -> Self {
        Self::of(vec![
            Box::new(SampleCollector { sample }),
            Box::new(LifecycleCollector(lifecycle)),
            Box::new(IncidentCollector(engine, history)),
        ])
    }

    fn of(collectors: Vec<Box<dyn Collector>>) -> Self {
        let mut registry = Registry::default();
        for collector in collectors {
            registry.register_collector(collector);
        }
        Self { registry }
    }

    /// OpenMetrics text, ending in `# EOF`.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut body = String::with_capacity(16 * 1024);
        encode(&mut body, &self.registry)?;
        Ok(body)
    }
}

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// One metric family, from (labels, metric) pairs.
fn family<'a, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl Iterator<Item = (Labels<'a>, M)>,
) -> Result<(), std::fmt::Error> {
    // Like client_golang, a family without series is left out rather than sent empty.
    let mut series = series.peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Labels<'a>, u64)>,
) -> Result<(), std::fmt::Error> {
    family(encoder, name, help, MetricType::Counter, series.map(|(labels, value)| (labels, ConstCounter::new(value))))
}

fn gauge<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Labels<'a>, i64)>,
) -> Result<(), std::fmt::Error> {
    family(encoder, name, help, MetricType::Gauge, series.map(|(labels, value)| (labels, ConstGauge::new(value))))
}

/// The per-interface, kernel and probe families, from the latest sample.
#[derive(Debug)]
struct SampleCollector {
    sample: Arc<LatestSample>,
}

impl Collector for SampleCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sample = self.sample.get();
        let directions = |series: &crate::sampling::sampler::InterfaceSeries| {
            [("ingress", series.counters.ingress), ("egress", series.counters.egress)]
        };
        let per_direction = |pick: fn(&monitor_common::DirectionCounters) -> u64| {
            sample.interfaces.iter().flat_map(move |s| {
                directions(s).into_iter().map(move |(direction, counters)| {
                    let labels: Labels = vec![
                        ("interface", s.interface.as_str()),
                        ("direction", direction),
                        ("pod_namespace", s.pod_namespace.as_str()),
                        ("pod", s.pod.as_str()),
                    ];
                    (labels, pick(&counters))
                })
            })
        };
        counter(
            &mut encoder,
            "datapath_packets",
            "Packets seen by tc on watched interfaces.",
            per_direction(|c| c.packets),
        )?;
        counter(
            &mut encoder,
            "datapath_bytes",
            "Bytes (skb length) seen by tc on watched interfaces.",
            per_direction(|c| c.bytes),
        )?;
        counter(
            &mut encoder,
            "datapath_group_packets",
            "Packets to a broadcast or multicast MAC address seen by tc on watched interfaces.",
            per_direction(|c| c.group),
        )?;
        counter(&mut encoder, "datapath_tcp_resets", "TCP segments carrying RST.", per_direction(|c| c.tcp_resets))?;
        counter(
            &mut encoder,
            "datapath_tcp_handshakes",
            "TCP handshakes started (SYNs that are not retransmits) in this direction.",
            per_direction(|c| c.syns),
        )?;
        counter(
            &mut encoder,
            "datapath_tcp_handshakes_answered",
            "TCP handshakes started in this direction that got a SYN-ACK or a reset.",
            per_direction(|c| c.syns_answered),
        )?;
        counter(
            &mut encoder,
            "datapath_tcp_handshakes_unseen_service",
            "Of datapath_tcp_handshakes: those to a service (address and port) not seen answering a handshake before, a scan's or a filtered port's (benign-class evidence).",
            per_direction(|c| c.unseen_syns),
        )?;
        counter(
            &mut encoder,
            "datapath_unanswered_packets",
            "Packets sent in this direction by conversations that got nothing back for 400 ms.",
            per_direction(|c| c.unanswered),
        )?;
        counter(
            &mut encoder,
            "datapath_tcp_syn_retransmits",
            "SYNs repeating an earlier unanswered SYN of the same flow.",
            sample.interfaces.iter().map(|s| {
                let labels: Labels = vec![
                    ("interface", s.interface.as_str()),
                    ("pod_namespace", s.pod_namespace.as_str()),
                    ("pod", s.pod.as_str()),
                ];
                (labels, s.counters.ingress.syn_retransmits + s.counters.egress.syn_retransmits)
            }),
        )?;
        // Without the retransmit tracer nothing is counted: no series rather than zeros.
        let retransmits_counted = sample.probes.probes.get(RETRANSMIT_PROBE).is_some_and(Option::is_some);
        let watched_retransmits = sample.interfaces.iter().map(|s| {
            let labels: Labels = vec![
                ("interface", s.interface.as_str()),
                ("pod_namespace", s.pod_namespace.as_str()),
                ("pod", s.pod.as_str()),
            ];
            (labels, s.tcp_retransmits)
        });
        let other_retransmits = std::iter::once((
            vec![("interface", OTHER_INTERFACE), ("pod_namespace", ""), ("pod", "")],
            sample.other_tcp_retransmits,
        ));
        counter(
            &mut encoder,
            "datapath_tcp_retransmits",
            "TCP data segments retransmitted by sockets of this pod's network namespace or to this pod's addresses \
             (SYN retransmits excluded).",
            watched_retransmits.chain(other_retransmits).filter(|_| retransmits_counted),
        )?;
        let watched_drops = sample.interfaces.iter().flat_map(|s| {
            s.drops.iter().map(move |(reason, count)| {
                let labels: Labels = vec![
                    ("interface", s.interface.as_str()),
                    ("reason", reason.as_str()),
                    ("pod_namespace", s.pod_namespace.as_str()),
                    ("pod", s.pod.as_str()),
                ];
                (labels, *count)
            })
        });
        let other_drops = sample.other_drops.iter().map(|(reason, count)| {
            let labels: Labels =
                vec![("interface", OTHER_INTERFACE), ("reason", reason.as_str()), ("pod_namespace", ""), ("pod", "")];
            (labels, *count)
        });
        counter(
            &mut encoder,
            "datapath_drops",
            "Packets the kernel dropped (kfree_skb), by device and drop reason.",
            watched_drops.chain(other_drops),
        )?;
        counter(
            &mut encoder,
            "datapath_switch_unforwarded_packets",
            "Packets that entered a switch (bridge, OVS datapath) on a watched port and left on none, per sample entered minus left.",
            sample.switches.iter().map(|s| {
                let labels: Labels = vec![("switch", s.interface.as_str())];
                (labels, s.drops.values().sum::<u64>())
            }),
        )?;
        counter(
            &mut encoder,
            "datapath_ovs_lookups",
            "OVS kernel datapath flow-table lookups, as the datapath counts them (ovs-dpctl show): hit a flow, \
             missed (an upcall to ovs-vswitchd), lost (an upcall that failed, whether the packet was freed as a drop or not).",
            sample.ovs_datapaths.iter().flat_map(|dp| {
                [("hit", dp.hit), ("missed", dp.missed), ("lost", dp.lost)].map(|(result, count)| {
                    let labels: Labels = vec![("datapath", dp.name.as_str()), ("result", result)];
                    (labels, count)
                })
            }),
        )?;
        gauge(
            &mut encoder,
            "datapath_ovs_flows",
            "Flows in each OVS kernel datapath's flow table.",
            sample
                .ovs_datapaths
                .iter()
                .map(|dp| (vec![("datapath", dp.name.as_str())], i64::try_from(dp.flows).unwrap_or(i64::MAX))),
        )?;
        gauge(
            &mut encoder,
            "datapath_interfaces_attached",
            "Interfaces the tc programs are attached to.",
            std::iter::once((Labels::new(), i64::try_from(sample.attached).unwrap_or(i64::MAX))),
        )?;
        gauge(
            &mut encoder,
            "datapath_bpf_map_entries",
            "Entries in the kernel's counter maps.",
            sample.map_entries.iter().map(|(map, n)| (vec![("map", *map)], i64::try_from(*n).unwrap_or(i64::MAX))),
        )?;
        gauge(
            &mut encoder,
            "datapath_flow_table_entries",
            "Handshakes awaiting an answer in the kernel's LRU flow table (counted every 10 s).",
            std::iter::once((Labels::new(), i64::try_from(sample.flow_table_entries).unwrap_or(i64::MAX))),
        )?;
        counter(
            &mut encoder,
            "datapath_monitor_samples_judged",
            "Samples of the kernel's counters the incident engine has judged since the agent started (one per sample interval).",
            std::iter::once((Labels::new(), sample.judged)),
        )?;
        counter(
            &mut encoder,
            "datapath_flow_table_evictions",
            "Handshakes the full LRU flow table evicted to make room: their SYN retransmits and answers go uncounted.",
            std::iter::once((Labels::new(), sample.flow_table_evictions)),
        )?;
        counter(
            &mut encoder,
            "datapath_bpf_map_entries_collected",
            "Idle kernel entries no watched interface owns (deleted namespaces, vanished devices), folded into other and removed.",
            sample.entries_collected.iter().map(|(map, n)| (vec![("map", *map)], *n)),
        )?;
        counter(
            &mut encoder,
            "datapath_tc_programs_removed",
            "tc programs found removed from a watched interface by someone else, each attached again.",
            std::iter::once((Labels::new(), sample.tc_programs_removed)),
        )?;
        counter(
            &mut encoder,
            "datapath_tc_reattach_failures",
            "Attempts to attach a removed tc program again that failed (retried every 5 s).",
            std::iter::once((Labels::new(), sample.tc_reattach_failures)),
        )?;
        counter(
            &mut encoder,
            "datapath_bpf_program_runs",
            "Runs of each kernel program (kernel BPF statistics).",
            sample.programs.iter().map(|p| (vec![("program", p.program)], p.runs)),
        )?;
        family(
            &mut encoder,
            "datapath_bpf_program_run_seconds",
            "Time spent in each kernel program (kernel BPF statistics).",
            MetricType::Counter,
            sample.programs.iter().map(|p| (vec![("program", p.program)], ConstCounter::new(p.run_nanos as f64 / 1e9))),
        )?;
        gauge(
            &mut encoder,
            "datapath_probe_loaded",
            "1 when the probe is loaded, 0 when this kernel does not support it.",
            sample.probes.probes.iter().map(|(probe, variant)| (vec![("probe", *probe)], i64::from(variant.is_some()))),
        )?;
        counter(
            &mut encoder,
            "datapath_bpf_map_update_errors",
            "Kernel-side map updates that failed (map full): counts lost, never silently.",
            sample
                .map_errors
                .iter()
                .enumerate()
                .filter_map(|(slot, count)| map_error_name(slot).map(|map| (vec![("map", map)], *count))),
        )?;
        Ok(())
    }
}

/// The lifecycle families, from fresh snapshots at each scrape.
struct LifecycleCollector(Arc<Lifecycle>);

impl std::fmt::Debug for LifecycleCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LifecycleCollector")
    }
}

impl Collector for LifecycleCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let cni = self.0.cni.snapshot();
        let processes = self.0.processes.snapshot();
        let dirs: Vec<(String, &CniDirSnapshot)> =
            cni.dirs.iter().filter(|d| d.seen).map(|d| (d.dir.display().to_string(), d)).collect();
        gauge(
            &mut encoder,
            "datapath_cni_default_network_present",
            "1 when the CNI config dir has a valid default network (its first valid config by file name), else 0. \
             Only for dirs that existed at some point since the agent started.",
            dirs.iter().map(|(dir, d)| {
                let labels: Labels = vec![("dir", dir.as_str())];
                (labels, i64::from(d.default_network.is_some()))
            }),
        )?;
        counter(
            &mut encoder,
            "datapath_cni_config_changes",
            "CNI config file changes seen (added, changed, removed, invalid), since the agent started.",
            dirs.iter().flat_map(|(dir, d)| {
                d.changes.iter().map(move |c| {
                    let labels: Labels = vec![("dir", dir.as_str()), ("file", c.file.as_str()), ("change", c.change)];
                    (labels, c.count)
                })
            }),
        )?;
        gauge(
            &mut encoder,
            "datapath_sdn_process_running",
            "Running processes with this kernel comm name.",
            processes.processes.iter().map(|p| {
                let labels: Labels = vec![("process", p.name.as_str())];
                (labels, p.running.len() as i64)
            }),
        )?;
        counter(
            &mut encoder,
            "datapath_sdn_process_restarts",
            "Exits of this SDN process followed by a start of the same name within the restart window.",
            processes.processes.iter().map(|p| {
                let labels: Labels = vec![("process", p.name.as_str())];
                (labels, p.restarts)
            }),
        )?;
        counter(
            &mut encoder,
            "datapath_sdn_process_foreign_reports",
            "Starts and exits of processes named like a watched SDN process but outside the host's PID namespace \
             (pods' processes): counted, never taken as the node's SDN processes.",
            processes.foreign_reports.iter().map(|(comm, count)| (vec![("process", comm.as_str())], *count)),
        )?;
        counter(&mut encoder, "datapath_lifecycle_events", "Lifecycle events recorded on the timeline, by kind.", {
            let events = self.0.timeline.counts_by_kind();
            events.into_iter().map(|(kind, count)| {
                let labels: Labels = vec![("kind", kind.as_str())];
                (labels, count)
            })
        })?;
        let skipped = self.0.pods.read(PodIndex::skipped);
        counter(
            &mut encoder,
            "datapath_cni_cache_files_skipped",
            "CNI result cache files that could not be read or parsed (pod names unknown for them).",
            std::iter::once((Labels::new(), skipped)),
        )?;
        let sources = self.0.sources.snapshot();
        gauge(
            &mut encoder,
            "datapath_source_up",
            "1 while this signal source works (link_watch, cni_config, cni_cache, sdn_processes, tc_programs); 0 while it is \
             down and restarting: its signal is not seen meanwhile.",
            sources.iter().map(|(name, state)| (vec![("source", *name)], i64::from(state.up))),
        )?;
        counter(
            &mut encoder,
            "datapath_source_failures",
            "Times this signal source failed since the agent started.",
            sources.iter().map(|(name, state)| (vec![("source", *name)], state.failures)),
        )?;
        Ok(())
    }
}

/// The incident families, from the engine and the history at each scrape.
struct IncidentCollector(SharedEngine, Arc<IncidentHistory>);

impl std::fmt::Debug for IncidentCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IncidentCollector")
    }
}

fn by_cause(map: &std::collections::BTreeMap<String, u64>) -> impl Iterator<Item = (Labels<'_>, u64)> {
    map.iter().map(|(cause, n)| {
        let labels: Labels = vec![("cause", cause.as_str())];
        (labels, *n)
    })
}

impl Collector for IncidentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (ended, lost, active, durations) = {
            let engine = sync::lock(&self.0);
            (
                engine.ended_by_cause().clone(),
                engine.lost_by_cause().clone(),
                engine.active(),
                engine.durations().clone(),
            )
        };
        counter(
            &mut encoder,
            "datapath_incidents",
            "Incidents ended since the agent started, by their final top cause kind (or unattributed).",
            by_cause(&ended),
        )?;
        counter(
            &mut encoder,
            "datapath_incident_lost_packets",
            "Packets lost in ended incidents (dropped, retransmitted, unanswered), by final top cause kind.",
            by_cause(&lost),
        )?;
        gauge(
            &mut encoder,
            "datapath_incident_active",
            "1 while a pod-network disruption is in progress.",
            std::iter::once((Labels::new(), i64::from(active))),
        )?;
        family(
            &mut encoder,
            "datapath_incident_duration_seconds",
            "Durations of closed incidents, by top cause kind.",
            MetricType::Histogram,
            durations.iter().map(|(cause, histogram)| {
                let labels: Labels = vec![("cause", cause.as_str())];
                (labels, histogram.clone())
            }),
        )?;
        gauge(
            &mut encoder,
            "datapath_incident_store_up",
            "1 while incidents are kept across restarts in the state dir, 0 when it could not be opened.",
            std::iter::once((Labels::new(), i64::from(self.1.kept()))),
        )?;
        counter(
            &mut encoder,
            "datapath_incident_store_errors",
            "Writes of the incident history (closed incidents, the open one's checkpoint) that failed, and 1 when it \
             could not be opened at all.",
            std::iter::once((Labels::new(), self.1.errors())),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use monitor_common::{DirectionCounters, InterfaceCounters};

    use super::*;
    use crate::{
        datapath::{ProbeReport, ProgramRunStats},
        sampling::{
            ovs_datapaths::OvsDatapathStats,
            sampler::{InterfaceSeries, Sample},
        },
    };

    #[test]
    fn renders_every_series_with_bounded_labels() {
        let sample = Sample {
            interfaces: vec![InterfaceSeries {
                interface: "veth1a2b3c4d".into(),
                ifindex: 5,
                counters: InterfaceCounters {
                    ingress: DirectionCounters {
                        packets: 3,
                        bytes: 426,
                        syn_retransmits: 2,
                        syns: 3,
                        unanswered: 3,
                        ..Default::default()
                    },
                    egress: DirectionCounters { packets: 1, bytes: 54, tcp_resets: 1, ..Default::default() },
                },
                drops: BTreeMap::from([("NO_SOCKET".to_string(), 7)]),
                tcp_retransmits: 9,
                ..InterfaceSeries::default()
            }],
            other_drops: BTreeMap::from([("NOT_SPECIFIED".to_string(), 4)]),
            switches: vec![InterfaceSeries {
                interface: "ovs-system".into(),
                drops: BTreeMap::from([("NO_OUTPUT_PORT".to_string(), 12)]),
                ..InterfaceSeries::default()
            }],
            other_tcp_retransmits: 5,
            probes: ProbeReport {
                probes: BTreeMap::from([(RETRANSMIT_PROBE, Some("tp_btf".to_string()))]),
                ..ProbeReport::default()
            },
            programs: vec![ProgramRunStats { program: "tc_ingress", runs: 10, run_nanos: 1_500 }],
            attached: 1,
            ovs_datapaths: vec![OvsDatapathStats {
                name: "ovs-system".into(),
                hit: 980,
                missed: 35,
                lost: 1,
                flows: 7,
            }],
            ..Sample::default()
        };
        let latest = Arc::new(LatestSample::default());
        latest.publish(sample);
        let metrics = Metrics::of(vec![Box::new(SampleCollector { sample: latest })]);
        let text = metrics.render().unwrap();
        for line in [
            r#"datapath_packets_total{interface="veth1a2b3c4d",direction="ingress",pod_namespace="",pod=""} 3"#,
            r#"datapath_bytes_total{interface="veth1a2b3c4d",direction="egress",pod_namespace="",pod=""} 54"#,
            r#"datapath_tcp_resets_total{interface="veth1a2b3c4d",direction="egress",pod_namespace="",pod=""} 1"#,
            r#"datapath_tcp_syn_retransmits_total{interface="veth1a2b3c4d",pod_namespace="",pod=""} 2"#,
            r#"datapath_tcp_handshakes_total{interface="veth1a2b3c4d",direction="ingress",pod_namespace="",pod=""} 3"#,
            r#"datapath_tcp_handshakes_answered_total{interface="veth1a2b3c4d",direction="ingress",pod_namespace="",pod=""} 0"#,
            r#"datapath_unanswered_packets_total{interface="veth1a2b3c4d",direction="ingress",pod_namespace="",pod=""} 3"#,
            r#"datapath_tcp_retransmits_total{interface="veth1a2b3c4d",pod_namespace="",pod=""} 9"#,
            r#"datapath_tcp_retransmits_total{interface="other",pod_namespace="",pod=""} 5"#,
            r#"datapath_drops_total{interface="veth1a2b3c4d",reason="NO_SOCKET",pod_namespace="",pod=""} 7"#,
            r#"datapath_drops_total{interface="other",reason="NOT_SPECIFIED",pod_namespace="",pod=""} 4"#,
            "datapath_interfaces_attached 1",
            r#"datapath_switch_unforwarded_packets_total{switch="ovs-system"} 12"#,
            r#"datapath_bpf_program_runs_total{program="tc_ingress"} 10"#,
            r#"datapath_bpf_program_run_seconds_total{program="tc_ingress"} 0.0000015"#,
            r#"datapath_bpf_map_update_errors_total{map="drops"} 0"#,
            r#"datapath_bpf_map_update_errors_total{map="retransmits"} 0"#,
            r#"datapath_ovs_lookups_total{datapath="ovs-system",result="hit"} 980"#,
            r#"datapath_ovs_lookups_total{datapath="ovs-system",result="missed"} 35"#,
            r#"datapath_ovs_lookups_total{datapath="ovs-system",result="lost"} 1"#,
            r#"datapath_ovs_flows{datapath="ovs-system"} 7"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn no_retransmit_series_without_the_retransmit_tracer() {
        let sample = Sample {
            interfaces: vec![InterfaceSeries { interface: "veth1a2b3c4d".into(), ..InterfaceSeries::default() }],
            probes: ProbeReport {
                probes: BTreeMap::from([(RETRANSMIT_PROBE, None)]),
                errors: BTreeMap::from([(RETRANSMIT_PROBE, "tp_btf: unsupported".to_string())]),
            },
            ..Sample::default()
        };
        let latest = Arc::new(LatestSample::default());
        latest.publish(sample);
        let text = Metrics::of(vec![Box::new(SampleCollector { sample: latest })]).render().unwrap();
        assert!(text.contains("datapath_tcp_syn_retransmits_total"), "{text}");
        assert!(!text.contains("datapath_tcp_retransmits"), "{text}");
        assert!(text.contains(r#"datapath_probe_loaded{probe="tcp_retransmit"} 0"#), "{text}");
    }
}
