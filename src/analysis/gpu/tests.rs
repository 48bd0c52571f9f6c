use super::*;
use crate::event::GpuProcSample;

fn w(start_ms: u64, pct: u32) -> UtilWindow {
    let pct = pct as f64;
    UtilWindow {
        start: MonoNs(start_ms * 1_000_000),
        end: MonoNs((start_ms + 10) * 1_000_000),
        pct,
    }
}

const P: u64 = 10_000_000;

#[test]
fn gap_edges_use_the_neighbours_utilization() {
    // Busy 0..10, then 30% busy (3 ms of kernel then idle), idle x2,
    // then 40% busy (idle 6 ms then kernel), busy.
    let ws = [
        w(0, 100),
        w(10, 30),
        w(20, 0),
        w(30, 0),
        w(40, 40),
        w(50, 100),
    ];
    let g = idle_gaps(&ws, P, 5.0);
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].0, MonoNs(13_000_000));
    assert_eq!(g[0].1, MonoNs(46_000_000));
}

#[test]
fn merged_idle_weights_equal_the_per_gpu_mean_everywhere() {
    let ms = |x: u64| MonoNs(x * 1_000_000);
    let series = |pts: &[(u64, u64, f64)]| {
        let mut s = crate::analysis::series::Series::default();
        for &(a, b, v) in pts {
            s.push(ms(a), ms(b), v);
        }
        s
    };
    // Unaligned samples, a hole in one GPU, and one GPU sampled later.
    let mut a = GpuAnalysis::default();
    for pts in [
        vec![(0, 17, 1.0), (17, 34, 0.25), (40, 57, 0.5)],
        vec![(5, 12, 0.0), (12, 29, 0.75), (29, 46, 1.0)],
        vec![(30, 31, 0.1)],
    ] {
        a.devices.push(GpuDeviceAnalysis {
            idle: series(&pts),
            ..Default::default()
        });
    }
    let merged = a.idle_weights();
    for t in 0..70_000u64 {
        let t = MonoNs(t * 1_000);
        assert_eq!(merged.at(t), a.idle_weight_at(t), "at {t:?}");
    }
}

#[test]
fn runs_without_a_fully_idle_sample_are_not_claimed() {
    let ws = [w(0, 100), w(10, 50), w(20, 50), w(30, 100)];
    assert!(idle_gaps(&ws, P, 5.0).is_empty());
    // The threshold counts "nearly idle" samples as idle.
    let ws = [w(0, 100), w(10, 5), w(20, 100)];
    assert_eq!(idle_gaps(&ws, P, 5.0).len(), 1);
    assert!(idle_gaps(&ws, P, 4.0).is_empty());
}

#[test]
fn a_partly_busy_sample_between_two_gaps_is_shared_once() {
    // Idle, 20% busy, idle: the first gap takes the busy sample's idle
    // share, the second starts where the first ended, never inside it.
    let ws = [w(0, 100), w(10, 0), w(20, 20), w(30, 0), w(40, 100)];
    let g = idle_gaps(&ws, P, 5.0);
    assert_eq!(
        g,
        [
            (MonoNs(10_000_000), MonoNs(28_000_000)),
            (MonoNs(28_000_000), MonoNs(40_000_000))
        ]
    );
    // A long partly busy window (a late poll) too.
    let long = UtilWindow {
        start: MonoNs(20_000_000),
        end: MonoNs(45_000_000),
        pct: 20.0,
    };
    let ws = [w(0, 100), w(10, 0), long, w(45, 0), w(55, 100)];
    let g = idle_gaps(&ws, P, 5.0);
    assert_eq!(g.len(), 2);
    assert!(g[0].1 <= g[1].0, "{g:?}");
}

#[test]
fn a_missing_sample_splits_a_gap() {
    let ws = [w(0, 0), w(10, 0), w(40, 0)];
    let g = idle_gaps(&ws, P, 5.0);
    assert_eq!(g.len(), 2);
    assert_eq!(g[0], (MonoNs(0), MonoNs(20_000_000)));
}

/// Windows of the real period (1/6 s) with the given utilizations,
/// from 0, through the accumulator, into a device analysis.
fn device_at_real_period(pcts: &[u32]) -> GpuDeviceAnalysis {
    let p = DEFAULT_PERIOD_NS;
    let mut u = UtilAcc::new(p, DEFAULT_IDLE_THRESHOLD_PCT);
    for (i, &pct) in pcts.iter().enumerate() {
        u.push(UtilWindow {
            start: MonoNs(i as u64 * p),
            end: MonoNs((i as u64 + 1) * p),
            pct: pct as f64,
        });
    }
    let (gaps, stats) = u.gaps.finish();
    GpuDeviceAnalysis {
        resolution_ns: p,
        sampled: u.first.zip(u.last),
        idle: u.idle,
        idle_s: u.idle_ns / 1e9,
        idle_gaps: gaps,
        gap_stats: stats,
        ..Default::default()
    }
}

#[test]
fn idle_time_is_the_utilization_deficit() {
    // Steps shorter than a sample: never a fully idle sample, yet the
    // GPU was idle 70% of 2 s.
    let d = device_at_real_period(&[30; 12]);
    assert!(d.idle_gaps.is_empty());
    assert!((d.idle_s - 1.4).abs() < 1e-6, "{}", d.idle_s);
    let end = MonoNs(12 * DEFAULT_PERIOD_NS);
    let s = d.idle_split(MonoNs(0), end);
    assert!((s.steady_s - 1.4).abs() < 1e-6, "{s:?}");
    assert_eq!((s.startup_s, s.shutdown_s), (0.0, 0.0));
    // Half a sample: half of its idle share.
    let half = d.idle_between(MonoNs(0), MonoNs(DEFAULT_PERIOD_NS / 2));
    assert!((half - 0.7 / 12.0).abs() < 1e-6, "{half}");
}

#[test]
fn start_up_and_shutdown_are_the_edge_gaps() {
    // Idle 3 samples, then 40% busy, then idle 2 samples.
    let mut pcts = vec![0, 0, 0];
    pcts.extend([40; 6]);
    pcts.extend([0, 0]);
    let d = device_at_real_period(&pcts);
    let end = MonoNs(pcts.len() as u64 * DEFAULT_PERIOD_NS);
    let ph = d.phases(MonoNs(0), end);
    let (a, b) = ph.startup.unwrap();
    assert_eq!(a, MonoNs(0));
    // The gap reaches into the first busy sample by its idle share.
    assert_eq!(
        b.0,
        3 * DEFAULT_PERIOD_NS + (DEFAULT_PERIOD_NS as f64 * 0.6) as u64
    );
    assert!(ph.shutdown.is_some() && ph.steady.is_some());
    let s = d.idle_split(MonoNs(0), end);
    assert!((s.total_s - d.idle_s).abs() < 1e-6, "{s:?} vs {}", d.idle_s);
    assert!(s.startup_s > 0.5 && s.shutdown_s > 0.3, "{s:?}");
    // A GPU that never worked is all start-up.
    let d = device_at_real_period(&[0; 6]);
    let ph = d.phases(MonoNs(0), MonoNs(6 * DEFAULT_PERIOD_NS));
    assert!(ph.startup.is_some() && ph.steady.is_none());
}

fn proc_use(pid: i32, in_job: bool) -> GpuProcUse {
    GpuProcUse {
        pid: Pid(pid),
        in_job,
        ctx: GpuContext::Compute,
        first_seen: MonoNs(0),
        last_seen: MonoNs(0),
        mem_max: None,
        mem: Series::default(),
        sm: Series::default(),
        sm_mean: None,
        sm_s: 0.0,
        gi: None,
        ci: None,
        present: false,
        last_mem: None,
        last_sm: None,
        sm_sum: 0.0,
        sm_ns: 0.0,
    }
}

#[test]
fn idle_intervals_are_the_union_over_the_jobs_gpus() {
    let ms = |a: u64, b: u64| (MonoNs(a * 1_000_000), MonoNs(b * 1_000_000));
    let dev = |gaps: Vec<(MonoNs, MonoNs)>, procs: Vec<GpuProcUse>| GpuDeviceAnalysis {
        idle_gaps: gaps,
        processes: procs,
        ..Default::default()
    };
    let mut a = GpuAnalysis {
        devices: vec![
            dev(vec![ms(0, 10), ms(50, 60)], vec![proc_use(1, true)]),
            dev(vec![ms(5, 20)], vec![proc_use(2, true)]),
            // Not the job's: ignored.
            dev(vec![ms(100, 200)], vec![proc_use(3, false)]),
        ],
        ..Default::default()
    };
    assert_eq!(a.idle_intervals(), vec![ms(0, 20), ms(50, 60)]);
    // No job process on any GPU: every GPU counts.
    for d in &mut a.devices {
        d.processes.clear();
    }
    assert_eq!(a.idle_intervals().len(), 3);
}

#[test]
fn throttle_bits_have_names() {
    assert_eq!(
        throttle_names(0x44),
        vec!["sw_power_cap", "hw_thermal_slowdown"]
    );
    assert_eq!(throttle_names(0x1000), vec!["0x1000"]);
    // nvml.h: HW slowdown, SW and HW thermal slowdown; SW power cap,
    // HW power brake.
    assert_eq!(
        throttle_mask(&["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"]),
        0x8 | 0x20 | 0x40
    );
    assert_eq!(
        throttle_mask(&["sw_power_cap", "hw_power_brake_slowdown"]),
        0x4 | 0x80
    );
}

fn header() -> Header {
    Header {
        format: "gpuprof-recording".into(),
        version: 1,
        gpuprof_version: "0".into(),
        command: vec![],
        host: "h".into(),
        start: MonoNs(1_000_000_000),
        anchor_realtime_ns: 1_700_000_000_000_000_000,
        anchor_monotonic_ns: 1_000_000_000,
        interval_ns: 100_000_000,
        cpus: 2,
        page_size: 4096,
        clock_ticks_per_s: 100,
        rank: None,
        job_pid: Pid(41),
        boottime_offset_ns: 0,
        gpu_idle_threshold_pct: None,
        step_range: None,
        attached: None,
        rank_env: Default::default(),
        clock: None,
        boot_id: None,
        anchor_error_ns: 0,
    }
}

#[test]
fn gpm_windows_are_the_source_when_they_cover_the_run() {
    let h = header();
    let wall = |mono_ms: u64| 1_700_000_000_000_000 + (mono_ms * 1000) - 1_000_000;
    let ms = |x: u64| MonoNs(x * 1_000_000);
    let build = |gpm_until_ms: u64| {
        let mut b = GpuBuilder::new(&h);
        // Driver samples: 50% busy every 100 ms from 1.1 s to 5 s.
        b.push(&Event::GpuUtil {
            t: ms(5000),
            gpu: 0,
            samples: (11..=50).map(|k| (wall(k * 100), 50)).collect(),
        });
        // GPM: 100 ms windows from 1.0 s, idle in every other one.
        let mut at = 1000;
        while at + 100 <= gpm_until_ms {
            b.push(&Event::GpuActivity {
                t: ms(at + 100),
                gpu: 0,
                from: ms(at),
                busy_pct: if (at / 100) % 2 == 0 { 100.0 } else { 0.0 },
                sm_active_pct: Some(80.0),
            });
            at += 100;
        }
        let job: BTreeSet<Pid> = [Pid(41)].into();
        b.finish(&GpuInputs {
            job_pids: &job,
            end: ms(5000),
        })
    };
    let a = build(5000);
    let d = &a.devices[0];
    assert_eq!(d.util_source, UtilSource::Gpm);
    assert_eq!(d.resolution_ns, 100_000_000);
    assert!((d.busy_fraction.unwrap() - 0.5).abs() < 1e-9);
    assert!((d.driver_busy_fraction.unwrap() - 0.5).abs() < 1e-9);
    // Every other 100 ms window fully idle: 20 gaps GPM can place and
    // the driver's 50% samples could not.
    assert_eq!(d.gap_stats.count, 20);
    assert!((d.idle_s - 2.0).abs() < 1e-6, "{}", d.idle_s);
    assert!((d.sm_active.mean() - 80.0).abs() < 1e-9);
    // GPM stopped half way: the driver's samples for the whole run.
    let a = build(3000);
    let d = &a.devices[0];
    assert_eq!(d.util_source, UtilSource::DriverSamples);
    assert_eq!(d.gap_stats.count, 0);
    assert!((d.idle_s - 2.0).abs() < 1e-6, "{}", d.idle_s);
}

#[test]
fn attribution_and_throttle_seconds() {
    let h = header();
    let wall = |mono_ms: u64| 1_700_000_000_000_000 + (mono_ms * 1000) - 1_000_000;
    let mut b = GpuBuilder::new(&h);
    b.push(&Event::GpuDriver {
        t: MonoNs(1_000_000_000),
        driver_version: Some("550".into()),
        cuda_driver_version: Some(12040),
        devices: 2,
    });
    for gpu in 0..2 {
        b.push(&Event::GpuProcesses {
            t: MonoNs(1_100_000_000),
            gpu,
            procs: vec![GpuProc {
                pid: Pid(if gpu == 0 { 42 } else { 4_000_000 }),
                ctx: GpuContext::Compute,
                mem: Some(1 << 30),
                gi: None,
                ci: None,
            }],
        });
    }
    let state = |throttle| GpuState {
        throttle: Some(throttle),
        ..Default::default()
    };
    b.push(&Event::GpuState {
        t: MonoNs(1_000_000_000),
        gpu: 0,
        state: state(0),
    });
    b.push(&Event::GpuState {
        t: MonoNs(2_000_000_000),
        gpu: 0,
        state: state(0x40),
    });
    b.push(&Event::GpuUtil {
        t: MonoNs(1_300_000_000),
        gpu: 0,
        samples: vec![
            (wall(1100), 90),
            (wall(1200), 0),
            (wall(1300), 0),
            (wall(1400), 90),
        ],
    });
    let job: BTreeSet<Pid> = [Pid(41), Pid(42)].into();
    b.push(&Event::GpuProcUtil {
        t: MonoNs(1_300_000_000),
        gpu: 0,
        samples: vec![
            GpuProcSample {
                pid: Pid(42),
                ts_us: wall(1200),
                sm: 80,
                mem: 0,
            },
            GpuProcSample {
                pid: Pid(42),
                ts_us: wall(1300),
                sm: 0,
                mem: 0,
            },
        ],
    });
    // The process leaves the GPU at 1.6 s.
    b.push(&Event::GpuProcesses {
        t: MonoNs(1_600_000_000),
        gpu: 0,
        procs: vec![],
    });
    let a = b.finish(&GpuInputs {
        job_pids: &job,
        end: MonoNs(4_500_000_000),
    });
    assert!(!a.attribution_unavailable);
    assert_eq!(a.job_gpu_pids(), [Pid(42)].into());
    assert!(!a.devices[1].processes[0].in_job);
    let t = &a.devices[0].throttle;
    assert_eq!(t[0].reason, "hw_thermal_slowdown");
    assert!((t[0].seconds - 2.5).abs() < 1e-9);
    assert_eq!(t[0].first, MonoNs(2_000_000_000));
    assert_eq!(a.devices[0].resolution_ns, 100_000_000);
    assert_eq!(a.devices[0].gap_stats.count, 1);
    assert!((a.devices[0].gap_stats.total_s - 0.22).abs() < 1e-6);
    let d = &a.devices[0];
    assert_eq!(d.util_samples, 4);
    assert_eq!((d.util_p50, d.util_p95), (Some(90.0), Some(90.0)));
    assert!((d.busy_fraction.unwrap() - 0.45).abs() < 1e-9);
    // 80% for 100 ms, then 0% until it left at 1.6 s: a mean of 20%.
    let p = &d.processes[0];
    assert!((p.sm_mean.unwrap() - 20.0).abs() < 1e-9, "{:?}", p.sm_mean);
    assert_eq!(p.mem_max, Some(1 << 30));

    // A steady SM% read in the tick before the process was listed (the
    // collector records each value once, at its first change): it
    // still counts from when it was read.
    let mut b = GpuBuilder::new(&h);
    b.push(&Event::GpuProcUtil {
        t: MonoNs(1_100_000_000),
        gpu: 0,
        samples: vec![GpuProcSample {
            pid: Pid(42),
            ts_us: wall(1050),
            sm: 85,
            mem: 0,
        }],
    });
    b.push(&Event::GpuProcesses {
        t: MonoNs(1_100_000_000),
        gpu: 0,
        procs: vec![GpuProc {
            pid: Pid(42),
            ctx: GpuContext::Compute,
            mem: Some(1 << 30),
            gi: None,
            ci: None,
        }],
    });
    let a = b.finish(&GpuInputs {
        job_pids: &job,
        end: MonoNs(2_000_000_000),
    });
    let p = &a.devices[0].processes[0];
    assert_eq!(p.sm_mean, Some(85.0));
    assert!((p.sm_s - 0.95).abs() < 1e-6, "{}", p.sm_s);

    let nobody: BTreeSet<Pid> = [Pid(7)].into();
    let mut b = GpuBuilder::new(&h);
    b.push(&Event::GpuProcesses {
        t: MonoNs(1_100_000_000),
        gpu: 0,
        procs: vec![GpuProc {
            pid: Pid(4_000_000),
            ctx: GpuContext::Compute,
            mem: Some(1 << 30),
            gi: None,
            ci: None,
        }],
    });
    let a = b.finish(&GpuInputs {
        job_pids: &nobody,
        end: MonoNs(2_000_000_000),
    });
    assert!(a.attribution_unavailable);
    assert!(a.notes[0].contains("PID namespace"));
}

/// The first GPM poll can land just before the window starts: the window
/// that straddles the start counts from it. It was dropped, and a fully
/// idle 100 ms was missing from the idle total (the job's own log said
/// 1.970 s idle, gpuprof 1.870 s).
#[test]
fn a_gpm_window_across_the_start_counts_from_it() {
    let h = header();
    let ms = |x: u64| MonoNs(x * 1_000_000);
    let mut b = GpuBuilder::new(&h);
    // Probe at 1.000 s, first poll at 1.050 s; the window starts at
    // 1.051 s; then 100 ms windows, idle, until 3.05 s.
    b.push(&Event::GpuActivity {
        t: ms(1050),
        gpu: 0,
        from: ms(1000),
        busy_pct: 0.0,
        sm_active_pct: None,
    });
    b.push(&Event::WindowStart { t: ms(1051) });
    let mut at = 1050;
    while at < 3050 {
        b.push(&Event::GpuActivity {
            t: ms(at + 100),
            gpu: 0,
            from: ms(at),
            busy_pct: 0.0,
            sm_active_pct: None,
        });
        at += 100;
    }
    let job: BTreeSet<Pid> = [Pid(41)].into();
    let a = b.finish(&GpuInputs {
        job_pids: &job,
        end: ms(3050),
    });
    let d = &a.devices[0];
    assert_eq!(d.util_source, UtilSource::Gpm);
    let split = d.idle_split(ms(1051), ms(3050));
    assert!((split.total_s - 1.999).abs() < 1e-6, "{split:?}");
}
