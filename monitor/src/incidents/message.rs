//! The incident record's text: its totals and the message a person reads ("9.4 s pod-network
//! disruption on 14 interfaces …, began 1.1 s after ovs-vswitchd went down for a restart"),
//! and the log line of each update.

use std::time::Duration;

use tracing::info;

use super::{
    engine::IncidentUpdate,
    record::{Cause, Incident, IncidentInterface, IncidentTotals, LostPackets},
};
use crate::{
    lifecycle::clock::{Stamp, rfc3339},
    sampling::switches::UNFORWARDED_REASON,
};

/// When an incident ran, and whether it still does.
pub(super) struct Span {
    pub(super) seq: u64,
    pub(super) start: Stamp,
    pub(super) end_ns: u64,
    pub(super) active: bool,
}

/// The record of an incident; `lost` is its interfaces' evidence with each packet counted
/// once (see `detection::Evidence::total`).
pub(super) fn build_incident(
    Span { seq, start, end_ns, active }: Span,
    interfaces: Vec<IncidentInterface>,
    lost: LostPackets,
    causes: Vec<Cause>,
    lookback: Duration,
) -> Incident {
    let end = Stamp::from_monotonic(end_ns.max(start.mono_ns));
    let duration_seconds = round(start.seconds_until(&end), 1_000.0);
    let totals = IncidentTotals {
        drops: interfaces.iter().map(|i| i.drops).sum(),
        tcp_resets: interfaces.iter().map(|i| i.tcp_resets).sum(),
        syn_retransmits: interfaces.iter().map(|i| i.syn_retransmits).sum(),
        interfaces: interfaces.len(),
        lost_packets: lost.packets(),
        lost,
    };
    let start_text = rfc3339(start.wall);
    let mut incident = Incident {
        id: format!("{start_text}-{seq}"),
        start: start_text,
        end: (!active).then(|| rfc3339(end.wall)),
        active,
        duration_seconds,
        totals,
        interfaces,
        causes,
        message: String::new(),
        detected_at: String::new(),
        close_reason: None,
    };
    incident.message = message(&incident, lookback);
    incident
}

pub(super) fn round(value: f64, scale: f64) -> f64 {
    (value * scale).round() / scale
}
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// "ovs-vswitchd restarted", "the CNI default network config was removed", ...
fn phrase(cause: &Cause) -> String {
    let s = cause.subject.as_str();
    match cause.kind.as_str() {
        "process_restart" => format!("{s} went down for a restart"),
        "process_exit" => format!("{s} exited"),
        "process_start" => format!("{s} started"),
        "cni_default_network_missing" => "the CNI default network config was removed".into(),
        "cni_default_network_restored" => "the CNI default network came back".into(),
        "cni_config_removed" => format!("CNI config {} was removed", basename(s)),
        "cni_config_changed" => format!("CNI config {} changed", basename(s)),
        "cni_config_invalid" => format!("CNI config {} became invalid", basename(s)),
        "cni_config_added" => format!("CNI config {} was added", basename(s)),
        "interface_down" => format!("{s} went down"),
        "interface_up" => format!("{s} came up"),
        "interface_removed" => format!("{s} was removed"),
        "interface_added" => format!("{s} appeared"),
        other => format!("{other} {s}"),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// "9.4 s pod-network disruption on 14 interfaces (247 packets lost (210 unanswered; 37
/// retransmitted; 165 dropped: NETFILTER_DROP 165)), began 1.1 s after ovs-vswitchd went down
/// for a restart and 2.9 s after ..."
fn message(incident: &Incident, lookback: Duration) -> String {
    let t = &incident.totals;
    let mut text = format!(
        "{}{:.1} s pod-network disruption on {} ({} lost",
        if incident.active { "ongoing: " } else { "" },
        incident.duration_seconds,
        plural(t.interfaces as u64, "interface", "interfaces"),
        plural(t.lost_packets, "packet", "packets"),
    );
    let mut kinds = Vec::new();
    if t.lost.unanswered > 0 {
        kinds.push(format!("{} unanswered", thousands(t.lost.unanswered)));
    }
    if t.lost.retransmitted > 0 {
        kinds.push(format!("{} retransmitted", thousands(t.lost.retransmitted)));
    }
    let unforwarded = t.lost.dropped.get(UNFORWARDED_REASON).copied().unwrap_or(0);
    if unforwarded > 0 {
        kinds.push(format!("{} forwarded to no port by a switch", thousands(unforwarded)));
    }
    let dropped: u64 = t.lost.dropped.values().sum::<u64>() - unforwarded;
    if dropped > 0 {
        let mut reasons: Vec<(&String, &u64)> =
            t.lost.dropped.iter().filter(|(reason, _)| reason.as_str() != UNFORWARDED_REASON).collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = reasons.iter().take(3).map(|(r, n)| format!("{r} {}", thousands(**n))).collect();
        kinds.push(format!("{} dropped: {}", thousands(dropped), top.join(", ")));
    }
    if !kinds.is_empty() {
        text.push_str(&format!(" ({})", kinds.join("; ")));
    }
    let silent: Vec<String> = incident
        .interfaces
        .iter()
        .flat_map(|i| i.silent_directions.iter().map(move |d| format!("{} {d}", i.interface)))
        .collect();
    if !silent.is_empty() {
        text.push_str(&format!("; went silent: {}", silent.join(", ")));
    }
    text.push(')');
    if incident.causes.is_empty() {
        text.push_str(&format!(
            ", unattributed: no lifecycle event from {} s before it began until it ended",
            lookback.as_secs()
        ));
        return text;
    }
    let parts: Vec<String> = incident
        .causes
        .iter()
        .take(2)
        .map(|c| {
            if c.offset_seconds <= 0.0 {
                format!("{:.1} s after {}", -c.offset_seconds, phrase(c))
            } else {
                format!("{:.1} s before {}", c.offset_seconds, phrase(c))
            }
        })
        .collect();
    text.push_str(&format!(", began {}", parts.join(" and ")));
    text
}

/// Logs an update as one line.
pub fn log_update(update: &IncidentUpdate) {
    match update {
        IncidentUpdate::Opened(i) => {
            info!(
                id = i.id,
                interfaces = i.totals.interfaces,
                cause = i.cause_label(),
                "incident opened: {}",
                i.message
            )
        }
        IncidentUpdate::Closed(i) => info!(
            id = i.id,
            duration_seconds = i.duration_seconds,
            lost_packets = i.totals.lost_packets,
            cause = i.cause_label(),
            "incident closed: {}",
            i.message
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(4210), "4,210");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
