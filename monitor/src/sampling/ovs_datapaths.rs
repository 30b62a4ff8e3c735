//! OVS kernel datapaths' own counters, read from openvswitch.ko over generic netlink (the
//! `ovs_datapath` family), as `ovs-dpctl show` reads them: flow-table lookups that hit a
//! flow, missed one (an upcall to ovs-vswitchd), and were lost (an upcall that failed).
//!
//! `lost` counts every failed upcall, however the kernel freed the packet. The drop tracer
//! names per input port those freed with `kfree_skb` (`OVS_UPCALL_FAILED`); an upcall refused
//! on a full socket queue (`-EAGAIN`) is freed with `consume_skb` and only this counter has it.

use std::{
    io,
    time::{Duration, Instant},
};

use netlink_packet_core::{
    DecodeError, Emitable, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload, NlaBuffer, NlasIterator,
    ParseableParametrized,
};
use netlink_packet_generic::{
    GenlFamily, GenlHeader, GenlMessage,
    ctrl::{GenlCtrl, GenlCtrlCmd, nlas::GenlCtrlAttrs},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

const FAMILY: &str = "ovs_datapath";
const VERSION: u8 = 2;
const CMD_GET: u8 = 3;
const ATTR_NAME: u16 = 1;
const ATTR_STATS: u16 = 3;
/// `struct ovs_header`: the datapath's ifindex, 0 to ask for all.
const OVS_HEADER_LEN: usize = 4;
/// How long a reply may take: the kernel answers from its own tables, at once.
const REPLY_TIMEOUT: Duration = Duration::from_millis(500);
/// How often to look for the family again while openvswitch.ko is not loaded.
const FAMILY_RETRY: Duration = Duration::from_secs(10);

/// One datapath's counters (`struct ovs_dp_stats`), cumulative since it was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct OvsDatapathStats {
    /// The datapath's name (its local port's device, `ovs-system` for OVS).
    pub name: String,
    pub hit: u64,
    pub missed: u64,
    pub lost: u64,
    pub flows: u64,
}

/// A request (`OVS_DP_CMD_GET`, all datapaths) or a reply (`OVS_DP_CMD_NEW`).
#[derive(Debug, Default)]
struct DatapathMessage {
    cmd: u8,
    name: Option<String>,
    stats: Option<[u64; 4]>,
}

impl GenlFamily for DatapathMessage {
    fn family_name() -> &'static str {
        FAMILY
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        VERSION
    }
}

impl Emitable for DatapathMessage {
    fn buffer_len(&self) -> usize {
        OVS_HEADER_LEN
    }

    /// A dump request carries only the header (dp_ifindex 0).
    fn emit(&self, buffer: &mut [u8]) {
        buffer[..OVS_HEADER_LEN].fill(0);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for DatapathMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        let attrs = buf.get(OVS_HEADER_LEN..).ok_or_else(|| DecodeError::from("no ovs_header"))?;
        let mut message = Self { cmd: header.cmd, ..Self::default() };
        for nla in NlasIterator::new(attrs) {
            let nla: NlaBuffer<&[u8]> = nla?;
            let value = nla.value();
            match nla.kind() {
                ATTR_NAME => {
                    let name = value.split(|byte| *byte == 0).next().unwrap_or_default();
                    message.name = Some(String::from_utf8_lossy(name).into_owned());
                }
                ATTR_STATS => {
                    let mut stats = [0u64; 4];
                    for (slot, bytes) in stats.iter_mut().zip(value.chunks_exact(8)) {
                        *slot = u64::from_ne_bytes(bytes.try_into().expect("chunks of 8"));
                    }
                    if value.len() < 32 {
                        return Err(DecodeError::from("OVS_DP_ATTR_STATS shorter than struct ovs_dp_stats"));
                    }
                    message.stats = Some(stats);
                }
                _ => {}
            }
        }
        Ok(message)
    }
}

/// What reading the datapaths found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvsDatapathsState {
    /// Read: these datapaths (none is possible: the module is loaded, OVS not started).
    Read,
    /// openvswitch.ko is not loaded: no family to ask.
    NoModule,
    /// The read failed (the agent keeps the last values and says why).
    Failed(String),
}

/// Reads the datapaths' counters; the socket and the family id are kept between reads.
#[derive(Debug)]
pub struct OvsDatapaths {
    socket: Option<Socket>,
    family: Option<u16>,
    family_tried: Option<Instant>,
    sequence: u32,
    pub state: OvsDatapathsState,
    pub latest: Vec<OvsDatapathStats>,
}

impl Default for OvsDatapaths {
    fn default() -> Self {
        Self {
            socket: None,
            family: None,
            family_tried: None,
            sequence: 0,
            state: OvsDatapathsState::NoModule,
            latest: Vec::new(),
        }
    }
}

impl OvsDatapaths {
    /// Reads every datapath's counters into `latest`. Without the module, looks for it again
    /// every [`FAMILY_RETRY`]; a failed read keeps the last values and records why.
    pub fn refresh(&mut self) {
        if self.family.is_none() {
            if self.family_tried.is_some_and(|at| at.elapsed() < FAMILY_RETRY) {
                return;
            }
            self.family_tried = Some(Instant::now());
        }
        match self.read() {
            Ok(Some(datapaths)) => {
                self.latest = datapaths;
                self.state = OvsDatapathsState::Read;
            }
            Ok(None) => {
                self.family = None;
                self.latest.clear();
                self.state = OvsDatapathsState::NoModule;
            }
            Err(error) => {
                // A new socket next time: a reply left unread must not be taken for the next one.
                self.socket = None;
                self.family = None;
                let message = error.to_string();
                if self.state != OvsDatapathsState::Failed(message.clone()) {
                    tracing::warn!(%error, "reading OVS datapath counters over netlink; keeping the last values");
                }
                self.state = OvsDatapathsState::Failed(message);
            }
        }
    }

    /// `None`: the family is not registered (openvswitch.ko not loaded).
    fn read(&mut self) -> io::Result<Option<Vec<OvsDatapathStats>>> {
        if self.socket.is_none() {
            let mut socket = Socket::new(NETLINK_GENERIC)?;
            socket.bind_auto()?;
            socket.connect(&SocketAddr::new(0, 0))?;
            set_receive_timeout(&socket, REPLY_TIMEOUT)?;
            self.socket = Some(socket);
        }
        let family = match self.family {
            Some(family) => family,
            None => match self.resolve_family()? {
                Some(family) => {
                    self.family = Some(family);
                    family
                }
                None => return Ok(None),
            },
        };
        let mut request = GenlMessage::from_payload(DatapathMessage { cmd: CMD_GET, ..Default::default() });
        request.set_resolved_family_id(family);
        let replies: Vec<DatapathMessage> = match self.exchange(request) {
            Ok(replies) => replies,
            // The module was unloaded since: its family id is gone.
            Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::EOPNOTSUPP)) => return Ok(None),
            Err(error) => return Err(error),
        };
        let mut datapaths: Vec<OvsDatapathStats> = replies
            .into_iter()
            .filter_map(|reply| {
                let [hit, missed, lost, flows] = reply.stats?;
                Some(OvsDatapathStats { name: reply.name?, hit, missed, lost, flows })
            })
            .collect();
        datapaths.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Some(datapaths))
    }

    /// The family's id from a dump of all registered families. Not a lookup by name: for a
    /// family it does not know, the kernel loads the module that registers it, and an agent
    /// must not load openvswitch.ko on a node that does not use OVS.
    fn resolve_family(&mut self) -> io::Result<Option<u16>> {
        let request = GenlMessage::from_payload(GenlCtrl { cmd: GenlCtrlCmd::GetFamily, nlas: vec![] });
        let families = self.exchange(request)?;
        Ok(families.into_iter().find_map(|family: GenlCtrl| {
            let named = family.nlas.iter().any(|nla| matches!(nla, GenlCtrlAttrs::FamilyName(name) if name == FAMILY));
            family.nlas.iter().find_map(|nla| match nla {
                GenlCtrlAttrs::FamilyId(id) if named => Some(*id),
                _ => None,
            })
        }))
    }

    fn exchange<F>(&mut self, request: GenlMessage<F>) -> io::Result<Vec<F>>
    where
        F: GenlFamily + Emitable + ParseableParametrized<[u8], GenlHeader> + std::fmt::Debug,
    {
        self.exchange_flags(request, NLM_F_REQUEST | NLM_F_DUMP)
    }

    /// Sends `request` and collects the replies' payloads up to the dump's end (or the one reply).
    fn exchange_flags<F>(&mut self, mut request: GenlMessage<F>, flags: u16) -> io::Result<Vec<F>>
    where
        F: GenlFamily + Emitable + ParseableParametrized<[u8], GenlHeader> + std::fmt::Debug,
    {
        let socket = self.socket.as_mut().ok_or_else(|| io::Error::other("no netlink socket"))?;
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        request.finalize();
        let mut message = NetlinkMessage::from(request);
        message.header.flags = flags;
        message.header.sequence_number = sequence;
        message.finalize();
        let mut buffer = vec![0; message.buffer_len()];
        message.serialize(&mut buffer);
        socket.send(&buffer, 0)?;

        let dump = flags & NLM_F_DUMP != 0;
        let mut payloads = Vec::new();
        let mut received = vec![0u8; 32 * 1024];
        loop {
            let length = socket.recv(&mut &mut received[..], 0)?;
            let mut offset = 0;
            while offset < length {
                let reply = NetlinkMessage::<GenlMessage<F>>::deserialize(&received[offset..length])
                    .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))?;
                let size = reply.header.length as usize;
                if size == 0 {
                    break;
                }
                offset += size;
                if reply.header.sequence_number != sequence {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::InnerMessage(genl) => {
                        payloads.push(genl.payload);
                        if !dump {
                            return Ok(payloads);
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(payloads),
                    NetlinkPayload::Error(error) => {
                        return Err(match error.code {
                            Some(code) => io::Error::from_raw_os_error(-code.get()),
                            None => io::Error::other("netlink acknowledgement where a reply was expected"),
                        });
                    }
                    _ => {}
                }
            }
        }
    }
}

fn set_receive_timeout(socket: &Socket, timeout: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid socket fd, and a timeval that lives across the call with its size.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const value).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let length = 4 + value.len();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(length as u16).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(value);
        bytes.resize(length.next_multiple_of(4), 0);
        bytes
    }

    fn header(cmd: u8) -> GenlHeader {
        GenlHeader { cmd, version: VERSION }
    }

    #[test]
    fn a_reply_gives_the_name_and_the_four_counters() {
        let mut payload = vec![7, 0, 0, 0];
        payload.extend(nla(ATTR_NAME, b"ovs-system\0"));
        let stats: Vec<u8> = [980u64, 35, 1, 7].iter().flat_map(|v| v.to_ne_bytes()).collect();
        payload.extend(nla(ATTR_STATS, &stats));
        payload.extend(nla(4, &[0; 32]));
        let reply = DatapathMessage::parse_with_param(&payload, header(1)).expect("parses");
        assert_eq!(reply.name.as_deref(), Some("ovs-system"));
        assert_eq!(reply.stats, Some([980, 35, 1, 7]));
    }

    #[test]
    fn short_stats_and_a_missing_header_are_errors_not_zeros() {
        let mut payload = vec![0; 4];
        payload.extend(nla(ATTR_STATS, &[1; 16]));
        assert!(DatapathMessage::parse_with_param(&payload, header(1)).is_err());
        assert!(DatapathMessage::parse_with_param(&[0, 0], header(1)).is_err());
    }

    #[test]
    fn a_request_is_the_header_only() {
        let request = DatapathMessage { cmd: CMD_GET, ..Default::default() };
        let mut buffer = vec![0xff; request.buffer_len()];
        request.emit(&mut buffer);
        assert_eq!(buffer, [0, 0, 0, 0]);
    }

    /// Without openvswitch.ko loaded the family is absent: no datapaths, stated, no error, and
    /// the module is not loaded by asking (in the test VMs it could be). In the guests,
    /// tests/ovs_kernel.rs compares the counts with ovs-dpctl.
    #[test]
    #[ignore = "needs root: run through cargo xtask test"]
    fn reading_without_the_module_states_it_and_loads_nothing() {
        let loaded = || std::path::Path::new("/sys/module/openvswitch").exists();
        if loaded() {
            // In a guest after an OVS test: unload it (no datapath may remain, or it stays).
            let _ = std::process::Command::new("modprobe").args(["-r", "openvswitch"]).status();
        }
        let was_loaded = loaded();
        let mut datapaths = OvsDatapaths::default();
        datapaths.refresh();
        if was_loaded {
            assert_eq!(datapaths.state, OvsDatapathsState::Read);
        } else {
            assert_eq!(datapaths.state, OvsDatapathsState::NoModule);
            assert!(datapaths.latest.is_empty());
            assert!(!loaded(), "reading the datapaths loaded openvswitch.ko");
        }
    }
}
