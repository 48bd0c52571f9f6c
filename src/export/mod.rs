//! Exporters: pure, deterministic functions from an [`Analysis`] to bytes.
//!
//! [`Analysis`]: crate::analysis::Analysis

pub mod common;
pub mod flame;
pub mod folded_budget;
pub mod pb;
pub mod pprof;
pub mod report;
pub mod report_gpu;
pub mod report_nvtx;
pub mod report_schema;
pub mod sampled;
pub mod speedscope;
pub mod summary;
pub mod trace;
pub mod trace_budget;
pub mod trace_fragment;
pub mod trace_gaps;
pub mod trace_gpu;
pub mod trace_ids;
pub mod trace_nvtx;
pub mod trace_slices;
pub mod trace_stacks;
pub mod trace_waits;
pub mod trace_writer;
