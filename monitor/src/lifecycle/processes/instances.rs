//! Instances of one comm: OVN-Kubernetes runs three `ovsdb-server`s (OVS's `conf.db`, OVN's
//! northbound and southbound databases), and "ovsdb-server restarted" does not say which.
//! A process of an instanced comm is named `comm(instance)`, the instance read from its
//! command line: the database file's stem (`conf`, `ovnnb_db`, `ovnsb_db`), else its
//! `--pidfile`'s or `--unixctl`'s. Labels stay bounded: at most [`MAX_INSTANCES`] per comm,
//! later ones are `comm(other)`.

use std::{collections::BTreeMap, fs, path::Path};

/// Comms whose processes are told apart by instance.
const INSTANCED: [&str; 1] = ["ovsdb-server"];
/// Distinct instances per comm; more are named `comm(other)`.
pub(super) const MAX_INSTANCES: usize = 8;
/// Longest instance label kept.
const MAX_LABEL: usize = 32;

/// Whether `comm`'s processes are named by instance.
pub(super) fn is_instanced(comm: &str) -> bool {
    INSTANCED.contains(&comm)
}

/// The instance label in a command line (NUL-separated, as in `/proc/<pid>/cmdline`).
fn label_from_cmdline(cmdline: &[u8]) -> Option<String> {
    let args: Vec<String> =
        cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let stem = |path: &str| -> Option<String> {
        let name = Path::new(path).file_name()?.to_str()?;
        let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
        let clean: String = stem
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            .take(MAX_LABEL)
            .collect();
        (!clean.is_empty()).then_some(clean)
    };
    let database = args.iter().skip(1).find(|a| !a.starts_with('-') && a.ends_with(".db"));
    let option = |name: &str| {
        args.iter().find_map(|a| a.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')).map(str::to_string))
    };
    database.and_then(|d| stem(d)).or_else(|| option("--pidfile").and_then(|p| stem(&p))).or_else(|| {
        // `--unixctl=/var/run/ovn/ovnnb_db.ctl`; `punix:` remotes are sockets of any name.
        option("--unixctl").and_then(|p| stem(&p))
    })
}

/// Names processes of instanced comms, keeping the labels bounded.
#[derive(Clone, Debug, Default)]
pub(super) struct InstanceNames {
    /// Labels given so far, per comm.
    seen: BTreeMap<String, Vec<String>>,
}

impl InstanceNames {
    /// The name of process `pid` of `comm`: `comm` itself, or `comm(instance)` for an
    /// instanced comm whose command line names one (read under `proc_root`; a process
    /// already gone, a kernel thread or an unreadable command line gives `comm`).
    pub(super) fn name(&mut self, proc_root: &Path, comm: &str, pid: u32) -> String {
        if !is_instanced(comm) {
            return comm.to_string();
        }
        let cmdline = fs::read(proc_root.join(pid.to_string()).join("cmdline")).unwrap_or_default();
        match label_from_cmdline(&cmdline) {
            Some(label) => self.bounded(comm, label),
            None => comm.to_string(),
        }
    }

    fn bounded(&mut self, comm: &str, label: String) -> String {
        let labels = self.seen.entry(comm.to_string()).or_default();
        if labels.contains(&label) || labels.len() < MAX_INSTANCES {
            if !labels.contains(&label) {
                labels.push(label.clone());
            }
            format!("{comm}({label})")
        } else {
            format!("{comm}(other)")
        }
    }
}

/// The comm of a process name: `ovsdb-server(ovnnb_db)` → `ovsdb-server`.
pub fn comm_of(name: &str) -> &str {
    match name.split_once('(') {
        Some((comm, rest)) if rest.ends_with(')') && !comm.is_empty() => comm,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(args: &[&str]) -> Vec<u8> {
        args.iter().flat_map(|a| a.bytes().chain([0])).collect()
    }

    #[test]
    fn instance_labels_come_from_the_database_the_pidfile_or_the_control_socket() {
        let ovs = cmdline(&[
            "ovsdb-server",
            "/etc/openvswitch/conf.db",
            "-vconsole:emer",
            "--remote=punix:/var/run/openvswitch/db.sock",
            "--pidfile=/var/run/openvswitch/ovsdb-server.pid",
            "--detach",
        ]);
        assert_eq!(label_from_cmdline(&ovs).as_deref(), Some("conf"));
        let nb = cmdline(&[
            "ovsdb-server",
            "-vconsole:off",
            "--pidfile=/var/run/ovn/ovnnb_db.pid",
            "--unixctl=/var/run/ovn/ovnnb_db.ctl",
            "--remote=punix:/var/run/ovn/ovnnb_db.sock",
            "/etc/ovn/ovnnb_db.db",
        ]);
        assert_eq!(label_from_cmdline(&nb).as_deref(), Some("ovnnb_db"));
        let pidfile_only = cmdline(&["ovsdb-server", "--pidfile=/run/ovn/ovnsb_db.pid"]);
        assert_eq!(label_from_cmdline(&pidfile_only).as_deref(), Some("ovnsb_db"));
        let unixctl_only = cmdline(&["ovsdb-server", "--unixctl=/run/x/sb.ctl"]);
        assert_eq!(label_from_cmdline(&unixctl_only).as_deref(), Some("sb"));
        assert_eq!(label_from_cmdline(&cmdline(&["ovsdb-server", "--detach"])), None);
        assert_eq!(label_from_cmdline(b""), None);
        // Odd characters never reach a label.
        let odd = cmdline(&["ovsdb-server", "/tmp/a b\"{}.db"]);
        assert_eq!(label_from_cmdline(&odd).as_deref(), Some("ab"));
    }

    #[test]
    fn labels_are_bounded_per_comm() {
        let mut names = InstanceNames::default();
        for i in 0..MAX_INSTANCES {
            assert_eq!(names.bounded("ovsdb-server", format!("db{i}")), format!("ovsdb-server(db{i})"));
        }
        assert_eq!(names.bounded("ovsdb-server", "db0".into()), "ovsdb-server(db0)");
        assert_eq!(names.bounded("ovsdb-server", "late".into()), "ovsdb-server(other)");
    }

    #[test]
    fn names_of_live_processes_and_of_other_comms() {
        let mut names = InstanceNames::default();
        let root = std::env::temp_dir().join(format!("dm-instances-{}", std::process::id()));
        fs::create_dir_all(root.join("42")).unwrap();
        fs::write(root.join("42/cmdline"), cmdline(&["ovsdb-server", "/etc/ovn/ovnsb_db.db"])).unwrap();
        assert_eq!(names.name(&root, "ovsdb-server", 42), "ovsdb-server(ovnsb_db)");
        // Gone before its command line was read: the comm alone.
        assert_eq!(names.name(&root, "ovsdb-server", 43), "ovsdb-server");
        assert_eq!(names.name(&root, "ovs-vswitchd", 42), "ovs-vswitchd");
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(comm_of("ovsdb-server(ovnsb_db)"), "ovsdb-server");
        assert_eq!(comm_of("ovs-vswitchd"), "ovs-vswitchd");
        assert_eq!(comm_of("(x)"), "(x)");
    }
}
