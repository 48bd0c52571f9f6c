//! The two stack samplers of a recording, started and stopped together:
//! native stacks with perf (opened between fork and exec of the job) and
//! Python stacks with py-spy.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::collect::perf::{self, PerfOptions, PerfSampler};
use crate::collect::python::PySampler;
use crate::event::{Coverage, Event, Pid};
use crate::record::Sink;

#[derive(Default)]
pub struct StackCollectors {
    perf: Option<PerfSampler>,
    python: Option<PySampler>,
}

impl StackCollectors {
    /// Start sampling `job`, which must be forked and not yet exec'd.
    /// `None` options: stacks disabled (`--no-stacks`). A refusal is said in
    /// one line (unless `quiet`) and recorded as coverage; the job runs
    /// anyway.
    pub fn start(
        opts: Option<&PerfOptions>,
        job: Pid,
        sink: &Sink,
        quiet: bool,
    ) -> StackCollectors {
        Self::start_with(opts, sink, quiet, None, |o| perf::open(job, o))
    }

    /// Start sampling the running process `root` and everything below it
    /// (`gpuprof attach`).
    pub fn start_attached(
        opts: Option<&PerfOptions>,
        root: Pid,
        sink: &Sink,
        quiet: bool,
    ) -> StackCollectors {
        Self::start_with(opts, sink, quiet, Some(root), |o| {
            perf::open_attached(root, o)
        })
    }

    fn start_with(
        opts: Option<&PerfOptions>,
        sink: &Sink,
        quiet: bool,
        root: Option<Pid>,
        open: impl FnOnce(&PerfOptions) -> Result<perf::Opened, perf::OpenError>,
    ) -> StackCollectors {
        let Some(opts) = opts else {
            for source in [
                perf::COVERAGE_SOURCE,
                crate::collect::python::COVERAGE_SOURCE,
            ] {
                sink.send_blocking(Event::Coverage(Coverage {
                    source: source.into(),
                    available: false,
                    detail: "disabled with --no-stacks".into(),
                }));
            }
            return StackCollectors::default();
        };
        let mut c = StackCollectors::default();
        let changes = Arc::new(AtomicU64::new(0));
        let mut tree_changes = None;
        match open(opts) {
            Ok(opened) => match PerfSampler::start(opened, sink.clone(), changes.clone()) {
                Ok(s) => {
                    c.perf = Some(s);
                    tree_changes = Some(changes);
                }
                Err(e) => {
                    let detail =
                        format!("cannot start the perf reader thread: {e}; no native stacks");
                    if !quiet {
                        eprintln!("gpuprof: {detail}");
                    }
                    sink.send_blocking(Event::Coverage(Coverage {
                        source: perf::COVERAGE_SOURCE.into(),
                        available: false,
                        detail,
                    }));
                }
            },
            Err(e) => {
                if !quiet {
                    eprintln!("gpuprof: {}", e.message);
                }
                sink.send_blocking(Event::Coverage(perf::refused_coverage(&e)));
            }
        }
        match PySampler::start(opts.frequency, sink.clone(), tree_changes, root) {
            Ok(p) => c.python = Some(p),
            Err(e) => sink.send_blocking(Event::Coverage(Coverage {
                source: crate::collect::python::COVERAGE_SOURCE.into(),
                available: false,
                detail: format!("cannot start the Python sampler thread: {e}"),
            })),
        }
        c
    }

    /// The job ended (or recording stops): drain, symbolize, write the
    /// counters.
    pub fn stop(self) {
        if let Some(p) = self.python {
            p.stop();
        }
        if let Some(p) = self.perf {
            p.stop();
        }
    }
}
