//! gpuprof: a profiler for GPU training jobs.
//!
//! Pipeline: `launch` → `collect::*` → `event`s → `record` (streamed to disk)
//! → `analysis` → `export::*`. See `docs/` and DESIGN.md.

pub mod agent;
pub mod analysis;
pub mod attach;
pub mod cli;
pub mod collect;
pub mod compare;
pub mod config;
pub mod diagnose;
pub mod doctor;
pub mod event;
pub mod explain;
pub mod export;
pub mod launch;
pub mod live;
pub mod merge;
pub mod outdir;
pub mod outputs;
pub mod placeholders;
pub mod record;
pub mod selfcost;
pub mod session;
pub mod units;
pub mod vocab;
