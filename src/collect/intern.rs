//! Interning of stacks into a prefix tree and batching of samples, shared by
//! the native (perf) and Python (py-spy) samplers.
//!
//! A stack is recorded once as a chain of `StackNode { id, parent, frame }`
//! events; a sample is then a (time delta, node id) pair inside a per-thread
//! `Samples` batch. This is what keeps an hour of 16 busy threads within the
//! recording budget.

use rustc_hash::FxHashMap as HashMap;
use std::hash::Hash;

use crate::event::{Event, MonoNs, Pid, SampleBatch, SampleSource, StackKind, Tid};
use crate::record::Sink;

/// Samples of one thread are flushed after this many, or after
/// [`FLUSH_AFTER_NS`] since the first of the batch.
const BATCH_MAX: usize = 4096;
pub const FLUSH_AFTER_NS: u64 = 1_000_000_000;
/// Threads whose last stack [`Interner::stack_of`] remembers; past this
/// many the memory is dropped and rebuilt (only speed depends on it).
const PATHS_MAX: usize = 4096;

/// Frame and stack interner of one sampler. `F` is the frame key.
pub struct Interner<F> {
    kind: StackKind,
    frames: HashMap<F, u32>,
    nodes: HashMap<(Option<u32>, u32), u32>,
    batches: HashMap<(Pid, Tid, SampleSource), Batch>,
    /// The last stack interned by [`Interner::stack_of`] per thread: its
    /// frame keys and their node ids, outermost first.
    paths: HashMap<Tid, Path<F>>,
    pub samples: u64,
}

struct Path<F> {
    keys: Vec<F>,
    nodes: Vec<u32>,
}

impl<F> Default for Path<F> {
    fn default() -> Self {
        Path {
            keys: Vec::new(),
            nodes: Vec::new(),
        }
    }
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
            frames: HashMap::default(),
            nodes: HashMap::default(),
            batches: HashMap::default(),
            paths: HashMap::default(),
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
            parent = Some(self.node(parent, f, sink));
        }
        parent
    }

    fn node(&mut self, parent: Option<u32>, frame: u32, sink: &Sink) -> u32 {
        let next_id = self.nodes.len() as u32;
        *self.nodes.entry((parent, frame)).or_insert_with(|| {
            sink.send_blocking(Event::StackNode {
                kind: self.kind,
                id: next_id,
                parent,
                frame,
            });
            next_id
        })
    }

    /// Id of the stack whose frame keys, outermost first, are `keys` (each
    /// key through [`Interner::frame`], then [`Interner::stack`]), sampled
    /// in thread `tid`. Consecutive samples of a thread share most of their
    /// stack: the part shared with its previous stack is taken from that one
    /// without a lookup (two hash lookups per frame otherwise, most of the
    /// interning). Ids never change once given, so a remembered path stays
    /// right whatever happened since.
    pub fn stack_of(
        &mut self,
        tid: Tid,
        keys: &[F],
        sink: &Sink,
        mut announce: impl FnMut(u32, &F) -> Event,
    ) -> Option<u32> {
        let mut path = self.paths.remove(&tid).unwrap_or_default();
        let same = path
            .keys
            .iter()
            .zip(keys)
            .take_while(|(a, b)| a == b)
            .count();
        path.keys.truncate(same);
        path.nodes.truncate(same);
        let mut parent = path.nodes.last().copied();
        for key in &keys[same..] {
            let f = self.frame(key, sink, &mut announce);
            let id = self.node(parent, f, sink);
            path.keys.push(key.clone());
            path.nodes.push(id);
            parent = Some(id);
        }
        if self.paths.len() >= PATHS_MAX {
            self.paths.clear();
        }
        self.paths.insert(tid, path);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Interning key by key and through a thread's remembered path gives
    /// the same ids and announces each frame and node once, whatever the
    /// order of threads and stacks.
    #[test]
    fn remembered_paths_give_the_same_ids_as_lookups() {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tap_seen = seen.clone();
        let (sink, writer) = crate::record::start_writer_with_tap(
            dir.path(),
            Some(Box::new(move |ev: &Event| {
                if let Event::StackNode {
                    kind,
                    id,
                    parent,
                    frame,
                } = ev
                {
                    tap_seen.lock().unwrap().push((
                        *kind == StackKind::Python,
                        *id,
                        *parent,
                        *frame,
                    ));
                }
            })),
        )
        .unwrap();
        let stacks: [&[&str]; 6] = [
            &["main", "run", "load", "decode"],
            &["main", "run", "load", "resize"],
            &["main", "run"],
            &["main", "run", "load", "decode"],
            &["main", "idle"],
            &["other", "run", "load"],
        ];
        let mut plain = Interner::<String>::new(StackKind::Native);
        // The kind tells the two interners' nodes apart in the recording.
        let mut cached = Interner::<String>::new(StackKind::Python);
        let mut announced = 0;
        for (i, stack) in stacks.iter().cycle().take(40).enumerate() {
            let keys: Vec<String> = stack.iter().map(|s| s.to_string()).collect();
            let ids: Vec<u32> = keys
                .iter()
                .map(|k| {
                    plain.frame(k, &sink, |id, _| Event::StackMarker {
                        id,
                        marker: String::new(),
                    })
                })
                .collect();
            let want = plain.stack(&ids, &sink);
            let tid = Tid((i % 3) as i32);
            let got = cached.stack_of(tid, &keys, &sink, |id, _| {
                announced += 1;
                Event::StackMarker {
                    id,
                    marker: String::new(),
                }
            });
            assert_eq!(got, want, "stack {i}: {stack:?}");
        }
        // Seven distinct frames, each announced once.
        assert_eq!(announced, 7);
        assert_eq!(cached.frames().count(), 7);
        drop(sink);
        let (stats, _) = writer.finish();
        stats.unwrap();
        // Both interners announced the same nodes, each once.
        let nodes = seen.lock().unwrap().clone();
        let of = |python: bool| -> Vec<(u32, Option<u32>, u32)> {
            nodes
                .iter()
                .filter(|n| n.0 == python)
                .map(|n| (n.1, n.2, n.3))
                .collect()
        };
        let (a, mut b) = (of(false), of(true));
        // main, main/run, …/load, …/decode, …/resize, main/idle, other,
        // other/run, other/run/load.
        assert_eq!(a.len(), 9, "{a:?}");
        assert_eq!(a, b, "announced in the same order");
        b.dedup_by_key(|n| n.0);
        assert_eq!(a.len(), b.len());
    }
}
