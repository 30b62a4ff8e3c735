//! `cargo xtask eval`: how well the monitor detects, measured on the lab against the lab's own
//! ground truth (which the agent never sees): every scenario N times, each with a fresh agent,
//! then a soak of natural traffic with no fault. Writes EVALUATION.md at the repository root and
//! the raw runs to target/eval/results.json.

mod assess;
pub mod report;
mod stats;

pub use self::assess::{Expected, expected};

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use dm_lab::{
    Datapath, FaultPlan, Lab, LabOptions, NODE_NETNS, Roles, Scenario, ScenarioReport,
    probe_log::{self, UdpSecond},
    soak::{self, Rng},
};
use jiff::Timestamp;
use serde_json::{Value, json};

use crate::{
    build,
    command::{self, Workspace},
    lab::{AGENT_LISTEN, LabAgent, require_root},
    setup,
};

use self::{
    assess::*,
    report::{Meta, render},
};

/// `cargo xtask eval` options.
pub struct EvalOptions {
    /// Runs per scenario.
    pub repeat: u32,
    /// Minutes of natural-traffic soak.
    pub soak_minutes: f64,
    /// The seed of the runs' fault plans (None: drawn from the clock).
    pub seed: Option<u64>,
    /// Only these scenarios (comma-separated names); all when None.
    pub scenarios: Option<String>,
    /// Skip the soak.
    pub no_soak: bool,
    /// OVS's datapath under the lab's bridge.
    pub datapath: Datapath,
    /// Set in a test VM (the guest's half of `eval --vm`): what the host built, and where the
    /// report goes instead of EVALUATION.md.
    pub guest: Option<GuestRun>,
}

/// The guest's half of `cargo xtask eval --vm`.
#[derive(Clone, Debug)]
pub struct GuestRun {
    pub agent: PathBuf,
    pub lab: PathBuf,
    /// Gets `report.md`, `results.json` and `logs/`.
    pub out_dir: PathBuf,
}

/// The report a guest's eval writes into its out dir.
pub const GUEST_REPORT: &str = "report.md";

/// How long the soak's agent runs before the soak traffic starts.
const SOAK_WARMUP: Duration = Duration::from_secs(2);
/// How long a decoy's noise runs before its agent starts: the noise is the node's steady state.
const NOISE_BEFORE_AGENT: Duration = Duration::from_secs(2);
/// After the scenario: wait for every incident to close, at most this long ...
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// ... or this long when no incident appeared at all.
const NO_INCIDENT_WAIT: Duration = Duration::from_secs(8);
/// How often the incidents are polled.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Polling the agent.

#[derive(Default)]
struct PollState {
    first_seen: BTreeMap<String, Timestamp>,
    latest: Vec<Value>,
    polls: u64,
    errors: u64,
    /// The first failed poll's error: a dead or hung agent scores nothing.
    first_error: Option<String>,
}

/// How the polls of one run went.
struct PollSummary {
    polls: u64,
    errors: u64,
    first_error: Option<String>,
}

impl PollSummary {
    /// Err when any poll failed: what the agent reported then is unknown, so the run measures
    /// nothing.
    fn check(&self, log: &Path) -> anyhow::Result<()> {
        let Self { polls, errors, first_error } = self;
        ensure!(
            *errors == 0,
            "{errors} of {polls} polls of the agent failed (first: {}); see {}",
            first_error.as_deref().unwrap_or("?"),
            log.display()
        );
        Ok(())
    }
}

/// Polls `/api/v1/incidents` every 100 ms from a thread that entered the node netns.
struct Poller {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<PollState>>,
    handle: thread::JoinHandle<()>,
}

impl Poller {
    fn start() -> anyhow::Result<Self> {
        let netns = fs::File::open(format!("/run/netns/{NODE_NETNS}")).context("opening the node netns")?;
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(PollState::default()));
        let (thread_stop, thread_state) = (Arc::clone(&stop), Arc::clone(&state));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = thread::spawn(move || {
            // SAFETY: setns on a valid fd; it moves only this thread into the node netns.
            let entered = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == 0;
            let _ = ready_tx.send(entered);
            if !entered {
                return;
            }
            while !thread_stop.load(Ordering::Relaxed) {
                poll_once(&thread_state);
                thread::sleep(POLL_INTERVAL);
            }
            poll_once(&thread_state);
        });
        ensure!(
            ready_rx.recv().unwrap_or(false),
            "cannot enter netns {NODE_NETNS}: {}",
            std::io::Error::last_os_error()
        );
        Ok(Poller { stop, state, handle })
    }

    /// (incidents now, all of them inactive).
    fn snapshot(&self) -> (usize, bool) {
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (state.latest.len(), state.latest.iter().all(|incident| incident["active"] != true))
    }

    fn finish(self) -> (Vec<SeenIncident>, PollSummary) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut seen: Vec<SeenIncident> = state
            .latest
            .iter()
            .filter_map(|raw| {
                let view = IncidentView::from_json(raw)?;
                let first_seen = *state.first_seen.get(&view.id)?;
                Some(SeenIncident { view, first_seen, raw: raw.clone() })
            })
            .collect();
        seen.sort_by_key(|s| s.view.start);
        let summary = PollSummary { polls: state.polls, errors: state.errors, first_error: state.first_error.clone() };
        (seen, summary)
    }
}

fn poll_once(state: &Mutex<PollState>) {
    let result = http_get_local("/api/v1/incidents");
    let seen_at = Timestamp::now();
    let mut state = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    state.polls += 1;
    match result.and_then(|body| serde_json::from_str::<Value>(&body).context("incidents are not JSON")) {
        Ok(Value::Array(incidents)) => {
            for incident in &incidents {
                if let Some(id) = incident["id"].as_str() {
                    state.first_seen.entry(id.to_string()).or_insert(seen_at);
                }
            }
            state.latest = incidents;
        }
        Ok(_) => {
            state.errors += 1;
            state.first_error.get_or_insert_with(|| "/api/v1/incidents is not an array".to_owned());
        }
        Err(error) => {
            state.errors += 1;
            state.first_error.get_or_insert_with(|| format!("{error:#}"));
        }
    }
}

/// GET `path` from the agent (the calling thread must be in the node netns).
fn http_get_local(path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&AGENT_LISTEN.parse()?, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {AGENT_LISTEN}\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    parse_http_response(&response)
}

/// The body of a 200 response (Content-Length or chunked framing).
pub fn parse_http_response(response: &[u8]) -> anyhow::Result<String> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").context("no end of the response head")?;
    let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
    ensure!(head.starts_with("http/1.1 200") || head.starts_with("http/1.0 200"), "not a 200: {head}");
    let body = &response[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok(String::from_utf8_lossy(body).into_owned());
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").context("truncated chunk")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).context("bad chunk size")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            break;
        }
        ensure!(rest.len() >= size, "truncated chunk");
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

// ---------------------------------------------------------------------------------------------
// Running it.

/// How often the lab's prober probes during an eval: 4 times kubelet's rate, so that a measured
/// outage is quantized by 250 ms at each end, not by 1 s (see [`dm_lab::LabOptions`]).
pub const PROBE_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

/// `cargo xtask eval`.
pub fn eval(options: EvalOptions) -> anyhow::Result<()> {
    require_root("eval")?;
    ensure!(options.repeat >= 1, "--repeat must be at least 1");
    ensure!(options.soak_minutes >= 0.0 && options.soak_minutes.is_finite(), "--soak-minutes must be ≥ 0");
    let scenarios = parse_scenarios(options.scenarios.as_deref())?;
    let seed = options.seed.unwrap_or_else(draw_seed);
    println!("==> seed {seed} (the same seed and options replay the same fault plans: --seed {seed})");
    // (agent, lab, out dir, the repository root: for its commit, and EVALUATION.md on the host).
    let (agent_binary, lab_binary, out_dir, root) = match &options.guest {
        Some(guest) => (
            guest.agent.clone(),
            guest.lab.clone(),
            guest.out_dir.clone(),
            std::env::current_dir().context("the working directory")?,
        ),
        None => {
            setup::ensure_ready()?;
            let workspace = Workspace::locate()?;
            let agent = build::build_agent(&workspace, false)?;
            let lab = build::build_lab(&workspace)?;
            (agent, lab, workspace.target_dir.join("eval"), workspace.root)
        }
    };
    let logs = out_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let date = Timestamp::now();
    let clock = Instant::now();

    println!("==> lab up ({} datapath)", options.datapath);
    let lab_options = LabOptions { probe_period: PROBE_PERIOD, datapath: options.datapath };
    let result = Lab::up_with(&lab_binary, lab_options).and_then(|mut lab| {
        let result = eval_in(&mut lab, &agent_binary, &scenarios, &options, seed, &out_dir, &logs);
        lab.stop_soak();
        lab.stop_noise();
        result
    });
    println!("==> lab down");
    if let Err(error) = Lab::down() {
        eprintln!("warning: lab down: {error:#}");
    }
    let (runs, soak) = result?;

    let mut command_line = format!("cargo xtask eval --repeat {} --seed {seed}", options.repeat);
    if let Some(list) = &options.scenarios {
        let _ = write!(command_line, " --scenarios {list}");
    }
    if options.no_soak {
        command_line.push_str(" --no-soak");
    } else {
        let _ = write!(command_line, " --soak-minutes {}", options.soak_minutes);
    }
    let meta = Meta {
        command: command_line,
        date,
        kernel: command::stdout(std::process::Command::new("uname").arg("-r"))
            .map(|k| k.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
        commit: command::stdout(std::process::Command::new("git").current_dir(&root).args([
            "rev-parse",
            "--short",
            "HEAD",
        ]))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into()),
        repeat: options.repeat,
        seed,
        datapath: options.datapath,
        soak_minutes: (!options.no_soak).then_some(options.soak_minutes),
        total_seconds: clock.elapsed().as_secs_f64(),
    };
    write_results(&out_dir, seed, &runs, soak.as_ref())?;
    let report = render(&meta, &runs, soak.as_ref());
    let path = if options.guest.is_some() {
        let path = out_dir.join(GUEST_REPORT);
        fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
        path
    } else {
        // The host's part is replaced; the sections `eval --vm` added are kept.
        let path = root.join("EVALUATION.md");
        let existing = fs::read_to_string(&path).unwrap_or_default();
        fs::write(&path, report::with_host_part(&existing, &report))
            .with_context(|| format!("writing {}", path.display()))?;
        path
    };
    println!("\n{}", report.split("## Per scenario").next().unwrap_or(""));
    println!("wrote {} and {}", path.display(), out_dir.join("results.json").display());
    Ok(())
}

/// A seed for an eval given none: from the clock, small enough to type back.
pub fn draw_seed() -> u64 {
    Rng::new(0).next_u64() >> 16
}

/// `--soak`: `30m`, `90s`, `1h`, `1.5h`, or a bare number of minutes; in minutes.
pub fn parse_soak(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let (number, minutes_per_unit) = if let Some(h) = text.strip_suffix('h') {
        (h, 60.0)
    } else if let Some(m) = text.strip_suffix('m') {
        (m, 1.0)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1.0 / 60.0)
    } else {
        (text, 1.0)
    };
    match number.trim().parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value * minutes_per_unit),
        _ => Err(format!("bad soak duration `{text}` (e.g. 30m, 90s, 1h)")),
    }
}

/// Mixed into a run's seed for its roles' stream.
const ROLES_STREAM: u64 = 0x726f_6c65_7300;

/// The seed of one run's plan: the eval's seed and the run's place, so that a run replays
/// alone (`--seed S --scenarios X --repeat N` draws run N of X as the whole eval did).
fn run_seed(seed: u64, scenario: Scenario, repeat: u32) -> u64 {
    let index = Scenario::ALL.iter().position(|s| *s == scenario).unwrap_or(0) as u64;
    seed ^ (index << 40) ^ u64::from(repeat)
}

fn parse_scenarios(list: Option<&str>) -> anyhow::Result<Vec<Scenario>> {
    let Some(list) = list else { return Ok(Scenario::ALL.to_vec()) };
    let mut scenarios = Vec::new();
    for name in list.split(',').filter(|name| !name.trim().is_empty()) {
        let scenario = Scenario::parse(name).with_context(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
            format!("unknown scenario {name:?}; one of: {}", names.join(", "))
        })?;
        if !scenarios.contains(&scenario) {
            scenarios.push(scenario);
        }
    }
    if scenarios.is_empty() {
        bail!("--scenarios names no scenario");
    }
    Ok(scenarios)
}

fn eval_in(
    lab: &mut Lab,
    agent_binary: &Path,
    scenarios: &[Scenario],
    options: &EvalOptions,
    seed: u64,
    out_dir: &Path,
    logs: &Path,
) -> anyhow::Result<(Vec<RunRecord>, Option<SoakRecord>)> {
    let mut runs = Vec::new();
    for repeat in 1..=options.repeat {
        for &scenario in scenarios {
            let plan = FaultPlan::draw(scenario, &mut Rng::from_seed(run_seed(seed, scenario, repeat)));
            // Its own stream: the plans stay what the same seed drew before roles were drawn.
            let roles = Roles::draw(&mut Rng::from_seed(run_seed(seed, scenario, repeat) ^ ROLES_STREAM));
            let run = run_once(lab, agent_binary, scenario, repeat, &plan, &roles, logs);
            lab.stop_noise();
            let run = run.with_context(|| format!("{scenario} run {repeat} ({})", plan.describe(scenario)))?;
            let a = assess(&run);
            println!(
                "    => {} incident(s); matched: {}; top cause {}; onset {} duration {} latency {} (prober), false {}, pods {}",
                run.incidents.len(),
                a.matched.map_or("none".to_string(), |i| run.incidents[i].view.id.clone()),
                a.matched.map_or("—".to_string(), |i| run.incidents[i].view.top_cause()),
                signed(a.onset_error_prober),
                signed(a.duration_error_prober),
                plain(a.latency),
                a.false_incidents,
                a.pods.map_or("—".to_string(), |p| format!(
                    "{} of {} named right, {} in truth",
                    p.right, p.named, p.truth
                )),
            );
            runs.push(run);
            write_results(out_dir, seed, &runs, None)?;
        }
    }
    let soak = if options.no_soak { None } else { Some(run_soak(lab, agent_binary, options.soak_minutes, logs)?) };
    Ok((runs, soak))
}

fn run_once(
    lab: &mut Lab,
    agent_binary: &Path,
    scenario: Scenario,
    repeat: u32,
    plan: &FaultPlan,
    roles: &Roles,
    logs: &Path,
) -> anyhow::Result<RunRecord> {
    println!(
        "==> {scenario} run {repeat}: {}, {:.1} s after the agent is ready; {}",
        plan.describe(scenario),
        plan.delay_seconds,
        roles.describe()
    );
    lab.assign_roles(roles).context("moving the probe and the stream")?;
    let lab: &Lab = lab;
    if lab.start_noise(scenario)? {
        println!("    noise started {} s before the agent", NOISE_BEFORE_AGENT.as_secs());
        thread::sleep(NOISE_BEFORE_AGENT);
    }
    let log = logs.join(format!("agent-{scenario}-{repeat}.log"));
    let mut agent = LabAgent::start_fresh(agent_binary, lab, &log)?;
    let agent_ready = Timestamp::now();
    let poller = Poller::start()?;
    let waited = wait_watching(&mut agent, plan.delay(), &log);
    let report =
        waited.and_then(|()| lab.disrupt_planned(scenario, plan, &mut |at, step| println!("    {at:.3}  {step}")));
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            poller.finish();
            let _ = agent.stop();
            return Err(error);
        }
    };
    let after = Instant::now();
    loop {
        thread::sleep(Duration::from_millis(200));
        agent.check_running().with_context(|| format!("see {}", log.display()))?;
        let (count, all_closed) = poller.snapshot();
        if (count == 0 && after.elapsed() >= NO_INCIDENT_WAIT)
            || (count > 0 && all_closed)
            || after.elapsed() >= CLOSE_TIMEOUT
        {
            break;
        }
    }
    let (incidents, polls) = poller.finish();
    agent.stop().with_context(|| format!("see {}", log.display()))?;
    polls.check(&log)?;
    Ok(record(lab, scenario, repeat, *plan, agent_ready, &report, incidents))
}

/// Waits `delay`, checking every 200 ms that the agent still runs.
fn wait_watching(agent: &mut LabAgent, delay: Duration, log: &Path) -> anyhow::Result<()> {
    let until = Instant::now() + delay;
    while Instant::now() < until {
        thread::sleep(Duration::from_millis(200).min(until.saturating_duration_since(Instant::now())));
        agent.check_running().with_context(|| format!("see {}", log.display()))?;
    }
    Ok(())
}

fn record(
    lab: &Lab,
    scenario: Scenario,
    repeat: u32,
    plan: FaultPlan,
    agent_ready: Timestamp,
    report: &ScenarioReport,
    incidents: Vec<SeenIncident>,
) -> RunRecord {
    // Re-read the UDP log now: a datagram is declared lost 1 s after sending, so the report's
    // own window may lack the last losses.
    let udp = probe_log::parse_udp(&fs::read_to_string(lab.udp_log()).unwrap_or_default());
    let udp_loss = probe_log::udp_loss_window(&udp, report.started, report.finished).or(report.udp_loss.clone());
    // The pods that lost traffic in truth: the prober's target when a probe failed, both ends
    // of the UDP stream when a datagram was lost.
    let roles = &lab.roles;
    let mut truth: Vec<&str> = Vec::new();
    if report.outage.is_some() {
        truth.push(&roles.probed);
    }
    if udp_loss.is_some() {
        truth.extend([roles.stream_client.as_str(), roles.stream_server.as_str()]);
    }
    truth.sort_unstable();
    truth.dedup();
    let truth_pods = lab.pod_names(truth);
    RunRecord {
        scenario,
        repeat,
        plan,
        roles: roles.clone(),
        truth_pods,
        agent_ready,
        started: report.started,
        finished: report.finished,
        outage: report.outage.clone(),
        udp_loss,
        udp_sent: report.udp_sent,
        udp_received: report.udp_received,
        incidents,
        report: serde_json::to_value(report).unwrap_or(Value::Null),
    }
}

fn run_soak(lab: &Lab, agent_binary: &Path, minutes: f64, logs: &Path) -> anyhow::Result<SoakRecord> {
    println!("==> soak: {minutes} min of natural traffic (no fault), fresh agent");
    let log = logs.join("agent-soak.log");
    let mut agent = LabAgent::start_fresh(agent_binary, lab, &log)?;
    let poller = Poller::start()?;
    thread::sleep(SOAK_WARMUP);
    let started = Timestamp::now();
    let soak = lab.start_soak();
    let result = soak.and_then(|_| {
        let until = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
        let mut reported = 0;
        while Instant::now() < until {
            thread::sleep(Duration::from_secs(1).min(until.saturating_duration_since(Instant::now())));
            agent.check_running().with_context(|| format!("see {}", log.display()))?;
            let (count, _) = poller.snapshot();
            if count != reported {
                println!("    {:.3}  the agent reports {count} incident(s)", Timestamp::now());
                reported = count;
            }
        }
        Ok(())
    });
    let finished = Timestamp::now();
    let (incidents, polls) = poller.finish();
    let stopped = agent.stop().with_context(|| format!("see {}", log.display()));
    lab.stop_soak();
    result?;
    stopped?;
    polls.check(&log)?;
    let failed_probes: Vec<Timestamp> =
        lab.probes(Some(started))?.into_iter().filter(|p| !p.ok && p.at <= finished).map(|p| p.at).collect();
    let udp: Vec<UdpSecond> = probe_log::parse_udp(&fs::read_to_string(lab.udp_log()).unwrap_or_default())
        .into_iter()
        .filter(|s| s.at >= started)
        .collect();
    let (udp_sent, udp_received) = probe_log::udp_totals(&udp, started, finished);
    // Soak daemons' own tallies, kept with the agent logs.
    for name in ["soak-client", "soak-apiserver", "soak-web"] {
        let _ = fs::copy(lab.logs_dir().join(format!("{name}.log")), logs.join(format!("{name}.log")));
    }
    check_soak_traffic(&soak::traffic_tallies(lab.logs_dir().as_path()))?;
    Ok(SoakRecord { minutes, started, finished, incidents, failed_probes, udp, udp_sent, udp_received })
}

/// Of each soak behaviour's requests, at least this share must have been answered as expected:
/// a soak whose traffic did not flow proves nothing by its lack of incidents.
const SOAK_ANSWERED_FLOOR: f64 = 0.95;

/// Err when a soak behaviour logged no result, or fewer than [`SOAK_ANSWERED_FLOOR`] of its
/// requests were answered.
fn check_soak_traffic(tallies: &[soak::TrafficTally]) -> anyhow::Result<()> {
    let mut short = Vec::new();
    for soak::TrafficTally { daemon, behaviour, ok, failed } in tallies {
        let total = ok + failed;
        let share = if total == 0 { 0.0 } else { *ok as f64 / total as f64 };
        println!("    soak traffic {daemon} {behaviour}: {ok} of {total} answered ({:.1} %)", share * 100.0);
        if share < SOAK_ANSWERED_FLOOR {
            short.push(format!("{daemon} {behaviour}: {ok} of {total}"));
        }
    }
    ensure!(
        short.is_empty(),
        "soak traffic below the floor of {:.0} % answered: {}",
        SOAK_ANSWERED_FLOOR * 100.0,
        short.join("; ")
    );
    Ok(())
}

fn seen_json(seen: &SeenIncident) -> Value {
    json!({ "first_seen": format!("{:.3}", seen.first_seen), "incident": seen.raw })
}

fn write_results(out_dir: &Path, seed: u64, runs: &[RunRecord], soak: Option<&SoakRecord>) -> anyhow::Result<()> {
    let runs: Vec<Value> = runs
        .iter()
        .map(|run| {
            let a = assess(run);
            json!({
                "scenario": run.scenario.name(),
                "repeat": run.repeat,
                "plan": run.plan,
                "plan_text": run.plan.describe(run.scenario),
                "roles": run.roles,
                "truth_pods": run.truth_pods,
                "agent_ready": format!("{:.3}", run.agent_ready),
                "report": run.report,
                "udp_loss": run.udp_loss.as_ref().map(|l| json!({
                    "first_lost": format!("{:.3}", l.first_lost), "last_lost": format!("{:.3}", l.last_lost), "lost": l.lost,
                })),
                "incidents": run.incidents.iter().map(seen_json).collect::<Vec<_>>(),
                "assessment": {
                    "expected": expected_text(expected(run.scenario)),
                    "matched": a.matched.map(|i| run.incidents[i].view.id.clone()),
                    "top1_correct": a.top1_correct,
                    "false_incidents": a.false_incidents,
                    "onset_error_prober": a.onset_error_prober,
                    "duration_error_prober": a.duration_error_prober,
                    "onset_error_udp": a.onset_error_udp,
                    "duration_error_udp": a.duration_error_udp,
                    "latency": a.latency,
                    "lost_reported": a.lost_reported,
                    "lost_truth": a.lost_truth,
                    "pods": a.pods.map(|p| json!({ "named": p.named, "right": p.right, "truth": p.truth })),
                },
            })
        })
        .collect();
    let soak = soak.map(|soak| {
        let (false_, real) = soak.counts();
        json!({
            "minutes": soak.minutes,
            "started": format!("{:.3}", soak.started),
            "finished": format!("{:.3}", soak.finished),
            "incidents": soak.incidents.iter().map(seen_json).collect::<Vec<_>>(),
            "false_incidents": false_,
            "incidents_with_real_loss": real,
            "failed_probes": soak.failed_probes.iter().map(|at| format!("{at:.3}")).collect::<Vec<_>>(),
            "udp_sent": soak.udp_sent,
            "udp_received": soak.udp_received,
            "udp_lost": soak.udp.iter().map(|s| s.lost).sum::<u64>(),
            "udp_loss_seconds": soak.udp.iter().filter(|s| s.lost > 0).map(|s| json!({
                "at": format!("{:.3}", s.at),
                "lost": s.lost,
                "first_lost_at": s.first_lost_at.map(|t| format!("{t:.3}")),
                "last_lost_at": s.last_lost_at.map(|t| format!("{t:.3}")),
            })).collect::<Vec<_>>(),
        })
    });
    let path: PathBuf = out_dir.join("results.json");
    let text = serde_json::to_string_pretty(&json!({ "seed": seed, "runs": runs, "soak": soak }))?;
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soak_traffic_below_the_floor_or_silent_fails_the_eval() {
        let tally = |behaviour, ok, failed| soak::TrafficTally { daemon: "soak-client", behaviour, ok, failed };
        assert!(check_soak_traffic(&[tally("onoff", 95, 5), tally("dns", 1000, 0)]).is_ok());
        let error = check_soak_traffic(&[tally("onoff", 94, 6), tally("dns", 0, 0)]).unwrap_err().to_string();
        assert!(error.contains("soak-client onoff: 94 of 100") && error.contains("dns: 0 of 0"), "{error}");
    }

    #[test]
    fn any_failed_poll_fails_the_run() {
        let log = Path::new("agent.log");
        assert!(PollSummary { polls: 40, errors: 0, first_error: None }.check(log).is_ok());
        let summary = PollSummary { polls: 40, errors: 1, first_error: Some("connection refused".to_owned()) };
        let error = summary.check(log).unwrap_err().to_string();
        assert!(error.contains("1 of 40 polls") && error.contains("connection refused"), "{error}");
    }

    #[test]
    fn soak_durations_and_run_seeds() {
        assert_eq!(parse_soak("30m"), Ok(30.0));
        assert_eq!(parse_soak("1.5h"), Ok(90.0));
        assert_eq!(parse_soak("90s"), Ok(1.5));
        assert_eq!(parse_soak("5"), Ok(5.0));
        assert!(parse_soak("-1m").is_err() && parse_soak("soon").is_err());
        // A run's plan depends on the seed, the scenario and the repeat only.
        let plan =
            |seed, scenario, repeat| FaultPlan::draw(scenario, &mut Rng::from_seed(run_seed(seed, scenario, repeat)));
        assert_eq!(plan(9, Scenario::OvsRestart, 2), plan(9, Scenario::OvsRestart, 2));
        assert_ne!(plan(9, Scenario::OvsRestart, 2), plan(9, Scenario::OvsRestart, 3));
        assert_ne!(plan(9, Scenario::OvsRestart, 2), plan(10, Scenario::OvsRestart, 2));
    }

    #[test]
    fn chunked_and_plain_responses_parse() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]";
        assert_eq!(parse_http_response(plain).unwrap(), "[]");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[{}\r\n1\r\n]\r\n0\r\n\r\n";
        assert_eq!(parse_http_response(chunked).unwrap(), "[{}]");
        assert!(parse_http_response(b"HTTP/1.1 503 Unavailable\r\n\r\n").is_err());
    }
}
