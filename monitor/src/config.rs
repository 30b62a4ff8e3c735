//! The agent's configuration: CLI flags, `DATAPATH_MONITOR_*` environment variables and a
//! TOML file, in that order of precedence, over the defaults in [`Config::default`].

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::{
    datapath::{DatapathOptions, DisabledProbe, DropTracerChoice, TcAttachChoice, process_probe::comm_key},
    sampling::InterfaceFilter,
};

#[derive(Debug, Parser)]
#[command(name = "datapath-monitor", version, about = "Node-level eBPF datapath continuity monitor")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: attach to watched interfaces and serve metrics and the API.
    Run(Box<RunArgs>),
    /// Print recent incidents from a running agent.
    Incidents {
        #[arg(long, env = "DATAPATH_MONITOR_SERVER", default_value = DEFAULT_SERVER)]
        server: String,
        #[arg(long)]
        json: bool,
    },
    /// Print attached interfaces, programs and lifecycle state from a running agent.
    Status {
        #[arg(long, env = "DATAPATH_MONITOR_SERVER", default_value = DEFAULT_SERVER)]
        server: String,
    },
    /// Detach what agents run with keep_attached left: their pins (tcx links, tracers, maps)
    /// and their clsact filters on this network namespace's interfaces. For uninstalling.
    Detach {
        #[arg(long, env = "DATAPATH_MONITOR_PIN_DIR", default_value = DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
    },
}

pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/datapath-monitor";

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:9781";

/// Flags of `run`. Every one is optional here so that unset flags fall back to the file.
#[derive(Debug, Default, Args)]
pub struct RunArgs {
    /// TOML configuration file (keys as in datapath-monitor.toml).
    #[arg(long, env = "DATAPATH_MONITOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Resolve and check the configuration, print it as TOML, and exit without loading anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Address of the HTTP server (/metrics, /healthz, /readyz, /api/v1/*).
    #[arg(long, env = "DATAPATH_MONITOR_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Interface name glob to watch (repeatable; replaces the defaults).
    #[arg(long = "interface", env = "DATAPATH_MONITOR_INTERFACE", value_delimiter = ',')]
    pub interfaces: Vec<String>,
    /// Interface name glob never to watch (repeatable).
    #[arg(long = "exclude", env = "DATAPATH_MONITOR_EXCLUDE", value_delimiter = ',')]
    pub excludes: Vec<String>,
    /// CNI configuration directory to watch (repeatable; replaces the defaults).
    #[arg(long = "cni-dir", env = "DATAPATH_MONITOR_CNI_DIR", value_delimiter = ',')]
    pub cni_dirs: Vec<PathBuf>,
    /// Kernel comm name of an SDN process to watch (repeatable; replaces the defaults).
    #[arg(long = "sdn-process", env = "DATAPATH_MONITOR_SDN_PROCESS", value_delimiter = ',')]
    pub sdn_processes: Vec<String>,
    /// libcni result cache, for pod names.
    #[arg(long, env = "DATAPATH_MONITOR_CNI_CACHE_DIR")]
    pub cni_cache_dir: Option<PathBuf>,
    /// Where incident history is kept.
    #[arg(long, env = "DATAPATH_MONITOR_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log line format.
    #[arg(long, env = "DATAPATH_MONITOR_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// How long series of a removed interface stay exported.
    #[arg(long, env = "DATAPATH_MONITOR_REMOVED_INTERFACE_GRACE_SECONDS")]
    pub removed_interface_grace_seconds: Option<u64>,
    /// Seconds without an increment after which a kernel drop or retransmit entry that no
    /// watched interface owns (a deleted namespace's or device's) is folded into "other" and removed.
    #[arg(long, env = "DATAPATH_MONITOR_KERNEL_ENTRY_IDLE_SECONDS")]
    pub kernel_entry_idle_seconds: Option<u64>,
    /// How often the kernel counters are read.
    #[arg(long, env = "DATAPATH_MONITOR_SAMPLE_INTERVAL_MS")]
    pub sample_interval_ms: Option<u64>,
    /// An SDN process exit followed by a start of the same name within this many seconds is a restart.
    #[arg(long, env = "DATAPATH_MONITOR_PROCESS_RESTART_WINDOW_SECONDS")]
    pub process_restart_window_seconds: Option<u64>,
    /// How many lifecycle events the timeline keeps (oldest dropped first).
    #[arg(long, env = "DATAPATH_MONITOR_EVENT_CAPACITY")]
    pub event_capacity: Option<usize>,
    /// Lost packets (dropped, retransmitted, unanswered) in one second above an interface's baseline that open an incident (while one is open, one packet joins it).
    #[arg(long, env = "DATAPATH_MONITOR_INCIDENT_FLOOR")]
    pub incident_floor: Option<u64>,
    /// How long a disruption must stay calm before it ends (hysteresis), in milliseconds.
    #[arg(long, env = "DATAPATH_MONITOR_INCIDENT_QUIET_MS")]
    pub incident_quiet_ms: Option<u64>,
    /// The longest an incident lasts, in seconds: one still going then is closed, and its loss rate becomes the baseline.
    #[arg(long, env = "DATAPATH_MONITOR_INCIDENT_MAX_SECONDS")]
    pub incident_max_seconds: Option<u64>,
    /// How far before an incident lifecycle events are candidate causes, in seconds.
    #[arg(long, env = "DATAPATH_MONITOR_INCIDENT_LOOKBACK_SECONDS")]
    pub incident_lookback_seconds: Option<u64>,
    /// Seconds of calm history in each interface's baseline.
    #[arg(long, env = "DATAPATH_MONITOR_INCIDENT_BASELINE_SECONDS")]
    pub incident_baseline_seconds: Option<u64>,
    /// Incidents kept in memory and read back from the state dir at start-up.
    #[arg(long, env = "DATAPATH_MONITOR_INCIDENT_HISTORY")]
    pub incident_history: Option<usize>,
    /// How tc programs attach: auto (tcx, else clsact), tcx, clsact.
    #[arg(long, env = "DATAPATH_MONITOR_TC_ATTACH")]
    pub tc_attach: Option<TcAttachChoice>,
    /// Which drop tracer: auto (tp_btf, else the classic tracepoint), tp-btf, tracepoint.
    #[arg(long, env = "DATAPATH_MONITOR_DROP_TRACER")]
    pub drop_tracer: Option<DropTracerChoice>,
    /// A probe not to load (repeatable): kfree_skb, sched_process, tcp_retransmit, ovs_upcall.
    /// The agent runs without its signal and says so, as on a kernel that lacks it.
    #[arg(long = "disable-probe", env = "DATAPATH_MONITOR_DISABLE_PROBE", value_delimiter = ',')]
    pub disable_probes: Vec<DisabledProbe>,
    /// Turn on the kernel's BPF run-time statistics for the program cost metrics (true/false).
    /// They time every BPF program run on the node, not only the agent's.
    #[arg(long, env = "DATAPATH_MONITOR_BPF_STATS", value_name = "BOOL")]
    pub bpf_stats: Option<bool>,
    /// Keep the kernel programs attached and counting when the agent exits, pinned under
    /// --pin-dir, for the next agent to take over: a restart then loses no packet and no count
    /// (true/false). Undo with `datapath-monitor detach`.
    #[arg(long, env = "DATAPATH_MONITOR_KEEP_ATTACHED", value_name = "BOOL")]
    pub keep_attached: Option<bool>,
    /// The bpffs directory for --keep-attached's pins.
    #[arg(long, env = "DATAPATH_MONITOR_PIN_DIR")]
    pub pin_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The resolved configuration; also the schema of the TOML file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    pub interfaces: Vec<String>,
    pub exclude: Vec<String>,
    pub cni_dirs: Vec<PathBuf>,
    pub sdn_processes: Vec<String>,
    pub cni_cache_dir: PathBuf,
    pub state_dir: PathBuf,
    pub log_format: LogFormat,
    pub removed_interface_grace_seconds: u64,
    pub kernel_entry_idle_seconds: u64,
    pub sample_interval_ms: u64,
    pub process_restart_window_seconds: u64,
    pub event_capacity: usize,
    pub incident_floor: u64,
    pub incident_quiet_ms: u64,
    pub incident_max_seconds: u64,
    pub incident_lookback_seconds: u64,
    pub incident_baseline_seconds: u64,
    pub incident_history: usize,
    pub tc_attach: TcAttachChoice,
    pub drop_tracer: DropTracerChoice,
    pub bpf_stats: bool,
    pub disable_probes: Vec<DisabledProbe>,
    pub keep_attached: bool,
    pub pin_dir: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9781)),
            interfaces: InterfaceFilter::DEFAULT_INCLUDE.iter().map(|s| s.to_string()).collect(),
            exclude: Vec::new(),
            cni_dirs: ["/etc/cni/net.d", "/etc/kubernetes/cni/net.d", "/var/run/multus/cni/net.d"]
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            sdn_processes: [
                "openshift-sdn-n",
                "openshift-sdn",
                "ovs-vswitchd",
                "ovsdb-server",
                "ovn-controller",
                "ovnkube",
                "flanneld",
                "calico-node",
                "cilium-agent",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            cni_cache_dir: PathBuf::from("/var/lib/cni/results"),
            state_dir: PathBuf::from("/var/lib/datapath-monitor"),
            log_format: LogFormat::Text,
            removed_interface_grace_seconds: 300,
            kernel_entry_idle_seconds: 300,
            sample_interval_ms: 250,
            process_restart_window_seconds: 60,
            event_capacity: 10_000,
            incident_floor: 3,
            incident_quiet_ms: 4_000,
            incident_max_seconds: 300,
            incident_lookback_seconds: 30,
            incident_baseline_seconds: 60,
            incident_history: 1_000,
            tc_attach: TcAttachChoice::Auto,
            drop_tracer: DropTracerChoice::Auto,
            disable_probes: Vec::new(),
            bpf_stats: false,
            keep_attached: false,
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
        }
    }
}

/// A configuration that cannot be used. Messages leave their sources out: print errors with
/// [`crate::errors::chain`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("{key} must be {what}, got {value}")]
    Invalid { key: &'static str, what: &'static str, value: String },
    #[error("interfaces/exclude")]
    Globs(#[source] crate::sampling::InterfaceError),
}

impl Config {
    pub fn from_toml(path: &Path, text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|source| ConfigError::Parse { path: path.to_path_buf(), source: Box::new(source) })
    }

    /// File (if any) overlaid with flags and environment.
    pub fn resolve(args: RunArgs) -> Result<Self, ConfigError> {
        // Each flag is named once, below: the destructuring makes a new flag a compile error
        // until it is listed. A list given replaces the file's, an option given replaces its
        // value; what is not given keeps the file's (or the default).
        macro_rules! overlay {
            (lists: $($list:ident => $field:ident),*; options: $($option:ident),* $(,)?) => {{
                let RunArgs { config, dry_run: _, $($list,)* $($option,)* } = args;
                let mut resolved = match config {
                    Some(path) => {
                        let text = std::fs::read_to_string(&path)
                            .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
                        Self::from_toml(&path, &text)?
                    }
                    None => Self::default(),
                };
                $(if !$list.is_empty() {
                    resolved.$field = $list;
                })*
                $(if let Some(value) = $option {
                    resolved.$option = value;
                })*
                resolved
            }};
        }
        let resolved = overlay!(
            lists: interfaces => interfaces, excludes => exclude, cni_dirs => cni_dirs, sdn_processes => sdn_processes,
                disable_probes => disable_probes;
            options: listen,
            cni_cache_dir,
            state_dir,
            log_format,
            removed_interface_grace_seconds,
            kernel_entry_idle_seconds,
            sample_interval_ms,
            process_restart_window_seconds,
            event_capacity,
            incident_floor,
            incident_quiet_ms,
            incident_max_seconds,
            incident_lookback_seconds,
            incident_baseline_seconds,
            incident_history,
            tc_attach,
            drop_tracer,
            bpf_stats,
            keep_attached,
            pin_dir,
        );
        resolved.validate()?;
        Ok(resolved)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !(10..=10_000).contains(&self.sample_interval_ms) {
            return Err(ConfigError::Invalid {
                key: "sample_interval_ms",
                what: "between 10 and 10000",
                value: self.sample_interval_ms.to_string(),
            });
        }
        // The one check of process names: the kernel filter and /proc scans take them as given.
        if let Some(name) = self.sdn_processes.iter().find(|name| comm_key(name).is_none()) {
            return Err(ConfigError::Invalid {
                key: "sdn_processes",
                what: "kernel comm names of 1 to 15 bytes without NUL",
                value: name.escape_debug().to_string(),
            });
        }
        // Globs are compiled here too, so that `--dry-run` rejects what `run` would.
        crate::sampling::InterfaceFilter::new(&self.interfaces, &self.exclude).map_err(ConfigError::Globs)?;
        let ranges: [(&'static str, u64, std::ops::RangeInclusive<u64>, &'static str); 9] = [
            // A day: longer would only keep gone interfaces' series; far longer overflows clocks.
            (
                "removed_interface_grace_seconds",
                self.removed_interface_grace_seconds,
                0..=86_400,
                "between 0 and 86400",
            ),
            ("kernel_entry_idle_seconds", self.kernel_entry_idle_seconds, 10..=86_400, "between 10 and 86400"),
            ("process_restart_window_seconds", self.process_restart_window_seconds, 1..=86_400, "between 1 and 86400"),
            ("incident_floor", self.incident_floor, 1..=1_000_000, "between 1 and 1000000"),
            ("incident_quiet_ms", self.incident_quiet_ms, 250..=600_000, "between 250 and 600000"),
            ("incident_max_seconds", self.incident_max_seconds, 10..=86_400, "between 10 and 86400"),
            ("incident_lookback_seconds", self.incident_lookback_seconds, 0..=3_600, "between 0 and 3600"),
            ("incident_baseline_seconds", self.incident_baseline_seconds, 5..=3_600, "between 5 and 3600"),
            ("incident_history", self.incident_history as u64, 1..=100_000, "between 1 and 100000"),
        ];
        for (key, value, range, what) in ranges {
            if !range.contains(&value) {
                return Err(ConfigError::Invalid { key, what, value: value.to_string() });
            }
        }
        if !(1..=1_000_000).contains(&self.event_capacity) {
            return Err(ConfigError::Invalid {
                key: "event_capacity",
                what: "between 1 and 1000000",
                value: self.event_capacity.to_string(),
            });
        }
        Ok(())
    }

    /// The configuration as a TOML file would state it.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    pub fn engine_config(&self) -> crate::incidents::EngineConfig {
        crate::incidents::EngineConfig {
            floor: self.incident_floor,
            quiet: Duration::from_millis(self.incident_quiet_ms),
            max_duration: Duration::from_secs(self.incident_max_seconds),
            lookback: Duration::from_secs(self.incident_lookback_seconds),
            baseline_seconds: self.incident_baseline_seconds as usize,
            history: self.incident_history,
        }
    }

    pub fn process_restart_window(&self) -> Duration {
        Duration::from_secs(self.process_restart_window_seconds)
    }

    pub fn sample_interval(&self) -> Duration {
        Duration::from_millis(self.sample_interval_ms)
    }

    pub fn datapath_options(&self) -> DatapathOptions {
        DatapathOptions {
            tc_attach: self.tc_attach,
            drop_tracer: self.drop_tracer,
            bpf_stats: self.bpf_stats,
            disabled: self.disable_probes.iter().map(|probe| probe.name()).collect(),
            pin_dir: self.keep_attached.then(|| self.pin_dir.clone()),
        }
    }

    pub fn removed_interface_grace(&self) -> Duration {
        Duration::from_secs(self.removed_interface_grace_seconds)
    }

    pub fn kernel_entry_idle(&self) -> Duration {
        Duration::from_secs(self.kernel_entry_idle_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("datapath-monitor").chain(args.iter().copied()))
    }

    fn run_args(args: &[&str]) -> RunArgs {
        match parse(args).unwrap().command {
            Command::Run(run) => *run,
            other => panic!("expected run, got {other:?}"),
        }
    }

    #[test]
    fn defaults_come_from_the_field() {
        let config = Config::resolve(run_args(&["run"])).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:9781");
        assert!(config.interfaces.iter().any(|g| g == "veth*"));
        assert!(config.sdn_processes.iter().any(|p| p == "ovs-vswitchd"));
        assert_eq!(config.sample_interval_ms, 250);
    }

    #[test]
    fn programs_are_pinned_only_with_keep_attached() {
        let config = Config::resolve(run_args(&["run"])).unwrap();
        assert_eq!(config.datapath_options().pin_dir, None);
        let config = Config::resolve(run_args(&["run", "--keep-attached", "true"])).unwrap();
        assert_eq!(config.datapath_options().pin_dir, Some(PathBuf::from(DEFAULT_PIN_DIR)));
        let config =
            Config::resolve(run_args(&["run", "--keep-attached", "true", "--pin-dir", "/sys/fs/bpf/dm"])).unwrap();
        assert_eq!(config.datapath_options().pin_dir, Some(PathBuf::from("/sys/fs/bpf/dm")));
        match parse(&["detach"]).unwrap().command {
            Command::Detach { pin_dir } => assert_eq!(pin_dir, PathBuf::from(DEFAULT_PIN_DIR)),
            other => panic!("expected detach, got {other:?}"),
        }
    }

    #[test]
    fn flags_override_file_and_repeat() {
        let dir = std::env::temp_dir().join(format!("dm-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "listen = \"0.0.0.0:9000\"\ninterfaces = [\"eth*\"]\nsample_interval_ms = 100\n")
            .unwrap();
        let config = Config::resolve(run_args(&[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--interface",
            "dm*",
            "--interface",
            "br0",
            "--log-format",
            "json",
            "--tc-attach",
            "clsact",
            "--drop-tracer",
            "tracepoint",
        ]))
        .unwrap();
        assert_eq!(config.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(config.interfaces, vec!["dm*", "br0"]);
        assert_eq!(config.sample_interval_ms, 100);
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(config.tc_attach, TcAttachChoice::Clsact);
        assert_eq!(config.drop_tracer, DropTracerChoice::Tracepoint);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        assert!(parse(&["run", "--listen", "nonsense"]).is_err());
        assert!(parse(&["run", "--log-format", "xml"]).is_err());
        assert!(parse(&["run", "--no-such-flag"]).is_err());
        let err = Config::from_toml(Path::new("x.toml"), "no_such_key = 1").unwrap_err();
        let err = crate::errors::chain(&err);
        assert!(err.contains("no_such_key"), "{err}");
        let err = Config::resolve(run_args(&["run", "--incident-floor", "0"])).unwrap_err();
        assert!(err.to_string().contains("incident_floor"), "{err}");
        let err = Config::resolve(run_args(&["run", "--sdn-process", "a-name-longer-than-15"])).unwrap_err();
        assert!(err.to_string().contains("15 bytes"), "{err}");
        let err = Config::resolve(run_args(&["run", "--sdn-process", "ovs\0vswitchd"])).unwrap_err();
        assert!(err.to_string().contains("without NUL"), "{err}");
        // What `run` would reject, `--dry-run` rejects too.
        let err = Config::resolve(run_args(&["run", "--dry-run", "--interface", "tun[0"])).unwrap_err();
        let err = crate::errors::chain(&err);
        assert!(err.contains("interfaces/exclude") && err.contains("tun[0"), "{err}");
        let err = Config::resolve(run_args(&["run", "--removed-interface-grace-seconds", "18446744073709551615"]))
            .unwrap_err();
        assert!(err.to_string().contains("removed_interface_grace_seconds must be between 0 and 86400"), "{err}");
    }

    #[test]
    fn dry_run_output_reads_back_as_the_same_config() {
        let config = Config::resolve(run_args(&["run", "--dry-run", "--incident-floor", "9"])).unwrap();
        let text = config.to_toml().unwrap();
        assert_eq!(Config::from_toml(Path::new("x"), &text).unwrap(), config);
    }

    #[test]
    fn shipped_example_config_parses_and_equals_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datapath-monitor.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(Config::from_toml(&path, &text).unwrap(), Config::default());
    }
}
