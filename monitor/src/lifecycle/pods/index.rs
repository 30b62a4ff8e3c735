//! Every cache entry of one cache dir, indexed by what the interface watch knows about a pod
//! veth: its host-side name and its peer's network namespace inode.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsStr,
    hash::Hash,
    io,
    os::unix::fs::MetadataExt,
    path::Path,
    time::SystemTime,
};

use serde::Serialize;
use tracing::{debug, warn};

use super::cache_entry::{CacheEntry, PodCacheError, parse_cache_entry, read_bounded};
use crate::{errors, sampling::OwnNetns};

/// The pod behind a host interface, as the cache describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodInfo {
    /// K8S_POD_NAMESPACE.
    pub namespace: String,
    /// K8S_POD_NAME.
    pub name: String,
    /// The pod sandbox (infra container) ID.
    pub container_id: String,
    /// The CNI network name of this attachment.
    pub network: String,
    /// The attachment's addresses with prefix length, e.g. "10.129.0.43/23".
    pub ips: Vec<String>,
    /// The first sandbox (netns) path of the entry.
    pub sandbox: Option<String>,
    /// The cache file's name in the cache dir.
    pub cache_file: String,
}

/// What [`PodIndex::read_file`] did with a file.
#[derive(Debug)]
pub enum FileOutcome {
    /// Parsed and indexed; the pod is None when the entry names no pod.
    Indexed { pod: Option<PodInfo> },
    /// The file does not exist (any more): its entry, if any, was removed.
    Gone,
    /// Could not be read or parsed: counted in [`PodIndex::skipped`], its old entry removed.
    Skipped(PodCacheError),
}

/// A sandbox path and the netns it named when the entry was indexed.
#[derive(Clone, Debug)]
struct Sandbox {
    path: String,
    dev: u64,
    ino: u64,
}

#[derive(Debug)]
struct Indexed {
    entry: CacheEntry,
    pod: Option<PodInfo>,
    /// Upsert order: the newest entry wins a contested interface.
    seq: u64,
    sandboxes: Vec<Sandbox>,
}

impl Indexed {
    fn pod_key(&self) -> Option<(&str, &str)> {
        self.pod.as_ref().map(|pod| (pod.namespace.as_str(), pod.name.as_str()))
    }

    fn has_netns(&self, inode: u64) -> bool {
        self.sandboxes.iter().any(|sandbox| sandbox.ino == inode)
    }

    /// Whether a sandbox path still names netns `inode` (any netns when None).
    fn names_netns_now(&self, inode: Option<u64>) -> bool {
        self.sandboxes.iter().filter(|sandbox| inode.is_none_or(|inode| sandbox.ino == inode)).any(|sandbox| {
            std::fs::metadata(&sandbox.path)
                .is_ok_and(|metadata| metadata.dev() == sandbox.dev && metadata.ino() == sandbox.ino)
        })
    }
}

/// Every cache entry of one cache dir, by file name, indexed by host interface name and by
/// sandbox netns inode.
#[derive(Debug)]
pub struct PodIndex {
    entries: HashMap<String, Indexed>,
    by_interface: HashMap<String, HashSet<String>>,
    by_netns: HashMap<u64, HashSet<String>>,
    seq: u64,
    skipped: u64,
    /// The nsfs device: a sandbox path on another device (a stale `/run/netns` file whose
    /// bind mount is gone) names no netns. None: unknown, any device is accepted.
    netns_dev: Option<u64>,
}

impl Default for PodIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl PodIndex {
    /// An empty index. Sandbox paths are resolved in the calling process's mount namespace.
    pub fn new() -> Self {
        let netns_dev = match OwnNetns::of_this_thread() {
            Ok(own) => Some(own.nsfs_dev),
            Err(error) => {
                warn!(error = %errors::chain(&error), "cannot find the nsfs device; sandbox paths are not checked for it");
                None
            }
        };
        Self {
            entries: HashMap::new(),
            by_interface: HashMap::new(),
            by_netns: HashMap::new(),
            seq: 0,
            skipped: 0,
            netns_dev,
        }
    }

    /// Adds or replaces the entry of cache file `file` (a name in the cache dir). Its sandbox
    /// paths are stat'ed now; one that does not name a netns is kept out of the inode index.
    pub fn upsert(&mut self, file: &str, entry: CacheEntry) {
        self.remove(file);
        self.seq += 1;
        let mut sandboxes = Vec::new();
        for path in &entry.sandboxes {
            match std::fs::metadata(path) {
                Ok(metadata) if self.netns_dev.is_none_or(|dev| dev == metadata.dev()) => {
                    sandboxes.push(Sandbox { path: path.clone(), dev: metadata.dev(), ino: metadata.ino() });
                }
                Ok(_) => debug!(file, path, "sandbox path is not a network namespace"),
                Err(error) => debug!(file, path, %error, "sandbox path unavailable"),
            }
        }
        for interface in &entry.host_interfaces {
            let claimants = self.by_interface.entry(interface.clone()).or_default();
            if !claimants.is_empty() {
                debug!(file, interface, others = ?claimants, "host interface listed by more than one cache entry; the newest wins");
            }
            claimants.insert(file.to_string());
        }
        for sandbox in &sandboxes {
            self.by_netns.entry(sandbox.ino).or_default().insert(file.to_string());
        }
        let pod = entry.pod.as_ref().map(|(namespace, name)| PodInfo {
            namespace: namespace.clone(),
            name: name.clone(),
            container_id: entry.container_id.clone(),
            network: entry.network.clone(),
            ips: entry.ips.clone(),
            sandbox: entry.sandboxes.first().cloned(),
            cache_file: file.to_string(),
        });
        self.entries.insert(file.to_string(), Indexed { entry, pod, seq: self.seq, sandboxes });
    }

    /// Forgets the entry of cache file `file`, if any.
    pub fn remove(&mut self, file: &str) {
        let Some(old) = self.entries.remove(file) else {
            return;
        };
        for interface in &old.entry.host_interfaces {
            unindex(&mut self.by_interface, interface, file);
        }
        for sandbox in &old.sandboxes {
            unindex(&mut self.by_netns, &sandbox.ino, file);
        }
    }

    /// Reads cache file `name` in `dir` and indexes it; removes its entry if the file is
    /// gone. A file that cannot be read or parsed (too large, not a regular file, not a
    /// cniCacheV1 entry, ...) is logged, counted in [`Self::skipped`] and its old entry
    /// removed: a file being rewritten is read again on its next close.
    pub fn read_file(&mut self, dir: &Path, name: &OsStr) -> FileOutcome {
        let Some(file) = name.to_str() else {
            return self.skip(&dir.join(name), &name.to_string_lossy(), PodCacheError::NonUtf8Name);
        };
        let path = dir.join(name);
        match read_bounded(&path) {
            Ok(bytes) => match parse_cache_entry(&bytes) {
                Ok(entry) => {
                    self.upsert(file, entry);
                    FileOutcome::Indexed { pod: self.entries.get(file).and_then(|indexed| indexed.pod.clone()) }
                }
                Err(error) => self.skip(&path, file, error),
            },
            Err(PodCacheError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                self.remove(file);
                FileOutcome::Gone
            }
            Err(error) => self.skip(&path, file, error),
        }
    }

    fn skip(&mut self, path: &Path, file: &str, error: PodCacheError) -> FileOutcome {
        self.skipped += 1;
        let reason = errors::chain(&error);
        warn!(path = %path.display(), %reason, "skipping CNI cache file");
        self.remove(file);
        FileOutcome::Skipped(error)
    }

    /// Reads the whole cache dir, oldest file first (so the newest entry wins a contested
    /// interface, as it would have live), and forgets entries whose file is gone. A missing
    /// dir empties the index; an unreadable one leaves it as it was.
    pub fn rescan(&mut self, dir: &Path) {
        let listing = match std::fs::read_dir(dir) {
            Ok(listing) => listing,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                debug!(dir = %dir.display(), "CNI cache dir does not exist: no pods known");
                self.clear();
                return;
            }
            Err(error) => {
                warn!(dir = %dir.display(), %error, "cannot list the CNI cache dir; pod index unchanged");
                return;
            }
        };
        let mut names = Vec::new();
        for item in listing {
            match item {
                Ok(item) => {
                    // The entry itself (symlinks not followed); read_file rejects non-files.
                    let modified = item.metadata().and_then(|metadata| metadata.modified()).ok();
                    names.push((modified.unwrap_or(SystemTime::UNIX_EPOCH), item.file_name()));
                }
                Err(error) => warn!(dir = %dir.display(), %error, "error while listing the CNI cache dir"),
            }
        }
        names.sort();
        let present: HashSet<String> = names.iter().filter_map(|(_, name)| name.to_str()).map(str::to_string).collect();
        let gone: Vec<String> = self.entries.keys().filter(|file| !present.contains(*file)).cloned().collect();
        for file in gone {
            self.remove(&file);
        }
        for (_, name) in names {
            self.read_file(dir, &name);
        }
        debug!(dir = %dir.display(), entries = self.entries.len(), skipped = self.skipped, "rescanned the CNI cache dir");
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.by_interface.clear();
        self.by_netns.clear();
    }

    /// The pod behind a watched host interface (call it for pod veths): by the host-side
    /// interface name in a result, else by the sandbox netns, whose inode must equal the pod
    /// veth's peer netns inode (and the sandbox path must still name that netns).
    ///
    /// A name match is dropped when the entry's sandbox is known to be another netns than
    /// `peer_netns_inode`. Of several entries the newest wins, but an interface that entries
    /// of different pods list while both their sandboxes are alive is a shared device (a
    /// bridge) and gives no pod. An entry that names no pod gives no pod, even when an older
    /// entry named one.
    pub fn lookup(&self, host_interface: &str, peer_netns_inode: Option<u64>) -> Option<&PodInfo> {
        let mut by_name: Vec<&Indexed> = self
            .claimants(self.by_interface.get(host_interface))
            .filter(|indexed| match peer_netns_inode {
                Some(inode) => indexed.sandboxes.is_empty() || indexed.has_netns(inode),
                None => true,
            })
            .collect();
        if !by_name.is_empty() {
            by_name.sort_by_key(|indexed| std::cmp::Reverse(indexed.seq));
            let newest = by_name[0];
            if by_name.len() > 1 {
                let shared = newest.pod.is_some()
                    && by_name[1..]
                        .iter()
                        .any(|other| other.pod_key() != newest.pod_key() && other.names_netns_now(None))
                    && newest.names_netns_now(None);
                if shared {
                    debug!(
                        interface = host_interface,
                        "interface listed by live entries of different pods: shared device, no pod"
                    );
                    return None;
                }
                debug!(
                    interface = host_interface,
                    file = newest.pod.as_ref().map(|pod| pod.cache_file.as_str()),
                    "several cache entries list this interface; using the newest"
                );
            }
            return newest.pod.as_ref();
        }
        let inode = peer_netns_inode?;
        let live = self.claimants(self.by_netns.get(&inode)).filter(|indexed| indexed.names_netns_now(Some(inode)));
        // An entry that names its host veth, and not this one, describes another attachment
        // of the pod: it speaks for this interface only if no entry leaves the host side open
        // and all agree on the pod.
        let (open, naming_others): (Vec<&Indexed>, Vec<&Indexed>) =
            live.partition(|indexed| indexed.entry.host_interfaces.is_empty());
        let only_naming_others = open.is_empty();
        let candidates = if only_naming_others { naming_others } else { open };
        let newest = candidates.iter().max_by_key(|indexed| indexed.seq)?;
        if candidates.iter().any(|other| other.pod_key() != newest.pod_key()) {
            if only_naming_others {
                debug!(
                    interface = host_interface,
                    inode, "netns of entries of different pods that name other veths: no pod"
                );
                return None;
            }
            debug!(interface = host_interface, inode, "netns claimed by entries of different pods; using the newest");
        }
        newest.pod.as_ref()
    }

    fn claimants<'a>(&'a self, files: Option<&'a HashSet<String>>) -> impl Iterator<Item = &'a Indexed> {
        files.into_iter().flatten().filter_map(|file| self.entries.get(file))
    }

    /// The entry of cache file `file`.
    pub fn entry(&self, file: &str) -> Option<&CacheEntry> {
        self.entries.get(file).map(|indexed| &indexed.entry)
    }

    /// Number of indexed cache files (with or without a pod).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no cache file is indexed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many times a file could not be read or parsed (each read counts).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

fn unindex<K: Hash + Eq>(index: &mut HashMap<K, HashSet<String>>, key: &K, file: &str) {
    if let Some(files) = index.get_mut(key) {
        files.remove(file);
        if files.is_empty() {
            index.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;
    use crate::lifecycle::pods::cache_entry::{
        MAX_CACHE_FILE_BYTES,
        fixtures::{V031, V040, pod, strings},
    };

    use crate::test_support::TempDir;

    trait WriteFile {
        fn write(&self, name: &str, contents: &str) -> String;
    }

    impl WriteFile for TempDir {
        fn write(&self, name: &str, contents: &str) -> String {
            let path = self.0.join(name);
            std::fs::write(&path, contents).expect("write temp file");
            path.to_string_lossy().into_owned()
        }
    }

    /// An index that accepts any file as a netns stand-in (its inode plays the netns inode).
    fn index() -> PodIndex {
        PodIndex { netns_dev: None, ..PodIndex::new() }
    }

    fn inode(path: &str) -> u64 {
        std::fs::metadata(path).expect("stat").ino()
    }

    fn cache_entry(namespace_name: Option<(&str, &str)>, host: &[&str], sandboxes: &[&str]) -> CacheEntry {
        CacheEntry {
            pod: namespace_name.map(|(namespace, name)| (namespace.to_string(), name.to_string())),
            pod_uid: None,
            container_id: "c1".into(),
            network: "net".into(),
            if_name: "eth0".into(),
            cni_version: Some("1.0.0".into()),
            host_interfaces: strings(host),
            sandboxes: strings(sandboxes),
            ips: strings(&["10.0.0.2/24"]),
        }
    }

    fn looked_up(index: &PodIndex, interface: &str, peer: Option<u64>) -> Option<(String, String)> {
        index.lookup(interface, peer).map(|pod| (pod.namespace.clone(), pod.name.clone()))
    }

    #[test]
    fn lookup_by_host_interface_name() {
        let mut index = index();
        index.upsert("ovn-c1-eth0", parse_cache_entry(V040.as_bytes()).expect("0.4.0"));
        let found = index.lookup("0123456789abcde", None).expect("by name");
        assert_eq!(
            found,
            &PodInfo {
                namespace: "default".into(),
                name: "web-1".into(),
                container_id: "0123456789abcdef".into(),
                network: "ovn-kubernetes".into(),
                ips: strings(&["10.128.0.5/23", "fd01:0:0:1::5/64"]),
                sandbox: Some("/var/run/netns/a1b2".into()),
                cache_file: "ovn-c1-eth0".into(),
            }
        );
        assert_eq!(
            looked_up(&index, "0123456789abcde", Some(4026532000)),
            pod("default", "web-1"),
            "sandbox unknown here"
        );
        assert_eq!(index.lookup("eth0", None), None, "the container side is not a host interface");
        assert_eq!(index.lookup("0123456789abcd", None), None, "no prefix matches");
        assert_eq!(index.lookup("veth0", Some(1)), None);

        index.remove("ovn-c1-eth0");
        assert_eq!(index.lookup("0123456789abcde", None), None);
        assert!(index.is_empty());
        index.remove("ovn-c1-eth0");
    }

    #[test]
    fn lookup_by_sandbox_netns_inode() {
        let dir = TempDir::new("pods");
        let (netns_a, netns_b) = (dir.write("netns-a", ""), dir.write("netns-b", ""));
        let mut index = index();
        index.upsert("sdn-a", cache_entry(Some(("ns", "a")), &[], &[&netns_a]));
        index.upsert("sdn-b", cache_entry(Some(("ns", "b")), &[], &["/nonexistent/netns", &netns_b]));
        assert_eq!(looked_up(&index, "veth1", Some(inode(&netns_a))), pod("ns", "a"));
        assert_eq!(looked_up(&index, "veth2", Some(inode(&netns_b))), pod("ns", "b"));
        assert_eq!(
            index.lookup("veth2", Some(inode(&netns_b))).and_then(|pod| pod.sandbox.as_deref()),
            Some("/nonexistent/netns")
        );
        assert_eq!(index.lookup("veth1", None), None, "no peer netns, no name: unknown");
        assert_eq!(index.lookup("veth1", Some(inode(&netns_a) + 1_000_000)), None);

        // The sandbox path disappears (netns deleted): it no longer matches, even by inode.
        let inode_a = inode(&netns_a);
        std::fs::remove_file(&netns_a).expect("remove");
        assert_eq!(index.lookup("veth1", Some(inode_a)), None);
        // A new file at the same path is another netns (another inode): still no match.
        std::fs::write(&netns_a, "").expect("recreate");
        if inode(&netns_a) != inode_a {
            assert_eq!(index.lookup("veth1", Some(inode(&netns_a))), None, "inode cached at upsert");
        }
        index.upsert("sdn-a", cache_entry(Some(("ns", "a2")), &[], &[&netns_a]));
        assert_eq!(looked_up(&index, "veth1", Some(inode(&netns_a))), pod("ns", "a2"));
    }

    #[test]
    fn a_sandbox_outside_nsfs_is_no_netns() {
        let dir = TempDir::new("pods");
        let netns = dir.write("netns", "");
        let dev = std::fs::metadata(&netns).expect("stat").dev();
        let mut index = PodIndex { netns_dev: Some(dev + 1), ..PodIndex::new() };
        index.upsert("f", cache_entry(Some(("ns", "p")), &[], &[&netns]));
        assert_eq!(index.lookup("veth1", Some(inode(&netns))), None);
        index.netns_dev = Some(dev);
        index.upsert("f", cache_entry(Some(("ns", "p")), &[], &[&netns]));
        assert_eq!(looked_up(&index, "veth1", Some(inode(&netns))), pod("ns", "p"));
    }

    #[test]
    fn replacement_and_contested_interfaces() {
        let dir = TempDir::new("pods");
        let (netns_a, netns_b) = (dir.write("netns-a", ""), dir.write("netns-b", ""));
        let mut index = index();

        // Replacing a file's entry re-indexes it: the old interface no longer matches.
        index.upsert("f1", cache_entry(Some(("ns", "a")), &["vethaaaa0001"], &[]));
        index.upsert("f1", cache_entry(Some(("ns", "b")), &["vethbbbb0002"], &[]));
        assert_eq!(index.lookup("vethaaaa0001", None), None);
        assert_eq!(looked_up(&index, "vethbbbb0002", None), pod("ns", "b"));
        assert_eq!(index.len(), 1);

        // Two files list the same veth: the newest upsert wins, the other takes over on removal.
        index.upsert("f2", cache_entry(Some(("ns", "c")), &["vethbbbb0002"], &[]));
        assert_eq!(looked_up(&index, "vethbbbb0002", None), pod("ns", "c"));
        index.upsert("f1", cache_entry(Some(("ns", "b")), &["vethbbbb0002"], &[]));
        assert_eq!(looked_up(&index, "vethbbbb0002", None), pod("ns", "b"));
        index.remove("f1");
        assert_eq!(looked_up(&index, "vethbbbb0002", None), pod("ns", "c"));

        // The newest entry names no pod: unknown, not the older pod.
        index.upsert("f3", cache_entry(None, &["vethbbbb0002"], &[]));
        assert_eq!(index.lookup("vethbbbb0002", None), None);
        index.remove("f3");

        // A name match whose sandbox is another netns than the veth's peer is not this veth.
        index.upsert("f4", cache_entry(Some(("ns", "d")), &["vethdddd0004"], &[&netns_a]));
        index.upsert("f5", cache_entry(Some(("ns", "e")), &[], &[&netns_b]));
        assert_eq!(looked_up(&index, "vethdddd0004", Some(inode(&netns_a))), pod("ns", "d"));
        assert_eq!(looked_up(&index, "vethdddd0004", Some(inode(&netns_b))), pod("ns", "e"), "by inode instead");
        assert_eq!(index.lookup("vethdddd0004", Some(inode(&netns_b) + 1_000_000)), None);
    }

    #[test]
    fn a_bridge_listed_by_live_pods_is_no_pod() {
        let dir = TempDir::new("pods");
        let (netns_a, netns_b) = (dir.write("netns-a", ""), dir.write("netns-b", ""));
        let mut index = index();
        index.upsert("mynet-a-eth0", cache_entry(Some(("ns", "a")), &["cni0", "veth000a"], &[&netns_a]));
        assert_eq!(looked_up(&index, "veth000a", Some(inode(&netns_a))), pod("ns", "a"));
        index.upsert("mynet-b-eth0", cache_entry(Some(("ns", "b")), &["cni0", "veth000b"], &[&netns_b]));
        assert_eq!(index.lookup("cni0", None), None, "shared by two live pods");
        assert_eq!(looked_up(&index, "veth000a", Some(inode(&netns_a))), pod("ns", "a"));
        assert_eq!(looked_up(&index, "veth000b", Some(inode(&netns_b))), pod("ns", "b"));
        // Pod a's netns is gone (its entry is stale): the newest live claimant wins again.
        std::fs::remove_file(&netns_a).expect("remove");
        assert_eq!(looked_up(&index, "cni0", None), pod("ns", "b"));
    }

    #[test]
    fn several_attachments_of_one_pod_netns() {
        let dir = TempDir::new("pods");
        let netns = dir.write("netns", "");
        let mut index = index();
        let mut default = cache_entry(Some(("ns", "p")), &["vethdef00001"], &[&netns]);
        default.network = "default".into();
        let mut extra = cache_entry(Some(("ns", "p")), &[], &[&netns]);
        extra.network = "extra".into();
        index.upsert("default-c1-eth0", default);
        index.upsert("extra-c1-net1", extra);
        let network =
            |index: &PodIndex, interface| index.lookup(interface, Some(inode(&netns))).map(|pod| pod.network.clone());
        assert_eq!(network(&index, "vethdef00001").as_deref(), Some("default"), "by name first");
        assert_eq!(
            network(&index, "vethother002").as_deref(),
            Some("extra"),
            "the entry that does not name another veth"
        );
        index.remove("extra-c1-net1");
        assert_eq!(
            network(&index, "vethother002").as_deref(),
            Some("default"),
            "same pod, the only entry for the netns"
        );

        // Entries of different pods claim the netns and each names another veth: unknown.
        let mut stale = cache_entry(Some(("ns", "old")), &["vethold00003"], &[&netns]);
        stale.network = "default".into();
        index.upsert("default-c0-eth0", stale);
        assert_eq!(index.lookup("vethother002", Some(inode(&netns))), None);
    }

    fn read(index: &mut PodIndex, dir: &TempDir, name: &str) -> FileOutcome {
        index.read_file(&dir.0, OsStr::new(name))
    }

    #[test]
    fn read_file_indexes_skips_and_forgets() {
        let dir = TempDir::new("pods");
        let mut index = index();
        dir.write("openshift-sdn-3f2a01-eth0", V031);
        match read(&mut index, &dir, "openshift-sdn-3f2a01-eth0") {
            FileOutcome::Indexed { pod: Some(pod) } => {
                assert_eq!(
                    (pod.name.as_str(), pod.cache_file.as_str()),
                    ("apiserver-zg25k", "openshift-sdn-3f2a01-eth0")
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(index.entry("openshift-sdn-3f2a01-eth0").map(|entry| entry.network.as_str()), Some("openshift-sdn"));

        // Rewritten in place and caught half-written: skipped, and the old entry is dropped.
        dir.write("openshift-sdn-3f2a01-eth0", &V031[..40]);
        assert!(matches!(
            read(&mut index, &dir, "openshift-sdn-3f2a01-eth0"),
            FileOutcome::Skipped(PodCacheError::Json(_))
        ));
        assert!(index.is_empty());
        assert_eq!(index.skipped(), 1);

        dir.write("openshift-sdn-3f2a01-eth0", V031);
        assert!(matches!(read(&mut index, &dir, "openshift-sdn-3f2a01-eth0"), FileOutcome::Indexed { pod: Some(_) }));
        std::fs::remove_file(dir.0.join("openshift-sdn-3f2a01-eth0")).expect("remove");
        assert!(matches!(read(&mut index, &dir, "openshift-sdn-3f2a01-eth0"), FileOutcome::Gone));
        assert!(index.is_empty());
        assert_eq!(index.skipped(), 1, "a vanished file is not a skip");

        dir.write("nopod", r#"{"kind":"cniCacheV1","containerId":"c","ifName":"eth0","networkName":"n"}"#);
        assert!(matches!(read(&mut index, &dir, "nopod"), FileOutcome::Indexed { pod: None }));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn rescan_reads_good_files_and_counts_the_rest() {
        let dir = TempDir::new("pods");
        dir.write("openshift-sdn-3f2a01-eth0", V031);
        dir.write("ovn-kubernetes-0123456789abcdef-eth0", V040);
        dir.write("broken-c9-eth0", r#"{"kind":"cniCacheV1","containerId":"c9","#);
        dir.write(".openshift-sdn-3f2a01-eth0.swp", "b0VIM 9.0\0\0\0garbage");
        dir.write("legacy-c8-eth0", r#"{"cniVersion":"0.3.1","ips":[]}"#);
        std::fs::write(dir.0.join("huge"), vec![b' '; MAX_CACHE_FILE_BYTES as usize + 1]).expect("write");
        std::fs::create_dir(dir.0.join("subdir")).expect("mkdir");
        nix::unistd::mkfifo(&dir.0.join("fifo"), nix::sys::stat::Mode::S_IRUSR).expect("mkfifo");
        std::os::unix::fs::symlink(dir.0.join("openshift-sdn-3f2a01-eth0"), dir.0.join("link")).expect("symlink");

        let mut index = index();
        index.rescan(&dir.0);
        assert_eq!(index.len(), 2);
        assert_eq!(index.skipped(), 7, "broken, swap, legacy, huge, subdir, fifo, symlink");
        assert_eq!(looked_up(&index, "0123456789abcde", None), pod("default", "web-1"));

        // A file deleted while unwatched is forgotten by the next rescan.
        std::fs::remove_file(dir.0.join("ovn-kubernetes-0123456789abcdef-eth0")).expect("remove");
        index.rescan(&dir.0);
        assert_eq!(index.len(), 1);
        assert_eq!(index.lookup("0123456789abcde", None), None);
        assert_eq!(index.skipped(), 14, "each read of a bad file counts");

        let missing = dir.0.join("missing");
        index.rescan(&missing);
        assert!(index.is_empty(), "a missing cache dir means no pods");
    }

    #[test]
    fn rescan_lets_the_newest_file_win() {
        let dir = TempDir::new("pods");
        let entry = |name: &str| {
            format!(
                r#"{{"kind":"cniCacheV1","containerId":"{name}","ifName":"eth0","networkName":"n",
                "cniArgs":[["K8S_POD_NAMESPACE","ns"],["K8S_POD_NAME","{name}"]],
                "result":{{"cniVersion":"1.0.0","interfaces":[{{"name":"vethshared01"}}]}}}}"#
            )
        };
        // "a-new" sorts first by name, but is the newer file.
        let old = dir.write("z-old", &entry("old"));
        let new = dir.write("a-new", &entry("new"));
        let now = SystemTime::now();
        std::fs::File::options()
            .write(true)
            .open(&old)
            .and_then(|file| file.set_modified(now - std::time::Duration::from_secs(60)))
            .expect("mtime");
        std::fs::File::options().write(true).open(&new).and_then(|file| file.set_modified(now)).expect("mtime");
        let mut index = index();
        index.rescan(&dir.0);
        assert_eq!(looked_up(&index, "vethshared01", None), pod("ns", "new"));
    }

    #[test]
    fn a_non_utf8_file_name_is_skipped() {
        use std::os::unix::ffi::OsStrExt;
        let dir = TempDir::new("pods");
        let name = OsStr::from_bytes(b"net-\xff-eth0");
        std::fs::write(dir.0.join(name), V031).expect("write");
        let mut index = index();
        assert!(matches!(index.read_file(&dir.0, name), FileOutcome::Skipped(PodCacheError::NonUtf8Name)));
        assert!(index.is_empty());
        assert_eq!(index.skipped(), 1);
    }

    fn run(command: &str, args: &[&str]) -> String {
        let output = Command::new(command).args(args).stderr(Stdio::piped()).output().expect("run");
        assert!(output.status.success(), "{command} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Deletes the named netns on drop, even when the test fails.
    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).stderr(Stdio::null()).status();
        }
    }

    #[test]
    #[ignore = "needs root: creates a network namespace"]
    fn a_real_netns_matches_by_the_inode_the_kernel_reports() {
        let name = format!("dm-pods-{}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let netns = Netns(name.clone());
        let sandbox = format!("/var/run/netns/{name}");
        // The kernel's own name for the netns, from inside it: "net:[4026532178]".
        let link = run("ip", &["netns", "exec", &name, "readlink", "/proc/self/ns/net"]);
        let kernel_inode: u64 = link
            .strip_prefix("net:[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
            .expect("net:[N]");

        let mut index = PodIndex::new();
        assert!(index.netns_dev.is_some());
        let json = V031.replace("/var/run/netns/3f2a01", &sandbox);
        index.upsert("openshift-sdn-3f2a01-eth0", parse_cache_entry(json.as_bytes()).expect("parse"));
        assert_eq!(
            looked_up(&index, "veth1a2b3c4d", Some(kernel_inode)),
            pod("openshift-apiserver", "apiserver-zg25k")
        );

        // `ip netns del` unmounts, then unlinks: after the unmount alone the path is a plain
        // file on /run's tmpfs, which must not match; after the unlink nothing is there.
        run("umount", &[&sandbox]);
        assert_eq!(index.lookup("veth1a2b3c4d", Some(kernel_inode)), None, "stale netns file");
        drop(netns);
        let _ = std::fs::remove_file(&sandbox);
        assert_eq!(index.lookup("veth1a2b3c4d", Some(kernel_inode)), None);
        index.upsert("openshift-sdn-3f2a01-eth0", parse_cache_entry(json.as_bytes()).expect("parse"));
        assert_eq!(index.lookup("veth1a2b3c4d", Some(kernel_inode)), None, "a missing sandbox has no inode");
    }
}
