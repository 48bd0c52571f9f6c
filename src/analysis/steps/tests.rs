use super::*;

#[test]
fn gpu_gap_stretches_of_several_steps_are_split_and_slow_steps_are_not() {
    // Steps every 450 ms: a 300 ms idle gap, 150 ms busy. The gap of
    // the third step was not seen (no whole driver sample in it); the
    // sixth step waited 450 ms longer for its input (a slow step, as long
    // as two: not split, its gap is not ordinary).
    let ms = |x: f64| MonoNs((x * 1e6) as u64);
    let mut gaps = Vec::new();
    let mut t = 0.0;
    for i in 0..9 {
        let idle = if i == 5 { 750.0 } else { 300.0 };
        if i != 2 {
            gaps.push((ms(t), ms(t + idle)));
        }
        t += idle + 150.0;
    }
    let (iv, merged) = gap_steps(&gaps);
    assert_eq!(merged, 1);
    let d: Vec<u64> = iv.iter().map(|w| (w.1 .0 - w.0 .0) / 1_000_000).collect();
    assert_eq!(d, vec![450, 450, 450, 450, 450, 900, 450, 450]);
    // Without the split the spacing is not regular enough for steps.
    let starts: Vec<f64> = gaps.windows(2).map(|w| w[1].0.secs_since(w[0].0)).collect();
    let split: Vec<f64> = iv.iter().map(|w| w.1.secs_since(w.0)).collect();
    assert!(regularity(&split) >= MIN_REGULARITY);
    assert!(regularity(&starts) < regularity(&split));
}

/// The loop thread's frames in one step: (frame, sampled seconds under
/// it), and the step's sampled seconds.
fn frames(sampled_s: f64, fs: &[(&str, f64)]) -> Metrics {
    Metrics {
        frames: fs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        sampled_s,
        ..Default::default()
    }
}

#[test]
fn a_slow_steps_own_frames_leave_out_the_loops_trunk() {
    // Typical steps barely compute: one sample in three steps, under
    // the loop's trunk. The slow step saves a checkpoint.
    let mut typical = vec![frames(0.0, &[]); 20];
    for t in typical.iter_mut().step_by(3) {
        *t = frames(
            0.01,
            &[("main (train.py)", 0.01), ("forward (model.py)", 0.01)],
        );
    }
    let slow = frames(
        0.30,
        &[
            ("main (train.py)", 0.30),
            ("save_checkpoint (train.py)", 0.28),
            ("crc32_16bytes", 0.20),
            ("forward (model.py)", 0.02),
        ],
    );
    let vs = Against {
        typical: &typical,
        excess: 0.4,
    };
    let mut names: Vec<&str> = specific_frames(&slow, &vs)
        .into_iter()
        .map(|x| x.1.as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["crc32_16bytes", "save_checkpoint (train.py)"]);
    // Typical steps that were never sampled cannot tell the trunk.
    let unsampled = vec![frames(0.0, &[]); 20];
    let vs = Against {
        typical: &unsampled,
        ..vs
    };
    assert!(specific_frames(&slow, &vs)
        .iter()
        .any(|x| x.1 == "main (train.py)"));
    // Nothing when no frame took a big share of the extra time.
    let vs = Against {
        typical: &typical,
        excess: 4.0,
    };
    assert!(specific_frames(&slow, &vs).is_empty());
}

#[test]
fn slow_step_patterns() {
    assert_eq!(
        pattern(&[4, 9, 14, 19], 1..20).as_deref(),
        Some("every 5th step (steps 4, 9, …)")
    );
    assert_eq!(pattern(&[1, 2, 3], 0..10), None);
    assert_eq!(pattern(&[0, 10], 0..20), None);
    assert_eq!(
        pattern(&[2, 4, 6, 8, 11], 1..12).as_deref(),
        Some("mostly every 2nd step")
    );
    // One stray slow step, at the start or between two periodic ones.
    for idx in [
        &[1, 4, 9, 14, 19][..],
        &[4, 9, 12, 14, 19],
        &[4, 9, 14, 19, 20],
    ] {
        assert_eq!(
            pattern(idx, 1..21).as_deref(),
            Some("mostly every 5th step"),
            "{idx:?}"
        );
    }
    // A periodic step that was not slow once still makes the pattern.
    assert_eq!(
        pattern(&[4, 9, 19, 24], 1..25).as_deref(),
        Some("mostly every 5th step")
    );
    // Every 10th is not "every 5th with holes".
    assert_eq!(
        pattern(&[4, 14, 24, 34], 1..35).as_deref(),
        Some("every 10th step (steps 4, 14, …)")
    );
    // Scattered slow steps make no pattern.
    assert_eq!(pattern(&[3, 7, 8, 20, 21, 33], 1..40), None);
    // Three slow steps 5 apart are every 5th step of a 15-step run,
    // not of a run of a thousand, where the stride went on fast.
    assert_eq!(
        pattern(&[4, 9, 14], 1..15).as_deref(),
        Some("every 5th step (steps 4, 9, …)")
    );
    assert_eq!(pattern(&[4, 9, 14], 1..1000), None);
    assert_eq!(ordinal(21), "21st");
    assert_eq!(ordinal(12), "12th");
}

#[test]
fn steps_run_from_start_to_next_start() {
    let r = |a: u64, b: u64| (MonoNs(a), MonoNs(b));
    assert_eq!(
        intervals_from_starts(&[r(0, 5), r(8, 12), r(20, 22)]),
        vec![r(0, 8), r(8, 20), r(20, 22)]
    );
}

#[test]
fn regular_spacing_survives_a_slow_step_every_fifth() {
    let mut v = vec![0.1; 20];
    for i in (4..20).step_by(5) {
        v[i] = 0.5;
    }
    assert!(regularity(&v) >= MIN_REGULARITY);
    let noise: Vec<f64> = (0..20).map(|i| [0.05, 0.3, 0.1, 0.9][i % 4]).collect();
    assert!(regularity(&noise) < MIN_REGULARITY);
    assert!(local_regularity(&noise) < MIN_LOCAL_REGULARITY);
}

/// Steps 2.5× slower while another program's load lasted, then back (the
/// gaps' periods of a run on a CI host): the median fits too few, their
/// neighbours all of them.
#[test]
fn a_drifting_step_rate_is_still_steps() {
    let v = [
        1.24, 1.61, 1.60, 1.07, 0.90, 0.71, 0.68, 0.73, 0.66, 0.61, 0.70,
    ];
    assert!(regularity(&v) < MIN_REGULARITY);
    assert!(local_regularity(&v) >= MIN_LOCAL_REGULARITY);
}

#[test]
fn step_like_names() {
    assert!(step_like("train_step"));
    assert!(step_like("iteration N"));
    assert!(!step_like("epoch N"));
    assert!(!step_like("forward"));
}

/// Entries (3 samples each) from spacings in ms, starting at 1 s.
fn starts(spacings_ms: &[u64]) -> Vec<Run> {
    let mut t = 1_000_000_000;
    let run = |t| Run {
        start: MonoNs(t),
        samples: 3,
    };
    let mut v = vec![run(t)];
    for ms in spacings_ms {
        t += ms * 1_000_000;
        v.push(run(t));
    }
    v
}

#[test]
fn stack_steps_take_the_backward_pass_over_a_coincidence() {
    // Samples at 99 Hz.
    const PERIOD: u64 = 10_101_010;
    // A real PyTorch loop fed by two DataLoader workers: one batch
    // waited for, the next ready (short-long-short), 50 steps.
    let alternating: Vec<u64> = (0..49)
        .map(|i| if i % 2 == 0 { 110 } else { 260 })
        .collect();
    // Imports of several modules named utils.py, 3 of 4 spacings alike.
    let imports = [1200, 1250, 1230, 400];
    let mut runs: HashMap<&str, Vec<Run>> = HashMap::new();
    runs.insert("Tensor.backward (_tensor.py)", starts(&alternating));
    runs.insert("Sequential.forward (container.py)", starts(&alternating));
    runs.insert("<module> (utils.py)", starts(&imports));
    assert_eq!(
        choose_stack_step(&runs, PERIOD),
        Some("Tensor.backward (_tensor.py)")
    );
    // Without a step marker, an alternating spacing is not taken for
    // a loop, and neither is a handful of entries.
    runs.remove("Tensor.backward (_tensor.py)");
    assert_eq!(choose_stack_step(&runs, PERIOD), None);
    // A module body never, however regular; any other regular function.
    let regular = [200u64; 20];
    runs.insert("<module> (data.py)", starts(&regular));
    assert_eq!(choose_stack_step(&runs, PERIOD), None);
    runs.insert("train_one (train.py)", starts(&regular));
    assert_eq!(
        choose_stack_step(&runs, PERIOD),
        Some("train_one (train.py)")
    );
    // A marker still comes first, even the less regular one.
    runs.insert("LitModel.training_step (model.py)", starts(&alternating));
    assert_eq!(
        choose_stack_step(&runs, PERIOD),
        Some("LitModel.training_step (model.py)")
    );
    // Steps shorter than 3 sampling periods are not resolved.
    let mut fast = HashMap::new();
    fast.insert("Tensor.backward (_tensor.py)", starts(&[20u64; 30]));
    assert_eq!(choose_stack_step(&fast, PERIOD), None);
    // An entry shorter than a sampling period can go unsampled, and its
    // step would be counted with the one before: a function seen
    // mostly one sample at a time is no step boundary, however regular.
    let mut brief = HashMap::new();
    let mut runs = starts(&regular);
    for r in runs.iter_mut().take(11) {
        r.samples = 1;
    }
    brief.insert("Tensor.backward (_tensor.py)", runs.clone());
    assert_eq!(choose_stack_step(&brief, PERIOD), None);
    // 10 of 21: typically two samples or more.
    runs[0].samples = 2;
    brief.insert("Tensor.backward (_tensor.py)", runs);
    assert_eq!(
        choose_stack_step(&brief, PERIOD),
        Some("Tensor.backward (_tensor.py)")
    );
    // Spacings of two steps: entries that went unsampled. One in 20
    // passes, three do not.
    let mut missed = [200u64; 20];
    missed[7] = 400;
    let mut m = HashMap::new();
    m.insert("Tensor.backward (_tensor.py)", starts(&missed));
    assert_eq!(
        choose_stack_step(&m, PERIOD),
        Some("Tensor.backward (_tensor.py)")
    );
    missed[11] = 410;
    missed[15] = 390;
    m.insert("Tensor.backward (_tensor.py)", starts(&missed));
    assert_eq!(choose_stack_step(&m, PERIOD), None);
}

#[test]
fn step_markers() {
    assert!(step_marker("Tensor.backward (_tensor.py)"));
    assert!(step_marker("Trainer.training_step (trainer.py)"));
    assert!(step_marker("main.<locals>.train_step (train.py)"));
    assert!(!step_marker("backward (__init__.py)"));
    assert!(!step_marker("Function.backward (function.py)"));
    assert!(!step_marker("train_step_fn (train.py)"));
}
