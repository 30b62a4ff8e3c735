//! Running external programs the same way everywhere: echoed, checked, with cargo's bin
//! directory on PATH (where `cargo install` puts bpf-linker, and which `sudo` drops).

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Where `cargo install` puts binaries: `$CARGO_HOME/bin`, by default `~/.cargo/bin`.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    let cargo_home = match env::var_os("CARGO_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env::var_os("HOME")?).join(".cargo"),
    };
    Some(cargo_home.join("bin"))
}

/// The PATH given to every child: the caller's, plus cargo's bin directory if it is absent.
pub fn search_path() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH").map(|path| env::split_paths(&path).collect()).unwrap_or_default();
    if let Some(cargo_bin) = cargo_bin_dir()
        && !dirs.contains(&cargo_bin)
    {
        dirs.push(cargo_bin);
    }
    dirs
}

/// The first executable called `name` on [`search_path`].
pub fn find_program(name: &str) -> Option<PathBuf> {
    search_path().into_iter().map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata().is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A command for `program` whose PATH is [`search_path`].
pub fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    if let Ok(path) = env::join_paths(search_path()) {
        cmd.env("PATH", path);
    }
    cmd
}

/// `cargo` through rustup's proxy, so that `+nightly` works.
pub fn cargo() -> Command {
    command("cargo")
}

/// The command line as a user would paste it into a shell (environment overrides first,
/// PATH left out).
pub fn display(cmd: &Command) -> String {
    let envs = cmd.get_envs().filter_map(|(key, value)| {
        let value = value?;
        (key != "PATH").then(|| format!("{}={}", key.to_string_lossy(), shell_quote(&value.to_string_lossy())))
    });
    let words = [cmd.get_program()].into_iter().chain(cmd.get_args()).map(|word| shell_quote(&word.to_string_lossy()));
    envs.chain(words).collect::<Vec<_>>().join(" ")
}

/// `word` unchanged when the shell would keep it as is, single-quoted otherwise.
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` with inherited stdio, echoing it first so the user sees what is done for them.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = display(cmd);
    println!("$ {line}");
    let status = cmd.status().with_context(|| format!("starting `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; fails with its stderr when it fails.
pub fn stdout(cmd: &mut Command) -> anyhow::Result<String> {
    let line = display(cmd);
    let output = cmd.stdin(Stdio::null()).output().with_context(|| format!("starting `{line}`"))?;
    if !output.status.success() {
        bail!("`{line}` failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    String::from_utf8(output.stdout).with_context(|| format!("`{line}` printed non-UTF-8 output"))
}

/// Whether `cmd` runs and exits 0, its output discarded (for "is this tool here?" probes).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|status| status.success())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The workspace as cargo sees it (respects CARGO_TARGET_DIR and `build.target-dir`).
pub struct Workspace {
    pub root: PathBuf,
    pub target_dir: PathBuf,
}

impl Workspace {
    pub fn locate() -> anyhow::Result<Self> {
        let metadata = stdout(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
        let metadata: serde_json::Value = serde_json::from_str(&metadata).context("parsing `cargo metadata` output")?;
        let path = |key: &str| {
            metadata[key].as_str().map(PathBuf::from).with_context(|| format!("`cargo metadata` output has no {key}"))
        };
        Ok(Self { root: path("workspace_root")?, target_dir: path("target_directory")? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displayed_commands_paste_into_a_shell() {
        let mut cmd = Command::new("cargo");
        cmd.env("CARGO_ENCODED_RUSTFLAGS", "--cfg=bpf_target_arch=\"x86_64\"").env("PATH", "/usr/bin").args([
            "install",
            "--version",
            "~0.13",
            "it's",
        ]);
        assert_eq!(
            display(&cmd),
            r#"CARGO_ENCODED_RUSTFLAGS='--cfg=bpf_target_arch="x86_64"' cargo install --version '~0.13' 'it'\''s'"#
        );
    }
}
