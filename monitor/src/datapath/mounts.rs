//! The pseudo filesystems the agent needs: tracefs (classic tracepoints) and bpffs.
//! A container or a minimal host may not have them mounted.

use std::path::Path;

use nix::mount::{MsFlags, mount};
use tracing::info;

use super::DatapathError;

pub const TRACEFS: &str = "/sys/kernel/tracing";
pub const BPFFS: &str = "/sys/fs/bpf";

/// Mounts tracefs and bpffs where they are missing. Returns what it mounted.
pub fn ensure_mounted() -> Result<Vec<&'static str>, DatapathError> {
    let mut mounted = Vec::new();
    for (target, fstype, marker) in [(TRACEFS, "tracefs", "events"), (BPFFS, "bpf", "")] {
        if is_mounted(target, fstype) {
            continue;
        }
        // tracefs may be reachable through debugfs's automount even when not listed.
        if !marker.is_empty() && Path::new(target).join(marker).exists() {
            continue;
        }
        mount(Some(fstype), target, Some(fstype), MsFlags::empty(), None::<&str>).map_err(|errno| {
            // Without CAP_SYS_ADMIN, say so: it is the one thing the operator can change.
            let lacking = errno == nix::errno::Errno::EPERM
                && crate::privileges::has_effective(crate::privileges::CAP_SYS_ADMIN) == Some(false);
            let hint = if lacking {
                ": the agent lacks CAP_SYS_ADMIN, which mounting needs (grant it, or mount it on the host)"
            } else {
                ""
            };
            DatapathError::Mount { target, fstype, hint, source: std::io::Error::from(errno) }
        })?;
        info!(target, fstype, "mounted");
        mounted.push(target);
    }
    Ok(mounted)
}

fn is_mounted(target: &str, fstype: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|mounts| {
        mounts.lines().any(|line| {
            let mut fields = line.split_whitespace();
            let (_source, mount_point, kind) = (fields.next(), fields.next(), fields.next());
            mount_point == Some(target) && kind == Some(fstype)
        })
    })
}
