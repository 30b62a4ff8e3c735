//! Least privilege at run time: once the kernel programs are loaded, the pseudo filesystems
//! mounted and the interfaces present at start-up attached, the agent drops every capability
//! except those later work needs:
//!
//! | kept | for |
//! |---|---|
//! | `CAP_BPF` | every `bpf()` call: reading the maps each sample, attaching to new interfaces |
//! | `CAP_NET_ADMIN` | attaching tc programs to interfaces that appear later (tcx links, clsact filters), the link watch's `SO_RCVBUFFORCE` |
//! | `CAP_PERFMON` | attaching the OVS upcall tracer when openvswitch.ko is loaded after start-up |
//! | `CAP_SYS_PTRACE` | reading `/proc/<pid>/ns/net` and `ns/pid` of other users' processes (pods' network namespaces, the PID namespace check) |
//! | `CAP_LEASE` | the `F_SETLEASE` probe on CNI config files owned by another user (is it still being written?) |
//!
//! Dropped with the rest: `CAP_SYSLOG`, which only opening `/proc/kallsyms` at start-up needs
//! (the open file keeps showing addresses; see `kernel_layout::ovs_upcall_site`).
//!
//! Without `CAP_BPF` in the permitted set (a kernel before 5.8 or a runtime that does not
//! grant it), `CAP_SYS_ADMIN` stands in for `CAP_BPF` and `CAP_PERFMON` and is kept.
//!
//! Capabilities belong to threads, and the runtime's threads exist already: the drop is done
//! on every thread of the process, each in a signal handler that makes the `capset` call for
//! itself (as glibc does for `setuid`), and checked in `/proc/self/task/*/status`. Threads
//! made later inherit the dropped set from the thread that makes them.

use std::{
    fs,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// Capability numbers (`linux/capability.h`).
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_LEASE: u32 = 28;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit halves.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The set every thread's effective and permitted sets are cut down to, for the handler.
static TARGET: AtomicU64 = AtomicU64::new(0);
/// Threads whose `capset` failed in the handler.
static FAILED: AtomicU32 = AtomicU32::new(0);

fn bit(cap: u32) -> u64 {
    1 << cap
}

/// The capabilities kept out of `permitted` (this process's permitted set).
pub fn kept_of(permitted: u64) -> u64 {
    let mut keep = bit(CAP_BPF) | bit(CAP_NET_ADMIN) | bit(CAP_PERFMON) | bit(CAP_SYS_PTRACE) | bit(CAP_LEASE);
    if permitted & bit(CAP_BPF) == 0 {
        keep |= bit(CAP_SYS_ADMIN);
    }
    permitted & keep
}

/// Names of the capabilities in `set`, for logs.
pub fn names(set: u64) -> Vec<&'static str> {
    [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_LEASE, "CAP_LEASE"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_BPF, "CAP_BPF"),
    ]
    .into_iter()
    .filter(|(cap, _)| set & bit(*cap) != 0)
    .map(|(_, name)| name)
    .collect()
}

/// The capabilities the agent cannot work without, checked before anything is loaded: a
/// missing one is an error that names it and what it is for, rather than an agent that is
/// ready and watches nothing. (`CAP_SYS_ADMIN` stands in for `CAP_BPF` and `CAP_PERFMON`.)
pub fn check_required() -> anyhow::Result<()> {
    let Some(effective) = effective_set() else { return Ok(()) };
    let has = |cap: u32| effective & bit(cap) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN (attaching the tc programs to interfaces)");
    }
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF (loading the kernel programs and reading their maps; or CAP_SYS_ADMIN)");
    }
    if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_PERFMON (the drop and process tracers; or CAP_SYS_ADMIN)");
    }
    if !missing.is_empty() {
        bail!(
            "the agent lacks {}: grant them (deploy/README.md, \"Capabilities and host paths\"), or run it as root",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Whether this thread's effective set holds `cap` (None when /proc cannot say).
pub fn has_effective(cap: u32) -> Option<bool> {
    effective_set().map(|effective| effective & bit(cap) != 0)
}

/// This thread's `CapEff` (None when /proc cannot say).
fn effective_set() -> Option<u64> {
    let status = fs::read_to_string("/proc/thread-self/status").ok()?;
    sets_of(&status).map(|(effective, _)| effective)
}

/// `CapEff` and `CapPrm` of one `/proc/.../status`.
fn sets_of(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status.lines().find_map(|line| line.strip_prefix(name)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    Some((field("CapEff:")?, field("CapPrm:")?))
}

fn capset(set: u64) -> std::io::Result<()> {
    let header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let low = set as u32;
    let high = (set >> 32) as u32;
    let data = [
        CapData { effective: low, permitted: low, inheritable: 0 },
        CapData { effective: high, permitted: high, inheritable: 0 },
    ];
    // SAFETY: capset with a v3 header and its two data structs, for the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

extern "C" fn drop_in_this_thread(_: libc::c_int) {
    // Only async-signal-safe work: one raw syscall and an atomic.
    if capset(TARGET.load(Ordering::SeqCst)).is_err() {
        FAILED.fetch_add(1, Ordering::SeqCst);
    }
}

/// Threads of this process whose effective or permitted set still holds more than `target`.
fn threads_above(target: u64) -> anyhow::Result<Vec<i32>> {
    let mut above = Vec::new();
    for entry in fs::read_dir("/proc/self/task").context("listing /proc/self/task")? {
        let entry = entry?;
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        // A thread that exited meanwhile has no status: it holds nothing.
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else { continue };
        let (effective, permitted) = sets_of(&status).context("no CapEff/CapPrm in a thread's status")?;
        if (effective | permitted) & !target != 0 {
            above.push(tid);
        }
    }
    Ok(above)
}

/// Drops every capability but [`kept_of`] the permitted set, in every thread. Returns the
/// set kept and the set dropped.
pub fn drop_unneeded() -> anyhow::Result<(u64, u64)> {
    let status = fs::read_to_string("/proc/thread-self/status").context("reading this thread's capabilities")?;
    let (_, permitted) = sets_of(&status).context("no CapPrm in /proc/thread-self/status")?;
    let target = kept_of(permitted);
    TARGET.store(target, Ordering::SeqCst);
    capset(target).context("capset in this thread")?;
    let signal = libc::SIGRTMIN() + 5;
    // SAFETY: installs a handler that only makes a raw syscall and touches atomics.
    let previous = unsafe { libc::signal(signal, drop_in_this_thread as *const () as libc::sighandler_t) };
    if previous == libc::SIG_ERR {
        bail!("installing the capability-drop signal handler: {}", std::io::Error::last_os_error());
    }
    let pid = std::process::id() as i32;
    let deadline = Instant::now() + Duration::from_secs(5);
    // Threads made meanwhile by a thread not yet done are found in the next round.
    let outcome = loop {
        let above = threads_above(target)?;
        if above.is_empty() {
            break Ok(());
        }
        if FAILED.load(Ordering::SeqCst) > 0 {
            break Err(anyhow::anyhow!("capset failed in {} thread(s)", FAILED.load(Ordering::SeqCst)));
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!("threads {above:?} kept their capabilities"));
        }
        for tid in above {
            // SAFETY: tgkill to a thread of this very process.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, signal) };
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: restores the default disposition of a signal nobody else uses.
    unsafe { libc::signal(signal, libc::SIG_DFL) };
    outcome?;
    Ok((target, permitted & !target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_later_work_needs_and_sys_admin_only_without_cap_bpf() {
        let everything = (1u64 << 41) - 1;
        let kept = kept_of(everything);
        assert_eq!(names(kept), ["CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_LEASE", "CAP_PERFMON", "CAP_BPF"]);
        let old_kernel = everything & !bit(CAP_BPF) & !bit(CAP_PERFMON);
        assert_eq!(names(kept_of(old_kernel)), ["CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_ADMIN", "CAP_LEASE"]);
        // Never more than was permitted.
        assert_eq!(kept_of(bit(CAP_NET_ADMIN)), bit(CAP_NET_ADMIN));
    }

    #[test]
    fn reads_the_sets_of_a_status_file() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000000c000081000\n";
        assert_eq!(sets_of(status), Some((0xc0_0008_1000, 0x1ff_ffff_ffff)));
        assert_eq!(sets_of("Name: x\n"), None);
    }
}
