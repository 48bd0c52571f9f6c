//! Exporters: pure, deterministic functions from an [`Analysis`] to bytes.
//!
//! [`Analysis`]: crate::analysis::Analysis

pub mod flame;
pub mod report;
pub mod summary;
pub mod trace;
