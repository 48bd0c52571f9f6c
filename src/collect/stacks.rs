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
        match perf::open(job, opts) {
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
        match PySampler::start(opts.frequency, sink.clone(), tree_changes) {
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
