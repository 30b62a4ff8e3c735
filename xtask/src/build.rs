//! `cargo xtask build`: the agent binary. Its build.rs compiles the kernel programs through
//! aya-build with the nightly toolchain, so one cargo invocation builds both.

use std::path::PathBuf;

use anyhow::{Context as _, ensure};

use crate::{
    command::{self, Workspace},
    setup,
};

const AGENT_PACKAGE: &str = "datapath-monitor";
const AGENT_BINARY: &str = "datapath-monitor";

/// `cargo xtask build [--release]`: checks the toolchain, then builds; returns the binary.
pub fn build(release: bool) -> anyhow::Result<PathBuf> {
    setup::ensure_ready()?;
    build_agent(&Workspace::locate()?, release)
}

/// Builds the agent, assuming the toolchain is ready, and returns the binary's absolute path.
pub fn build_agent(workspace: &Workspace, release: bool) -> anyhow::Result<PathBuf> {
    let mut cargo = command::cargo();
    cargo.current_dir(&workspace.root).args(["build", "--package", AGENT_PACKAGE]);
    if release {
        cargo.arg("--release");
    }
    command::run(&mut cargo).context("building the agent")?;
    let profile = if release { "release" } else { "debug" };
    let binary = workspace.target_dir.join(profile).join(AGENT_BINARY);
    ensure!(binary.is_file(), "the build succeeded but {} is missing", binary.display());
    Ok(binary)
}

const LAB_PACKAGE: &str = "datapath-monitor-lab";
const LAB_BINARY: &str = "dm-lab";

/// Builds the lab's binary (its daemons: healthz server, prober, traffic, stand-in sdn).
pub fn build_lab(workspace: &Workspace) -> anyhow::Result<PathBuf> {
    let mut cargo = command::cargo();
    cargo.current_dir(&workspace.root).args(["build", "--package", LAB_PACKAGE, "--bin", LAB_BINARY]);
    command::run(&mut cargo).context("building the lab")?;
    let binary = workspace.target_dir.join("debug").join(LAB_BINARY);
    ensure!(binary.is_file(), "the build succeeded but {} is missing", binary.display());
    Ok(binary)
}
