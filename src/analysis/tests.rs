use super::*;
use crate::event::{Event, Header, MonoNs, Pid, Tid};

const MS: u64 = 1_000_000;

fn header() -> Header {
    Header {
        command: vec!["python3".into(), "train.py".into()],
        ..Header::for_tests(MonoNs(1_000 * MS), Pid(10))
    }
}

fn proc_ev(t: u64, pid: i32, ppid: i32, comm: &str, cmd: &[&str]) -> Event {
    Event::Process {
        t: MonoNs(t * MS),
        pid: Pid(pid),
        ppid: Pid(ppid),
        start_boot_ns: 0,
        comm: comm.into(),
        cmdline: cmd.iter().map(|s| s.to_string()).collect(),
        exe: None,
        rank_env: None,
    }
}

fn cpu_ev(t: u64, pid: i32, tid: i32, cpu_ms: u64, state: char) -> Event {
    Event::ThreadCpu {
        t: MonoNs(t * MS),
        pid: Pid(pid),
        tid: Tid(tid),
        user_ns: cpu_ms * MS,
        sys_ns: 0,
        state,
        cpu: 0,
    }
}

#[test]
fn a_pid_taken_by_a_later_process_keeps_both_processes_figures() {
    let start = |t: u64, boot: u64, comm: &str| {
        let mut e = proc_ev(t, 20, 10, comm, &[comm]);
        if let Event::Process { start_boot_ns, .. } = &mut e {
            *start_boot_ns = boot;
        }
        e
    };
    let sample = |t: u64, cpu_ms: u64| Event::ProcessSample {
        t: MonoNs(t * MS),
        pid: Pid(20),
        user_ns: cpu_ms * MS,
        sys_ns: 0,
        rss_bytes: 0,
        read_bytes: 0,
        write_bytes: 0,
        rchar: 0,
        wchar: 0,
        threads: 1,
    };
    let exit = |t: u64| Event::ProcessExit {
        t: MonoNs(t * MS),
        pid: Pid(20),
        status: None,
    };
    let evs = vec![
        proc_ev(1_000, 10, 1, "python3", &["python3", "train.py"]),
        start(1_100, 7, "first"),
        sample(1_200, 600),
        sample(2_200, 1_000),
        exit(2_300),
        // A late record of the same process (same start) is no reuse.
        start(2_350, 7, "first"),
        // The kernel gives PID 20 to another process.
        start(3_000, 9, "second"),
        sample(3_100, 200),
        sample(3_600, 500),
        // And to a third, between two passes of the sampler: no exit.
        start(4_000, 11, "third"),
        sample(4_100, 100),
    ];
    let a = analyze_events(header(), evs.into_iter());
    let now = &a.processes[&Pid(20)];
    assert_eq!((now.comm.as_str(), now.cpu_s()), ("third", 0.1));
    let kept: Vec<(&str, f64, Option<MonoNs>)> = a
        .reused
        .iter()
        .map(|p| (p.comm.as_str(), p.cpu_s(), p.exited))
        .collect();
    assert_eq!(
        kept,
        vec![
            ("first", 1.0, Some(MonoNs(2_300 * MS))),
            ("second", 0.5, Some(MonoNs(4_000 * MS)))
        ]
    );
    assert!(
        a.warnings.iter().any(|w| w.contains("processes_reused")),
        "{:?}",
        a.warnings
    );
}

#[test]
fn thread_cpu_is_placed_in_the_interval_it_happened() {
    let h = header();
    let evs = vec![
        Event::WindowStart {
            t: MonoNs(1_000 * MS),
        },
        proc_ev(1_100, 10, 1, "python3", &["python3", "train.py"]),
        cpu_ev(1_100, 10, 10, 0, 'S'),
        // Idle for 2 s (no events), then busy for one interval.
        cpu_ev(3_100, 10, 10, 100, 'R'),
        cpu_ev(3_200, 10, 10, 200, 'R'),
        Event::ProcessExit {
            t: MonoNs(3_300 * MS),
            pid: Pid(10),
            status: None,
        },
    ];
    let a = analyze_events(h, evs.into_iter());
    let th = &a.processes[&Pid(10)].threads[&Tid(10)];
    assert_eq!(th.user_ns, 200 * MS);
    // Busy 100% over [3.0, 3.2) s, idle before.
    assert_eq!(
        th.cpu.mean_in(MonoNs(3_000 * MS), MonoNs(3_200 * MS)),
        Some(1.0)
    );
    assert_eq!(
        th.cpu.mean_in(MonoNs(1_100 * MS), MonoNs(3_000 * MS)),
        Some(0.0)
    );
    assert_eq!(th.state_ns[&'S'], 2_000 * MS);
    assert_eq!(th.state_ns[&'R'], 200 * MS);
    // No footer: flagged as cut short.
    assert!(a.warnings.iter().any(|w| w.contains("end marker")));
}

#[test]
fn delayed_window_measures_from_the_first_sample() {
    let h = header();
    let evs = vec![
        Event::WindowStart {
            t: MonoNs(61_000 * MS),
        },
        proc_ev(61_050, 10, 1, "python3", &["python3", "train.py"]),
        cpu_ev(61_050, 10, 10, 50_000, 'R'),
        cpu_ev(61_150, 10, 10, 50_100, 'R'),
    ];
    let a = analyze_events(h, evs.into_iter());
    assert_eq!(
        a.processes[&Pid(10)].threads[&Tid(10)].user_ns,
        100 * MS,
        "CPU before the window is not counted"
    );
}

#[test]
fn roles_follow_the_documented_rules() {
    let h = header();
    let py = ["python3", "train.py"];
    let evs = vec![
        proc_ev(1_100, 10, 1, "python3", &py),
        // Forked DataLoader-style worker, same command line.
        proc_ev(1_200, 11, 10, "python3", &py),
        // Named like PyTorch's workers.
        proc_ev(1_200, 12, 10, "pt_data_worker", &py),
        // multiprocessing spawn child and its resource tracker.
        proc_ev(
            1_200,
            13,
            10,
            "python3",
            &[
                "python3",
                "-c",
                "from multiprocessing.spawn import spawn_main; spawn_main()",
            ],
        ),
        proc_ev(
            1_200,
            14,
            10,
            "python3",
            &[
                "python3",
                "-c",
                "from multiprocessing.resource_tracker import main;main(5)",
            ],
        ),
        // A shell helper and a Python program it runs.
        proc_ev(1_200, 15, 10, "sh", &["sh", "-c", "python3 eval.py"]),
        proc_ev(1_300, 16, 15, "python3", &["python3", "eval.py"]),
        // torch.compile's compile-worker sidecar and a worker it forked.
        proc_ev(
            1_300,
            17,
            10,
            "python3",
            &[
                "/venv/bin/python3",
                "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/__main__.py",
                "--kind=fork",
                "--workers=2",
            ],
        ),
        proc_ev(
            1_400,
            18,
            17,
            "python3",
            &[
                "/venv/bin/python3",
                "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/__main__.py",
                "--kind=fork",
                "--workers=2",
            ],
        ),
        // A probe the program runs with inline code, and the same inline
        // code run by a shell (a wrapper script's program).
        proc_ev(
            1_500,
            19,
            10,
            "python3",
            &[
                "/venv/bin/python3",
                "-I",
                "-c",
                "import sys; print(sys.version)",
            ],
        ),
        proc_ev(
            1_500,
            20,
            15,
            "python3",
            &["python3", "-uc", "import train; train.main()"],
        ),
    ];
    let a = analyze_events(h, evs.into_iter());
    let role = |p: i32| a.processes[&Pid(p)].role;
    assert_eq!(role(10), Role::Main);
    assert_eq!(role(11), Role::Worker);
    assert_eq!(role(12), Role::Worker);
    assert_eq!(role(13), Role::Worker);
    assert_eq!(role(14), Role::Other);
    assert_eq!(role(15), Role::Other);
    assert_eq!(role(16), Role::Main);
    assert_eq!(role(17), Role::Other);
    assert_eq!(role(18), Role::Other);
    assert_eq!(role(19), Role::Other);
    assert_eq!(role(20), Role::Main);
}

fn ranked(t: u64, pid: i32, ppid: i32, comm: &str, cmd: &[&str], env: &[(&str, &str)]) -> Event {
    let mut ev = proc_ev(t, pid, ppid, comm, cmd);
    if let Event::Process { rank_env, .. } = &mut ev {
        *rank_env = Some(
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    ev
}

#[test]
fn torchrun_agent_is_the_launcher_and_workers_belong_to_their_rank() {
    let py = ["python3", "train.py"];
    let rank = |r: &'static str, l: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![
            ("RANK", r),
            ("LOCAL_RANK", l),
            ("WORLD_SIZE", "4"),
            ("GROUP_RANK", "1"),
        ]
    };
    let evs = vec![
        // Under `srun … torchrun`: the agent carries the node's
        // SLURM_PROCID, its ranks their own RANK.
        ranked(
            1_100,
            10,
            1,
            "pt_elastic",
            &["python3", "torchrun", "train.py"],
            &[("SLURM_PROCID", "1")],
        ),
        ranked(1_200, 20, 10, "python3", &py, &rank("2", "0")),
        ranked(1_200, 30, 10, "python3", &py, &rank("3", "1")),
        // Their DataLoader workers inherit the environment.
        ranked(1_300, 21, 20, "pt_data_worker", &py, &rank("2", "0")),
        ranked(1_300, 31, 30, "pt_data_worker", &py, &rank("3", "1")),
        // A worker whose environment could not be read: by ancestry.
        proc_ev(1_300, 32, 30, "pt_data_worker", &py),
        // A helper the agent ran (no rank of its own).
        ranked(
            1_150,
            11,
            10,
            "ldconfig",
            &["ldconfig", "-p"],
            &[("SLURM_PROCID", "1")],
        ),
    ];
    let a = analyze_events(header(), evs.into_iter());
    let p = |pid: i32| &a.processes[&Pid(pid)];
    assert_eq!(p(10).role, Role::Launcher);
    assert_eq!(p(10).rank, None);
    assert_eq!(p(10).label(), "launcher");
    assert_eq!(p(20).label(), "rank 2");
    assert_eq!(p(30).label(), "rank 3");
    assert_eq!(p(30).rank_ids.local_rank, Some(1));
    assert_eq!(p(30).rank_ids.node_rank, Some(1));
    assert_eq!(p(30).rank_ids.world_size, Some(4));
    assert_eq!(p(21).label(), "worker of rank 2");
    assert_eq!(p(31).label(), "worker of rank 3");
    assert_eq!(p(32).label(), "worker of rank 3");
    assert_eq!(p(11).role, Role::Other);
    assert_eq!(
        p(11).rank,
        None,
        "the agent's own SLURM_PROCID numbers the node"
    );
    assert_eq!(a.ranks(), vec![2, 3]);
    assert!(a.multi_rank());
    let order: Vec<i32> = a.processes_in_order().iter().map(|p| p.pid.0).collect();
    assert_eq!(order, vec![10, 20, 21, 30, 31, 32, 11]);
}

#[test]
fn one_process_per_rank_under_srun_is_that_rank() {
    let py = ["python3", "train.py"];
    let env = [("SLURM_PROCID", "5"), ("SLURM_LOCALID", "1")];
    let evs = vec![
        ranked(1_100, 10, 1, "python3", &py, &env),
        ranked(1_200, 11, 10, "pt_data_worker", &py, &env),
    ];
    let a = analyze_events(header(), evs.into_iter());
    assert_eq!(a.processes[&Pid(10)].label(), "rank 5");
    assert_eq!(a.processes[&Pid(10)].rank_ids.local_rank, Some(1));
    assert_eq!(a.processes[&Pid(11)].label(), "worker of rank 5");
    assert_eq!(a.ranks(), vec![5]);
    assert!(!a.multi_rank());
}
