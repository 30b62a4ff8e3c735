//! `cargo xtask test`: everything CI runs, in order, stopping at the first failure: fmt,
//! clippy (host and eBPF), unit tests, then the privileged end-to-end tests against the
//! real agent binary.

use std::{
    env,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    build,
    command::{self, Workspace},
    image, setup,
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
        if e2e {
            let mut tag = None;
            report.step("agent image (podman, the release binary)", || {
                let release = build::build_agent(&workspace, true)?;
                tag = Some(image::build_image(&workspace, &release)?);
                Ok(Outcome::Passed)
            })?;
            let tag = tag.context("the image step returned no tag")?;
            report.step("end-to-end tests", || end_to_end_tests(&workspace, &agent, &lab, &tag, filter))?;
        }
        let kernels = kernels.unwrap_or_else(|| Kernel::DEFAULT_MATRIX.to_vec());
        report.step("end-to-end tests (VMs)", || vm_tests(&workspace, &kernels, &lab, filter))?;
    }
    report.finish();
    Ok(())
}

/// Cargo in the workspace root, whatever directory `cargo xtask` was started from.
fn cargo_in(workspace: &Workspace) -> Command {
    let mut cargo = command::cargo();
    cargo.current_dir(&workspace.root);
    cargo
}

fn fmt(workspace: &Workspace) -> anyhow::Result<Outcome> {
    if !command::succeeds(command::cargo().args(["fmt", "--version"])) {
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

fn end_to_end_tests(
    workspace: &Workspace,
    agent: &Path,
    lab: &Path,
    image: &str,
    filter: &[String],
) -> anyhow::Result<Outcome> {
    if !command::is_root() {
        if running_in_ci() {
            bail!("privileged end-to-end tests need root; CI never skips them");
        }
        return Ok(Outcome::Skipped("privileged end-to-end tests need root (run sudo -E cargo xtask test)".to_owned()));
    }
    // The agent library's own privileged tests (real netlink in scratch namespaces), then the
    // end-to-end tests; one at a time: they share eBPF attach points and the drop tracer.
    for package in [AGENT_PACKAGE, E2E_PACKAGE] {
        let mut test = cargo_in(workspace);
        test.env(AGENT_BIN_VAR, agent)
            .env(LAB_BIN_VAR, lab)
            .env(IMAGE_VAR, image)
            .args(["test", "--package", package, "--", "--ignored", "--test-threads=1", "--nocapture"])
            .args(filter);
        command::run(&mut test)?;
    }
    Ok(Outcome::Passed)
}

/// The end-to-end suites in a guest of each kernel (software emulation: several minutes each).
fn vm_tests(workspace: &Workspace, kernels: &[Kernel], lab: &Path, filter: &[String]) -> anyhow::Result<Outcome> {
    if !command::is_root() {
        if running_in_ci() {
            bail!("test VMs need root (virtiofsd, the guests' privileged tests); CI never skips them");
        }
        return Ok(Outcome::Skipped("test VMs need root (run sudo -E cargo xtask test)".to_owned()));
    }
    vm::test_kernels(workspace, kernels, lab, filter)?;
    Ok(Outcome::Passed)
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
    fn finish(&self) {
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
            println!("  {verdict:<8} {name:<24} {:>7.1} s", elapsed.as_secs_f64());
        }
    }
}
