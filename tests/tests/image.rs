//! End-to-end: the agent *image* (`cargo xtask image`, named by DM_IMAGE), run by podman with
//! exactly what the rendered `deploy/base` DaemonSet declares for its agent container: the
//! capabilities it adds and drops, read-only root filesystem, no privilege escalation, user
//! 0, the host PID namespace, the host network (here: the test's node namespace), its args,
//! and its hostPath volumes at their mount paths, read-only where it says so. Read from
//! `kubectl kustomize deploy/base`, so test and manifest cannot drift.
//!
//! Two host paths are moved, so that the test touches nothing of the machine's own: the CNI
//! config dirs' parents and the CNI cache (temp dirs), and the state dir.

use std::{
    collections::BTreeMap,
    net::UdpSocket,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use datapath_monitor_tests::{
    AGENT_PORT, Metrics, Netns, Pod, TempDir, addr, http_get_port, require_root, scaled, send_udp, settle, sh, unique,
};
use serde_json::Value;

/// The agent container of the rendered base DaemonSet, and its pod spec.
fn rendered_daemonset() -> Result<(Value, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("workspace root")?;
    let yaml = sh(&["kubectl", "kustomize", root.join("deploy/base").to_str().context("path")?])?;
    let python = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(".cache/datapath-monitor/venv/bin/python");
    let mut child = Command::new(python)
        .args(["-c", "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("the tools virtualenv's python (cargo xtask setup)")?;
    std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, yaml.as_bytes())?;
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "rendering deploy/base to JSON failed");
    let documents: Vec<Value> = serde_json::from_slice(&output.stdout)?;
    let daemonset = documents.into_iter().find(|d| d["kind"] == "DaemonSet").context("no DaemonSet")?;
    let pod = daemonset["spec"]["template"]["spec"].clone();
    let agent = pod["containers"]
        .as_array()
        .and_then(|containers| containers.iter().find(|c| c["name"] == "agent"))
        .cloned()
        .context("no agent container")?;
    Ok((agent, pod))
}

/// `podman run` arguments for the agent container as the manifest declares it, in the network
/// namespace `netns`, with host paths in `moved` replaced. `drop_cap` leaves one added
/// capability out.
fn podman_args(
    agent: &Value,
    pod: &Value,
    netns: &str,
    moved: &BTreeMap<&str, String>,
    drop_cap: Option<&str>,
) -> Result<Vec<String>> {
    let mut args: Vec<String> = Vec::new();
    ensure!(pod["hostNetwork"] == true && pod["hostPID"] == true, "the DaemonSet runs on the host's network and PIDs");
    args.extend(["--network".into(), format!("ns:/run/netns/{netns}"), "--pid".into(), "host".into()]);
    let security = &agent["securityContext"];
    if security["readOnlyRootFilesystem"] == true {
        args.push("--read-only".into());
    }
    if security["allowPrivilegeEscalation"] == false {
        args.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    ensure!(security["privileged"] != true, "the agent must not need a privileged container");
    if let Some(user) = security["runAsUser"].as_u64() {
        args.extend(["--user".into(), user.to_string()]);
    }
    for cap in security["capabilities"]["drop"].as_array().into_iter().flatten() {
        args.extend(["--cap-drop".into(), cap.as_str().context("cap")?.to_lowercase()]);
    }
    for cap in security["capabilities"]["add"].as_array().into_iter().flatten() {
        let cap = cap.as_str().context("cap")?;
        if Some(cap) != drop_cap {
            args.extend(["--cap-add".into(), cap.to_lowercase()]);
        }
    }
    let volumes: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    for mount in agent["volumeMounts"].as_array().into_iter().flatten() {
        let name = mount["name"].as_str().context("mount name")?;
        let host = volumes.get(name).with_context(|| format!("volume {name} is not a hostPath"))?;
        let host = moved.get(host).cloned().unwrap_or_else(|| host.to_string());
        std::fs::create_dir_all(&host)?;
        let mut options = vec![if mount["readOnly"] == true { "ro" } else { "rw" }];
        if mount["mountPropagation"] == "HostToContainer" {
            options.push("rslave");
        }
        let path = mount["mountPath"].as_str().context("mountPath")?;
        args.extend(["--volume".into(), format!("{host}:{path}:{}", options.join(","))]);
    }
    args.push(std::env::var("DM_IMAGE").context("DM_IMAGE is not set: run through cargo xtask test")?);
    for arg in agent["args"].as_array().into_iter().flatten() {
        args.push(arg.as_str().context("arg")?.to_string());
    }
    Ok(args)
}

fn podman() -> Command {
    let mut podman = Command::new("podman");
    if Path::new("/usr/sbin/runc").exists() {
        podman.args(["--runtime", "/usr/sbin/runc"]);
    }
    podman.args(["--cgroup-manager", "cgroupfs"]);
    podman
}

/// A container of the agent image; removed on drop.
struct Container {
    name: String,
}

impl Container {
    fn start(args: &[String]) -> Result<Self> {
        let name = unique("dm-image-");
        let output = podman()
            .args(["run", "--detach", "--name", &name, "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"])
            .args(args)
            .output()?;
        ensure!(output.status.success(), "podman run: {}", String::from_utf8_lossy(&output.stderr));
        Ok(Self { name })
    }

    fn logs(&self) -> String {
        podman()
            .args(["logs", &self.name])
            .output()
            .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
            .unwrap_or_default()
    }

    fn running(&self) -> bool {
        podman()
            .args(["inspect", "--format", "{{.State.Running}}", &self.name])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "--force", "--time", "10", &self.name]).output();
    }
}

fn get(host: &Netns, path: &str) -> Result<(u16, String)> {
    let path = path.to_string();
    host.run(move || http_get_port(AGENT_PORT, &path))?
}

fn metrics(host: &Netns) -> Result<Metrics> {
    let (status, body) = get(host, "/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    Metrics::parse(&body)
}

fn wait_for(what: &str, container: &Container, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + scaled(Duration::from_secs(30));
    loop {
        if done().unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}:\n{}", container.logs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root and the image: run through cargo xtask test"]
fn the_image_runs_with_the_manifests_security_context_and_counts_exactly() -> Result<()> {
    require_root();
    let (agent, pod) = rendered_daemonset()?;
    let host = Netns::new("dmim")?;
    let veth = Pod::new(&host, 51)?;
    let scratch = TempDir::new("dmim")?;
    let (etc, multus, cni_lib, state) =
        (scratch.join("etc/cni"), scratch.join("multus"), scratch.join("var-lib-cni"), scratch.join("state"));
    let moved: BTreeMap<&str, String> = [
        ("/etc/cni", &etc),
        ("/etc/kubernetes/cni", &etc),
        ("/var/run/multus/cni", &multus),
        ("/run/multus/cni", &multus),
        ("/var/lib/cni", &cni_lib),
        ("/var/lib/datapath-monitor", &state),
    ]
    .into_iter()
    .map(|(from, to)| (from, to.display().to_string()))
    .collect();
    std::fs::create_dir_all(etc.join("net.d"))?;
    std::fs::create_dir_all(cni_lib.join("results"))?;
    // As on a node: tracefs and bpffs mounted on the host (the pins --keep-attached makes go
    // to the host's bpffs, where this test removes them).
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    for (target, fstype) in [("/sys/fs/bpf", "bpf"), ("/sys/kernel/tracing", "tracefs")] {
        if !mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(target)) {
            sh(&["mount", "-t", fstype, fstype, target])?;
        }
    }
    // An SDN process name of the defaults, that nothing on a test machine runs.
    let sdn = scratch.join("flanneld");
    std::fs::copy("/bin/sleep", &sdn)?;

    let args = podman_args(&agent, &pod, &host.name, &moved, None)?;
    println!("podman run {}", args.join(" "));
    let container = Container::start(&args)?;
    let outcome = (|| -> Result<()> {
        wait_for("/readyz", &container, || Ok(get(&host, "/readyz")?.0 == 200))?;
        let labels = [("interface", veth.veth.as_str()), ("direction", "ingress")];
        wait_for("the pod veth attached", &container, || Ok(metrics(&host)?.has("datapath_packets_total", &labels)))?;

        // Exact packets and drops.
        host.exec(&["iptables", "-A", "INPUT", "-p", "udp", "--dport", "5102", "-j", "DROP"])?;
        let listener = host.run(|| UdpSocket::bind("0.0.0.0:5101"))??;
        send_udp(&veth.ns, addr(&veth.host_ip, 5101), 120)?;
        send_udp(&veth.ns, addr(&veth.host_ip, 5102), 30)?;
        let dropped = [("interface", veth.veth.as_str()), ("reason", "NETFILTER_DROP")];
        wait_for("the drops", &container, || Ok(metrics(&host)?.value("datapath_drops_total", &dropped) >= 30.0))?;
        settle();
        let m = metrics(&host)?;
        ensure!(m.value("datapath_packets_total", &labels) == 150.0, "{}", m.text);
        ensure!(m.value("datapath_drops_total", &dropped) == 30.0, "{}", m.text);
        drop(listener);

        // A CNI config change and an SDN process restart.
        std::fs::write(
            etc.join("net.d/10-test.conflist"),
            r#"{"cniVersion":"0.4.0","name":"test","plugins":[{"type":"bridge"}]}"#,
        )?;
        let mut first = Command::new(&sdn).arg("600").spawn()?;
        std::thread::sleep(Duration::from_millis(500));
        first.kill()?;
        first.wait()?;
        let mut second = Command::new(&sdn).arg("600").spawn()?;
        let seen = wait_for("the config change and the restart", &container, || {
            let (_, body) = get(&host, "/api/v1/events?limit=1000")?;
            Ok(body.contains("cni_config_added") && body.contains("process_restart") && body.contains("flanneld"))
        });
        let _ = second.kill();
        let _ = second.wait();
        seen?;

        // Read-only root filesystem.
        let write = podman().args(["exec", &container.name, "touch", "/written"]).output()?;
        let error = String::from_utf8_lossy(&write.stderr);
        ensure!(!write.status.success() && error.contains("Read-only file system"), "writing to / : {error}");
        let (_, readyz) = get(&host, "/readyz")?;
        println!("image ready, 150/150 packets, 30/30 drops, config change and restart seen; /readyz: {readyz}");
        Ok(())
    })();
    let logs = container.logs();
    drop(container);
    let _ = Command::new(std::env::var("DATAPATH_MONITOR_BIN").unwrap_or_default())
        .args(["detach", "--pin-dir", "/sys/fs/bpf/datapath-monitor"])
        .status();
    outcome.with_context(|| logs)?;

    // Without one capability the manifest grants: an error that names it, not a ready agent
    // that watches nothing.
    let args = podman_args(&agent, &pod, &host.name, &moved, Some("NET_ADMIN"))?;
    let container = Container::start(&args)?;
    wait_for("the agent to exit", &container, || Ok(!container.running()))?;
    let logs = container.logs();
    println!("without CAP_NET_ADMIN: {}", logs.lines().last().unwrap_or_default());
    ensure!(logs.contains("lacks CAP_NET_ADMIN"), "the error names the missing capability:\n{logs}");
    Ok(())
}
