//! The process tracer's kernel side: the `task_struct` offsets it follows (from BTF), the
//! `sched:sched_process_exit` record layout (from its format file), the watched-name filter
//! map, and attaching `process_exec` / `process_exit` to their classic tracepoints.

use std::{collections::BTreeSet, io};

use aya::{
    EbpfLoader,
    maps::{HashMap, MapData, RingBuf},
    programs::TracePoint,
};
use btf_rs::Btf;
use monitor_common::{
    COMM_LEN, GLOBAL_AGENT_PIDNS_DEV, GLOBAL_AGENT_PIDNS_INO, GLOBAL_SIGNAL_GROUP_EXIT_CODE_OFFSET,
    GLOBAL_SIGNAL_LIVE_OFFSET, GLOBAL_TASK_COMM_OFFSET, GLOBAL_TASK_GROUP_LEADER_OFFSET,
    GLOBAL_TASK_REAL_PARENT_OFFSET, GLOBAL_TASK_SIGNAL_OFFSET, GLOBAL_TASK_TGID_OFFSET, GLOBAL_TP_GROUP_DEAD_OFFSET,
    PROCESS_EVENTS_MAP, PROCESS_EXEC_PROGRAM, PROCESS_EXIT_PROGRAM, ProcessEvent, SDN_COMMS_MAP, SDN_COMMS_MAX,
};
use tokio::io::{Interest, unix::AsyncFd};
use tracing::{debug, info, warn};

use super::{
    Datapath, DatapathError,
    kernel_layout::{member_offset, read_tracepoint_format, tracepoint_field_offset},
    probes::PROCESS_PROBE,
    program_mut,
};
use crate::errors;

/// Byte offsets the process tracer follows from `struct task_struct *`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessTracerOffsets {
    /// `task_struct.signal`.
    pub task_signal: u32,
    /// `signal_struct.live.counter` (threads of the group still alive).
    pub signal_live: u32,
    /// `task_struct.group_leader`.
    pub task_group_leader: u32,
    /// `task_struct.comm`.
    pub task_comm: u32,
    /// `signal_struct.group_exit_code`.
    pub signal_group_exit_code: u32,
    /// `task_struct.real_parent`.
    pub task_real_parent: u32,
    /// `task_struct.tgid`.
    pub task_tgid: u32,
    /// Offset of `group_dead` in the `sched_process_exit` record; 0 when the field is absent.
    pub tp_group_dead: u32,
    /// The agent's PID namespace (`stat /proc/self/ns/pid`: device, inode; 0 when unknown):
    /// each report says whether its process is in it.
    pub agent_pidns_dev: u64,
    pub agent_pidns_ino: u64,
}

impl ProcessTracerOffsets {
    /// Resolves the offsets from the kernel's BTF and the tracepoint's format file.
    pub fn resolve(btf: &Btf) -> Result<Self, DatapathError> {
        let tp_group_dead = match read_tracepoint_format("sched", "sched_process_exit") {
            Ok(format) => tracepoint_field_offset(&format, "group_dead").unwrap_or(0),
            Err(error) => {
                // The classic tracepoint itself then fails to attach, with a clearer error.
                debug!(%error, "sched_process_exit format unreadable");
                0
            }
        };
        let (agent_pidns_dev, agent_pidns_ino) = match own_pid_namespace() {
            Ok(namespace) => namespace,
            Err(error) => {
                warn!(%error, "cannot read this process's PID namespace: SDN process reports from pods are not told apart");
                (0, 0)
            }
        };
        Ok(Self {
            task_signal: member_offset(btf, "task_struct", &["signal"])?,
            signal_live: member_offset(btf, "signal_struct", &["live", "counter"])?,
            task_group_leader: member_offset(btf, "task_struct", &["group_leader"])?,
            task_comm: member_offset(btf, "task_struct", &["comm"])?,
            signal_group_exit_code: member_offset(btf, "signal_struct", &["group_exit_code"])?,
            task_real_parent: member_offset(btf, "task_struct", &["real_parent"])?,
            task_tgid: member_offset(btf, "task_struct", &["tgid"])?,
            tp_group_dead,
            agent_pidns_dev,
            agent_pidns_ino,
        })
    }

    /// How the exit program tells the last thread of a process.
    pub fn exit_detection(&self) -> &'static str {
        if self.tp_group_dead != 0 { "group_dead" } else { "signal_live" }
    }

    /// Hands the offsets to the programs (globals are fixed at load time).
    pub fn override_globals<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        loader
            .override_global(GLOBAL_TASK_SIGNAL_OFFSET, &self.task_signal, true)
            .override_global(GLOBAL_SIGNAL_LIVE_OFFSET, &self.signal_live, true)
            .override_global(GLOBAL_TASK_GROUP_LEADER_OFFSET, &self.task_group_leader, true)
            .override_global(GLOBAL_TASK_COMM_OFFSET, &self.task_comm, true)
            .override_global(GLOBAL_SIGNAL_GROUP_EXIT_CODE_OFFSET, &self.signal_group_exit_code, true)
            .override_global(GLOBAL_TASK_REAL_PARENT_OFFSET, &self.task_real_parent, true)
            .override_global(GLOBAL_TASK_TGID_OFFSET, &self.task_tgid, true)
            .override_global(GLOBAL_TP_GROUP_DEAD_OFFSET, &self.tp_group_dead, true)
            .override_global(GLOBAL_AGENT_PIDNS_DEV, &self.agent_pidns_dev, true)
            .override_global(GLOBAL_AGENT_PIDNS_INO, &self.agent_pidns_ino, true);
    }
}

/// (device, inode) of this process's PID namespace, as the kernel's
/// `bpf_get_ns_current_pid_tgid` wants them.
pub fn own_pid_namespace() -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata("/proc/self/ns/pid")?;
    Ok((meta.dev(), meta.ino()))
}

/// The running process tracer: the ring buffer of its reports.
pub struct ProcessProbe {
    /// [`ProcessEvent`] records, oldest first.
    events: RingBuf<MapData>,
    /// The process names the kernel filters on.
    pub names: Vec<String>,
}

impl std::fmt::Debug for ProcessProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessProbe").field("names", &self.names).finish_non_exhaustive()
    }
}

impl ProcessProbe {
    /// Starts polling its ring buffer; must be called inside a tokio runtime.
    pub fn into_reports(self) -> io::Result<ProcessReports> {
        // SAFETY: the RingBuf owns its map's fd and neither closes nor replaces it while the
        // AsyncFd holds it.
        let ring = unsafe { AsyncFd::register_with_interest(self.events, Interest::READABLE) }
            .map_err(|error| error.into_parts().1)?;
        Ok(ProcessReports { ring })
    }
}

/// The process tracer's reports as they arrive: every exec of a watched name and every
/// whole-process exit.
pub struct ProcessReports {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl ProcessReports {
    /// Every report the ring buffer holds now, oldest first (waits for at least one
    /// readiness). A record too short to decode is logged and skipped.
    pub async fn next_batch(&mut self) -> io::Result<Vec<ProcessEvent>> {
        let mut guard = self.ring.readable_mut().await?;
        let batch = drain(guard.get_inner_mut());
        guard.clear_ready();
        Ok(batch)
    }

    /// Every report the ring buffer holds now, without waiting.
    pub fn drain_now(&mut self) -> Vec<ProcessEvent> {
        drain(self.ring.get_mut())
    }
}

/// Every report `ring` holds now, oldest first; a record too short to decode is logged and skipped.
fn drain(ring: &mut RingBuf<MapData>) -> Vec<ProcessEvent> {
    let mut batch = Vec::new();
    while let Some(item) = ring.next() {
        match decode_event(&item) {
            Some(event) => batch.push(event),
            None => debug!(len = item.len(), "short process event"),
        }
    }
    batch
}

/// A [`ProcessEvent`] from its bytes in the ring buffer (layout of the `repr(C)` struct).
fn decode_event(bytes: &[u8]) -> Option<ProcessEvent> {
    let u32_at = |at: usize| Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    Some(ProcessEvent {
        ktime_ns: u64::from_ne_bytes(bytes.get(0..8)?.try_into().ok()?),
        kind: u32_at(8)?,
        tgid: u32_at(12)?,
        ppid: u32_at(16)?,
        exit_code: u32_at(20)?,
        comm: bytes.get(24..24 + COMM_LEN)?.try_into().ok()?,
        pid_ns: u32_at(24 + COMM_LEN)?,
        reserved: 0,
    })
}

/// The kernel filter's key of a process name: its bytes, NUL-padded to `TASK_COMM_LEN`. None
/// for a name the kernel can never report: empty, longer than 15 bytes (the kernel truncates
/// comm to `TASK_COMM_LEN` - 1), or with a NUL byte. The configuration rejects such names.
pub fn comm_key(name: &str) -> Option<[u8; COMM_LEN]> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= COMM_LEN || bytes.contains(&0) {
        return None;
    }
    let mut key = [0u8; COMM_LEN];
    key[..bytes.len()].copy_from_slice(bytes);
    Some(key)
}

impl Datapath {
    /// Fills the kernel's name filter with `names`, attaches `process_exec` and
    /// `process_exit`, and hands over their event ring buffer. Records the outcome as probe
    /// "sched_process" in the probe report. Can only succeed once.
    pub fn start_process_probe(&mut self, names: &[String]) -> Result<ProcessProbe, DatapathError> {
        let result = self.try_start_process_probe(names);
        match &result {
            Ok(probe) => {
                let exit_detection = self.process_offsets.as_ref().map_or("", |o| o.exit_detection());
                info!(names = ?probe.names, exit_detection, "process tracer attached");
                self.probes.probes.insert(PROCESS_PROBE, Some("tracepoint".into()));
                self.probes.errors.remove(PROCESS_PROBE);
            }
            Err(error) => {
                let error = errors::chain(error);
                warn!(%error, "process tracer unsupported on this kernel; SDN process events are not seen");
                self.probes.probes.insert(PROCESS_PROBE, None);
                self.probes.errors.insert(PROCESS_PROBE, error);
            }
        }
        result
    }

    fn try_start_process_probe(&mut self, names: &[String]) -> Result<ProcessProbe, DatapathError> {
        if self.disabled.contains(&super::probes::PROCESS_PROBE) {
            return Err(DatapathError::ProcessTracer(super::probes::DISABLED.into()));
        }
        if !aya::sys::is_map_supported(aya::maps::MapType::RingBuf).unwrap_or(false) {
            return Err(DatapathError::ProcessTracer("this kernel has no BPF ring buffers (Linux 5.8+)".into()));
        }
        if let Err(error) = &self.process_offsets {
            return Err(DatapathError::ProcessTracer(error.clone()));
        }
        if self.ebpf.map(PROCESS_EVENTS_MAP).is_none() {
            return Err(DatapathError::ProcessTracer("already started".into()));
        }
        let mut keys = BTreeSet::new();
        let mut watched = Vec::new();
        for name in names {
            let key = comm_key(name).ok_or_else(|| {
                DatapathError::ProcessTracer(format!("{name:?} is not a kernel comm name (1 to 15 bytes, no NUL)"))
            })?;
            if keys.insert(key) {
                watched.push(name.clone());
            }
        }
        if keys.len() > SDN_COMMS_MAX as usize {
            return Err(DatapathError::ProcessTracer(format!(
                "{} process names given, the kernel filter holds {SDN_COMMS_MAX}",
                keys.len()
            )));
        }
        {
            let map = self.ebpf.map_mut(SDN_COMMS_MAP).ok_or(DatapathError::Missing(SDN_COMMS_MAP))?;
            let mut comms: HashMap<&mut MapData, [u8; COMM_LEN], u8> = HashMap::try_from(map)
                .map_err(|source| DatapathError::Map { name: SDN_COMMS_MAP, source: Box::new(source) })?;
            for key in &keys {
                comms
                    .insert(key, 1, 0)
                    .map_err(|source| DatapathError::Map { name: SDN_COMMS_MAP, source: Box::new(source) })?;
            }
            // A previous agent's names (pinned maps, `keep_attached`) that this one does not watch.
            let stale: Vec<[u8; COMM_LEN]> =
                comms.keys().filter_map(Result::ok).filter(|k| !keys.contains(k)).collect();
            for key in stale {
                let _ = comms.remove(&key);
            }
        }
        // Both tracers a previous agent left, or neither: half would report starts without exits.
        let programs = [(PROCESS_EXEC_PROGRAM, "sched_process_exec"), (PROCESS_EXIT_PROGRAM, "sched_process_exit")];
        if let Some(keeper) = self.keeper.as_mut()
            && !programs.iter().all(|(name, _)| keeper.pins.has_link(name))
        {
            programs.iter().for_each(|(name, _)| keeper.pins.unpin(name));
        }
        let mut attached: Vec<&'static str> = Vec::new();
        for (program_name, tracepoint) in programs {
            let outcome = super::probes::attach_tracepoint(
                &mut self.ebpf,
                program_name,
                "sched",
                tracepoint,
                self.keeper.as_mut(),
            );
            if let Err(error) = outcome {
                // Half a tracer would report starts without exits (or fill the ring for nobody).
                for name in attached.into_iter().chain([program_name]) {
                    if let Some(keeper) = self.keeper.as_ref() {
                        keeper.pins.unpin(name);
                    }
                    if let Ok(program) = program_mut::<TracePoint>(&mut self.ebpf, name) {
                        let _ = program.unload();
                    }
                }
                return Err(error);
            }
            attached.push(program_name);
        }
        let map = self.ebpf.take_map(PROCESS_EVENTS_MAP).ok_or(DatapathError::Missing(PROCESS_EVENTS_MAP))?;
        let events = RingBuf::try_from(map)
            .map_err(|source| DatapathError::Map { name: PROCESS_EVENTS_MAP, source: Box::new(source) })?;
        Ok(ProcessProbe { events, names: watched })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT_FORMAT_6_18: &str = "name: sched_process_exit
ID: 369
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;

print fmt: \"comm=%s pid=%d prio=%d group_dead=%s\", REC->comm, REC->pid, REC->prio, REC->group_dead ? \"true\" : \"false\"
";

    // 6.1: no group_dead.
    const EXIT_FORMAT_6_1: &str = "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
";

    #[test]
    fn group_dead_offset_from_format() {
        assert_eq!(tracepoint_field_offset(EXIT_FORMAT_6_18, "group_dead"), Some(32));
        assert_eq!(tracepoint_field_offset(EXIT_FORMAT_6_18, "comm"), Some(8));
        assert_eq!(tracepoint_field_offset(EXIT_FORMAT_6_18, "pid"), Some(24));
        assert_eq!(tracepoint_field_offset(EXIT_FORMAT_6_1, "group_dead"), None);
        assert_eq!(tracepoint_field_offset("", "group_dead"), None);
    }

    #[test]
    fn names_take_the_kernel_comm_form() {
        let key = comm_key("flanneld").unwrap();
        assert_eq!(&key[..8], b"flanneld");
        assert!(key[8..].iter().all(|b| *b == 0));
        let key = comm_key("openshift-sdn-n").unwrap();
        assert_eq!(&key[..15], b"openshift-sdn-n");
        assert_eq!(key[15], 0);
        // Names the kernel never reports (it truncates comm to 15 bytes) have no key.
        assert_eq!(comm_key("openshift-sdn-node"), None);
        assert_eq!(comm_key(""), None);
        assert_eq!(comm_key("a\0b"), None);
    }

    #[test]
    fn kernel_records_decode() {
        let event = ProcessEvent {
            ktime_ns: 0x0102_0304_0506_0708,
            kind: monitor_common::PROCESS_EVENT_EXIT,
            tgid: 4242,
            ppid: 1,
            exit_code: 9,
            comm: *b"ovs-vswitchd\0\0\0\0",
            pid_ns: monitor_common::PID_NS_OTHER,
            reserved: 0,
        };
        // The same bytes the kernel writes for the repr(C) struct.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&event.ktime_ns.to_ne_bytes());
        for field in [event.kind, event.tgid, event.ppid, event.exit_code] {
            bytes.extend_from_slice(&field.to_ne_bytes());
        }
        bytes.extend_from_slice(&event.comm);
        bytes.extend_from_slice(&event.pid_ns.to_ne_bytes());
        bytes.extend_from_slice(&event.reserved.to_ne_bytes());
        assert_eq!(bytes.len(), size_of::<ProcessEvent>());
        assert_eq!(std::mem::offset_of!(ProcessEvent, pid_ns), 40);
        assert_eq!(std::mem::offset_of!(ProcessEvent, comm), 24);
        assert_eq!(std::mem::offset_of!(ProcessEvent, exit_code), 20);
        assert_eq!(decode_event(&bytes), Some(event));
        assert_eq!(decode_event(&bytes[..30]), None);
    }

    #[test]
    fn offsets_resolve_on_the_running_kernel() {
        let path = std::path::Path::new(crate::datapath::kernel_layout::VMLINUX_BTF);
        if !path.exists() {
            eprintln!("no BTF: skipped");
            return;
        }
        let Ok(btf) = Btf::from_file(path) else { return };
        let offsets = ProcessTracerOffsets::resolve(&btf).unwrap();
        assert!(offsets.task_comm > 0 && offsets.task_signal > 0 && offsets.task_group_leader > 0);
        assert!(offsets.signal_group_exit_code > 0 && offsets.task_real_parent > 0 && offsets.task_tgid > 0);
        // atomic_t live opens signal_struct on every kernel since 2.6 (after refcount sigcnt).
        assert!(offsets.signal_live < 16, "{offsets:?}");
    }
}
