//! `cargo xtask test`: everything CI runs, in order, stopping at the first failure: fmt,
//! clippy (host and eBPF), unit tests, then the privileged end-to-end tests against the
//! real agent binary.

use std::{
    env,
    io::{self, BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};

use crate::{
    build,
    command::{self, Workspace},
    exclusions, image, setup,
    vm::{self, Kernel},
};

/// Only for the bpf target; the agent's build.rs builds it, step "clippy (eBPF)" lints it.
const EBPF_PACKAGE: &str = "monitor-ebpf";
const E2E_PACKAGE: &str = "datapath-monitor-tests";
const AGENT_PACKAGE: &str = "datapath-monitor";
/// How the end-to-end tests find the agent they start.
const AGENT_BIN_VAR: &str = "DATAPATH_MONITOR_BIN";
/// How the lab scenario tests find the lab's binary.
const LAB_BIN_VAR: &str = "DM_LAB_BIN";
/// The agent image (`cargo xtask image`) the image end-to-end test runs.
const IMAGE_VAR: &str = "DM_IMAGE";

/// Which halves of the run to do: `--unit` is fmt, clippy and unit tests; `--e2e` the rest.
pub struct Selection {
    pub unit: bool,
    pub e2e: bool,
    /// Test VMs to run the end-to-end tests in; None: the default matrix after the host's.
    pub kernels: Option<Vec<Kernel>>,
}

/// `cargo xtask test [--unit | --e2e] [-- FILTER]`.
pub fn test(selection: Selection, filter: &[String]) -> anyhow::Result<()> {
    let Selection { unit, e2e, kernels } = selection;
    setup::ensure_ready()?;
    let workspace = Workspace::locate()?;
    let mut report = Report::default();
    let mut timings = Timings::default();
    if unit {
        report.step("fmt", || fmt(&workspace))?;
        report.step("clippy", || clippy(&workspace))?;
        report.step("clippy (eBPF, nightly)", || clippy_ebpf(&workspace))?;
        report.step("unit tests", || unit_tests(&workspace))?;
        report.step("deploy manifests and alert rules", || deploy_checks(&workspace))?;
        report.step("licenses, bans and sources (cargo deny)", || cargo_deny(&workspace))?;
    }
    if e2e || kernels.is_some() {
        let mut binaries = None;
        report.step("build agent and lab", || {
            binaries = Some((build::build_agent(&workspace, false)?, build::build_lab(&workspace)?));
            Ok(Outcome::Passed)
        })?;
        let (agent, lab) = binaries.context("the build step returned no binaries")?;
        let mut tag = None;
        if e2e {
            report.step("agent image (podman, the release binary)", || {
                let release = build::build_agent(&workspace, true)?;
                tag = Some(image::build_image(&workspace, &release)?);
                Ok(Outcome::Passed)
            })?;
        }
        let kernels = kernels.unwrap_or_else(|| Kernel::DEFAULT_MATRIX.to_vec());
        let mut guest_binaries = None;
        report.step("build the guests' agent and test executables", || {
            guest_binaries = Some(vm::GuestBinaries::build(&workspace, filter)?);
            Ok(Outcome::Passed)
        })?;
        let guest_binaries = guest_binaries.context("the build step returned no guest binaries")?;
        let host = tag.map(|tag| HostRun { agent: &agent, lab: &lab, image: tag });
        report.step("end-to-end tests (host and guests at once)", || {
            end_to_end_everywhere(&workspace, host, &kernels, &guest_binaries, &lab, filter, &mut timings)
        })?;
    }
    report.finish(&timings);
    Ok(())
}

/// What the host's end-to-end run needs besides the workspace.
struct HostRun<'a> {
    agent: &'a Path,
    lab: &'a Path,
    image: String,
}

/// The host's end-to-end suites (when `host` is given) and the guests' at the same time: the
/// host's suites mostly wait on their traffic (the CPU is ~95 % idle meanwhile), each guest is
/// one single-threaded TCG process. Every run goes to its end; the step fails if any did.
fn end_to_end_everywhere(
    workspace: &Workspace,
    host: Option<HostRun<'_>>,
    kernels: &[Kernel],
    guest_binaries: &vm::GuestBinaries,
    lab: &Path,
    filter: &[String],
    timings: &mut Timings,
) -> anyhow::Result<Outcome> {
    if !command::is_root() {
        if running_in_ci() {
            bail!("privileged end-to-end tests and test VMs need root; CI never skips them");
        }
        return Ok(Outcome::Skipped(
            "privileged end-to-end tests and test VMs need root (run sudo -E cargo xtask test)".to_owned(),
        ));
    }
    let (host_result, guests_result) = thread::scope(|scope| {
        let guests = scope.spawn(|| vm::test_kernels(workspace, kernels, guest_binaries, lab));
        let host_result = host.map(|host| {
            let started = Instant::now();
            let result = host_end_to_end_tests(workspace, &host, guest_binaries, filter);
            (result, started.elapsed())
        });
        let guests_result = guests.join().unwrap_or_else(|_| Err(anyhow!("the thread running the guests panicked")));
        (host_result, guests_result)
    });
    let mut failures = Vec::new();
    if let Some((result, elapsed)) = host_result {
        timings.host_elapsed = Some(elapsed);
        match result {
            Ok((suites, status)) => {
                timings.host_suites = suites;
                if let Err(error) = status {
                    failures.push(format!("on the host: {error:#}"));
                }
            }
            Err(error) => failures.push(format!("on the host: {error:#}")),
        }
    }
    match guests_result {
        Ok(reports) => timings.guests = reports,
        Err(error) => failures.push(format!("in the guests: {error:#}")),
    }
    if !failures.is_empty() {
        // The step's failure stops the run before the closing table: print it here.
        timings.print();
        bail!("end-to-end tests failed {}", failures.join("; "));
    }
    Ok(Outcome::Passed)
}

/// Cargo in the workspace root, whatever directory `cargo xtask` was started from.
fn cargo_in(workspace: &Workspace) -> Command {
    let mut cargo = command::cargo();
    cargo.current_dir(&workspace.root);
    cargo
}

fn fmt(workspace: &Workspace) -> anyhow::Result<Outcome> {
    if !command::succeeds(command::cargo().args(["fmt", "--version"])) {
        // Setup installs it; CI never skips a check.
        if running_in_ci() {
            bail!("rustfmt is not installed (cargo xtask setup installs it; rustup component add rustfmt)");
        }
        return Ok(Outcome::Skipped("fmt: rustfmt is not installed (rustup component add rustfmt)".to_owned()));
    }
    command::run(cargo_in(workspace).args(["fmt", "--all", "--check"]))?;
    Ok(Outcome::Passed)
}

fn clippy(workspace: &Workspace) -> anyhow::Result<Outcome> {
    // --workspace ignores default-members, so the bpf-only crate is excluded by name.
    command::run(cargo_in(workspace).args([
        "clippy",
        "--workspace",
        "--exclude",
        EBPF_PACKAGE,
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    Ok(Outcome::Passed)
}

fn clippy_ebpf(workspace: &Workspace) -> anyhow::Result<Outcome> {
    let mut clippy = cargo_in(workspace);
    // aya-ebpf picks its per-architecture code (pt_regs layouts) from this cfg.
    clippy.env("CARGO_ENCODED_RUSTFLAGS", format!("--cfg=bpf_target_arch=\"{}\"", env::consts::ARCH));
    clippy.args([
        "+nightly",
        "clippy",
        "--package",
        EBPF_PACKAGE,
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
        "--",
        "-D",
        "warnings",
    ]);
    command::run(&mut clippy)?;
    Ok(Outcome::Passed)
}

fn unit_tests(workspace: &Workspace) -> anyhow::Result<Outcome> {
    // Privileged tests are #[ignore]d, so this needs no root.
    command::run(cargo_in(workspace).args(["test", "--workspace", "--exclude", EBPF_PACKAGE]))?;
    Ok(Outcome::Passed)
}

/// Renders and validates deploy/ (kubectl kustomize, kubernetes-validate, the agent's own CLI
/// parser on the DaemonSet's args), then `promtool check rules` and `promtool test rules`.
fn deploy_checks(workspace: &Workspace) -> anyhow::Result<Outcome> {
    let agent = build::build_agent(workspace, false)?;
    let deploy = workspace.root.join("deploy");
    let python = setup::tools_venv().join("bin/python");
    let mut validate = command::command(python.to_str().context("tools path")?);
    validate.arg(deploy.join("validate.py")).arg(&agent);
    for kustomization in ["base", "openshift"] {
        validate.arg(deploy.join(kustomization));
    }
    command::run(&mut validate)?;
    let rules = deploy.join("prometheus");
    command::run(command::command("promtool").arg("check").arg("rules").arg(rules.join("rules.yaml")))?;
    command::run(command::command("promtool").args(["test", "rules"]).arg(rules.join("rules_test.yaml")))?;
    Ok(Outcome::Passed)
}

/// `cargo deny check licenses bans sources` (deny.toml). Advisories need the RustSec
/// database from github.com, which these machines cannot reach.
fn cargo_deny(workspace: &Workspace) -> anyhow::Result<Outcome> {
    command::run(cargo_in(workspace).args(["deny", "--log-level", "error", "check", "licenses", "bans", "sources"]))?;
    Ok(Outcome::Passed)
}

/// The agent library's own privileged tests (real netlink in scratch namespaces), then the
/// end-to-end suites, one test at a time: they share eBPF attach points and the drop tracer.
/// Their output is echoed as `[host] ` lines (the guests' run beside it) and read for each
/// suite's counts and time. Err: the run could not be started or read; Ok with an Err status:
/// it ran and failed.
fn host_end_to_end_tests(
    workspace: &Workspace,
    host: &HostRun<'_>,
    suites: &vm::GuestBinaries,
    filter: &[String],
) -> anyhow::Result<(Vec<SuiteTime>, anyhow::Result<()>)> {
    // What this kernel cannot run is excluded by name, and said so; the tests themselves fail
    // under CI=true rather than skip.
    let features = exclusions::KernelFeatures::of_this_host();
    let mut skips = Vec::new();
    for suite in &suites.suites {
        for (name, why) in features.excluded(suite.target) {
            println!("[host] excluded {name}: {why}");
            skips.extend(["--skip".to_owned(), name.to_owned()]);
        }
    }
    let mut test = cargo_in(workspace);
    test.env(AGENT_BIN_VAR, host.agent)
        .env(LAB_BIN_VAR, host.lab)
        .env(IMAGE_VAR, &host.image)
        // Both packages in one cargo run: the features the guests' build unified stay as they
        // are, so nothing is rebuilt under the guests' feet.
        .args(["test", "--no-fail-fast", "--package", AGENT_PACKAGE, "--package", E2E_PACKAGE])
        .args(["--", "--ignored", "--test-threads=1", "--nocapture"])
        .args(&skips)
        .args(filter);
    println!("$ {}", command::display(&test));
    let (reader, writer) = io::pipe().context("creating a pipe for the host's tests")?;
    test.stdin(Stdio::null()).stdout(writer.try_clone()?).stderr(writer);
    let mut child = test.spawn().context("starting cargo test")?;
    // The command holds the pipe's write ends: drop it so the reader sees the end.
    drop(test);
    let mut suites = Vec::new();
    for line in BufReader::new(reader).lines() {
        let line = line.context("reading the host's test output")?;
        println!("[host] {line}");
        read_suite_line(&line, &mut suites);
    }
    let status = child.wait()?;
    let status = if status.success() { Ok(()) } else { Err(anyhow!("cargo test exited with {status}")) };
    Ok((suites, status))
}

/// One test binary of a cargo test run: its name, counts and time.
struct SuiteTime {
    name: String,
    passed: u32,
    failed: u32,
    seconds: f64,
}

/// Reads cargo's `Running …`/`Doc-tests …` line, which names the next suite, and libtest's
/// `test result: …` line, which closes it.
fn read_suite_line(line: &str, suites: &mut Vec<SuiteTime>) {
    let line = line.trim();
    let name = if let Some(rest) = line.strip_prefix("Running ") {
        // `Running tests/datapath.rs (target/debug/deps/datapath-0123abcd)`
        let binary = rest.rsplit_once('(').map_or(rest, |(_, binary)| binary.trim_end_matches(')'));
        let file = binary.rsplit('/').next().unwrap_or(binary);
        Some(file.rsplit_once('-').map_or(file, |(stem, _)| stem).to_owned())
    } else {
        line.strip_prefix("Doc-tests ").map(|krate| format!("{krate} (doc)"))
    };
    if let Some(name) = name {
        suites.push(SuiteTime { name, passed: 0, failed: 0, seconds: 0.0 });
    } else if let Some(counts) = line.strip_prefix("test result: ")
        && let Some(suite) = suites.last_mut()
    {
        suite.passed = vm::count_before(counts, " passed");
        suite.failed = vm::count_before(counts, " failed");
        suite.seconds = counts
            .rsplit_once("finished in ")
            .and_then(|(_, seconds)| seconds.trim_end_matches('s').parse().ok())
            .unwrap_or(f64::NAN);
    }
}

/// Where the end-to-end time went, for the table at the end of the run.
#[derive(Default)]
struct Timings {
    host_elapsed: Option<Duration>,
    host_suites: Vec<SuiteTime>,
    guests: Vec<vm::KernelReport>,
}

impl Timings {
    fn print(&self) {
        if let Some(elapsed) = self.host_elapsed {
            println!("\nhost end-to-end suites ({:.0} s, beside the guests):", elapsed.as_secs_f64());
            // A suite that ran no test (an empty doc-test run, the ignored-only unit tests of the
            // harness) says nothing about time.
            for suite in self.host_suites.iter().filter(|suite| suite.passed + suite.failed > 0) {
                println!(
                    "  {:<24} {:>3} passed {:>3} failed {:>7.1}s",
                    suite.name, suite.passed, suite.failed, suite.seconds
                );
            }
        }
        if !self.guests.is_empty() {
            println!("\n{}", vm::summary(&self.guests));
        }
    }
}

fn running_in_ci() -> bool {
    env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// How a step that did not fail ended.
enum Outcome {
    Passed,
    /// Why, said as the user should read it on the last lines of the run.
    Skipped(String),
}

enum Verdict {
    Passed,
    Skipped(String),
    Failed,
}

/// The steps run so far, printed as the summary at the end (or at the first failure).
#[derive(Default)]
struct Report {
    steps: Vec<(&'static str, Verdict, Duration)>,
}

impl Report {
    /// Runs one step; on failure prints the summary and returns the error.
    fn step(&mut self, name: &'static str, body: impl FnOnce() -> anyhow::Result<Outcome>) -> anyhow::Result<()> {
        println!("==> {name}");
        let started = Instant::now();
        let result = body();
        let elapsed = started.elapsed();
        match result {
            Ok(Outcome::Passed) => self.steps.push((name, Verdict::Passed, elapsed)),
            Ok(Outcome::Skipped(why)) => self.steps.push((name, Verdict::Skipped(why), elapsed)),
            Err(error) => {
                self.steps.push((name, Verdict::Failed, elapsed));
                self.print_summary();
                return Err(error.context(format!("test step `{name}` failed")));
            }
        }
        Ok(())
    }

    /// Prints the summary; skips go last so that a skipped step cannot scroll out of sight.
    fn finish(&self, timings: &Timings) {
        timings.print();
        self.print_summary();
        for (_, verdict, _) in &self.steps {
            if let Verdict::Skipped(why) = verdict {
                println!("SKIPPED: {why}");
            }
        }
    }

    fn print_summary(&self) {
        println!("\nsummary:");
        for (name, verdict, elapsed) in &self.steps {
            let verdict = match verdict {
                Verdict::Passed => "passed",
                Verdict::Skipped(_) => "skipped",
                Verdict::Failed => "FAILED",
            };
            println!("  {verdict:<8} {name:<44} {:>7.1} s", elapsed.as_secs_f64());
        }
        let total: Duration = self.steps.iter().map(|(_, _, elapsed)| *elapsed).sum();
        println!("  {:<8} {:<44} {:>7.1} s", "", "total", total.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_are_named_by_their_binary_and_closed_by_their_result_line() {
        let output = "\
     Running unittests src/lib.rs (target/debug/deps/datapath_monitor-0123abcd)
running 2 tests
test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 3.50s
     Running tests/datapath.rs (target/debug/deps/datapath-89ef)
test result: FAILED. 12 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 101.25s
   Doc-tests datapath_monitor
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
";
        let mut suites = Vec::new();
        for line in output.lines() {
            read_suite_line(line, &mut suites);
        }
        let read: Vec<(&str, u32, u32, f64)> =
            suites.iter().map(|s| (s.name.as_str(), s.passed, s.failed, s.seconds)).collect();
        assert_eq!(
            read,
            [("datapath_monitor", 2, 0, 3.5), ("datapath", 12, 1, 101.25), ("datapath_monitor (doc)", 0, 0, 0.0)]
        );
    }
}
