//! `dm-lab`: build, inspect, disrupt and tear down the datapath-monitor lab, plus the lab's
//! internal daemons (run by the lab itself inside its network namespaces).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use dm_lab::{Datapath, Lab, LabOptions, Scenario, daemons, sdn, soak, sys};

#[derive(Parser)]
#[command(name = "dm-lab", about = "An OpenShift SDN node in a box, replaying pod-network disruptions")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the lab (tears down leftovers first).
    Up {
        /// OVS datapath under the bridge: userspace (any kernel) or kernel (openvswitch.ko, as
        /// production nodes run it).
        #[arg(long, default_value = "userspace", value_parser = Datapath::parse)]
        datapath: Datapath,
        /// How often the prober probes (kubelet's default 1 s; shorter periods overlap probes).
        #[arg(long, default_value = "1s", value_parser = daemons::parse_duration)]
        probe_period: Duration,
    },
    /// Remove every lab object (idempotent).
    Down,
    /// Show the running lab.
    Status,
    /// Print the flags that point datapath-monitor at the lab.
    AgentArgs,
    /// Replay a scenario and report the outage it caused.
    Disrupt {
        /// sdn-upgrade | ovs-restart | flow-flush | cni-flap | benign-restart | silent-drop | all
        scenario: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// (internal) Serve GET /healthz → 200 "ok".
    ServeHealthz {
        #[arg(long, default_value_t = 8443)]
        port: u16,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// (internal) Echo UDP datagrams.
    UdpEcho {
        #[arg(long, default_value_t = 9000)]
        port: u16,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// (internal) Send UDP datagrams at a steady rate and count the echoes.
    UdpClient {
        #[arg(long)]
        target: String,
        #[arg(long, default_value_t = 20)]
        rate: u32,
        #[arg(long)]
        log: PathBuf,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// (internal) Kubelet-like readiness prober.
    Prober {
        #[arg(long)]
        url: String,
        #[arg(long, default_value = "1s", value_parser = daemons::parse_duration)]
        period: Duration,
        #[arg(long, default_value = "1s", value_parser = daemons::parse_duration)]
        timeout: Duration,
        #[arg(long)]
        log: PathBuf,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// (internal) The soak's servers: HTTP (fast, slow), bulk TCP, DNS-like UDP, a UDP sink.
    SoakServe {
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// (internal) The soak's clients: natural traffic with no fault toward one pod.
    SoakTraffic {
        /// The pod IP to talk to.
        #[arg(long)]
        target: String,
        /// Comma-separated: onoff, push, bursty, rejects, bulk, dns.
        #[arg(long)]
        behaviours: String,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// Run the soak's natural traffic (no fault) for some minutes, then stop it.
    Soak {
        /// Minutes to run.
        #[arg(long, default_value_t = 5.0)]
        minutes: f64,
    },
    /// (internal) Steady background traffic that loses packets by design (a decoy's).
    Noise {
        /// rejects (closed ports) or scan (filtered ports)
        #[arg(long, value_parser = dm_lab::noise::NoiseKind::parse)]
        kind: dm_lab::noise::NoiseKind,
        #[arg(long)]
        target: std::net::IpAddr,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
    /// (internal) The stand-in openshift-sdn node process.
    Sdn {
        #[arg(long, default_value = dm_lab::ROOT)]
        root: PathBuf,
        #[arg(long)]
        keep_flows: bool,
        #[arg(long, default_value = "0.5s", value_parser = daemons::parse_duration)]
        program_delay: Duration,
        #[arg(long, default_value = "3s", value_parser = daemons::parse_duration)]
        resync_delay: Duration,
        #[arg(long)]
        pidfile: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("dm-lab: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn write_pid(pidfile: &Option<PathBuf>) -> anyhow::Result<()> {
    match pidfile {
        Some(path) => sys::write_own_pid(path),
        None => Ok(()),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Up { datapath, probe_period } => {
            let bin = std::env::current_exe().context("cannot find this executable")?;
            let lab = Lab::up_with(&bin, LabOptions { datapath, probe_period })?;
            println!("{}", lab.status()?);
            println!("agent flags: {}", lab.agent_args().join(" "));
        }
        Cmd::Down => {
            Lab::down()?;
            println!("lab removed");
        }
        Cmd::Status => println!("{}", Lab::attach()?.status()?),
        Cmd::AgentArgs => println!("{}", Lab::attach()?.agent_args().join(" ")),
        Cmd::Disrupt { scenario, json } => {
            let scenarios =
                if scenario == "all" {
                    Scenario::ALL.to_vec()
                } else {
                    let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
                    vec![Scenario::parse(&scenario).with_context(|| {
                        format!("unknown scenario `{scenario}` (one of: {}, all)", names.join(", "))
                    })?]
                };
            let lab = Lab::attach()?;
            for scenario in scenarios {
                if !json {
                    println!("== {scenario}: {}", scenario.description());
                }
                let report = lab.disrupt_with(scenario, &mut |at, step| {
                    if !json {
                        eprintln!("  {at:.3}  {step}");
                    }
                })?;
                if json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    println!("{report}\n");
                }
            }
        }
        Cmd::ServeHealthz { port, pidfile } => {
            write_pid(&pidfile)?;
            daemons::serve_healthz(port)?;
        }
        Cmd::Noise { kind, target, pidfile } => {
            write_pid(&pidfile)?;
            dm_lab::noise::run(kind, target)?;
        }
        Cmd::UdpEcho { port, pidfile } => {
            write_pid(&pidfile)?;
            daemons::udp_echo(port)?;
        }
        Cmd::UdpClient { target, rate, log, pidfile } => {
            write_pid(&pidfile)?;
            daemons::udp_client(&target, rate, &log)?;
        }
        Cmd::Prober { url, period, timeout, log, pidfile } => {
            write_pid(&pidfile)?;
            daemons::prober(&url, period, timeout, &log)?;
        }
        Cmd::SoakServe { pidfile } => {
            soak::write_pid(pidfile.as_deref())?;
            soak::serve()?;
        }
        Cmd::SoakTraffic { target, behaviours, pidfile } => {
            let behaviours = soak::parse_behaviours(&behaviours)?;
            soak::write_pid(pidfile.as_deref())?;
            soak::traffic(&target, &behaviours)?;
        }
        Cmd::Soak { minutes } => {
            let lab = Lab::attach()?;
            for line in soak::layout() {
                println!("  {line}");
            }
            let result = lab.start_soak().map(|pids| {
                println!("soak running ({} daemons) for {minutes} min", pids.len());
                std::thread::sleep(Duration::from_secs_f64(minutes.max(0.0) * 60.0));
            });
            lab.stop_soak();
            result?;
            println!("soak stopped");
        }
        Cmd::Sdn { root, keep_flows, program_delay, resync_delay, pidfile } => {
            let pidfile = pidfile.unwrap_or_else(|| root.join("pids/sdn.pid"));
            sdn::run(&sdn::SdnOptions { root, keep_flows, program_delay, resync_delay, pidfile })?;
        }
    }
    Ok(())
}
