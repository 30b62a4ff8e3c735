//! Continuity across agent restarts (`keep_attached`). Without it a restart (a DaemonSet
//! rollout, a crash) costs the seconds between the old agent's exit and the new one's attach:
//! nothing counts packets or drops then, and every counter starts again from zero.
//!
//! With it, the maps and links of one build of the kernel programs are pinned in bpffs under
//! `<pin_dir>/<build>/` (`maps/<NAME>`, `links/<program>` and `links/<program>@<ifindex>`):
//! - the agent leaves its programs attached when it exits, so they never stop counting;
//! - the next agent of the same build reuses the pinned maps (counters go on from where they
//!   were), takes over the tracers' links as they are, and swaps its own tc programs into the
//!   tcx links atomically (`bpf_link_update`), or into the clsact filters in place;
//! - an agent of another build (its maps may differ) starts afresh and removes the old
//!   build's pins once its own programs are attached, so there is no gap then either;
//! - `datapath-monitor detach` removes everything (uninstall).
//!
//! `<build>` is a hash of the kernel object: two agents share pins only when their programs
//! and map layouts are the same bytes.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::links::{FdLink, PinnedLink};
use monitor_common::{
    CONVERSATIONS_MAP, DROP_BASELINES_MAP, DROPS_MAP, FLOW_TABLE_MAP, FLOWS_MAP, INTERFACE_COUNTERS_MAP,
    INTERFACE_SLOTS_MAP, MAP_ERRORS_MAP, POD_ADDRESSES_MAP, POD_VETHS_MAP, PROCESS_EVENTS_MAP, RETRANSMITS_MAP,
    SDN_COMMS_MAP, SERVICES_MAP, UPCALL_CONFIG_MAP, UPCALL_INFLIGHT_MAP, UPCALL_SITE_MAP,
};
use tracing::{debug, info, warn};

/// Every map of the kernel object but its globals (`.rodata`, set at load from this kernel).
pub(super) const PINNED_MAPS: [&str; 17] = [
    INTERFACE_COUNTERS_MAP,
    INTERFACE_SLOTS_MAP,
    FLOWS_MAP,
    SERVICES_MAP,
    FLOW_TABLE_MAP,
    CONVERSATIONS_MAP,
    MAP_ERRORS_MAP,
    DROPS_MAP,
    DROP_BASELINES_MAP,
    POD_ADDRESSES_MAP,
    POD_VETHS_MAP,
    RETRANSMITS_MAP,
    SDN_COMMS_MAP,
    PROCESS_EVENTS_MAP,
    UPCALL_INFLIGHT_MAP,
    UPCALL_CONFIG_MAP,
    UPCALL_SITE_MAP,
];

/// This build's pin directory.
pub(super) struct Pins {
    root: PathBuf,
    dir: PathBuf,
    /// This build's maps were pinned already: a previous agent ran, and its counters go on.
    pub(super) taken_over: bool,
}

impl Pins {
    /// Opens (creating it if needed) the pin directory of the kernel object `object` under
    /// `root`, which must be on a bpffs.
    pub(super) fn open(root: &Path, object: &[u8]) -> io::Result<Self> {
        if !is_bpffs(root.parent().unwrap_or(root)) && !is_bpffs(root) {
            return Err(io::Error::other(format!("{} is not on a bpffs", root.display())));
        }
        let dir = root.join(build_id(object));
        let taken_over = dir.join("maps").join(DROPS_MAP).exists();
        fs::create_dir_all(dir.join("maps"))?;
        fs::create_dir_all(dir.join("links"))?;
        Ok(Self { root: root.to_path_buf(), dir, taken_over })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn map_path(&self, name: &str) -> PathBuf {
        self.dir.join("maps").join(name)
    }

    fn link_path(&self, name: &str) -> PathBuf {
        self.dir.join("links").join(name)
    }

    pub(super) fn has_link(&self, name: &str) -> bool {
        self.link_path(name).exists()
    }

    /// The link a previous agent pinned as `name`, if there is one.
    pub(super) fn take_over(&self, name: &str) -> Option<FdLink> {
        let path = self.link_path(name);
        if !path.exists() {
            return None;
        }
        match PinnedLink::from_pin(&path) {
            Ok(pinned) => Some(FdLink::from(pinned)),
            Err(error) => {
                warn!(path = %path.display(), %error, "a pinned link cannot be opened; attaching afresh");
                self.unpin(name);
                None
            }
        }
    }

    /// Pins `link` as `name` and hands it back. On failure the link is gone (aya drops it):
    /// the caller attaches again, unpinned.
    pub(super) fn pin(&self, name: &str, link: FdLink) -> Result<FdLink, String> {
        let path = self.link_path(name);
        // A stale pin of that name (a link that went with its device) is replaced.
        self.unpin(name);
        link.pin(&path).map(FdLink::from).map_err(|error| {
            warn!(path = %path.display(), %error, "pinning a link failed: attaching it unpinned");
            error.to_string()
        })
    }

    /// Removes the pin `name` (its link detaches once no one holds it).
    pub(super) fn unpin(&self, name: &str) {
        let path = self.link_path(name);
        match fs::remove_file(&path) {
            Ok(()) => debug!(path = %path.display(), "unpinned"),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => warn!(path = %path.display(), %error, "removing a pinned link"),
        }
    }

    /// The names of this build's pinned links.
    pub(super) fn links(&self) -> Vec<String> {
        fs::read_dir(self.dir.join("links"))
            .map(|entries| entries.filter_map(Result::ok).filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    }

    /// Removes the pins of other builds (their programs detach, their maps go): called once
    /// this build's programs run, so that the node is never without one.
    pub(super) fn remove_other_builds(&self) {
        let Ok(entries) = fs::read_dir(&self.root) else { return };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path != self.dir && path.is_dir() {
                match fs::remove_dir_all(&path) {
                    Ok(()) => info!(path = %path.display(), "removed the pins of another build of the agent"),
                    Err(error) => warn!(path = %path.display(), %error, "removing another build's pins"),
                }
            }
        }
    }
}

/// What the agent keeps for the next one: the pin directory, and the links it holds itself
/// (taken over or pinned by it) while it runs.
pub(super) struct Keeper {
    pub(super) pins: Pins,
    held: Vec<FdLink>,
}

impl Keeper {
    pub(super) fn new(pins: Pins) -> Self {
        Self { pins, held: Vec::new() }
    }

    /// Takes over the link a previous agent pinned as `name`; false when there is none.
    pub(super) fn adopt(&mut self, name: &str) -> bool {
        match self.pins.take_over(name) {
            Some(link) => {
                info!(link = name, "took over the previous agent's link: it never stopped");
                self.held.push(link);
                true
            }
            None => false,
        }
    }

    /// Pins `link` as `name` and holds it; false when pinning failed (the link is gone then).
    pub(super) fn keep(&mut self, name: &str, link: FdLink) -> bool {
        match self.pins.pin(name, link) {
            Ok(link) => {
                self.held.push(link);
                true
            }
            Err(_) => false,
        }
    }
}

/// `datapath-monitor detach`: removes every pin under `root` (tcx links and tracers detach,
/// maps are freed) and the agent's clsact filters on every interface of this network
/// namespace. Returns what it removed, for the operator.
pub fn detach_everything(root: &Path) -> io::Result<String> {
    let builds = remove_all(root)?;
    let mut filters = 0;
    for entry in fs::read_dir("/sys/class/net")? {
        let Ok(interface) = entry?.file_name().into_string() else { continue };
        for (program, attach_type) in [
            (monitor_common::TC_INGRESS_PROGRAM, aya::programs::TcAttachType::Ingress),
            (monitor_common::TC_EGRESS_PROGRAM, aya::programs::TcAttachType::Egress),
        ] {
            if aya::programs::tc::qdisc_detach_program(&interface, attach_type, program).is_ok() {
                filters += 1;
            }
        }
    }
    Ok(format!(
        "removed the pins of {builds} build(s) under {} and the agent's clsact filters on {filters} hook(s)",
        root.display()
    ))
}

/// Removes every pin under `root` (all builds) and `root` itself.
fn remove_all(root: &Path) -> io::Result<usize> {
    let mut removed = 0;
    match fs::read_dir(root) {
        Ok(entries) => {
            for entry in entries {
                fs::remove_dir_all(entry?.path())?;
                removed += 1;
            }
            fs::remove_dir(root)?;
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    Ok(removed)
}

/// Whether `path` is on a bpffs (statfs magic BPF_FS_MAGIC).
fn is_bpffs(path: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a NUL-terminated path, stat a statfs the call fills.
    unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) == 0 && stat.f_type as i64 == BPF_FS_MAGIC }
}

/// FNV-1a of the kernel object, in hex: stable across runs and Rust versions.
fn build_id(object: &[u8]) -> String {
    let hash = object
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_id_is_the_objects_fnv1a() {
        // FNV-1a test vectors.
        assert_eq!(build_id(b""), "cbf29ce484222325");
        assert_eq!(build_id(b"a"), "af63dc4c8601ec8c");
        assert_ne!(build_id(b"object one"), build_id(b"object two"));
    }

    #[test]
    fn a_pin_dir_off_bpffs_is_a_clear_error() {
        let root = std::env::temp_dir().join(format!("dm-pins-{}", std::process::id()));
        let error = Pins::open(&root, b"object").err().expect("not a bpffs");
        assert!(error.to_string().contains("is not on a bpffs"), "{error}");
        assert!(!root.exists(), "nothing created off bpffs");
    }
}
