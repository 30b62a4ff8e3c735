//! How one replay of a scenario is shaped: how long its fault lasts, which signal stops the sdn,
//! and in the seed which comes first, the CNI config's removal or the OVS restart. Each
//! scenario has fixed defaults (what `dm-lab disrupt` and the tests replay); `cargo xtask eval`
//! draws every run's plan from a seed instead, so that nothing is tuned to one timing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Scenario, soak::Rng};

/// How the sdn is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum StopSignal {
    /// SIGTERM: the sdn's trap deletes the CNI config before it exits.
    Term,
    /// SIGKILL: no trap runs; the config stays unless the scenario removes it.
    Kill,
}

impl StopSignal {
    /// `SIGTERM` / `SIGKILL`.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Term => "SIGTERM",
            StopSignal::Kill => "SIGKILL",
        }
    }

    pub(crate) fn signal(self) -> nix::sys::signal::Signal {
        match self {
            StopSignal::Term => nix::sys::signal::Signal::SIGTERM,
            StopSignal::Kill => nix::sys::signal::Signal::SIGKILL,
        }
    }
}

/// The shape of one replay.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// How long the fault is held, in seconds: sdn-upgrade, the stop of the old sdn to the start
    /// of the new one; ovs-restart, the running sdn's wait before it re-programs the flows it
    /// found gone; flow-flush, the new sdn's wait between its flush and its flows; cni-flap, the
    /// config's absence; silent-drop, the DROP rule's life; the decoys, the lifecycle event's.
    pub hold_seconds: f64,
    /// How the sdn is stopped (sdn-upgrade, flow-flush, benign-restart, rejects-restart).
    pub signal: StopSignal,
    /// sdn-upgrade: the CNI config is removed 1 s before the OVS restart (else 1 s after).
    pub cni_first: bool,
    /// Seconds from the agent's readiness to the fault (`cargo xtask eval` waits them; the lab
    /// does not).
    pub delay_seconds: f64,
}

/// The ranges [`FaultPlan::draw`] draws from, in milliseconds.
pub const HOLD_MS: (u64, u64) = (2_000, 15_000);
pub const DELAY_MS: (u64, u64) = (500, 30_000);

impl FaultPlan {
    /// The fixed plan of `scenario`, as the lab has always replayed it.
    pub fn default_for(scenario: Scenario) -> Self {
        let (hold_seconds, signal) = match scenario {
            // 9 s, not 8: the datapath gap (vswitchd restart at +1 s to flows at +9.5 s) then
            // exceeds 8 s whatever the prober's phase, so the outage lands in the seed's 8–12 s.
            Scenario::SdnUpgrade => (9.0, StopSignal::Term),
            Scenario::OvsRestart => (3.0, StopSignal::Term),
            Scenario::FlowFlush => (4.0, StopSignal::Kill),
            Scenario::CniFlap | Scenario::ScanFlap => (2.0, StopSignal::Term),
            Scenario::BenignRestart | Scenario::RejectsRestart => (0.0, StopSignal::Kill),
            Scenario::SilentDrop => (5.0, StopSignal::Term),
        };
        Self { hold_seconds, signal, cni_first: true, delay_seconds: 2.0 }
    }

    /// A plan for `scenario` drawn from `rng`: hold 2–15 s (none for the restarts that keep
    /// their flows), signal TERM or KILL, either order, delay 0.5–30 s.
    pub fn draw(scenario: Scenario, rng: &mut Rng) -> Self {
        let hold_ms = rng.range(HOLD_MS.0, HOLD_MS.1);
        let delay_ms = rng.range(DELAY_MS.0, DELAY_MS.1);
        let signal = if rng.next_u64() & 1 == 0 { StopSignal::Term } else { StopSignal::Kill };
        let cni_first = rng.next_u64() & 1 == 0;
        let hold_seconds = match scenario {
            Scenario::BenignRestart | Scenario::RejectsRestart => 0.0,
            _ => hold_ms as f64 / 1000.0,
        };
        Self { hold_seconds, signal, cni_first, delay_seconds: delay_ms as f64 / 1000.0 }
    }

    /// [`FaultPlan::hold_seconds`] as a duration.
    pub fn hold(&self) -> Duration {
        Duration::from_secs_f64(self.hold_seconds.max(0.0))
    }

    /// [`FaultPlan::delay_seconds`] as a duration.
    pub fn delay(&self) -> Duration {
        Duration::from_secs_f64(self.delay_seconds.max(0.0))
    }

    /// One line for logs and reports: what of the plan the scenario uses.
    pub fn describe(&self, scenario: Scenario) -> String {
        let hold = format!("hold {:.1} s", self.hold_seconds);
        let signal = self.signal.name();
        let order = if self.cni_first {
            "CNI config removed, then OVS restarted"
        } else {
            "OVS restarted, then CNI config removed"
        };
        match scenario {
            Scenario::SdnUpgrade => format!("{hold}, {signal}, {order}"),
            Scenario::FlowFlush => format!("{hold}, {signal}"),
            Scenario::BenignRestart | Scenario::RejectsRestart => signal.to_string(),
            Scenario::OvsRestart | Scenario::CniFlap | Scenario::SilentDrop | Scenario::ScanFlap => hold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_replay_from_the_seed_and_stay_in_their_ranges() {
        let draw = |seed| {
            let mut rng = Rng::from_seed(seed);
            (0..200).map(|_| FaultPlan::draw(Scenario::SdnUpgrade, &mut rng)).collect::<Vec<_>>()
        };
        let plans = draw(42);
        assert_eq!(plans, draw(42));
        assert_ne!(plans, draw(43));
        for plan in &plans {
            assert!((2.0..=15.0).contains(&plan.hold_seconds), "{plan:?}");
            assert!((0.5..=30.0).contains(&plan.delay_seconds), "{plan:?}");
        }
        // Both signals and both orders come up.
        assert!(
            plans.iter().any(|p| p.signal == StopSignal::Term) && plans.iter().any(|p| p.signal == StopSignal::Kill)
        );
        assert!(plans.iter().any(|p| p.cni_first) && plans.iter().any(|p| !p.cni_first));
        let mut rng = Rng::from_seed(1);
        assert_eq!(FaultPlan::draw(Scenario::BenignRestart, &mut rng).hold_seconds, 0.0);
    }

    #[test]
    fn defaults_are_the_fixed_replays() {
        let seed = FaultPlan::default_for(Scenario::SdnUpgrade);
        assert_eq!((seed.hold_seconds, seed.signal, seed.cni_first), (9.0, StopSignal::Term, true));
        assert_eq!(seed.describe(Scenario::SdnUpgrade), "hold 9.0 s, SIGTERM, CNI config removed, then OVS restarted");
        assert_eq!(FaultPlan::default_for(Scenario::FlowFlush).describe(Scenario::FlowFlush), "hold 4.0 s, SIGKILL");
        assert_eq!(FaultPlan::default_for(Scenario::CniFlap).describe(Scenario::CniFlap), "hold 2.0 s");
    }
}
