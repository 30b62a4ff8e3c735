//! The datapath-monitor lab: an OpenShift SDN node in a box, built from real parts on one
//! machine, and scenarios that replay real pod-network disruptions on it.
//!
//! Everything lives apart from the host: a node network namespace ([`NODE_NETNS`]) holding a
//! private OVS instance's bridge `br0` (`fail_mode=secure`; OVS's userspace `netdev` datapath,
//! or with [`Datapath::Kernel`] the kernel's `openvswitch.ko` that production nodes run), its
//! internal port `tun0` and the pods' host-side veths; one network namespace per pod; a
//! kubelet-like readiness prober; a stand-in `openshift-sdn-node` that owns the flows and the
//! CNI config; and the lab root ([`ROOT`]) with the CNI config dir, the libcni cache, the OVS
//! db/run/log dirs, pid files, logs and a JSON state file describing the running lab.
//!
//! [`Lab::up`] builds it, [`Lab::disrupt`] replays a [`Scenario`] and measures the prober's
//! outage, [`Lab::down`] removes every trace.

pub mod cni;
pub mod daemons;
pub mod datapath;
mod node;
pub mod noise;
pub mod plan;
pub mod probe_log;
pub mod roles;
mod scenarios;
pub mod sdn;
pub mod soak;
pub mod sys;

use std::{fmt, path::PathBuf, time::Duration};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

pub use plan::{FaultPlan, StopSignal};
pub use probe_log::{LossWindow, Outage, Probe};
pub use roles::Roles;

/// The lab root: CNI dirs, OVS dirs, pid files, logs, state file.
pub const ROOT: &str = "/run/dm-lab";
/// The node network namespace (OVS bridge, tun0, pod host-side veths, prober, sdn, agent).
pub const NODE_NETNS: &str = "dml-node";
/// Prefix of every lab network namespace.
pub const NETNS_PREFIX: &str = "dml-";
/// The OVS bridge.
pub const BRIDGE: &str = "br0";
/// The bridge's internal port: the node's route into the pod subnet.
pub const TUN: &str = "tun0";
/// tun0's address: the pods' gateway.
pub const GATEWAY: &str = "10.129.0.1";
/// Prefix length of the pod subnet 10.129.0.0/23.
pub const PREFIX: u8 = 23;
/// The apiserver pod's health port.
pub const HEALTHZ_PORT: u16 = 8443;
/// The web pod's UDP echo port.
pub const UDP_PORT: u16 = 9000;
/// Datagrams per second the client pod sends to the web pod.
pub const UDP_RATE: u32 = 20;

/// A disruption the lab can replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The seed: sdn TERM (CNI config removed), ovs-vswitchd restarted ~1 s later (no flows),
    /// a new sdn 9 s after the TERM programs the flows (0.5 s later) and writes the config again:
    /// ~8.1 s without flows, which the 1 s prober grid sees as an 8–9 s outage (the seed's 8–12 s).
    SdnUpgrade,
    /// ovs-vswitchd restarted; the running sdn re-programs the flows after its resync delay.
    OvsRestart,
    /// sdn SIGKILLed (config stays); the new one flushes the flows and re-adds them 4 s later.
    FlowFlush,
    /// CNI config deleted and restored 2 s later; no datapath impact.
    CniFlap,
    /// Decoy: sdn SIGKILLed and restarted with `--keep-flows`; traffic untouched.
    BenignRestart,
    /// Decoy: the web pod drops all input for 5 s; drops with no lifecycle event.
    SilentDrop,
    /// Decoy: the sdn restarts keeping its flows while the client pod sends to closed ports of
    /// the web pod at a steady rate (resets and port unreachables: benign drops all along).
    RejectsRestart,
    /// Decoy: the CNI config flaps while the client pod scans filtered ports of the web pod at
    /// a steady rate (SYNs nobody answers, dropped by the pod's firewall all along).
    ScanFlap,
}

impl Scenario {
    /// Every scenario, seed first.
    pub const ALL: [Scenario; 8] = [
        Scenario::SdnUpgrade,
        Scenario::OvsRestart,
        Scenario::FlowFlush,
        Scenario::CniFlap,
        Scenario::BenignRestart,
        Scenario::SilentDrop,
        Scenario::RejectsRestart,
        Scenario::ScanFlap,
    ];

    /// The scenario's CLI name (`sdn-upgrade`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::SdnUpgrade => "sdn-upgrade",
            Scenario::OvsRestart => "ovs-restart",
            Scenario::FlowFlush => "flow-flush",
            Scenario::CniFlap => "cni-flap",
            Scenario::BenignRestart => "benign-restart",
            Scenario::SilentDrop => "silent-drop",
            Scenario::RejectsRestart => "rejects-restart",
            Scenario::ScanFlap => "scan-flap",
        }
    }

    /// The scenario named `s` (its CLI name; `_` works for `-`, case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        Self::ALL.into_iter().find(|scenario| scenario.name() == wanted)
    }

    /// One line on what the scenario does.
    pub fn description(self) -> &'static str {
        match self {
            Scenario::SdnUpgrade => {
                "sdn TERM (CNI config removed), ovs-vswitchd restart 1 s later, new sdn 9 s after the TERM"
            }
            Scenario::OvsRestart => "ovs-vswitchd restart; the running sdn re-programs the flows after 3 s",
            Scenario::FlowFlush => "sdn SIGKILL; the new sdn flushes the flows and re-adds them 4 s later",
            Scenario::CniFlap => "CNI config deleted, restored 2 s later (no datapath impact)",
            Scenario::BenignRestart => "decoy: sdn SIGKILL, new sdn with --keep-flows (traffic untouched)",
            Scenario::SilentDrop => "decoy: the web pod drops all input for 5 s (no lifecycle event)",
            Scenario::RejectsRestart => {
                "decoy: sdn SIGKILL, new sdn with --keep-flows, while a pod sends to closed ports at 10/s"
            }
            Scenario::ScanFlap => {
                "decoy: CNI config deleted, restored 2 s later, while a pod scans filtered ports at 10/s"
            }
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The OVS datapath under the lab's bridge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Datapath {
    /// OVS's userspace datapath (`datapath_type=netdev`): runs on any kernel; a packet with no
    /// flow is handled in ovs-vswitchd, OVS's own drop signals do not exist.
    #[default]
    Userspace,
    /// OVS's kernel datapath (`openvswitch.ko`, `system@ovs-system`), as on production nodes.
    Kernel,
}

impl Datapath {
    /// The CLI name (`userspace`, `kernel`).
    pub fn name(self) -> &'static str {
        match self {
            Datapath::Userspace => "userspace",
            Datapath::Kernel => "kernel",
        }
    }

    /// The datapath named `s` (`userspace` or `netdev`; `kernel` or `system`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "userspace" | "netdev" => Ok(Datapath::Userspace),
            "kernel" | "system" => Ok(Datapath::Kernel),
            other => Err(format!("unknown datapath {other:?}: userspace or kernel")),
        }
    }
}

impl fmt::Display for Datapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A lab pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabPod {
    /// Short name (`apiserver`, `web`, `client`): netns `dml-pod-<name>`.
    pub name: String,
    /// Kubernetes namespace.
    pub namespace: String,
    /// Kubernetes pod name.
    pub pod: String,
    /// The pod's network namespace.
    pub netns: String,
    /// Host-side veth in the node netns (a port of br0).
    pub veth: String,
    /// Pod IP (the /23 pod subnet).
    pub ip: String,
}

/// A running lab, as described by its state file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lab {
    /// Lab root ([`ROOT`]).
    pub root: PathBuf,
    /// The CNI config dir the sdn writes `80-openshift-network.conf` into.
    pub cni_dir: PathBuf,
    /// The libcni result cache dir (one entry per pod).
    pub cni_cache_dir: PathBuf,
    /// The pods.
    pub pods: Vec<LabPod>,
    /// The lab's copy of the dm-lab binary the daemons run from.
    pub bin: PathBuf,
    /// The same binary as `openshift-sdn-node` (comm `openshift-sdn-n`).
    pub sdn_bin: PathBuf,
    /// When the lab was built.
    pub created: Timestamp,
    /// The OVS datapath under the bridge (labs built before it was a choice ran userspace).
    #[serde(default)]
    pub datapath: Datapath,
    /// How often the prober probes, in milliseconds (labs built before it was a choice: 1 s).
    #[serde(default = "default_probe_period_ms")]
    pub probe_period_ms: u64,
    /// Which pods the prober and the UDP stream use (labs from before: the defaults).
    #[serde(default)]
    pub roles: Roles,
}

/// The prober's period unless told otherwise: kubelet's default for readiness probes.
pub const DEFAULT_PROBE_PERIOD: Duration = Duration::from_secs(1);

fn default_probe_period_ms() -> u64 {
    DEFAULT_PROBE_PERIOD.as_millis() as u64
}

/// How to build a lab ([`Lab::up_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabOptions {
    /// OVS's datapath under the bridge.
    pub datapath: Datapath,
    /// How often the prober probes (each probe still times out after 1 s; probes overlap when
    /// the period is shorter). `cargo xtask eval` probes every 250 ms, so that the outage it
    /// measures is quantized by 250 ms, not by kubelet's 1 s.
    pub probe_period: Duration,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self { datapath: Datapath::default(), probe_period: DEFAULT_PROBE_PERIOD }
    }
}

/// What a scenario did and what it cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: Scenario,
    /// How it was replayed (reports from before plans: the scenario's defaults).
    #[serde(default)]
    pub plan: Option<FaultPlan>,
    /// When it started.
    pub started: Timestamp,
    /// When it was over and the prober ready again (or the wait timed out).
    pub finished: Timestamp,
    /// What was done (or seen) when.
    pub steps: Vec<(Timestamp, String)>,
    /// The prober's outage between `started` and `finished`, None when every probe passed.
    pub outage: Option<Outage>,
    /// UDP datagrams the client pod sent to the web pod between `started` and `finished`.
    pub udp_sent: u64,
    /// UDP echoes the client pod got back in that window.
    pub udp_received: u64,
    /// The datagrams lost in that window, by send time (None when none was lost, or the UDP
    /// client's log predates loss tracking). A datagram is declared lost 1 s after it was sent,
    /// so one sent in the last ~2 s before `finished` may be missing here: re-read the log later
    /// ([`probe_log::udp_loss_window`]) for the complete window.
    #[serde(default)]
    pub udp_loss: Option<probe_log::LossWindow>,
}

impl ScenarioReport {
    /// Seconds from start to finish.
    pub fn duration_seconds(&self) -> f64 {
        probe_log::seconds_between(self.started, self.finished)
    }
}

impl fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "scenario {} ({}): {:.3} → {:.3} ({:.1} s)",
            self.scenario,
            self.scenario.description(),
            self.started,
            self.finished,
            self.duration_seconds()
        )?;
        if let Some(plan) = &self.plan {
            writeln!(f, "plan: {}", plan.describe(self.scenario))?;
        }
        for (at, step) in &self.steps {
            writeln!(f, "  {:>+7.3} s  {:.3}  {step}", probe_log::seconds_between(self.started, *at), at)?;
        }
        match &self.outage {
            Some(outage) => writeln!(
                f,
                "prober outage: {:.1} s ({} failed probes; first failure {:.3}, {} {:.3})",
                outage.seconds,
                outage.failed_probes,
                outage.first_failure,
                if outage.ongoing { "still failing at" } else { "ready again" },
                outage.recovered
            )?,
            None => writeln!(f, "prober outage: none (every probe passed)")?,
        }
        let lost = self.udp_sent.saturating_sub(self.udp_received);
        write!(f, "udp client→web: {} sent, {} echoed back, {lost} lost", self.udp_sent, self.udp_received)?;
        if let Some(loss) = &self.udp_loss {
            write!(
                f,
                " (lost datagrams sent {:.3} → {:.3}, {:.1} s)",
                loss.first_lost,
                loss.last_lost,
                loss.seconds()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_round_trip() {
        for scenario in Scenario::ALL {
            assert_eq!(Scenario::parse(scenario.name()), Some(scenario));
        }
        assert_eq!(Scenario::parse("SDN_UPGRADE"), Some(Scenario::SdnUpgrade));
        assert_eq!(Scenario::parse(" silent-drop "), Some(Scenario::SilentDrop));
        assert_eq!(Scenario::parse("meteor-strike"), None);
    }

    #[test]
    fn report_prints_steps_and_outage() {
        let started: Timestamp = "2026-01-12T20:58:40Z".parse().unwrap();
        let report = ScenarioReport {
            scenario: Scenario::SdnUpgrade,
            plan: Some(FaultPlan::default_for(Scenario::SdnUpgrade)),
            started,
            finished: "2026-01-12T20:58:55Z".parse().unwrap(),
            steps: vec![("2026-01-12T20:58:41Z".parse().unwrap(), "SIGTERM sdn".into())],
            outage: Some(Outage {
                first_failure: "2026-01-12T20:58:42Z".parse().unwrap(),
                recovered: "2026-01-12T20:58:51.4Z".parse().unwrap(),
                seconds: 9.4,
                failed_probes: 9,
                ongoing: false,
            }),
            udp_sent: 300,
            udp_received: 150,
            udp_loss: None,
        };
        let text = report.to_string();
        assert!(text.contains("scenario sdn-upgrade"), "{text}");
        assert!(text.contains("plan: hold 9.0 s, SIGTERM, CNI config removed, then OVS restarted"), "{text}");
        assert!(text.contains("+1.000 s"), "{text}");
        assert!(text.contains("prober outage: 9.4 s (9 failed probes"), "{text}");
        assert!(text.contains("150 lost"), "{text}");
    }
}
