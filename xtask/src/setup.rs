//! `cargo xtask setup`: make this machine able to build and test the project.
//!
//! Every requirement is looked at first and installed only when missing, so a second run
//! only reports, in seconds. [`ensure_ready`] is the same look in front of build, run and
//! test.

use std::{
    env,
    ffi::OsStr,
    fs, iter,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::{self, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::command::{self, cargo, command, find_program, stdout};

/// The LLVM that bpf-linker links. It reads the bitcode nightly rustc emits, so its major
/// must not be older than rustc's.
const LLVM_MAJOR: u32 = 22;
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// bpf-linker's llvm-sys (221.x) finds LLVM through this; without it `cargo install`
/// fails to link with "unable to find library -lLLVM".
const LLVM_SYS_PREFIX_VAR: &str = "LLVM_SYS_221_PREFIX";
const BPF_LINKER_FEATURE: &str = "llvm-22";
const BPF_LINKER_VERSION: &str = "~0.13";

/// llvm-22-dev and libpolly-22-dev build bpf-linker; the rest build the lab and drive the
/// end-to-end tests.
/// openvswitch-switch provides the lab's userspace switch (no kernel module is loaded).
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "iproute2",
    "iptables",
    "bpftool",
    "ethtool",
    "curl",
    "procps",
    "openvswitch-switch",
    // promtool (and the Prometheus server the alert test runs); python3-venv for kubernetes-validate.
    "prometheus",
    "python3-venv",
    // `cargo xtask bench`: TCP and UDP throughput.
    "iperf3",
    // Test VMs (cargo xtask vm, test --kernels): QEMU and virtiofsd, the initramfs's busybox,
    // cpio, depmod and module decompression.
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
    "zstd",
    // `cargo xtask image` and its end-to-end test: podman with runc (crun fails on these
    // hosts' hybrid cgroups), and mmdebstrap for the runtime base where it cannot be pulled.
    "podman",
    "runc",
    "mmdebstrap",
];

/// In install order: bpf-linker builds against the LLVM the apt step installs.
const REQUIREMENTS: &[&dyn Requirement] = &[&AptPackages, &RustToolchains, &BpfLinker, &DeployTools, &CargoDeny];

/// cargo-deny, for `cargo deny check licenses bans sources` (deny.toml).
const CARGO_DENY_VERSION: &str = "~0.18";

struct CargoDeny;

impl Requirement for CargoDeny {
    fn check(&self) -> anyhow::Result<State> {
        Ok(match find_program("cargo-deny") {
            Some(path) => State::Present(format!(
                "{} at {}",
                stdout(Command::new(&path).arg("--version")).unwrap_or_default().trim(),
                path.display()
            )),
            None => State::Missing("cargo-deny".to_owned()),
        })
    }

    fn install(&self) -> anyhow::Result<()> {
        command::run(cargo().args(["install", "cargo-deny", "--locked", "--version", CARGO_DENY_VERSION]))
            .context("installing cargo-deny from crates.io")
    }
}

/// kubernetes-validate (PyPI), pinned: its bundled schemas validate the manifests offline.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// Where the manifest tools live: a virtualenv of our own, never the system Python's packages.
pub fn tools_venv() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/datapath-monitor/venv")
}

/// kubectl (with kustomize) and kubernetes-validate, for checking deploy/.
struct DeployTools;

impl DeployTools {
    fn kubectl_present() -> bool {
        command::succeeds(command("kubectl").args(["version", "--client"]).stdout(Stdio::null()).stderr(Stdio::null()))
    }

    fn validator_present() -> bool {
        let python = tools_venv().join("bin/python");
        command::succeeds(
            command(python.to_str().unwrap_or("python3")).args(["-c", "import kubernetes_validate, yaml"]),
        )
    }
}

impl Requirement for DeployTools {
    fn check(&self) -> anyhow::Result<State> {
        let mut missing = Vec::new();
        if !Self::kubectl_present() {
            missing.push("kubectl".to_owned());
        }
        if !Self::validator_present() {
            missing.push(format!("{KUBERNETES_VALIDATE} in {}", tools_venv().display()));
        }
        Ok(if missing.is_empty() {
            State::Present(format!("kubectl, {KUBERNETES_VALIDATE} in {}", tools_venv().display()))
        } else {
            State::Missing(missing.join(", "))
        })
    }

    fn install(&self) -> anyhow::Result<()> {
        if !Self::kubectl_present() {
            // Debian's kubectl; a kubectl from elsewhere on PATH is used as it is.
            command::run(apt_get().args(["install", "-y", "kubernetes-client"]))?;
        }
        if !Self::validator_present() {
            let venv = tools_venv();
            command::run(command("python3").args(["-m", "venv"]).arg(&venv))
                .context("creating the tools virtualenv (apt package python3-venv)")?;
            command::run(command(venv.join("bin/pip").to_str().unwrap_or("pip")).args([
                "install",
                "-q",
                KUBERNETES_VALIDATE,
            ]))
            .context("installing kubernetes-validate from PyPI")?;
        }
        Ok(())
    }
}

/// One thing building or testing needs from this machine.
trait Requirement {
    /// Looks, changing nothing.
    fn check(&self) -> anyhow::Result<State>;
    /// Installs what [`Requirement::check`] found missing.
    fn install(&self) -> anyhow::Result<()>;
}

enum State {
    Present(String),
    Missing(String),
}

/// `cargo xtask setup [--check]`.
pub fn setup(check_only: bool) -> anyhow::Result<()> {
    let distribution = Distribution::detect();
    if !distribution.has_apt {
        bail!(
            "unsupported distribution {}: `cargo xtask setup` installs through apt-get \
             (Debian, Ubuntu). Install by hand:\n{}",
            distribution.name,
            install_by_hand()
        );
    }
    println!("ok: distribution {} (apt-get)", distribution.name);

    let mut missing = 0;
    for requirement in REQUIREMENTS {
        match requirement.check()? {
            State::Present(detail) => println!("ok: {detail}"),
            State::Missing(detail) if check_only => {
                println!("missing: {detail}");
                missing += 1;
            }
            State::Missing(detail) => {
                println!("installing: {detail}");
                requirement.install()?;
                match requirement.check()? {
                    State::Present(detail) => println!("ok: {detail}"),
                    State::Missing(detail) => bail!("still missing after installing: {detail}"),
                }
            }
        }
    }
    if missing > 0 {
        bail!("{missing} requirement(s) missing: run `cargo xtask setup`");
    }
    Ok(())
}

/// The quick look in front of build, run and test; installs only when something is missing.
pub fn ensure_ready() -> anyhow::Result<()> {
    let distribution = Distribution::detect();
    if !distribution.has_apt {
        println!(
            "warning: {} is not supported by `cargo xtask setup`; assuming these are installed:\n{}",
            distribution.name,
            install_by_hand()
        );
        return Ok(());
    }
    let mut missing = Vec::new();
    for requirement in REQUIREMENTS {
        if let State::Missing(detail) = requirement.check()? {
            missing.push(detail);
        }
    }
    if missing.is_empty() {
        println!("ok: build and test requirements present (details: cargo xtask setup --check)");
        return Ok(());
    }
    println!("missing: {}; running `cargo xtask setup`", missing.join("; "));
    setup(false)
}

/// What to install on a distribution without apt-get, from the same constants setup uses.
fn install_by_hand() -> String {
    let mut bpf_linker = bpf_linker_install_command();
    bpf_linker.env(LLVM_SYS_PREFIX_VAR, "<LLVM 22 prefix>");
    [
        format!(
            "  - packages (Debian names): {} (LLVM {LLVM_MAJOR} with Polly and its headers)",
            APT_PACKAGES.join(" ")
        ),
        "  - rustup (https://rustup.rs), then: rustup toolchain install nightly --profile minimal \
         && rustup component add rust-src clippy --toolchain nightly && rustup component add clippy rustfmt"
            .to_owned(),
        format!("  - bpf-linker: PATH=<LLVM 22 prefix>/bin:$PATH {}", command::display(&bpf_linker)),
        format!("  - kubectl, and {KUBERNETES_VALIDATE} in a virtualenv at {}", tools_venv().display()),
    ]
    .join("\n")
}

/// The running distribution, from os-release.
struct Distribution {
    name: String,
    has_apt: bool,
}

impl Distribution {
    fn detect() -> Self {
        match fs::read_to_string("/etc/os-release").or_else(|_| fs::read_to_string("/usr/lib/os-release")) {
            Ok(os_release) => Self::parse(&os_release),
            Err(_) => Self { name: "unknown (no /etc/os-release)".to_owned(), has_apt: false },
        }
    }

    fn parse(os_release: &str) -> Self {
        let field = |key: &str| {
            os_release.lines().find_map(|line| {
                let value = line.strip_prefix(key)?.strip_prefix('=')?;
                Some(value.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
            })
        };
        let id = field("ID").unwrap_or_default();
        let id_like = field("ID_LIKE").unwrap_or_default();
        let has_apt =
            iter::once(id.as_str()).chain(id_like.split_whitespace()).any(|id| id == "debian" || id == "ubuntu");
        let name = field("PRETTY_NAME").unwrap_or_else(|| format!("ID={id}"));
        Self { name, has_apt }
    }
}

/// apt-get as root: directly when we are root, through sudo otherwise.
fn apt_get() -> Command {
    if command::is_root() {
        let mut cmd = command("apt-get");
        cmd.env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    } else {
        let mut cmd = command("sudo");
        cmd.args(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        cmd
    }
}

struct AptPackages;

impl AptPackages {
    fn missing() -> anyhow::Result<Vec<&'static str>> {
        let mut query = command("dpkg-query");
        query.args(["-W", "-f=${Package}\t${Status}\n"]).args(APT_PACKAGES);
        // Exits 1 when dpkg has never heard of a package; the others are still listed.
        let output = query
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .with_context(|| format!("starting `{}`", command::display(&query)))?;
        let listing = String::from_utf8_lossy(&output.stdout);
        let installed = installed_packages(&listing);
        Ok(APT_PACKAGES.iter().copied().filter(|package| !installed.contains(package)).collect())
    }
}

/// Package names that `dpkg-query -W -f='${Package}\t${Status}\n'` reports as installed.
fn installed_packages(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .filter(|(_, status)| status.trim() == "install ok installed")
        .map(|(package, _)| package)
        .collect()
}

impl Requirement for AptPackages {
    fn check(&self) -> anyhow::Result<State> {
        let missing = Self::missing()?;
        Ok(if missing.is_empty() {
            State::Present(format!("apt packages {}", APT_PACKAGES.join(" ")))
        } else {
            State::Missing(format!("apt packages {}", missing.join(" ")))
        })
    }

    fn install(&self) -> anyhow::Result<()> {
        let missing = Self::missing()?;
        command::run(apt_get().arg("update"))?;
        command::run(apt_get().args(["install", "-y"]).args(&missing)).with_context(|| {
            format!(
                "installing {} (Debian 12 has llvm-{LLVM_MAJOR} in bookworm-security; \
                 elsewhere add https://apt.llvm.org)",
                missing.join(" ")
            )
        })
    }
}

/// A rustup component the tasks use beyond rustc and cargo: (toolchain, component, why).
/// `None` is the toolchain rustup picks here (stable unless overridden).
type RustComponent = (Option<&'static str>, &'static str, &'static str);

const RUST_COMPONENTS: &[RustComponent] = &[
    (Some("nightly"), "rust-src", "build-std=core for the bpf target"),
    (Some("nightly"), "clippy", "lints the eBPF crate"),
    (None, "clippy", "lints the workspace"),
    (None, "rustfmt", "cargo xtask test checks the formatting"),
];

struct RustToolchains;

impl RustToolchains {
    fn has_nightly() -> anyhow::Result<bool> {
        let toolchains = stdout(command("rustup").args(["toolchain", "list"]))?;
        Ok(lists_nightly(&toolchains))
    }

    /// The entries of [`RUST_COMPONENTS`] that are not installed.
    fn missing_components() -> anyhow::Result<Vec<RustComponent>> {
        let mut missing = Vec::new();
        for toolchain in [Some("nightly"), None] {
            let mut list = command("rustup");
            list.args(["component", "list", "--installed"]);
            if let Some(toolchain) = toolchain {
                list.args(["--toolchain", toolchain]);
            }
            let installed = stdout(&mut list)?;
            missing.extend(
                RUST_COMPONENTS
                    .iter()
                    .copied()
                    .filter(|(wanted, component, _)| *wanted == toolchain && !lists_component(&installed, component)),
            );
        }
        Ok(missing)
    }
}

/// Whether `rustup toolchain list` shows the rolling nightly (not a dated one).
fn lists_nightly(toolchains: &str) -> bool {
    toolchains.lines().any(|line| {
        line.split_whitespace()
            .next()
            .and_then(|name| name.strip_prefix("nightly-"))
            .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// Whether `rustup component list --installed` shows `component` (bare or with a target suffix).
fn lists_component(installed: &str, component: &str) -> bool {
    installed
        .lines()
        .map(str::trim)
        .any(|line| line == component || line.strip_prefix(component).is_some_and(|rest| rest.starts_with('-')))
}

/// The value of `key: value` in `rustc -vV` output.
fn rustc_field<'a>(version: &'a str, key: &str) -> Option<&'a str> {
    version.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

impl Requirement for RustToolchains {
    fn check(&self) -> anyhow::Result<State> {
        if find_program("rustup").is_none() {
            return Ok(State::Missing("rustup".to_owned()));
        }
        if !Self::has_nightly()? {
            return Ok(State::Missing("rust nightly toolchain with rust-src and clippy".to_owned()));
        }
        let missing = Self::missing_components()?;
        if !missing.is_empty() {
            let names: Vec<String> = missing
                .iter()
                .map(|(toolchain, component, why)| {
                    format!("{component} for {} ({why})", toolchain.unwrap_or("the default toolchain"))
                })
                .collect();
            return Ok(State::Missing(format!("rust components {}", names.join(", "))));
        }
        let version = stdout(command("rustc").args(["+nightly", "-vV"]))?;
        let release = rustc_field(&version, "release").unwrap_or("unknown");
        let llvm = rustc_field(&version, "LLVM version").unwrap_or("unknown");
        let rustc_llvm_major = llvm.split('.').next().and_then(|major| major.parse::<u32>().ok());
        let warning = match rustc_llvm_major {
            Some(major) if major > LLVM_MAJOR => format!(
                "; warning: bpf-linker's LLVM {LLVM_MAJOR} is older than nightly's, \
                 raise LLVM_MAJOR in xtask/src/setup.rs"
            ),
            _ => String::new(),
        };
        Ok(State::Present(format!(
            "rust nightly {release} (LLVM {llvm}) with rust-src and clippy; clippy and rustfmt on the default toolchain{warning}"
        )))
    }

    fn install(&self) -> anyhow::Result<()> {
        if find_program("rustup").is_none() {
            bail!("rustup is not installed: install it from https://rustup.rs, then run `cargo xtask setup` again");
        }
        if !Self::has_nightly()? {
            command::run(command("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))?;
        }
        for (toolchain, component, _) in Self::missing_components()? {
            let mut add = command("rustup");
            add.args(["component", "add", component]);
            if let Some(toolchain) = toolchain {
                add.args(["--toolchain", toolchain]);
            }
            command::run(&mut add)?;
        }
        Ok(())
    }
}

struct BpfLinker;

impl Requirement for BpfLinker {
    fn check(&self) -> anyhow::Result<State> {
        let Some(path) = find_program("bpf-linker") else {
            return Ok(State::Missing(match bpf_linker_installers().first() {
                Some(pid) => format!("bpf-linker (pid {pid} is installing it now)"),
                None => "bpf-linker".to_owned(),
            }));
        };
        let version = stdout(Command::new(&path).arg("--version"))?;
        let version = version.trim();
        Ok(match llvm_major(&path) {
            Some(major) if major == LLVM_MAJOR => {
                State::Present(format!("{version} (LLVM {major}) at {}", path.display()))
            }
            Some(major) => {
                State::Missing(format!("{version} at {} links LLVM {major}, need LLVM {LLVM_MAJOR}", path.display()))
            }
            None => State::Present(format!(
                "{version} at {} (its LLVM major is unknown: not linked to a shared libLLVM)",
                path.display()
            )),
        })
    }

    fn install(&self) -> anyhow::Result<()> {
        // A second build next to a running one doubles a long LLVM link for nothing.
        wait_for_other_installer();
        if let State::Present(_) = self.check()? {
            return Ok(());
        }
        command::run(&mut bpf_linker_install_command())
            .context("installing bpf-linker (needs the apt packages llvm-22-dev and libpolly-22-dev)")
    }
}

/// `cargo install bpf-linker` against the system LLVM (no LLVM download, no static link).
fn bpf_linker_install_command() -> Command {
    let mut cmd = cargo();
    // llvm-sys runs llvm-config, which Debian keeps under the versioned prefix.
    let path = iter::once(Path::new(LLVM_PREFIX).join("bin")).chain(command::search_path());
    if let Ok(path) = env::join_paths(path) {
        cmd.env("PATH", path);
    }
    cmd.env(LLVM_SYS_PREFIX_VAR, LLVM_PREFIX).args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--no-default-features",
        "--features",
        BPF_LINKER_FEATURE,
        "--locked",
        // Replaces a bpf-linker built for another LLVM.
        "--force",
    ]);
    cmd
}

/// The LLVM major `bpf-linker` was built for: the shared libLLVM it links, or else the
/// feature cargo recorded when it installed it.
fn llvm_major(bpf_linker: &Path) -> Option<u32> {
    let linked =
        command::stdout(Command::new("ldd").arg(bpf_linker)).ok().and_then(|libraries| linked_llvm_major(&libraries));
    linked.or_else(|| {
        let cargo_bin = command::cargo_bin_dir()?;
        if bpf_linker.parent() != Some(cargo_bin.as_path()) {
            return None;
        }
        let installs = fs::read_to_string(cargo_bin.parent()?.join(".crates2.json")).ok()?;
        installed_llvm_feature(&installs)
    })
}

/// The major of `libLLVM.so.22.1` or `libLLVM-22.so` in `ldd` output.
fn linked_llvm_major(libraries: &str) -> Option<u32> {
    libraries.split_whitespace().find_map(|word| {
        let rest = word.strip_prefix("libLLVM.so.").or_else(|| word.strip_prefix("libLLVM-"))?;
        rest.split(['.', '-']).next()?.parse().ok()
    })
}

/// The `llvm-NN` feature of bpf-linker in cargo's `.crates2.json`.
fn installed_llvm_feature(crates2: &str) -> Option<u32> {
    let installs: serde_json::Value = serde_json::from_str(crates2).ok()?;
    let (_, install) =
        installs["installs"].as_object()?.iter().find(|(package, _)| package.starts_with("bpf-linker "))?;
    install["features"].as_array()?.iter().find_map(|feature| feature.as_str()?.strip_prefix("llvm-")?.parse().ok())
}

/// The `cargo install … bpf-linker` processes running on this machine (never this one).
fn bpf_linker_installers() -> Vec<u32> {
    let me = process::id();
    let Ok(processes) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            (pid != me && installs_bpf_linker(&cmdline)).then_some(pid)
        })
        .collect()
}

/// Whether a NUL-separated /proc/PID/cmdline is `cargo … install … bpf-linker[@version] …`.
fn installs_bpf_linker(cmdline: &[u8]) -> bool {
    let args: Vec<&OsStr> = cmdline.split(|byte| *byte == 0).map(OsStr::from_bytes).collect();
    let Some(cargo_at) = args.iter().position(|arg| Path::new(arg).file_name() == Some(OsStr::new("cargo"))) else {
        return false;
    };
    let after_cargo = &args[cargo_at + 1..];
    after_cargo.contains(&OsStr::new("install"))
        && after_cargo.iter().any(|arg| {
            let arg = arg.as_bytes();
            arg == b"bpf-linker" || arg.starts_with(b"bpf-linker@")
        })
}

fn wait_for_other_installer() {
    let started = Instant::now();
    let mut reported: Option<Instant> = None;
    while let Some(&pid) = bpf_linker_installers().first() {
        if reported.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            println!(
                "waiting: pid {pid} is installing bpf-linker ({} s so far); not starting a second build",
                started.elapsed().as_secs()
            );
            reported = Some(Instant::now());
        }
        thread::sleep(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_and_its_derivatives_have_apt() {
        let debian =
            Distribution::parse("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n");
        assert!(debian.has_apt);
        assert_eq!(debian.name, "Debian GNU/Linux 12 (bookworm)");
        assert!(Distribution::parse("ID=ubuntu\nID_LIKE=debian\n").has_apt);
        assert!(Distribution::parse("ID=pop\nID_LIKE=\"ubuntu debian\"\n").has_apt);
    }

    #[test]
    fn other_distributions_have_no_apt() {
        let fedora = Distribution::parse("ID=fedora\nPRETTY_NAME=\"Fedora Linux 41\"\n");
        assert!(!fedora.has_apt);
        assert_eq!(fedora.name, "Fedora Linux 41");
        // ID_LIKE must not be read as ID.
        assert!(!Distribution::parse("ID_LIKE=rhel\nID=rocky\n").has_apt);
    }

    #[test]
    fn only_fully_installed_packages_count() {
        let listing = "curl\tinstall ok installed\nethtool\tdeinstall ok config-files\n\
                       iptables\tunknown ok not-installed\n";
        assert_eq!(installed_packages(listing), ["curl"]);
    }

    #[test]
    fn rolling_nightly_is_found_but_not_a_dated_one() {
        assert!(lists_nightly("stable-x86_64-unknown-linux-gnu (active, default)\nnightly-x86_64-unknown-linux-gnu\n"));
        assert!(!lists_nightly("nightly-2025-01-01-x86_64-unknown-linux-gnu\n"));
        assert!(!lists_nightly("stable-x86_64-unknown-linux-gnu (default)\n"));
    }

    #[test]
    fn components_match_with_or_without_target_suffix() {
        let installed = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\nrust-src\n";
        assert!(lists_component(installed, "rust-src"));
        assert!(lists_component(installed, "clippy"));
        assert!(!lists_component(installed, "rustfmt"));
        assert!(!lists_component("rust-std-x86_64-unknown-linux-gnu\n", "rust-s"));
    }

    #[test]
    fn llvm_major_from_ldd() {
        let ldd = "\tlibLLVM.so.22.1 => /usr/lib/llvm-22/lib/libLLVM.so.22.1 (0x00007f)\n";
        assert_eq!(linked_llvm_major(ldd), Some(22));
        assert_eq!(linked_llvm_major("\tlibLLVM-21.so => /usr/lib/libLLVM-21.so (0x1)\n"), Some(21));
        assert_eq!(linked_llvm_major("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"), None);
    }

    #[test]
    fn llvm_major_from_cargo_install_record() {
        let crates2 = r#"{"installs":{"bpf-linker 0.13.0 (registry+https://github.com/rust-lang/crates.io-index)":
            {"features":["llvm-22"],"no_default_features":true}}}"#;
        assert_eq!(installed_llvm_feature(crates2), Some(22));
        assert_eq!(installed_llvm_feature(r#"{"installs":{}}"#), None);
    }

    #[test]
    fn recognises_a_running_bpf_linker_install() {
        assert!(installs_bpf_linker(
            b"cargo\0install\0bpf-linker\0--no-default-features\0--features\0llvm-22\0--locked\0"
        ));
        assert!(installs_bpf_linker(b"/root/.rustup/toolchains/stable/bin/cargo\0install\0bpf-linker@0.13.0\0"));
        assert!(!installs_bpf_linker(b"cargo\0build\0--package\0bpf-linker\0"));
        assert!(!installs_bpf_linker(b"bash\0-c\0cargo install bpf-linker\0"));
        assert!(!installs_bpf_linker(b"vim\0install\0bpf-linker\0"));
    }

    #[test]
    fn finds_a_running_bpf_linker_install_in_proc() -> anyhow::Result<()> {
        // argv is `/bin/sh -c SCRIPT cargo install bpf-linker`; `; true` keeps sh from exec'ing sleep.
        let mut installer =
            Command::new("/bin/sh").args(["-c", "sleep 10; true", "cargo", "install", "bpf-linker"]).spawn()?;
        // spawn returns while execve may still be filling in the new cmdline (empty until then).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut found = bpf_linker_installers();
        while !found.contains(&installer.id()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
            found = bpf_linker_installers();
        }
        installer.kill()?;
        installer.wait()?;
        assert!(found.contains(&installer.id()), "{found:?} lacks {}", installer.id());
        Ok(())
    }

    #[test]
    fn rustc_version_fields() {
        let version = "rustc 1.97.0-nightly\nrelease: 1.97.0-nightly\nLLVM version: 22.1.4\n";
        assert_eq!(rustc_field(version, "release"), Some("1.97.0-nightly"));
        assert_eq!(rustc_field(version, "LLVM version"), Some("22.1.4"));
    }
}
