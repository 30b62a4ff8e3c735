//! /metrics: the latest [`Sample`] as OpenMetrics text (prometheus-client).
//!
//! Kernel counters are absolute, so each scrape encodes constant metrics from the sample
//! instead of keeping a second set of counters in user space.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use crate::sampling::sampler::{LatestSample, OTHER_INTERFACE, map_error_name};

#[derive(Debug)]
struct SampleCollector {
    sample: Arc<LatestSample>,
}

pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub fn new(sample: Arc<LatestSample>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SampleCollector { sample }));
        Self { registry }
    }

    /// Adds families encoded by another collector (e.g. the lifecycle state).
    pub fn with_collector(mut self, collector: impl Collector + 'static) -> Self {
        self.registry.register_collector(Box::new(collector));
        self
    }

    /// OpenMetrics text, ending in `# EOF`.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut body = String::with_capacity(16 * 1024);
        encode(&mut body, &self.registry)?;
        Ok(body)
    }
}

pub(crate) type Labels<'a> = Vec<(&'static str, &'a str)>;

/// One metric family, from (labels, metric) pairs.
pub(crate) fn family<'a, M: EncodeMetric>(
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

pub(crate) fn counter<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Labels<'a>, u64)>,
) -> Result<(), std::fmt::Error> {
    family(encoder, name, help, MetricType::Counter, series.map(|(labels, value)| (labels, ConstCounter::new(value))))
}

pub(crate) fn gauge<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Labels<'a>, i64)>,
) -> Result<(), std::fmt::Error> {
    family(encoder, name, help, MetricType::Gauge, series.map(|(labels, value)| (labels, ConstGauge::new(value))))
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
        counter(&mut encoder, "datapath_tcp_resets", "TCP segments carrying RST.", per_direction(|c| c.tcp_resets))?;
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
        gauge(
            &mut encoder,
            "datapath_interfaces_attached",
            "Interfaces the tc programs are attached to.",
            std::iter::once((Labels::new(), i64::try_from(sample.attached).unwrap_or(i64::MAX))),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use monitor_common::{DirectionCounters, InterfaceCounters};

    use super::*;
    use crate::{
        datapath::ProgramRunStats,
        sampling::sampler::{InterfaceSeries, Sample},
    };

    #[test]
    fn renders_every_series_with_bounded_labels() {
        let sample = Sample {
            interfaces: vec![InterfaceSeries {
                interface: "veth1a2b3c4d".into(),
                ifindex: 5,
                counters: InterfaceCounters {
                    ingress: DirectionCounters { packets: 3, bytes: 426, tcp_resets: 0, syn_retransmits: 2 },
                    egress: DirectionCounters { packets: 1, bytes: 54, tcp_resets: 1, syn_retransmits: 0 },
                },
                drops: BTreeMap::from([("NO_SOCKET".to_string(), 7)]),
                ..InterfaceSeries::default()
            }],
            other_drops: BTreeMap::from([("NOT_SPECIFIED".to_string(), 4)]),
            programs: vec![ProgramRunStats { program: "tc_ingress", runs: 10, run_nanos: 1_500 }],
            attached: 1,
            ..Sample::default()
        };
        let latest = Arc::new(LatestSample::default());
        latest.publish(sample);
        let metrics = Metrics::new(latest);
        let text = metrics.render().unwrap();
        for line in [
            r#"datapath_packets_total{interface="veth1a2b3c4d",direction="ingress",pod_namespace="",pod=""} 3"#,
            r#"datapath_bytes_total{interface="veth1a2b3c4d",direction="egress",pod_namespace="",pod=""} 54"#,
            r#"datapath_tcp_resets_total{interface="veth1a2b3c4d",direction="egress",pod_namespace="",pod=""} 1"#,
            r#"datapath_tcp_syn_retransmits_total{interface="veth1a2b3c4d",pod_namespace="",pod=""} 2"#,
            r#"datapath_drops_total{interface="veth1a2b3c4d",reason="NO_SOCKET",pod_namespace="",pod=""} 7"#,
            r#"datapath_drops_total{interface="other",reason="NOT_SPECIFIED",pod_namespace="",pod=""} 4"#,
            "datapath_interfaces_attached 1",
            r#"datapath_bpf_program_runs_total{program="tc_ingress"} 10"#,
            r#"datapath_bpf_program_run_seconds_total{program="tc_ingress"} 0.0000015"#,
            r#"datapath_bpf_map_update_errors_total{map="drops"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
