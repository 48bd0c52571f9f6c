//! The in-process agent's side of the perf reader: its records (hello,
//! code objects, samples, notes) made into stacks beside perf's, what it did
//! per process, and the periods each of its samples stands for.

use super::*;

/// What the agent did in one process.
#[derive(Default)]
pub(super) struct AgentProc {
    pub(super) samples: u64,
    pub(super) partial: BTreeMap<String, u64>,
    pub(super) late: u64,
    pub(super) unknown_code: u64,
    pub(super) chained: bool,
    /// Its perf event samples the threads' periods in the kernel (None:
    /// timers, or no hello yet).
    pub(super) kernel: Option<bool>,
    /// Periods counted with a later sample: several that ended in one
    /// stretch in the kernel, which came as one signal.
    pub(super) merged: u64,
    /// Periods that took no sample: they ended in the kernel, whose periods
    /// the event may not sample.
    pub(super) unsampled: u64,
}

/// A thread's CPU time at its previous agent sample, and what was left
/// over when its periods were counted (negative: counted ahead).
#[derive(Clone, Copy)]
pub(super) struct CpuCredit {
    pub(super) prev: u64,
    pub(super) carry: i64,
}

/// The periods an agent sample stands for beyond itself, from the thread's
/// CPU time since its previous sample (`credit`: None at its first).
/// Counted with a carry, so that a signal that came late (at the end of a
/// system call) is not counted twice: the CPU times telescope.
pub(super) fn extra_periods(credit: &mut Option<CpuCredit>, cpu_ns: u64, period_ns: u64) -> u64 {
    let p = period_ns.max(1) as i64;
    match credit {
        Some(c) if cpu_ns >= c.prev && cpu_ns > 0 => {
            let x = (cpu_ns - c.prev) as i64 + c.carry;
            let k = (x / p).max(1);
            c.carry = (x - k * p).max(-p);
            c.prev = cpu_ns;
            (k - 1) as u64
        }
        _ => {
            // The first sample of the thread (or a new thread of a reused
            // id): its CPU time before may predate the event.
            *credit = (cpu_ns > 0).then_some(CpuCredit {
                prev: cpu_ns,
                carry: 0,
            });
            0
        }
    }
}

/// One thread's samples so far, the agent's and perf's, and its CPU time
/// at its previous agent sample.
#[derive(Default)]
pub(super) struct ThreadCounts {
    pub(super) agent: u64,
    pub(super) perf: u64,
    credit: Option<CpuCredit>,
}

pub(super) struct Agent {
    pub(super) rings: AgentRings,
    pub(super) verdicts: Arc<AgentVerdicts>,
    pub(super) counts: HashMap<(Pid, Tid), ThreadCounts>,
    pub(super) procs: BTreeMap<Pid, AgentProc>,
    pub(super) buf: Vec<(usize, AgentRecord)>,
    pub(super) last_reap: Instant,
}

impl Agent {
    /// Counts a perf sample of `tid`; true when the agent samples its
    /// process and has kept up with perf on this thread so far (the rule
    /// the analysis applies at the end: `analysis::stacks::agent_covers`).
    pub(super) fn keeps_up(&mut self, pid: Pid, tid: Tid) -> bool {
        let c = self.counts.entry((pid, tid)).or_default();
        c.perf += 1;
        agent_covers(c.agent, c.perf) && self.verdicts.get(pid) == Some(true)
    }
}

impl Reader {
    pub(super) fn agent_record(&mut self, ring: usize, rec: AgentRecord) {
        let Some(a) = self.agent.as_mut() else {
            return;
        };
        match rec {
            AgentRecord::Hello(h) => {
                a.procs.entry(h.pid).or_default().kernel =
                    (h.sampling && !h.timer).then_some(h.kernel);
                // A native program sampled by its timers has no Python
                // frames for the agent to take: py-spy reads it if it is a
                // Python after all (a static interpreter whose symbols the
                // agent cannot see).
                a.verdicts.set(h.pid, h.sampling && h.python);
                // The py-spy sampler may be waiting for this word.
                self.news.wake_listener();
                if self.timer.is_some() {
                    self.timer_process(&h);
                }
                if h.python {
                    self.sink.send_blocking(Event::PyProcess {
                        t: h.t,
                        pid: h.pid,
                        version: h.version,
                        same_instant: h.sampling,
                        timer: h.timer,
                        detail: h.detail,
                    });
                }
            }
            AgentRecord::Note(Note::HandlerChained { pid, .. }) => {
                a.procs.entry(pid).or_default().chained = true;
            }
            AgentRecord::Note(Note::Async { pid, .. }) => {
                a.procs.entry(pid).or_default().late += 1;
            }
            AgentRecord::Sample(smp) => self.agent_sample(ring, smp),
            AgentRecord::Code(_) => {}
        }
    }

    /// Timer sampler: a process the agent just started sampling. No perf
    /// records introduce processes, so its hello stands for them: a new
    /// program (or a forked child) whose mappings are read afresh from
    /// /proc, and its fork and name for the analysis (at the hello's time,
    /// its first sample: no sample of it comes before).
    fn timer_process(&mut self, h: &pyagent::Hello) {
        self.procs.remove(&h.pid);
        self.maps_read.remove(&h.pid);
        if h.forked {
            // Its parent's mappings, in case it is gone before its maps
            // are read (a short-lived worker): read again if it is not.
            if let Some(parent) = self.procs.get(&h.ppid) {
                let mut copy = parent.clone();
                copy.jit.insert(0, own_perf_map(h.pid, Some(h.t)));
                self.procs.insert(h.pid, copy);
            }
        }
        if std::path::Path::new(&format!("/proc/{}", h.pid.0)).exists() {
            self.reread_maps(h.pid);
        }
        if h.forked && h.ppid.0 > 0 {
            self.sink.send_blocking(Event::TaskFork {
                t: h.t,
                pid: h.pid,
                tid: Tid(h.pid.0),
                ppid: h.ppid,
                ptid: Tid(h.ppid.0),
            });
        }
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", h.pid.0))
            .map(|c| c.trim_end_matches('\n').to_string())
            .unwrap_or_default();
        if !comm.is_empty() {
            self.sink.send_blocking(Event::TaskComm {
                t: h.t,
                pid: h.pid,
                tid: Tid(h.pid.0),
                comm,
                exec: !h.forked,
            });
        }
        self.news.new_process();
    }

    /// An agent sample as one recorded stack: its Python frames, then its
    /// native stack (unwound like a perf sample), each outermost first,
    /// and, when the Python frames are missing or cut, a marker saying so.
    fn agent_sample(&mut self, ring: usize, smp: pyagent::AgentSample) {
        let Some(a) = self.agent.as_mut() else {
            return;
        };
        let (pid, tid, t) = (smp.native.pid, smp.native.tid, smp.native.t);
        let st = a.procs.entry(pid).or_default();
        st.samples += 1;
        let period = pyagent::period_ns(self.opts.frequency);
        let credit = &mut a.counts.entry((pid, tid)).or_default().credit;
        let extra = extra_periods(credit, smp.cpu_ns, period).min(MAX_OVERRUN as u64);
        // With the kernel's periods sampled, the periods beyond this one
        // ended in the stretch in the kernel this signal came at the end
        // of (at most one signal is pending): they are this stack's. Else
        // they ended in the kernel somewhere since the previous sample,
        // and are only counted.
        let merged = match st.kernel {
            Some(true) => {
                st.merged += extra;
                extra as u32
            }
            Some(false) => {
                st.unsampled += extra;
                0
            }
            None => 0,
        };
        let mut py: Vec<FrameKey> = Vec::with_capacity(smp.frames.len());
        let mut marker = None;
        match smp.status {
            PyStatus::Ok | PyStatus::Truncated | PyStatus::NoThreadState => {
                if smp.status == PyStatus::Truncated {
                    *st.partial.entry("truncated".into()).or_default() += 1;
                    marker = Some(MARKER_TRUNCATED);
                }
                // Innermost first in the record; a frame's entry flag moves
                // to the next inner frame when a shim frame is left out.
                let mut inner_first: Vec<FrameKey> = Vec::with_capacity(smp.frames.len());
                for &(code, key, flags) in smp.frames.iter() {
                    let entry = flags & pyagent::FRAME_ENTRY != 0;
                    if flags & pyagent::FRAME_BAD_CODE != 0 {
                        marker = Some(MARKER_UNREADABLE);
                        break;
                    }
                    match a.rings.resolve(ring, code, key) {
                        Some((id, table)) => {
                            if a.rings.name(id).1 == "<shim>" {
                                if entry {
                                    if let Some(FrameKey::Py(_, e, _)) = inner_first.last_mut() {
                                        *e = true;
                                    }
                                }
                                continue;
                            }
                            let line = a.rings.line(table, pyagent::frame_instruction(flags));
                            inner_first.push(FrameKey::Py(id, entry, line));
                        }
                        None => {
                            st.unknown_code += 1;
                            marker = Some(MARKER_UNREADABLE);
                            break;
                        }
                    }
                }
                if marker == Some(MARKER_UNREADABLE) {
                    *st.partial.entry("unknown code".into()).or_default() += 1;
                } else {
                    py.extend(inner_first.into_iter().rev());
                }
            }
            PyStatus::Unreadable | PyStatus::Inconsistent => {
                let why = if smp.status == PyStatus::Unreadable {
                    "unreadable"
                } else {
                    "inconsistent"
                };
                *st.partial.entry(why.into()).or_default() += 1;
                marker = Some(MARKER_UNREADABLE);
            }
        }
        if self.timer.is_some() && !self.maps_read.contains_key(&pid) {
            self.reread_maps(pid);
        }
        let Some(u) = self.unwind_agent_sample(&smp.native) else {
            return;
        };
        for (i, _, e) in &u.jit {
            self.jit_names
                .entry(u.frames[*i])
                .or_insert_with(|| e.name.clone());
        }
        self.announce_files();
        self.keys_buf.clear();
        // Python frames first: a thread's consecutive samples then share
        // the Python part and most of the native part of their stack,
        // which a native leaf put before the Python frames would split
        // (the analysis tells the two apart by kind, not by position).
        self.keys_buf.extend(
            py.into_iter()
                .chain(u.frames.iter().rev().map(|&(f, o)| FrameKey::Native(f, o)))
                .chain(marker.map(FrameKey::Marker)),
        );
        let rings = &self.agent.as_ref().expect("agent present").rings;
        let (symbols, paths, jit) = (&self.symbols, &self.paths, &self.jit_names);
        let py_names = &self.py_names;
        let stack = self
            .interner
            .stack_of(tid, &self.keys_buf, &self.sink, |id, k| {
                if let FrameKey::Native(file, offset) = *k {
                    queue_name(symbols, paths, jit, id, file, offset);
                }
                frame_event(id, k, Some(rings), py_names)
            });
        if let Some(stack) = stack {
            // A timer signal that came for several periods (overruns)
            // stands for each: the thread's CPU time stays exact.
            for _ in 0..=smp.overrun.min(MAX_OVERRUN) + merged {
                self.interner.sample_from(
                    SampleSource::Agent,
                    pid,
                    tid,
                    t,
                    stack,
                    u.complete,
                    &self.sink,
                );
            }
            self.stats_overruns += smp.overrun.min(MAX_OVERRUN) as u64;
        }
    }

    /// Unwind an agent sample's native half. With the timer sampler a
    /// frame outside every known mapping (a library loaded after the maps
    /// were read) has the maps read again, and the sample unwound again.
    fn unwind_agent_sample(&mut self, native: &sample::Sample) -> Option<unwind::Unwound> {
        let pid = native.pid;
        for attempt in 0..2 {
            self.prepare_maps(pid);
            let pm = self.procs.get_mut(&pid).expect("prepared");
            self.sample_gen += 1;
            let files = &mut self.files;
            let u = unwind::unwind(
                pm,
                &mut self.cache,
                native,
                self.unknown_file,
                self.sample_gen,
                &mut |path| files.id_of_text(path),
            )?;
            let unknown = u.frames.iter().any(|&(f, _)| f == self.unknown_file);
            if attempt == 1 || !unknown || self.timer.is_none() || !self.reread_maps(pid) {
                return Some(u);
            }
        }
        None
    }

    /// A perf sample of a thread the agent keeps up with. The analysis uses
    /// the agent's samples of this thread (see
    /// `analysis::stacks::agent_covers`): unwinding this copy of the same
    /// moment would be CPU taken from the job for nothing. It is kept,
    /// marked, for the counts that decide.
    pub(super) fn covered_sample(&mut self, pid: Pid, tid: Tid, t: MonoNs) {
        self.stats.samples += 1;
        let stack = match self.not_unwound {
            Some(stack) => stack,
            None => {
                let id = self.interner.frame(
                    &FrameKey::Marker(MARKER_NOT_UNWOUND),
                    &self.sink,
                    |id, _| Event::StackMarker {
                        id,
                        marker: MARKER_NOT_UNWOUND.to_string(),
                    },
                );
                let Some(stack) = self.interner.stack(&[id], &self.sink) else {
                    return;
                };
                *self.not_unwound.insert(stack)
            }
        };
        self.interner.sample(pid, tid, t, stack, true, &self.sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 10_000_000;

    #[test]
    fn periods_beyond_a_sample_telescope() {
        let mut c = None;
        // The first sample of a thread stands for itself only.
        assert_eq!(extra_periods(&mut c, 5 * P, P), 0);
        // One period later: nothing beyond it.
        assert_eq!(extra_periods(&mut c, 6 * P, P), 0);
        // A signal at the end of a 3.5-period stretch in the kernel.
        assert_eq!(extra_periods(&mut c, 9 * P + P / 2, P), 2);
        // A signal that came late counts ahead; the next one early is not
        // counted twice: 4 signals over 4 periods stand for 4 in all.
        let mut c = Some(CpuCredit { prev: 0, carry: 0 });
        let got: u64 = [P + P / 2, 2 * P, 3 * P + P / 3, 4 * P]
            .iter()
            .map(|&t| extra_periods(&mut c, t, P))
            .sum();
        assert_eq!(got, 0);
        // Over a long run the samples and their extras add up to the CPU
        // time in periods, whatever the jitter.
        let mut c = Some(CpuCredit { prev: 0, carry: 0 });
        let (mut t, mut n) = (0u64, 0u64);
        for i in 0..1000u64 {
            t += P + (i * 7919 % 13) * P / 5; // 1 to 3.4 periods apart
            n += 1 + extra_periods(&mut c, t, P);
        }
        assert!((n as i64 - (t / P) as i64).abs() <= 1, "{n} vs {}", t / P);
        // A thread id reused by a new thread (its CPU time went back).
        assert_eq!(extra_periods(&mut c, P, P), 0);
        assert_eq!(c.map(|c| c.prev), Some(P));
    }
}
