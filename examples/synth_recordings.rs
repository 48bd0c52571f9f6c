//! Synthetic node recordings for measuring `gpuprof merge` at scale:
//! `cargo run --release --example synth_recordings -- OUT NODES HOURS`.
//!
//! Each node runs 8 ranks (one per GPU) under a torchrun agent, each rank
//! with 2 DataLoader workers, for HOURS of recorded time at gpuprof's
//! default rates: /proc every 100 ms (per-thread CPU and state, per-process
//! figures, machine-wide CPU, memory, pressure, disks), 8 GPUs at the
//! driver's 1/6 s utilization period, native stack samples at 99 Hz of the
//! 16 worker threads and the 8 main threads, Python stacks of the main
//! threads at 10 Hz (in `all_reduce` while waiting), and one step of 1.3 s.
//! Node 1 is the straggler: its rank 8's workers are saturated and its
//! ranks wait less.
//!
//! Every recording is a real one as far as the reader can tell; to keep
//! generation fast, the bulk (identical on every normal node, their own
//! PIDs and clocks being per host) is written once and each recording is
//! its own gzip member (header, processes with their rank variables)
//! followed by a copy of the bulk — a multi-member gzip stream, which the
//! reader supports like any recording flushed in blocks.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;
use gpuprof::event::*;

const MS: u64 = 1_000_000;
const TICK: u64 = 100 * MS;
const START: u64 = 1_000_000 * MS;
const RANKS: u32 = 8;
const WORKERS: u32 = 2;

fn pid_main(local: u32) -> i32 {
    2000 + 100 * local as i32
}
fn pid_worker(local: u32, w: u32) -> i32 {
    pid_main(local) + 1 + w as i32
}

struct Out<W: Write> {
    w: W,
    line: Vec<u8>,
}

impl<W: Write> Out<W> {
    fn ev(&mut self, e: &Event) {
        self.line.clear();
        serde_json::to_writer(&mut self.line, e).unwrap();
        self.line.push(b'\n');
        self.w.write_all(&self.line).unwrap();
    }
}

fn gz(path: &Path) -> Out<GzEncoder<BufWriter<File>>> {
    Out {
        w: GzEncoder::new(
            BufWriter::with_capacity(1 << 20, File::create(path).unwrap()),
            Compression::fast(),
        ),
        line: Vec::new(),
    }
}

fn header(node: u32, nodes: u32, hours: f64) -> Header {
    let _ = hours;
    let mut env = RankEnv::new();
    env.insert("GROUP_RANK".into(), node.to_string());
    Header {
        format: "gpuprof-recording".into(),
        version: RECORDING_VERSION,
        gpuprof_version: env!("CARGO_PKG_VERSION").into(),
        command: vec![
            "torchrun".into(),
            format!("--nnodes={nodes}"),
            "--nproc-per-node=8".into(),
            "train.py".into(),
        ],
        host: format!("node-{node:02}"),
        start: MonoNs(START),
        // Each host's wall clock a few ms off, synchronised within 5 ms.
        anchor_realtime_ns: 1_780_000_000_000_000_000 + START + (node as u64 * 7919 % 5) * MS,
        anchor_monotonic_ns: START,
        anchor_error_ns: 500,
        interval_ns: TICK,
        cpus: 64,
        page_size: 4096,
        clock_ticks_per_s: 100,
        rank: None,
        rank_env: env,
        boot_id: Some(format!("synthetic-boot-{node}")),
        clock: Some(ClockSync {
            synchronized: true,
            max_error_us: 5_000,
            est_error_us: 500,
            source: "synthetic".into(),
        }),
        job_pid: Pid(1000),
        boottime_offset_ns: 0,
        gpu_idle_threshold_pct: Some(5.0),
        attached: None,
        step_range: None,
    }
}

/// The per-node part: header and processes with their rank variables.
fn node_part(path: &Path, node: u32, nodes: u32, hours: f64) {
    let mut o = gz(path);
    o.ev(&Event::Header(header(node, nodes, hours)));
    o.ev(&Event::WindowStart { t: MonoNs(START) });
    let proc_ev =
        |pid: i32, ppid: i32, comm: &str, cmd: &[&str], env: Option<RankEnv>| Event::Process {
            t: MonoNs(START),
            pid: Pid(pid),
            ppid: Pid(ppid),
            start_boot_ns: 0,
            comm: comm.into(),
            cmdline: cmd.iter().map(|s| s.to_string()).collect(),
            exe: Some("/usr/bin/python3.11".into()),
            rank_env: env,
        };
    let mut agent_env = RankEnv::new();
    agent_env.insert("GROUP_RANK".into(), node.to_string());
    o.ev(&proc_ev(
        1000,
        1,
        "pt_elastic",
        &["python3", "torchrun", "train.py"],
        Some(agent_env),
    ));
    for l in 0..RANKS {
        let mut env = RankEnv::new();
        env.insert("RANK".into(), (node * RANKS + l).to_string());
        env.insert("LOCAL_RANK".into(), l.to_string());
        env.insert("WORLD_SIZE".into(), (nodes * RANKS).to_string());
        env.insert("GROUP_RANK".into(), node.to_string());
        o.ev(&proc_ev(
            pid_main(l),
            1000,
            "python3",
            &["python3", "-u", "train.py"],
            Some(env.clone()),
        ));
        for w in 0..WORKERS {
            o.ev(&proc_ev(
                pid_worker(l, w),
                pid_main(l),
                "pt_data_worker",
                &["python3", "-u", "train.py"],
                Some(env.clone()),
            ));
        }
    }
    o.w.finish().unwrap().flush().unwrap();
}

/// Deterministic noise in [0, 1).
fn noise(a: u64, b: u64) -> f64 {
    let mut z = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The bulk: everything after the processes, for `hours` of time.
fn bulk(path: &Path, hours: f64, slow: bool) {
    let mut o = gz(path);
    let ticks = (hours * 36_000.0) as u64;
    let step = 1_300 * MS;
    // Worker thread CPU per tick: normal 35%, the slow rank's 98%.
    let worker_busy = |l: u32| if slow && l == 0 { 0.98 } else { 0.35 };
    // Wait share of each rank in all_reduce: normal 30%, the slow
    // node's ranks 10% (they arrive last).
    let wait = |_l: u32| if slow { 0.10 } else { 0.30 };

    // Native stack vocabulary: 6 frames, 3 stacks.
    o.ev(&Event::StackFile {
        id: 0,
        path: "/usr/bin/python3.11".into(),
    });
    o.ev(&Event::StackFile {
        id: 1,
        path: "/usr/lib/libtorch_cpu.so".into(),
    });
    for (id, file, off) in [
        (0, 0, 0x10),
        (1, 0, 0x20),
        (2, 0, 0x30),
        (3, 1, 0x40),
        (4, 1, 0x50),
        (5, 1, 0x60),
    ] {
        o.ev(&Event::NativeFrame {
            id,
            file,
            offset: off,
        });
    }
    for (id, parent, frame) in [
        (0, None, 0),
        (1, Some(0), 1),
        (2, Some(1), 2),
        (3, Some(2), 3),
        (4, Some(2), 4),
        (5, Some(4), 5),
    ] {
        o.ev(&Event::StackNode {
            kind: StackKind::Native,
            id,
            parent,
            frame,
        });
    }
    // Python vocabulary: <module> → main → train_step | all_reduce | __getitem__.
    let py = [
        (0, "<module>", "train.py"),
        (1, "main", "train.py"),
        (2, "train_step", "train.py"),
        (
            3,
            "all_reduce",
            "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
        ),
        (4, "__getitem__", "train.py"),
    ];
    for (id, name, file) in py {
        o.ev(&Event::PyFrame {
            id,
            name: name.into(),
            file: file.into(),
            entry: id == 0,
        });
    }
    for (id, parent, frame) in [
        (0, None, 0),
        (1, Some(0), 1),
        (2, Some(1), 2),
        (3, Some(1), 3),
        (4, Some(0), 4),
    ] {
        o.ev(&Event::StackNode {
            kind: StackKind::Python,
            id,
            parent,
            frame,
        });
    }
    o.ev(&Event::GpuDriver {
        t: MonoNs(START),
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: Some(12040),
        devices: RANKS,
    });
    for g in 0..RANKS {
        o.ev(&Event::GpuDevice {
            t: MonoNs(START),
            gpu: g,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: format!("GPU-synthetic-{g}"),
            pci_bus_id: None,
            mem_total: Some(80 << 30),
            max_sm_mhz: Some(1980),
            max_mem_mhz: Some(2619),
            pcie_max_gen: Some(5),
            pcie_max_width: Some(16),
            mig_enabled: Some(false),
            unsupported: vec![],
        });
        o.ev(&Event::GpuProcesses {
            t: MonoNs(START),
            gpu: g,
            procs: vec![GpuProc {
                pid: Pid(pid_main(g)),
                ctx: GpuContext::Compute,
                mem: Some(40 << 30),
                gi: None,
                ci: None,
            }],
        });
    }

    let mut cpu_ns: BTreeMap<i32, u64> = BTreeMap::new();
    let mut sys = CpuTimes::default();
    let mut native: BTreeMap<i32, (Vec<u32>, Vec<u32>, u64)> = BTreeMap::new();
    let mut python: BTreeMap<i32, (Vec<u32>, Vec<u32>, u64)> = BTreeMap::new();
    for k in 0..=ticks {
        let t = START + k * TICK;
        let in_step = (k * TICK) % step;
        for l in 0..RANKS {
            // Main thread: computes (1 - wait) of each step, waits the rest.
            let waiting = (in_step as f64) >= (1.0 - wait(l)) * step as f64;
            let threads = [
                (pid_main(l), pid_main(l), if waiting { 0.05 } else { 0.9 }),
                (pid_main(l), pid_main(l) + 50, 0.02),
            ];
            let mut all = threads.to_vec();
            for w in 0..WORKERS {
                let b = worker_busy(l) * (0.8 + 0.4 * noise(k, (l * 10 + w) as u64));
                all.push((pid_worker(l, w), pid_worker(l, w), b.min(1.0)));
            }
            let mut per_proc: BTreeMap<i32, u64> = BTreeMap::new();
            for (pid, tid, busy) in all {
                let c = cpu_ns.entry(tid).or_default();
                *c += (busy * TICK as f64) as u64;
                *per_proc.entry(pid).or_default() += *c;
                if k == 0 {
                    o.ev(&Event::Thread {
                        t: MonoNs(t),
                        pid: Pid(pid),
                        tid: Tid(tid),
                        comm: if pid == tid && pid % 100 == 0 {
                            "python3".into()
                        } else {
                            "pt_data_worker".into()
                        },
                    });
                }
                o.ev(&Event::ThreadCpu {
                    t: MonoNs(t),
                    pid: Pid(pid),
                    tid: Tid(tid),
                    user_ns: *c,
                    sys_ns: 0,
                    state: if busy > 0.5 { 'R' } else { 'S' },
                    cpu: tid % 64,
                });
                // Native samples of busy moments at 99 Hz.
                if busy > 0.3 {
                    let e = native
                        .entry(tid)
                        .or_insert((Vec::new(), Vec::new(), t / 1000));
                    for s in 0..((busy * 9.9).round() as u32) {
                        e.0.push(if e.0.is_empty() { 0 } else { 10_101 });
                        e.1.push(3 + (s + k as u32) % 3);
                    }
                }
            }
            for (pid, c) in per_proc {
                o.ev(&Event::ProcessSample {
                    t: MonoNs(t),
                    pid: Pid(pid),
                    user_ns: c,
                    sys_ns: 0,
                    rss_bytes: 2 << 30,
                    read_bytes: k * 4096,
                    write_bytes: 0,
                    rchar: k * 65536,
                    wchar: 0,
                    threads: 8,
                });
            }
            // Python stack of the main thread at 10 Hz.
            let e = python
                .entry(pid_main(l))
                .or_insert((Vec::new(), Vec::new(), t / 1000));
            e.0.push(if e.0.is_empty() { 0 } else { 100_000 });
            e.1.push(if waiting { 3 } else { 2 });
        }
        sys.user += 40 * TICK;
        sys.idle += 24 * TICK;
        o.ev(&Event::SystemCpu {
            t: MonoNs(t),
            total: sys,
            per_cpu: vec![],
            procs_running: 30,
            procs_blocked: 0,
        });
        o.ev(&Event::Memory {
            t: MonoNs(t),
            total_bytes: 1 << 40,
            available_bytes: 800 << 30,
            swap_total_bytes: 0,
            swap_free_bytes: 0,
            pswpin: 0,
            pswpout: 0,
        });
        o.ev(&Event::Pressure {
            t: MonoNs(t),
            cpu: Some(Psi {
                some_us: k * 1000,
                full_us: None,
            }),
            io: Some(Psi {
                some_us: k * 100,
                full_us: Some(k * 50),
            }),
            memory: Some(Psi {
                some_us: 0,
                full_us: Some(0),
            }),
        });
        o.ev(&Event::Disks {
            t: MonoNs(t),
            disks: vec![DiskCounters {
                name: "nvme0n1".into(),
                reads: k * 10,
                read_bytes: k * 40960,
                writes: 0,
                write_bytes: 0,
                io_ms: k * 5,
            }],
        });
        // Once a second: GPU utilization (6 samples each), stack batches.
        if k % 10 == 0 && k > 0 {
            for g in 0..RANKS {
                let samples: Vec<(u64, u32)> = (0..6)
                    .map(|j| {
                        let ts = t - 1_000 * MS + j * 166 * MS;
                        let wall_us = (1_780_000_000_000_000_000 + ts) / 1000;
                        let busy = if slow && g == 0 && j % 2 == 0 {
                            0
                        } else {
                            85 + (noise(k, j + g as u64 * 8) * 10.0) as u32
                        };
                        (wall_us, busy)
                    })
                    .collect();
                o.ev(&Event::GpuUtil {
                    t: MonoNs(t),
                    gpu: g,
                    samples,
                });
                o.ev(&Event::GpuState {
                    t: MonoNs(t),
                    gpu: g,
                    state: GpuState {
                        mem_used: Some((40 << 30) + (k % 7) * (1 << 20)),
                        sm_mhz: Some(1980),
                        temp_c: Some(60 + (k / 600 % 10) as u32),
                        power_mw: Some(500_000 + (noise(k, g as u64) * 100_000.0) as u32),
                        power_limit_mw: Some(700_000),
                        ..Default::default()
                    },
                });
            }
            for (kind, map) in [
                (StackKind::Native, &mut native),
                (StackKind::Python, &mut python),
            ] {
                for (tid, (dt, st, t0)) in std::mem::take(map) {
                    if dt.is_empty() {
                        continue;
                    }
                    let pid = if tid % 100 == 50 { tid - 50 } else { tid };
                    o.ev(&Event::Samples(SampleBatch {
                        kind,
                        pid: Pid(pid),
                        tid: Tid(tid),
                        t0: MonoNs(t0 * 1000),
                        dt_us: dt,
                        stacks: st,
                        incomplete: vec![],
                        source: Default::default(),
                    }));
                }
            }
        }
    }
    o.ev(&Event::Symbols {
        names: vec![
            (0, "_start".into()),
            (1, "Py_RunMain".into()),
            (2, "_PyEval_EvalFrameDefault".into()),
            (3, "at::native::add_kernel".into()),
            (4, "at::native::conv2d".into()),
            (5, "mkl_sgemm".into()),
        ],
        unnamed: vec![],
    });
    o.ev(&Event::StackStats(StackStats {
        kind: Some(StackKind::Native),
        samples: 0,
        interval_ns: 10_101_010,
        detail: "synthetic".into(),
        ..Default::default()
    }));
    o.ev(&Event::Footer(Footer {
        t: MonoNs(START + ticks * TICK),
        status: JobStatus::Exited(0),
        reason: "job exited".into(),
        dropped_events: 0,
        profiler_cpu_ns: 0,
        profiler_max_rss_bytes: 0,
        profiler_cpu_ns_by_component: Default::default(),
        end_anchor: None,
        recording_error: None,
    }));
    o.w.finish().unwrap().flush().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: synth_recordings OUT NODES HOURS");
        std::process::exit(2);
    }
    let out = Path::new(&args[1]);
    let nodes: u32 = args[2].parse().expect("NODES");
    let hours: f64 = args[3].parse().expect("HOURS");
    std::fs::create_dir_all(out).unwrap();
    let (normal, slow) = (out.join(".bulk-normal.gz"), out.join(".bulk-slow.gz"));
    bulk(&normal, hours, false);
    bulk(&slow, hours, true);
    for n in 0..nodes {
        let dir = out.join(format!("node-{n:02}")).join("recording");
        std::fs::create_dir_all(&dir).unwrap();
        let ev = dir.join("events.jsonl.gz");
        node_part(&ev, n, nodes, hours);
        let body = std::fs::read(if n == 1 { &slow } else { &normal }).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&ev).unwrap();
        f.write_all(&body).unwrap();
    }
    let _ = std::fs::remove_file(&normal);
    let _ = std::fs::remove_file(&slow);
    let size: u64 = (0..nodes)
        .map(|n| {
            std::fs::metadata(out.join(format!("node-{n:02}/recording/events.jsonl.gz")))
                .unwrap()
                .len()
        })
        .sum();
    println!(
        "{nodes} recordings of {hours} h in {}: {:.1} MB in all",
        out.display(),
        size as f64 / 1e6
    );
}
