//! Interning of stacks into a prefix tree and batching of samples, shared by
//! the native (perf) and Python (py-spy) samplers.
//!
//! A stack is recorded once as a chain of `StackNode { id, parent, frame }`
//! events; a sample is then a (time delta, node id) pair inside a per-thread
//! `Samples` batch. This is what keeps an hour of 16 busy threads within the
//! recording budget.

use std::collections::HashMap;
use std::hash::Hash;

use crate::event::{Event, MonoNs, Pid, SampleBatch, SampleSource, StackKind, Tid};
use crate::record::Sink;

/// Samples of one thread are flushed after this many, or after
/// [`FLUSH_AFTER_NS`] since the first of the batch.
const BATCH_MAX: usize = 4096;
pub const FLUSH_AFTER_NS: u64 = 1_000_000_000;

/// Frame and stack interner of one sampler. `F` is the frame key.
pub struct Interner<F> {
    kind: StackKind,
    frames: HashMap<F, u32>,
    nodes: HashMap<(Option<u32>, u32), u32>,
    batches: HashMap<(Pid, Tid, SampleSource), Batch>,
    pub samples: u64,
}

struct Batch {
    t0: MonoNs,
    last_us: u64,
    dt_us: Vec<u32>,
    stacks: Vec<u32>,
    incomplete: Vec<u32>,
}

impl<F: Hash + Eq + Clone> Interner<F> {
    pub fn new(kind: StackKind) -> Self {
        Interner {
            kind,
            frames: HashMap::new(),
            nodes: HashMap::new(),
            batches: HashMap::new(),
            samples: 0,
        }
    }

    /// Id of a frame; `announce` emits the frame's event the first time.
    pub fn frame(&mut self, key: &F, sink: &Sink, announce: impl FnOnce(u32, &F) -> Event) -> u32 {
        if let Some(id) = self.frames.get(key) {
            return *id;
        }
        let id = self.frames.len() as u32;
        sink.send_blocking(announce(id, key));
        self.frames.insert(key.clone(), id);
        id
    }

    /// Id of the stack whose frames, outermost first, are `frames`.
    pub fn stack(&mut self, frames_root_first: &[u32], sink: &Sink) -> Option<u32> {
        let mut parent = None;
        for &f in frames_root_first {
            let next_id = self.nodes.len() as u32;
            let id = *self.nodes.entry((parent, f)).or_insert_with(|| {
                sink.send_blocking(Event::StackNode {
                    kind: self.kind,
                    id: next_id,
                    parent,
                    frame: f,
                });
                next_id
            });
            parent = Some(id);
        }
        parent
    }

    /// Add a sample to its thread's batch; flushes full or old batches.
    /// `complete`: the stack reaches the thread's root.
    pub fn sample(
        &mut self,
        pid: Pid,
        tid: Tid,
        t: MonoNs,
        stack: u32,
        complete: bool,
        sink: &Sink,
    ) {
        self.sample_from(SampleSource::Perf, pid, tid, t, stack, complete, sink)
    }

    /// [`Interner::sample`] for a given sampler: each has its own batches.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_from(
        &mut self,
        source: SampleSource,
        pid: Pid,
        tid: Tid,
        t: MonoNs,
        stack: u32,
        complete: bool,
        sink: &Sink,
    ) {
        self.samples += 1;
        let us = t.0 / 1000;
        let key = (pid, tid, source);
        let b = self.batches.entry(key).or_insert_with(|| Batch {
            t0: MonoNs(us * 1000),
            last_us: us,
            dt_us: Vec::new(),
            stacks: Vec::new(),
            incomplete: Vec::new(),
        });
        // Records are time-ordered, but clamp anyway: a delta is unsigned.
        let d = us.saturating_sub(b.last_us).min(u32::MAX as u64) as u32;
        b.last_us += d as u64;
        b.dt_us.push(d);
        if !complete {
            b.incomplete.push(b.stacks.len() as u32);
        }
        b.stacks.push(stack);
        if b.stacks.len() >= BATCH_MAX || t.0.saturating_sub(b.t0.0) >= FLUSH_AFTER_NS {
            let b = self.batches.remove(&key).expect("batch present");
            self.emit(key, b, sink);
        }
    }

    /// Flush batches older than `FLUSH_AFTER_NS` at time `now` (all of them
    /// with `None`), so that a crash loses at most about a second.
    pub fn flush(&mut self, now: Option<MonoNs>, sink: &Sink) {
        let due: Vec<(Pid, Tid, SampleSource)> = self
            .batches
            .iter()
            .filter(|(_, b)| now.map_or(true, |n| n.0.saturating_sub(b.t0.0) >= FLUSH_AFTER_NS))
            .map(|(k, _)| *k)
            .collect();
        let mut due = due;
        due.sort();
        for k in due {
            if let Some(b) = self.batches.remove(&k) {
                self.emit(k, b, sink);
            }
        }
    }

    fn emit(&self, (pid, tid, source): (Pid, Tid, SampleSource), b: Batch, sink: &Sink) {
        sink.send(Event::Samples(SampleBatch {
            kind: self.kind,
            pid,
            tid,
            source,
            t0: b.t0,
            dt_us: b.dt_us,
            stacks: b.stacks,
            incomplete: b.incomplete,
        }));
    }

    /// Every interned frame key with its id.
    pub fn frames(&self) -> impl Iterator<Item = (&F, u32)> {
        self.frames.iter().map(|(k, v)| (k, *v))
    }
}
