//! Process tracer on `sched:sched_process_exec` and `sched:sched_process_exit`: one
//! ring-buffer event when a process with a watched name (comm) starts, and one when such a
//! process ends as a whole (its last thread exits).
//!
//! rustc emits no CO-RE relocations, so the agent resolves `task_struct` offsets from
//! /sys/kernel/btf/vmlinux and hands them over as globals.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::bpf_get_ns_current_pid_tgid,
    },
    macros::{map, tracepoint},
    maps::{HashMap, RingBuf},
    programs::TracePointContext,
};
use monitor_common::{
    COMM_LEN, MAP_ERROR_PROCESS_EVENTS, PID_NS_AGENTS, PID_NS_OTHER, PID_NS_UNCHECKED, PROCESS_EVENT_EXEC,
    PROCESS_EVENT_EXIT, PROCESS_EVENTS_BYTES, ProcessEvent, SDN_COMMS_MAX,
};

use crate::packets::count_map_error;

/// Watched process names (NUL-padded comm), filled by the agent.
#[map(name = "SDN_COMMS")]
static SDN_COMMS: HashMap<[u8; COMM_LEN], u8> = HashMap::with_max_entries(SDN_COMMS_MAX, 0);

#[map(name = "PROCESS_EVENTS")]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENTS_BYTES, 0);

#[unsafe(no_mangle)]
static TASK_SIGNAL_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SIGNAL_LIVE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_GROUP_LEADER_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_COMM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static SIGNAL_GROUP_EXIT_CODE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_REAL_PARENT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TP_GROUP_DEAD_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static AGENT_PIDNS_DEV: u64 = 0;
#[unsafe(no_mangle)]
static AGENT_PIDNS_INO: u64 = 0;

fn global(value: &'static u32) -> u32 {
    // SAFETY: the agent fills these before load; volatile keeps rustc from folding the 0.
    unsafe { read_volatile(value) }
}

/// After exec the task already carries its new name.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    let Ok(comm) = bpf_get_current_comm() else {
        return 0;
    };
    let comm = nul_padded(comm);
    if !is_watched(&comm) {
        return 0;
    }
    let task = current_task();
    emit(ProcessEvent {
        ktime_ns: now_ns(),
        kind: PROCESS_EVENT_EXEC,
        tgid: current_tgid(),
        ppid: parent_tgid(task),
        exit_code: 0,
        comm,
        pid_ns: pid_ns(),
        reserved: 0,
    });
    0
}

/// Fires for every exiting thread; only the last one of a thread group is a process exit.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let task = current_task();
    if task.is_null() || !group_dead(&ctx, task) {
        return 0;
    }
    // The process's name is its leader's: other threads carry their own ("handler12").
    // SAFETY: bpf_probe_read_kernel checks the address; offsets come from the kernel's BTF.
    let Ok(leader) = (unsafe { read_field::<*const u8>(task, &TASK_GROUP_LEADER_OFFSET) }) else {
        return 0;
    };
    if leader.is_null() {
        return 0;
    }
    // SAFETY: as above; the leader's task_struct lives until the whole group is reaped.
    let Ok(comm) = (unsafe { read_field::<[u8; COMM_LEN]>(leader, &TASK_COMM_OFFSET) }) else {
        return 0;
    };
    let comm = nul_padded(comm);
    if !is_watched(&comm) {
        return 0;
    }
    // The wait status the parent will see: exit_group() and fatal signals set
    // SIGNAL_GROUP_EXIT and group_exit_code (synchronize_group_exit() does it for a last
    // plain exit() too), and wait() then reports group_exit_code. The last thread's own
    // task->exit_code can differ: after a multi-threaded core dump it lacks the core bit
    // (measured on 6.18: 0x0b where wait() says 0x8b).
    // SAFETY: as above.
    let exit_code = unsafe {
        read_field::<*const u8>(task, &TASK_SIGNAL_OFFSET)
            .and_then(|signal| read_field::<u32>(signal, &SIGNAL_GROUP_EXIT_CODE_OFFSET))
            .unwrap_or(0)
    };
    emit(ProcessEvent {
        ktime_ns: now_ns(),
        kind: PROCESS_EVENT_EXIT,
        tgid: current_tgid(),
        ppid: parent_tgid(task),
        exit_code,
        comm,
        pid_ns: pid_ns(),
        reserved: 0,
    });
    0
}

/// Whether the exiting thread is the last of its group.
fn group_dead(ctx: &TracePointContext, task: *const u8) -> bool {
    match global(&TP_GROUP_DEAD_OFFSET) {
        // No group_dead field (before it was added to the tracepoint): do_exit() decrements
        // signal->live before the tracepoint, so 0 means no thread is left. Two threads
        // exiting at once may both see 0: the agent ignores the second report.
        0 => {
            // SAFETY: bpf_probe_read_kernel checks the addresses; offsets come from BTF.
            let live = unsafe {
                read_field::<*const u8>(task, &TASK_SIGNAL_OFFSET)
                    .and_then(|signal| read_field::<i32>(signal, &SIGNAL_LIVE_OFFSET))
            };
            matches!(live, Ok(0))
        }
        // SAFETY: the offset comes from the tracepoint's own format file.
        offset => matches!(unsafe { ctx.read_at::<u8>(offset as usize) }, Ok(dead) if dead != 0),
    }
}

/// Whether the current task is in the agent's PID namespace: a pod can run a binary named
/// `ovs-vswitchd` and kill it, and that must not look like the node's switch restarting.
fn pid_ns() -> u32 {
    // SAFETY: the agent fills these before load; volatile keeps rustc from folding the 0.
    let (dev, ino) = unsafe { (read_volatile(&AGENT_PIDNS_DEV), read_volatile(&AGENT_PIDNS_INO)) };
    if ino == 0 {
        return PID_NS_UNCHECKED;
    }
    let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes at most `size` bytes into `info`; it succeeds only when the
    // current task's active PID namespace is (dev, ino).
    let result =
        unsafe { bpf_get_ns_current_pid_tgid(dev, ino, &mut info, core::mem::size_of::<bpf_pidns_info>() as u32) };
    if result == 0 { PID_NS_AGENTS } else { PID_NS_OTHER }
}

fn is_watched(comm: &[u8; COMM_LEN]) -> bool {
    SDN_COMMS.get_ptr(comm).is_some()
}

/// Zeroes every byte after the first NUL, so the name matches the map key exactly.
fn nul_padded(mut comm: [u8; COMM_LEN]) -> [u8; COMM_LEN] {
    let mut ended = false;
    for byte in comm.iter_mut() {
        ended |= *byte == 0;
        if ended {
            *byte = 0;
        }
    }
    comm
}

fn emit(event: ProcessEvent) {
    match PROCESS_EVENTS.reserve::<ProcessEvent>(0) {
        Some(mut entry) => {
            entry.write(event);
            entry.submit(0);
        }
        None => count_map_error(MAP_ERROR_PROCESS_EVENTS),
    }
}

fn current_task() -> *const u8 {
    // SAFETY: a plain helper call, no arguments.
    unsafe { bpf_get_current_task() as *const u8 }
}

fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

fn now_ns() -> u64 {
    // SAFETY: a plain helper call, no arguments.
    unsafe { bpf_ktime_get_ns() }
}

fn parent_tgid(task: *const u8) -> u32 {
    // SAFETY: bpf_probe_read_kernel checks the addresses; offsets come from the kernel's BTF.
    unsafe {
        read_field::<*const u8>(task, &TASK_REAL_PARENT_OFFSET)
            .and_then(|parent| read_field::<u32>(parent, &TASK_TGID_OFFSET))
            .unwrap_or(0)
    }
}

/// Reads the `T` at `base + offset` (offset from a global).
///
/// # Safety
/// `base` must be a kernel pointer; the read itself is checked by the helper.
unsafe fn read_field<T>(base: *const u8, offset: &'static u32) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel tolerates bad addresses (it returns an error).
    unsafe { bpf_probe_read_kernel(base.wrapping_add(global(offset) as usize).cast::<T>()) }
}
