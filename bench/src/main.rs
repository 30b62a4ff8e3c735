//! dm-bench: what datapath-monitor costs the datapath and the node, and how fast it sees a
//! disruption. Run it through `cargo xtask bench`, which builds it and the agent (release)
//! and sets DATAPATH_MONITOR_BIN; results go to BENCHMARKS.md.

mod agent_cost;
mod kernel;
mod latency;
mod programs;
mod report;
mod stats;
mod throughput;
mod topology;
mod traffic;

use std::{
    fs::File,
    os::fd::AsFd as _,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use clap::{Parser, ValueEnum};
use datapath_monitor_tests::{AGENT_PORT, Agent, TempDir, http_get_port};
use nix::sched::{CloneFlags, setns};

use crate::{report::Section, topology::Topology};

#[derive(Parser)]
#[command(about = "Benchmarks datapath-monitor (root); run it through `cargo xtask bench`")]
struct Cli {
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// Fewer rounds and shorter runs: checks every section works; not for the record.
    #[arg(long)]
    quick: bool,
    /// Only these sections (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Part>,
    /// The command line the report names as the one that reproduces it.
    #[arg(long, default_value = "cargo xtask bench")]
    command: String,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    Programs,
    Throughput,
    Agent,
    Latency,
}

/// How long and how often: the full run is the record, `--quick` a smoke run.
pub struct Plan {
    /// Interleaved rounds per mode (with / without the monitor).
    pub rounds: usize,
    /// One throughput run.
    pub run: Duration,
    /// Steady state measured per agent-cost configuration.
    pub steady: Duration,
    /// Detection and process-event trials.
    pub trials: usize,
    /// /metrics requests.
    pub scrapes: usize,
    /// One per-program workload.
    pub program_run: Duration,
    /// Processes started and stopped for the process tracer's cost.
    pub execs: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                rounds: 2,
                run: Duration::from_secs(2),
                steady: Duration::from_secs(10),
                trials: 5,
                scrapes: 200,
                program_run: Duration::from_secs(1),
                execs: 200,
            }
        } else {
            Self {
                rounds: 5,
                run: Duration::from_secs(5),
                steady: Duration::from_secs(60),
                trials: 20,
                scrapes: 1000,
                program_run: Duration::from_secs(3),
                execs: 1000,
            }
        }
    }
}

/// The node under test and the agent's scratch directories.
pub struct Bench {
    pub topology: Topology,
    pub plan: Plan,
    scratch: TempDir,
}

/// Comm name of the stand-in SDN process whose exits the latency section times.
pub const SDN_STAND_IN: &str = "dmb-sdn";

impl Bench {
    /// The agent in the host namespace, as deployed (RUST_LOG=info), once it has attached to
    /// `interfaces` interfaces.
    pub fn start_agent(&self, interfaces: usize) -> Result<Agent<'_>> {
        let dir = |name: &str| self.scratch.join(name).display().to_string();
        let (state, cni, cache) = (dir("state"), dir("cni"), dir("cni-cache"));
        let args = ["--state-dir", &state, "--cni-dir", &cni, "--cni-cache-dir", &cache, "--sdn-process", SDN_STAND_IN];
        let agent = Agent::start_logging(&self.topology.host, &args, "info")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, body) = get(AGENT_PORT, "/api/v1/interfaces")?;
            let watched: Vec<serde_json::Value> = serde_json::from_str(&body)?;
            let attached = watched.iter().filter(|interface| !interface["attach_mode"].is_null()).count();
            if attached >= interfaces {
                return Ok(agent);
            }
            ensure!(Instant::now() < deadline, "the agent attached to {attached} of {interfaces} interfaces in 60 s");
            thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn scratch_path(&self, name: &str) -> PathBuf {
        self.scratch.join(name)
    }
}

/// HTTP GET on the agent from the calling thread (the main thread lives in the host namespace).
pub fn get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_port(port, path)
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "the bench needs root (namespaces, eBPF): run `sudo -E cargo xtask bench`"
    );
    datapath_monitor_tests::agent_binary()?;
    let started = Instant::now();
    let date = jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC").to_string();
    let bench = Bench { topology: Topology::new()?, plan: Plan::new(cli.quick), scratch: TempDir::new("dmb")? };
    // Everything below (HTTP to the agent, tc attach by name) runs in the host namespace.
    let host = File::open(format!("/run/netns/{}", bench.topology.host.name)).context("opening the host netns")?;
    setns(host.as_fd(), CloneFlags::CLONE_NEWNET).context("entering the host netns")?;
    let wanted = |part| cli.only.is_empty() || cli.only.contains(&part);

    let mut sections: Vec<Section> = Vec::new();
    let mut bench = bench;
    if wanted(Part::Programs) {
        progress("per-program cost");
        sections.push(programs::measure(&bench)?);
    }
    if wanted(Part::Throughput) {
        progress("throughput with and without the monitor");
        sections.push(throughput::measure(&bench)?);
    }
    if wanted(Part::Agent) {
        progress("agent CPU, memory and scrape");
        sections.extend(agent_cost::measure(&mut bench)?);
    }
    if wanted(Part::Latency) {
        progress("detection latency");
        sections.push(latency::measure(&bench)?);
    }

    sections.sort_by(|a, b| a.title.cmp(&b.title));
    let existing = std::fs::read_to_string(&cli.out).unwrap_or_default();
    let header = report::Header {
        command: cli.command,
        machine: topology::machine(),
        date,
        duration_minutes: started.elapsed().as_secs_f64() / 60.0,
        quick: cli.quick,
    };
    let text = report::render(&header, &sections, report::kept_notes(&existing));
    std::fs::write(&cli.out, &text).with_context(|| format!("writing {}", cli.out.display()))?;
    println!("{text}");
    eprintln!("wrote {}", cli.out.display());
    Ok(())
}

pub fn progress(what: &str) {
    eprintln!("dm-bench: {what} …");
}
