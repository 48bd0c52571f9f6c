//! gpuprof: a profiler for GPU training jobs.
//!
//! Pipeline: `launch` → `collect::*` → `event`s → `record` (streamed to disk)
//! → `analysis` → `export::*`. See `docs/` and DESIGN.md.

pub mod event;
pub mod launch;
pub mod record;
