//! Network namespaces: the agent's own, and the one behind each nsid the kernel uses to name
//! a veth peer's namespace relative to ours.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    time::Duration,
};

use netlink_packet_route::{
    RouteNetlinkMessage,
    nsid::{NsidAttribute, NsidMessage},
};
use rtnetlink::{
    packet_core::{NLM_F_REQUEST, NetlinkPayload},
    sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE},
};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{
    InterfaceError,
    links::{parse_datagram, request_bytes},
    netlink_error,
};

/// At most one netns rescan per interval, so a flood of veths cannot make it spin.
const RESCAN_INTERVAL: Duration = Duration::from_secs(1);
/// Where `ip netns` and container runtimes pin network namespaces.
const PINNED_NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];
/// This thread's netns: `/proc/self` would name the main thread's, which differs in tests.
const OWN_NETNS: &str = "/proc/thread-self/ns/net";

/// The network namespace the agent runs in, as the kernel names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnNetns {
    /// Its inode number: how drop counters and `/api/v1/interfaces` name it.
    pub inode: u64,
    /// The nsfs device, where every network namespace inode lives: a file on another device
    /// (e.g. a stale `/run/netns` entry whose bind mount is gone) is no network namespace.
    pub nsfs_dev: u64,
}

impl OwnNetns {
    /// The calling thread's network namespace.
    pub fn of_this_thread() -> Result<Self, InterfaceError> {
        std::fs::metadata(OWN_NETNS)
            .map(|metadata| Self { inode: metadata.ino(), nsfs_dev: metadata.dev() })
            .map_err(|source| InterfaceError::Netns { path: OWN_NETNS.into(), source })
    }
}

/// Maps nsids (the kernel's names for other network namespaces, relative to ours) to netns
/// inodes, by asking the kernel the nsid of each netns file it can find.
pub(super) struct NetnsResolver {
    /// Non-blocking: the kernel answers RTM_GETNSID inside sendmsg(2), so the reply is
    /// already queued when send returns.
    socket: Socket,
    seq: u32,
    /// Device of nsfs: files elsewhere (e.g. a stale /run/netns entry) are no netns.
    nsfs_dev: u64,
    by_nsid: HashMap<i32, u64>,
    last_scan: Option<Instant>,
}

impl NetnsResolver {
    pub(super) fn open() -> Result<Self, InterfaceError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(netlink_error("opening the nsid socket"))?;
        socket.bind_auto().map_err(netlink_error("binding the nsid socket"))?;
        socket.set_non_blocking(true).map_err(netlink_error("configuring the nsid socket"))?;
        let nsfs_dev = OwnNetns::of_this_thread()?.nsfs_dev;
        Ok(Self { socket, seq: 0, nsfs_dev, by_nsid: HashMap::new(), last_scan: None })
    }

    pub(super) fn lookup(&self, nsid: i32) -> Option<u64> {
        self.by_nsid.get(&nsid).copied()
    }

    /// The kernel deleted this nsid (its netns is gone); the number may be reused.
    pub(super) fn forget(&mut self, nsid: i32) {
        self.by_nsid.remove(&nsid);
    }

    pub(super) fn clear(&mut self) {
        self.by_nsid.clear();
    }

    pub(super) fn next_scan_allowed_at(&self) -> Instant {
        self.last_scan.map_or_else(Instant::now, |last| last + RESCAN_INTERVAL)
    }

    /// Pinned netns files first (cheap, and where CNI runtimes keep pod namespaces), then
    /// every process's, unless the pinned ones already answered all `wanted` nsids.
    pub(super) async fn rescan(&mut self, wanted: &HashSet<i32>) {
        let started = Instant::now();
        self.last_scan = Some(started);
        let mut skip: HashSet<u64> = self.by_nsid.values().copied().collect();
        let pinned = PINNED_NETNS_DIRS.iter().flat_map(|dir| dir_entries(Path::new(dir)));
        let pinned = unique_netns_files(pinned, self.nsfs_dev, &mut skip);
        self.ask_nsids(&pinned);
        let mut processes = 0;
        if !wanted.iter().all(|nsid| self.by_nsid.contains_key(nsid)) {
            let nsfs_dev = self.nsfs_dev;
            let listed = tokio::task::spawn_blocking(move || {
                let files = dir_entries(Path::new("/proc"))
                    .into_iter()
                    .filter(|path| {
                        path.file_name().is_some_and(|name| name.as_encoded_bytes().iter().all(u8::is_ascii_digit))
                    })
                    .map(|path| path.join("ns/net"));
                unique_netns_files(files, nsfs_dev, &mut skip)
            })
            .await;
            match listed {
                Ok(files) => {
                    processes = files.len();
                    self.ask_nsids(&files);
                }
                Err(error) => warn!(%error, "listing process network namespaces failed"),
            }
        }
        debug!(
            pinned = pinned.len(),
            processes,
            known = self.by_nsid.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rescanned network namespaces"
        );
    }

    fn ask_nsids(&mut self, files: &[PathBuf]) {
        for path in files {
            let file = match File::open(path) {
                Ok(file) => file,
                Err(error) => {
                    debug!(path = %path.display(), %error, "netns file vanished");
                    continue;
                }
            };
            // The path may name another netns by now (pid reuse): trust the open file.
            let inode = match file.metadata() {
                Ok(metadata) if metadata.dev() == self.nsfs_dev => metadata.ino(),
                Ok(_) => continue,
                Err(error) => {
                    debug!(path = %path.display(), %error, "netns file unreadable");
                    continue;
                }
            };
            match self.query_nsid(&file) {
                Ok(Some(nsid)) => {
                    self.by_nsid.insert(nsid, inode);
                }
                Ok(None) => {}
                Err(error) => debug!(path = %path.display(), %error, "RTM_GETNSID failed"),
            }
        }
    }

    /// RTM_GETNSID with NETNSA_FD; None for NETNSA_NSID_NOT_ASSIGNED (-1).
    fn query_nsid(&mut self, netns: &File) -> io::Result<Option<i32>> {
        let fd = u32::try_from(netns.as_raw_fd()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.seq = self.seq.wrapping_add(1);
        let mut message = NsidMessage::default();
        message.attributes.push(NsidAttribute::Fd(fd));
        let request = request_bytes(RouteNetlinkMessage::GetNsId(message), NLM_F_REQUEST, self.seq);
        self.socket.send_to(&request, &SocketAddr::new(0, 0), 0)?;
        loop {
            // WouldBlock here means no reply: reported as an error, never waited for.
            let (datagram, _) = self.socket.recv_from_full()?;
            for reply in parse_datagram(&datagram) {
                if reply.header.sequence_number != self.seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(reply)) => {
                        return Ok(reply.attributes.iter().find_map(|attribute| match attribute {
                            NsidAttribute::Id(nsid) if *nsid >= 0 => Some(*nsid),
                            _ => None,
                        }));
                    }
                    NetlinkPayload::Error(error) if error.code.is_some() => {
                        return Err(error.to_io());
                    }
                    _ => {}
                }
            }
        }
    }
}

fn dir_entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|entry| entry.ok().map(|entry| entry.path())).collect(),
        Err(error) => {
            if error.kind() != io::ErrorKind::NotFound {
                debug!(dir = %dir.display(), %error, "cannot list network namespace files");
            }
            Vec::new()
        }
    }
}

/// Netns files among `paths`, one per netns, skipping the inodes in `skip` (and adding theirs).
fn unique_netns_files(
    paths: impl IntoIterator<Item = PathBuf>,
    nsfs_dev: u64,
    skip: &mut HashSet<u64>,
) -> Vec<PathBuf> {
    paths
        .into_iter()
        .filter(|path| {
            std::fs::metadata(path).is_ok_and(|metadata| metadata.dev() == nsfs_dev && skip.insert(metadata.ino()))
        })
        .collect()
}
