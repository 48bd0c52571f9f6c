//! Which Python frames are collective communication calls: the waits
//! analysis and the collectives analysis both classify frames by them.

/// Python functions of `torch.distributed` (and libraries built on it)
/// that block until every rank has joined. Non-blocking variants
/// (`isend`, `async_op=True` work objects) do not wait there.
pub const COLLECTIVE_FUNCTIONS: &[&str] = &[
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "_all_gather_base",
    "all_to_all",
    "all_to_all_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    // Horovod's blocking calls.
    "allreduce",
    "allgather",
    "synchronize",
];

/// Files whose functions above are collectives (path fragments).
pub const COLLECTIVE_FILES: &[&str] = &["torch/distributed/", "distributed_c10d.py", "horovod/"];

/// Whether a Python frame is a blocking collective call.
pub fn is_collective_frame(name: &str, file: &str) -> bool {
    COLLECTIVE_FUNCTIONS.contains(&name) && COLLECTIVE_FILES.iter().any(|f| file.contains(f))
}

/// Whether a Python frame is distributed code at all (`init_process_group`,
/// DDP's setup, collectives).
pub fn is_distributed_frame(_name: &str, file: &str) -> bool {
    COLLECTIVE_FILES.iter().any(|f| file.contains(f))
}
