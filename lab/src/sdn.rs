//! The stand-in openshift-sdn node process (`dm-lab sdn`, exec'd as `<root>/bin/openshift-sdn-node`
//! so its kernel comm is `openshift-sdn-n`). Like openshift-sdn it owns br0's flows and the CNI
//! config: on start it flushes the flow table (unless `--keep-flows`), programs the pod flows
//! after `--program-delay`, then writes `80-openshift-network.conf`; every second it checks the
//! flows and re-programs them `--resync-delay` after it finds them gone (ovs-vswitchd restarted
//! with `fail_mode=secure`; a replay may set that delay, see [`resync_delay_path`]); its TERM trap
//! deletes the CNI config and exits 0.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use jiff::Timestamp;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use serde::{Deserialize, Serialize};

use crate::{
    BRIDGE, GATEWAY, Lab, PREFIX, TUN,
    daemons::{append_line, now_text},
    sys::{self, OvsDirs},
};

/// The cookie on every flow the sdn programs (how it tells its flows from others).
pub const COOKIE: &str = "0xd31";

/// What the sdn was told.
#[derive(Clone, Debug)]
pub struct SdnOptions {
    /// Lab root (state file, OVS dirs, CNI dir).
    pub root: PathBuf,
    /// Do not flush the flow table on start.
    pub keep_flows: bool,
    /// Wait between the flush and programming the flows.
    pub program_delay: Duration,
    /// Wait between finding the flows gone and re-programming them.
    pub resync_delay: Duration,
    /// Where to write this process's pid.
    pub pidfile: PathBuf,
}

/// One line of the sdn's event log (`<root>/sdn-events.jsonl`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SdnEvent {
    /// When.
    pub at: Timestamp,
    /// Which sdn process.
    pub pid: u32,
    /// `start`, `flushed`, `programmed`, `ready` (CNI config written), `flows-missing`, `terminated`.
    pub event: String,
}

/// Parses sdn event log text, skipping bad lines.
pub fn parse_events(text: &str) -> Vec<SdnEvent> {
    text.lines().filter_map(|line| serde_json::from_str(line.trim()).ok()).collect()
}

/// Reads the sdn event log (no file: no events).
pub fn read_events(path: &Path) -> Vec<SdnEvent> {
    parse_events(&std::fs::read_to_string(path).unwrap_or_default())
}

/// The OpenFlow rules for `ports` (IP, ofport): IPv4 and ARP to each address go to its port.
pub fn flow_lines(ports: &[(&str, u32)]) -> String {
    let mut flows = String::new();
    for (ip, ofport) in ports {
        flows.push_str(&format!("cookie={COOKIE},priority=100,ip,nw_dst={ip},actions=output:{ofport}\n"));
        flows.push_str(&format!("cookie={COOKIE},priority=100,arp,arp_tpa={ip},actions=output:{ofport}\n"));
    }
    flows
}

/// A file whose duration (`2.5s`), when present, the running sdn waits instead of its
/// `--resync-delay` the next time it finds the flows gone: how a replay sets the outage of an
/// OVS restart without restarting the sdn.
pub fn resync_delay_path(root: &Path) -> PathBuf {
    root.join("sdn-resync-delay")
}

fn resync_delay(root: &Path) -> Option<Duration> {
    let text = std::fs::read_to_string(resync_delay_path(root)).ok()?;
    match crate::daemons::parse_duration(&text) {
        Ok(delay) => Some(delay),
        Err(error) => {
            eprintln!("{} ignoring {}: {error}", now_text(), resync_delay_path(root).display());
            None
        }
    }
}

/// How many flows a fully programmed br0 has.
pub fn expected_flows(lab: &Lab) -> usize {
    2 * (lab.pods.len() + 1)
}

/// Counts the sdn's flows on br0.
pub fn count_flows(ovs: &OvsDirs) -> anyhow::Result<usize> {
    let dump = ovs.ofctl(&["dump-flows", BRIDGE, &format!("cookie={COOKIE}/-1")], None)?;
    Ok(dump.lines().filter(|line| line.contains(&format!("cookie={COOKIE}"))).count())
}

/// Configures tun0 (address, up, no TX checksum offload) and programs the pod flows.
pub fn program(lab: &Lab, ovs: &OvsDirs) -> anyhow::Result<()> {
    let address = format!("{GATEWAY}/{PREFIX}");
    sys::run(std::process::Command::new("ip").args(["addr", "replace", &address, "dev", TUN]))?;
    sys::run(std::process::Command::new("ip").args(["link", "set", TUN, "up"]))?;
    sys::run(std::process::Command::new("ethtool").args(["-K", TUN, "tx", "off"]))?;
    let mut ports: Vec<(&str, u32)> = Vec::new();
    for (name, ip) in
        std::iter::once((TUN, GATEWAY)).chain(lab.pods.iter().map(|pod| (pod.veth.as_str(), pod.ip.as_str())))
    {
        let ofport = ovs.vsctl(&["get", "Interface", name, "ofport"])?;
        let ofport: i64 = ofport.trim().parse().with_context(|| format!("ofport of {name}: {ofport:?}"))?;
        if ofport <= 0 {
            bail!("port {name} has no ofport yet ({ofport})");
        }
        ports.push((ip, ofport as u32));
    }
    ovs.ofctl(&["add-flows", BRIDGE, "-"], Some(&flow_lines(&ports)))?;
    Ok(())
}

static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// Sleeps `duration` unless TERM arrives; false when it did.
fn pause(duration: Duration) -> bool {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        if TERMINATED.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)));
    }
    !TERMINATED.load(Ordering::SeqCst)
}

/// Runs the sdn until SIGTERM/SIGINT.
pub fn run(options: &SdnOptions) -> anyhow::Result<()> {
    let action = SigAction::new(SigHandler::Handler(on_term), SaFlags::empty(), SigSet::empty());
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }.with_context(|| format!("installing a {signal} handler"))?;
    }
    sys::write_own_pid(&options.pidfile)?;
    let lab = Lab::load(&options.root)?;
    let ovs = lab.ovs();
    let events = lab.sdn_events_log();
    let pid = std::process::id();
    let event = |name: &str| {
        append_line(&events, &serde_json::json!({ "at": now_text(), "pid": pid, "event": name }).to_string());
    };
    println!("{} openshift-sdn-node (stand-in) pid {pid} starting: {options:?}", now_text());
    event("start");
    if !options.keep_flows {
        match ovs.ofctl(&["del-flows", BRIDGE], None) {
            Ok(_) => {
                println!("{} flushed all flows on {BRIDGE}", now_text());
                event("flushed");
            }
            Err(error) => eprintln!("{} cannot flush flows: {error:#}", now_text()),
        }
        if !pause(options.program_delay) {
            return terminate(&lab, &event);
        }
    }
    // Program (or with --keep-flows, check) the flows until it works.
    loop {
        match count_flows(&ovs) {
            Ok(count) if count >= expected_flows(&lab) => {
                println!("{} {count} flows present, nothing to program", now_text());
                break;
            }
            Ok(_) => match program(&lab, &ovs) {
                Ok(()) => {
                    println!("{} programmed {} flows on {BRIDGE}", now_text(), expected_flows(&lab));
                    event("programmed");
                    break;
                }
                Err(error) => eprintln!("{} cannot program flows: {error:#}", now_text()),
            },
            Err(error) => eprintln!("{} cannot read flows: {error:#}", now_text()),
        }
        if !pause(Duration::from_secs(1)) {
            return terminate(&lab, &event);
        }
    }
    let config = lab.cni_config_path();
    match sys::write_atomic(&config, &lab.root, &crate::cni::network_config()) {
        Ok(()) => println!("{} wrote {}", now_text(), config.display()),
        Err(error) => eprintln!("{} cannot write the CNI config: {error:#}", now_text()),
    }
    event("ready");
    let mut unreadable = false;
    loop {
        if !pause(Duration::from_secs(1)) {
            return terminate(&lab, &event);
        }
        match count_flows(&ovs) {
            Ok(count) if count < expected_flows(&lab) => {
                unreadable = false;
                let resync_delay = resync_delay(&lab.root).unwrap_or(options.resync_delay);
                println!(
                    "{} only {count} of {} flows on {BRIDGE} (ovs-vswitchd restarted?); re-programming in {:.1} s",
                    now_text(),
                    expected_flows(&lab),
                    resync_delay.as_secs_f64()
                );
                event("flows-missing");
                if !pause(resync_delay) {
                    return terminate(&lab, &event);
                }
                loop {
                    match program(&lab, &ovs) {
                        Ok(()) => {
                            println!("{} re-programmed {} flows", now_text(), expected_flows(&lab));
                            event("programmed");
                            break;
                        }
                        Err(error) => eprintln!("{} cannot program flows: {error:#}", now_text()),
                    }
                    if !pause(Duration::from_secs(1)) {
                        return terminate(&lab, &event);
                    }
                }
            }
            Ok(_) => unreadable = false,
            Err(error) => {
                if !unreadable {
                    eprintln!("{} cannot read flows (ovs-vswitchd down?): {error:#}", now_text());
                }
                unreadable = true;
            }
        }
    }
}

/// The TERM trap: delete the CNI config, exit 0.
fn terminate(lab: &Lab, event: &dyn Fn(&str)) -> anyhow::Result<()> {
    let config = lab.cni_config_path();
    match std::fs::remove_file(&config) {
        Ok(()) => println!("{} TERM: removed {}", now_text(), config.display()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => eprintln!("{} TERM: cannot remove {}: {error}", now_text(), config.display()),
    }
    event("terminated");
    println!("{} TERM: exiting", now_text());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_send_ip_and_arp_to_the_port() {
        let flows = flow_lines(&[("10.129.0.1", 1), ("10.129.0.43", 2)]);
        assert_eq!(flows.lines().count(), 4);
        assert!(flows.contains("cookie=0xd31,priority=100,ip,nw_dst=10.129.0.43,actions=output:2"));
        assert!(flows.contains("cookie=0xd31,priority=100,arp,arp_tpa=10.129.0.1,actions=output:1"));
    }

    #[test]
    fn events_parse_forgivingly() {
        let text = "{\"at\":\"2026-01-12T20:58:46.230Z\",\"pid\":7,\"event\":\"ready\"}\n{bad\n";
        let events = parse_events(text);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event, "ready");
        assert_eq!(events[0].pid, 7);
    }
}
