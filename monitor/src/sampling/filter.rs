//! Which links are watched: pod veths and the include globs, minus the exclude globs.

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::{InterfaceError, LinkFacts};

/// Decides which links are watched: pod veths and include globs, minus exclude globs.
#[derive(Clone, Debug)]
pub struct InterfaceFilter {
    include: GlobSet,
    exclude: GlobSet,
}

impl InterfaceFilter {
    /// Default include globs: veth*, br0, tun0, vxlan_sys_*, genev_sys_*, br-int, br-ex, ovn-k8s-mp*.
    pub const DEFAULT_INCLUDE: &'static [&'static str] =
        &["veth*", "br0", "tun0", "vxlan_sys_*", "genev_sys_*", "br-int", "br-ex", "ovn-k8s-mp*"];

    /// `include` is used as given: an empty list watches pod veths only.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, InterfaceError> {
        Ok(Self { include: glob_set(include)?, exclude: glob_set(exclude)? })
    }

    /// Watched = (host-side veth whose peer is in another netns) OR name matches an include
    /// glob; AND name matches no exclude glob.
    pub fn watches(&self, link: &LinkFacts) -> bool {
        (link.is_pod_veth() || self.include.is_match(&link.name)) && !self.exclude.is_match(&link.name)
    }
}

fn glob_set(globs: &[String]) -> Result<GlobSet, InterfaceError> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        let parsed = Glob::new(glob).map_err(|source| InterfaceError::Glob { glob: glob.clone(), source })?;
        builder.add(parsed);
    }
    builder.build().map_err(InterfaceError::GlobSet)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{
        PeerLink,
        links::fixtures::{filter, link, veth},
    };

    fn defaults() -> Vec<String> {
        InterfaceFilter::DEFAULT_INCLUDE.iter().map(|glob| glob.to_string()).collect()
    }

    #[test]
    fn default_globs_watch_sdn_devices_and_nothing_else() {
        let filter = InterfaceFilter::new(&defaults(), &[]).expect("defaults are valid");
        for name in
            ["veth1a2b3c4d", "br0", "tun0", "vxlan_sys_4789", "genev_sys_6081", "br-int", "br-ex", "ovn-k8s-mp0"]
        {
            assert!(filter.watches(&link(1, name)), "{name} should be watched");
        }
        for name in ["lo", "eth0", "ens3", "br-test", "br00", "tun1", "docker0", "xveth0"] {
            assert!(!filter.watches(&link(1, name)), "{name} should not be watched");
        }
    }

    #[test]
    fn exclude_wins_over_include_and_over_the_pod_veth_rule() {
        let filter = filter(&["veth*"], &["veth9*", "0123*"]);
        assert!(filter.watches(&link(1, "veth1234")));
        assert!(!filter.watches(&link(1, "veth9abc")));
        assert!(!filter.watches(&veth(1, "0123456789abcde", Some(3))), "exclude beats the pod-veth rule");
    }

    #[test]
    fn a_veth_is_watched_by_name_only_when_its_peer_is_local() {
        let filter = filter(&[], &[]);
        // OVN-Kubernetes names pod veths after the container ID: no include glob matches.
        assert!(filter.watches(&veth(7, "0123456789abcde", Some(3))));
        assert!(!filter.watches(&veth(7, "0123456789abcde", None)), "both ends in this netns");
        let tunnel = LinkFacts {
            kind: Some("vxlan".to_string()),
            peer: Some(PeerLink { ifindex: 2, netnsid: Some(3), netns_inode: None }),
            ..link(7, "0123456789abcde")
        };
        assert!(!filter.watches(&tunnel), "only veths have pod peers");
    }

    #[test]
    fn a_bad_glob_is_named_in_the_error() {
        for (include, exclude) in [(&["veth["][..], &[][..]), (&["veth*"][..], &["br-[x"][..])] {
            let owned = |globs: &[&str]| globs.iter().map(|glob| glob.to_string()).collect::<Vec<_>>();
            let error = InterfaceFilter::new(&owned(include), &owned(exclude)).expect_err("invalid glob");
            let bad = include.iter().chain(exclude).find(|glob| glob.contains('[')).copied().unwrap_or_default();
            assert!(matches!(&error, InterfaceError::Glob { glob, .. } if glob == bad), "{error:?}");
            assert!(error.to_string().contains(bad), "{error}");
        }
    }
}
