use super::intake::{RawSample, Thinned};
use super::merge::{merge_same_instant, Markers};
use super::names::Kind;
use super::*;
// Slicing is the trace exporter's (see `export::trace_slices`); these
// tests keep it on the fixtures of the stack analysis.
use crate::export::trace_slices::{thread_slices, TRACE_MAX_DEPTH};

fn node(kind: StackKind, id: u32, parent: Option<u32>, frame: u32) -> Event {
    Event::StackNode {
        kind,
        id,
        parent,
        frame,
    }
}

#[test]
fn a_package_body_is_named_with_its_package() {
    for (path, label) in [
        (
            "/venv/lib/python3.11/site-packages/torch/_tensor.py",
            "_tensor.py",
        ),
        ("/venv/site-packages/torch/__init__.py", "torch/__init__.py"),
        (
            "/venv/site-packages/torch/autograd/__init__.py",
            "autograd/__init__.py",
        ),
        ("/usr/lib/python3.11/json/__main__.py", "json/__main__.py"),
        ("pkg//__init__.py", "pkg//__init__.py"),
        ("__init__.py", "__init__.py"),
        ("/__init__.py", "__init__.py"),
        (
            "<frozen importlib._bootstrap>",
            "<frozen importlib._bootstrap>",
        ),
    ] {
        assert_eq!(py_file_label(path), label, "{path}");
    }
}

fn analyze_all(d: &mut StackData) -> Stacks {
    let metas: BTreeMap<Pid, ProcMeta> = d
        .sampled_pids()
        .into_iter()
        .map(|p| (p, d.fallback_meta(p)))
        .collect();
    analyze(d, (MonoNs(0), MonoNs(u64::MAX)), &|p| metas[&p].clone())
}

/// A hand-built recording: one Python thread whose native stack is
/// _start → main → _PyEval_EvalFrameDefault → zlib_compress → deflate,
/// and whose Python stack is <module> → augment.
/// The counting sort by thread gives the order of the stable
/// comparison sort, threads out of time order and equal times included.
#[test]
fn samples_sort_by_thread_as_by_comparison() {
    let v: Vec<RawSample> = (0..5000u64)
        .map(|i| {
            let r = splitmix64(i);
            // Thread 3's samples come out of time order.
            let tid = (r % 4) as i32;
            let t = if tid == 3 { r % 97 } else { i / 3 };
            RawSample {
                t: MonoNs(t),
                pid: Pid(tid / 2),
                tid: Tid(tid),
                stack: i as u32,
                weight_flags: 1,
            }
        })
        .collect();
    let mut a = v.clone();
    a.sort_by_key(|s| (s.pid, s.tid, s.t));
    let mut b = v;
    sort_by_thread(&mut b);
    let key = |s: &RawSample| (s.pid, s.tid, s.t, s.stack);
    assert_eq!(
        a.iter().map(key).collect::<Vec<_>>(),
        b.iter().map(key).collect::<Vec<_>>()
    );
}

#[test]
fn analysis_keeps_a_bounded_unbiased_share_of_samples() {
    let mut t = Thinned::default();
    // Two threads sampled every 10 ms, 5x the bound in all; stack 1 in
    // one sample of four. Thread 2 stops for 10 s in the middle.
    let n = ANALYSIS_MAX_SAMPLES as u64 * 5 / 2;
    let period = 10_000_000;
    for tid in [1, 2] {
        let samples = (0..n)
            .filter(|i| tid == 1 || !(n / 2..n / 2 + 1000).contains(i))
            .map(|i| RawSample {
                t: MonoNs(i * period),
                pid: Pid(1),
                tid: Tid(tid),
                stack: (i % 4 == 0) as u32,
                weight_flags: 1,
            });
        t.push_thread(Pid(1), Tid(tid), samples);
    }
    assert!(t.kept.len() < ANALYSIS_MAX_SAMPLES);
    assert!(
        t.kept.len() > ANALYSIS_MAX_SAMPLES / 4,
        "kept {}",
        t.kept.len()
    );
    assert!(t.bucket_ns >= 4 * period, "bucket {}", t.bucket_ns);
    // Weights: every recorded sample is counted.
    let total: u64 = t.kept.iter().map(|s| s.weight() as u64).sum();
    assert_eq!(total, 2 * n - 1000);
    let ones: u64 = t
        .kept
        .iter()
        .filter(|s| s.stack == 1)
        .map(|s| s.weight() as u64)
        .sum();
    let share = ones as f64 / total as f64;
    assert!((share - 0.25).abs() < 0.01, "share {share}");
    // Thread 1 ran throughout: one sample in every bucket.
    let mut buckets: Vec<u64> = t
        .kept
        .iter()
        .filter(|s| s.tid == Tid(1))
        .map(|s| s.t.0 / t.bucket_ns)
        .collect();
    buckets.sort_unstable();
    let (lo, hi) = (buckets[0], *buckets.last().unwrap());
    assert_eq!(
        buckets.len() as u64,
        hi - lo + 1,
        "a bucket without a sample"
    );
    // Thread 2's 10 s stop left empty buckets.
    let t2 = t.kept.iter().filter(|s| s.tid == Tid(2)).count() as u64;
    assert!(t2 < hi - lo + 1 - 10_000_000_000 / t.bucket_ns + 2);
}

#[test]
fn a_thread_on_cpu_throughout_is_one_slice_per_frame_after_thinning() {
    let mut d = data();
    // Replace the samples: one thread on the deep stack (node 4) every
    // 10 ms for 10 hours, thinned by the analysis.
    d.native = Thinned::default();
    d.python = Thinned::default();
    let n = 3_600_000u64;
    d.native.push_thread(
        Pid(10),
        Tid(10),
        (0..n).map(|i| RawSample {
            t: MonoNs(1_000_000_000 + i * 10_000_000),
            pid: Pid(10),
            tid: Tid(10),
            stack: 4,
            weight_flags: 1,
        }),
    );
    let mut st = analyze_all(&mut d);
    st.period_ns = 10_000_000;
    assert!(st.bucket_ns > 0);
    assert_eq!(st.report.samples, n, "weights count every sample");
    assert!(st.report.analysis_bucket_ms >= 20.0);
    let thread = st.threads().next().unwrap();
    for level in [0, 1, 5] {
        let slices = thread_slices(&st, thread, View::Native, level);
        let roots: Vec<_> = slices.iter().filter(|s| s.depth == 0).collect();
        assert_eq!(roots.len(), 1, "level {level}: {} root slices", roots.len());
        let covered = roots[0].end.0 - roots[0].start.0;
        assert!(covered as f64 >= 0.999 * (n * 10_000_000) as f64);
        // One slice per frame of the stack.
        assert_eq!(slices.len(), 5);
    }
}

fn data() -> StackData {
    let mut d = StackData::new();
    let evs = vec![
        Event::StackFile {
            id: 0,
            path: "/usr/bin/python3".into(),
        },
        Event::StackFile {
            id: 1,
            path: "/lib/libz.so.1".into(),
        },
        Event::NativeFrame {
            id: 0,
            file: 0,
            offset: 0x10,
        },
        Event::NativeFrame {
            id: 1,
            file: 0,
            offset: 0x20,
        },
        Event::NativeFrame {
            id: 2,
            file: 0,
            offset: 0x30,
        },
        Event::NativeFrame {
            id: 3,
            file: 0,
            offset: 0x40,
        },
        Event::NativeFrame {
            id: 4,
            file: 1,
            offset: 0x50,
        },
        Event::Symbols {
            unnamed: Vec::new(),
            names: vec![
                (0, "_start".into()),
                (1, "main".into()),
                (2, "_PyEval_EvalFrameDefault".into()),
                (3, "zlib_compress".into()),
            ],
        },
        node(StackKind::Native, 0, None, 0),
        node(StackKind::Native, 1, Some(0), 1),
        node(StackKind::Native, 2, Some(1), 2),
        node(StackKind::Native, 3, Some(2), 3),
        node(StackKind::Native, 4, Some(3), 4),
        Event::PyFrame {
            id: 0,
            name: "<module>".into(),
            file: "/x/job.py".into(),
            entry: true,
        },
        Event::PyFrame {
            id: 1,
            name: "augment".into(),
            file: "/x/job.py".into(),
            entry: false,
        },
        node(StackKind::Python, 0, None, 0),
        node(StackKind::Python, 1, Some(0), 1),
        Event::TaskComm {
            t: MonoNs(0),
            pid: Pid(10),
            tid: Tid(10),
            comm: "python3".into(),
            exec: true,
        },
        Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_000_000_000),
            dt_us: vec![0, 10_000, 10_000, 50_000],
            stacks: vec![4, 4, 2, 4],
            incomplete: vec![],
            source: SampleSource::Perf,
        }),
        Event::Samples(SampleBatch {
            kind: StackKind::Python,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_005_000_000),
            dt_us: vec![0],
            stacks: vec![1],
            incomplete: vec![],
            source: SampleSource::Perf,
        }),
    ];
    for e in &evs {
        d.add(e);
    }
    d
}

#[test]
fn perf_samples_of_python_code_are_never_matched_in_time() {
    let mut d = data();
    let st = analyze_all(&mut d);
    let native = FoldOptions {
        view: View::Native,
        merge_workers: false,
    };
    // A py-spy stack 5 ms from the first samples does not make them
    // Python-attributed: every frame as sampled, and in the Python view
    // the interpreter's part is an explicit [python: not sampled].
    let folded = st.folded_role(Some(Role::Main), native);
    assert!(
        folded.contains(
            "python3 (10);_start;main;_PyEval_EvalFrameDefault;zlib_compress;[libz.so.1+0x50] 3"
        ),
        "{folded}"
    );
    let py = st.folded_role(Some(Role::Main), FoldOptions::default());
    assert!(!py.contains("augment"), "{py}");
    assert!(py.contains("[python: not sampled]"), "{py}");
    let p = &st.report.python;
    let c = &p.counts;
    assert_eq!((c.same_instant, c.unattributed, c.native_only), (0, 4, 0));
    assert_eq!(c.unattributed_by_reason[Unattributed::NoAgent.as_str()], 4);
    // py-spy's stack is the Python-only view of that process.
    assert_eq!(p.python_only_stacks, 1);
    assert_eq!(st.python_only.len(), 1);
    assert_eq!(
        st.stack(st.python_only[0].stack).collect::<Vec<_>>(),
        vec!["<module> (job.py)", "augment (job.py)"]
    );
    assert_eq!(st.report.unwind_coverage, 1.0);
}

/// A native stack that carries its own Python frames (CPython perf
/// trampolines named from /tmp/perf-PID.map) is the same instant's:
/// nothing is matched to it.
#[test]
fn trampoline_frames_are_the_python_frames() {
    let mut d = data();
    for e in [
        Event::StackFile {
            id: 2,
            path: "/tmp/perf-10.map".into(),
        },
        Event::NativeFrame {
            id: 5,
            file: 2,
            offset: 0x7f00_0000_1000,
        },
        Event::Symbols {
            names: vec![(5, "py::Loader.augment:/x/job.py".into())],
            unnamed: Vec::new(),
        },
        // _start → main → trampoline → eval → zlib_compress
        node(StackKind::Native, 10, Some(1), 5),
        node(StackKind::Native, 11, Some(10), 2),
        node(StackKind::Native, 12, Some(11), 3),
        // The second sample's unwind was cut (the same frames; its
        // outer ones unknown): its Python frames are partial.
        Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_005_000_000),
            dt_us: vec![0, 10_000],
            stacks: vec![12, 12],
            incomplete: vec![1],
            source: SampleSource::Perf,
        }),
    ] {
        d.add(&e);
    }
    let st = analyze_all(&mut d);
    assert_eq!(st.report.python_from_perf_map, 2);
    let c = &st.report.python.counts;
    assert_eq!((c.same_instant, c.same_instant_partial), (1, 1));
    let native = st.folded_role(
        Some(Role::Main),
        FoldOptions {
            view: View::Native,
            merge_workers: false,
        },
    );
    assert!(
        native.contains(
            "python3 (10);_start;main;Loader.augment (job.py);_PyEval_EvalFrameDefault;zlib_compress 2"
        ),
        "{native}"
    );
    let py = st.folded_role(Some(Role::Main), FoldOptions::default());
    assert!(
        py.contains("python3 (10);Loader.augment (job.py) 2"),
        "{py}"
    );
}

/// (frame id, kind) for a merge, from a spec: `N` native, `E` eval
/// loop (ids from 100), `P` Python (`P*` an entry), `M` a marker.
fn kinds(spec: &str) -> Vec<(u32, Kind)> {
    spec.split_whitespace()
        .enumerate()
        .map(|(i, w)| {
            let kind = match w.as_bytes()[0] {
                b'P' => Kind::Python(w.ends_with('*')),
                b'M' => Kind::Marker,
                _ => Kind::Native,
            };
            (i as u32 + 100 * (w.as_bytes()[0] == b'E') as u32, kind)
        })
        .collect()
}

#[test]
fn same_instant_runs_replace_their_interpreter_frames() {
    let m = Markers {
        unmatched: 900,
        truncated: 901,
        native_unknown: 902,
    };
    let is_eval = |n: u32| (100..200).contains(&n);
    let no_pm = |_: u32| false;
    let merge = |f: &[(u32, Kind)], complete| merge_same_instant(f, complete, &is_eval, &no_pm, &m);
    // _start, eval, C call back into Python, eval, zlib leaf; Python:
    // <module>* main, worker* compress.
    let f = kinds("N E N E N P* P P* P");
    let (out, how) = merge(&f, true);
    assert_eq!(how, Attribution::SameInstant);
    assert_eq!(out, vec![0, 101, 5, 6, 2, 103, 7, 8, 4]);
    // The same sample recorded with its Python frames first.
    let python_first: Vec<(u32, Kind)> = f[5..].iter().chain(&f[..5]).copied().collect();
    assert_eq!(merge(&python_first, true), (out, how));
    // One run too many with both sides complete: nothing is placed; the
    // native frames stay, the marker follows the outer interpreter frame.
    let f = kinds("N E N N P* P P* P");
    let (out, how) = merge(&f, true);
    assert_eq!(how, Attribution::Unattributed(Unattributed::Unmatched));
    assert_eq!(out, vec![0, 101, 900, 2, 3]);
    // The same with the native stack cut above: the outer run is the
    // outer part of the same instant.
    let (out, how) = merge(&f, false);
    assert_eq!(how, Attribution::SameInstantPartial);
    assert_eq!(out, vec![4, 5, 0, 101, 6, 7, 2, 3]);
    // Python frames over a native stack that stops before any
    // interpreter frame, whether or not the unwinder took its last
    // address for the end of the stack: the Python frames stay, above
    // `[native frames unknown]` and the native frames unwound.
    for complete in [true, false] {
        let (out, how) = merge(&kinds("N N P* P P* P"), complete);
        assert_eq!(how, Attribution::NativeUnknown);
        assert_eq!(out, vec![2, 3, 4, 5, 902, 0, 1]);
    }
    // Python frames cut (the outer run lost): the inner run is placed
    // under the truncation marker.
    let mut f = kinds("N E N E N P* P M");
    f[7].0 = 901;
    let (out, how) = merge(&f, true);
    assert_eq!(how, Attribution::SameInstantPartial);
    assert_eq!(out, vec![0, 101, 2, 901, 103, 5, 6, 4]);
    // An unreadable chain: its marker after the interpreter frame.
    let (out, how) = merge(&kinds("N E N M"), true);
    assert_eq!(how, Attribution::Unattributed(Unattributed::Unreadable));
    assert_eq!(out, vec![0, 101, 3, 2]);
    // No interpreter frame, no Python frame: native code.
    assert_eq!(merge(&kinds("N N"), true).1, Attribution::NativeOnly);
}

/// An agent sample and a perf sample of the same thread: the agent's is
/// used, the perf one is not counted again. Its Python frames may come
/// after its native leaf (earlier recordings) or before its native root
/// (the recorder now): same stacks, and the root is found either way
/// (the samples are marked incomplete: only a named root makes them
/// count as reaching it).
#[test]
fn agent_samples_replace_perf_samples_of_their_thread() {
    let python_last = vec![
        node(StackKind::Native, 5, Some(4), 5),
        node(StackKind::Native, 6, Some(5), 6),
    ];
    let python_first = vec![
        node(StackKind::Native, 7, None, 5),
        node(StackKind::Native, 8, Some(7), 6),
        node(StackKind::Native, 9, Some(8), 0),
        node(StackKind::Native, 10, Some(9), 1),
        node(StackKind::Native, 11, Some(10), 2),
        node(StackKind::Native, 12, Some(11), 3),
        node(StackKind::Native, 13, Some(12), 4),
    ];
    for (nodes, leaf) in [(python_last, 6), (python_first, 13)] {
        agent_samples_replace_perf_samples(nodes, leaf);
    }
}

/// Process 10 is sampled by the agent (Python 3.12), and its frames 5
/// and 6 are `<module>` → `augment`.
fn same_instant_python() -> Vec<Event> {
    vec![
        Event::InlinePyFrame {
            id: 5,
            name: "<module>".into(),
            file: "/x/job.py".into(),
            entry: true,
            line: None,
        },
        Event::InlinePyFrame {
            id: 6,
            name: "augment".into(),
            file: "/x/job.py".into(),
            entry: false,
            line: None,
        },
        Event::PyProcess {
            t: MonoNs(0),
            pid: Pid(10),
            version: "3.12.1".into(),
            same_instant: true,
            timer: false,
            detail: String::new(),
        },
    ]
}

fn agent_samples_replace_perf_samples(nodes: Vec<Event>, leaf: u32) {
    let mut d = data();
    let mut evs = nodes;
    evs.extend(same_instant_python());
    evs.extend(vec![Event::Samples(SampleBatch {
        kind: StackKind::Native,
        pid: Pid(10),
        tid: Tid(10),
        t0: MonoNs(1_003_000_000),
        dt_us: vec![0, 10_000, 10_000, 10_000],
        stacks: vec![leaf; 4],
        incomplete: vec![0, 1, 2, 3],
        source: SampleSource::Agent,
    })]);
    for e in &evs {
        d.add(e);
    }
    let st = analyze_all(&mut d);
    let native = FoldOptions {
        view: View::Native,
        merge_workers: false,
    };
    assert_eq!(
        st.folded_role(Some(Role::Main), native),
        "python3 (10);_start;main;_PyEval_EvalFrameDefault;<module> (job.py);augment (job.py);zlib_compress;[libz.so.1+0x50] 4\n"
    );
    let p = &st.report.python;
    assert_eq!((p.counts.same_instant, p.counts.unattributed), (4, 0));
    assert_eq!(p.by_version["3.12"].same_instant, 4);
    assert_eq!(p.processes[0].sampler, "same-instant");
    // py-spy's stacks of a process the agent samples are no view of
    // their own.
    assert!(st.python_only.is_empty());
    assert_eq!(st.report.unwind_coverage, 1.0, "leaf {leaf}");
}

/// Frames recorded with their lines: by function unless `lines`, then
/// `name (file:LINE)`, and `file:?` for a line that could not be
/// decoded (recorded as 0).
#[test]
fn python_frames_by_line_only_when_asked() {
    for lines in [false, true] {
        let mut d = data();
        d.lines = lines;
        let mut evs = vec![
            node(StackKind::Native, 7, None, 5),
            node(StackKind::Native, 8, Some(7), 6),
            node(StackKind::Native, 9, Some(8), 0),
            node(StackKind::Native, 10, Some(9), 1),
            node(StackKind::Native, 11, Some(10), 2),
            node(StackKind::Native, 12, Some(11), 3),
            node(StackKind::Native, 13, Some(12), 4),
        ];
        for e in same_instant_python() {
            evs.push(match e {
                Event::InlinePyFrame {
                    id,
                    name,
                    file,
                    entry,
                    ..
                } => Event::InlinePyFrame {
                    id,
                    name,
                    file,
                    entry,
                    line: Some(if id == 5 { 12 } else { 0 }),
                },
                other => other,
            });
        }
        evs.push(Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_003_000_000),
            dt_us: vec![0, 10_000],
            stacks: vec![13; 2],
            incomplete: vec![],
            source: SampleSource::Agent,
        }));
        for e in &evs {
            d.add(e);
        }
        let st = analyze_all(&mut d);
        let folded = st.folded_role(
            Some(Role::Main),
            FoldOptions {
                view: View::Native,
                merge_workers: false,
            },
        );
        let want = if lines {
            "<module> (job.py:12);augment (job.py:?);"
        } else {
            "<module> (job.py);augment (job.py);"
        };
        assert!(folded.contains(want), "{folded}");
    }
}

/// Without `--lines` the tables are by function, exactly as an analysis
/// of the same recording without lines builds them, while the stacks
/// by line (what the profiles hold) keep each Python frame's line; with
/// `--lines` both are the same tables.
#[test]
fn stacks_by_line_are_kept_beside_the_tables_by_function() {
    // `augment` sampled on line 30, then 31 (frame 16), then 30 again.
    let build = |lines: bool, recorded: bool| {
        let mut d = data();
        d.lines = lines;
        let mut evs = Vec::new();
        for (base, augment) in [(7, 6), (20, 16)] {
            evs.push(node(StackKind::Native, base, None, 5));
            evs.push(node(StackKind::Native, base + 1, Some(base), augment));
            for k in 0..5 {
                evs.push(node(StackKind::Native, base + 2 + k, Some(base + 1 + k), k));
            }
        }
        for (id, name, entry, line) in [
            (5, "<module>", true, 12),
            (6, "augment", false, 30),
            (16, "augment", false, 31),
        ] {
            evs.push(Event::InlinePyFrame {
                id,
                name: name.into(),
                file: "/x/job.py".into(),
                entry,
                line: recorded.then_some(line),
            });
        }
        evs.extend(same_instant_python().into_iter().skip(2));
        evs.push(Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_003_000_000),
            dt_us: vec![0, 10_000, 10_000],
            stacks: vec![13, 26, 13],
            incomplete: vec![],
            source: SampleSource::Agent,
        }));
        for e in &evs {
            d.add(e);
        }
        analyze_all(&mut d)
    };
    let plain = build(false, false);
    let st = build(false, true);
    assert_eq!(st.frames, plain.frames);
    assert_eq!(st.stacks, plain.stacks);
    let ids = |st: &Stacks| -> Vec<(u32, u32)> {
        st.samples.iter().map(|s| (s.stack, s.py_stack)).collect()
    };
    assert_eq!(ids(&st), ids(&plain));
    assert_eq!(st.samples[0].py_stack, st.samples[1].py_stack);
    // (name, line) of each sample's Python frames, in both views.
    let lines = |st: &Stacks, view: View| -> Vec<Vec<(String, Option<u32>)>> {
        st.samples
            .iter()
            .map(|s| {
                st.lined_stack_ids(st.lined_view_stack(s, view))
                    .iter()
                    .map(|f| st.lined_frame(*f))
                    .filter(|f| f.class == FrameClass::Python)
                    .map(|f| (f.name.clone(), f.line))
                    .collect()
            })
            .collect()
    };
    let at = |l: u32| {
        vec![
            ("<module>".to_string(), Some(12)),
            ("augment".to_string(), Some(l)),
        ]
    };
    let want = vec![at(30), at(31), at(30)];
    for view in [View::Python, View::Native] {
        assert_eq!(lines(&st, view), want, "{view:?}");
        assert_eq!(lines(&build(true, true), view), want, "--lines, {view:?}");
    }
    assert_eq!(st.samples[0].lined_py_stack, st.samples[2].lined_py_stack);
    // Python frames without a recorded line have none.
    assert!(lines(&plain, View::Python)
        .iter()
        .flatten()
        .all(|f| f.1.is_none()));
    // With --lines the tables are by line already.
    let by_line = build(true, true);
    assert!(by_line.lined.is_none());
    assert_eq!(by_line.samples.len(), 3);
    assert_ne!(by_line.samples[0].py_stack, by_line.samples[1].py_stack);
}

/// A thread the perf reader left to the agent for some samples but the
/// analysis gives to perf (3 agent samples against 16 of perf's): each
/// sample not unwound takes the nearest unused agent sample within a
/// second, and keeps the marker when there is none.
#[test]
fn agent_samples_stand_in_for_perf_samples_not_unwound() {
    let mut d = data();
    let ms = 1_000_000u64;
    let evs = vec![
        node(StackKind::Native, 5, Some(4), 5),
        node(StackKind::Native, 6, Some(5), 6),
        Event::StackMarker {
            id: 20,
            marker: crate::vocab::stacks::MARKER_NOT_UNWOUND.into(),
        },
        node(StackKind::Native, 20, None, 20),
        // Perf at 2.00 s, every 10 ms: not unwound at 2.00, 2.01 and
        // 2.06–2.09 s.
        Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(2_000 * ms),
            dt_us: vec![
                0, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000,
                10_000,
            ],
            stacks: vec![20, 20, 4, 4, 4, 4, 20, 20, 20, 20, 4, 4],
            incomplete: vec![],
            source: SampleSource::Perf,
        }),
        // The agent at 1.999 and 2.002 s (both nearest to 2.00 s: the
        // second goes to 2.01 s), and 7 s later.
        Event::Samples(SampleBatch {
            kind: StackKind::Native,
            pid: Pid(10),
            tid: Tid(10),
            t0: MonoNs(1_999 * ms),
            dt_us: vec![0, 3_000, 7_000_000],
            stacks: vec![6; 3],
            incomplete: vec![],
            source: SampleSource::Agent,
        }),
    ];
    for e in same_instant_python().iter().chain(&evs) {
        d.add(e);
    }
    let st = analyze_all(&mut d);
    assert_eq!(st.report.samples, 16, "perf's count stays");
    assert_eq!(
        (st.report.not_unwound_stood_in, st.report.not_unwound),
        (2, 4)
    );
    // Its samples are perf's, but the agent sampled it: the agent's
    // count of periods not sampled in the kernel covers it, so its /proc
    // system time is not added again.
    let th = (Pid(10), Tid(10));
    assert!(!st.report.agent_threads.contains(&th));
    assert!(st.report.agent_seen_threads.contains(&th));
    let folded = st.folded_role(
        Some(Role::Main),
        FoldOptions {
            view: View::Native,
            merge_workers: false,
        },
    );
    let count = |needle: &str| -> u64 {
        folded
            .lines()
            .filter(|l| l.contains(needle))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(count("augment (job.py)"), 2, "{folded}");
    assert_eq!(count("[perf: not unwound"), 4, "{folded}");
    // The stand-ins keep the agent's times (1.999 and 2.002 s).
    let mut times: Vec<u64> = st
        .samples
        .iter()
        .filter(|s| s.attribution == Attribution::SameInstant)
        .map(|s| s.t.0 / ms)
        .collect();
    times.sort_unstable();
    assert_eq!(times, vec![1_999, 2_002]);
    assert!(st
        .samples
        .windows(2)
        .all(|w| (w[0].pid, w[0].tid, w[0].t) <= (w[1].pid, w[1].tid, w[1].t)));
}

#[test]
fn slices_nest_and_do_not_bridge_gaps() {
    let mut d = data();
    let mut st = analyze_all(&mut d);
    st.period_ns = 10_000_000;
    let thread = st.threads().next().unwrap();
    let slices = thread_slices(&st, thread, View::Native, 0);
    // Samples at 0, 10, 20 ms (deep, deep, shallow) then at 70 ms.
    let root: Vec<_> = slices.iter().filter(|s| s.depth == 0).collect();
    assert_eq!(root.len(), 2, "{slices:?}");
    assert_eq!(root[0].start, MonoNs(1_000_000_000));
    assert_eq!(root[0].end, MonoNs(1_030_000_000));
    assert_eq!(root[1].start, MonoNs(1_070_000_000));
    assert_eq!(root[1].end, MonoNs(1_080_000_000));
    // No slice is shorter than one period.
    assert!(slices.iter().all(|s| s.end.0 - s.start.0 >= 10_000_000));
    // Sorted by start, parents first.
    assert!(slices
        .windows(2)
        .all(|w| (w[0].start, w[0].depth) <= (w[1].start, w[1].depth)));
    // One level up, cells of 20 ms: the 40 ms pause is one empty cell
    // in a row at most, so it is bridged.
    let coarse = thread_slices(&st, thread, View::Native, 1);
    assert_eq!(coarse.iter().filter(|s| s.depth == 0).count(), 1);
}

#[test]
fn levels_are_bounded_whatever_the_period() {
    let mut d = data();
    let mut st = analyze_all(&mut d);
    for period in [0, 1, u64::MAX / 3] {
        st.period_ns = period;
        // No overflow, no division by zero, however coarse.
        for level in [0, 1, MAX_TRACE_LEVEL, u32::MAX] {
            let cell = st.cell_ns(level);
            assert!(cell >= 1);
            let thread = st.threads().next().unwrap();
            let slices = thread_slices(&st, thread, View::Native, level);
            assert!(!slices.is_empty());
        }
        assert!(st.max_level() <= MAX_TRACE_LEVEL);
    }
}

#[test]
fn deep_stacks_keep_their_innermost_frames() {
    let mut d = data();
    let mut st = analyze_all(&mut d);
    st.period_ns = 10_000_000;
    let deep: Vec<u32> = (0..TRACE_MAX_DEPTH as u32 + 100).map(|i| i % 3).collect();
    st.stacks[st.samples[0].stack as usize] = deep.clone();
    let thread = st.threads().next().unwrap();
    let slices = thread_slices(&st, thread, View::Native, 0);
    let first: Vec<_> = slices
        .iter()
        .filter(|s| s.start == MonoNs(1_000_000_000))
        .collect();
    assert_eq!(first.len(), TRACE_MAX_DEPTH);
    assert_eq!(first[0].name, OUTER_FRAMES_CUT);
    assert_eq!(st.name(first[0].name), "[outer frames not shown]");
    assert_eq!(first.last().unwrap().name, *deep.last().unwrap());
}

#[test]
fn gpu_idle_filter_selects_samples_inside_intervals() {
    let mut d = data();
    let st = analyze_all(&mut d);
    let o = FoldOptions::default();
    let f = st.folded_during(&[(MonoNs(1_015_000_000), MonoNs(1_025_000_000))], o);
    assert_eq!(f.lines().count(), 1, "{f}");
    assert!(f.ends_with(" 1\n"));
    assert!(st.folded_during(&[], o).is_empty());
}

#[test]
fn perf_completes_the_process_table() {
    let ms = 1_000_000;
    let h = crate::event::Header {
        cpus: 2,
        ..crate::event::Header::for_tests(MonoNs(1_000 * ms), Pid(10))
    };
    let comm = |t: u64, pid: i32, c: &str| Event::TaskComm {
        t: MonoNs(t * ms),
        pid: Pid(pid),
        tid: Tid(pid),
        comm: c.into(),
        exec: true,
    };
    let fork = |t: u64, pid: i32, ppid: i32| Event::TaskFork {
        t: MonoNs(t * ms),
        pid: Pid(pid),
        tid: Tid(pid),
        ppid: Pid(ppid),
        ptid: Tid(ppid),
    };
    let evs = vec![
        Event::WindowStart {
            t: MonoNs(1_000 * ms),
        },
        comm(1_001, 10, "bash"),
        // Forked while the job was still a shell wrapper.
        fork(1_002, 11, 10),
        comm(1_003, 10, "python3"),
        Event::Process {
            t: MonoNs(1_100 * ms),
            pid: Pid(10),
            ppid: Pid(1),
            start_boot_ns: 0,
            comm: "python3".into(),
            cmdline: vec!["python3".into(), "train.py".into()],
            exe: None,
            rank_env: None,
        },
        // A worker forked by python that lives 150 ms, unseen by /proc.
        fork(1_200, 12, 10),
        Event::TaskExit {
            t: MonoNs(1_350 * ms),
            pid: Pid(12),
            tid: Tid(12),
        },
        Event::Footer(crate::event::Footer {
            t: MonoNs(2_000 * ms),
            status: crate::event::JobStatus::Exited(0),
            reason: "job exited".into(),
            dropped_events: 0,
            profiler_cpu_ns: 0,
            profiler_max_rss_bytes: 0,
            profiler_cpu_ns_by_component: Default::default(),
            end_anchor: None,
            recording_error: None,
        }),
    ];
    let a = super::super::analyze_events(h, evs.into_iter());
    let w = &a.processes[&Pid(12)];
    assert_eq!(w.cmdline, vec!["python3", "train.py"]);
    assert_eq!(
        (w.first_seen, w.exited),
        (MonoNs(1_200 * ms), Some(MonoNs(1_350 * ms)))
    );
    assert_eq!(w.role, super::super::Role::Worker);
    let shell = &a.processes[&Pid(11)];
    assert_eq!(shell.comm, "bash");
    assert!(shell.cmdline.is_empty());
    assert_eq!(shell.role, super::super::Role::Other);
}
