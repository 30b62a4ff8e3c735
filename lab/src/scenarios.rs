//! Replaying the scenarios on the running lab: each does what the real failure does (signals to
//! the sdn, an ovs-vswitchd restart, a flow flush, CNI config changes, an iptables DROP), records
//! what it did when, waits until the scenario is over and the prober is ready again, and
//! measures the prober's outage and the UDP client's losses.

use std::{
    fs,
    time::{Duration, Instant},
};

use anyhow::Context;
use jiff::Timestamp;
use nix::sys::signal::Signal;

use crate::{
    Lab, Scenario, ScenarioReport, cni,
    probe_log::{self, compute_outage, ready_since},
    sdn::{self, SdnEvent},
    sys,
};

/// How long a scenario waits for the prober to be ready again.
const READY_TIMEOUT: Duration = Duration::from_secs(40);

/// The steps of a running scenario, passed on to a watcher as they happen.
struct Steps<'a> {
    steps: Vec<(Timestamp, String)>,
    watch: &'a mut dyn FnMut(Timestamp, &str),
}

impl Steps<'_> {
    fn at(&mut self, at: Timestamp, text: impl Into<String>) {
        let text = text.into();
        (self.watch)(at, &text);
        self.steps.push((at, text));
    }

    fn now(&mut self, text: impl Into<String>) -> Timestamp {
        let at = Timestamp::now();
        self.at(at, text);
        at
    }
}

fn sleep_until(deadline: Instant) {
    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
}

impl Lab {
    /// Replays `scenario`, blocking until it is over and the prober is ready again (or a
    /// timeout), and reports what was done when and the outage it caused.
    pub fn disrupt(&self, scenario: Scenario) -> anyhow::Result<ScenarioReport> {
        self.disrupt_with(scenario, &mut |_, _| {})
    }

    /// [`Lab::disrupt`], calling `watch` with every step as it happens.
    pub fn disrupt_with(
        &self,
        scenario: Scenario,
        watch: &mut dyn FnMut(Timestamp, &str),
    ) -> anyhow::Result<ScenarioReport> {
        self.ovs_pid("ovs-vswitchd").context("the lab's ovs-vswitchd is not running: run `dm-lab up` again")?;
        self.daemon_pid("prober").context("the lab's prober is not running: run `dm-lab up` again")?;
        self.check_datapath()?;
        let started = Timestamp::now();
        let mut steps = Steps { steps: Vec::new(), watch };
        let settled = match scenario {
            Scenario::SdnUpgrade => self.sdn_upgrade(&mut steps)?,
            Scenario::OvsRestart => self.ovs_restart(&mut steps)?,
            Scenario::FlowFlush => self.flow_flush(&mut steps)?,
            Scenario::CniFlap => self.cni_flap(&mut steps)?,
            Scenario::BenignRestart => self.benign_restart(&mut steps)?,
            Scenario::SilentDrop => self.silent_drop(&mut steps)?,
        };
        // Ready: the probes of 2 s (at least 2) in a row passed, like kubelet's 2 at its 1 s period.
        let needed = (2000 / self.probe_period_ms.max(1)).max(2) as usize;
        let ready = sys::wait_for(READY_TIMEOUT, || {
            self.probes(Some(settled)).ok().filter(|probes| ready_since(probes, settled, needed))
        });
        match ready {
            Some(_) => steps.now(format!("prober ready ({needed} probes in a row passed after the scenario settled)")),
            None => {
                steps.now(format!("prober still not ready {} s after the scenario settled", READY_TIMEOUT.as_secs()))
            }
        };
        let finished = Timestamp::now();
        // Steps seen in the sdn's own log may precede the step that caused them being recorded.
        steps.steps.sort_by_key(|(at, _)| *at);
        let probes = self.probes(Some(started))?;
        let outage = compute_outage(&probes, started, finished);
        let udp = probe_log::parse_udp(&fs::read_to_string(self.udp_log()).unwrap_or_default());
        let (udp_sent, udp_received) = probe_log::udp_totals(&udp, started, finished);
        let udp_loss = probe_log::udp_loss_window(&udp, started, finished);
        Ok(ScenarioReport { scenario, started, finished, steps: steps.steps, outage, udp_sent, udp_received, udp_loss })
    }

    fn running_sdn(&self) -> anyhow::Result<i32> {
        self.daemon_pid("sdn").context("the lab's sdn is not running: run `dm-lab up` again")
    }

    /// Waits for sdn `pid` to log `event`; records it as a step at its own time.
    fn await_sdn_event(
        &self,
        steps: &mut Steps<'_>,
        pid: i32,
        event: &str,
        after: Timestamp,
        timeout: Duration,
        text: &str,
    ) -> anyhow::Result<Timestamp> {
        let found: Option<SdnEvent> = sys::wait_for(timeout, || {
            sdn::read_events(&self.sdn_events_log())
                .into_iter()
                .find(|e| e.pid as i32 == pid && e.event == event && e.at >= after)
        });
        match found {
            Some(found) => {
                steps.at(found.at, format!("sdn pid {pid}: {text}"));
                Ok(found.at)
            }
            None => anyhow::bail!(
                "sdn pid {pid} did not report `{event}` within {} s; its log ends with:\n{}",
                timeout.as_secs(),
                sys::tail(&self.logs_dir().join("sdn.log"), 10)
            ),
        }
    }

    fn config_state(&self) -> &'static str {
        if self.cni_config_path().exists() { "present" } else { "gone" }
    }

    fn restart_vswitchd(&self, steps: &mut Steps<'_>) -> anyhow::Result<()> {
        let old = self.stop_vswitchd()?;
        steps.now(format!("ovs-vswitchd pid {old} stopped (SIGTERM)"));
        let new = self.start_vswitchd()?;
        let flows = sdn::count_flows(&self.ovs()).map_or_else(|error| format!("? ({error:#})"), |n| n.to_string());
        steps.now(format!("ovs-vswitchd started again, pid {new}: fail_mode=secure, {flows} flows on br0"));
        Ok(())
    }

    fn sdn_upgrade(&self, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let old = self.running_sdn()?;
        let t0 = Instant::now();
        sys::signal(old, Signal::SIGTERM);
        let term = steps.now(format!("SIGTERM openshift-sdn-node pid {old} (its trap deletes {})", cni::CONFIG_FILE));
        if sys::wait_exit(old, Duration::from_secs(3)) {
            steps.now(format!("sdn pid {old} exited; CNI config {}", self.config_state()));
        } else {
            steps.now(format!("sdn pid {old} still running 3 s after SIGTERM"));
        }
        sleep_until(t0 + Duration::from_secs(1));
        self.restart_vswitchd(steps)?;
        // 9 s, not 8: the datapath gap (vswitchd restart at +1 s to flows at +9.5 s) then exceeds
        // 8 s whatever the prober's phase, so the outage always lands in the seed's 8–12 s.
        sleep_until(t0 + Duration::from_secs(9));
        let new = self.start_sdn(&[])?;
        steps.now(format!("new openshift-sdn-node started, pid {new} (comm {})", sys::comm(new).unwrap_or_default()));
        self.await_sdn_event(steps, new, "programmed", term, Duration::from_secs(15), "programmed the pod flows")?;
        self.await_sdn_event(steps, new, "ready", term, Duration::from_secs(15), "wrote the CNI config (ready)")
    }

    fn ovs_restart(&self, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let sdn = self.running_sdn()?;
        let before = Timestamp::now();
        self.restart_vswitchd(steps)?;
        self.await_sdn_event(steps, sdn, "flows-missing", before, Duration::from_secs(10), "found the flows gone")?;
        self.await_sdn_event(steps, sdn, "programmed", before, Duration::from_secs(20), "re-programmed the pod flows")
    }

    fn flow_flush(&self, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let old = self.running_sdn()?;
        sys::signal(old, Signal::SIGKILL);
        sys::wait_exit(old, Duration::from_secs(3));
        let killed = steps.now(format!("SIGKILL openshift-sdn-node pid {old}; CNI config {}", self.config_state()));
        let new = self.start_sdn(&["--program-delay", "4s"])?;
        steps.now(format!("new openshift-sdn-node started, pid {new}, --program-delay 4s"));
        self.await_sdn_event(steps, new, "flushed", killed, Duration::from_secs(10), "flushed every flow on br0")?;
        self.await_sdn_event(steps, new, "programmed", killed, Duration::from_secs(20), "programmed the pod flows")?;
        self.await_sdn_event(steps, new, "ready", killed, Duration::from_secs(20), "wrote the CNI config (ready)")
    }

    fn cni_flap(&self, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let config = self.cni_config_path();
        match fs::remove_file(&config) {
            Ok(()) => steps.now(format!("deleted {}", config.display())),
            Err(error) => steps.now(format!("cannot delete {}: {error}", config.display())),
        };
        std::thread::sleep(Duration::from_secs(2));
        sys::write_atomic(&config, &self.root, &cni::network_config())?;
        Ok(steps.now(format!("restored {}", config.display())))
    }

    fn benign_restart(&self, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let old = self.running_sdn()?;
        sys::signal(old, Signal::SIGKILL);
        sys::wait_exit(old, Duration::from_secs(3));
        let killed = steps.now(format!("SIGKILL openshift-sdn-node pid {old}; CNI config {}", self.config_state()));
        let new = self.start_sdn(&["--keep-flows"])?;
        steps.now(format!("new openshift-sdn-node started, pid {new}, --keep-flows"));
        self.await_sdn_event(
            steps,
            new,
            "ready",
            killed,
            Duration::from_secs(15),
            "kept the flows, wrote the CNI config",
        )
    }

    fn silent_drop(&self, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let web = self.pod("web").context("no web pod")?;
        let iptables =
            |op: &str| sys::run(sys::in_netns(&web.netns, "iptables").args(["-w", "5", op, "INPUT", "-j", "DROP"]));
        iptables("-I")?;
        steps.now(format!("iptables -I INPUT -j DROP in {} (pod {}/{})", web.netns, web.namespace, web.pod));
        std::thread::sleep(Duration::from_secs(5));
        iptables("-D")?;
        Ok(steps.now(format!("removed the DROP rule in {}", web.netns)))
    }
}
