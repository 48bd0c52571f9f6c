use super::*;
use crate::event::{GpuProc, GpuState, Header};

const S: u64 = 1_000_000_000;

fn header() -> Event {
    Event::Header(Header {
        anchor_realtime_ns: 1_000 * S,
        gpu_idle_threshold_pct: Some(5.0),
        ..Header::for_tests(MonoNs(10 * S), Pid(100))
    })
}

fn process(t: u64, pid: i32, ppid: i32, cmd: &str) -> Event {
    Event::Process {
        t: MonoNs(t),
        pid: Pid(pid),
        ppid: Pid(ppid),
        start_boot_ns: 0,
        comm: "python3".into(),
        cmdline: cmd.split(' ').map(String::from).collect(),
        exe: None,
        rank_env: None,
    }
}

fn sample(t: u64, pid: i32, cpu_ns: u64, write: u64) -> Event {
    Event::ProcessSample {
        t: MonoNs(t),
        pid: Pid(pid),
        user_ns: cpu_ns,
        sys_ns: 0,
        rss_bytes: 1 << 20,
        read_bytes: 0,
        write_bytes: write,
        rchar: 0,
        wchar: 0,
        threads: 1,
    }
}

fn sys(t: u64) -> Event {
    Event::SystemCpu {
        t: MonoNs(t),
        total: CpuTimes {
            user: t,
            idle: t,
            ..Default::default()
        },
        per_cpu: vec![],
        procs_running: 1,
        procs_blocked: 0,
    }
}

fn state(live: &Live) -> MutexGuard<'_, LiveState> {
    live.lock()
}

#[test]
fn cpu_and_io_are_counted_under_the_role_at_the_time() {
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    tap(&Event::WindowStart { t: MonoNs(10 * S) });
    tap(&process(10 * S, 100, 1, "python train.py"));
    tap(&process(11 * S, 101, 100, "python train.py"));
    tap(&sample(11 * S, 100, S, 100));
    tap(&sample(11 * S, 101, S / 2, 0));
    // A forked Python child with its parent's command line: a worker.
    assert_eq!(state(&live).role_of(Pid(101)), Some(Role::Worker));
    tap(&Event::Thread {
        t: MonoNs(12 * S),
        pid: Pid(101),
        tid: Tid(101),
        comm: TORCH_WORKER_NAME.into(),
    });
    tap(&sample(12 * S, 100, 2 * S, 300));
    tap(&sample(12 * S, 101, 2 * S, 0));
    let st = state(&live);
    assert_eq!(st.roles[0].cpu_ns, 2 * S);
    assert_eq!(st.roles[0].write_bytes, 300);
    assert_eq!(st.roles[1].cpu_ns, 2 * S);
    assert_eq!(st.alive(), [1, 1, 0, 0]);
    assert_eq!(st.elapsed_s(), 2.0);
}

#[test]
fn a_reused_pid_counts_the_new_process_from_zero() {
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    tap(&Event::WindowStart { t: MonoNs(10 * S) });
    tap(&process(10 * S, 100, 1, "python train.py"));
    tap(&process(10 * S, 102, 100, "convert a.jpg"));
    tap(&sample(11 * S, 102, S, 0));
    // The recorder ends it, then names the process the kernel gave its
    // PID to: that one's 0.2 s count, not a negative delta against 1 s.
    tap(&Event::ProcessExit {
        t: MonoNs(12 * S),
        pid: Pid(102),
        status: None,
    });
    tap(&process(12 * S, 102, 100, "convert b.jpg"));
    tap(&sample(13 * S, 102, S / 5, 0));
    let st = state(&live);
    let role = st.role_of(Pid(102)).unwrap();
    assert_eq!(st.roles[ri(role)].cpu_ns, S + S / 5);
}

#[test]
fn gpu_busy_share_and_throttle_seconds() {
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    tap(&process(10 * S, 100, 1, "python train.py"));
    // 20 samples of 100 ms: 10 at 80%, 10 idle. Unix µs = 1000 s + mono - 10 s.
    let us = |mono_ns: u64| (1_000 * S + mono_ns - 10 * S) / 1000;
    let samples: Vec<(u64, u32)> = (1..=20)
        .map(|i| (us(10 * S + i * S / 10), if i <= 10 { 80 } else { 0 }))
        .collect();
    tap(&Event::GpuUtil {
        t: MonoNs(12 * S),
        gpu: 0,
        samples,
    });
    tap(&Event::GpuProcesses {
        t: MonoNs(12 * S),
        gpu: 0,
        procs: vec![GpuProc {
            pid: Pid(100),
            ctx: crate::event::GpuContext::Compute,
            mem: Some(1 << 30),
            gi: None,
            ci: None,
        }],
    });
    let hot = |t: u64, bits: u64| Event::GpuState {
        t: MonoNs(t),
        gpu: 0,
        state: GpuState {
            throttle: Some(bits),
            ..Default::default()
        },
    };
    tap(&hot(10 * S, 0x40));
    tap(&hot(11 * S, 0));
    tap(&hot(11 * S + S / 2, 0x40));
    let st = state(&live);
    let g = &st.gpus[&0];
    // The first sample's period is assumed (1/6 s), the others measured.
    assert!(
        (g.busy_s - (0.8 / 6.0 + 9.0 * 0.08)).abs() < 1e-6,
        "{}",
        g.busy_s
    );
    let (share, len) = g.busy_share(MonoNs(11 * S), MonoNs(12 * S)).unwrap();
    assert!((len - 1.0).abs() < 1e-6 && share == 0.0, "{share} {len}");
    assert_eq!(st.role_of(Pid(100)), Some(Role::Main));
    let th = g.throttle_s(MonoNs(12 * S));
    assert!((th[&0x40] - 1.5).abs() < 1e-9, "{th:?}");
    assert!((g.throttled_in(0x40, MonoNs(11 * S), MonoNs(12 * S)) - 0.5).abs() < 1e-9);
}

#[test]
fn alerts_need_a_full_window_and_history_stays_bounded() {
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    let us = |mono_ns: u64| (1_000 * S + mono_ns - 10 * S) / 1000;
    let window = std::time::Duration::from_secs(30);
    // 10% busy from t = 10 s on, one sample per 100 ms.
    for sec in 0..200u64 {
        let samples: Vec<(u64, u32)> = (1..=10)
            .map(|i| (us(10 * S + sec * S + i * S / 10), 10))
            .collect();
        tap(&Event::GpuUtil {
            t: MonoNs(11 * S + sec * S),
            gpu: 0,
            samples,
        });
        for k in 0..10 {
            tap(&sys(10 * S + sec * S + k * S / 10));
        }
        if sec == 20 {
            assert!(state(&live).alerts(window).is_empty());
        }
    }
    let st = state(&live);
    let alerts = st.alerts(window);
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0].key, "gpu-idle:0");
    assert!(alerts[0].message.contains("busy only 10%"), "{alerts:?}");
    // Kept: a minute (the longest window asked for) plus one entry.
    let per_minute = 600;
    assert!(st.ticks.len() <= per_minute + 2, "{}", st.ticks.len());
    assert!(st.gpus[&0].util.len() <= per_minute + 1);
    assert!(st.alerts(std::time::Duration::ZERO).is_empty());
}

#[test]
fn nvtx_ranges_are_counted_per_name_with_the_recorders_totals() {
    use crate::event::{NvtxBatch, NvtxRangeRec, NvtxStats, NvtxTotal};
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    tap(&Event::NvtxName {
        id: 1,
        name: "train_step".into(),
    });
    let range = |d: Option<u64>, open: bool| NvtxRangeRec {
        d,
        n: 1,
        open,
        ..Default::default()
    };
    tap(&Event::NvtxRanges(NvtxBatch {
        inst: 0,
        pid: Pid(100),
        tid: Tid(100),
        t0: MonoNs(11 * S),
        // Two steps of 0.25 s, a mark, and a range cut by the end.
        ranges: vec![
            range(Some(S / 4), false),
            range(Some(S / 4), false),
            range(None, false),
            range(Some(S), true),
        ],
    }));
    let stats = |count| {
        Event::NvtxStats(NvtxStats {
            totals: vec![NvtxTotal {
                inst: 0,
                dom: 0,
                name: 1,
                count,
                total_ns: count * S / 4,
                max_ns: S / 4,
            }],
            ..Default::default()
        })
    };
    // Cumulative: the latest totals hold.
    tap(&stats(4));
    tap(&stats(6));
    let r = state(&live).nvtx_ranges();
    assert_eq!(r["train_step"].0, 8);
    assert!((r["train_step"].1 - 2.0).abs() < 1e-9);
}

#[test]
fn ranks_and_launchers_as_the_analysis_sees_them() {
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    let with_env = |pid: i32, ppid: i32, cmd: &str, rank: Option<&str>| {
        let Event::Process {
            t,
            pid,
            ppid,
            start_boot_ns,
            comm,
            cmdline,
            exe,
            ..
        } = process(10 * S, pid, ppid, cmd)
        else {
            unreachable!()
        };
        let mut env = crate::event::RankEnv::new();
        if let Some(r) = rank {
            env.insert("RANK".into(), r.into());
        }
        Event::Process {
            t,
            pid,
            ppid,
            start_boot_ns,
            comm,
            cmdline,
            exe,
            rank_env: Some(env),
        }
    };
    tap(&with_env(100, 1, "python torchrun train.py", None));
    tap(&with_env(101, 100, "python train.py", Some("0")));
    tap(&with_env(102, 100, "python train.py", Some("1")));
    // A worker whose environment could not be read: its parent's rank.
    tap(&process(10 * S, 103, 102, "python train.py"));
    tap(&sample(11 * S, 102, S, 0));
    tap(&sample(11 * S, 103, 2 * S, 0));
    let st = state(&live);
    assert_eq!(st.role_of(Pid(100)), Some(Role::Launcher));
    assert_eq!(st.rank_of(Pid(100)), None);
    assert_eq!(st.rank_of(Pid(101)), Some(0));
    assert_eq!(st.rank_of(Pid(103)), Some(1));
    assert_eq!(st.role_of(Pid(103)), Some(Role::Worker));
    let cpu = st.rank_cpu();
    assert_eq!(cpu[&(1, Role::Main)], S);
    assert_eq!(cpu[&(1, Role::Worker)], 2 * S);
}

/// Host memory pressure and a binding cgroup CPU limit are warned about
/// once they have held for the window, not before; a window in which
/// they eased is quiet.
#[test]
fn memory_pressure_and_cpu_limit_warn_over_a_full_window() {
    use crate::event::{CgroupCpu, Psi};
    let live = Live::new(std::time::Duration::from_secs(60));
    let mut tap = live.tap();
    tap(&header());
    let window = std::time::Duration::from_secs(30);
    let cgroup = |t: u64, periods: u64, throttled: u64| Event::Cgroup {
        t: MonoNs(t),
        cpu: Some(CgroupCpu {
            path: "/job".into(),
            v2: true,
            quota_us: 50_000,
            period_us: 100_000,
            nr_periods: periods,
            nr_throttled: throttled,
            throttled_ns: 0,
        }),
        memory: None,
    };
    // From t = 10 s, every 100 ms: 20% of the time stalled on memory
    // (20 ms of each 100 ms), and the limit throttling 4 periods in 10
    // until t = 60 s, none after.
    let (mut stall_us, mut periods, mut throttled) = (0u64, 0u64, 0u64);
    for k in 0..1000u64 {
        let t = 10 * S + k * S / 10;
        let pressed = t < 60 * S;
        if pressed {
            stall_us += 20_000;
        }
        periods += 1;
        if pressed && k % 10 < 4 {
            throttled += 1;
        }
        tap(&sys(t));
        tap(&Event::Pressure {
            t: MonoNs(t),
            cpu: None,
            io: None,
            memory: Some(Psi {
                some_us: stall_us,
                full_us: None,
            }),
        });
        tap(&cgroup(t, periods, throttled));
        let keys = || -> Vec<String> {
            let mut k: Vec<String> = state(&live)
                .alerts(window)
                .into_iter()
                .map(|a| a.key)
                .collect();
            k.sort();
            k
        };
        if t == 30 * S {
            assert!(keys().is_empty(), "20 s of data is not a 30 s window");
        }
        if t == 55 * S {
            assert_eq!(keys(), ["cpu-limit", "host-memory"]);
            let alerts = state(&live).alerts(window);
            let text: Vec<&str> = alerts.iter().map(|a| a.message.as_str()).collect();
            assert!(
                text.iter().any(|m| m.contains("host memory 20%")),
                "{text:?}"
            );
            assert!(
                text.iter()
                    .any(|m| m.contains("(0.5 cores) throttled it in 40%")),
                "{text:?}"
            );
        }
    }
    // The last 30 s had neither.
    assert!(state(&live).alerts(window).is_empty());
}
