//! Chrome Trace Event Format (JSON object form), as read by Perfetto
//! (ui.perfetto.dev) and chrome://tracing. Timestamps are µs from the start
//! of the recording; the monotonic/realtime anchor is in `metadata`.
//!
//! Layout: one trace process per job process (real PID) with counters for
//! CPU, IO and RSS and one CPU counter per thread; each thread's R/D state
//! runs on a companion track "<thread> state" (kept apart from the thread's
//! own track so that stack slices there nest cleanly); NVTX ranges on
//! tracks of their own (`trace_nvtx`); a synthetic "system" process with
//! machine-wide counters.

use std::io::{self, Write};

use serde_json::{json, Value};

use crate::analysis::{Analysis, Process, Role, Series};
use crate::event::MonoNs;

pub use super::trace_fragment::Fragment;

/// Synthetic trace PIDs live above the kernel's PID_MAX_LIMIT (2^22).
pub const SYSTEM_PID: i64 = 0x7000_0000;
/// Companion tracks of a thread: `tid + STATE_TID_OFFSET`.
pub const STATE_TID_OFFSET: i64 = 0x4000_0000;

/// Streams trace events; used by every part of the trace (processes,
/// system, GPUs, stacks).
pub struct TraceWriter<W: Write> {
    w: W,
    start: MonoNs,
    first: bool,
    pub events: u64,
    fragment: Option<Fragment>,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut w: W, start: MonoNs) -> io::Result<TraceWriter<W>> {
        w.write_all(b"{\"traceEvents\":[\n")?;
        Ok(TraceWriter {
            w,
            start,
            first: true,
            events: 0,
            fragment: None,
        })
    }

    /// Whether only a merge's timeline detail is kept (see [`Fragment`]):
    /// per-thread tracks need not be built.
    pub fn timeline_only(&self) -> bool {
        self.fragment
            .as_ref()
            .is_some_and(|f| f.timeline_bucket_us.is_some())
    }

    /// A writer of one recording's part of a merged trace (see
    /// [`Fragment`]).
    pub fn fragment(w: W, start: MonoNs, fragment: Fragment) -> TraceWriter<W> {
        TraceWriter {
            w,
            start,
            first: true,
            events: 0,
            fragment: Some(fragment),
        }
    }

    /// µs since the start of the recording (never negative).
    pub fn ts(&self, t: MonoNs) -> f64 {
        let ns = t.0.saturating_sub(self.start.0);
        (ns / 1000) as f64 + ((ns % 1000) / 100) as f64 / 10.0
    }

    pub fn raw(&mut self, v: &Value) -> io::Result<()> {
        if let Some(f) = &mut self.fragment {
            self.events += f.emit(v, &mut self.w)?;
            return Ok(());
        }
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut self.w, v)?;
        self.events += 1;
        Ok(())
    }

    pub fn process_name(&mut self, pid: i64, name: &str, sort: i64) -> io::Result<()> {
        self.raw(&json!({"ph":"M","name":"process_name","pid":pid,"tid":0,"args":{"name":name}}))?;
        self.raw(&json!({"ph":"M","name":"process_sort_index","pid":pid,"tid":0,"args":{"sort_index":sort}}))
    }

    pub fn thread_name(&mut self, pid: i64, tid: i64, name: &str, sort: i64) -> io::Result<()> {
        self.raw(&json!({"ph":"M","name":"thread_name","pid":pid,"tid":tid,"args":{"name":name}}))?;
        self.raw(&json!({"ph":"M","name":"thread_sort_index","pid":pid,"tid":tid,"args":{"sort_index":sort}}))
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
        let ts = self.ts(from);
        let dur = (self.ts(to) - ts).max(0.0);
        let mut v = json!({"ph":"X","name":name,"pid":pid,"tid":tid,"ts":ts,"dur":dur});
        if let Some(a) = args {
            v["args"] = a;
        }
        self.raw(&v)
    }

    pub fn counter_value(&mut self, pid: i64, name: &str, t: MonoNs, value: f64) -> io::Result<()> {
        let ts = self.ts(t);
        let value = (value * 1000.0).round() / 1000.0;
        self.raw(&json!({"ph":"C","name":name,"pid":pid,"tid":0,"ts":ts,"args":{"value":value}}))
    }

    /// A counter track from a series, scaled; repeated values are skipped.
    pub fn counter(&mut self, pid: i64, name: &str, s: &Series, scale: f64) -> io::Result<()> {
        let mut last: Option<f64> = None;
        let pts = s.points();
        for p in pts {
            let v = (p.v * scale * 1000.0).round() / 1000.0;
            if last != Some(v) {
                self.counter_value(pid, name, p.t0, v)?;
                last = Some(v);
            }
        }
        if let Some(p) = pts.last() {
            // End the track where the data ends.
            self.counter_value(pid, name, p.t1, (p.v * scale * 1000.0).round() / 1000.0)?;
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

/// A job process's track name: "rank 1 · python3 train.py …" for ranks,
/// their workers and launchers; "python3 train.py … [main]" otherwise.
pub fn process_track_name(p: &Process) -> String {
    let cmd = short_command(&p.cmdline, &p.comm);
    if p.rank.is_some() || p.role == Role::Launcher {
        format!("{} · {cmd}", p.label())
    } else {
        format!("{cmd} [{}]", p.role)
    }
}

/// Short display form of a command line.
pub fn short_command(cmdline: &[String], comm: &str) -> String {
    if cmdline.is_empty() {
        return comm.to_string();
    }
    let mut parts: Vec<String> = Vec::new();
    for (i, a) in cmdline.iter().enumerate() {
        let a = if i == 0 {
            a.rsplit('/').next().unwrap_or(a)
        } else {
            a.as_str()
        };
        parts.push(a.to_string());
        if parts.iter().map(|p| p.len() + 1).sum::<usize>() > 60 {
            parts.push("…".into());
            break;
        }
    }
    parts.join(" ")
}

/// Write the whole trace; stack slices in `view`.
pub fn write<W: Write>(a: &Analysis, w: W, view: crate::analysis::stacks::View) -> io::Result<W> {
    write_with(a, TraceWriter::new(w, a.start)?, view)
}

/// Write the whole trace through `tw` (a fresh writer, or a merge
/// [`Fragment`]'s); stack slices in `view`.
pub fn write_with<W: Write>(
    a: &Analysis,
    mut tw: TraceWriter<W>,
    view: crate::analysis::stacks::View,
) -> io::Result<W> {
    write_processes(a, &mut tw)?;
    write_system(a, &mut tw)?;
    super::trace_gpu::write_gpus(a, &mut tw)?;
    // A merge's timeline keeps neither (see `trace_fragment`): not built.
    let (stacks, nvtx) = if tw.timeline_only() {
        (Value::Null, Value::Null)
    } else {
        (
            super::flame::write_trace(a, &mut tw, view)?,
            super::trace_nvtx::write_nvtx(a, &mut tw)?,
        )
    };
    let steps = super::trace_nvtx::write_steps(a, &mut tw)?;
    let h = &a.header;
    let meta = json!({
        "stack_slices": stacks,
        "nvtx": nvtx,
        "steps": steps,
        "gpuprof_version": h.gpuprof_version,
        "command": h.command,
        "host": h.host,
        "rank": h.rank,
        "clock": "CLOCK_MONOTONIC; ts = µs since start_monotonic_ns",
        "start_monotonic_ns": a.start.0,
        "anchor_monotonic_ns": h.anchor_monotonic_ns,
        "anchor_realtime_ns": h.anchor_realtime_ns,
        "interval_ns": h.interval_ns,
        "gpu_idle_threshold_pct": a.gpu.idle_threshold_pct,
        "gpu_sample_period_ms": a.gpu.devices.iter().map(|d| (d.resolution_ns as f64 / 1e5).round() / 10.0).collect::<Vec<_>>(),
    });
    tw.finish(meta)
}

fn write_processes<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    for (i, p) in a.processes_in_order().into_iter().enumerate() {
        let pid = p.pid.0 as i64;
        tw.process_name(pid, &process_track_name(p), i as i64)?;
        tw.counter(pid, "CPU %", &p.cpu, 100.0)?;
        tw.counter(pid, "IO read MB/s", &p.read_bps, 1e-6)?;
        tw.counter(pid, "IO write MB/s", &p.write_bps, 1e-6)?;
        tw.counter(pid, "RSS MB", &p.rss, 1e-6)?;
        for (j, th) in p.threads.values().enumerate() {
            let tid = th.tid.0 as i64;
            let tname = if th.comm.is_empty() {
                format!("thread {tid}")
            } else {
                th.comm.clone()
            };
            // Per thread: its own track (stack slices), then its NVTX
            // tracks (`trace_nvtx`), then its state track.
            if tw.timeline_only() && tid != pid {
                continue;
            }
            tw.thread_name(pid, tid, &format!("{tname} ({tid})"), (j * 4) as i64)?;
            if tw.timeline_only() {
                continue;
            }
            tw.counter(pid, &format!("CPU % {tname} ({tid})"), &th.cpu, 100.0)?;
            if !th.state_runs.is_empty() {
                let stid = tid + STATE_TID_OFFSET;
                tw.thread_name(
                    pid,
                    stid,
                    &format!("{tname} ({tid}) state"),
                    (j * 4 + 3) as i64,
                )?;
                for &(from, to, st) in &th.state_runs {
                    let label = match st {
                        'R' => "running",
                        'D' => "uninterruptible wait (D, usually IO)",
                        _ => "other",
                    };
                    tw.slice(pid, stid, label, from, to, None)?;
                }
            }
        }
    }
    Ok(())
}

fn write_system<W: Write>(a: &Analysis, tw: &mut TraceWriter<W>) -> io::Result<()> {
    let s = &a.system;
    tw.process_name(SYSTEM_PID, &format!("system ({} CPUs)", s.cpus), 5000)?;
    tw.counter(SYSTEM_PID, "CPU busy %", &s.busy, 1.0)?;
    tw.counter(SYSTEM_PID, "CPU iowait %", &s.iowait, 1.0)?;
    tw.counter(SYSTEM_PID, "CPU steal %", &s.steal, 1.0)?;
    tw.counter(SYSTEM_PID, "runnable tasks", &s.runnable, 1.0)?;
    tw.counter(SYSTEM_PID, "tasks blocked on IO", &s.blocked, 1.0)?;
    for (i, c) in s.per_cpu_busy.iter().enumerate() {
        tw.counter(SYSTEM_PID, &format!("CPU{i} busy %"), c, 1.0)?;
    }
    for d in s.disks.values() {
        if d.read_bytes == 0 && d.write_bytes == 0 && d.busy.max() <= 0.0 {
            continue;
        }
        tw.counter(SYSTEM_PID, &format!("disk {} busy %", d.name), &d.busy, 1.0)?;
        tw.counter(
            SYSTEM_PID,
            &format!("disk {} read MB/s", d.name),
            &d.read_bps,
            1e-6,
        )?;
        tw.counter(
            SYSTEM_PID,
            &format!("disk {} write MB/s", d.name),
            &d.write_bps,
            1e-6,
        )?;
    }
    for (name, ps) in [
        ("cpu", &s.psi_cpu),
        ("io", &s.psi_io),
        ("memory", &s.psi_memory),
    ] {
        tw.counter(SYSTEM_PID, &format!("PSI {name} some %"), &ps.some, 1.0)?;
        if name != "cpu" {
            tw.counter(SYSTEM_PID, &format!("PSI {name} full %"), &ps.full, 1.0)?;
        }
    }
    tw.counter(SYSTEM_PID, "memory available GB", &s.mem_available, 1e-9)?;
    tw.counter(SYSTEM_PID, "swap used GB", &s.swap_used, 1e-9)?;
    tw.counter(SYSTEM_PID, "swap in MB/s", &s.swap_in_bps, 1e-6)?;
    tw.counter(SYSTEM_PID, "swap out MB/s", &s.swap_out_bps, 1e-6)?;
    Ok(())
}
