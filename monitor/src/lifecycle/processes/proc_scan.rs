//! `/proc` as a source of truth about which watched processes run: what the kernel's reports
//! cannot tell (processes running before the agent, a daemon's child, a lost report).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::Path,
};

/// Where processes are listed.
pub(super) const PROC: &str = "/proc";

/// How deep a process's PID namespace is below the root's: the number of pids it has, one per
/// namespace level (`NSpid:` in `/proc/<pid>/status`, readable without privileges). 1 is the
/// host's namespace; a process in a pod's namespace has 2 or more.
pub(super) fn pid_ns_depth(status: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(status).ok()?;
    let line = text.lines().find_map(|line| line.strip_prefix("NSpid:"))?;
    let depth = line.split_whitespace().count();
    (depth > 0).then_some(depth)
}

/// The depth of the agent's own PID namespace (see [`pid_ns_depth`]).
pub(super) fn own_pid_ns_depth(proc_root: &Path) -> Option<usize> {
    pid_ns_depth(&fs::read(proc_root.join("self").join("status")).ok()?)
}

/// Pids of live (non-zombie) processes whose name is one of `names`, by name. With
/// `depth`, only processes in a PID namespace that deep: the agent's own, as /proc lists only
/// the agent's namespace and those below it (pods' processes, when the agent runs with the
/// host's).
pub(super) fn scan_proc(
    proc_root: &Path,
    names: &[String],
    depth: Option<usize>,
) -> io::Result<BTreeMap<String, BTreeSet<u32>>> {
    let mut found: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    if names.is_empty() {
        return Ok(found);
    }
    for entry in fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        // Numeric entries are processes (thread group ids); threads hide under task/.
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        // Processes vanish during a scan: that is normal, skip them.
        let Ok(stat) = fs::read(entry.path().join("stat")) else { continue };
        let Some((comm, state)) = parse_stat(&stat) else { continue };
        // A zombie has exited already; its parent just has not reaped it.
        if matches!(state, b'Z' | b'X' | b'x') {
            continue;
        }
        let comm = String::from_utf8_lossy(comm);
        let Some(name) = names.iter().find(|name| **name == comm) else { continue };
        if let Some(depth) = depth {
            let status = fs::read(entry.path().join("status")).unwrap_or_default();
            if pid_ns_depth(&status) != Some(depth) {
                continue;
            }
        }
        found.entry(name.clone()).or_default().insert(pid);
    }
    Ok(found)
}

/// (comm, state) from `/proc/<pid>/stat`: `pid (comm) S ppid …`, where comm may itself
/// contain spaces and parentheses.
fn parse_stat(stat: &[u8]) -> Option<(&[u8], u8)> {
    let open = stat.iter().position(|b| *b == b'(')?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    let comm = stat.get(open + 1..close)?;
    let state = *stat.get(close + 1..)?.iter().find(|b| !b.is_ascii_whitespace())?;
    Some((comm, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse() {
        assert_eq!(parse_stat(b"1234 (ovs-vswitchd) S 1 1234 1234 0 -1"), Some((&b"ovs-vswitchd"[..], b'S')));
        assert_eq!(parse_stat(b"7 (a) b (c)) Z 1 7"), Some((&b"a) b (c)"[..], b'Z')));
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x)"), None);
    }

    #[test]
    fn proc_scans_find_live_processes_by_name() {
        let root = std::env::temp_dir().join(format!("dm-proc-scan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (pid, stat) in [
            ("100", "100 (ovs-vswitchd) S 1 100"),
            ("101", "101 (ovs-vswitchd) Z 1 101"),
            ("102", "102 (ovsdb-server) R 1 102"),
            ("103", "103 (bash) S 1 103"),
            ("self", "104 (ovs-vswitchd) S 1 104"),
        ] {
            fs::create_dir_all(root.join(pid)).unwrap();
            fs::write(root.join(pid).join("stat"), stat).unwrap();
        }
        // A process that vanished between readdir and read.
        fs::create_dir_all(root.join("105")).unwrap();
        // A pod's process of a watched name: two pids, one per namespace level.
        fs::create_dir_all(root.join("106")).unwrap();
        fs::write(root.join("106").join("stat"), "106 (ovs-vswitchd) S 1 106").unwrap();
        fs::write(root.join("106").join("status"), "Name:\tovs-vswitchd\nNSpid:\t106\t7\n").unwrap();
        for pid in ["100", "102"] {
            fs::write(root.join(pid).join("status"), format!("Name:\tx\nNSpid:\t{pid}\n")).unwrap();
        }
        let names = vec!["ovs-vswitchd".to_string(), "ovsdb-server".to_string(), "flanneld".to_string()];
        let host_only = scan_proc(&root, &names, Some(1)).unwrap();
        let all = scan_proc(&root, &names, None).unwrap();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            host_only,
            BTreeMap::from([
                ("ovs-vswitchd".to_string(), BTreeSet::from([100])),
                ("ovsdb-server".to_string(), BTreeSet::from([102]))
            ])
        );
        assert_eq!(all["ovs-vswitchd"], BTreeSet::from([100, 106]));
    }

    #[test]
    fn pid_namespace_depth_comes_from_nspid() {
        assert_eq!(pid_ns_depth(b"Name:\tsleep\nNSpid:\t4242\nNSsid:\t1\n"), Some(1));
        assert_eq!(pid_ns_depth(b"Name:\tsleep\nNSpid:\t4242\t1\n"), Some(2));
        assert_eq!(pid_ns_depth(b"Name:\tsleep\n"), None);
        assert_eq!(pid_ns_depth(b"NSpid:\n"), None);
        assert!(own_pid_ns_depth(Path::new(PROC)).is_some_and(|depth| depth >= 1));
    }

    #[test]
    fn this_machine_proc_scan_finds_this_process() {
        let Ok(comm) = fs::read_to_string("/proc/self/comm") else { return };
        let comm = comm.trim_end_matches('\n').to_string();
        let depth = own_pid_ns_depth(Path::new(PROC));
        let found = scan_proc(Path::new(PROC), std::slice::from_ref(&comm), depth).unwrap();
        assert!(found.get(&comm).is_some_and(|pids| pids.contains(&std::process::id())), "{comm}: {found:?}");
    }
}
