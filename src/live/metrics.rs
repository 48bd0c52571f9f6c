//! `--metrics-addr HOST:PORT`: the live figures in the Prometheus /
//! OpenMetrics text format at `http://HOST:PORT/metrics`, for a Prometheus
//! next to the DCGM exporter. Served on gpuprof's tokio runtime by a small
//! HTTP/1.1 handler: one GET per connection, `Connection: close` — all a
//! scraper needs, with no HTTP stack to carry. Every metric is listed in
//! docs/outputs.md.

use std::borrow::Cow;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Live, LiveState};
use crate::analysis::gpu::throttle_names;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Resolve and bind `--metrics-addr` before the job starts, so that a bad
/// address is an error then and not a surprise an hour later.
pub fn bind(addr: &str) -> Result<StdListener, String> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| {
            format!(
                "--metrics-addr {addr}: not an address ({e}); give HOST:PORT, e.g. --metrics-addr 127.0.0.1:9464"
            )
        })?
        .collect();
    let mut last = None;
    for a in &addrs {
        match StdListener::bind(a) {
            Ok(l) => {
                l.set_nonblocking(true)
                    .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
                if !a.ip().is_loopback() {
                    let port = l.local_addr().map_or(a.port(), |b| b.port());
                    eprintln!(
                        "gpuprof: warning: --metrics-addr {addr} listens on {}:{port}, beyond this machine's loopback: anyone who can reach port {port} reads the job's live figures (process ids, roles, ranks, GPU, CPU, IO and memory figures, findings) without authentication; use 127.0.0.1:{port} unless a scraper on another host needs it, behind a firewall",
                        a.ip()
                    );
                }
                return Ok(l);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            format!("--metrics-addr {addr}: the address is already in use; choose a free port")
        }
        Some(e) => format!("--metrics-addr {addr}: cannot listen there ({e})"),
        None => format!("--metrics-addr {addr}: the name resolves to no address"),
    })
}

type Labels = Vec<(Cow<'static, str>, String)>;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// One metric family of a scrape: the figures are taken under the live
/// lock, the text is encoded outside it.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Labels, f64)>,
}

#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            if f.samples.is_empty() {
                continue;
            }
            let ty = match f.kind {
                Kind::Counter => ConstCounter::new(0.0f64).metric_type(),
                Kind::Gauge => ConstGauge::new(0.0f64).metric_type(),
            };
            // The encoder ends the help text with a full stop itself.
            let help = f.help.trim_end_matches('.');
            let mut me = encoder.encode_descriptor(f.name, help, None, ty)?;
            if let [(labels, v)] = f.samples.as_slice() {
                if labels.is_empty() {
                    put(f.kind, me, *v)?;
                    continue;
                }
            }
            for (labels, v) in &f.samples {
                put(f.kind, me.encode_family(labels)?, *v)?;
            }
        }
        Ok(())
    }
}

fn put(
    kind: Kind,
    e: prometheus_client::encoding::MetricEncoder<'_>,
    v: f64,
) -> Result<(), std::fmt::Error> {
    match kind {
        Kind::Counter => ConstCounter::new(v.max(0.0)).encode(e),
        Kind::Gauge => ConstGauge::new(v).encode(e),
    }
}

fn l(pairs: &[(&'static str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (Cow::Borrowed(*k), v.clone()))
        .collect()
}

struct Builder(Vec<Family>);

impl Builder {
    fn fam(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
    ) -> &mut Vec<(Labels, f64)> {
        self.0.push(Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        });
        &mut self.0.last_mut().expect("just pushed").samples
    }
}

fn role_name(i: usize) -> String {
    super::ROLES[i].as_str().to_string()
}

/// Every family of one scrape, in the order they are served.
fn families(st: &LiveState, ctx: &Context) -> Vec<Family> {
    let mut b = Builder(Vec::new());
    recording_families(&mut b, st, ctx);
    role_families(&mut b, st);
    disk_families(&mut b, st);
    gpu_families(&mut b, st);
    rank_families(&mut b, st);
    nvtx_and_condition_families(&mut b, st, ctx);
    b.0
}

/// The start of the last minute before `now`: the window of busy shares.
fn last_minute(now: crate::event::MonoNs) -> crate::event::MonoNs {
    crate::event::MonoNs(now.0.saturating_sub(60_000_000_000))
}

fn gpu_labels(i: &u32, g: &super::LiveGpu) -> Labels {
    l(&[
        ("gpu", i.to_string()),
        ("uuid", g.uuid.clone()),
        ("name", g.name.clone()),
    ])
}

/// The recording itself and gpuprof's own cost.
fn recording_families(b: &mut Builder, st: &LiveState, ctx: &Context) {
    use Kind::*;
    b.fam(
        "gpuprof_recording_seconds",
        "Seconds recorded so far.",
        Gauge,
    )
    .push((vec![], st.elapsed_s()));
    let bytes = std::fs::metadata(&ctx.recording_file)
        .map(|m| m.len() as f64)
        .unwrap_or(0.0);
    b.fam(
        "gpuprof_recording_bytes",
        "Size of the recording on disk (compressed).",
        Gauge,
    )
    .push((vec![], bytes));
    b.fam("gpuprof_events", "Events recorded.", Counter)
        .push((vec![], st.events as f64));
    let (cpu_ns, _) = crate::selfcost::self_usage();
    b.fam(
        "gpuprof_profiler_cpu_seconds",
        "CPU time gpuprof itself used (user + system).",
        Counter,
    )
    .push((vec![], cpu_ns as f64 / 1e9));
}

/// The job's processes by role.
fn role_families(b: &mut Builder, st: &LiveState) {
    use Kind::*;
    let alive = st.alive();
    let rss = st.rss();
    let cores = st.role_cores(10.0);
    let f = b.fam(
        "gpuprof_cpu_seconds",
        "CPU time of the job's processes by role (main, worker, other).",
        Counter,
    );
    for (i, r) in st.roles.iter().enumerate() {
        f.push((l(&[("role", role_name(i))]), r.cpu_ns as f64 / 1e9));
    }
    if let Some(c) = cores {
        let f = b.fam(
            "gpuprof_cpu_cores",
            "CPU cores used by role over the last 10 s.",
            Gauge,
        );
        for (i, v) in c.iter().enumerate() {
            f.push((l(&[("role", role_name(i))]), *v));
        }
    }
    let f = b.fam(
        "gpuprof_read_bytes",
        "Bytes the job's processes read from storage, by role.",
        Counter,
    );
    for (i, r) in st.roles.iter().enumerate() {
        f.push((l(&[("role", role_name(i))]), r.read_bytes as f64));
    }
    let f = b.fam(
        "gpuprof_write_bytes",
        "Bytes the job's processes wrote to storage, by role.",
        Counter,
    );
    for (i, r) in st.roles.iter().enumerate() {
        f.push((l(&[("role", role_name(i))]), r.write_bytes as f64));
    }
    let f = b.fam(
        "gpuprof_processes",
        "Processes of the job alive, by role.",
        Gauge,
    );
    for (i, n) in alive.iter().enumerate() {
        f.push((l(&[("role", role_name(i))]), *n as f64));
    }
    let f = b.fam(
        "gpuprof_memory_rss_bytes",
        "Resident memory of the job's processes, by role.",
        Gauge,
    );
    for (i, n) in rss.iter().enumerate() {
        f.push((l(&[("role", role_name(i))]), *n as f64));
    }
    let f = b.fam(
        "gpuprof_threads",
        "Threads of the job by scheduler state (R running or runnable, D waiting on IO, S sleeping, ...).",
        Gauge,
    );
    for (s, n) in st.thread_states() {
        f.push((l(&[("state", s.to_string())]), n as f64));
    }
}

/// Disks, machine-wide.
fn disk_families(b: &mut Builder, st: &LiveState) {
    use Kind::*;
    let rd = b.fam(
        "gpuprof_disk_read_bytes",
        "Bytes read from each disk (machine-wide).",
        Counter,
    );
    for (name, d) in st.disks.iter().filter(|(_, d)| d.seen_io()) {
        rd.push((l(&[("disk", name.clone())]), d.read_bytes as f64));
    }
    let wr = b.fam(
        "gpuprof_disk_write_bytes",
        "Bytes written to each disk (machine-wide).",
        Counter,
    );
    for (name, d) in st.disks.iter().filter(|(_, d)| d.seen_io()) {
        wr.push((l(&[("disk", name.clone())]), d.write_bytes as f64));
    }
    let busy = b.fam(
        "gpuprof_disk_busy_seconds",
        "Seconds each disk had IO in flight (machine-wide).",
        Counter,
    );
    for (name, d) in st.disks.iter().filter(|(_, d)| d.seen_io()) {
        busy.push((l(&[("disk", name.clone())]), d.io_ms as f64 / 1e3));
    }
}

/// GPUs, and the GPU memory of the job's processes.
fn gpu_families(b: &mut Builder, st: &LiveState) {
    use Kind::*;
    let now = st.now;
    let from = last_minute(now);
    let f = b.fam(
        "gpuprof_gpu_busy_ratio",
        "Share of the last minute during which a kernel ran (driver utilization samples).",
        Gauge,
    );
    for (i, g) in &st.gpus {
        if let Some((s, _)) = g.busy_share(from, now) {
            f.push((gpu_labels(i, g), s));
        }
    }
    let f = b.fam(
        "gpuprof_gpu_busy_seconds",
        "Seconds a kernel ran: utilization x sample period, summed over the driver's samples.",
        Counter,
    );
    for (i, g) in &st.gpus {
        f.push((gpu_labels(i, g), g.busy_s));
    }
    let f = b.fam(
        "gpuprof_gpu_idle_seconds",
        "Seconds the GPU ran no kernel: (1 - utilization) x sample period, summed.",
        Counter,
    );
    for (i, g) in &st.gpus {
        f.push((gpu_labels(i, g), (g.sampled_s - g.busy_s).max(0.0)));
    }
    let f = b.fam(
        "gpuprof_gpu_idle_sample_seconds",
        "Seconds of samples at or below the idle threshold (--idle-threshold): time in idle gaps.",
        Counter,
    );
    for (i, g) in &st.gpus {
        f.push((gpu_labels(i, g), g.idle_sample_s));
    }
    let f = b.fam("gpuprof_gpu_memory_used_bytes", "GPU memory in use.", Gauge);
    for (i, g) in &st.gpus {
        if let Some(m) = g.mem_used {
            f.push((gpu_labels(i, g), m as f64));
        }
    }
    let f = b.fam(
        "gpuprof_gpu_memory_total_bytes",
        "GPU memory in all.",
        Gauge,
    );
    for (i, g) in &st.gpus {
        if let Some(m) = g.mem_total {
            f.push((gpu_labels(i, g), m as f64));
        }
    }
    let f = b.fam("gpuprof_gpu_temperature_celsius", "GPU temperature.", Gauge);
    for (i, g) in &st.gpus {
        if let Some(v) = g.temp_c {
            f.push((gpu_labels(i, g), v as f64));
        }
    }
    let f = b.fam("gpuprof_gpu_power_watts", "GPU power draw.", Gauge);
    for (i, g) in &st.gpus {
        if let Some(v) = g.power_mw {
            f.push((gpu_labels(i, g), v as f64 / 1e3));
        }
    }
    let f = b.fam("gpuprof_gpu_sm_clock_mhz", "GPU SM clock.", Gauge);
    for (i, g) in &st.gpus {
        if let Some(v) = g.sm_mhz {
            f.push((gpu_labels(i, g), v as f64));
        }
    }
    let f = b.fam(
        "gpuprof_gpu_throttle_seconds",
        "Seconds each clock-event (throttle) reason was active, by NVML reason name.",
        Counter,
    );
    for (i, g) in &st.gpus {
        for (bit, s) in g.throttle_s(now) {
            let mut lab = gpu_labels(i, g);
            lab.push((Cow::Borrowed("reason"), throttle_names(bit).join(",")));
            f.push((lab, s));
        }
    }
    let f = b.fam(
        "gpuprof_gpu_process_memory_bytes",
        "GPU memory held by each process of the job on each GPU, with its role and rank (empty: none).",
        Gauge,
    );
    for (i, g) in &st.gpus {
        for (pid, mem) in &g.procs {
            let (Some(m), Some(role)) = (mem, st.role_of(*pid)) else {
                continue;
            };
            let mut lab = gpu_labels(i, g);
            lab.push((Cow::Borrowed("pid"), pid.0.to_string()));
            lab.push((Cow::Borrowed("role"), role.as_str().to_string()));
            lab.push((
                Cow::Borrowed("rank"),
                st.rank_of(*pid).map(|r| r.to_string()).unwrap_or_default(),
            ));
            f.push((lab, *m as f64));
        }
    }
}

/// Per rank (processes carry the launcher's rank variables).
fn rank_families(b: &mut Builder, st: &LiveState) {
    use Kind::*;
    let now = st.now;
    let from = last_minute(now);
    let ranks = st.rank_gpus();
    let f = b.fam(
        "gpuprof_rank_gpu_busy_ratio",
        "Busy share over the last minute of the GPUs each rank holds a context on (mean over them).",
        Gauge,
    );
    for (r, (gpus, _)) in &ranks {
        let shares: Vec<f64> = gpus
            .iter()
            .filter_map(|i| st.gpus.get(i)?.busy_share(from, now).map(|x| x.0))
            .collect();
        if !shares.is_empty() {
            f.push((
                l(&[("rank", r.to_string())]),
                shares.iter().sum::<f64>() / shares.len() as f64,
            ));
        }
    }
    let f = b.fam(
        "gpuprof_rank_gpu_memory_bytes",
        "GPU memory held by each rank's processes.",
        Gauge,
    );
    for (r, (_, mem)) in &ranks {
        f.push((l(&[("rank", r.to_string())]), *mem as f64));
    }
    let f = b.fam(
        "gpuprof_rank_cpu_seconds",
        "CPU time of each rank's processes (its main process and its workers), by role.",
        Counter,
    );
    for ((r, role), ns) in st.rank_cpu() {
        f.push((
            l(&[("rank", r.to_string()), ("role", role.as_str().to_string())]),
            ns as f64 / 1e9,
        ));
    }
}

/// NVTX ranges and the early-warning conditions.
fn nvtx_and_condition_families(b: &mut Builder, st: &LiveState, ctx: &Context) {
    use Kind::*;
    // NVTX ranges (training steps, when the job marks them).
    let ranges = st.nvtx_ranges();
    let f = b.fam(
        "gpuprof_nvtx_ranges",
        "Completed NVTX ranges by message: rate() of a step range is steps/s.",
        Counter,
    );
    for (name, (n, _)) in &ranges {
        f.push((l(&[("name", name.clone())]), *n as f64));
    }
    let f = b.fam(
        "gpuprof_nvtx_range_seconds",
        "Seconds spent in completed NVTX ranges by message.",
        Counter,
    );
    for (name, (_, secs)) in &ranges {
        f.push((l(&[("name", name.clone())]), *secs));
    }

    // Conditions holding now (the early warnings).
    let f = b.fam(
        "gpuprof_condition_active",
        "Early-warning conditions holding over the last --warn-after window, with the finding each points at (gpuprof explain FINDING).",
        Gauge,
    );
    for a in st.alerts(ctx.warn_window) {
        let cond = a.key.split(':').next().unwrap_or("").to_string();
        let subject = a.key.split(':').nth(1).unwrap_or("").to_string();
        f.push((
            l(&[
                ("condition", cond),
                ("subject", subject),
                (
                    "finding",
                    a.finding.map_or(String::new(), |f| f.id().to_string()),
                ),
            ]),
            1.0,
        ));
    }
}

/// What the server needs besides the live state.
#[derive(Clone)]
pub struct Context {
    pub recording_file: PathBuf,
    pub warn_window: Duration,
}

/// The text of one scrape.
pub fn render(live: &Live, ctx: &Context) -> String {
    let fams = families(&live.lock(), ctx);
    let mut reg = Registry::default();

    reg.register_collector(Box::new(Scrape(fams)));
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

/// Connections served at once. More wait in the kernel's listen queue,
/// which costs gpuprof no descriptor: idle connections from anyone on the
/// machine must not take the descriptors the collectors need.
pub const MAX_CONNECTIONS: usize = 8;
/// The longest a connection is kept, request and answer together (a
/// scraper's default timeout is 10 s; the answer is ready at once).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve until the task is aborted.
pub async fn serve(listener: StdListener, live: Live, ctx: Context) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((sock, _)) = listener.accept().await else {
            // Out of descriptors (or another passing error): wait, rather
            // than spin on a listener that stays readable.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (live, ctx) = (live.clone(), ctx.clone());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, handle(sock, live, ctx)).await;
            drop(slot);
        });
    }
}

async fn handle(mut sock: tokio::net::TcpStream, live: Live, ctx: Context) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 16 * 1024 {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, render(&live, &ctx)),
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "gpuprof: the job's live figures are at /metrics\n".to_string(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: use /metrics\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET /metrics\n".into(),
        ),
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        resp.push_str(&body);
    }
    sock.write_all(resp.as_bytes()).await?;
    sock.shutdown().await
}
