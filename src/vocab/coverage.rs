//! Coverage source names: each collector states in a `Coverage` event
//! whether it ran, under one of these names; the analysis and the report
//! read them back.

/// Native stacks (perf events or the in-process timer sampler).
pub const NATIVE_STACKS: &str = "native-stacks";
/// Python stacks read with py-spy.
pub const PYTHON_STACKS: &str = "python-stacks";
/// Same-instant Python frames from the in-process agent.
pub const PYTHON_SAME_INSTANT: &str = "python-same-instant";
/// NVTX ranges from the injection library.
pub const NVTX: &str = "nvtx";
/// gpuprof's own resource losses; the analysis marks the profile
/// incomplete when it is present and unavailable.
pub const RESOURCES: &str = "gpuprof-resources";
