//! Guest kernels: Debian's cloud kernel packages for a series, fetched through apt and unpacked
//! once under the cache, or the host's own kernel.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::command::{self, command};

/// A kernel the test VM can boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Debian 12's own kernel series (no tcx; `kfree_skb` without `rx_sk`).
    V6_1,
    /// The 6.12 LTS series (tcx; `kfree_skb` with `rx_sk`).
    V6_12,
    /// The kernel this machine runs, from /boot.
    Host,
}

impl Kernel {
    pub const DEFAULT_MATRIX: &[Kernel] = &[Kernel::V6_1, Kernel::V6_12];

    pub fn parse(name: &str) -> anyhow::Result<Self> {
        match name.trim() {
            "6.1" => Ok(Self::V6_1),
            "6.12" => Ok(Self::V6_12),
            "host" => Ok(Self::Host),
            other => bail!("unknown kernel {other:?}: expected 6.1, 6.12 or host"),
        }
    }

    /// A comma-separated list, e.g. `6.1,6.12`.
    pub fn parse_list(list: &str) -> anyhow::Result<Vec<Self>> {
        let kernels =
            list.split(',').filter(|name| !name.trim().is_empty()).map(Self::parse).collect::<Result<Vec<_>, _>>()?;
        ensure!(!kernels.is_empty(), "no kernel in {list:?}: expected e.g. 6.1,6.12");
        Ok(kernels)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::V6_1 => "6.1",
            Self::V6_12 => "6.12",
            Self::Host => "host",
        }
    }

    /// Debian's meta-package that depends on the newest image of the series.
    fn meta_package(self) -> Option<&'static str> {
        match self {
            Self::V6_1 => Some("linux-image-cloud-amd64"),
            Self::V6_12 => Some("linux-image-6.12-cloud-amd64"),
            Self::Host => None,
        }
    }
}

/// A bootable kernel and the modules built for it.
pub struct PreparedKernel {
    pub kernel: Kernel,
    /// `uname -r` in the guest.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` with a modules.dep.
    pub modules: PathBuf,
}

/// Where downloaded packages and unpacked kernels are kept between runs.
pub fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/datapath-monitor/vm")
}

/// Fetches (once) and unpacks (once) the kernel, or finds the host's.
pub fn prepare(kernel: Kernel) -> anyhow::Result<PreparedKernel> {
    match kernel.meta_package() {
        Some(meta) => prepare_debian(kernel, meta),
        None => prepare_host(),
    }
}

fn prepare_host() -> anyhow::Result<PreparedKernel> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").context("reading the host's kernel release")?;
    let release = release.trim().to_owned();
    let vmlinuz = PathBuf::from(format!("/boot/vmlinuz-{release}"));
    let modules = PathBuf::from(format!("/lib/modules/{release}"));
    ensure!(
        vmlinuz.is_file(),
        "the host kernel {release} cannot be booted in a VM: {} does not exist (this machine boots its kernel \
         from outside; use --kernel 6.1 or --kernel 6.12)",
        vmlinuz.display()
    );
    ensure!(
        modules.join("modules.dep").is_file(),
        "the host kernel {release} has no modules in {} (needed for virtiofs, veth, clsact in the guest)",
        modules.display()
    );
    Ok(PreparedKernel { kernel: Kernel::Host, release, vmlinuz, modules })
}

fn prepare_debian(kernel: Kernel, meta: &str) -> anyhow::Result<PreparedKernel> {
    let cache = cache_dir();
    let package = resolve_image_package(kernel, meta, &cache)?;
    let unpacked = cache.join("kernels").join(&package);
    if !unpacked.join(".complete").is_file() {
        let deb = download(&package, &cache.join("debs"))?;
        unpack(&deb, &unpacked)?;
    }
    let release = package
        .strip_prefix("linux-image-")
        .with_context(|| format!("{package} is not a linux-image package"))?
        .to_owned();
    let vmlinuz = unpacked.join(format!("boot/vmlinuz-{release}"));
    ensure!(vmlinuz.is_file(), "{package} has no {}", vmlinuz.display());
    let modules = modules_dir(&unpacked, &release)?;
    Ok(PreparedKernel { kernel, release, vmlinuz, modules })
}

/// The concrete image package (`linux-image-6.1.0-57-cloud-amd64`) the meta-package depends on,
/// from apt's local lists; without apt's answer, the newest one already cached.
fn resolve_image_package(kernel: Kernel, meta: &str, cache: &Path) -> anyhow::Result<String> {
    let answer = command::stdout(command("apt-cache").args(["depends", "--no-recommends", "--no-suggests", meta]));
    if let Ok(text) = &answer
        && let Some(package) = image_dependency(text)
    {
        return Ok(package);
    }
    let prefix = match kernel {
        Kernel::V6_1 => "linux-image-6.1.",
        _ => "linux-image-6.12.",
    };
    let mut cached: Vec<String> = fs::read_dir(cache.join("kernels"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().join(".complete").is_file())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with(prefix))
        .collect();
    cached.sort();
    match cached.pop() {
        Some(package) => {
            println!("note: apt does not know {meta}; using the cached {package}");
            Ok(package)
        }
        None => bail!(
            "cannot find Debian's kernel {} package: `apt-cache depends {meta}` gave {}; \
             run `apt-get update` (the package comes from Debian 12's main archive)",
            kernel.name(),
            match answer {
                Ok(text) => format!("no linux-image dependency:\n{text}"),
                Err(error) => error.to_string(),
            }
        ),
    }
}

/// The first `Depends: linux-image-…` of `apt-cache depends` output.
fn image_dependency(apt_cache_depends: &str) -> Option<String> {
    apt_cache_depends.lines().find_map(|line| {
        let package = line.trim().strip_prefix("Depends:")?.trim();
        package.starts_with("linux-image-").then(|| package.to_owned())
    })
}

fn download(package: &str, debs: &Path) -> anyhow::Result<PathBuf> {
    let existing = |debs: &Path| -> Option<PathBuf> {
        fs::read_dir(debs).ok()?.flatten().map(|entry| entry.path()).find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(&format!("{package}_")) && name.ends_with(".deb"))
        })
    };
    if let Some(deb) = existing(debs) {
        return Ok(deb);
    }
    fs::create_dir_all(debs).with_context(|| format!("creating {}", debs.display()))?;
    let mut apt = command("apt-get");
    apt.current_dir(debs).args(["download", package]);
    command::run(&mut apt)
        .with_context(|| format!("downloading {package} (does this machine reach its apt mirror?)"))?;
    existing(debs).with_context(|| format!("apt-get download left no {package}_*.deb in {}", debs.display()))
}

fn unpack(deb: &Path, unpacked: &Path) -> anyhow::Result<()> {
    let partial = PathBuf::from(format!("{}.partial", unpacked.display()));
    let _ = fs::remove_dir_all(&partial);
    let _ = fs::remove_dir_all(unpacked);
    fs::create_dir_all(&partial)?;
    command::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial))?;
    fs::rename(&partial, unpacked)?;
    // Debian's packages ship no modules.dep: the postinst runs depmod.
    let release = fs::read_dir(modules_root(unpacked)?)?
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .next()
        .context("the kernel package has no modules")?;
    command::run(command("depmod").arg("-b").arg(unpacked).arg(&release)).context("depmod (apt package kmod)")?;
    fs::write(unpacked.join(".complete"), "")?;
    Ok(())
}

/// `lib/modules` (or usr/lib/modules on merged-/usr packages) of an unpacked package.
fn modules_root(unpacked: &Path) -> anyhow::Result<PathBuf> {
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|dir| unpacked.join(dir))
        .find(|dir| dir.is_dir())
        .with_context(|| format!("{} has no lib/modules", unpacked.display()))
}

fn modules_dir(unpacked: &Path, release: &str) -> anyhow::Result<PathBuf> {
    let dir = modules_root(unpacked)?.join(release);
    ensure!(dir.join("modules.dep").is_file(), "{} has no modules.dep", dir.display());
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_package_is_read_from_apt_cache_depends() {
        let text = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n";
        assert_eq!(image_dependency(text).as_deref(), Some("linux-image-6.1.0-57-cloud-amd64"));
        assert_eq!(image_dependency("linux-image-cloud-amd64\n  Depends: initramfs-tools\n"), None);
    }

    #[test]
    fn kernel_lists_parse() {
        assert_eq!(Kernel::parse_list("6.1,6.12").unwrap(), vec![Kernel::V6_1, Kernel::V6_12]);
        assert_eq!(Kernel::parse_list("host").unwrap(), vec![Kernel::Host]);
        assert!(Kernel::parse_list("5.4").is_err());
        assert!(Kernel::parse_list("").is_err());
    }
}
