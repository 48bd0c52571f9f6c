//! The words every layer shares: stack markers, sampler and coverage
//! source names, rank ids, NVTX name groups, and a few small pure helpers.
//!
//! This layer sits below `collect/` and `analysis/` so that the collector
//! that writes a word and the analysis that reads it name the same thing
//! without either importing the other. It imports only `event` and
//! `units`; see `docs/architecture.md`.

pub mod collectives;
pub mod coverage;
pub mod files;
pub mod hash;
pub mod nvtx;
pub mod ranks;
pub mod stacks;
