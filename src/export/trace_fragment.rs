//! One recording's part of a merged trace (`gpuprof merge`).
//!
//! A fragment is written one event per line as `<ts>\t<event without ts>`
//! (`-` for events without a time; a last `meta\t…` line), with the
//! recording's PIDs and TIDs renumbered into a range of its own, so that the
//! merge can shift every timestamp once all clock offsets are known and
//! stream the parts into one `trace.json`.
//!
//! At the `timeline` level of detail (the merge's default) the fragment
//! keeps what lines nodes and ranks up against each other — per process
//! CPU, IO, memory and GPU counters, machine-wide counters, GPU counters
//! with their idle gaps and clock-event slices, the training steps — and
//! leaves out the per-thread tracks (stack slices, scheduler states,
//! per-thread and per-CPU counters, NVTX ranges), which stay in each node's
//! own `trace.json`; counters are averaged over buckets sized so that the
//! merged trace fits its budget.

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::{json, Value};

use super::trace_ids::{GPU_PID_BASE, STEPS_TID, SYSTEM_PID};

/// How one recording's trace becomes part of a merged trace.
#[derive(Clone, Debug)]
pub struct Fragment {
    /// The recording's index in the merge (below [`Fragment::MAX_SLOTS`]).
    pub slot: u32,
    /// Prepended to process names: "node-a · ".
    pub prefix: String,
    pub sort_base: i64,
    /// None: every event; Some: the timeline level of detail, counters
    /// averaged over buckets of this many µs.
    pub timeline_bucket_us: Option<f64>,
    /// The counter track being averaged.
    agg: Option<Agg>,
    /// The recording's PIDs and TIDs (real and synthetic) renumbered, in
    /// order of appearance, from the start of its range.
    ids: HashMap<i64, i64>,
}

/// Averaging state of one counter track.
#[derive(Clone, Debug)]
struct Agg {
    pid: i64,
    name: String,
    /// The counter's arg key (Perfetto names the track "<name> <key>").
    key: String,
    /// The event as received (pid and names already moved).
    template: Value,
    bucket: f64,
    /// Start of the current bucket, integral of value × time in it, and the
    /// time it covers.
    b0: f64,
    sum: f64,
    covered: f64,
    last: Option<(f64, f64)>,
    emitted: Option<f64>,
}

impl Fragment {
    /// Perfetto reads PIDs and TIDs as u32: each recording gets 2^22 of
    /// them (its processes and threads, renumbered), above the first 2^22.
    pub const MAX_SLOTS: u32 = 1023;
    const SPAN_BITS: u32 = 22;

    pub fn new(
        slot: u32,
        prefix: String,
        sort_base: i64,
        timeline_bucket_us: Option<f64>,
    ) -> Fragment {
        Fragment {
            slot,
            prefix,
            sort_base,
            timeline_bucket_us,
            agg: None,
            ids: HashMap::new(),
        }
    }

    /// The merged trace's id of one of the recording's PIDs or TIDs. They
    /// share one numbering (a process's main thread has its PID as TID;
    /// the synthetic ones — machine, GPUs, state and NVTX tracks — lie
    /// outside the kernel's PIDs), so one map keeps them apart.
    pub fn id(&mut self, id: i64) -> io::Result<i64> {
        if let Some(v) = self.ids.get(&id) {
            return Ok(*v);
        }
        let n = self.ids.len() as i64;
        if n >= 1 << Self::SPAN_BITS {
            return Err(io::Error::other(format!(
                "more than {} processes and threads in one recording: too many for one merged trace",
                1u64 << Self::SPAN_BITS
            )));
        }
        let v = ((self.slot as i64 + 1) << Self::SPAN_BITS) + n;
        self.ids.insert(id, v);
        Ok(v)
    }

    fn is_gpu(pid: i64) -> bool {
        (GPU_PID_BASE..GPU_PID_BASE + (1 << 24)).contains(&pid)
    }

    /// Whether the timeline level of detail keeps an event (by its
    /// recording's own PID).
    fn keeps(pid: i64, v: &Value) -> bool {
        let ph = v["ph"].as_str().unwrap_or("");
        let name = v["name"].as_str().unwrap_or("");
        // GPUs, and the training steps (one track per recording): what
        // lines nodes up against each other.
        if Self::is_gpu(pid) || v["tid"].as_i64() == Some(STEPS_TID) {
            return true;
        }
        match ph {
            // Process names, and the main thread's name (Perfetto shows a
            // process by its main thread when it has nothing else).
            "M" => {
                name == "process_name"
                    || name == "process_sort_index"
                    || v["tid"].as_i64() == Some(pid)
            }
            "C" if pid == SYSTEM_PID => {
                // Per-CPU detail ("CPU3 busy %") stays in the node's trace.
                !(name.starts_with("CPU") && name[3..].starts_with(|c: char| c.is_ascii_digit()))
            }
            "C" => !name.starts_with("CPU % "),
            _ => false,
        }
    }

    fn relocate(&mut self, v: &mut Value) -> io::Result<()> {
        let Some(o) = v.as_object_mut() else {
            return Ok(());
        };
        if let Some(p) = o.get("pid").and_then(|p| p.as_i64()) {
            o.insert("pid".into(), json!(self.id(p)?));
        }
        if let Some(t) = o.get("tid").and_then(|t| t.as_i64()) {
            o.insert("tid".into(), json!(self.id(t)?));
        }
        for k in ["id", "bind_id"] {
            if let Some(i) = o.get(k).and_then(|i| i.as_u64()) {
                o.insert(k.into(), json!(((self.slot as u64 + 1) << 40) | i));
            }
        }
        // The slice a gap's cause links to moves with its thread.
        if let Some(l) = o
            .get_mut("args")
            .and_then(|a| a.get_mut("linked_slice"))
            .and_then(|l| l.as_object_mut())
        {
            for k in ["pid", "tid"] {
                if let Some(x) = l.get(k).and_then(|x| x.as_i64()) {
                    l.insert(k.into(), json!(self.id(x)?));
                }
            }
        }
        self.rename(v);
        Ok(())
    }

    /// Prefix process names and offset their sort order.
    pub fn rename(&self, v: &mut Value) {
        if v["ph"] != "M" {
            return;
        }
        let what = v["name"].as_str().unwrap_or("").to_string();
        let args = &mut v["args"];
        match what.as_str() {
            "process_name" if !self.prefix.is_empty() => {
                let n = format!("{}{}", self.prefix, args["name"].as_str().unwrap_or(""));
                args["name"] = json!(n);
            }
            "process_sort_index" => {
                let i = args["sort_index"].as_i64().unwrap_or(0);
                args["sort_index"] = json!(self.sort_base + i);
            }
            _ => {}
        }
    }

    fn line<W: Write>(w: &mut W, ts: Option<f64>, v: &Value) -> io::Result<()> {
        match ts {
            Some(t) => write!(w, "{t}\t")?,
            None => w.write_all(b"-\t")?,
        }
        serde_json::to_writer(&mut *w, v)?;
        w.write_all(b"\n")
    }

    /// Write one event (or fold it into a counter average); returns the
    /// number of lines written.
    pub fn emit<W: Write>(&mut self, v: &Value, w: &mut W) -> io::Result<u64> {
        let pid = v["pid"].as_i64().unwrap_or(0);
        let bucket = self.timeline_bucket_us;
        if bucket.is_some() && !Self::keeps(pid, v) {
            return Ok(0);
        }
        let mut v = v.clone();
        self.relocate(&mut v)?;
        let ts = v
            .as_object_mut()
            .and_then(|o| o.remove("ts"))
            .and_then(|t| t.as_f64());
        let Some(bucket) = bucket else {
            Self::line(w, ts, &v)?;
            return Ok(1);
        };
        let name = v["name"].as_str().unwrap_or("").to_string();
        let mut n = 0;
        if v["ph"] == "C" {
            // One value per counter event, under the key that names it.
            let arg = v["args"]
                .as_object()
                .and_then(|o| o.iter().next())
                .and_then(|(k, x)| Some((k.clone(), x.as_f64()?)));
            if let (Some(t), Some((key, val))) = (ts, arg) {
                let same = self
                    .agg
                    .as_ref()
                    .is_some_and(|a| a.pid == pid && a.name == name);
                if !same {
                    n += self.flush(w)?;
                    self.agg = Some(Agg {
                        pid,
                        name,
                        key,
                        template: v,
                        bucket,
                        b0: (t / bucket).floor() * bucket,
                        sum: 0.0,
                        covered: 0.0,
                        last: None,
                        emitted: None,
                    });
                }
                let agg = self.agg.as_mut().expect("set above");
                n += agg.push(t, val, w)?;
                return Ok(n);
            }
        }
        n += self.flush(w)?;
        Self::line(w, ts, &v)?;
        Ok(n + 1)
    }

    /// End the counter track being averaged.
    fn flush<W: Write>(&mut self, w: &mut W) -> io::Result<u64> {
        match self.agg.take() {
            Some(a) => a.end(w),
            None => Ok(0),
        }
    }

    pub fn finish<W: Write>(&mut self, metadata: &Value, w: &mut W) -> io::Result<()> {
        self.flush(w)?;
        w.write_all(b"meta\t")?;
        serde_json::to_writer(&mut *w, metadata)?;
        w.write_all(b"\n")
    }
}

impl Agg {
    fn point<W: Write>(&mut self, t: f64, value: f64, w: &mut W) -> io::Result<u64> {
        let value = (value * 1000.0).round() / 1000.0;
        if self.emitted == Some(value) {
            return Ok(0);
        }
        self.emitted = Some(value);
        let mut v = self.template.clone();
        v["args"] = json!({ self.key.as_str(): value });
        Fragment::line(w, Some((t * 10.0).round() / 10.0), &v)?;
        Ok(1)
    }

    /// Close the current bucket with its time-weighted mean.
    fn close<W: Write>(&mut self, w: &mut W) -> io::Result<u64> {
        let n = if self.covered > 0.0 {
            let mean = self.sum / self.covered;
            self.point(self.b0, mean, w)?
        } else {
            0
        };
        self.sum = 0.0;
        self.covered = 0.0;
        Ok(n)
    }

    /// The value `val` holds from `t` on.
    fn push<W: Write>(&mut self, t: f64, val: f64, w: &mut W) -> io::Result<u64> {
        let mut n = 0;
        if let Some((lt, lv)) = self.last {
            let mut from = lt;
            while t >= self.b0 + self.bucket {
                let edge = self.b0 + self.bucket;
                if edge > from {
                    self.sum += lv * (edge - from);
                    self.covered += edge - from;
                    from = edge;
                }
                n += self.close(w)?;
                // A long constant stretch: one point, then jump.
                if t >= edge + self.bucket {
                    n += self.point(edge, lv, w)?;
                    self.b0 = (t / self.bucket).floor() * self.bucket;
                    from = self.b0;
                } else {
                    self.b0 = edge;
                }
            }
            if t > from {
                self.sum += lv * (t - from);
                self.covered += t - from;
            }
        }
        self.last = Some((t, val));
        Ok(n)
    }

    fn end<W: Write>(mut self, w: &mut W) -> io::Result<u64> {
        let mut n = self.close(w)?;
        if let Some((t, v)) = self.last {
            // The track ends where its data ends, with its last value.
            self.emitted = None;
            n += self.point(t, v, w)?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(buf: &[u8]) -> Vec<(String, Value)> {
        String::from_utf8_lossy(buf)
            .lines()
            .filter_map(|l| {
                let (ts, ev) = l.split_once('\t')?;
                (ts != "meta").then(|| (ts.to_string(), serde_json::from_str(ev).unwrap()))
            })
            .collect()
    }

    #[test]
    fn ids_of_different_recordings_never_collide() {
        use crate::export::trace_ids::NVTX_TID_BASE;
        use crate::export::trace_ids::STATE_TID_OFFSET;
        // Real ids up to the kernel's largest pid_max, and the synthetic
        // ones (machine, GPUs, state and NVTX tracks, steps).
        let ids = [
            0,
            1,
            4242,
            (1 << 22) - 1,
            SYSTEM_PID,
            GPU_PID_BASE,
            GPU_PID_BASE + 7,
            STATE_TID_OFFSET + 4242,
            NVTX_TID_BASE,
            NVTX_TID_BASE + 3,
            STEPS_TID,
        ];
        let mut seen = std::collections::BTreeSet::new();
        for slot in [0, 1, Fragment::MAX_SLOTS - 1] {
            let mut f = Fragment::new(slot, String::new(), 0, None);
            for x in ids {
                let v = f.id(x).unwrap();
                assert!(seen.insert(v), "{x:#x} of slot {slot}");
                assert!((1 << 22..=u32::MAX as i64).contains(&v), "{v:#x}");
                // The same id again: the same number (a PID and its main
                // thread's TID stay one).
                assert_eq!(f.id(x).unwrap(), v);
            }
        }
        // The last recording's range ends at u32::MAX.
        let last = (Fragment::MAX_SLOTS as i64 + 1) << Fragment::SPAN_BITS;
        assert_eq!(last - 1, u32::MAX as i64);
    }

    #[test]
    fn timeline_detail_keeps_processes_and_gpus_and_averages_counters() {
        let mut f = Fragment::new(2, "node-c · ".into(), 3_000_000, Some(1000.0));
        let mut buf = Vec::new();
        let evs = vec![
            json!({"ph":"M","name":"process_name","pid":42,"tid":0,"args":{"name":"rank 3 · python3"}}),
            json!({"ph":"M","name":"thread_name","pid":42,"tid":43,"args":{"name":"pin (43)"}}),
            json!({"ph":"X","name":"main","pid":42,"tid":42,"ts":5.0,"dur":1.0}),
            json!({"ph":"C","name":"CPU % python3 (42)","pid":42,"tid":0,"ts":0.0,"args":{"value":50.0}}),
            // CPU %: 100 for 500 µs, 0 for 1500 µs, 100 to 4000, end.
            json!({"ph":"C","name":"CPU %","pid":42,"tid":0,"ts":0.0,"args":{"value":100.0}}),
            json!({"ph":"C","name":"CPU %","pid":42,"tid":0,"ts":500.0,"args":{"value":0.0}}),
            json!({"ph":"C","name":"CPU %","pid":42,"tid":0,"ts":2000.0,"args":{"value":100.0}}),
            json!({"ph":"C","name":"CPU %","pid":42,"tid":0,"ts":4000.0,"args":{"value":100.0}}),
            json!({"ph":"X","name":"GPU idle","pid":GPU_PID_BASE,"tid":1,"ts":10.0,"dur":3.0}),
        ];
        for e in &evs {
            f.emit(e, &mut buf).unwrap();
        }
        f.finish(&json!({}), &mut buf).unwrap();
        let out = lines(&buf);
        let names: Vec<&str> = out
            .iter()
            .map(|(_, v)| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names.iter().filter(|n| **n == "thread_name").count(),
            0,
            "{names:?}"
        );
        assert!(!names.contains(&"main") && !names.contains(&"CPU % python3 (42)"));
        assert!(names.contains(&"GPU idle"));
        assert_eq!(out[0].1["args"]["name"], "node-c · rank 3 · python3");
        assert_eq!(out[0].1["pid"], f.id(42).unwrap());
        let cpu: Vec<(f64, f64)> = out
            .iter()
            .filter(|(_, v)| v["name"] == "CPU %")
            .map(|(t, v)| (t.parse().unwrap(), v["args"]["value"].as_f64().unwrap()))
            .collect();
        // Buckets of 1 ms: 50%, 0%, 100% from 2 ms on, end at 4 ms.
        assert_eq!(
            cpu,
            vec![(0.0, 50.0), (1000.0, 0.0), (2000.0, 100.0), (4000.0, 100.0)]
        );
    }
}
