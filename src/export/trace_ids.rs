//! Track ids and sort keys of the trace: every part of the trace and a
//! merged trace's fragments number their tracks from here, so that none of
//! them imports another to learn a number.

/// Synthetic trace PIDs live above the kernel's PID_MAX_LIMIT (2^22).
pub const SYSTEM_PID: i64 = 0x7000_0000;
/// Companion tracks of a thread: `tid + STATE_TID_OFFSET`. Decimal, so
/// that the tid Perfetto shows beside the name ends with the thread's own.
pub const STATE_TID_OFFSET: i64 = 1_000_000_000;

/// Sort order of trace processes: GPUs first, then the job's processes in
/// their order (`Analysis::processes_in_order`), processes only perf saw,
/// then the machine.
pub const SORT_GPU: i64 = 0;
pub const SORT_PROCESSES: i64 = 1_000_000;
pub const SORT_PERF_ONLY: i64 = 3_000_000;
pub const SORT_SYSTEM: i64 = 4_000_000;

/// Synthetic trace PIDs of GPUs: above the kernel's PID_MAX_LIMIT and apart
/// from the system process.
pub const GPU_PID_BASE: i64 = 0x7100_0000;

/// Track ids of NVTX tracks within their process: above real TIDs
/// (PID_MAX_LIMIT is 2^22) and the state tracks' offset.
pub const NVTX_TID_BASE: i64 = 0x5000_0000;

/// Track id of the steps track (on the process whose thread marks steps,
/// else the job's process).
pub const STEPS_TID: i64 = NVTX_TID_BASE - 1;
