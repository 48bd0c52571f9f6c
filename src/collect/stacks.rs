//! The stack samplers of a recording, started and stopped together: native
//! stacks with perf (opened between fork and exec of the job), Python frames
//! of the same instant from the in-process agent (preloaded into the job,
//! its rings drained by the perf reader), and Python-only stacks with py-spy
//! (of every Python process: blocked threads included, for the rank analysis).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::agent::AgentDir;
use crate::collect::perf::pyagent::{self, RingDir, Window};
use crate::collect::perf::{self, AgentLink, PerfOptions, PerfSampler, SamplerChoice};
use crate::collect::python::PySampler;
use crate::collect::TreeNews;
use crate::event::{Coverage, Event, Pid};
use crate::record::Sink;
use crate::vocab::coverage;

#[derive(Default)]
pub struct StackCollectors {
    perf: Option<PerfSampler>,
    python: Option<PySampler>,
    /// What the perf reader learns of new processes and libraries.
    news: Option<Arc<TreeNews>>,
    /// The recording window is open (false until `--delay` elapses).
    active: Arc<AtomicBool>,
    /// The agents' rings folder, whose window word they follow.
    ring_dir: Option<PathBuf>,
}

/// The in-process agent, ready before the job is forked: its folder (which
/// must outlive every process that may still load it), its rings, and the
/// environment that puts it into the job.
pub struct PreparedAgent {
    /// Declared before `dir`: the rings go first.
    rings: RingDir,
    dir: AgentDir,
    link: AgentLink,
    env: Vec<(OsString, OsString)>,
    /// The agent is the native sampler too (its CPU-time timers), with
    /// what the first line says of why.
    timer: Option<TimerPlan>,
}

/// Why the timer sampler runs, and at what rate.
struct TimerPlan {
    /// perf_event_open's refusal, when that is why (else `--sampler timer`).
    refusal: Option<std::io::Error>,
    /// `--frequency`, at most the kernel's tick rate (see [`timer_frequency`]).
    frequency: u64,
    /// Said when `--frequency` was lowered.
    lowered: Option<String>,
}

impl TimerPlan {
    fn new(refusal: Option<std::io::Error>, requested: u64) -> TimerPlan {
        let frequency = timer_frequency(requested);
        TimerPlan {
            refusal,
            frequency,
            lowered: (frequency < requested).then(|| {
                format!(
                    "--frequency {requested} lowered to {frequency} Hz: the kernel checks CPU-time timers once per tick ({frequency} a second here), so faster timers would miss expirations and undercount CPU time"
                )
            }),
        }
    }
}

/// The timer sampler's rate: a thread's CPU-time timer expires only at a
/// scheduler tick (the kernel checks CPU timers from its tick), so at a rate
/// above the tick rate every signal would merge several periods (counted
/// as overruns, but the resolution is the tick's). Measured here
/// (CONFIG_HZ=250): `--frequency 499` gave 69 signals for 0.3 s of CPU. The
/// tick is the resolution of the coarse clock.
pub(crate) fn timer_frequency(requested: u64) -> u64 {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: res is a valid timespec to write into.
    let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) } == 0;
    let tick_ns = res.tv_sec as u64 * 1_000_000_000 + res.tv_nsec as u64;
    if !ok || tick_ns == 0 {
        return requested;
    }
    requested.min((1_000_000_000 / tick_ns).max(1))
}

impl PreparedAgent {
    /// Variables to add to the job's environment.
    pub fn env(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// The job is over: remove the rings; remove the agent itself only when
    /// no process that may still load it is left (a preload path that
    /// vanished makes the dynamic loader complain in each new process).
    pub fn finish(self, descendants_alive: bool) {
        let PreparedAgent { rings, dir, .. } = self;
        drop(rings);
        if descendants_alive {
            std::mem::forget(dir);
        }
    }
}

/// Whether the agent will be preloaded, and why not.
pub enum AgentPlan {
    Ready(Box<PreparedAgent>),
    /// Not used: the coverage detail.
    Off(String),
}

impl StackCollectors {
    /// Prepare the same-instant Python agent for a recording with `opts`
    /// (`None`: `--no-stacks`). Call before forking the job.
    pub fn prepare_agent(opts: Option<&PerfOptions>) -> AgentPlan {
        let Some(opts) = opts else {
            return AgentPlan::Off("disabled with --no-stacks".into());
        };
        if !opts.same_instant_python() {
            return AgentPlan::Off(
                "disabled with --python-frames py-spy: Python frames come from py-spy alone".into(),
            );
        }
        let refusal = perf::self_sampling_refusal();
        let timer = match (opts.sampler, refusal) {
            (SamplerChoice::Timer, refusal) => Some(TimerPlan::new(refusal, opts.frequency)),
            (SamplerChoice::Auto, Some(e)) => Some(TimerPlan::new(Some(e), opts.frequency)),
            (SamplerChoice::Perf, Some(_)) => {
                return AgentPlan::Off(
                    "perf events are refused here, so the agent could not sample either (--sampler perf; the default would sample with the in-process timers)".into(),
                );
            }
            (_, None) => None,
        };
        let dir = match AgentDir::create() {
            Ok(d) => d,
            Err(e) => return AgentPlan::Off(format!("no folder for the agent: {e}")),
        };
        let so = match dir.install(pyagent::AGENT) {
            Ok(p) => p,
            Err(e) => return AgentPlan::Off(format!("cannot write the agent: {e}")),
        };
        let rings = match RingDir::create(dir.path()) {
            Ok(r) => r,
            Err(e) => return AgentPlan::Off(format!("no folder for the agent's rings: {e}")),
        };
        let env = pyagent::job_env(
            &so,
            rings.path(),
            timer.as_ref().map_or(opts.frequency, |t| t.frequency),
            opts.stack_size,
            timer.is_some(),
        );
        let link = AgentLink {
            ring_dir: rings.path().to_path_buf(),
            verdicts: Arc::new(perf::AgentVerdicts::new(so.clone())),
        };
        AgentPlan::Ready(Box::new(PreparedAgent {
            rings,
            dir,
            link,
            env,
            timer,
        }))
    }

    /// Start sampling `job`, which must be forked and not yet exec'd, with
    /// the agent of `agent` in its environment. `None` options: stacks
    /// disabled (`--no-stacks`). A refusal is said in one line (unless
    /// `quiet`) and recorded as coverage; the job runs anyway. `active`:
    /// from the job's exec; else nothing is sampled, in gpuprof or in the
    /// job, until [`StackCollectors::set_active`] (`--delay`).
    pub fn start(
        opts: Option<&PerfOptions>,
        job: Pid,
        sink: &Sink,
        quiet: bool,
        agent: &AgentPlan,
        active: bool,
    ) -> StackCollectors {
        let timer = match agent {
            AgentPlan::Ready(a) => a.timer.as_ref(),
            AgentPlan::Off(_) => None,
        };
        let mut c = match timer {
            Some(plan) => {
                let mut why = timer_line(plan);
                if let Some(l) = &plan.lowered {
                    why = format!("{why}; {l}");
                }
                if !quiet {
                    eprintln!("gpuprof: {why}");
                }
                let o = opts.map(|o| PerfOptions {
                    frequency: plan.frequency,
                    ..o.clone()
                });
                Self::start_with(o.as_ref(), sink, quiet, None, agent, active, |o| {
                    Ok(perf::timer_only(job, o, why))
                })
            }
            None => Self::start_with(opts, sink, quiet, None, agent, active, |o| {
                perf::open(job, o, active)
            }),
        };
        if let AgentPlan::Ready(a) = agent {
            // Before the job's exec, where the agent maps it.
            let w = if active { Window::Open } else { Window::Paused };
            if pyagent::set_window(a.rings.path(), w).is_ok() {
                c.ring_dir = Some(a.rings.path().to_path_buf());
            }
        }
        c
    }
}

/// `gpuprof attach` where perf events are refused: the timer sampler needs
/// its agent loaded at a process's start, so nothing samples the running
/// processes' native stacks. The line says so, what is left (py-spy's
/// Python stacks, from outside), how much is missing (the tree's processes
/// and threads now), and how to get it without privileges.
fn attach_refused(root: Pid, e: perf::OpenError) -> perf::OpenError {
    let Some(errno) = e.errno.filter(|n| *n == libc::EACCES || *n == libc::EPERM) else {
        return e;
    };
    let threads = perf::tree_threads(root);
    let processes = 1 + crate::collect::python::descendants(root.0).len();
    let then = format!(
        "no native stacks of the {processes} process(es) and {} thread(s) of PID {root}: nothing can be placed inside processes already running (the in-process timer sampler, which needs no privilege, is loaded when gpuprof starts the job: `gpuprof -- CMD`); Python stacks come from py-spy alone (read from outside, blocked threads included)",
        threads.len()
    );
    perf::OpenError {
        message: perf::refusal_advice_then(&std::io::Error::from_raw_os_error(errno), &then),
        errno: Some(errno),
    }
}

/// The first line of a run with the timer sampler: which sampler, and why.
fn timer_line(plan: &TimerPlan) -> String {
    const WHAT: &str = "stacks come from the in-process timer sampler instead (each thread of the job samples itself on its own CPU-time clock; no privilege needed; see docs/stacks.md)";
    match &plan.refusal {
        Some(e) => perf::refusal_advice_then(e, WHAT),
        None => "--sampler timer: stacks come from the in-process timer sampler (each thread of the job samples itself on its own CPU-time clock), not perf events".into(),
    }
}

impl StackCollectors {
    /// The recording window opened (`--delay` elapsed): perf's events are
    /// turned on, py-spy starts reading, the agents start sampling.
    pub fn set_active(&self) {
        self.active.store(true, Ordering::Release);
        if let Some(d) = &self.ring_dir {
            let _ = pyagent::set_window(d, Window::Open);
        }
    }

    /// Start sampling the running process `root` and everything below it
    /// (`gpuprof attach`).
    pub fn start_attached(
        opts: Option<&PerfOptions>,
        root: Pid,
        sink: &Sink,
        quiet: bool,
    ) -> StackCollectors {
        let agent = AgentPlan::Off(
            "not in processes that were already running (attach): the agent is preloaded only into jobs gpuprof starts; Python frames come from py-spy alone".into(),
        );
        Self::start_with(opts, sink, quiet, Some(root), &agent, true, |o| {
            perf::open_attached(root, o).map_err(|e| attach_refused(root, e))
        })
    }

    fn start_with(
        opts: Option<&PerfOptions>,
        sink: &Sink,
        quiet: bool,
        root: Option<Pid>,
        agent: &AgentPlan,
        active: bool,
        open: impl FnOnce(&PerfOptions) -> Result<perf::Opened, perf::OpenError>,
    ) -> StackCollectors {
        let active = Arc::new(AtomicBool::new(active));
        let Some(opts) = opts else {
            for source in [
                coverage::NATIVE_STACKS,
                coverage::PYTHON_STACKS,
                coverage::PYTHON_SAME_INSTANT,
            ] {
                sink.send_blocking(Event::Coverage(Coverage {
                    source: source.into(),
                    available: false,
                    detail: "disabled with --no-stacks".into(),
                }));
            }
            return StackCollectors::default();
        };
        let link = match agent {
            AgentPlan::Ready(a) => Some(a.link.clone()),
            AgentPlan::Off(_) => None,
        };
        let mut c = StackCollectors {
            active: active.clone(),
            ..StackCollectors::default()
        };
        let changes = Arc::new(TreeNews::default());
        let mut news = None;
        let mut agent_running = false;
        match open(opts) {
            Ok(opened) => {
                match PerfSampler::start(
                    opened,
                    sink.clone(),
                    changes.clone(),
                    link.clone(),
                    active.clone(),
                ) {
                    Ok(s) => {
                        c.perf = Some(s);
                        news = Some(changes);
                        agent_running = link.is_some();
                    }
                    Err(e) => {
                        let detail =
                            format!("cannot start the perf reader thread: {e}; no native stacks");
                        if !quiet {
                            eprintln!("gpuprof: {detail}");
                        }
                        sink.send_blocking(Event::Coverage(Coverage {
                            source: coverage::NATIVE_STACKS.into(),
                            available: false,
                            detail,
                        }));
                    }
                }
            }
            Err(e) => {
                if !quiet {
                    eprintln!("gpuprof: {}", e.message);
                }
                sink.send_blocking(Event::Coverage(perf::refused_coverage(&e)));
            }
        }
        sink.send_blocking(Event::Coverage(Coverage {
            source: coverage::PYTHON_SAME_INSTANT.into(),
            available: agent_running,
            detail: match agent {
                AgentPlan::Ready(a) if agent_running && a.timer.is_some() => format!(
                    "in-process agent preloaded into the job (LD_PRELOAD), sampling with per-thread CPU-time timers: every process that loads it (CPython 3.9–3.13 with its Python frames, native programs without) is sampled from inside, at {} Hz per thread; report.json stacks.python says per process what it did",
                    opts.frequency
                ),
                AgentPlan::Ready(_) if agent_running => format!(
                    "in-process agent preloaded into the job (LD_PRELOAD): CPython 3.9–3.13 processes are sampled from inside, at {} Hz per thread; report.json stacks.python says per process what it did",
                    opts.frequency
                ),
                AgentPlan::Ready(_) => {
                    "native stacks are not sampled, so the agent's samples are not read".into()
                }
                AgentPlan::Off(why) => why.clone(),
            },
        }));
        // With the agent reading its processes, py-spy reads only those it
        // does not sample, and the ranks' main processes whose loop thread
        // the wall-clock sampler cannot read with the agent's layout.
        let verdicts = link.filter(|_| agent_running).map(|l| l.verdicts);
        match PySampler::start(
            opts.frequency,
            sink.clone(),
            news.clone(),
            root,
            verdicts,
            active,
        ) {
            Ok(p) => c.python = Some(p),
            Err(e) => sink.send_blocking(Event::Coverage(Coverage {
                source: coverage::PYTHON_STACKS.into(),
                available: false,
                detail: format!("cannot start the Python sampler thread: {e}"),
            })),
        }
        c.news = news;
        c
    }

    /// Tell the samplers to finish, without waiting for them (see
    /// [`StackCollectors::stop`]).
    pub fn request_stop(&self) {
        // The job may run on (`--duration`): its agents stop their events
        // now rather than fill rings no one reads.
        if let Some(d) = &self.ring_dir {
            let _ = pyagent::set_window(d, Window::Over);
        }
        if let Some(p) = &self.python {
            p.request_stop();
        }
        if let Some(p) = &self.perf {
            p.request_stop();
        }
    }

    /// News of new processes and libraries, while perf is read.
    pub fn news(&self) -> Option<Arc<TreeNews>> {
        self.news.clone()
    }

    /// The job ended (or recording stops): drain, symbolize, write the
    /// counters.
    pub fn stop(self) {
        self.request_stop();
        if let Some(p) = self.python {
            p.stop();
        }
        if let Some(p) = self.perf {
            p.stop();
        }
    }
}
