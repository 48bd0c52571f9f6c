//! The trace's event writer, shared by every part of the trace (processes,
//! system, GPUs, stacks, NVTX, waits) and by the size budget, which
//! measures a part by writing it to `io::sink()`.

use std::io::{self, Write};

use serde_json::{json, Value};

use super::trace_fragment::Fragment;
use crate::analysis::Series;
use crate::event::MonoNs;

/// Streams trace events; used by every part of the trace (processes,
/// system, GPUs, stacks). Counts the bytes it writes, so a part can be
/// measured by writing it to `io::sink()`.
pub struct TraceWriter<W: Write> {
    w: W,
    start: MonoNs,
    first: bool,
    pub events: u64,
    pub bytes: u64,
    buf: String,
    fragment: Option<Fragment>,
}

/// `s` as a JSON string (see [`push_json_str`]), to write many times.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_str(&mut out, s);
    out
}

/// Append `s` as a JSON string; control characters (which older Perfetto
/// versions reject even escaped) become spaces.
fn push_json_str(buf: &mut String, s: &str) {
    buf.push('"');
    for c in s.chars() {
        match c {
            '"' => buf.push_str("\\\""),
            '\\' => buf.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => buf.push(' '),
            c => buf.push(c),
        }
    }
    buf.push('"');
}

/// Tenths of µs since `start` (never negative): the trace's resolution.
fn tenths(start: MonoNs, t: MonoNs) -> u64 {
    t.0.saturating_sub(start.0) / 100
}

fn push_tenths(buf: &mut String, t: u64) {
    use std::fmt::Write as _;
    let _ = write!(buf, "{}", t / 10);
    if t % 10 != 0 {
        let _ = write!(buf, ".{}", t % 10);
    }
}

/// A counter value as written: rounded to 3 decimals.
pub fn counter_round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A flow end on a slice: Perfetto's v2 flow binding (`bind_id` with
/// `flow_out` on the earlier slice, `flow_in` on the later one). The id is
/// unique in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowEnd {
    pub id: u64,
    pub out: bool,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut w: W, start: MonoNs) -> io::Result<TraceWriter<W>> {
        let head = b"{\"traceEvents\":[\n";
        w.write_all(head)?;
        Ok(TraceWriter {
            w,
            start,
            first: true,
            events: 0,
            bytes: head.len() as u64,
            buf: String::with_capacity(256),
            fragment: None,
        })
    }

    /// A writer of one recording's part of a merged trace (see
    /// [`Fragment`]): events go through the fragment, one per line.
    pub fn fragment(w: W, start: MonoNs, fragment: Fragment) -> TraceWriter<W> {
        TraceWriter {
            w,
            start,
            first: true,
            events: 0,
            bytes: 0,
            buf: String::with_capacity(256),
            fragment: Some(fragment),
        }
    }

    /// Whether only a merge's timeline detail is kept (see [`Fragment`]):
    /// per-thread tracks need not be built.
    pub fn timeline_only(&self) -> bool {
        self.fragment
            .as_ref()
            .is_some_and(|f| f.timeline_bucket_us.is_some())
    }

    /// A writer that measures: no header, and every event counted with its
    /// separator.
    pub fn counting(w: W, start: MonoNs) -> TraceWriter<W> {
        TraceWriter {
            w,
            start,
            first: false,
            events: 0,
            bytes: 0,
            buf: String::with_capacity(256),
            fragment: None,
        }
    }

    /// µs since the start of the recording (never negative), to 0.1 µs.
    pub fn ts(&self, t: MonoNs) -> f64 {
        tenths(self.start, t) as f64 / 10.0
    }

    /// Count bytes that will be written later (planning only).
    pub fn reserve(&mut self, bytes: u64) {
        self.bytes += bytes;
    }

    fn emit(&mut self) -> io::Result<()> {
        if let Some(f) = &mut self.fragment {
            // A merge's fragment moves ids and times: it takes the event
            // as a value.
            let v: Value = serde_json::from_str(&self.buf).map_err(io::Error::other)?;
            self.events += f.emit(&v, &mut self.w)?;
            self.bytes += self.buf.len() as u64 + 2;
            return Ok(());
        }
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        self.w.write_all(self.buf.as_bytes())?;
        self.bytes += self.buf.len() as u64 + 2;
        self.events += 1;
        Ok(())
    }

    pub fn raw(&mut self, v: &Value) -> io::Result<()> {
        self.buf.clear();
        self.buf.push_str(&v.to_string());
        self.emit()
    }

    fn meta(&mut self, what: &str, pid: i64, tid: i64, key: &str, value: &Value) -> io::Result<()> {
        use std::fmt::Write as _;
        self.buf.clear();
        self.buf.push_str("{\"ph\":\"M\",\"name\":");
        push_json_str(&mut self.buf, what);
        let _ = write!(self.buf, ",\"pid\":{pid},\"tid\":{tid},\"args\":{{");
        push_json_str(&mut self.buf, key);
        self.buf.push(':');
        match value {
            Value::String(s) => push_json_str(&mut self.buf, s),
            v => self.buf.push_str(&v.to_string()),
        }
        self.buf.push_str("}}");
        self.emit()
    }

    pub fn process_name(&mut self, pid: i64, name: &str, sort: i64) -> io::Result<()> {
        self.meta("process_name", pid, 0, "name", &json!(name))?;
        self.meta("process_sort_index", pid, 0, "sort_index", &json!(sort))
    }

    /// Name a thread track. Perfetto shows the tid beside the name: the
    /// name should not repeat it.
    pub fn thread_name(&mut self, pid: i64, tid: i64, name: &str, sort: i64) -> io::Result<()> {
        self.meta("thread_name", pid, tid, "name", &json!(name))?;
        self.meta("thread_sort_index", pid, tid, "sort_index", &json!(sort))
    }

    /// A complete slice (`X`) on one thread track.
    pub fn slice(
        &mut self,
        pid: i64,
        tid: i64,
        name: &str,
        from: MonoNs,
        to: MonoNs,
        args: Option<Value>,
    ) -> io::Result<()> {
        self.slice_flow(pid, tid, name, from, to, args.as_ref(), None)
    }

    /// A complete slice, with args and one end of a flow.
    #[allow(clippy::too_many_arguments)]
    pub fn slice_flow(
        &mut self,
        pid: i64,
        tid: i64,
        name: &str,
        from: MonoNs,
        to: MonoNs,
        args: Option<&Value>,
        flow: Option<FlowEnd>,
    ) -> io::Result<()> {
        let name = json_str(name);
        self.slice_json(pid, tid, &name, from, to, args, flow)
    }

    /// [`TraceWriter::slice_flow`] with the name already a JSON string
    /// (see [`json_str`]).
    #[allow(clippy::too_many_arguments)]
    pub fn slice_json(
        &mut self,
        pid: i64,
        tid: i64,
        name_json: &str,
        from: MonoNs,
        to: MonoNs,
        args: Option<&Value>,
        flow: Option<FlowEnd>,
    ) -> io::Result<()> {
        use std::fmt::Write as _;
        let ts = tenths(self.start, from);
        let dur = tenths(self.start, to).saturating_sub(ts);
        self.buf.clear();
        self.buf.push_str("{\"ph\":\"X\",\"name\":");
        self.buf.push_str(name_json);
        let _ = write!(self.buf, ",\"pid\":{pid},\"tid\":{tid},\"ts\":");
        push_tenths(&mut self.buf, ts);
        self.buf.push_str(",\"dur\":");
        push_tenths(&mut self.buf, dur);
        if let Some(a) = args {
            self.buf.push_str(",\"args\":");
            self.buf.push_str(&a.to_string());
        }
        if let Some(f) = flow {
            let dir = if f.out { "flow_out" } else { "flow_in" };
            let _ = write!(self.buf, ",\"bind_id\":{},\"{dir}\":true", f.id);
        }
        self.buf.push('}');
        self.emit()
    }

    /// One counter point. `name` is the track's full name: Perfetto names a
    /// counter track "<event name> <arg key>", so it is split at its last
    /// space into the two (a name without a space is its own key). Values
    /// that are not finite are left out.
    pub fn counter_value(&mut self, pid: i64, name: &str, t: MonoNs, value: f64) -> io::Result<()> {
        use std::fmt::Write as _;
        let value = counter_round(value);
        if !value.is_finite() {
            return Ok(());
        }
        let (head, key) = match name.rsplit_once(' ') {
            Some((h, k)) if !h.is_empty() && !k.is_empty() => (h, k),
            _ => (name, name),
        };
        let ts = tenths(self.start, t);
        self.buf.clear();
        self.buf.push_str("{\"ph\":\"C\",\"name\":");
        push_json_str(&mut self.buf, head);
        let _ = write!(self.buf, ",\"pid\":{pid},\"tid\":0,\"ts\":");
        push_tenths(&mut self.buf, ts);
        self.buf.push_str(",\"args\":{");
        push_json_str(&mut self.buf, key);
        let _ = write!(self.buf, ":{value}}}}}");
        self.emit()
    }

    /// A counter track from a series, scaled; repeated values are skipped.
    pub fn counter(&mut self, pid: i64, name: &str, s: &Series, scale: f64) -> io::Result<()> {
        self.counter_at(pid, name, s, scale, 0, None)
    }

    /// A counter track at reduction `level`: groups of 2^level neighbouring
    /// points merged (time-weighted mean). `ended`: the process or thread
    /// exited then, and the track drops to 0 there instead of holding its
    /// last value to the end of the view.
    pub fn counter_at(
        &mut self,
        pid: i64,
        name: &str,
        s: &Series,
        scale: f64,
        level: u32,
        ended: Option<MonoNs>,
    ) -> io::Result<()> {
        let pts = s.points();
        let group = 1usize << level.min(30);
        let mut last: Option<f64> = None;
        let mut end = None;
        for chunk in pts.chunks(group) {
            let (mut sum, mut dur) = (0.0, 0.0);
            for p in chunk {
                sum += p.v * p.dur_s();
                dur += p.dur_s();
            }
            let v = if dur > 0.0 { sum / dur } else { chunk[0].v };
            let v = counter_round(v * scale);
            if last != Some(v) {
                self.counter_value(pid, name, chunk[0].t0, v)?;
                last = Some(v);
            }
            end = chunk.last().map(|p| p.t1);
        }
        if let (Some(end), Some(v)) = (end, last) {
            match ended {
                // Nothing after the exit: the track ends at 0.
                Some(x) if x >= end => self.counter_value(pid, name, x, 0.0)?,
                Some(_) => self.counter_value(pid, name, end, 0.0)?,
                // End the track where the data ends.
                None => self.counter_value(pid, name, end, v)?,
            }
        }
        Ok(())
    }

    pub fn finish(mut self, metadata: Value) -> io::Result<W> {
        if let Some(f) = &mut self.fragment {
            f.finish(&metadata, &mut self.w)?;
            self.w.flush()?;
            return Ok(self.w);
        }
        self.w
            .write_all(b"\n],\"displayTimeUnit\":\"ms\",\"metadata\":")?;
        serde_json::to_writer(&mut self.w, &metadata)?;
        self.w.write_all(b"}\n")?;
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Neighbours closer than this merge at `level` (0: none).
pub fn merge_gap(unit: u64, level: u32) -> u64 {
    if level == 0 {
        0
    } else {
        unit.saturating_mul(1u64 << (level - 1).min(62))
    }
}
