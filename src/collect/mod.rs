//! Collectors: each turns one OS source into timestamped [`Event`]s sent
//! to a [`Sink`]. None of them knows about exporters.
//!
//! [`Event`]: crate::event::Event
//! [`Sink`]: crate::record::Sink

pub mod clock;
pub mod files;
pub mod gpu;
pub mod intern;
pub mod nvtx;
pub mod perf;
pub mod procfs;
pub mod python;
pub mod stacks;
pub mod system;
