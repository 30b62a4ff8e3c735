//! Building, describing and tearing down the lab node: the node netns, the private OVS instance
//! and its bridge, the pods and their veths, the CNI cache, and the daemons.

use std::{
    fmt::Write as _,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, bail, ensure};
use jiff::Timestamp;
use nix::sys::signal::Signal;

use crate::{
    BRIDGE, Datapath, GATEWAY, Lab, LabOptions, LabPod, NETNS_PREFIX, NODE_NETNS, PREFIX, Probe, ROOT, TUN, cni,
    datapath,
    probe_log::{self, UdpSecond},
    sdn,
    sys::{self, Daemon, OvsDirs},
};

/// The pods: (short name, namespace, pod, IP).
const PODS: [(&str, &str, &str, &str); 3] = [
    ("apiserver", "openshift-apiserver", "apiserver-zg25k", "10.129.0.43"),
    ("web", "web", "web-1", "10.129.0.44"),
    ("client", "client", "client-1", "10.129.0.45"),
];

/// Tools the lab runs, and the Debian package that brings each.
const TOOLS: [(&str, &str); 11] = [
    ("ovs-vsctl", "openvswitch-switch"),
    ("ovs-ofctl", "openvswitch-switch"),
    ("ovsdb-tool", "openvswitch-switch"),
    ("ovsdb-server", "openvswitch-switch"),
    ("ovs-vswitchd", "openvswitch-switch"),
    ("ethtool", "ethtool"),
    ("ip", "iproute2"),
    ("iptables", "iptables"),
    ("setsid", "util-linux"),
    ("ovs-appctl", "openvswitch-switch"),
    ("ovs-dpctl", "openvswitch-switch"),
];

/// The niceness `ovs-ctl` gives ovsdb-server and ovs-vswitchd (`--ovs-vswitchd-priority`).
const OVS_NICENESS: &str = "-10";
/// The daemons the lab starts itself, by pid-file name.
const DAEMONS: [&str; 5] = ["serve-healthz", "udp-echo", "sdn", "udp-client", "prober"];

/// The tools that are missing.
fn missing_tools() -> Vec<(&'static str, &'static str)> {
    TOOLS.into_iter().filter(|(tool, _)| !sys::have(tool)).collect()
}

/// Checks the tools, installing missing packages with apt-get when it can.
fn ensure_tools() -> anyhow::Result<()> {
    let missing = missing_tools();
    if missing.is_empty() {
        return Ok(());
    }
    let mut packages: Vec<&str> = missing.iter().map(|(_, package)| *package).collect();
    packages.sort();
    packages.dedup();
    if sys::have("apt-get") {
        eprintln!("dm-lab: installing {}", packages.join(" "));
        let status = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status();
        if let Err(error) = status {
            eprintln!("dm-lab: apt-get failed: {error}");
        }
    }
    let missing = missing_tools();
    if !missing.is_empty() {
        let tools: Vec<String> = missing.iter().map(|(tool, package)| format!("{tool} (package {package})")).collect();
        bail!("the lab needs {}: install them (e.g. `cargo xtask setup`)", tools.join(", "));
    }
    Ok(())
}

impl Lab {
    /// The lab description a fresh build at [`ROOT`] would have.
    fn planned(root: &Path, datapath: Datapath) -> Self {
        let pods = PODS
            .iter()
            .map(|(name, namespace, pod, ip)| LabPod {
                name: name.to_string(),
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                netns: format!("{NETNS_PREFIX}pod-{name}"),
                veth: cni::veth_name(namespace, pod),
                ip: ip.to_string(),
            })
            .collect();
        Lab {
            root: root.to_path_buf(),
            cni_dir: root.join("cni/net.d"),
            cni_cache_dir: root.join("cni/results"),
            pods,
            bin: root.join("bin/dm-lab"),
            sdn_bin: root.join("bin/openshift-sdn-node"),
            created: Timestamp::now(),
            datapath,
            probe_period_ms: crate::DEFAULT_PROBE_PERIOD.as_millis() as u64,
            roles: crate::Roles::default(),
        }
    }

    /// The state file describing the running lab.
    pub fn state_file(&self) -> PathBuf {
        self.root.join("state.json")
    }

    /// Pid files of the lab's own daemons.
    pub fn pids_dir(&self) -> PathBuf {
        self.root.join("pids")
    }

    /// Daemon logs.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// The prober's JSON-lines log.
    pub fn prober_log(&self) -> PathBuf {
        self.root.join("prober.jsonl")
    }

    /// The UDP client's per-second JSON-lines log.
    pub fn udp_log(&self) -> PathBuf {
        self.root.join("udp-client.jsonl")
    }

    /// The sdn's event log.
    pub fn sdn_events_log(&self) -> PathBuf {
        self.root.join("sdn-events.jsonl")
    }

    /// The CNI config the sdn writes when ready.
    pub fn cni_config_path(&self) -> PathBuf {
        self.cni_dir.join(cni::CONFIG_FILE)
    }

    /// The agent's state dir in the lab.
    pub fn agent_state_dir(&self) -> PathBuf {
        self.root.join("agent-state")
    }

    /// The lab's private OVS instance.
    pub fn ovs(&self) -> OvsDirs {
        OvsDirs::new(&self.root)
    }

    /// The pod with short name `name`.
    pub fn pod(&self, name: &str) -> Option<&LabPod> {
        self.pods.iter().find(|pod| pod.name == name)
    }

    /// The lab pod with short name `name`, or an error naming it.
    pub(crate) fn pod_named(&self, name: &str) -> anyhow::Result<&LabPod> {
        self.pod(name).with_context(|| format!("no pod {name}"))
    }

    /// The live pid of lab daemon `name` (`sdn`, `prober`, ...).
    pub fn daemon_pid(&self, name: &str) -> Option<i32> {
        sys::read_pid(&self.pids_dir().join(format!("{name}.pid"))).filter(|pid| sys::alive(*pid))
    }

    /// Stops lab daemon `name` (SIGTERM, SIGKILL after 2 s) and removes its pid file; idempotent.
    pub(crate) fn stop_daemon(&self, name: &str) {
        if let Some(pid) = self.daemon_pid(name) {
            sys::stop(pid, Duration::from_secs(2));
        }
        let _ = fs::remove_file(self.pids_dir().join(format!("{name}.pid")));
    }

    /// Writes the state file describing this lab.
    pub(crate) fn write_state(&self) -> anyhow::Result<()> {
        fs::write(self.state_file(), serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", self.state_file().display()))
    }

    /// The live pid of OVS daemon `name` (`ovsdb-server`, `ovs-vswitchd`).
    pub fn ovs_pid(&self, name: &str) -> Option<i32> {
        sys::read_pid(&self.ovs().pidfile(name)).filter(|pid| sys::alive(*pid))
    }

    /// Reads the state file of the lab at `root`.
    pub fn load(root: &Path) -> anyhow::Result<Lab> {
        let path = root.join("state.json");
        let text = fs::read_to_string(&path)
            .with_context(|| format!("no lab is running ({} unreadable): run `dm-lab up` first", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a lab state file", path.display()))
    }

    /// The running lab (from its state file), or an error saying `lab up` first.
    pub fn attach() -> anyhow::Result<Lab> {
        Self::load(Path::new(ROOT))
    }

    /// Installs/checks what it needs (ovs binaries, ethtool, iproute2, iptables), tears down
    /// leftovers, builds everything and checks that the prober reaches the apiserver pod and the
    /// client's UDP echoes come back. `dm_lab_bin` is the built dm-lab binary to run daemons from.
    /// On failure the half-built lab is left for inspection (`dm-lab status`, logs under
    /// [`ROOT`]); `dm-lab down` removes it.
    pub fn up(dm_lab_bin: &Path) -> anyhow::Result<Lab> {
        Self::up_on(dm_lab_bin, Datapath::Userspace)
    }

    /// [`Lab::up`] on OVS's `datapath`. On the kernel datapath it loads `openvswitch.ko`, waits
    /// out OVS 3.1.0's CPU-count bug right after boot (see [`datapath`]) and checks the switch's
    /// health (upcall handlers, no upcall lost) besides the probes.
    pub fn up_on(dm_lab_bin: &Path, datapath: Datapath) -> anyhow::Result<Lab> {
        Self::up_with(dm_lab_bin, LabOptions { datapath, ..LabOptions::default() })
    }

    /// [`Lab::up_on`] with every build option.
    pub fn up_with(dm_lab_bin: &Path, options: LabOptions) -> anyhow::Result<Lab> {
        let LabOptions { datapath, probe_period } = options;
        ensure!(
            (Duration::from_millis(50)..=Duration::from_secs(60)).contains(&probe_period),
            "the probe period must be between 50 ms and 60 s (got {probe_period:?})"
        );
        if !dm_lab_bin.is_file() {
            bail!("dm-lab binary {} not found (build it first)", dm_lab_bin.display());
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            bail!("the lab needs root (network namespaces, OVS)");
        }
        ensure_tools()?;
        if datapath == Datapath::Kernel {
            datapath::load_module()?;
        }
        Self::down()?;
        let mut lab = Self::planned(Path::new(ROOT), datapath);
        lab.probe_period_ms = probe_period.as_millis() as u64;
        lab.build(dm_lab_bin)
            .context("building the lab failed (its logs are under /run/dm-lab/logs; `dm-lab down` cleans up)")?;
        Ok(lab)
    }

    fn build(&self, dm_lab_bin: &Path) -> anyhow::Result<()> {
        let ovs = self.ovs();
        for dir in [
            self.root.join("bin"),
            self.pids_dir(),
            self.logs_dir(),
            self.cni_dir.clone(),
            self.cni_cache_dir.clone(),
            self.agent_state_dir(),
            ovs.run.clone(),
            ovs.db.clone(),
            ovs.log.clone(),
            ovs.etc.clone(),
        ] {
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        fs::copy(dm_lab_bin, &self.bin)
            .with_context(|| format!("copying {} to {}", dm_lab_bin.display(), self.bin.display()))?;
        fs::set_permissions(&self.bin, fs::Permissions::from_mode(0o755))?;
        if fs::hard_link(&self.bin, &self.sdn_bin).is_err() {
            fs::copy(&self.bin, &self.sdn_bin).with_context(|| format!("creating {}", self.sdn_bin.display()))?;
        }

        // The node: its netns and the private OVS instance (tap devices land in the node netns).
        sys::run(Command::new("ip").args(["netns", "add", NODE_NETNS]))?;
        sys::run(Command::new("ip").args(["-n", NODE_NETNS, "link", "set", "lo", "up"]))?;
        let db = ovs.db.join("conf.db");
        sys::run(Command::new("ovsdb-tool").arg("create").arg(&db))?;
        self.start_ovsdb_server()?;
        ovs.vsctl(&["--no-wait", "init"])?;
        self.start_vswitchd()?;
        let datapath_type = match self.datapath {
            Datapath::Userspace => "datapath_type=netdev",
            Datapath::Kernel => "datapath_type=system",
        };
        ovs.vsctl(&[
            "add-br",
            BRIDGE,
            "--",
            "set",
            "Bridge",
            BRIDGE,
            datapath_type,
            "fail_mode=secure",
            "--",
            "add-port",
            BRIDGE,
            TUN,
            "--",
            "set",
            "Interface",
            TUN,
            "type=internal",
        ])?;
        sys::wait_for(Duration::from_secs(5), || sys::ip_in(NODE_NETNS, &["link", "show", TUN]).ok())
            .with_context(|| format!("{TUN} did not appear in netns {NODE_NETNS}"))?;
        let gateway = format!("{GATEWAY}/{PREFIX}");
        sys::ip_in(NODE_NETNS, &["addr", "replace", &gateway, "dev", TUN])?;
        sys::ip_in(NODE_NETNS, &["link", "set", TUN, "up"])?;
        sys::run(sys::in_netns(NODE_NETNS, "ethtool").args(["-K", TUN, "tx", "off"]))?;

        // The pods.
        for pod in &self.pods {
            self.build_pod(pod)?;
        }
        self.write_state()?;

        // The daemons: the probed pod's /healthz, the UDP echo, the sdn, the UDP client, the prober.
        self.start_servers()?;
        let sdn = self.start_sdn(&[])?;
        let comm = sys::comm(sdn).unwrap_or_default();
        if comm != "openshift-sdn-n" {
            bail!("the sdn (pid {sdn}) has comm {comm:?}, not \"openshift-sdn-n\"");
        }
        sys::wait_for(Duration::from_secs(15), || self.cni_config_path().exists().then_some(())).with_context(
            || {
                format!(
                    "the sdn did not write {} within 15 s; its log ends with:\n{}",
                    self.cni_config_path().display(),
                    sys::tail(&self.logs_dir().join("sdn.log"), 10)
                )
            },
        )?;
        self.start_clients()?;
        self.check_datapath()?;
        Ok(())
    }

    /// On the kernel datapath: upcall handlers exist and no upcall is lost over a second; a
    /// clear error otherwise. The lab checks it after building and before every replay.
    pub fn check_datapath(&self) -> anyhow::Result<()> {
        if self.datapath == Datapath::Kernel {
            let pid = self.ovs_pid("ovs-vswitchd").context("the lab's ovs-vswitchd is not running")?;
            datapath::check_health(pid, Duration::from_secs(1)).context("the lab's kernel datapath is unhealthy")?;
        }
        Ok(())
    }

    fn build_pod(&self, pod: &LabPod) -> anyhow::Result<()> {
        sys::run(Command::new("ip").args(["netns", "add", &pod.netns]))?;
        sys::ip_in(
            NODE_NETNS,
            &["link", "add", &pod.veth, "type", "veth", "peer", "name", cni::POD_IFNAME, "netns", &pod.netns],
        )?;
        sys::ip_in(NODE_NETNS, &["link", "set", &pod.veth, "up"])?;
        let address = format!("{}/{PREFIX}", pod.ip);
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["link", "set", cni::POD_IFNAME, "up"],
            vec!["addr", "add", &address, "dev", cni::POD_IFNAME],
            vec!["route", "add", "default", "via", GATEWAY],
        ] {
            sys::ip_in(&pod.netns, &args)?;
        }
        sys::run(sys::in_netns(&pod.netns, "ethtool").args(["-K", cni::POD_IFNAME, "tx", "off"]))?;
        self.ovs().vsctl(&["add-port", BRIDGE, &pod.veth])?;
        let entry = cni::cache_entry(&cni::CacheEntry {
            namespace: &pod.namespace,
            pod: &pod.pod,
            veth: &pod.veth,
            netns: &pod.netns,
            ip: &pod.ip,
            prefix: PREFIX,
            gateway: GATEWAY,
        });
        let id = cni::container_id(&pod.namespace, &pod.pod);
        let path = self.cni_cache_dir.join(cni::cache_file_name(&id));
        sys::write_atomic(&path, &self.root, &serde_json::to_string(&entry)?)
    }

    /// Starts a lab daemon (from `program`, in `netns`) and returns its pid.
    pub(crate) fn spawn(&self, name: &str, netns: &str, program: &Path, args: &[&str]) -> anyhow::Result<i32> {
        let daemon = Daemon { name, netns, program, args: args.iter().map(|arg| arg.to_string()).collect() };
        sys::spawn_daemon(&daemon, &self.pids_dir(), &self.logs_dir(), &[])
    }

    /// Starts a new sdn (`openshift-sdn-node sdn --root <root> <extra>`) in the node netns.
    pub(crate) fn start_sdn(&self, extra: &[&str]) -> anyhow::Result<i32> {
        let root = self.root.to_string_lossy().into_owned();
        let mut args = vec!["sdn", "--root", &root];
        args.extend_from_slice(extra);
        self.spawn("sdn", NODE_NETNS, &self.sdn_bin, &args)
    }

    /// Runs an OVS daemon with `--detach` in the node netns (it returns once the daemon is up).
    fn start_ovs_daemon(&self, name: &str, args: &[String]) -> anyhow::Result<i32> {
        let ovs = self.ovs();
        let pidfile = ovs.pidfile(name);
        let _ = fs::remove_file(&pidfile);
        let out_path = self.logs_dir().join(format!("{name}.out"));
        let out = fs::OpenOptions::new().create(true).append(true).open(&out_path)?;
        // At nice -10, as `ovs-ctl` (and so the distributions' units) starts both daemons: a
        // userspace datapath that waits behind busy neighbours for the CPU holds packets back
        // for hundreds of milliseconds, loss to the agent and to nobody else (seen here while
        // both test guests kept the two cores busy).
        let mut command = sys::in_netns(NODE_NETNS, "nice");
        command.args(["-n", OVS_NICENESS, name]);
        ovs.env(&mut command)
            .args(args)
            .arg(format!("--pidfile={}", pidfile.display()))
            .arg(format!("--log-file={}", ovs.log.join(format!("{name}.log")).display()))
            .args(["--detach", "--no-chdir", "-vconsole:off"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let status = command.status().with_context(|| format!("cannot run {name}"))?;
        if !status.success() {
            bail!("{name} failed to start ({status}); see {} and {}", out_path.display(), ovs.log.display());
        }
        sys::wait_for(Duration::from_secs(5), || sys::read_pid(&pidfile).filter(|pid| sys::alive(*pid)))
            .with_context(|| format!("{name} wrote no live pid to {}", pidfile.display()))
    }

    fn start_ovsdb_server(&self) -> anyhow::Result<i32> {
        let ovs = self.ovs();
        self.start_ovs_daemon(
            "ovsdb-server",
            &[
                ovs.db.join("conf.db").to_string_lossy().into_owned(),
                format!("--remote=punix:{}", ovs.db_sock().display()),
                format!("--unixctl={}", ovs.run.join("ovsdb-server.ctl").display()),
            ],
        )
    }

    /// Starts the lab's ovs-vswitchd; returns its pid.
    pub(crate) fn start_vswitchd(&self) -> anyhow::Result<i32> {
        if self.datapath == Datapath::Kernel {
            datapath::wait_for_cpu_count()?;
        }
        self.start_ovs_daemon("ovs-vswitchd", &[format!("unix:{}", self.ovs().db_sock().display())])
    }

    /// Stops the lab's ovs-vswitchd (SIGTERM, SIGKILL after 5 s); returns the pid it had.
    pub(crate) fn stop_vswitchd(&self) -> anyhow::Result<i32> {
        let pid = self.ovs_pid("ovs-vswitchd").context("the lab's ovs-vswitchd is not running")?;
        sys::stop(pid, Duration::from_secs(5));
        Ok(pid)
    }

    /// Removes every lab object: processes (by pid file and by scanning /proc for anything run
    /// from or pointing at the lab root), the `dml-*` network namespaces and the lab root.
    /// Idempotent.
    pub fn down() -> anyhow::Result<()> {
        let root = Path::new(ROOT);
        let mut pids: Vec<i32> = Vec::new();
        for dir in [root.join("pids"), OvsDirs::new(root).run] {
            if let Ok(entries) = fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    if entry.path().extension().is_some_and(|ext| ext == "pid")
                        && let Some(pid) = sys::read_pid(&entry.path())
                    {
                        pids.push(pid);
                    }
                }
            }
        }
        pids.extend(sys::processes_under(root));
        let own = std::process::id() as i32;
        pids.retain(|pid| *pid != own && sys::alive(*pid));
        pids.sort_unstable();
        pids.dedup();
        for pid in &pids {
            sys::signal(*pid, Signal::SIGTERM);
        }
        for pid in &pids {
            if !sys::wait_exit(*pid, Duration::from_secs(3)) {
                sys::signal(*pid, Signal::SIGKILL);
            }
        }
        // Anything still there (or started meanwhile) gets SIGKILL.
        for pid in sys::processes_under(root) {
            sys::signal(pid, Signal::SIGKILL);
            sys::wait_exit(pid, Duration::from_secs(2));
        }
        let mut errors = Vec::new();
        for netns in sys::netns_with_prefix(NETNS_PREFIX) {
            if let Err(error) = sys::run(Command::new("ip").args(["netns", "delete", &netns])) {
                errors.push(format!("{error:#}"));
            }
        }
        if root.exists()
            && let Err(error) = fs::remove_dir_all(root)
        {
            errors.push(format!("removing {}: {error}", root.display()));
        }
        if !errors.is_empty() {
            bail!("lab teardown incomplete: {}", errors.join("; "));
        }
        Ok(())
    }

    /// Human-readable: processes (pids alive?), bridge ports and flow count, pods, prober's last
    /// result, CNI config present.
    pub fn status(&self) -> anyhow::Result<String> {
        let mut out = String::new();
        let ovs = self.ovs();
        writeln!(out, "lab at {} (built {:.0}), OVS {} datapath", self.root.display(), self.created, self.datapath)?;
        writeln!(out, "processes:")?;
        for name in ["ovsdb-server", "ovs-vswitchd"] {
            let pid = sys::read_pid(&ovs.pidfile(name));
            writeln!(out, "  {name:<14} {}", describe_pid(pid))?;
        }
        for name in DAEMONS {
            let pid = sys::read_pid(&self.pids_dir().join(format!("{name}.pid")));
            let comm = pid.filter(|pid| sys::alive(*pid)).and_then(sys::comm).map(|comm| format!(" comm {comm}"));
            writeln!(out, "  {name:<14} {}{}", describe_pid(pid), comm.unwrap_or_default())?;
        }
        let ports =
            ovs.vsctl(&["list-ports", BRIDGE]).map(|ports| ports.split_whitespace().collect::<Vec<_>>().join(" "));
        writeln!(out, "bridge {BRIDGE}: ports {}", ports.unwrap_or_else(|error| format!("unknown ({error:#})")))?;
        let flows = sdn::count_flows(&ovs);
        writeln!(
            out,
            "flows: {} of {} expected",
            flows.map_or_else(|error| format!("unknown ({error:#})"), |n| n.to_string()),
            sdn::expected_flows(self)
        )?;
        if self.datapath == Datapath::Kernel {
            let handlers = self.ovs_pid("ovs-vswitchd").map_or(0, datapath::handler_threads);
            match datapath::stats() {
                Ok(s) => writeln!(
                    out,
                    "kernel datapath: lookups hit:{} missed:{} lost:{}, {} flows, {handlers} upcall handler threads",
                    s.hit, s.missed, s.lost, s.flows
                )?,
                Err(error) => writeln!(out, "kernel datapath: unknown ({error:#})")?,
            }
        }
        writeln!(out, "pods:")?;
        for pod in &self.pods {
            writeln!(out, "  {}/{} ip {} netns {} veth {}", pod.namespace, pod.pod, pod.ip, pod.netns, pod.veth)?;
        }
        let config = self.cni_config_path();
        writeln!(out, "CNI config {}: {}", config.display(), if config.exists() { "present" } else { "MISSING" })?;
        match self.probes(None)?.last() {
            Some(probe) => writeln!(
                out,
                "prober: last probe {:.3} {}",
                probe.at,
                if probe.ok { "ok".to_string() } else { format!("FAILED: {}", probe.error.as_deref().unwrap_or("?")) }
            )?,
            None => writeln!(out, "prober: no probes yet")?,
        }
        let udp = probe_log::parse_udp(&fs::read_to_string(self.udp_log()).unwrap_or_default());
        match udp.last() {
            Some(UdpSecond { at, sent, received, .. }) => {
                write!(out, "udp client→web: last second {at:.0}: {sent} sent, {received} echoed")?
            }
            None => write!(out, "udp client→web: no data yet")?,
        }
        Ok(out)
    }

    /// Flags that point datapath-monitor at the lab: `--cni-dir`, `--cni-cache-dir`,
    /// `--state-dir <root>/agent-state` (the agent itself runs in [`NODE_NETNS`], started by the
    /// caller).
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "--cni-dir".into(),
            self.cni_dir.to_string_lossy().into_owned(),
            "--cni-cache-dir".into(),
            self.cni_cache_dir.to_string_lossy().into_owned(),
            "--state-dir".into(),
            self.agent_state_dir().to_string_lossy().into_owned(),
        ]
    }

    /// Every probe result since `since` (all when None).
    pub fn probes(&self, since: Option<Timestamp>) -> anyhow::Result<Vec<Probe>> {
        probe_log::read_probes(&self.prober_log(), since)
    }
}

fn describe_pid(pid: Option<i32>) -> String {
    match pid {
        Some(pid) if sys::alive(pid) => format!("pid {pid} alive"),
        Some(pid) => format!("pid {pid} DEAD"),
        None => "not started".to_string(),
    }
}
