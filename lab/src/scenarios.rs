//! Replaying the scenarios on the running lab: each does what the real failure does (signals to
//! the sdn, an ovs-vswitchd restart, a flow flush, CNI config changes, an iptables DROP), records
//! what it did when, waits until the scenario is over and the prober is ready again, and
//! measures the prober's outage and the UDP client's losses.

use std::{
    fs,
    time::{Duration, Instant},
};

use crate::{
    FaultPlan, Lab, Scenario, ScenarioReport, StopSignal, cni,
    noise::NOISE_LEAD,
    probe_log::{self, compute_outage, ready_since},
    sdn::{self, SdnEvent},
    sys,
};
use anyhow::Context;
use jiff::Timestamp;

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
    /// Replays `scenario` with its default plan, blocking until it is over and the prober is
    /// ready again (or a timeout), and reports what was done when and the outage it caused.
    pub fn disrupt(&self, scenario: Scenario) -> anyhow::Result<ScenarioReport> {
        self.disrupt_with(scenario, &mut |_, _| {})
    }

    /// [`Lab::disrupt`], calling `watch` with every step as it happens.
    pub fn disrupt_with(
        &self,
        scenario: Scenario,
        watch: &mut dyn FnMut(Timestamp, &str),
    ) -> anyhow::Result<ScenarioReport> {
        self.disrupt_planned(scenario, &FaultPlan::default_for(scenario), watch)
    }

    /// Replays `scenario` as `plan` says ([`FaultPlan::delay_seconds`] is the caller's to wait).
    /// A decoy's noise ([`Lab::start_noise`]) is started first unless it runs already, and then
    /// runs [`NOISE_LEAD`] before the lifecycle event; noise started here is stopped at the end.
    pub fn disrupt_planned(
        &self,
        scenario: Scenario,
        plan: &FaultPlan,
        watch: &mut dyn FnMut(Timestamp, &str),
    ) -> anyhow::Result<ScenarioReport> {
        self.ovs_pid("ovs-vswitchd").context("the lab's ovs-vswitchd is not running: run `dm-lab up` again")?;
        self.daemon_pid("prober").context("the lab's prober is not running: run `dm-lab up` again")?;
        self.check_datapath()?;
        let mut steps = Steps { steps: Vec::new(), watch };
        let own_noise = self.start_noise(scenario)?;
        if own_noise {
            steps.now(format!(
                "noise started ({}); the lifecycle event comes {} s later",
                scenario.description(),
                NOISE_LEAD.as_secs()
            ));
            std::thread::sleep(NOISE_LEAD);
        }
        let started = Timestamp::now();
        let settled = self.replay(scenario, plan, &mut steps);
        if own_noise {
            self.stop_noise();
        }
        let settled = settled?;
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
        Ok(ScenarioReport {
            scenario,
            plan: Some(*plan),
            started,
            finished,
            steps: steps.steps,
            outage,
            udp_sent,
            udp_received,
            udp_loss,
        })
    }

    fn replay(&self, scenario: Scenario, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        match scenario {
            Scenario::SdnUpgrade => self.sdn_upgrade(plan, steps),
            Scenario::OvsRestart => self.ovs_restart(plan, steps),
            Scenario::FlowFlush => self.flow_flush(plan, steps),
            Scenario::CniFlap | Scenario::ScanFlap => self.cni_flap(plan, steps),
            Scenario::BenignRestart | Scenario::RejectsRestart => self.benign_restart(plan, steps),
            Scenario::SilentDrop => self.silent_drop(plan, steps),
        }
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

    /// Stops sdn `pid` with the plan's signal; returns when it was signalled. SIGTERM runs its
    /// trap, which deletes the CNI config; after SIGKILL, with `remove_config`, the lab deletes
    /// the config itself at once, so that every plan of the seed loses it.
    fn stop_sdn(&self, steps: &mut Steps<'_>, pid: i32, plan: &FaultPlan, remove_config: bool) -> Timestamp {
        sys::signal(pid, plan.signal.signal());
        let at = match plan.signal {
            StopSignal::Term => {
                steps.now(format!("SIGTERM openshift-sdn-node pid {pid} (its trap deletes {})", cni::CONFIG_FILE))
            }
            StopSignal::Kill => steps.now(format!("SIGKILL openshift-sdn-node pid {pid}")),
        };
        if sys::wait_exit(pid, Duration::from_secs(3)) {
            steps.now(format!("sdn pid {pid} exited; CNI config {}", self.config_state()));
        } else {
            steps.now(format!("sdn pid {pid} still running 3 s after {}", plan.signal.name()));
        }
        if remove_config && plan.signal == StopSignal::Kill {
            let config = self.cni_config_path();
            match fs::remove_file(&config) {
                Ok(()) => steps.now(format!("deleted {} (the killed sdn's trap could not)", config.display())),
                Err(error) => steps.now(format!("cannot delete {}: {error}", config.display())),
            };
        }
        at
    }

    fn sdn_upgrade(&self, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let old = self.running_sdn()?;
        let t0 = Instant::now();
        let stopped = if plan.cni_first {
            let stopped = self.stop_sdn(steps, old, plan, true);
            sleep_until(t0 + Duration::from_secs(1));
            self.restart_vswitchd(steps)?;
            stopped
        } else {
            self.restart_vswitchd(steps)?;
            sleep_until(t0 + Duration::from_secs(1));
            self.stop_sdn(steps, old, plan, true)
        };
        // The new sdn comes `hold` after the first step, and never before both are done.
        sleep_until(t0 + plan.hold().max(Duration::from_millis(1500)));
        let new = self.start_sdn(&[])?;
        steps.now(format!("new openshift-sdn-node started, pid {new} (comm {})", sys::comm(new).unwrap_or_default()));
        let after = stopped.min(Timestamp::now());
        self.await_sdn_event(steps, new, "programmed", after, Duration::from_secs(15), "programmed the pod flows")?;
        self.await_sdn_event(steps, new, "ready", after, Duration::from_secs(15), "wrote the CNI config (ready)")
    }

    fn ovs_restart(&self, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let sdn = self.running_sdn()?;
        let before = Timestamp::now();
        // The running sdn reads its resync delay from here when it finds the flows gone.
        let knob = sdn::resync_delay_path(&self.root);
        sys::write_atomic(&knob, &self.root, &format!("{:.3}s\n", plan.hold_seconds))?;
        let result = self.restart_vswitchd(steps).and_then(|()| {
            self.await_sdn_event(steps, sdn, "flows-missing", before, Duration::from_secs(10), "found the flows gone")?;
            let timeout = plan.hold() + Duration::from_secs(20);
            self.await_sdn_event(steps, sdn, "programmed", before, timeout, "re-programmed the pod flows")
        });
        let _ = fs::remove_file(&knob);
        result
    }

    fn flow_flush(&self, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let old = self.running_sdn()?;
        let killed = self.stop_sdn(steps, old, plan, false);
        let delay = format!("{:.3}s", plan.hold_seconds);
        let new = self.start_sdn(&["--program-delay", &delay])?;
        steps.now(format!("new openshift-sdn-node started, pid {new}, --program-delay {delay}"));
        let timeout = plan.hold() + Duration::from_secs(20);
        self.await_sdn_event(steps, new, "flushed", killed, Duration::from_secs(10), "flushed every flow on br0")?;
        self.await_sdn_event(steps, new, "programmed", killed, timeout, "programmed the pod flows")?;
        self.await_sdn_event(steps, new, "ready", killed, timeout, "wrote the CNI config (ready)")
    }

    fn cni_flap(&self, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let config = self.cni_config_path();
        match fs::remove_file(&config) {
            Ok(()) => steps.now(format!("deleted {}", config.display())),
            Err(error) => steps.now(format!("cannot delete {}: {error}", config.display())),
        };
        std::thread::sleep(plan.hold());
        sys::write_atomic(&config, &self.root, &cni::network_config())?;
        Ok(steps.now(format!("restored {}", config.display())))
    }

    fn benign_restart(&self, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let old = self.running_sdn()?;
        let killed = self.stop_sdn(steps, old, plan, false);
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

    /// Everything to the UDP stream's server is dropped in its pod (the web pod by default).
    fn silent_drop(&self, plan: &FaultPlan, steps: &mut Steps<'_>) -> anyhow::Result<Timestamp> {
        let web = self.pod_named(&self.roles.stream_server)?;
        let iptables =
            |op: &str| sys::run(sys::in_netns(&web.netns, "iptables").args(["-w", "5", op, "INPUT", "-j", "DROP"]));
        iptables("-I")?;
        steps.now(format!("iptables -I INPUT -j DROP in {} (pod {}/{})", web.netns, web.namespace, web.pod));
        std::thread::sleep(plan.hold());
        iptables("-D")?;
        Ok(steps.now(format!("removed the DROP rule in {}", web.netns)))
    }
}
