//! Rules on hand-built recordings: a main process and workers whose thread
//! states and CPU are written tick by tick, with GPU evidence built by hand
//! where a rule needs it.

use super::*;
use crate::analysis::analyze_events;
use crate::event::{CpuTimes, Event, Footer, Header, JobStatus, MonoNs, Pid, Tid};

const MS: u64 = 1_000_000;
const START: u64 = 1_000 * MS;
/// Ticks of 100 ms: a 10 s run.
const TICKS: u64 = 100;

fn t(tick: u64) -> MonoNs {
    MonoNs(START + tick * 100 * MS)
}

/// Built from JSON so that header fields added later (all `serde(default)`)
/// do not break these tests.
fn header(cpus: u32) -> Header {
    serde_json::from_value(serde_json::json!({
        "format": "gpuprof-recording",
        "version": 1,
        "gpuprof_version": "test",
        "command": ["python3", "train.py"],
        "host": "h",
        "start": START,
        "anchor_realtime_ns": 0,
        "anchor_monotonic_ns": START,
        "interval_ns": 100 * MS,
        "cpus": cpus,
        "page_size": 4096,
        "clock_ticks_per_s": 100,
        "job_pid": 10,
    }))
    .expect("a valid header")
}

/// A thread that is in `state(tick)` and uses `busy(tick)` of a core.
struct Th {
    pid: i32,
    tid: i32,
    state: fn(u64) -> char,
    busy: fn(u64) -> f64,
}

/// A run: main process 10 with thread 10, optional worker processes
/// (named like PyTorch's), machine busy share per tick.
fn run(cpus: u32, threads: &[Th], workers: &[i32], sys_busy: fn(u64) -> f64) -> Vec<Event> {
    run_ticks(cpus, threads, workers, sys_busy, TICKS)
}

/// [`run`] over `ticks` intervals of 100 ms.
fn run_ticks(
    cpus: u32,
    threads: &[Th],
    workers: &[i32],
    sys_busy: fn(u64) -> f64,
    ticks: u64,
) -> Vec<Event> {
    let mut evs = vec![Event::WindowStart { t: t(0) }];
    evs.push(Event::Process {
        t: t(0),
        pid: Pid(10),
        ppid: Pid(1),
        start_boot_ns: 0,
        comm: "python3".into(),
        cmdline: vec!["python3".into(), "train.py".into()],
        exe: None,
        rank_env: None,
    });
    for w in workers {
        evs.push(Event::Process {
            t: t(0),
            pid: Pid(*w),
            ppid: Pid(10),
            start_boot_ns: 0,
            comm: "pt_data_worker".into(),
            cmdline: vec!["python3".into(), "train.py".into()],
            exe: None,
            rank_env: None,
        });
    }
    let mut cum = vec![0.0f64; threads.len()];
    let mut sys = CpuTimes::default();
    for tick in 0..=ticks {
        for (i, th) in threads.iter().enumerate() {
            if tick > 0 {
                cum[i] += (th.busy)(tick) * 100.0;
            }
            evs.push(Event::ThreadCpu {
                t: t(tick),
                pid: Pid(th.pid),
                tid: Tid(th.tid),
                user_ns: cum[i] as u64 * MS,
                sys_ns: 0,
                state: (th.state)(tick),
                cpu: 0,
            });
        }
        if tick > 0 {
            let all = 100 * MS * cpus as u64;
            let busy = (sys_busy(tick) * all as f64) as u64;
            sys.user += busy;
            sys.idle += all - busy;
        }
        evs.push(Event::SystemCpu {
            t: t(tick),
            total: sys,
            per_cpu: vec![],
            procs_running: 1,
            procs_blocked: 0,
        });
    }
    evs.push(Event::Footer(Footer {
        t: t(ticks),
        status: JobStatus::Exited(0),
        reason: "job exited".into(),
        dropped_events: 0,
        profiler_cpu_ns: 0,
        profiler_max_rss_bytes: 0,
        profiler_cpu_ns_by_component: Default::default(),
        end_anchor: None,
        recording_error: None,
    }));
    evs
}

fn analysis(cpus: u32, threads: &[Th], workers: &[i32], sys_busy: fn(u64) -> f64) -> Analysis {
    analyze_events(
        header(cpus),
        run(cpus, threads, workers, sys_busy).into_iter(),
    )
}

fn ids(d: &Diagnosis) -> Vec<&'static str> {
    d.findings.iter().map(|f| f.kind.id()).collect()
}

fn sleeping_main() -> Th {
    Th {
        pid: 10,
        tid: 10,
        state: |_| 'S',
        busy: |_| 0.02,
    }
}

fn saturated_worker(pid: i32) -> Th {
    Th {
        pid,
        tid: pid,
        state: |_| 'R',
        busy: |_| 1.0,
    }
}

/// Idle-share series of a GPU sampled over the whole run that was fully
/// idle in `gaps` and fully busy otherwise.
fn idle_series(gaps: &[(MonoNs, MonoNs)]) -> crate::analysis::Series {
    let mut s = crate::analysis::Series::default();
    let mut at = t(0);
    for &(a, b) in gaps {
        s.push(at, a, 0.0);
        s.push(a, b, 1.0);
        at = b;
    }
    s.push(at, t(TICKS), 0.0);
    s
}

/// GPU 0 used by the job, idle in every other 100 ms from 1 s to 9 s.
fn gpu_with_gaps() -> GpuEvidence {
    let gaps: Vec<(MonoNs, MonoNs)> = (10..90).step_by(2).map(|k| (t(k), t(k + 1))).collect();
    GpuEvidence {
        devices: vec![GpuDeviceEvidence {
            index: 0,
            name: "Fake GPU".into(),
            busy_fraction: Some(0.6),
            idle: idle_series(&gaps),
            idle_gaps: gaps,
            resolution_s: 1.0 / 6.0,
            sampled: Some((t(0), t(TICKS))),
            job_processes: 1,
            mem_total: Some(80 << 30),
            mem_used_max: Some(10 << 30),
            pcie_best: Some((5, 16)),
            pcie_max: Some((5, 16)),
            ..Default::default()
        }],
        driver_version: Some("550.54.15".into()),
        driver_cuda: Some((12, 4)),
        attribution_available: true,
    }
}

#[test]
fn saturated_worker_with_idle_cores_is_too_few_workers() {
    let a = analysis(4, &[sleeping_main(), saturated_worker(20)], &[20], |_| 0.27);
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::TooFewWorkers, "{:?}", ids(&d));
    assert!(top.fix.contains("from 1 to"), "{}", top.fix);
    let gt = top.gpu_time.as_ref().unwrap();
    assert_eq!(gt.basis, Basis::Estimated);
    assert!(gt.share > 0.8, "{gt:?}");
    assert_eq!(top.severity, Severity::Critical);
    assert!(!d.gpu_measured);
    assert!(d.notes[0].contains("not measured"));
}

/// Without a measured GPU, the note says whether anything shows the job
/// uses one: a GPU framework or CUDA library among its libraries.
#[test]
fn unmeasured_gpu_note_says_when_nothing_shows_gpu_use() {
    let libs = |a: &mut crate::analysis::Analysis, lib: &str| {
        a.env.event(&Event::Libraries {
            t: t(0),
            pid: Pid(10),
            added: vec!["/usr/lib/x86_64-linux-gnu/libc.so.6".into(), lib.into()],
        })
    };
    let base = || analysis(4, &[sleeping_main(), saturated_worker(20)], &[20], |_| 0.27);
    // No libraries recorded: nothing is known either way.
    let d = diagnose(&base(), None, None);
    assert!(!d.notes[0].contains("nothing shows"), "{:?}", d.notes);
    let mut a = base();
    libs(&mut a, "/usr/lib/x86_64-linux-gnu/libz.so.1");
    let d = diagnose(&a, None, None);
    assert!(d.notes[0].contains("not measured"), "{:?}", d.notes);
    assert!(d.notes[0].contains("nothing shows"), "{:?}", d.notes);
    for lib in [
        "/venv/lib/torch/lib/libtorch_cpu.so",
        "/usr/local/cuda/lib64/libcudart.so.12",
    ] {
        // A framework or a CUDA runtime without the driver's library:
        // nothing ran on a GPU.
        let mut a = base();
        libs(&mut a, lib);
        assert_eq!(gpu_use(&a), GpuUse::NoDriver, "{lib}");
        let d = diagnose(&a, None, None);
        assert!(d.notes[0].contains("not measured"), "{lib}: {:?}", d.notes);
        assert!(
            !d.notes[0].contains("nothing shows"),
            "{lib}: {:?}",
            d.notes
        );
        assert!(
            d.notes[0].contains("nothing ran on a GPU"),
            "{lib}: {:?}",
            d.notes
        );
        // With the driver's library, a GPU may have been used.
        libs(&mut a, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        assert_eq!(gpu_use(&a), GpuUse::Possible, "{lib}");
        let d = diagnose(&a, None, None);
        assert!(!d.notes[0].contains("nothing"), "{lib}: {:?}", d.notes);
    }
    // With a measured GPU the note is not given at all.
    let mut a = base();
    libs(&mut a, "/usr/lib/x86_64-linux-gnu/libz.so.1");
    let d = diagnose(&a, Some(&gpu_with_gaps()), None);
    assert!(
        d.notes.iter().all(|n| !n.contains("nothing shows")),
        "{:?}",
        d.notes
    );
}

#[test]
fn saturated_workers_on_a_busy_machine_are_input_bound() {
    let a = analysis(2, &[sleeping_main(), saturated_worker(20)], &[20], |_| 0.97);
    let d = diagnose(&a, None, None);
    assert_eq!(d.top().unwrap().kind, FindingKind::InputPipelineBound);
}

#[test]
fn measured_gap_time_is_attributed_to_the_cause_of_its_bins() {
    let a = analysis(4, &[sleeping_main(), saturated_worker(20)], &[20], |_| 0.27);
    let g = gpu_with_gaps();
    let d = diagnose(&a, Some(&g), None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::TooFewWorkers);
    let gt = top.gpu_time.as_ref().unwrap();
    assert_eq!(gt.basis, Basis::Measured);
    // 40 gaps of 100 ms, all while the worker was saturated.
    assert!((gt.seconds - 4.0).abs() < 0.05, "{gt:?}");
    assert!((gt.share - 0.4).abs() < 0.01, "{gt:?}");
    assert!(top.evidence.iter().any(|e| e.contains("GPU 0 idle 40%")));
    assert!(d.gpu_measured);
}

#[test]
fn unexplained_gaps_are_a_finding() {
    // Nothing saturated: the gaps have no cause, and the GPU idle 40% of
    // the run is not met with silence.
    let a = analysis(4, &[sleeping_main()], &[], |_| 0.05);
    let d = diagnose(&a, Some(&gpu_with_gaps()), None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::GpuIdleUnexplained, "{:?}", ids(&d));
    assert_eq!(top.severity, Severity::Critical);
    let gt = top.gpu_time.as_ref().unwrap();
    assert_eq!(gt.basis, Basis::Measured);
    assert!((gt.seconds - 4.0).abs() < 0.05, "{gt:?}");
    assert!(
        top.evidence
            .iter()
            .any(|e| e.contains("the findings account for 0.0 s")),
        "{:?}",
        top.evidence
    );
    assert!(top.fix.contains("flame-gpu-idle.svg"));
}

#[test]
fn main_thread_computing_without_workers() {
    let main = Th {
        pid: 10,
        tid: 10,
        state: |k| if k % 5 == 0 { 'S' } else { 'R' },
        busy: |k| if k % 5 == 0 { 0.0 } else { 1.0 },
    };
    let a = analysis(4, std::slice::from_ref(&main), &[], |_| 0.25);
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(
        top.kind,
        FindingKind::MainProcessPreprocessing,
        "{:?}",
        ids(&d)
    );
    assert!(top.fix.contains("num_workers=3"), "{}", top.fix);
    assert!(!top.fix.contains("Nothing ran on a GPU"), "{}", top.fix);
    // PyTorch loaded, the driver's CUDA library never: the main thread's
    // computing time includes the model, and the fix says so.
    let mut a = analysis(4, &[main], &[], |_| 0.25);
    a.env.event(&Event::Libraries {
        t: t(0),
        pid: Pid(10),
        added: vec!["/venv/lib/torch/lib/libtorch_cpu.so".into()],
    });
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::MainProcessPreprocessing);
    assert!(top.fix.contains("Nothing ran on a GPU"), "{}", top.fix);
    assert!(
        top.evidence.iter().any(|e| e.contains("libcuda.so")),
        "{:?}",
        top.evidence
    );
}

/// Without a measured GPU, what the CPU side cost the GPU counts from the
/// first step: before it, the job was starting (imports, model, data), and
/// a GPU would have had nothing to run.
#[test]
fn estimates_without_a_gpu_leave_out_the_start_up() {
    let main = || Th {
        pid: 10,
        tid: 10,
        state: |_| 'R',
        busy: |_| 1.0,
    };
    let a = analysis(4, &[main()], &[], |_| 0.25);
    let whole = diagnose(&a, None, None)
        .top()
        .unwrap()
        .gpu_time
        .clone()
        .unwrap();
    let mut a = analysis(4, &[main()], &[], |_| 0.25);
    // The loop's first step starts 4 s into the 10 s run.
    a.steps.intervals = (40..TICKS).step_by(5).map(|k| (t(k), t(k + 5))).collect();
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(
        top.kind,
        FindingKind::MainProcessPreprocessing,
        "{:?}",
        ids(&d)
    );
    let gt = top.gpu_time.as_ref().unwrap();
    assert_eq!(gt.basis, Basis::Estimated);
    assert!((whole.seconds - 10.0).abs() < 0.3, "{whole:?}");
    assert!((gt.seconds - 6.0).abs() < 0.3, "{gt:?}");
    assert!(
        gt.method
            .ends_with("; the 4.0 s before the first step (start-up) left out"),
        "{}",
        gt.method
    );
    // Attached to a running job, what came before its first step is not
    // start-up: the whole recording counts.
    a.header.attached = Some(crate::event::Attached {
        process_start: MonoNs(0),
        processes: 1,
        threads: 1,
    });
    let d = diagnose(&a, None, None);
    let gt = d.top().unwrap().gpu_time.clone().unwrap();
    assert!((gt.seconds - 10.0).abs() < 0.3, "{gt:?}");
    assert!(!gt.method.contains("start-up"), "{}", gt.method);
}

/// A main thread that sleeps between short steps is read R now and then,
/// at the instant it wakes: with the workers keeping up, those readings are
/// not a busy training loop (one in ten readings R, 2% of a core).
#[test]
fn occasional_r_readings_of_a_sleeping_main_thread_are_not_a_busy_loop() {
    let main = Th {
        pid: 10,
        tid: 10,
        state: |k| if k % 10 == 3 { 'R' } else { 'S' },
        busy: |_| 0.02,
    };
    let a = analysis(4, &[main, worker_idle()], &[20], |_| 0.1);
    let d = diagnose(&a, None, None);
    assert!(!ids(&d).contains(&"training-loop"), "{:?}", ids(&d));
    // The same readings with no core free: runnable is waiting for a CPU,
    // which the GPU waits for too.
    let a = analysis(2, &[main_r_every_other(), worker_idle()], &[20], |_| 0.98);
    let d = diagnose(&a, None, None);
    assert!(ids(&d).contains(&"training-loop"), "{:?}", ids(&d));
}

fn main_r_every_other() -> Th {
    Th {
        pid: 10,
        tid: 10,
        state: |k| if k % 2 == 0 { 'R' } else { 'S' },
        busy: |_| 0.05,
    }
}

fn worker_idle() -> Th {
    Th {
        pid: 20,
        tid: 20,
        state: |_| 'S',
        busy: |_| 0.05,
    }
}

/// A main thread using most of a core is busy even when its state
/// readings happen to catch it sleeping.
#[test]
fn a_main_thread_using_a_core_is_busy_whatever_its_readings() {
    let main = Th {
        pid: 10,
        tid: 10,
        state: |_| 'S',
        busy: |_| 0.8,
    };
    let a = analysis(4, &[main], &[], |_| 0.25);
    let d = diagnose(&a, None, None);
    assert_eq!(
        d.top().map(|f| f.kind),
        Some(FindingKind::MainProcessPreprocessing),
        "{:?}",
        ids(&d)
    );
}

#[test]
fn workers_blocked_on_io() {
    let w = |pid| Th {
        pid,
        tid: pid,
        state: |_| 'D',
        busy: |_| 0.05,
    };
    let a = analysis(4, &[sleeping_main(), w(20), w(21)], &[20, 21], |_| 0.05);
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::IoBound, "{:?}", ids(&d));
    assert_eq!(top.severity, Severity::Critical);
    assert!(top.evidence[0].contains("D state"));
}

#[test]
fn more_runnable_threads_than_cores_is_oversubscription() {
    let ths: Vec<Th> = (0..8)
        .map(|i| Th {
            pid: 20 + i,
            tid: 20 + i,
            state: |_| 'R',
            busy: |_| 0.25,
        })
        .chain([sleeping_main()])
        .collect();
    let workers: Vec<i32> = (20..28).collect();
    let a = analysis(2, &ths, &workers, |_| 1.0);
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::CpuOversubscribed, "{:?}", ids(&d));
    // One busy thread per process: too many workers, not thread pools.
    assert!(
        top.fix.contains("`num_workers` from 8 to at most 1"),
        "{}",
        top.fix
    );
}

#[test]
fn thread_pools_in_workers_are_oversubscription_by_threads() {
    // Two workers, each with four threads always runnable, on 2 cores.
    let mut ths: Vec<Th> = Vec::new();
    for pid in [20, 21] {
        for k in 0..4 {
            ths.push(Th {
                pid,
                tid: pid * 100 + k,
                state: |_| 'R',
                busy: |_| 0.25,
            });
        }
    }
    ths.push(sleeping_main());
    let a = analysis(2, &ths, &[20, 21], |_| 1.0);
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::CpuOversubscribed, "{:?}", ids(&d));
    assert!(top.fix.contains("OMP_NUM_THREADS=1"), "{}", top.fix);
    assert!(
        top.evidence
            .iter()
            .any(|e| e.contains("2 processes had runnable threads then, 4.0 each")),
        "{:?}",
        top.evidence
    );
}

#[test]
fn idle_job_has_no_alarm() {
    let a = analysis(4, &[sleeping_main()], &[], |_| 0.05);
    let d = diagnose(&a, None, None);
    assert_eq!(ids(&d), vec!["low-sample-coverage"]);
    assert_eq!(d.findings[0].severity, Severity::Info);
}

#[test]
fn gpu_hardware_findings() {
    let a = analysis(4, &[sleeping_main()], &[], |_| 0.05);
    let mut g = gpu_with_gaps();
    {
        let d0 = &mut g.devices[0];
        d0.thermal = ThrottleEvidence {
            active_s: 5.0,
            active_busy_s: 4.0,
            clock_ratio: Some(0.75),
            reasons: vec![("hw_thermal_slowdown".into(), 5.0)],
        };
        d0.mem_used_max = Some((80 << 30) - (1 << 30));
        d0.pcie_best = Some((3, 16));
    }
    let d = diagnose(&a, Some(&g), None);
    let thermal = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::ThermalThrottling)
        .expect("thermal finding");
    let gt = thermal.gpu_time.as_ref().unwrap();
    assert!((gt.seconds - 1.0).abs() < 1e-9, "4 s busy × 25% clock lost");
    assert!(thermal.evidence[0].contains("hw_thermal_slowdown 5.0 s"));
    assert_eq!(thermal.severity, Severity::Warning);
    let kinds = ids(&d);
    assert!(kinds.contains(&"gpu-memory-pressure"), "{kinds:?}");
    assert!(kinds.contains(&"pcie-degraded"), "{kinds:?}");
    assert!(!kinds.contains(&"gpu-not-used"));
    // The 4 s of idle gaps have no cause (thermal throttling slows busy
    // time): they rank first, then the hardware findings by GPU time.
    assert_eq!(kinds[0], "gpu-idle-unexplained", "{kinds:?}");
    assert_eq!(kinds[1], "thermal-throttling", "{kinds:?}");
}

fn with_libs(mut a: Analysis, libs: &[&str]) -> Analysis {
    a.env.event(&Event::Libraries {
        t: t(1),
        pid: Pid(10),
        added: libs.iter().map(|s| s.to_string()).collect(),
    });
    a
}

#[test]
fn job_never_on_the_gpu_with_a_cpu_only_framework() {
    let a = with_libs(
        analysis(4, &[sleeping_main()], &[], |_| 0.05),
        &["/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"],
    );
    let mut g = gpu_with_gaps();
    g.devices[0].job_processes = 0;
    let d = diagnose(&a, Some(&g), None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::GpuNotUsed, "{:?}", ids(&d));
    assert_eq!(top.severity, Severity::Critical);
    assert!(top.evidence.iter().any(|e| e.contains("CPU-only build")));
    assert!(top.fix.contains("CUDA build"));
}

#[test]
fn cuda_runtime_newer_than_the_driver() {
    // Same major, newer minor, job on the GPU: a warning.
    let a = with_libs(
        analysis(4, &[sleeping_main()], &[], |_| 0.05),
        &["/usr/local/cuda-12.6/lib64/libcudart.so.12.6.77"],
    );
    let d = diagnose(&a, Some(&gpu_with_gaps()), None);
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::CudaDriverMismatch)
        .expect("mismatch");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.evidence[0].contains("CUDA runtime 12.6"),
        "{}",
        f.evidence[0]
    );

    // Newer major, never on the GPU: critical, and ranked before the
    // gpu-not-used symptom.
    let a = with_libs(
        analysis(4, &[sleeping_main()], &[], |_| 0.05),
        &["/x/libcudart.so.13.0.1", "/x/libtorch_cuda.so"],
    );
    let mut g = gpu_with_gaps();
    g.devices[0].job_processes = 0;
    let d = diagnose(&a, Some(&g), None);
    assert_eq!(
        &ids(&d)[..2],
        &["cuda-driver-mismatch", "gpu-not-used"],
        "{:?}",
        ids(&d)
    );
    assert_eq!(d.findings[0].severity, Severity::Critical);

    // An older runtime is fine.
    let a = with_libs(
        analysis(4, &[sleeping_main()], &[], |_| 0.05),
        &["/x/libcudart.so.11.8.89"],
    );
    let d = diagnose(&a, Some(&gpu_with_gaps()), None);
    assert!(!ids(&d).contains(&"cuda-driver-mismatch"));
}

#[test]
fn no_gpu_attribution_is_not_gpu_not_used() {
    let mut g = gpu_with_gaps();
    g.devices[0].job_processes = 0;
    g.attribution_available = false;
    // Maps not recorded, or a CUDA library mapped: cannot tell.
    let a = analysis(4, &[sleeping_main()], &[], |_| 0.05);
    let d = diagnose(&a, Some(&g), None);
    assert!(!ids(&d).contains(&"gpu-not-used"), "{:?}", ids(&d));
    let a = with_libs(a, &["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"]);
    let d = diagnose(&a, Some(&g), None);
    assert!(!ids(&d).contains(&"gpu-not-used"), "{:?}", ids(&d));
    // Maps read and no CUDA library anywhere: it did not use a GPU.
    let a = with_libs(
        analysis(4, &[sleeping_main()], &[], |_| 0.05),
        &["/usr/lib/libpython3.11.so.1.0"],
    );
    let d = diagnose(&a, Some(&g), None);
    assert_eq!(
        d.top().unwrap().kind,
        FindingKind::GpuNotUsed,
        "{:?}",
        ids(&d)
    );
}

/// Stack samples of workers 20 (same-instant, by the agent) and 21 (its
/// Python frames by py-spy only), 10 ms apart: worker 20 imports torch in
/// the first second, then runs `augment` (and three samples of `dumps`);
/// worker 21 runs `decode`, which py-spy sees at half the rate.
fn worker_stacks() -> Vec<Event> {
    use crate::event::{SampleBatch, SampleSource, StackKind};
    let node = |kind, id, parent, frame| Event::StackNode {
        kind,
        id,
        parent,
        frame,
    };
    // One run of Python frames per interpreter loop frame: the outermost
    // is its entry.
    let inline = |id, name: &str, file: &str| Event::InlinePyFrame {
        id,
        name: name.into(),
        file: file.into(),
        entry: id <= 2,
        line: None,
    };
    let batch = |kind, pid, source, ks: Vec<u64>, stack: fn(u64) -> u32| {
        let mut dt = vec![0u32];
        dt.extend(ks.windows(2).map(|w| ((w[1] - w[0]) * 10_000) as u32));
        Event::Samples(SampleBatch {
            kind,
            pid: Pid(pid),
            tid: Tid(pid),
            t0: MonoNs(START + ks[0] * 10 * MS),
            dt_us: dt,
            stacks: ks.iter().map(|&k| stack(k)).collect(),
            incomplete: vec![],
            source,
        })
    };
    let mut evs = vec![
        Event::StackFile {
            id: 0,
            path: "/usr/bin/python3".into(),
        },
        Event::NativeFrame {
            id: 0,
            file: 0,
            offset: 0x10,
        },
        Event::Symbols {
            names: vec![(0, "_PyEval_EvalFrameDefault".into())],
            unnamed: vec![],
        },
        inline(1, "<module>", "/venv/site-packages/torch/__init__.py"),
        inline(
            2,
            "_worker_loop",
            "/venv/site-packages/torch/utils/data/_utils/worker.py",
        ),
        inline(3, "augment", "/job/train.py"),
        inline(
            4,
            "dumps",
            "/usr/lib/python3.12/multiprocessing/reduction.py",
        ),
        node(StackKind::Native, 0, None, 0),
        node(StackKind::Native, 1, Some(0), 1),
        node(StackKind::Native, 2, Some(0), 2),
        node(StackKind::Native, 3, Some(2), 3),
        node(StackKind::Native, 4, Some(2), 4),
        Event::PyFrame {
            id: 0,
            name: "_worker_loop".into(),
            file: "/venv/site-packages/torch/utils/data/_utils/worker.py".into(),
            entry: true,
        },
        Event::PyFrame {
            id: 1,
            name: "decode".into(),
            file: "/job/train.py".into(),
            entry: false,
        },
        node(StackKind::Python, 0, None, 0),
        node(StackKind::Python, 1, Some(0), 1),
    ];
    for (pid, same_instant) in [(20, true), (21, false)] {
        evs.push(Event::PyProcess {
            t: t(0),
            pid: Pid(pid),
            version: "3.12.1".into(),
            same_instant,
            timer: false,
            detail: String::new(),
        });
    }
    evs.push(batch(
        StackKind::Native,
        20,
        SampleSource::Agent,
        (0..1000).collect(),
        |k| match k {
            0..=99 => 1,
            500..=502 => 4,
            _ => 3,
        },
    ));
    evs.push(batch(
        StackKind::Native,
        21,
        SampleSource::Perf,
        (100..1000).collect(),
        |_| 0,
    ));
    evs.push(batch(
        StackKind::Python,
        21,
        SampleSource::Perf,
        (100..1000).step_by(2).collect(),
        |_| 1,
    ));
    evs
}

#[test]
fn stacks_name_what_the_workers_ran_while_saturated() {
    let starting = |pid| Th {
        pid,
        tid: pid,
        state: |k| if k < 10 { 'S' } else { 'R' },
        busy: |k| if k < 10 { 0.0 } else { 1.0 },
    };
    let mut evs = run(
        2,
        &[sleeping_main(), starting(20), starting(21)],
        &[20, 21],
        |k| {
            if k < 10 {
                0.1
            } else {
                0.97
            }
        },
    );
    let footer = evs.pop().unwrap();
    evs.extend(worker_stacks());
    evs.push(footer);
    let a = analyze_events(header(2), evs.into_iter());
    let stacks = evidence::stacks_from_analysis(&a);
    assert!(stacks.is_some());
    let d = diagnose(&a, None, stacks.as_ref());
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::InputPipelineBound, "{:?}", ids(&d));
    // The import before the workers were saturated is not among what they
    // ran then; worker 21 counts by its CPU (900 samples), not by py-spy's
    // stacks (450: that would make it 33%); and `dumps` (3 samples of
    // 1,800) is left out.
    let line = top
        .evidence
        .iter()
        .find(|e| e.starts_with("Stack samples of the workers while they were saturated: "))
        .unwrap_or_else(|| panic!("{:?}", top.evidence));
    assert!(
        line.ends_with(
            ": `decode (train.py) ← _worker_loop` 50%, `augment (train.py) ← _worker_loop` 50%."
        ),
        "{line}"
    );
    assert!(d.stacks_measured);
}

/// A short recording is said to be short, at info: each finding's own
/// severity allows for the intervals behind it (issue 40).
#[test]
fn short_runs_are_said_to_be_imprecise() {
    let mut h = header(4);
    h.interval_ns = 1_000 * MS; // 10 intervals in 10 s
    let a = analyze_events(h, run(4, &[sleeping_main()], &[], |_| 0.05).into_iter());
    let d = diagnose(&a, None, None);
    let f = d.findings.last().unwrap();
    assert_eq!(f.kind, FindingKind::LowSampleCoverage);
    assert_eq!(f.severity, Severity::Info);
    assert!(f.title.contains("short"), "{}", f.title);
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("10 sampling intervals")),
        "{:?}",
        f.evidence
    );
    assert!(f.fix.contains("record at least 20 s"), "{}", f.fix);
}

/// A main thread computing in every third interval, no workers: the same
/// share of the run (a third) from 9 intervals and from 100.
fn main_busy_every_third(ticks: u64) -> Analysis {
    let main = Th {
        pid: 10,
        tid: 10,
        state: |k| if k % 3 == 0 { 'R' } else { 'S' },
        busy: |k| if k % 3 == 0 { 1.0 } else { 0.02 },
    };
    analyze_events(
        header(4),
        run_ticks(4, &[main], &[], |_| 0.25, ticks).into_iter(),
    )
}

/// Issue 40: few observations make a possible finding at info, which says
/// how long to record; many make the same share a warning.
#[test]
fn severity_follows_the_evidence_behind_the_share() {
    // 9 intervals, the cause in 3 of them: a third of the run, but three
    // readings are what chance gives.
    let d = diagnose(&main_busy_every_third(9), None, None);
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::MainProcessPreprocessing)
        .unwrap_or_else(|| panic!("{:?}", ids(&d)));
    assert_eq!(f.severity, Severity::Info, "{f:?}");
    assert!(!f.established());
    assert!(f.title.starts_with("Possibly batches"), "{}", f.title);
    let s = f.support.as_ref().unwrap();
    assert_eq!(s.severity_by_size, Severity::Critical, "{s:?}");
    assert_eq!((s.cause_intervals, s.intervals), (3, 9), "{s:?}");
    // Its interval alone would allow a warning; three intervals do not.
    assert!(s.share_low > 0.1 && s.share_high > 0.6, "{s:?}");
    let know = s.record_s_to_know.unwrap();
    assert!(know > 0.9 && know < 60.0, "{s:?}");
    let line = f.evidence.last().unwrap();
    assert!(
        line.starts_with("Possible, not established: its cause in 3 of 9 sampling intervals")
            && line.contains("Record at least"),
        "{line}"
    );
    // Possible findings rank after the established ones and are no answer.
    assert_eq!(
        d.findings.last().map(|f| f.kind),
        Some(FindingKind::MainProcessPreprocessing),
        "{:?}",
        ids(&d)
    );
    assert_ne!(d.top().map(|f| f.kind), Some(f.kind));

    // 100 intervals, the cause in 34: established, a warning — its share
    // (a third) would be critical, but its interval reaches below 30%.
    let d = diagnose(&main_busy_every_third(100), None, None);
    let f = d.top().unwrap();
    assert_eq!(
        f.kind,
        FindingKind::MainProcessPreprocessing,
        "{:?}",
        ids(&d)
    );
    assert_eq!(f.severity, Severity::Warning, "{f:?}");
    assert!(f.established());
    assert!(f.title.starts_with("Batches"), "{}", f.title);
    let s = f.support.as_ref().unwrap();
    assert_eq!(s.severity_by_size, Severity::Critical);
    assert!(s.share_low >= 0.1 && s.share_low < 0.3, "{s:?}");
    assert_eq!(s.record_s_to_know, None);
    assert!(
        f.evidence
            .last()
            .unwrap()
            .contains("a warning, not critical"),
        "{:?}",
        f.evidence
    );
}

/// Issue 40: workers read R at the instant they wake for a batch, using a
/// few percent of a core, are not saturated while cores sit idle; the same
/// readings with no core free are the wait for a core.
#[test]
fn running_readings_without_cpu_are_not_saturated_workers() {
    let waking = |pid| Th {
        pid,
        tid: pid,
        state: |k| if k % 5 == 0 { 'R' } else { 'S' },
        busy: |_| 0.04,
    };
    let a = analysis(
        4,
        &[sleeping_main(), waking(20), waking(21)],
        &[20, 21],
        |_| 0.1,
    );
    let d = diagnose(&a, None, None);
    for id in ["too-few-workers", "input-pipeline-bound"] {
        assert!(!ids(&d).contains(&id), "{:?}", ids(&d));
    }
    let a = analysis(
        2,
        &[sleeping_main(), waking(20), waking(21)],
        &[20, 21],
        |_| 0.98,
    );
    let d = diagnose(&a, None, None);
    assert!(ids(&d).contains(&"input-pipeline-bound"), "{:?}", ids(&d));
}

/// Saturated workers' evidence gives their figures while saturated, not
/// the whole run's beside the word "saturated".
#[test]
fn saturated_workers_evidence_is_of_the_saturated_time() {
    let half = Th {
        pid: 20,
        tid: 20,
        state: |k| if k < 50 { 'R' } else { 'S' },
        busy: |k| if k < 50 { 1.0 } else { 0.0 },
    };
    let a = analysis(4, &[sleeping_main(), half], &[20], |_| 0.27);
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::TooFewWorkers, "{:?}", ids(&d));
    assert!(
        top.evidence[0].contains(
            "in that time running or waiting for a CPU 100% of it and using 100% of a core each (over the whole run: 50% and "
        ),
        "{}",
        top.evidence[0]
    );
}

#[test]
fn blocked_on_writes_is_said_to_be_writes() {
    let main = Th {
        pid: 10,
        tid: 10,
        state: |_| 'D',
        busy: |_| 0.02,
    };
    let mut evs = run(4, &[main], &[], |_| 0.05);
    let footer = evs.pop().unwrap();
    for tick in 0..=TICKS {
        evs.push(Event::ProcessSample {
            t: t(tick),
            pid: Pid(10),
            user_ns: 0,
            sys_ns: 0,
            rss_bytes: 1 << 20,
            read_bytes: 0,
            write_bytes: tick * 1_000_000,
            rchar: 0,
            wchar: tick * 1_000_000,
            threads: 1,
        });
    }
    evs.sort_by_key(|e| e.time());
    evs.push(footer);
    let a = analyze_events(header(4), evs.into_iter());
    let d = diagnose(&a, None, None);
    let top = d.top().unwrap();
    // Its own finding: the fix is about writing, not about the dataset.
    assert_eq!(top.kind, FindingKind::WriteStall, "{:?}", ids(&d));
    assert!(!ids(&d).contains(&"io-bound"), "{:?}", ids(&d));
    assert!(top.title.contains("writes"), "{}", top.title);
    assert!(top.fix.contains("background thread"), "{}", top.fix);
}

#[test]
fn start_up_and_shutdown_idle_is_not_attributed() {
    let a = analysis(4, &[sleeping_main(), saturated_worker(20)], &[20], |_| 0.27);
    let mut g = gpu_with_gaps();
    // Idle for the first second and the last half second as well.
    let d0 = &mut g.devices[0];
    d0.idle_gaps.insert(0, (t(0), t(10)));
    d0.idle_gaps.push((t(95), t(TICKS)));
    d0.idle = idle_series(&d0.idle_gaps);
    let d = diagnose(&a, Some(&g), None);
    let gt = d.top().unwrap().gpu_time.as_ref().unwrap();
    assert!((gt.seconds - 4.0).abs() < 0.05, "{gt:?}");
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("idle 1.0 s before its first work") && n.contains("0.5 s after")),
        "{:?}",
        d.notes
    );
}

#[test]
fn partly_busy_samples_count_their_idle_share() {
    // At the real driver period a job whose steps are shorter than a
    // sample never leaves a sample fully idle: 30% busy in every sample,
    // no gap at all, yet 70% of the run lost to the saturated worker.
    let a = analysis(4, &[sleeping_main(), saturated_worker(20)], &[20], |_| 0.27);
    let mut g = gpu_with_gaps();
    let d0 = &mut g.devices[0];
    d0.idle_gaps.clear();
    d0.busy_fraction = Some(0.3);
    d0.idle = crate::analysis::Series::default();
    d0.idle.push(t(0), t(TICKS), 0.7);
    let d = diagnose(&a, Some(&g), None);
    let top = d.top().unwrap();
    assert_eq!(top.kind, FindingKind::TooFewWorkers, "{:?}", ids(&d));
    let gt = top.gpu_time.as_ref().unwrap();
    assert_eq!(gt.basis, Basis::Measured);
    assert!((gt.seconds - 7.0).abs() < 0.05, "{gt:?}");
    assert_eq!(top.severity, Severity::Critical);
    assert!(gt.method.contains("utilization deficit"), "{}", gt.method);
}

/// Idle cores that average above the threshold but swing from interval
/// to interval do not make too-few-workers: the lower end of their mean's
/// interval must clear it, so a machine near it does not flip the finding
/// run to run. Steady idle cores do.
#[test]
fn too_few_workers_needs_idle_cores_it_can_count_on() {
    // Saturated for six intervals (1.0–1.6 s).
    let burst = || Th {
        pid: 20,
        tid: 20,
        state: |k| if (10..16).contains(&k) { 'R' } else { 'S' },
        busy: |k| if (10..16).contains(&k) { 1.0 } else { 0.02 },
    };
    let a = analysis(4, &[sleeping_main(), burst()], &[20], |k| {
        if k % 2 == 0 {
            0.05
        } else {
            0.99
        }
    });
    let d = diagnose(&a, None, None);
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::InputPipelineBound)
        .unwrap_or_else(|| panic!("{:?}", ids(&d)));
    assert!(!ids(&d).contains(&"too-few-workers"), "{:?}", ids(&d));
    assert!(!f.title.contains("no core is idle"), "{}", f.title);
    assert!(
        f.evidence.iter().any(|e| e.contains("too unevenly")),
        "{:?}",
        f.evidence
    );
    let a = analysis(4, &[sleeping_main(), burst()], &[20], |_| 0.3);
    let d = diagnose(&a, None, None);
    assert!(ids(&d).contains(&"too-few-workers"), "{:?}", ids(&d));
}

/// The training-loop fix names the main thread's own work: a busier thread
/// of the same process (a collective library's network loop) is in the
/// process's line of the evidence, not in the fix.
#[test]
fn the_loop_fix_names_the_main_threads_work() {
    use crate::event::{SampleBatch, SampleSource, StackKind};
    let main = Th {
        pid: 10,
        tid: 10,
        state: |_| 'R',
        busy: |_| 1.0,
    };
    let mut evs = run(4, &[main], &[], |_| 0.5);
    let footer = evs.pop().unwrap();
    let node = |kind, id, parent, frame| Event::StackNode {
        kind,
        id,
        parent,
        frame,
    };
    let batch = |tid, source, every: usize, stack| {
        let ks: Vec<u64> = (0..1000).step_by(every).collect();
        let mut dt = vec![0u32];
        dt.extend(ks.windows(2).map(|w| ((w[1] - w[0]) * 10_000) as u32));
        Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(tid),
            t0: MonoNs(START + ks[0] * 10 * MS),
            stacks: vec![stack; ks.len()],
            dt_us: dt,
            incomplete: vec![],
            source,
        })
    };
    evs.extend([
        Event::Libraries {
            t: t(0),
            pid: Pid(10),
            added: vec!["/venv/lib/torch/lib/libtorch_cpu.so".into()],
        },
        Event::PyProcess {
            t: t(0),
            pid: Pid(10),
            version: "3.12.1".into(),
            same_instant: true,
            timer: false,
            detail: String::new(),
        },
        Event::StackFile {
            id: 0,
            path: "/usr/bin/python3".into(),
        },
        Event::StackFile {
            id: 1,
            path: "/venv/lib/torch/lib/libtorch_cpu.so".into(),
        },
        Event::NativeFrame {
            id: 0,
            file: 0,
            offset: 0x10,
        },
        Event::NativeFrame {
            id: 3,
            file: 1,
            offset: 0x20,
        },
        Event::NativeFrame {
            id: 4,
            file: 1,
            offset: 0x30,
        },
        Event::Symbols {
            names: vec![
                (0, "_PyEval_EvalFrameDefault".into()),
                (3, "gloo::transport::tcp::Loop::run()".into()),
                (4, "epoll_wait".into()),
            ],
            unnamed: vec![],
        },
        Event::InlinePyFrame {
            id: 1,
            name: "<module>".into(),
            file: "/job/train.py".into(),
            entry: true,
            line: None,
        },
        Event::InlinePyFrame {
            id: 2,
            name: "Net.forward".into(),
            file: "/job/model.py".into(),
            entry: false,
            line: None,
        },
        node(StackKind::Native, 0, None, 0),
        node(StackKind::Native, 1, Some(0), 1),
        node(StackKind::Native, 2, Some(1), 2),
        node(StackKind::Native, 3, None, 3),
        node(StackKind::Native, 4, Some(3), 4),
        // The main thread in its model half the time, the network loop's
        // thread on a CPU all the time.
        batch(10, SampleSource::Agent, 2, 2),
        batch(11, SampleSource::Perf, 1, 4),
    ]);
    evs.push(footer);
    let a = analyze_events(header(4), evs.into_iter());
    let stacks = evidence::stacks_from_analysis(&a);
    let d = diagnose(&a, None, stacks.as_ref());
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::TrainingLoop)
        .unwrap_or_else(|| panic!("{:?}", ids(&d)));
    assert!(
        f.fix
            .contains("(the main thread's time went to `Net.forward (model.py)"),
        "{}",
        f.fix
    );
    assert!(!f.fix.contains("epoll_wait"), "{}", f.fix);
    // The process's line still says where all its threads' time went.
    assert!(
        f.evidence
            .iter()
            .any(|e| e.starts_with("What the main process ran then") && e.contains("epoll_wait")),
        "{:?}",
        f.evidence
    );
}
