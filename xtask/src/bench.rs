//! `cargo xtask bench [--quick]`: builds the agent and the bench in release mode and runs the
//! bench (bench/, binary `dm-bench`), which writes BENCHMARKS.md at the workspace root.

use std::process::Command;

use anyhow::{Context as _, bail, ensure};

use crate::{
    build,
    command::{self, Workspace},
    setup,
};

const BENCH_PACKAGE: &str = "datapath-monitor-bench";
const BENCH_BINARY: &str = "dm-bench";

pub fn bench(quick: bool, only: Option<&str>) -> anyhow::Result<()> {
    if !command::is_root() {
        bail!(
            "the bench creates network namespaces and loads eBPF programs: run it as root (sudo -E cargo xtask bench)"
        );
    }
    setup::ensure_ready()?;
    let workspace = Workspace::locate()?;
    let agent = build::build_agent(&workspace, true)?;
    let mut cargo = command::cargo();
    cargo.current_dir(&workspace.root).args(["build", "--release", "--package", BENCH_PACKAGE, "--bin", BENCH_BINARY]);
    command::run(&mut cargo).context("building the bench")?;
    let binary = workspace.target_dir.join("release").join(BENCH_BINARY);
    ensure!(binary.is_file(), "the build succeeded but {} is missing", binary.display());

    let mut reproduce = String::from("cargo xtask bench");
    if quick {
        reproduce.push_str(" --quick");
    }
    if let Some(only) = only {
        reproduce.push_str(&format!(" --only {only}"));
    }
    let mut run = Command::new(&binary);
    run.env("DATAPATH_MONITOR_BIN", &agent)
        .arg("--out")
        .arg(workspace.root.join("BENCHMARKS.md"))
        .args(["--command", &reproduce]);
    if quick {
        run.arg("--quick");
    }
    if let Some(only) = only {
        run.args(["--only", only]);
    }
    command::run(&mut run).context("running the bench")
}
