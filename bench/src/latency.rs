//! Section 4, detection latency: from the first dropped packet of a disruption to its
//! incident in /api/v1/incidents, and from a watched process's exit to its event in
//! /api/v1/events.

use std::{
    collections::BTreeSet,
    net::UdpSocket,
    os::unix::fs::PermissionsExt as _,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use datapath_monitor_tests::AGENT_PORT;

use crate::{
    Bench, SDN_STAND_IN, get, progress,
    report::{Figure, Section},
    stats::percentile,
};

const STREAM_PORT: u16 = 7200;
const STREAM_RATE: u64 = 1_000;
const POLL: Duration = Duration::from_millis(5);

pub fn measure(bench: &Bench) -> Result<Section> {
    let agent = bench.start_agent(2)?;
    let detection = detection(bench)?;
    progress("  process exit to event");
    let process = process_exits(bench)?;
    drop(agent);

    let summary = |values: &[f64]| {
        let p = |q| percentile(values, q).unwrap_or_default();
        (p(50.0), p(95.0), p(100.0))
    };
    let (d50, d95, dmax) = summary(&detection);
    let (p50, p95, pmax) = summary(&process);
    let figures = vec![
        Figure::goal(
            "Detection: first dropped packet → incident in /api/v1/incidents, p50 / p95",
            format!("{:.0} / {:.0} ms", d50 * 1e3, d95 * 1e3),
            "p95 ≤ 1.5 s",
            d95 <= 1.5,
        ),
        Figure::info(
            "Watched process exit → event in /api/v1/events, p50 / p95",
            format!("{:.1} / {:.1} ms", p50 * 1e3, p95 * 1e3),
        ),
    ];
    let list = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted.iter().map(|value| format!("{:.0}", value * 1e3)).collect::<Vec<_>>().join(", ")
    };
    let body = format!(
        "**Disruption.** A pod sends {STREAM_RATE} UDP datagrams a second, evenly spaced, to a socket on the \
         host side of its veth. After 10 s of steady traffic, each trial closes that socket: from then on every \
         datagram is dropped by the kernel (`NO_SOCKET`), the first within 1 ms. The trial's clock starts when \
         the socket is closed; the bench polls /api/v1/incidents every {poll} ms until a new incident on that \
         veth appears, then reopens the socket and waits for the incident to end before the next trial. \
         {trials} trials: p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms. All, in ms: {}.\n\n\
         **Process exit.** A stand-in SDN process (a copy of `sleep` named `{SDN_STAND_IN}`, watched through \
         `--sdn-process`) is started; once its start is in /api/v1/events it is killed with SIGKILL, and the \
         bench polls /api/v1/events every {poll} ms until its exit appears. {trials} trials: p50 {:.1} ms, p95 \
         {:.1} ms, max {:.1} ms. All, in ms: {}.\n\n\
         Both include up to one polling interval and an HTTP request; the agent samples the kernel's counters \
         every 250 ms (`--sample-interval-ms`), which bounds how soon a drop can be seen.",
        d50 * 1e3,
        d95 * 1e3,
        dmax * 1e3,
        list(&detection),
        p50 * 1e3,
        p95 * 1e3,
        pmax * 1e3,
        list(&process),
        poll = POLL.as_millis(),
        trials = bench.plan.trials,
    );
    Ok(Section { title: "4. Detection latency".into(), figures, body })
}

/// The host-side socket of the stream, closed and reopened on request by its own thread;
/// it answers each request with the instant the socket was closed or opened.
struct Sink {
    requests: mpsc::Sender<bool>,
    done: mpsc::Receiver<Instant>,
}

fn detection(bench: &Bench) -> Result<Vec<f64>> {
    let pod = &bench.topology.a;
    let address = format!("{}:{STREAM_PORT}", pod.host_ip);
    let stop = Arc::new(AtomicBool::new(false));
    let (requests, request_rx) = mpsc::channel::<bool>();
    let (done_tx, done) = mpsc::channel();
    let sink_address = address.clone();
    // The main thread is in the host namespace, so this thread is too.
    let sink_thread = thread::spawn(move || -> Result<()> {
        let mut socket = Some(UdpSocket::bind(&sink_address)?);
        let mut buffer = [0u8; 128];
        loop {
            match request_rx.try_recv() {
                Ok(open) => {
                    socket = if open { Some(UdpSocket::bind(&sink_address)?) } else { None };
                    let _ = done_tx.send(Instant::now());
                }
                Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
                Err(mpsc::TryRecvError::Empty) => {}
            }
            match &socket {
                Some(socket) => {
                    socket.set_read_timeout(Some(Duration::from_millis(2)))?;
                    let _ = socket.recv(&mut buffer);
                }
                None => thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    let sink = Sink { requests, done };
    let sender = {
        let stop = Arc::clone(&stop);
        pod.ns.spawn(move || -> Result<()> {
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            let started = Instant::now();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * STREAM_RATE as f64) as u64;
                while sent < due {
                    // While the port is closed, ICMP errors make some sends fail.
                    let _ = socket.send_to(&[0x5a; 64], &address);
                    sent += 1;
                }
                thread::sleep(Duration::from_micros(200));
            }
            Ok(())
        })?
    };
    thread::sleep(Duration::from_secs(10));
    let mut latencies = Vec::new();
    let result = (|| -> Result<()> {
        for trial in 0..bench.plan.trials {
            progress(&format!("  disruption {}/{}", trial + 1, bench.plan.trials));
            let known = incident_ids()?;
            sink.requests.send(false)?;
            let closed = sink.done.recv_timeout(Duration::from_secs(5))?;
            let id = loop {
                if let Some(id) = new_incident(&known, &pod.veth)? {
                    break id;
                }
                if closed.elapsed() > Duration::from_secs(20) {
                    bail!("no incident 20 s after closing the port");
                }
                thread::sleep(POLL);
            };
            latencies.push(closed.elapsed().as_secs_f64());
            sink.requests.send(true)?;
            sink.done.recv_timeout(Duration::from_secs(5))?;
            wait_ended(&id)?;
            thread::sleep(Duration::from_secs(2));
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    drop(sink);
    sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))???;
    sink_thread.join().map_err(|_| anyhow::anyhow!("sink panicked"))??;
    result?;
    Ok(latencies)
}

fn incidents() -> Result<Vec<serde_json::Value>> {
    let (status, body) = get(AGENT_PORT, "/api/v1/incidents")?;
    anyhow::ensure!(status == 200, "/api/v1/incidents answered {status}");
    Ok(serde_json::from_str(&body)?)
}

fn incident_ids() -> Result<BTreeSet<String>> {
    Ok(incidents()?.iter().filter_map(|incident| incident["id"].as_str().map(String::from)).collect())
}

fn new_incident(known: &BTreeSet<String>, veth: &str) -> Result<Option<String>> {
    Ok(incidents()?.into_iter().find_map(|incident| {
        let id = incident["id"].as_str()?;
        let on_veth = incident["interfaces"].as_array()?.iter().any(|interface| interface["interface"] == veth);
        (!known.contains(id) && on_veth).then(|| id.to_string())
    }))
}

fn wait_ended(id: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let active = incidents()?.iter().any(|incident| incident["id"] == id && incident["active"] == true);
        if !active {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("incident {id} still active after 30 s")
}

fn process_exits(bench: &Bench) -> Result<Vec<f64>> {
    let stand_in = bench.scratch_path(SDN_STAND_IN);
    std::fs::copy("/bin/sleep", &stand_in).context("copying /bin/sleep")?;
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755))?;
    let mut latencies = Vec::new();
    for _ in 0..bench.plan.trials {
        let mut child = Command::new(&stand_in).arg("600").stdin(Stdio::null()).spawn()?;
        let pid = child.id();
        let started = Instant::now();
        while !has_event("process_start", pid)? {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                bail!("no process_start event for pid {pid} in 10 s");
            }
            thread::sleep(Duration::from_millis(20));
        }
        child.kill()?;
        let killed = Instant::now();
        child.wait()?;
        while !has_event("process_exit", pid)? {
            if killed.elapsed() > Duration::from_secs(10) {
                bail!("no process_exit event for pid {pid} in 10 s");
            }
            thread::sleep(POLL);
        }
        latencies.push(killed.elapsed().as_secs_f64());
        thread::sleep(Duration::from_millis(200));
    }
    Ok(latencies)
}

fn has_event(kind: &str, pid: u32) -> Result<bool> {
    let (status, body) = get(AGENT_PORT, "/api/v1/events")?;
    anyhow::ensure!(status == 200, "/api/v1/events answered {status}");
    let events: Vec<serde_json::Value> = serde_json::from_str(&body)?;
    let needle = format!("pid {pid}");
    Ok(events.iter().any(|event| {
        event["kind"] == kind
            && event["detail"].as_str().is_some_and(|detail| {
                detail == needle || detail.starts_with(&format!("{needle} ")) || detail.contains(&format!(" {needle} "))
            })
    }))
}
