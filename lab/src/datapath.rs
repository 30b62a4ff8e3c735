//! OVS's kernel datapath under the lab's bridge: loading `openvswitch.ko`, working around the
//! handler bug of OVS 3.1.0, and the health check the lab runs before it replays anything.
//!
//! **The handler bug.** In per-CPU upcall dispatch (kernels ≥ 5.15 with OVS ≥ 2.16),
//! ovs-vswitchd makes one upcall handler thread per usable CPU, counted by `count_cpu_cores()`.
//! OVS 3.1.0 (Debian bookworm's `openvswitch-switch` 3.1.0-2+deb12u1) refreshes that count only
//! once `time_msec() - last_updated >= 10000` with `last_updated` starting at 0, and
//! `time_msec()` is CLOCK_MONOTONIC: until the machine has been up 10 s the count is 0. An
//! ovs-vswitchd that configures its datapath then logs "Overriding n-handler-threads to 0",
//! hands the kernel an empty per-CPU PID list, every upcall fails with `-ENOTCONN` and
//! `ovs-dpctl show` counts every miss as `lost`: nothing is forwarded until a later
//! reconfiguration (after the 10 s) happens to recount. A freshly booted test VM starts OVS
//! within 10 s. Fixed upstream by b354cee2e ("ovs-thread: Fix cpus not read for the first
//! 10s", OVS 3.2.0, backported to 3.1.1); the lab waits out the 10 s with an affected OVS.

use std::{fs, path::Path, process::Command, thread, time::Duration};

use anyhow::{Context, bail};

use crate::{NODE_NETNS, sys};

/// An affected ovs-vswitchd counts no CPU before CLOCK_MONOTONIC reaches this (its
/// `COUNT_CPU_UPDATE_TIME_MS`), plus a margin.
const CPU_COUNT_AFTER: Duration = Duration::from_millis(10_500);

/// Loads `openvswitch.ko` unless it is there; a clear error on a kernel without it.
pub fn load_module() -> anyhow::Result<()> {
    if Path::new("/sys/module/openvswitch").exists() {
        return Ok(());
    }
    let output = Command::new("modprobe").arg("openvswitch").output().context("cannot run modprobe")?;
    if !output.status.success() || !Path::new("/sys/module/openvswitch").exists() {
        bail!(
            "the kernel datapath needs openvswitch.ko and `modprobe openvswitch` failed on {}: {} \
             (the 6.1 and 6.12 test VMs have it: cargo xtask lab up --datapath kernel --vm 6.12)",
            kernel_release(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "this kernel".into(), |s| s.trim().to_string())
}

/// ovs-vswitchd's version, e.g. (3, 1, 0), from `ovs-vswitchd --version`.
pub fn vswitchd_version() -> anyhow::Result<(u32, u32, u32)> {
    let text = sys::run(Command::new("ovs-vswitchd").arg("--version"))?;
    parse_version(&text).with_context(|| format!("no version in `ovs-vswitchd --version`: {text}"))
}

/// `ovs-vswitchd (Open vSwitch) 3.1.0` → (3, 1, 0).
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let first = text.lines().next()?;
    let version = first.split_whitespace().last()?;
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).filter(|p| !p.is_empty());
    let mut next = || parts.next().and_then(|p| p.parse().ok());
    Some((next()?, next()?, next().unwrap_or(0)))
}

/// Whether this OVS has the 10 s CPU-count bug: only 3.1.0 (introduced by 0d23948a598a,
/// "ovs-thread: Detect changes in number of CPUs"; fixed in 3.1.1 and 3.2.0).
fn has_cpu_count_bug(version: (u32, u32, u32)) -> bool {
    version == (3, 1, 0)
}

/// CLOCK_MONOTONIC, the clock of OVS's `time_msec()`.
fn monotonic() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// With an OVS that has the CPU-count bug, waits until the machine has been up long enough
/// for ovs-vswitchd to count its CPUs (at most 10.5 s, only right after boot).
pub fn wait_for_cpu_count() -> anyhow::Result<()> {
    let up = monotonic();
    // Past the 10 s, no version check: `ovs-vswitchd --version` is a process named
    // ovs-vswitchd, and run between a stop and a start (a scenario's restart) the agent saw
    // its short run as one more restart.
    if up >= CPU_COUNT_AFTER {
        return Ok(());
    }
    let version = vswitchd_version()?;
    if has_cpu_count_bug(version) {
        let wait = CPU_COUNT_AFTER - up;
        println!(
            "OVS {}.{}.{} counts no CPU in its first 10 s of uptime (0 upcall handlers, every upcall lost; \
             fixed in 3.1.1): up {:.1} s, waiting {:.1} s before starting ovs-vswitchd",
            version.0,
            version.1,
            version.2,
            up.as_secs_f64(),
            wait.as_secs_f64()
        );
        thread::sleep(wait);
    }
    Ok(())
}

/// The upcall handler threads of ovs-vswitchd `pid` (threads named `handler<N>`).
pub fn handler_threads(pid: i32) -> usize {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter(|task| fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.starts_with("handler")))
        .count()
}

/// `ovs-dpctl show`'s counters of the lab's kernel datapath.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DatapathStats {
    /// Packets that matched a kernel flow.
    pub hit: u64,
    /// Packets that matched none and were sent to ovs-vswitchd (an upcall).
    pub missed: u64,
    /// Upcalls that failed (no handler, a full queue): packets lost.
    pub lost: u64,
    /// Kernel flows.
    pub flows: u64,
}

/// Reads `ovs-dpctl show` in the node netns.
pub fn stats() -> anyhow::Result<DatapathStats> {
    let text = sys::run(sys::in_netns(NODE_NETNS, "ovs-dpctl").arg("show"))?;
    parse_dpctl_show(&text).with_context(|| format!("cannot read `ovs-dpctl show`:\n{text}"))
}

/// `lookups: hit:H missed:M lost:L` and `flows: F` of the first datapath in `ovs-dpctl show`.
pub fn parse_dpctl_show(text: &str) -> Option<DatapathStats> {
    let mut stats = DatapathStats::default();
    let mut seen = (false, false);
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("lookups:") {
            for field in rest.split_whitespace() {
                let (name, value) = field.split_once(':')?;
                let value = value.parse().ok()?;
                match name {
                    "hit" => stats.hit = value,
                    "missed" => stats.missed = value,
                    "lost" => stats.lost = value,
                    _ => {}
                }
            }
            seen.0 = true;
        } else if let Some(rest) = line.strip_prefix("flows:") {
            stats.flows = rest.trim().parse().ok()?;
            seen.1 = true;
        }
    }
    (seen.0 && seen.1).then_some(stats)
}

/// The kernel datapath's health: upcall handlers exist and no upcall is lost over `over`.
/// The error says what is wrong and what it means.
pub fn check_health(vswitchd: i32, over: Duration) -> anyhow::Result<DatapathStats> {
    let handlers = handler_threads(vswitchd);
    if handlers == 0 {
        bail!(
            "ovs-vswitchd (pid {vswitchd}) has no upcall handler threads: every packet without a kernel flow is \
             lost (see `ovs-dpctl show`); with OVS 3.1.0 this is the 10 s CPU-count bug"
        );
    }
    let before = stats()?;
    thread::sleep(over);
    let after = stats()?;
    if after.lost > before.lost {
        bail!(
            "the kernel datapath lost {} upcalls in {:.1} s (lookups hit:{} missed:{} lost:{}, {handlers} handler \
             threads): the switch is not forwarding reliably",
            after.lost - before.lost,
            over.as_secs_f64(),
            after.hit,
            after.missed,
            after.lost
        );
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_the_affected_ones() {
        assert_eq!(parse_version("ovs-vswitchd (Open vSwitch) 3.1.0\nDPDK 22.11.1\n"), Some((3, 1, 0)));
        assert_eq!(parse_version("ovs-vswitchd (Open vSwitch) 3.3.0-1ubuntu2"), Some((3, 3, 0)));
        assert_eq!(parse_version("ovs-vswitchd (Open vSwitch) 2.17"), Some((2, 17, 0)));
        assert_eq!(parse_version(""), None);
        assert!(has_cpu_count_bug((3, 1, 0)));
        for fine in [(3, 0, 7), (3, 1, 1), (2, 17, 9), (3, 2, 0)] {
            assert!(!has_cpu_count_bug(fine), "{fine:?}");
        }
    }

    #[test]
    fn dpctl_show_is_read() {
        let text = "system@ovs-system:\n  lookups: hit:12 missed:91 lost:91\n  flows: 0\n  \
                    masks: hit:0 total:0 hit/pkt:0.00\n  port 0: ovs-system (internal)\n";
        assert_eq!(parse_dpctl_show(text), Some(DatapathStats { hit: 12, missed: 91, lost: 91, flows: 0 }));
        assert_eq!(parse_dpctl_show("system@ovs-system:\n  flows: 3\n"), None);
        assert_eq!(parse_dpctl_show("lookups: hit:x missed:1 lost:0\nflows: 1"), None);
    }
}
