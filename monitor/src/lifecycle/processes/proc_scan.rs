//! `/proc` as a source of truth about which watched processes run: what the kernel's reports
//! cannot tell (processes running before the agent, a daemon's child, a lost report).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::Path,
};

/// Where processes are listed.
pub(super) const PROC: &str = "/proc";

/// Pids of live (non-zombie) processes whose name is one of `names`, by name.
pub(super) fn scan_proc(proc_root: &Path, names: &[String]) -> io::Result<BTreeMap<String, BTreeSet<u32>>> {
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
        if let Some(name) = names.iter().find(|name| **name == comm) {
            found.entry(name.clone()).or_default().insert(pid);
        }
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
        let names = vec!["ovs-vswitchd".to_string(), "ovsdb-server".to_string(), "flanneld".to_string()];
        let found = scan_proc(&root, &names).unwrap();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            found,
            BTreeMap::from([
                ("ovs-vswitchd".to_string(), BTreeSet::from([100])),
                ("ovsdb-server".to_string(), BTreeSet::from([102]))
            ])
        );
    }

    #[test]
    fn this_machine_proc_scan_finds_this_process() {
        let Ok(comm) = fs::read_to_string("/proc/self/comm") else { return };
        let comm = comm.trim_end_matches('\n').to_string();
        let found = scan_proc(Path::new(PROC), std::slice::from_ref(&comm)).unwrap();
        assert!(found.get(&comm).is_some_and(|pids| pids.contains(&std::process::id())), "{comm}: {found:?}");
    }
}
