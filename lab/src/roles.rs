//! Which pods carry the lab's ground truth: the pod the node's prober probes (its `/healthz`
//! server) and the two ends of the UDP stream (client and echo server). `dm-lab up` and the
//! tests use [`Roles::default`]; `cargo xtask eval` draws each run's roles from its seed, so
//! that the agent is never scored on one fixed pod layout.

use std::time::Duration;

use anyhow::Context as _;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{HEALTHZ_PORT, Lab, NODE_NETNS, UDP_PORT, UDP_RATE, probe_log, soak::Rng, sys};

/// The lab's pods, by short name, in the order roles are drawn from.
const POD_NAMES: [&str; 3] = ["apiserver", "web", "client"];

/// The traffic daemons [`Lab::assign_roles`] moves.
const TRAFFIC_DAEMONS: [&str; 4] = ["prober", "udp-client", "serve-healthz", "udp-echo"];

/// Pods by short name (`apiserver`, `web`, `client`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roles {
    /// The prober's target: the node probes its `/healthz`, as kubelet probes a pod.
    pub probed: String,
    /// The UDP stream's sender, and the pod that echoes it.
    pub stream_client: String,
    pub stream_server: String,
}

impl Default for Roles {
    fn default() -> Self {
        Self { probed: "apiserver".into(), stream_client: "client".into(), stream_server: "web".into() }
    }
}

impl Roles {
    /// Uniform over the 3 × 6 layouts: any pod probed, any ordered pair streaming (the probed
    /// pod may be one of them).
    pub fn draw(rng: &mut Rng) -> Self {
        let pick = |rng: &mut Rng, from: &[&str]| from[rng.range(0, from.len() as u64 - 1) as usize].to_string();
        let probed = pick(rng, &POD_NAMES);
        let stream_client = pick(rng, &POD_NAMES);
        let others: Vec<&str> = POD_NAMES.iter().copied().filter(|name| *name != stream_client).collect();
        let stream_server = pick(rng, &others);
        Self { probed, stream_client, stream_server }
    }

    /// E.g. `probe → apiserver, stream client → web`.
    pub fn describe(&self) -> String {
        format!("probe → {}, stream {} → {}", self.probed, self.stream_client, self.stream_server)
    }
}

impl Lab {
    /// Starts the servers of the traffic the lab watches: `/healthz` in the probed pod, the UDP
    /// echo in the stream's server.
    pub(crate) fn start_servers(&self) -> anyhow::Result<()> {
        let probed = self.pod_named(&self.roles.probed)?;
        let server = self.pod_named(&self.roles.stream_server)?;
        self.spawn("serve-healthz", &probed.netns, &self.bin, &["serve-healthz", "--port", &HEALTHZ_PORT.to_string()])?;
        self.spawn("udp-echo", &server.netns, &self.bin, &["udp-echo", "--port", &UDP_PORT.to_string()])?;
        Ok(())
    }

    /// Starts the prober and the UDP client, and waits until a probe passed and a datagram
    /// was echoed.
    pub(crate) fn start_clients(&self) -> anyhow::Result<()> {
        let probed = self.pod_named(&self.roles.probed)?;
        let client = self.pod_named(&self.roles.stream_client)?;
        let server = self.pod_named(&self.roles.stream_server)?;
        let target = format!("{}:{UDP_PORT}", server.ip);
        let udp_log = self.udp_log().to_string_lossy().into_owned();
        let rate = UDP_RATE.to_string();
        let args = ["udp-client", "--target", &target, "--rate", &rate, "--log", &udp_log];
        self.spawn("udp-client", &client.netns, &self.bin, &args)?;
        let url = format!("http://{}:{HEALTHZ_PORT}/healthz", probed.ip);
        let since = Timestamp::now();
        let period = format!("{}ms", self.probe_period_ms);
        let prober_log = self.prober_log().to_string_lossy().into_owned();
        let args = ["prober", "--url", &url, "--period", &period, "--timeout", "1s", "--log", &prober_log];
        self.spawn("prober", NODE_NETNS, &self.bin, &args)?;

        // End to end: TCP from the node to the probed pod, UDP between the stream's pods.
        let probed = sys::wait_for(Duration::from_secs(20), || {
            self.probes(Some(since)).ok().filter(|probes| probes.iter().any(|probe| probe.ok))
        });
        if probed.is_none() {
            let last = self.probes(Some(since)).ok().and_then(|probes| probes.last().cloned());
            anyhow::bail!(
                "the prober did not reach {url} within 20 s (last probe: {}); flows on {}: {}; prober log:\n{}",
                last.map_or("none".to_string(), |probe| probe.error.unwrap_or_else(|| "ok".into())),
                crate::BRIDGE,
                crate::sdn::count_flows(&self.ovs())
                    .map_or_else(|error| format!("unknown ({error:#})"), |n| n.to_string()),
                sys::tail(&self.logs_dir().join("prober.log"), 5)
            );
        }
        sys::wait_for(Duration::from_secs(10), || {
            let seconds = probe_log::parse_udp(&std::fs::read_to_string(self.udp_log()).unwrap_or_default());
            seconds.iter().any(|second| second.at >= since && second.received > 0).then_some(())
        })
        .with_context(|| format!("no UDP echo from {target} to the {} pod within 10 s", client.name))?;
        Ok(())
    }

    /// Moves the probe and the stream to `roles` (stops their daemons, starts them in the new
    /// pods, waits until both flow again) and records it in the state file. Nothing to do when
    /// they are there already.
    pub fn assign_roles(&mut self, roles: &Roles) -> anyhow::Result<()> {
        if self.roles == *roles {
            return Ok(());
        }
        for name in TRAFFIC_DAEMONS {
            self.stop_daemon(name);
        }
        self.roles = roles.clone();
        self.write_state()?;
        self.start_servers()?;
        self.start_clients()
    }

    /// `pod/namespace` names of the pods with these short names.
    pub fn pod_names<'a>(&self, short: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        short
            .into_iter()
            .filter_map(|name| self.pod(name))
            .map(|pod| format!("{}/{}", pod.namespace, pod.pod))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drawn_roles_stream_between_two_pods_and_cover_every_layout() {
        let mut rng = Rng::from_seed(7);
        let mut layouts = std::collections::BTreeSet::new();
        for _ in 0..400 {
            let roles = Roles::draw(&mut rng);
            assert_ne!(roles.stream_client, roles.stream_server, "{roles:?}");
            for name in [&roles.probed, &roles.stream_client, &roles.stream_server] {
                assert!(POD_NAMES.contains(&name.as_str()), "{roles:?}");
            }
            layouts.insert(roles.describe());
        }
        assert_eq!(layouts.len(), 3 * 6, "{layouts:?}");
        // The same seed, the same roles.
        assert_eq!(Roles::draw(&mut Rng::from_seed(11)), Roles::draw(&mut Rng::from_seed(11)));
    }
}
