//! What the kernel says about the agent: its programs' run-time statistics and its maps'
//! memory, found through the agent's own file descriptors; and the empty baseline programs
//! the bench attaches beside the agent's on the same hooks.

use std::{collections::BTreeMap, fs, os::fd::OwnedFd};

use anyhow::{Context as _, Result, bail};
use aya::{
    Btf, Ebpf,
    maps::MapInfo,
    programs::{
        BtfTracePoint, LinkOrder, SchedClassifier, TcAttachType, TracePoint, loaded_programs, tc::TcAttachOptions,
    },
    sys::{Stats, enable_stats},
};
use datapath_monitor::datapath::BASELINE_PROGRAMS_OBJECT;

/// Cumulative run time and run count of one program.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub time_ns: u64,
    pub count: u64,
}

impl RunStats {
    pub fn since(self, before: Self) -> Self {
        Self { time_ns: self.time_ns - before.time_ns, count: self.count - before.count }
    }

    pub fn ns_per_run(self) -> Option<f64> {
        (self.count > 0).then(|| self.time_ns as f64 / self.count as f64)
    }
}

/// Turns BPF run-time statistics on for as long as the value lives.
pub fn stats_enabled() -> Result<OwnedFd> {
    enable_stats(Stats::RunTime).context("BPF_ENABLE_STATS (needs CAP_SYS_ADMIN and Linux 5.8+)")
}

/// Run statistics of the programs `ids`, all read in one pass over the kernel's programs.
pub fn run_stats(ids: &[u32]) -> Result<BTreeMap<u32, RunStats>> {
    let mut stats = BTreeMap::new();
    for info in loaded_programs() {
        let info = info.context("listing BPF programs")?;
        if ids.contains(&info.id()) {
            stats.insert(info.id(), RunStats { time_ns: info.run_time().as_nanos() as u64, count: info.run_count() });
        }
    }
    if let Some(missing) = ids.iter().find(|id| !stats.contains_key(id)) {
        bail!("program {missing} is gone");
    }
    Ok(stats)
}

fn program_name(id: u32) -> Result<Option<String>> {
    for info in loaded_programs() {
        let info = info.context("listing BPF programs")?;
        if info.id() == id {
            return Ok(Some(info.name_as_str().unwrap_or("?").to_string()));
        }
    }
    Ok(None)
}

/// `key:\tvalue` lines of one fdinfo file.
fn fdinfo(pid: u32, fd: &str) -> BTreeMap<String, String> {
    fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_string(), value.trim().to_string()))
        .collect()
}

fn bpf_fds(pid: u32, kind: &str) -> Result<Vec<String>> {
    let mut fds = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fd")).with_context(|| format!("listing /proc/{pid}/fd"))? {
        let entry = entry?;
        if fs::read_link(entry.path()).is_ok_and(|target| target.to_string_lossy() == format!("anon_inode:bpf-{kind}"))
        {
            fds.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(fds)
}

/// The agent's programs by name (the kernel keeps 15 characters), from its open fds.
pub fn agent_programs(pid: u32) -> Result<BTreeMap<String, u32>> {
    let mut programs = BTreeMap::new();
    for fd in bpf_fds(pid, "prog")? {
        let Some(id) = fdinfo(pid, &fd).get("prog_id").and_then(|id| id.parse().ok()) else { continue };
        if let Some(name) = program_name(id)? {
            programs.insert(name, id);
        }
    }
    Ok(programs)
}

pub struct MapMemory {
    pub name: String,
    pub kind: String,
    pub max_entries: u32,
    pub bytes: u64,
}

/// The agent's maps with the memory the kernel charges for each (fdinfo `memlock`).
pub fn agent_maps(pid: u32) -> Result<Vec<MapMemory>> {
    let mut maps = BTreeMap::new();
    for fd in bpf_fds(pid, "map")? {
        let info = fdinfo(pid, &fd);
        let (Some(id), Some(bytes)) =
            (info.get("map_id").and_then(|id| id.parse().ok()), info.get("memlock").and_then(|b| b.parse().ok()))
        else {
            continue;
        };
        let map = MapInfo::from_id(id)?;
        maps.insert(
            id,
            MapMemory {
                name: map.name_as_str().unwrap_or("?").to_string(),
                kind: map.map_type().map_or_else(|_| "?".into(), |kind| format!("{kind:?}")),
                max_entries: map.max_entries(),
                bytes,
            },
        );
    }
    Ok(maps.into_values().collect())
}

/// The empty programs (monitor-ebpf/src/baselines.rs), attached last on the agent's hooks.
/// Ingress and egress get separate copies so each has its own statistics.
pub struct Baselines {
    ingress: Ebpf,
    egress: Ebpf,
}

pub const EMPTY_TC: &str = "empty_tc";
pub const EMPTY_KFREE_BTF: &str = "empty_kfree_btf";
pub const EMPTY_KFREE_TP: &str = "empty_kfree_tp";
pub const EMPTY_EXEC: &str = "empty_exec";
pub const EMPTY_EXIT: &str = "empty_exit";

impl Baselines {
    /// Loads them and attaches the tracepoint ones; tc ones attach with [`Baselines::attach_tc`].
    pub fn load() -> Result<Self> {
        // Classic tracepoints attach through tracefs (the agent mounts it in its own mount namespace).
        datapath_monitor::datapath::mounts::ensure_mounted().context("mounting tracefs and bpffs")?;
        let btf = Btf::from_sys_fs().context("kernel BTF")?;
        let mut ingress = Ebpf::load(BASELINE_PROGRAMS_OBJECT).context("loading the baseline programs")?;
        let egress = {
            let mut egress = Ebpf::load(BASELINE_PROGRAMS_OBJECT)?;
            program::<SchedClassifier>(&mut egress, EMPTY_TC)?.load()?;
            egress
        };
        program::<SchedClassifier>(&mut ingress, EMPTY_TC)?.load()?;
        let kfree_btf = program::<BtfTracePoint>(&mut ingress, EMPTY_KFREE_BTF)?;
        kfree_btf.load("kfree_skb", &btf)?;
        kfree_btf.attach()?;
        let kfree_tp = program::<TracePoint>(&mut ingress, EMPTY_KFREE_TP)?;
        kfree_tp.load()?;
        kfree_tp.attach("skb", "kfree_skb")?;
        for (name, tracepoint) in [(EMPTY_EXEC, "sched_process_exec"), (EMPTY_EXIT, "sched_process_exit")] {
            let program = program::<TracePoint>(&mut ingress, name)?;
            program.load()?;
            program.attach("sched", tracepoint)?;
        }
        Ok(Self { ingress, egress })
    }

    /// Attaches the empty tc programs to `interface` (in the calling thread's netns) with tcx,
    /// after the agent's.
    pub fn attach_tc(&mut self, interface: &str) -> Result<()> {
        for (ebpf, direction) in [(&mut self.ingress, TcAttachType::Ingress), (&mut self.egress, TcAttachType::Egress)]
        {
            program::<SchedClassifier>(ebpf, EMPTY_TC)?
                .attach_with_options(interface, direction, TcAttachOptions::TcxOrder(LinkOrder::last()))
                .with_context(|| format!("tcx attach on {interface} (the bench needs tcx, Linux 6.6+)"))?;
        }
        Ok(())
    }

    /// Ids of: the ingress and egress tc copies, then the named tracepoint programs.
    pub fn ids(&self) -> Result<BTreeMap<&'static str, u32>> {
        let mut ids = BTreeMap::new();
        let id = |ebpf: &Ebpf, name: &str| -> Result<u32> {
            let program = ebpf.program(name).with_context(|| format!("no program {name}"))?;
            Ok(program.info()?.id())
        };
        ids.insert("empty_tc_ingress", id(&self.ingress, EMPTY_TC)?);
        ids.insert("empty_tc_egress", id(&self.egress, EMPTY_TC)?);
        for name in [EMPTY_KFREE_BTF, EMPTY_KFREE_TP, EMPTY_EXEC, EMPTY_EXIT] {
            ids.insert(name, id(&self.ingress, name)?);
        }
        Ok(ids)
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program>,
{
    let Some(program) = ebpf.program_mut(name) else { bail!("no program {name} in the baseline object") };
    program.try_into().map_err(|_| anyhow::anyhow!("{name} has an unexpected program type"))
}
