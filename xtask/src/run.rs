//! `cargo xtask run`: build the agent and become it, so that signals (Ctrl-C, SIGTERM) and
//! the exit status are the agent's own.

use std::{os::unix::process::CommandExt as _, process::Command};

use anyhow::{Context as _, bail};

use crate::{build, command};

pub fn run(release: bool, args: &[String]) -> anyhow::Result<()> {
    // Checked before building: loading eBPF programs and attaching to interfaces needs root.
    if !command::is_root() {
        bail!(
            "the agent loads eBPF programs and needs root: run `sudo -E cargo xtask run` \
             (if sudo cannot find cargo: `sudo -E env \"PATH=$PATH\" cargo xtask run`)"
        );
    }
    let agent = build::build(release)?;
    let mut agent_command = Command::new(&agent);
    agent_command.arg("run").args(args);
    println!("$ {}", command::display(&agent_command));
    // exec only returns on failure; on success this process is the agent.
    let error = agent_command.exec();
    Err(error).with_context(|| format!("executing {}", agent.display()))
}
