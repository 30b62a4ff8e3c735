//! End-to-end tests a kernel cannot run, and why: the runner excludes them by name and says
//! so, where the kernel lacks what they need. A test never skips itself quietly: under
//! `CI=true` one that finds its kernel feature missing fails (`not_applicable` in the test
//! library), so a test this table does not name cannot pass by doing nothing.

use std::{fs, path::Path, process::Command};

/// A kernel feature some end-to-end tests need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// OVS's kernel datapath, openvswitch.ko (the test VMs' kernels have it, this host's not).
    OpenvswitchModule,
    /// tcx links (Linux 6.6 and later).
    Tcx,
}

impl Feature {
    fn why(self) -> &'static str {
        match self {
            Self::OpenvswitchModule => "no openvswitch.ko on this kernel (the test VMs run it)",
            Self::Tcx => "no tcx before Linux 6.6",
        }
    }
}

/// (test target, test name, what it needs).
const NEEDS: &[(&str, &str, Feature)] = &[
    ("ovs_kernel", "failed_upcalls_are_counted_named_and_match_the_datapaths_lost_counter", Feature::OpenvswitchModule),
    ("ovs_kernel", "upcalls_lost_on_a_full_queue_are_counted_from_the_datapaths_counter", Feature::OpenvswitchModule),
    ("ovs_kernel", "broadcasts_the_flows_drop_are_not_counted_as_unforwarded", Feature::OpenvswitchModule),
    ("continuity", "a_restart_onto_the_other_attach_mode_counts_each_packet_once", Feature::Tcx),
];

/// What one kernel has of the [`Feature`]s.
#[derive(Clone, Copy, Debug)]
pub struct KernelFeatures {
    openvswitch_module: bool,
    tcx: bool,
}

impl KernelFeatures {
    /// A kernel of `release` (e.g. `6.1.0-57-cloud-amd64`), with or without openvswitch.ko.
    pub fn of_release(release: &str, openvswitch_module: bool) -> Self {
        let mut numbers = release.trim().split(['.', '-', '+']).map(|part| part.parse::<u32>().ok());
        let version = (numbers.next().flatten().unwrap_or(0), numbers.next().flatten().unwrap_or(0));
        Self { openvswitch_module, tcx: version >= (6, 6) }
    }

    /// The kernel this process runs on.
    pub fn of_this_host() -> Self {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let module = Path::new("/sys/module/openvswitch").exists()
            || Command::new("modprobe")
                .args(["--dry-run", "--quiet", "openvswitch"])
                .status()
                .is_ok_and(|s| s.success());
        Self::of_release(&release, module)
    }

    fn has(self, feature: Feature) -> bool {
        match feature {
            Feature::OpenvswitchModule => self.openvswitch_module,
            Feature::Tcx => self.tcx,
        }
    }

    /// The tests of `target` this kernel cannot run: (name, why).
    pub fn excluded(self, target: &str) -> Vec<(&'static str, &'static str)> {
        NEEDS
            .iter()
            .filter(|(of, _, feature)| *of == target && !self.has(*feature))
            .map(|(_, name, feature)| (*name, feature.why()))
            .collect()
    }
}

/// The test targets the table names.
#[cfg(test)]
pub fn targets() -> impl Iterator<Item = &'static str> {
    NEEDS.iter().map(|(target, _, _)| *target)
}

/// The [`NEEDS`] entries of `target` that are not among `listed` (the target's tests): a
/// renamed test the table would no longer exclude.
pub fn unknown_names(target: &str, listed: &[String]) -> Vec<&'static str> {
    NEEDS
        .iter()
        .filter(|(of, name, _)| *of == target && !listed.iter().any(|test| test == name))
        .map(|(_, name, _)| *name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_a_feature_excludes_the_tests_that_need_it() {
        let old = KernelFeatures::of_release("6.1.0-57-cloud-amd64", true);
        assert_eq!(
            old.excluded("continuity"),
            [("a_restart_onto_the_other_attach_mode_counts_each_packet_once", "no tcx before Linux 6.6")]
        );
        assert!(old.excluded("ovs_kernel").is_empty());
        let host = KernelFeatures::of_release("6.18.44-fc-v1300\n", false);
        assert!(host.excluded("continuity").is_empty());
        assert_eq!(host.excluded("ovs_kernel").len(), 3);
        assert!(KernelFeatures::of_release("6.12.118+deb12-cloud-amd64", true).excluded("continuity").is_empty());
    }

    #[test]
    fn names_the_table_has_but_the_target_lists_not_are_reported() {
        let listed = vec!["a_restart_onto_the_other_attach_mode_counts_each_packet_once".to_owned()];
        assert!(unknown_names("continuity", &listed).is_empty());
        assert_eq!(unknown_names("ovs_kernel", &listed).len(), 3);
        assert!(unknown_names("datapath", &listed).is_empty());
    }
}
