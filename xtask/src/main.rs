//! `cargo xtask`: the project's tasks in Rust, so that setting up, building, running and
//! testing work the same on a laptop, a lab VM and CI.

mod bench;
mod build;
mod command;
mod eval;
mod exclusions;
mod image;
mod lab;
mod run;
mod setup;
mod test;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Project tasks for datapath-monitor", disable_help_subcommand = true)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need: system packages, nightly rust-src, bpf-linker.
    Setup {
        /// Only report; exit non-zero when something is missing.
        #[arg(long)]
        check: bool,
    },
    /// Build the agent (its build.rs builds the kernel programs).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build the agent and run it in the foreground (needs root).
    Run {
        #[arg(long)]
        release: bool,
        /// Run it in a test VM with this kernel instead (6.1, 6.12 or host).
        #[arg(long, value_name = "KERNEL")]
        vm: Option<String>,
        /// Arguments for `datapath-monitor run`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The lab: a node in a box (OVS, pods, prober, stand-in openshift-sdn) to disrupt.
    Lab {
        #[command(subcommand)]
        action: LabCommand,
    },
    /// Build, bring the lab up, run the agent, replay the SDN upgrade disruption, show what was caught.
    Demo {
        /// OVS datapath under the lab's bridge: userspace, or kernel (openvswitch.ko, as
        /// production nodes run it; the default with --vm).
        #[arg(long, value_parser = dm_lab::Datapath::parse)]
        datapath: Option<dm_lab::Datapath>,
        /// Run the whole demo in a test VM with this kernel (6.1 or 6.12): the kernel datapath.
        #[arg(long, value_name = "KERNEL")]
        vm: Option<String>,
        /// (internal, the guest's half of --vm) prebuilt agent and lab binaries.
        #[arg(long, hide = true, requires = "lab_bin")]
        agent_bin: Option<std::path::PathBuf>,
        #[arg(long, hide = true, requires = "agent_bin")]
        lab_bin: Option<std::path::PathBuf>,
    },
    /// Measure detection quality on the lab (needs root): every scenario N times with a fresh
    /// agent against the lab's ground truth (prober, numbered UDP stream), then a soak of natural
    /// traffic with no fault; writes EVALUATION.md and target/eval/results.json.
    Eval {
        /// Runs per scenario, each with its own fault plan drawn from the seed.
        #[arg(long, default_value_t = 5)]
        repeat: u32,
        /// Minutes of natural-traffic soak.
        #[arg(long, default_value_t = 5.0, conflicts_with = "soak")]
        soak_minutes: f64,
        /// How long the soak runs, e.g. 30m, 90s, 1h (instead of --soak-minutes).
        #[arg(long, value_name = "DURATION", value_parser = eval::parse_soak)]
        soak: Option<f64>,
        /// The seed every run's fault plan is drawn from (printed; the same seed replays the
        /// same plans). Drawn from the clock when not given.
        #[arg(long)]
        seed: Option<u64>,
        /// Run the eval in a test VM with this kernel (6.1 or 6.12), on OVS's kernel datapath;
        /// its section of EVALUATION.md is replaced, the host's kept.
        #[arg(long, value_name = "KERNEL")]
        vm: Option<String>,
        /// (internal, the guest's half of --vm) OVS datapath, prebuilt binaries, where to write.
        #[arg(long, hide = true, value_parser = dm_lab::Datapath::parse)]
        datapath: Option<dm_lab::Datapath>,
        #[arg(long, hide = true, requires_all = ["lab_bin", "out_dir"])]
        agent_bin: Option<std::path::PathBuf>,
        #[arg(long, hide = true, requires = "agent_bin")]
        lab_bin: Option<std::path::PathBuf>,
        #[arg(long, hide = true, requires = "agent_bin")]
        out_dir: Option<std::path::PathBuf>,
        /// Only these scenarios (comma-separated), e.g. sdn-upgrade,silent-drop.
        #[arg(long, value_name = "LIST")]
        scenarios: Option<String>,
        /// Skip the soak.
        #[arg(long)]
        no_soak: bool,
    },
    /// Measure what the monitor costs (datapath, CPU, memory) and how fast it detects; writes BENCHMARKS.md.
    Bench {
        /// Fewer rounds and shorter runs (a few minutes): checks every measurement works.
        #[arg(long)]
        quick: bool,
        /// Only some sections: programs, throughput, agent, latency (comma-separated).
        #[arg(long)]
        only: Option<String>,
    },
    /// Build the agent's container image (podman) from the Containerfile, tagged
    /// localhost/datapath-monitor:<version>-<commit>, around a release build of this checkout.
    Image,
    /// Boot a test VM (Debian kernel under QEMU, the host's root as its userland) and run a
    /// command in it, by default the agent; exits with the command's status.
    Vm {
        /// 6.1, 6.12 or host.
        #[arg(long)]
        kernel: String,
        /// The command to run in the guest.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// fmt, clippy (host and eBPF), unit tests, then privileged end-to-end tests.
    Test {
        /// Only fmt, clippy and unit tests.
        #[arg(long, conflicts_with = "e2e")]
        unit: bool,
        /// Only the agent build and the privileged end-to-end tests.
        #[arg(long)]
        e2e: bool,
        /// Run the end-to-end tests in test VMs of these kernels only (e.g. 6.1,6.12 or host);
        /// without it, the 6.1 and 6.12 guests run after the host's end-to-end tests.
        #[arg(long, value_name = "LIST", conflicts_with = "unit")]
        kernels: Option<String>,
        /// Test-name filter for the end-to-end tests.
        #[arg(last = true, conflicts_with = "unit")]
        filter: Vec<String>,
    },
}

#[derive(Subcommand)]
enum LabCommand {
    /// Create the lab (removing leftovers of an earlier one first).
    Up {
        /// OVS datapath under the bridge: userspace (any kernel), or kernel (openvswitch.ko;
        /// the 6.1 and 6.12 test VMs have it, this host's kernel may not).
        #[arg(long, default_value = "userspace", value_parser = dm_lab::Datapath::parse)]
        datapath: dm_lab::Datapath,
    },
    /// Processes, bridge, flows, pods, the prober's last result.
    Status,
    /// Replay a failure: sdn-upgrade, ovs-restart, flow-flush, cni-flap, benign-restart, silent-drop.
    Disrupt { scenario: String },
    /// Remove everything the lab created.
    Down,
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Setup { check } => setup::setup(check),
        Task::Build { release } => build::build(release).map(|_agent| ()),
        Task::Run { release, vm: None, args } => run::run(release, &args),
        Task::Run { release, vm: Some(kernel), args } => vm::run_agent(&kernel, release, &args),
        Task::Lab { action } => lab::lab(match action {
            LabCommand::Up { datapath } => lab::LabAction::Up(datapath),
            LabCommand::Status => lab::LabAction::Status,
            LabCommand::Disrupt { scenario } => lab::LabAction::Disrupt(scenario),
            LabCommand::Down => lab::LabAction::Down,
        }),
        Task::Demo { datapath, vm: Some(kernel), .. } => {
            vm::demo(&kernel, datapath.unwrap_or(dm_lab::Datapath::Kernel))
        }
        Task::Demo { datapath, vm: None, agent_bin, lab_bin } => {
            lab::demo(lab::DemoOptions { datapath: datapath.unwrap_or_default(), prebuilt: agent_bin.zip(lab_bin) })
        }
        Task::Eval {
            repeat,
            soak_minutes,
            soak,
            seed,
            vm,
            datapath,
            agent_bin,
            lab_bin,
            out_dir,
            scenarios,
            no_soak,
        } => {
            let options = eval::EvalOptions {
                repeat,
                soak_minutes: soak.unwrap_or(soak_minutes),
                seed,
                scenarios,
                no_soak,
                datapath: datapath.unwrap_or_default(),
                guest: agent_bin.zip(lab_bin).zip(out_dir).map(|((agent, lab), out_dir)| eval::GuestRun {
                    agent,
                    lab,
                    out_dir,
                }),
            };
            match vm {
                Some(kernel) => vm::eval(&kernel, &options),
                None => eval::eval(options),
            }
        }
        Task::Bench { quick, only } => bench::bench(quick, only.as_deref()),
        Task::Vm { kernel, command } => vm::vm(&kernel, &command),
        Task::Image => image::image().map(drop),
        Task::Test { unit, e2e, kernels, filter } => match kernels {
            None => test::test(test::Selection { unit: !e2e, e2e: !unit, kernels: None }, &filter),
            Some(list) => vm::Kernel::parse_list(&list).and_then(|kernels| {
                test::test(test::Selection { unit: false, e2e: false, kernels: Some(kernels) }, &filter)
            }),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // The message and its causes, without the backtrace anyhow adds when RUST_BACKTRACE is set.
            eprintln!("error: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
