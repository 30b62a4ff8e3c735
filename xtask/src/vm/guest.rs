//! One boot of a test VM: a tiny initramfs (busybox, the modules virtiofs and overlayfs need,
//! the job), the host's root shared read-only over virtiofs as the guest's userland, QEMU
//! under software emulation (KVM here boots only paravirtualized guests), the console streamed,
//! and the job's exit status read back from it.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail, ensure};

use super::kernel::PreparedKernel;
use crate::command;

const INIT: &str = include_str!("init.sh");
const STAGE2: &str = include_str!("stage2.sh");
const BUSYBOX: &str = "/bin/busybox";
const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";
const QEMU: &str = "qemu-system-x86_64";
/// Guest RAM; the overlay's writes live in it too.
const MEMORY_MB: u32 = 2048;
/// Modules the initramfs loads (when not built in), with their dependencies: its root's, the
/// virtio NIC for forwarded ports, and the agent's and the tests' first needs. Anything else
/// (netfilter, ...) the kernel autoloads through the guest's modprobe.
const INITRAMFS_MODULES: &[&str] =
    &["virtio_pci", "virtiofs", "overlay", "virtio_net", "veth", "sch_ingress", "cls_bpf", "act_bpf", "tun"];

/// What to run in the guest.
pub struct Job {
    /// A bash script, run in `workdir` as root.
    pub script: String,
    pub workdir: PathBuf,
    /// Forward these guest TCP ports to the same ports on the host's 127.0.0.1.
    pub forward_ports: Vec<u16>,
    /// Kill the guest after this long (None: run until the job ends).
    pub timeout: Option<Duration>,
    /// A copy of the console goes here.
    pub console_log: Option<PathBuf>,
    /// Printed before each console line echoed to stdout: tells one guest's lines from the
    /// others' when several run at once (e.g. `[6.1] `).
    pub console_prefix: String,
    /// A host directory the guest may write, mounted at the same path over the read-only root
    /// (a second virtiofs share): how a job hands files back (the eval's report, say).
    pub writable: Option<PathBuf>,
}

pub struct Outcome {
    /// The job's exit status.
    pub status: i32,
    /// Seconds from starting QEMU to the guest's userland running (as the guest measured it).
    pub boot_seconds: Option<f64>,
    pub console: String,
}

/// The tools a guest needs on the host, with the apt package that has each.
pub fn missing_tools() -> Vec<String> {
    let mut missing = Vec::new();
    if command::find_program(QEMU).is_none() {
        missing.push(format!("{QEMU} (apt package qemu-system-x86)"));
    }
    if !Path::new(VIRTIOFSD).is_file() {
        missing.push(format!("{VIRTIOFSD} (apt package qemu-system-common)"));
    }
    if !Path::new(BUSYBOX).is_file() {
        missing.push(format!("{BUSYBOX} (apt package busybox-static)"));
    }
    for (tool, package) in [("cpio", "cpio"), ("depmod", "kmod"), ("xz", "xz-utils"), ("zstd", "zstd")] {
        if command::find_program(tool).is_none() {
            missing.push(format!("{tool} (apt package {package})"));
        }
    }
    missing
}

/// Boots `kernel`, runs `job`, returns its status once the guest powered off.
pub fn run(kernel: &PreparedKernel, job: &Job) -> anyhow::Result<Outcome> {
    let missing = missing_tools();
    ensure!(missing.is_empty(), "missing for test VMs: {} (run `cargo xtask setup`)", missing.join(", "));
    ensure!(command::is_root(), "test VMs share the host's root through virtiofsd, which needs root");
    let scratch = Scratch::new()?;
    let nonce = format!("{}-{}", std::process::id(), SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos());
    let initramfs = build_initramfs(kernel, job, &nonce, &scratch.path)?;

    let socket = scratch.path.join("virtiofs.sock");
    let mut virtiofsd = Command::new(VIRTIOFSD);
    virtiofsd
        .arg(format!("--socket-path={}", socket.display()))
        // pivot_root (the default sandbox) cannot take / itself; chroot can.
        .args(["-o", "source=/", "-o", "sandbox=chroot", "-o", "cache=always", "-o", "log_level=err"])
        // It reports the guest's power-off as an unexpected disconnect; failures show as QEMU's.
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let _virtiofsd = KillOnDrop(virtiofsd.spawn().context("starting virtiofsd")?);
    let writable_socket = scratch.path.join("virtiofs-rw.sock");
    let _writable_virtiofsd = match &job.writable {
        Some(dir) => {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut daemon = Command::new(VIRTIOFSD);
            daemon
                .arg(format!("--socket-path={}", writable_socket.display()))
                .arg("-o")
                .arg(format!("source={}", dir.display()))
                .args(["-o", "sandbox=chroot", "-o", "cache=none", "-o", "log_level=err"])
                .stderr(Stdio::null())
                .stdin(Stdio::null());
            Some(KillOnDrop(daemon.spawn().context("starting virtiofsd for the writable share")?))
        }
        None => None,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() || (job.writable.is_some() && !writable_socket.exists()) {
        ensure!(Instant::now() < deadline, "virtiofsd did not create its socket in {}", scratch.path.display());
        thread::sleep(Duration::from_millis(20));
    }

    let mut qemu = command::command(QEMU);
    // One host thread for both vCPUs: with multi-threaded TCG the guest kernel now and then
    // oopses on an int3 while it patches its own code (static keys flipped when programs
    // attach or detach, seen at boot and at an agent's stop); single-threaded TCG has no such
    // cross-thread race.
    qemu.args(["-accel", "tcg,thread=single", "-cpu", "max", "-smp", "2", "-m"])
        .arg(MEMORY_MB.to_string())
        .args(["-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&initramfs)
        .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=3"])
        .arg("-chardev")
        .arg(format!("socket,id=vfs,path={}", socket.display()))
        .args(["-device", "vhost-user-fs-pci,chardev=vfs,tag=host"])
        .args(job.writable.iter().flat_map(|_| {
            [
                "-chardev".to_owned(),
                format!("socket,id=vfsrw,path={}", writable_socket.display()),
                "-device".to_owned(),
                "vhost-user-fs-pci,chardev=vfsrw,tag=writable".to_owned(),
            ]
        }))
        .arg("-object")
        .arg(format!("memory-backend-memfd,id=mem,size={MEMORY_MB}M,share=on"))
        .args(["-numa", "node,memdev=mem"]);
    if job.forward_ports.is_empty() {
        qemu.args(["-nic", "none"]);
    } else {
        let forwards: String =
            job.forward_ports.iter().map(|port| format!(",hostfwd=tcp:127.0.0.1:{port}-:{port}")).collect();
        qemu.arg("-nic").arg(format!("user,model=virtio-net-pci{forwards}"));
    }
    println!("$ {}", command::display(&qemu));
    let started = Instant::now();
    let mut child = KillOnDrop(qemu.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().context("starting QEMU")?);
    let stdout = child.0.stdout.take().context("QEMU's stdout")?;

    // The console is read on a thread so the timeout below can stop a hung guest.
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<(String, Instant)>();
    thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buffer = Vec::new();
        while reader.read_until(b'\n', &mut buffer).is_ok_and(|read| read > 0) {
            let line = String::from_utf8_lossy(&buffer).trim_end_matches(['\r', '\n']).to_owned();
            if lines_tx.send((line, Instant::now())).is_err() {
                break;
            }
            buffer.clear();
        }
    });
    let mut log = match &job.console_log {
        Some(path) => Some(fs::File::create(path).with_context(|| format!("creating {}", path.display()))?),
        None => None,
    };
    let marker = format!("DM-VM-EXIT={nonce}:");
    let mut console = String::new();
    let mut status = None;
    let mut boot_seconds = None;
    loop {
        let wait = match job.timeout {
            Some(timeout) => match timeout.checked_sub(started.elapsed()) {
                Some(left) => left,
                None => bail!("the guest did not finish within {timeout:?}; killed it"),
            },
            None => Duration::from_secs(3600),
        };
        let (line, at) = match lines_rx.recv_timeout(wait) {
            Ok(received) => received,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if let Some(code) = line.strip_prefix(&marker) {
            status = Some(code.trim().parse::<i32>().with_context(|| format!("guest exit line {line:?}"))?);
            continue;
        }
        if boot_seconds.is_none() && line.starts_with("dm-vm: Linux ") {
            boot_seconds = Some(at.duration_since(started).as_secs_f64());
        }
        println!("{}{line}", job.console_prefix);
        if let Some(log) = log.as_mut() {
            writeln!(log, "{line}")?;
        }
        console.push_str(&line);
        console.push('\n');
    }
    let qemu_status = child.0.wait()?;
    match status {
        Some(status) => Ok(Outcome { status, boot_seconds, console }),
        None if boot_seconds.is_some() => {
            bail!("the guest (Linux {}) stopped before its command ended (QEMU {qemu_status})", kernel.release)
        }
        None => Err(BootFailed(format!(
            "the guest (Linux {}) stopped without reporting its command's exit status (QEMU {qemu_status}); \
             boot or init failed, see the console above",
            kernel.release
        ))
        .into()),
    }
}

/// The guest never reached its userland (a kernel oops while booting, say): nothing of the job
/// ran, so booting it again cannot hide a failure of the job.
#[derive(Debug)]
pub struct BootFailed(String);

impl std::fmt::Display for BootFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BootFailed {}

/// The initramfs as a newc cpio archive; returns its path.
fn build_initramfs(kernel: &PreparedKernel, job: &Job, nonce: &str, scratch: &Path) -> anyhow::Result<PathBuf> {
    let root = scratch.join("initramfs");
    for dir in ["bin", "dev", "proc", "sys", "dm-vm/modules"] {
        fs::create_dir_all(root.join(dir))?;
    }
    fs::copy(BUSYBOX, root.join("bin/busybox")).context("copying busybox (apt package busybox-static)")?;
    write_executable(&root.join("init"), INIT)?;
    write_executable(&root.join("dm-vm/stage2.sh"), STAGE2)?;
    write_executable(&root.join("dm-vm/job.sh"), &job.script)?;

    let modules = ModuleIndex::read(&kernel.modules)?;
    let mut order = Vec::new();
    for name in INITRAMFS_MODULES {
        modules.load_order(name, &mut order)?;
    }
    let mut names = Vec::new();
    for path in &order {
        let name = uncompressed_name(path);
        decompress_module(&kernel.modules.join(path), &root.join("dm-vm/modules").join(&name))?;
        names.push(name);
    }
    fs::write(root.join("dm-vm/modules.order"), names.join("\n") + "\n")?;

    let hostname = format!("dm-vm-{}", kernel.kernel.name().replace('.', "-"));
    let net = if job.forward_ports.is_empty() { "" } else { "1" };
    let writable = match &job.writable {
        Some(dir) => dir.to_str().context("writable path")?,
        None => "",
    };
    let env = [
        ("DM_VM_NONCE", nonce),
        ("DM_VM_RELEASE", kernel.release.as_str()),
        ("DM_VM_MODULES", kernel.modules.to_str().context("modules path")?),
        ("DM_VM_WORKDIR", job.workdir.to_str().context("workdir path")?),
        ("DM_VM_HOSTNAME", hostname.as_str()),
        ("DM_VM_NET", net),
        ("DM_VM_WRITABLE", writable),
    ];
    let env: String =
        env.iter().map(|(key, value)| format!("export {key}={}\n", command::shell_quote(value))).collect();
    fs::write(root.join("dm-vm/env"), env)?;

    let archive = scratch.join("initramfs.cpio");
    let files = list_tree(&root)?;
    let mut cpio = Command::new("cpio");
    cpio.current_dir(&root)
        .args(["--quiet", "-o", "-H", "newc", "-R", "0:0"])
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&archive)?);
    let mut child = cpio.spawn().context("starting cpio (apt package cpio)")?;
    child.stdin.take().context("cpio stdin")?.write_all(files.join("\n").as_bytes())?;
    ensure!(child.wait()?.success(), "cpio failed building the initramfs");
    Ok(archive)
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Relative paths of everything under `root`, parents first.
fn list_tree(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut paths = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in fs::read_dir(root.join(&relative))? {
            let entry = entry?;
            let path = relative.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                pending.push(path.clone());
            }
            paths.push(path.to_str().context("non-UTF-8 path")?.to_owned());
        }
    }
    paths.sort();
    Ok(paths)
}

/// `foo.ko.xz` → `foo.ko`.
fn uncompressed_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.trim_end_matches(".xz").trim_end_matches(".zst").trim_end_matches(".gz").to_owned()
}

fn decompress_module(from: &Path, to: &Path) -> anyhow::Result<()> {
    let tool = match from.extension().and_then(|ext| ext.to_str()) {
        Some("xz") => "xz",
        Some("zst") => "zstd",
        Some("gz") => "gzip",
        _ => {
            fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
            return Ok(());
        }
    };
    let status = Command::new(tool)
        .arg("-dc")
        .arg(from)
        .stdout(fs::File::create(to)?)
        .status()
        .with_context(|| format!("starting {tool}"))?;
    ensure!(status.success(), "{tool} -dc {} failed", from.display());
    Ok(())
}

/// modules.dep and modules.builtin of one kernel.
struct ModuleIndex {
    /// Module name (with `_`) → (path relative to the modules dir, its dependencies' paths).
    by_name: BTreeMap<String, (String, Vec<String>)>,
    builtin: BTreeSet<String>,
}

impl ModuleIndex {
    fn read(dir: &Path) -> anyhow::Result<Self> {
        let dep = fs::read_to_string(dir.join("modules.dep")).context("reading modules.dep")?;
        let mut by_name = BTreeMap::new();
        for line in dep.lines() {
            let Some((path, deps)) = line.split_once(':') else { continue };
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            by_name.insert(module_name(path), (path.to_owned(), deps));
        }
        let builtin = fs::read_to_string(dir.join("modules.builtin")).unwrap_or_default();
        let builtin = builtin.lines().map(module_name).collect();
        Ok(Self { by_name, builtin })
    }

    /// Appends `name`'s dependencies, then `name`, to `order` (each path once); nothing for a
    /// built-in module.
    fn load_order(&self, name: &str, order: &mut Vec<String>) -> anyhow::Result<()> {
        let name = name.replace('-', "_");
        if self.builtin.contains(&name) {
            return Ok(());
        }
        let Some((path, deps)) = self.by_name.get(&name) else {
            bail!("the kernel has module {name} neither built in nor in modules.dep");
        };
        for dep in deps {
            self.load_order(&module_name(dep), order)?;
        }
        if !order.contains(path) {
            order.push(path.clone());
        }
        Ok(())
    }
}

/// `kernel/fs/fuse/virtiofs.ko.xz` → `virtiofs`.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}

/// A private directory for one boot, removed afterwards.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        // One per boot: the kernel matrix boots its guests at once from one process.
        static BOOTS: AtomicU32 = AtomicU32::new(0);
        let boot = BOOTS.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("dm-vm-{}-{boot}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_load_first_and_once() {
        let dir = std::env::temp_dir().join(format!("dm-vm-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("modules.dep"),
            "kernel/fs/fuse/virtiofs.ko.xz: kernel/fs/fuse/fuse.ko.xz\nkernel/fs/fuse/fuse.ko.xz:\n\
             kernel/fs/overlayfs/overlay.ko.xz:\nkernel/net/x/a-b.ko: kernel/fs/fuse/fuse.ko.xz\n",
        )
        .unwrap();
        fs::write(dir.join("modules.builtin"), "kernel/drivers/virtio/virtio_pci.ko\n").unwrap();
        let index = ModuleIndex::read(&dir).unwrap();
        let mut order = Vec::new();
        for name in ["virtio_pci", "virtiofs", "overlay", "a-b"] {
            index.load_order(name, &mut order).unwrap();
        }
        assert_eq!(
            order,
            [
                "kernel/fs/fuse/fuse.ko.xz",
                "kernel/fs/fuse/virtiofs.ko.xz",
                "kernel/fs/overlayfs/overlay.ko.xz",
                "kernel/net/x/a-b.ko"
            ]
        );
        assert!(index.load_order("nosuch", &mut order).is_err());
        assert_eq!(uncompressed_name("kernel/fs/fuse/fuse.ko.xz"), "fuse.ko");
        fs::remove_dir_all(&dir).unwrap();
    }
}
