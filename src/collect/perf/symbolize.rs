//! Symbolization of native frames, as they are first sampled.
//!
//! Frames are (file, file offset) pairs, so the processes need not exist any
//! more: blazesym reads the ELF file (`Source::Elf` + `Input::FileOffset`)
//! with demangling. Frames it cannot name are listed as tried; the analysis
//! shows them as `[file+0xoffset]`.
//!
//! Why as they come, on a thread of its own: names written only when
//! recording ends are lost when gpuprof is killed (the OOM killer, a
//! scheduler's kill), and the report then shows raw addresses and cannot
//! attach Python frames (it finds the interpreter's frames by name). Here a
//! frame is named within a fraction of a second of its first sample, off the perf
//! reader's path, and the `symbols` event goes into the recording at once.
//! The symbolizer keeps each file it parsed, so the cost is the same as
//! naming everything at the end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::event::Event;
use crate::record::Sink;

/// New frames are named in batches, at most this often: on a loader job
/// a few new frames still turn up in every 200 ms long after start-up, and
/// each batch wakes this thread and looks at each file named again.
const BATCH_EVERY: Duration = Duration::from_millis(500);
/// Names per `symbols` event.
const CHUNK: usize = 2048;

pub(super) fn symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(true)
        .build()
}

/// Names for `(frame id, offset)` lists grouped by file path. Returns
/// (frame id, name) for every frame that could be named.
pub(super) fn symbolize_with(
    symbolizer: &Symbolizer,
    by_file: &BTreeMap<String, Vec<(u32, u64)>>,
) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for (path, frames) in by_file {
        if !path.starts_with('/') || frames.is_empty() {
            continue;
        }
        let mut elf = Elf::new(path.as_str());
        // DWARF would add names of static functions in binaries that keep
        // their debug info, at a large parsing cost for big libraries; the
        // ELF symbol tables name almost every hot function.
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        let offsets: Vec<u64> = frames.iter().map(|f| f.1).collect();
        let Ok(syms) = symbolizer.symbolize(&src, Input::FileOffset(&offsets)) else {
            continue;
        };
        for ((id, _), sym) in frames.iter().zip(syms) {
            if let Symbolized::Sym(s) = sym {
                out.push((*id, s.name.into_owned()));
            }
        }
    }
    out.sort();
    out
}

/// A frame to name: looked up in its file, or already named (JIT code
/// named by a perf map).
enum Item {
    Lookup(u32, String, u64),
    Named(u32, String),
}

/// The symbolizer thread: frames in, `symbols` events out.
pub struct Streamer {
    tx: Option<Sender<Item>>,
    thread: Option<std::thread::JoinHandle<Duration>>,
    /// Set by `finish`: the last batch is not waited for. An unpark alone
    /// is not enough: the channel's own blocking `recv` parks the thread
    /// too, and can take the wake-up meant for the batch pause (the end of
    /// a run then waited out the whole pause, 0.5 s, one run in two).
    finishing: Arc<AtomicBool>,
}

impl Streamer {
    pub fn start(sink: Sink) -> Streamer {
        let (tx, rx) = std::sync::mpsc::channel();
        let finishing = Arc::new(AtomicBool::new(false));
        let f2 = finishing.clone();
        let thread = std::thread::Builder::new()
            .name("gpuprof-symbols".into())
            .spawn(move || {
                let _cost = crate::selfcost::Charge::new("symbolizer");
                run(rx, sink, &f2)
            })
            .ok();
        Streamer {
            tx: thread.is_some().then_some(tx),
            thread,
            finishing,
        }
    }

    /// Queue a newly sampled frame (file path, file offset).
    pub fn add(&self, id: u32, path: &str, offset: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Item::Lookup(id, path.to_string(), offset));
        }
    }

    /// Queue a newly sampled frame whose name is known already.
    pub fn add_named(&self, id: u32, name: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Item::Named(id, name.to_string()));
        }
    }

    /// Name what is queued, write it, and stop. Returns the thread's CPU
    /// time (its busy time where the clock is not available).
    pub fn finish(mut self) -> Duration {
        self.finishing.store(true, Ordering::Release);
        drop(self.tx.take());
        self.thread
            .take()
            .and_then(|t| {
                t.thread().unpark();
                t.join().ok()
            })
            .unwrap_or_default()
    }
}

fn add(
    item: Item,
    pending: &mut BTreeMap<String, Vec<(u32, u64)>>,
    named: &mut Vec<(u32, String)>,
) {
    match item {
        Item::Lookup(id, path, offset) => pending.entry(path).or_default().push((id, offset)),
        Item::Named(id, name) => named.push((id, name)),
    }
}

fn run(rx: Receiver<Item>, sink: Sink, finishing: &AtomicBool) -> Duration {
    let symbolizer = symbolizer();
    let mut pending: BTreeMap<String, Vec<(u32, u64)>> = BTreeMap::new();
    let mut named: Vec<(u32, String)> = Vec::new();
    let mut busy = Duration::ZERO;
    let mut since = Instant::now();
    let mut open = true;
    while open {
        // One wake-up per batch, not one per new frame (50 a second on a
        // loader job, each taken from the job on a busy machine): sleep
        // out the batch's time, take what gathered, and block only when
        // nothing did. `finish` unparks the thread so that the last batch
        // does not wait.
        if !finishing.load(Ordering::Acquire) {
            std::thread::park_timeout(BATCH_EVERY.saturating_sub(since.elapsed()));
        }
        loop {
            match rx.try_recv() {
                Ok(item) => add(item, &mut pending, &mut named),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if open && pending.is_empty() && named.is_empty() {
            // Nothing new: block until a frame comes; its batch then
            // gathers for BATCH_EVERY.
            match rx.recv() {
                Ok(item) => add(item, &mut pending, &mut named),
                Err(_) => open = false,
            }
            since = Instant::now();
            continue;
        }
        if !pending.is_empty() || !named.is_empty() {
            let t = Instant::now();
            let mut names = symbolize_with(&symbolizer, &pending);
            let mut tried: Vec<u32> = pending.values().flatten().map(|f| f.0).collect();
            tried.sort_unstable();
            let found: std::collections::HashSet<u32> = names.iter().map(|n| n.0).collect();
            let mut unnamed: Vec<u32> = tried.into_iter().filter(|i| !found.contains(i)).collect();
            names.append(&mut named);
            names.sort();
            let mut names = names.as_slice();
            // Every frame tried is in exactly one event, named or not.
            while !names.is_empty() || !unnamed.is_empty() {
                let k = names.len().min(CHUNK);
                let rest = CHUNK - k;
                let u: Vec<u32> = unnamed.drain(..rest.min(unnamed.len())).collect();
                sink.send_blocking(Event::Symbols {
                    names: names[..k].to_vec(),
                    unnamed: u,
                });
                names = &names[k..];
            }
            pending.clear();
            busy += t.elapsed();
        }
        since = Instant::now();
    }
    crate::selfcost::thread_cpu_ns().map_or(busy, Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    use super::Streamer;
    use crate::event::Event;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    type Seen = Arc<Mutex<Vec<(u32, String)>>>;

    /// Names the symbolizer sent, as the writer saw them.
    fn recorder() -> (
        tempfile::TempDir,
        crate::record::Sink,
        crate::record::Writer,
        Seen,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let tap: crate::record::Tap = Box::new(move |ev: &Event| {
            if let Event::Symbols { names, .. } = ev {
                s2.lock().unwrap().extend(names.iter().cloned());
            }
        });
        let (sink, writer) = crate::record::start_writer_with_tap(dir.path(), Some(tap)).unwrap();
        (dir, sink, writer, seen)
    }

    #[test]
    fn a_lone_frame_is_named_without_waiting_for_another() {
        let (_dir, sink, writer, seen) = recorder();
        let st = Streamer::start(sink.clone());
        std::thread::sleep(Duration::from_millis(300));
        st.add_named(7, "lone");
        let t0 = Instant::now();
        while seen.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(*seen.lock().unwrap(), vec![(7, "lone".to_string())]);
        // The last frame before the end is named too.
        st.add_named(8, "last");
        st.finish();
        drop(sink);
        drop(writer.finish());
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
