//! Test VMs: `cargo xtask vm`, `cargo xtask run --vm` and the kernel matrix of `cargo xtask
//! test`. A guest boots a Debian kernel of the chosen series under QEMU with the host's root
//! as its (read-only, RAM-overlaid) userland, so the workspace's built binaries, ip, iptables
//! and OVS's tools are all there at the same paths.

mod guest;
mod kernel;

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

pub use self::kernel::Kernel;
use crate::{
    build,
    command::{self, Workspace},
    exclusions, setup,
};

/// Where the agent listens in a guest started by `vm` or `run --vm`; forwarded to the host.
const GUEST_AGENT_PORT: u16 = 9781;
/// Guest CPU work runs 4–15× slower than on the host (software emulation): the end-to-end
/// harness stretches its waits by this factor, never its assertions.
const TIME_SCALE: u32 = 6;
/// One kernel's whole end-to-end run, boot included, must fit in this.
const TEST_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// What the apt packages of setup must provide for test VMs, or why not.
pub fn missing_tools() -> Vec<String> {
    guest::missing_tools()
}

/// `cargo xtask vm --kernel K [-- CMD...]`: CMD (default: the agent) in a guest; exits with
/// CMD's status.
pub fn vm(kernel: &str, command: &[String]) -> anyhow::Result<()> {
    if command.is_empty() {
        return run_agent(kernel, false, &[]);
    }
    let kernel = Kernel::parse(kernel)?;
    setup::ensure_ready()?;
    let workspace = Workspace::locate()?;
    let prepared = kernel::prepare(kernel)?;
    let script = command.iter().map(|word| command::shell_quote(word)).collect::<Vec<_>>().join(" ");
    let job = guest::Job {
        script: format!("exec {script}\n"),
        workdir: std::env::current_dir().unwrap_or(workspace.root),
        forward_ports: Vec::new(),
        timeout: None,
        console_log: None,
        console_prefix: String::new(),
        writable: None,
    };
    exit_with(guest::run(&prepared, &job)?.status)
}

/// `cargo xtask run --vm K [-- ARGS]`: the agent in a guest, its API forwarded to the host's
/// 127.0.0.1:9781, so `datapath-monitor status` on the host watches the guest's kernel.
pub fn run_agent(kernel: &str, release: bool, args: &[String]) -> anyhow::Result<()> {
    let kernel = Kernel::parse(kernel)?;
    let agent = build::build(release)?;
    let workspace = Workspace::locate()?;
    let prepared = kernel::prepare(kernel)?;
    let mut words = vec![agent.to_str().context("agent path")?.to_owned(), "run".to_owned()];
    if !args.iter().any(|arg| arg == "--listen" || arg.starts_with("--listen=")) {
        words.extend(["--listen".to_owned(), format!("0.0.0.0:{GUEST_AGENT_PORT}")]);
    }
    words.extend(args.iter().cloned());
    let line = words.iter().map(|word| command::shell_quote(word)).collect::<Vec<_>>().join(" ");
    println!(
        "==> the agent in a Linux {} guest; from this host: `datapath-monitor status --server http://127.0.0.1:{GUEST_AGENT_PORT}` \
         (Ctrl-C stops the guest)",
        kernel.name()
    );
    let job = guest::Job {
        script: format!("exec {line}\n"),
        workdir: workspace.root,
        forward_ports: vec![GUEST_AGENT_PORT],
        timeout: None,
        console_log: None,
        console_prefix: String::new(),
        writable: None,
    };
    exit_with(guest::run(&prepared, &job)?.status)
}

/// What a command run in a guest needs from the host: the kernel prepared, the agent and the
/// lab built, and this xtask to run there.
struct GuestHalf {
    kernel: Kernel,
    workspace: Workspace,
    agent: std::path::PathBuf,
    lab: std::path::PathBuf,
    xtask: std::path::PathBuf,
    prepared: kernel::PreparedKernel,
}

impl GuestHalf {
    fn build(kernel: &str, what: &str) -> anyhow::Result<Self> {
        crate::lab::require_root(what)?;
        let kernel = Kernel::parse(kernel)?;
        setup::ensure_ready()?;
        let workspace = Workspace::locate()?;
        let agent = build::build_agent(&workspace, false)?;
        let lab = build::build_lab(&workspace)?;
        let xtask = std::env::current_exe().context("cannot find the xtask executable")?;
        let prepared = kernel::prepare(kernel)?;
        Ok(Self { kernel, workspace, agent, lab, xtask, prepared })
    }
}

/// `cargo xtask demo --vm K`: builds the agent and the lab here, then runs the whole demo in
/// a guest of kernel K (which has openvswitch.ko) on `datapath`.
pub fn demo(kernel: &str, datapath: dm_lab::Datapath) -> anyhow::Result<()> {
    let GuestHalf { kernel, workspace, agent, lab, xtask, prepared } = GuestHalf::build(kernel, "the demo")?;
    let words = [
        xtask.to_str().context("xtask path")?,
        "demo",
        "--datapath",
        datapath.name(),
        "--agent-bin",
        agent.to_str().context("agent path")?,
        "--lab-bin",
        lab.to_str().context("lab path")?,
    ];
    let line = words.iter().map(|word| command::shell_quote(word)).collect::<Vec<_>>().join(" ");
    println!("==> the demo in a Linux {} guest, OVS {datapath} datapath", kernel.name());
    let job = guest::Job {
        // Waits scale as in the guests' tests: the agent's start-up there is software-emulated.
        script: format!("export DM_TEST_TIME_SCALE={TIME_SCALE}\nexec {line}\n"),
        workdir: workspace.root,
        forward_ports: Vec::new(),
        timeout: None,
        console_log: None,
        console_prefix: String::new(),
        writable: None,
    };
    exit_with(guest::run(&prepared, &job)?.status)
}

/// `cargo xtask eval --vm KERNEL`: the eval in a guest of that kernel, on OVS's kernel
/// datapath, with the agent and lab built here; its report replaces that kernel's section of
/// EVALUATION.md (the host's part and other kernels' sections stay).
pub fn eval(kernel: &str, options: &crate::eval::EvalOptions) -> anyhow::Result<()> {
    let GuestHalf { kernel, workspace, agent, lab, xtask, prepared } = GuestHalf::build(kernel, "eval")?;
    let out_dir = workspace.target_dir.join("eval").join(format!("vm-{}", kernel.name()));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let report_path = out_dir.join(crate::eval::GUEST_REPORT);
    let _ = std::fs::remove_file(&report_path);
    let seed = options.seed.unwrap_or_else(crate::eval::draw_seed);
    let path = |p: &std::path::Path| p.to_str().map(str::to_owned).context("a path that is not UTF-8");
    let mut words = vec![
        path(&xtask)?,
        "eval".into(),
        "--datapath".into(),
        "kernel".into(),
        "--agent-bin".into(),
        path(&agent)?,
        "--lab-bin".into(),
        path(&lab)?,
        "--out-dir".into(),
        path(&out_dir)?,
        "--repeat".into(),
        options.repeat.to_string(),
        "--seed".into(),
        seed.to_string(),
    ];
    if let Some(list) = &options.scenarios {
        words.extend(["--scenarios".into(), list.clone()]);
    }
    if options.no_soak {
        words.push("--no-soak".into());
    } else {
        words.extend(["--soak-minutes".into(), options.soak_minutes.to_string()]);
    }
    let line = words.iter().map(|word| command::shell_quote(word)).collect::<Vec<_>>().join(" ");
    println!("==> the eval in a Linux {} guest, OVS kernel datapath, seed {seed}", kernel.name());
    let job = guest::Job {
        script: format!("exec {line}\n"),
        workdir: workspace.root.clone(),
        forward_ports: Vec::new(),
        timeout: None,
        console_log: None,
        console_prefix: String::new(),
        writable: Some(out_dir.clone()),
    };
    let status = guest::run(&prepared, &job)?.status;
    ensure!(status == 0, "the guest's eval exited with status {status}; its logs are in {}", out_dir.display());
    let report = std::fs::read_to_string(&report_path)
        .with_context(|| format!("the guest's eval wrote no report at {}", report_path.display()))?;
    let evaluation = workspace.root.join("EVALUATION.md");
    let existing = std::fs::read_to_string(&evaluation).unwrap_or_default();
    std::fs::write(&evaluation, crate::eval::report::with_vm_section(&existing, kernel.name(), &report))
        .with_context(|| format!("writing {}", evaluation.display()))?;
    println!("wrote the Linux {} section of {}", kernel.name(), evaluation.display());
    Ok(())
}

fn exit_with(status: i32) -> anyhow::Result<()> {
    if status == 0 {
        return Ok(());
    }
    eprintln!("the guest's command exited with status {status}");
    std::process::exit(status.clamp(1, 255));
}

/// The end-to-end suites a guest runs: (cargo package, test target), the agent library's
/// privileged tests first.
const GUEST_SUITES: &[(&str, &str)] = &[
    ("datapath-monitor", "datapath_monitor"),
    ("datapath-monitor-tests", "datapath"),
    ("datapath-monitor-tests", "resilience"),
    ("datapath-monitor-tests", "continuity"),
    ("datapath-monitor-tests", "lifecycle"),
    ("datapath-monitor-tests", "incidents"),
    ("datapath-monitor-tests", "ovs_kernel"),
    // The lab's scenarios on OVS's kernel datapath (DM_LAB_DATAPATH=kernel below).
    ("datapath-monitor-tests", "lab"),
];

/// What one kernel's guest run found.
pub struct KernelReport {
    pub kernel: Kernel,
    pub release: String,
    pub boot_seconds: Option<f64>,
    pub elapsed: Duration,
    pub passed: u32,
    pub failed: u32,
    pub failures: Vec<String>,
    /// The probes' variants as the agent reported them in /readyz, e.g. `tc: clsact`.
    pub probes: Vec<(String, String)>,
    /// (suite, passed, failed, seconds of its tests).
    pub suites: Vec<(String, u32, u32, f64)>,
    /// (test, why): what the runner excluded on this kernel.
    pub excluded: Vec<(String, String)>,
    /// (test, seconds), as the guest timed each test's process.
    pub tests: Vec<(String, f64)>,
    pub status: i32,
}

/// What a guest runs: the release agent and the end-to-end test executables, [`GUEST_SUITES`]
/// order, each with the tests it lists here. Built before any guest boots, so that nothing
/// rebuilds them while guests read them.
pub struct GuestBinaries {
    agent: PathBuf,
    pub suites: Vec<GuestSuite>,
}

/// One end-to-end test executable.
pub struct GuestSuite {
    /// Its test target, e.g. `datapath`.
    pub target: &'static str,
    executable: PathBuf,
    /// Its tests that the run's filter selects, as it lists them on the host.
    tests: Vec<String>,
}

impl GuestBinaries {
    pub fn build(workspace: &Workspace, filter: &[String]) -> anyhow::Result<Self> {
        // The release build, as users run it: under emulation the debug build takes 19 s to be
        // ready (BTF parsing), the release build 3 s, and the tests start the agent 20 times.
        let agent = build::build_agent(workspace, true)?;
        let mut suites = Vec::new();
        for (executable, (_, target)) in build_test_binaries(workspace)?.into_iter().zip(GUEST_SUITES) {
            let all = list_tests(&executable, &[])?;
            ensure!(!all.is_empty(), "{target} ({}) lists no test", executable.display());
            let stale = exclusions::unknown_names(target, &all);
            ensure!(stale.is_empty(), "the exclusions name tests {target} does not have: {}", stale.join(", "));
            let tests = if filter.is_empty() { all } else { list_tests(&executable, filter)? };
            suites.push(GuestSuite { target, executable, tests });
        }
        Ok(Self { agent, suites })
    }
}

/// The ignored (privileged) tests `executable` lists, as `--ignored --list` names them.
fn list_tests(executable: &Path, filter: &[String]) -> anyhow::Result<Vec<String>> {
    let mut list = Command::new(executable);
    list.args(["--ignored", "--list", "--format=terse"]).args(filter);
    let listing =
        command::stdout(&mut list).with_context(|| format!("listing the tests of {}", executable.display()))?;
    Ok(listing.lines().filter_map(|line| line.strip_suffix(": test")).map(str::to_owned).collect())
}

/// Runs the end-to-end suites in a guest of each kernel, all guests at once (each is one
/// single-threaded TCG process, so two guests use both cores of a 2-core host), all kernels
/// even when one fails; prints the per-kernel summary; fails if any kernel failed.
pub fn test_kernels(
    workspace: &Workspace,
    kernels: &[Kernel],
    binaries: &GuestBinaries,
    lab: &Path,
) -> anyhow::Result<Vec<KernelReport>> {
    let missing = missing_tools();
    if !missing.is_empty() {
        bail!("missing for test VMs: {} (run `cargo xtask setup`)", missing.join(", "));
    }
    let logs = workspace.target_dir.join("vm-logs");
    fs::create_dir_all(&logs)?;
    // One at a time: a kernel not yet cached is fetched with apt.
    let prepared = kernels.iter().map(|&kernel| kernel::prepare(kernel)).collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let reports: Vec<KernelReport> = thread::scope(|scope| {
        let guests: Vec<_> = prepared
            .iter()
            .map(|prepared| {
                let features = exclusions::KernelFeatures::of_release(&prepared.release, has_openvswitch(prepared));
                let job = guest::Job {
                    script: test_script(binaries, features, lab),
                    workdir: workspace.root.clone(),
                    forward_ports: Vec::new(),
                    timeout: Some(TEST_TIMEOUT),
                    console_log: Some(logs.join(format!("{}.log", prepared.kernel.name()))),
                    console_prefix: format!("[{}] ", prepared.kernel.name()),
                    writable: None,
                };
                scope.spawn(move || test_one_kernel(prepared, &job, started))
            })
            .collect();
        guests
            .into_iter()
            .zip(&prepared)
            .map(|(guest, prepared)| {
                guest.join().unwrap_or_else(|_| {
                    KernelReport::failed(prepared, started.elapsed(), "the thread running it panicked".to_owned())
                })
            })
            .collect()
    });
    println!("\n{}", summary(&reports));
    println!("console logs: {}", logs.display());
    let failed: Vec<&str> = reports.iter().filter(|report| !report.passed()).map(|r| r.kernel.name()).collect();
    if !failed.is_empty() {
        bail!("end-to-end tests failed in the Linux {} guest(s)", failed.join(", "));
    }
    Ok(reports)
}

/// Whether the kernel package ships openvswitch.ko (the guest's modprobe loads it from there).
fn has_openvswitch(prepared: &kernel::PreparedKernel) -> bool {
    fs::read_to_string(prepared.modules.join("modules.dep")).is_ok_and(|dep| dep.contains("/openvswitch.ko"))
}

/// One guest's boot and run, booted once more when it never reached its userland.
fn test_one_kernel(prepared: &kernel::PreparedKernel, job: &guest::Job, started: Instant) -> KernelReport {
    let kernel = prepared.kernel;
    println!("==> end-to-end tests in a Linux {} guest", kernel.name());
    let mut outcome = guest::run(prepared, job);
    if let Err(error) = &outcome
        && error.downcast_ref::<guest::BootFailed>().is_some()
    {
        println!("==> the Linux {} guest failed to boot (no test ran): booting it once more", kernel.name());
        outcome = guest::run(prepared, job);
    }
    match outcome {
        Ok(outcome) => KernelReport::read(kernel, &prepared.release, &outcome, started.elapsed()),
        Err(error) => {
            println!("error: Linux {} guest: {error:#}", kernel.name());
            KernelReport::failed(prepared, started.elapsed(), format!("guest: {error}"))
        }
    }
}

/// `cargo test --no-run` for the guest suites; their executables in [`GUEST_SUITES`] order.
fn build_test_binaries(workspace: &Workspace) -> anyhow::Result<Vec<PathBuf>> {
    let mut cargo = command::cargo();
    cargo.current_dir(&workspace.root).args(["test", "--no-run", "--message-format=json-render-diagnostics"]);
    for package in GUEST_SUITES.iter().map(|(package, _)| *package).collect::<std::collections::BTreeSet<_>>() {
        cargo.args(["--package", package]);
    }
    println!("$ {}", command::display(&cargo));
    let output = command::stdout(&mut cargo).context("building the end-to-end test binaries")?;
    let mut found = Vec::new();
    for (package, target) in GUEST_SUITES {
        let executable = output.lines().find_map(|line| {
            let message: serde_json::Value = serde_json::from_str(line).ok()?;
            let package_matches = message["package_id"].as_str().is_some_and(|id| {
                id.contains(&format!("#{package}@"))
                    || id.contains(&format!("/{package}#"))
                    || id.contains(&format!("{package} "))
            });
            (message["reason"] == "compiler-artifact"
                && message["profile"]["test"] == true
                && message["target"]["name"] == *target
                && package_matches)
                .then(|| message["executable"].as_str().map(PathBuf::from))
                .flatten()
        });
        found.push(executable.with_context(|| format!("cargo built no test executable {package}/{target}"))?);
    }
    Ok(found)
}

/// The guest's job: a probe report from the agent, then each suite's tests as listed on the
/// host, less those this kernel cannot run (said as `DM-VM-EXCLUDED:` lines), one at a time.
/// Each suite's line carries how many tests it must run: the report checks that many ran.
fn test_script(binaries: &GuestBinaries, features: exclusions::KernelFeatures, lab: &Path) -> String {
    let quote = |path: &Path| command::shell_quote(&path.to_string_lossy());
    let mut script = String::new();
    let ci = std::env::var("CI").unwrap_or_default();
    let _ = writeln!(script, "export DATAPATH_MONITOR_BIN={} DM_LAB_BIN={}", quote(&binaries.agent), quote(lab));
    let _ = writeln!(
        script,
        "export DM_TEST_TIME_SCALE={TIME_SCALE} DM_TEST_IN_GUEST=1 DM_LAB_DATAPATH=kernel CI={}",
        command::shell_quote(&ci)
    );
    let _ = writeln!(script, "export RUST_BACKTRACE=1");
    script.push_str(PROBE_REPORT);
    script.push_str("failed=0\n");
    // One test per process, timed: the summary shows where a slow guest spends its time.
    script.push_str("TIMEFORMAT='DM-VM-TIME: %R'\n");
    for suite in &binaries.suites {
        let excluded = features.excluded(suite.target);
        let tests: Vec<&String> =
            suite.tests.iter().filter(|test| !excluded.iter().any(|(name, _)| *name == test.as_str())).collect();
        let _ = writeln!(script, "echo 'DM-VM-SUITE: {} {}'", suite.target, tests.len());
        for (name, why) in excluded.iter().filter(|(name, _)| suite.tests.iter().any(|test| test == name)) {
            let _ = writeln!(script, "echo {}", command::shell_quote(&format!("DM-VM-EXCLUDED: {name}: {why}")));
        }
        let binary = quote(&suite.executable);
        for test in tests {
            let test = command::shell_quote(test);
            let _ = writeln!(
                script,
                "echo DM-VM-TEST: {test}\ntime {binary} --ignored --exact --color=never {test} || failed=1"
            );
        }
    }
    script.push_str("exit $failed\n");
    script
}

/// Starts the agent once with a pod veth present and prints its /readyz probes on one line.
const PROBE_REPORT: &str = r#"
ip netns add dmvm-probe
ip link add vethdmvm0001 type veth peer name eth0 netns dmvm-probe
ip link set vethdmvm0001 up
"$DATAPATH_MONITOR_BIN" run --listen 127.0.0.1:9799 --state-dir /tmp/dmvm-probe >/tmp/dmvm-probe.log 2>&1 &
agent=$!
readyz=""
for _ in $(seq 1 240); do
    readyz=$(curl -sf http://127.0.0.1:9799/readyz) && break
    sleep 0.5
done
echo "DM-VM-PROBES: $readyz"
kill -TERM $agent; wait $agent
grep -E 'WARN|ERROR' /tmp/dmvm-probe.log | sed 's/^/agent log: /'
ip link del vethdmvm0001
ip netns del dmvm-probe
"#;

impl KernelReport {
    fn failed(prepared: &kernel::PreparedKernel, elapsed: Duration, why: String) -> Self {
        Self {
            kernel: prepared.kernel,
            release: prepared.release.clone(),
            boot_seconds: None,
            elapsed,
            passed: 0,
            failed: 0,
            failures: vec![why],
            probes: Vec::new(),
            suites: Vec::new(),
            excluded: Vec::new(),
            tests: Vec::new(),
            status: -1,
        }
    }

    /// The guest's job passed, and every suite ran each test it had to.
    fn passed(&self) -> bool {
        self.status == 0 && self.failures.is_empty()
    }

    fn read(kernel: Kernel, release: &str, outcome: &guest::Outcome, elapsed: Duration) -> Self {
        let mut report = Self {
            kernel,
            release: release.to_owned(),
            boot_seconds: outcome.boot_seconds,
            elapsed,
            passed: 0,
            failed: 0,
            failures: Vec::new(),
            probes: Vec::new(),
            suites: Vec::new(),
            excluded: Vec::new(),
            tests: Vec::new(),
            status: outcome.status,
        };
        let mut test = String::new();
        let mut expected = Vec::new();
        for line in outcome.console.lines() {
            let line = without_colors(line);
            let line = line.as_str();
            if let Some(suite) = line.strip_prefix("DM-VM-SUITE: ") {
                let (name, count) = suite.rsplit_once(' ').unwrap_or((suite, ""));
                expected.push(count.parse::<u32>().unwrap_or(u32::MAX));
                report.suites.push((name.to_owned(), 0, 0, 0.0));
            } else if let Some(excluded) = line.strip_prefix("DM-VM-EXCLUDED: ") {
                let (name, why) = excluded.split_once(": ").unwrap_or((excluded, ""));
                report.excluded.push((name.to_owned(), why.to_owned()));
            } else if let Some(name) = line.strip_prefix("DM-VM-TEST: ") {
                test = name.to_owned();
            } else if let Some(seconds) = line.strip_prefix("DM-VM-TIME: ") {
                let seconds = seconds.trim().parse().unwrap_or(f64::NAN);
                report.tests.push((test.clone(), seconds));
                if let Some(suite) = report.suites.last_mut() {
                    suite.3 += seconds;
                }
            } else if let Some(counts) = line.strip_prefix("test result: ") {
                let (passed, failed) = (count_before(counts, " passed"), count_before(counts, " failed"));
                report.passed += passed;
                report.failed += failed;
                if let Some(suite) = report.suites.last_mut() {
                    suite.1 += passed;
                    suite.2 += failed;
                }
            } else if let Some(name) = line.strip_prefix("test ").and_then(|rest| rest.strip_suffix(" ... FAILED")) {
                report.failures.push(name.to_owned());
            } else if let Some(json) = line.strip_prefix("DM-VM-PROBES: ") {
                report.probes = probe_variants(json);
            }
        }
        // A suite that ran fewer tests than it had (an executable that would not start, a
        // guest that stopped) or none at all has not passed, whatever its exit status.
        for ((suite, passed, failed, _), expected) in report.suites.iter().zip(&expected) {
            if passed + failed != *expected {
                report.failures.push(format!("{suite}: {} of {expected} tests ran", passed + failed));
            }
        }
        if report.suites.len() != GUEST_SUITES.len() && report.status == 0 {
            report.failures.push(format!("{} of {} suites ran", report.suites.len(), GUEST_SUITES.len()));
        }
        report
    }
}

/// `line` without ANSI color sequences (libtest colors its results even on a serial console).
fn without_colors(line: &str) -> String {
    let mut text = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, then one final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else if !c.is_control() {
            text.push(c);
        }
    }
    text
}

/// `N` in `...; N passed; ...`.
pub(crate) fn count_before(counts: &str, label: &str) -> u32 {
    counts
        .split(';')
        .find_map(|part| {
            part.trim().trim_start_matches("ok. ").trim_start_matches("FAILED. ").strip_suffix(label.trim_start())
        })
        .and_then(|number| number.trim().parse().ok())
        .unwrap_or(0)
}

/// `{"probes":{"probes":{"tc":"clsact",...},"errors":{...}}}` → `[("tc", "clsact"), ...]`;
/// an unsupported probe reads `unsupported: <why>`.
fn probe_variants(readyz: &str) -> Vec<(String, String)> {
    let Ok(body) = serde_json::from_str::<serde_json::Value>(readyz) else {
        return vec![("readyz".to_owned(), format!("no answer ({readyz:?})"))];
    };
    let report = &body["probes"];
    let Some(probes) = report["probes"].as_object() else { return Vec::new() };
    probes
        .iter()
        .map(|(probe, variant)| {
            let variant = match variant.as_str() {
                Some(variant) => variant.to_owned(),
                None => format!("unsupported: {}", report["errors"][probe].as_str().unwrap_or("?")),
            };
            (probe.clone(), variant)
        })
        .collect()
}

/// The per-kernel table printed at the end of a matrix run.
pub fn summary(reports: &[KernelReport]) -> String {
    let mut text = String::from("kernel matrix:\n");
    let _ = writeln!(
        text,
        "  {:<6} {:<28} {:>6} {:>7} {:>7} {:>8}  probes",
        "kernel", "release", "boot", "passed", "failed", "total"
    );
    for report in reports {
        let probes = report.probes.iter().map(|(probe, variant)| format!("{probe}={variant}")).collect::<Vec<_>>();
        let _ = writeln!(
            text,
            "  {:<6} {:<28} {:>6} {:>7} {:>7} {:>7.0}s  {}",
            report.kernel.name(),
            report.release,
            report.boot_seconds.map_or_else(|| "-".to_owned(), |seconds| format!("{seconds:.1}s")),
            report.passed,
            report.failed,
            report.elapsed.as_secs_f64(),
            probes.join(" ")
        );
        for (suite, passed, failed, seconds) in &report.suites {
            let _ = writeln!(text, "         {suite:<18} {passed:>3} passed {failed:>3} failed {seconds:>7.1}s");
        }
        let mut slowest = report.tests.clone();
        slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
        let slowest: Vec<String> =
            slowest.iter().take(3).map(|(test, seconds)| format!("{test} {seconds:.0}s")).collect();
        if !slowest.is_empty() {
            let _ = writeln!(text, "         slowest: {}", slowest.join(", "));
        }
        for (test, why) in &report.excluded {
            let _ = writeln!(text, "         excluded {test}: {why}");
        }
        for failure in &report.failures {
            let _ = writeln!(text, "         FAILED {failure}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_counts_are_read() {
        let line = "ok. 12 passed; 1 failed; 0 ignored; 0 measured; 40 filtered out; finished in 1.20s";
        assert_eq!(count_before(line, " passed"), 12);
        assert_eq!(count_before(line, " failed"), 1);
        assert_eq!(count_before("FAILED. 3 passed; 2 failed; 0 ignored", " passed"), 3);
    }

    fn report_of(console: &str) -> KernelReport {
        let outcome = guest::Outcome { status: 0, boot_seconds: Some(3.0), console: console.to_owned() };
        KernelReport::read(Kernel::V6_1, "6.1.0-57-cloud-amd64", &outcome, Duration::from_secs(60))
    }

    fn suite_console(suite: &str, expected: u32, passed: u32) -> String {
        let mut console = format!("DM-VM-SUITE: {suite} {expected}\n");
        for n in 0..passed {
            console.push_str(&format!(
                "DM-VM-TEST: t{n}\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; \
                 finished in 1.00s\nDM-VM-TIME: 1.1\n"
            ));
        }
        console
    }

    #[test]
    fn a_guest_passes_only_when_every_suite_ran_each_of_its_tests() {
        let all: String = GUEST_SUITES.iter().map(|(_, suite)| suite_console(suite, 2, 2)).collect();
        let report = report_of(&all);
        assert!(report.passed(), "{:?}", report.failures);
        assert_eq!(report.passed, 2 * GUEST_SUITES.len() as u32);

        // One suite's executable ran one test of two (exit status 0 all the same).
        let short: String = GUEST_SUITES
            .iter()
            .enumerate()
            .map(|(index, (_, suite))| suite_console(suite, 2, if index == 1 { 1 } else { 2 }))
            .collect();
        let report = report_of(&short);
        assert!(!report.passed());
        assert_eq!(report.failures, [format!("{}: 1 of 2 tests ran", GUEST_SUITES[1].1)]);

        // The guest stopped after its first suite.
        let report = report_of(&suite_console("datapath_monitor", 2, 2));
        assert_eq!(report.failures, [format!("1 of {} suites ran", GUEST_SUITES.len())]);
    }

    #[test]
    fn the_exclusions_name_only_guest_suites() {
        // The host's exclusions are found through the guest suites' listings.
        for target in exclusions::targets() {
            assert!(GUEST_SUITES.iter().any(|(_, suite)| *suite == target), "{target}");
        }
    }

    #[test]
    fn colors_are_stripped() {
        assert_eq!(without_colors("test result: \x1b[31mFAILED\x1b[m. 3 passed"), "test result: FAILED. 3 passed");
        assert_eq!(without_colors("\x1b[32mok\x1b[m\x0f. 4 passed"), "ok. 4 passed");
        assert_eq!(without_colors("plain"), "plain");
    }

    #[test]
    fn probe_variants_are_read_from_readyz() {
        let body = r#"{"ready":true,"interfaces_attached":1,"probes":{"probes":{"kfree_skb":"tp_btf","sched_process":null,"tc":"clsact"},"errors":{"sched_process":"no BTF"}}}"#;
        assert_eq!(
            probe_variants(body),
            [
                ("kfree_skb".to_owned(), "tp_btf".to_owned()),
                ("sched_process".to_owned(), "unsupported: no BTF".to_owned()),
                ("tc".to_owned(), "clsact".to_owned())
            ]
        );
    }
}
