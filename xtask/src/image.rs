//! `cargo xtask image`: the agent's container image, from the Containerfile, with podman.
//!
//! The Containerfile builds the agent from source in a Rust image (its `builder` stage), as a
//! registry's build would. Here the image takes the binary `cargo build --release` made on
//! this machine instead (`--build-arg AGENT_FROM=prebuilt`), which keeps CI's image build to
//! seconds; both are the same glibc (Debian 12), as the runtime base is.
//!
//! The runtime base, `docker.io/library/debian:bookworm-slim`, is pulled where registries can
//! be reached. Where they cannot (these machines reach package mirrors only), it is made from
//! Debian's own packages with mmdebstrap (`--variant=minbase`) and imported under the same
//! tag; the Containerfile is the same either way.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use crate::{
    build,
    command::{self, Workspace},
    setup,
};

/// The runtime base the Containerfile names (its `RUNTIME_IMAGE` default).
pub const BASE_IMAGE: &str = "docker.io/library/debian:bookworm-slim";
/// dpkg path filters of Debian's slim images (debuerreotype's `--slimify`).
const SLIM_PATHS: &[&str] = &[
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/groff/*",
];
/// Where the binary is put for the `prebuilt` stage (the one path of target/ the
/// .containerignore lets into the build context).
const PREBUILT: &str = "target/image/datapath-monitor";

/// podman with the runtime and cgroup manager that work on these hosts (crun fails on their
/// hybrid cgroups; runc does not).
pub fn podman() -> Command {
    let mut podman = command::command("podman");
    if Path::new("/usr/sbin/runc").exists() {
        podman.args(["--runtime", "/usr/sbin/runc"]);
    }
    podman.args(["--cgroup-manager", "cgroupfs"]);
    podman
}

/// Builds the image and returns its tag: `localhost/datapath-monitor:<version>-<commit>`.
pub fn image() -> anyhow::Result<String> {
    setup::ensure_ready()?;
    let workspace = Workspace::locate()?;
    let binary = build::build_agent(&workspace, true)?;
    build_image(&workspace, &binary)
}

/// Builds the image around `binary` (a release build of this checkout).
pub fn build_image(workspace: &Workspace, binary: &Path) -> anyhow::Result<String> {
    ensure_base()?;
    let prebuilt = workspace.root.join(PREBUILT);
    std::fs::create_dir_all(prebuilt.parent().context("prebuilt dir")?)?;
    std::fs::copy(binary, &prebuilt).with_context(|| format!("copying {} into the context", binary.display()))?;
    let tag = format!("localhost/datapath-monitor:{}", version_tag(workspace)?);
    command::run(
        podman()
            .current_dir(&workspace.root)
            .args(["build", "--file", "Containerfile", "--build-arg", "AGENT_FROM=prebuilt", "--tag", &tag])
            .args(["--tag", "localhost/datapath-monitor:latest", "."]),
    )
    .context("building the image (podman build)")?;
    let size = command::stdout(podman().args(["image", "inspect", "--format", "{{.Size}}", &tag]))?;
    let size: f64 = size.trim().parse().unwrap_or(0.0);
    println!("image {tag}: {:.1} MB", size / 1e6);
    Ok(tag)
}

/// `<version>-<commit>` (with `-dirty` when the work tree has changes).
fn version_tag(workspace: &Workspace) -> anyhow::Result<String> {
    let manifest = std::fs::read_to_string(workspace.root.join("monitor/Cargo.toml"))?;
    let version = manifest
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .context("no version in monitor/Cargo.toml")?;
    let commit =
        command::stdout(Command::new("git").current_dir(&workspace.root).args(["rev-parse", "--short=12", "HEAD"]))?;
    let dirty = !command::stdout(Command::new("git").current_dir(&workspace.root).args(["status", "--porcelain"]))?
        .trim()
        .is_empty();
    Ok(format!("{version}-{}{}", commit.trim(), if dirty { "-dirty" } else { "" }))
}

/// The runtime base, pulled, or made from Debian's packages when it cannot be.
fn ensure_base() -> anyhow::Result<()> {
    if command::succeeds(podman().args(["image", "exists", BASE_IMAGE])) {
        return Ok(());
    }
    if command::succeeds(podman().args(["pull", "--quiet", BASE_IMAGE])) {
        return Ok(());
    }
    println!("{BASE_IMAGE} cannot be pulled here: making it from Debian's packages (mmdebstrap)");
    let dir = std::env::temp_dir().join(format!("dm-image-base-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tarball = dir.join("bookworm-slim.tar");
    let made = command::run(
        command::command("mmdebstrap")
            .args(["--variant=minbase", "--quiet"])
            // As the official slim images: no manuals, locales or docs but the copyright files.
            .args(SLIM_PATHS.iter().map(|option| format!("--dpkgopt={option}")))
            .arg("bookworm")
            .arg(&tarball)
            .arg("http://deb.debian.org/debian"),
    )
    .context("mmdebstrap --variant=minbase bookworm")
    .and_then(|()| {
        command::run(podman().arg("import").arg(&tarball).arg(BASE_IMAGE)).context("podman import of the base")
    });
    let _ = std::fs::remove_dir_all(&dir);
    made
}
