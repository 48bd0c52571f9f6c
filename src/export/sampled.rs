//! What the profile exporters for other tools (`pprof`, `speedscope`) share:
//! how a frame of the analysis is described outside gpuprof, and which
//! process and thread a sample belongs to.

use crate::analysis::fold::FrameClass;
use crate::analysis::stacks::Stacks;
use crate::analysis::Analysis;
use crate::event::{Pid, Tid};

/// A frame as other tools describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameDesc<'a> {
    /// A Python function: its qualified name and source file, and the line
    /// the frame was on where the recording has it (None: not recorded, or
    /// not decoded; never 0).
    Python {
        name: &'a str,
        file: &'a str,
        line: Option<u32>,
    },
    /// Native code named by its file's symbols: the function and the
    /// library or executable it lies in, with the lowest file offset
    /// sampled in it.
    Native {
        name: &'a str,
        library: &'a str,
        offset: Option<u64>,
    },
    /// Native code its file does not name: shown by its label
    /// (`[libz.so.1+0x1234]`, or `[libz.so.1]` in the Python view).
    Unnamed {
        label: &'a str,
        library: &'a str,
        offset: Option<u64>,
    },
    /// A frame made up by the analysis (`[python: not sampled]`, …).
    Marker { label: &'a str },
}

impl<'a> FrameDesc<'a> {
    /// The function name shown: the same as the folded files' label except
    /// for Python frames, whose file goes into a field of its own.
    pub fn name(&self) -> &'a str {
        match self {
            FrameDesc::Python { name, .. } | FrameDesc::Native { name, .. } => name,
            FrameDesc::Unnamed { label, .. } | FrameDesc::Marker { label } => label,
        }
    }
}

/// How frame `id` of `st`'s stacks by line ([`Stacks::lined_stack_ids`])
/// is described.
pub fn describe(st: &Stacks, id: u32) -> FrameDesc<'_> {
    let f = st.lined_frame(id);
    match f.class {
        FrameClass::Python => FrameDesc::Python {
            name: &f.name,
            file: &f.file,
            line: f.line.filter(|l| *l > 0),
        },
        FrameClass::Marker => FrameDesc::Marker { label: &f.label },
        _ if f.file.is_empty() => FrameDesc::Marker { label: &f.label },
        _ if f.name.is_empty() => FrameDesc::Unnamed {
            label: &f.label,
            library: &f.file,
            offset: st.lined_frame_offset(id),
        },
        _ => FrameDesc::Native {
            name: &f.name,
            library: &f.file,
            offset: st.lined_frame_offset(id),
        },
    }
}

/// The process's name as the folded files' roots give it.
pub fn process_name(a: &Analysis, pid: Pid) -> &str {
    a.stacks.procs.get(&pid).map_or("?", |m| m.name.as_str())
}

/// A thread's name, when the recording has it.
pub fn thread_name(a: &Analysis, pid: Pid, tid: Tid) -> Option<&str> {
    a.processes
        .get(&pid)
        .and_then(|p| p.threads.get(&tid))
        .map(|t| t.comm.as_str())
        .filter(|c| !c.is_empty())
}

/// The sampling period in ns: the recorded one, else the one the frequency
/// gives; 0 when neither is known.
pub fn period_ns(st: &Stacks) -> u64 {
    if st.period_ns > 0 {
        st.period_ns
    } else if st.report.frequency_hz > 0.0 {
        (1e9 / st.report.frequency_hz).round() as u64
    } else {
        0
    }
}

/// A small analysis for the exporters' unit tests: one process (`python3`,
/// pid 100, rank-less) with two threads sampled at 100 Hz; native frames
/// `main` → `work` → an unnamed frame, in `/opt/app/libapp.so`.
#[cfg(test)]
pub fn tiny_analysis() -> Analysis {
    tiny_analysis_with_env(None)
}

/// [`tiny_analysis`] with the launcher variables of the process's own
/// environment (`RANK`, …).
#[cfg(test)]
pub fn tiny_analysis_with_env(rank_env: Option<crate::event::RankEnv>) -> Analysis {
    use crate::event::{
        Event, Footer, Header, JobStatus, MonoNs, SampleBatch, StackKind, StackStats,
    };
    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_000 * S;
    const PERIOD: u64 = 10_000_000;
    let header = Header {
        format: "gpuprof-recording".into(),
        version: 1,
        gpuprof_version: "test".into(),
        command: vec!["python3".into(), "app.py".into()],
        host: "test".into(),
        start: MonoNs(T0),
        anchor_realtime_ns: 1_800_000_000 * S,
        anchor_monotonic_ns: T0,
        anchor_error_ns: 0,
        interval_ns: 100_000_000,
        cpus: 2,
        page_size: 4096,
        clock_ticks_per_s: 100,
        rank: None,
        rank_env: Default::default(),
        boot_id: None,
        clock: None,
        job_pid: Pid(100),
        boottime_offset_ns: 0,
        gpu_idle_threshold_pct: None,
        step_range: None,
        attached: None,
    };
    let mut ev = vec![
        Event::WindowStart { t: MonoNs(T0) },
        Event::Process {
            t: MonoNs(T0 + 1),
            pid: Pid(100),
            ppid: Pid(1),
            start_boot_ns: 0,
            comm: "python3".into(),
            cmdline: vec!["python3".into(), "app.py".into()],
            exe: None,
            rank_env,
        },
        Event::StackFile {
            id: 0,
            path: "/opt/app/libapp.so".into(),
        },
    ];
    for (tid, name) in [(100, "python3"), (101, "loader")] {
        ev.push(Event::Thread {
            t: MonoNs(T0 + 1),
            pid: Pid(100),
            tid: Tid(tid),
            comm: name.into(),
        });
    }
    for (id, offset, name) in [
        (0u32, 0x100u64, Some("main")),
        (1, 0x200, Some("work")),
        (2, 0x300, None),
    ] {
        ev.push(Event::NativeFrame {
            id,
            file: 0,
            offset,
        });
        ev.push(Event::StackNode {
            kind: StackKind::Native,
            id,
            parent: id.checked_sub(1),
            frame: id,
        });
        ev.push(match name {
            Some(n) => Event::Symbols {
                names: vec![(id, n.into())],
                unnamed: vec![],
            },
            None => Event::Symbols {
                names: vec![],
                unnamed: vec![id],
            },
        });
    }
    // Thread 100: work, work, unnamed, work, main; thread 101: main, unnamed.
    for (tid, stacks) in [(100, vec![1u32, 1, 2, 1, 0]), (101, vec![0, 2])] {
        let mut dt = vec![0u32];
        dt.resize(stacks.len(), (PERIOD / 1000) as u32);
        ev.push(Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(100),
            tid: Tid(tid),
            t0: MonoNs(T0 + S),
            dt_us: dt,
            stacks,
            incomplete: vec![],
            source: Default::default(),
        }));
    }
    ev.push(Event::StackStats(StackStats {
        kind: Some(StackKind::Native),
        samples: 7,
        interval_ns: PERIOD,
        ..Default::default()
    }));
    ev.push(Event::Footer(Footer {
        t: MonoNs(T0 + 3 * S),
        status: JobStatus::Exited(0),
        reason: "job exited".into(),
        dropped_events: 0,
        profiler_cpu_ns: 0,
        profiler_max_rss_bytes: 0,
        profiler_cpu_ns_by_component: Default::default(),
        end_anchor: None,
        recording_error: None,
    }));
    crate::analysis::analyze_events(header, ev.into_iter())
}
