//! Every threshold of the diagnosis and of the live early warnings
//! (`WARN_*`, at the end), with its reason. `docs/findings.md` quotes
//! them; change both together.

/// A cause costing at least this share of the run is critical: fixing it
/// alone would make the run at least 1/(1-0.3) ≈ 1.4× faster.
pub const CRITICAL_SHARE: f64 = 0.30;
/// At least this share is a warning: a ≥ 1.1× speed-up is worth a change.
pub const WARNING_SHARE: f64 = 0.10;
/// Below this share of the run a cause is not reported: at 10 Hz sampling
/// a few percent are within the noise of state and CPU sampling.
pub const MIN_SHARE: f64 = 0.05;
/// A finding's share of the run is counted from a finite number of
/// observations (sampling intervals, each given one cause), so it has a
/// confidence interval: the Wilson score interval
/// at this normal quantile (95% two-sided). A finding's severity is that of
/// the interval's *lower* end: a healthy job shows a cause in an interval
/// now and then by chance (a thread read running at the instant it woke),
/// and on a 1 s recording one interval is 10% of the run; the lower end
/// clears a threshold by chance in about 2.5% of findings whose true share
/// is at the threshold, and far less often for noise well below it.
pub const SHARE_CONFIDENCE_Z: f64 = 1.96;
/// A cause seen in fewer sampling intervals than this is at most info and
/// "possible", whatever its share: one or two readings are what the
/// sampling of a healthy job produces by chance (half a second at the
/// default 10 Hz is the least a warning rests on). A measured GPU time
/// also needs at least this many driver utilization samples over the run
/// (under a second at the usual 1/6 s: too coarse to attribute idle time
/// to intervals).
pub const MIN_CAUSE_INTERVALS: f64 = 5.0;

/// A thread in state R (running or waiting for a CPU) for at least this
/// share of an interval wants a whole core: it is saturated. Below 1.0 to
/// allow for the moments a worker spends handing over a batch.
pub const SATURATED_R_SHARE: f64 = 0.75;
/// The input pipeline is at capacity when at least this share of its
/// workers is saturated.
pub const SATURATED_WORKERS_SHARE: f64 = 0.75;
/// Thread states are read once per interval, so one R reading stands for
/// the whole interval: workers that wait on their queue are read R
/// together at the instant they wake for the next batch. Their R readings
/// mean "saturated" only when they also used at least this share of a core
/// each in the interval (a saturated worker computes all along), or when
/// the machine had less than [`MAIN_BUSY_FREE_CORES`] idle or CPU pressure
/// said tasks waited (then runnable with little CPU is the wait for a
/// core).
pub const SATURATED_MIN_CPU: f64 = 0.5;
/// The main thread computes (preprocessing in the main process, or the
/// training loop's own work) when it is running or waiting for a CPU (state
/// R) at least half of an interval. R rather than CPU used: on a loaded
/// machine a busy thread waits for a core, and that wait is part of what
/// the GPU waits for.
pub const MAIN_BUSY_SHARE: f64 = 0.5;
/// Thread states are read once per interval, so one R reading stands for
/// the whole interval: a main thread that sleeps between short steps is
/// read R now and then at the instant it wakes. An R reading is believed
/// when the thread also used at least this share of a core in the bin, or
/// when the machine had less than [`MAIN_BUSY_FREE_CORES`] idle (then
/// being runnable with little CPU is the wait for a core). A thread that
/// used [`MAIN_BUSY_SHARE`] of a core is busy whatever its state readings.
pub const MAIN_BUSY_MIN_CPU: f64 = 0.2;
pub const MAIN_BUSY_FREE_CORES: f64 = 0.5;
/// The same for the live early warnings, which see only the cores a role
/// used (no per-thread states while recording): half a core.
pub const MAIN_BUSY_CORES: f64 = 0.5;
/// Tasks stalled on memory (PSI memory "some") at least this share of an
/// interval: reclaim or swap-in is on the critical path of the job's
/// threads (a healthy machine shows 0–1%).
pub const MEMORY_PSI_SHARE: f64 = 0.10;
/// The job's cgroup was throttled in at least this share of its scheduling
/// periods (100 ms each by default) during an interval: its CPU limit, not
/// the machine, capped it (an occasional throttled period is a burst).
pub const CPU_THROTTLED_SHARE: f64 = 0.25;
/// A thread blocked on storage is waiting for writes when its process
/// wrote more than it read in this many seconds up to then: buffered
/// writes are counted when dirtied, and the wait (fsync, close, dirty
/// limits) comes later.
pub const WRITE_LOOKBACK_S: f64 = 2.0;
/// Input workers that start within this many seconds of each other are
/// one generation (a DataLoader starts all of its workers at once).
pub const WORKER_GENERATION_S: f64 = 1.0;
/// A worker restart lasts at most this long: from the old generation's
/// first exit (at most this long before the new start) to the new one
/// being ready (at most this long after it).
pub const RESTART_WINDOW_S: f64 = 30.0;
/// Input threads blocked in uninterruptible sleep (D, almost always
/// waiting for storage) for at least half of an interval make it IO-bound.
pub const IO_D_SHARE: f64 = 0.5;
/// One more worker needs a whole core when saturated; with at least this
/// many idle cores, an extra worker gets ≥ 75% of one. The idle cores of
/// the saturated intervals vary: it is the lower end of their mean's 95%
/// interval ([`SHARE_CONFIDENCE_Z`]) that must reach this, so that a
/// machine near the threshold does not flip too-few-workers and
/// input-pipeline-bound run to run.
pub const IDLE_CORES_FOR_MORE_WORKERS: f64 = 0.75;
/// Saturated workers are starved by other programs when the CPU they used
/// was under this share of the time they were runnable (the rest went
/// waiting for a core).
pub const STARVED_CPU_OF_RUNNABLE: f64 = 0.5;
/// Main processes that did real work, whose main threads are counted: at
/// least this share of the busiest main process's CPU time (a wrapper
/// shell or launcher with next to no CPU does not dilute the main
/// thread's figures).
pub const MAIN_PROCESS_MIN_CPU_SHARE: f64 = 0.1;
/// An interval has input workers when more than this many were alive on
/// average in it: then the main thread's own work is the training loop,
/// not batch preparation.
pub const WORKERS_ALIVE_MIN: f32 = 0.5;
/// CPU oversubscription: the job's runnable threads at least this many
/// times the cores (a third of them waiting for a CPU at any time) ...
pub const OVERSUBSCRIBED_RUNNABLE_PER_CORE: f64 = 1.5;
/// ... and some task stalled waiting for a CPU at least this share of the
/// time (PSI cpu "some"), when the kernel reports pressure.
pub const OVERSUBSCRIBED_PSI_CPU: f64 = 0.25;
/// When oversubscribed, a process is busy when its threads were runnable
/// (state R) at least this many at a time on average ...
pub const OVERSUBSCRIBED_BUSY_PROCESS_RUNNABLE: f64 = 0.5;
/// When oversubscribed, busy processes with at least this many runnable
/// threads each point at thread pools (OpenMP/MKL/intra-op) rather than at
/// too many worker processes.
pub const THREAD_POOL_RUNNABLE_PER_PROCESS: f64 = 1.5;
/// GPU memory used at or above this share of the total leaves no room for
/// the allocator's fragmentation: the next larger batch fails with OOM.
pub const GPU_MEMORY_PRESSURE: f64 = 0.95;
/// A rotational disk is only a finding when the run read at least this
/// much from it (a few MB of code and configuration are not a dataset).
pub const SLOW_STORAGE_MIN_READ_BYTES: u64 = 10_000_000;
/// Files the input processes held open on one filesystem count as a
/// dataset when they total at least this many bytes ...
pub const DATASET_MIN_BYTES: u64 = 10_000_000;
/// ... or are at least this many distinct files (small-file datasets).
pub const DATASET_MIN_FILES: usize = 16;
/// The input processes read at least this many times the size of the data
/// files they held open from storage: the dataset was read from disk more
/// than once, so it did not stay in the page cache (a second epoch served
/// from the cache reads nothing from storage).
pub const PAGE_CACHE_REREAD: f64 = 1.5;
/// The findings must account for at least this share of the GPU's
/// steady-state idle time; below it, `gpu-idle-unexplained` says how much
/// is left (a remainder this small is within what 100 ms bins and 1/6 s
/// driver samples can attribute).
pub const EXPLAINED_IDLE_SHARE: f64 = 0.8;
/// A GPU busy at least this share of its sampled time is the bottleneck:
/// the idle time left unexplained is per-step launch and synchronisation
/// overhead, reported as info rather than as a warning.
pub const GPU_BOUND_BUSY_SHARE: f64 = 0.7;
/// Recordings shorter than this many sampling intervals give too few
/// samples for shares to be precise: the coverage finding says so (at
/// info: each finding's severity already allows for the observations it
/// has, see [`SHARE_CONFIDENCE_Z`]).
pub const MIN_INTERVALS: f64 = 20.0;
/// A stack sampler that lost more than this share of its records leaves
/// gaps in the flamegraphs.
pub const MAX_LOST_SHARE: f64 = 0.01;
/// Python stack samples a rank's waiting thread needs before its share of
/// time in collectives is compared with the others' (at the sampler's few
/// Hz, fewer make the share a coin toss).
pub const STRAGGLER_MIN_SAMPLES: u64 = crate::analysis::collectives::MIN_SAMPLES as u64;
/// The other ranks spend at least this share of their time in collectives
/// (median) before one of them can be said to wait for a straggler.
pub const STRAGGLER_MIN_WAIT_SHARE: f64 = 0.10;
/// ... and at least this many percentage points more than the rank that
/// waits least: below that, jitter between ranks and sampling noise.
pub const STRAGGLER_WAIT_GAP: f64 = 0.15;
/// Without collective stacks: a rank's GPU idle at least this much more
/// (share of the time) than the other ranks' median is the straggler.
pub const STRAGGLER_GPU_IDLE_GAP: f64 = 0.15;
/// A straggler's figure (running share of its workers, cores of its main
/// thread, blocked share of its input) explains it when it is at least this
/// far above the other ranks' median ...
pub const STRAGGLER_CAUSE_MARGIN: f64 = 0.25;
/// ... and at least this high itself (half the time busy).
pub const STRAGGLER_BUSY_SHARE: f64 = 0.5;
/// A disk at least this busy (% of the time with IO in flight) while reads
/// waited can be what they waited for; below it, on every disk, the wait is
/// more likely an IO limit or a network filesystem (a local disk serving a
/// reader that blocks is busy most of the time).
pub const DISK_BUSY_PCT: f64 = 50.0;
/// Other programs on the machine using at least this many cores while the
/// workers were saturated compete with them: the fix starts with giving the
/// job the CPU.
pub const OTHER_PROGRAMS_CORES: f64 = 0.5;
/// Another program is named when it took at least this share of the job's
/// runnable time in the seconds it was busy …
pub const OTHER_PROGRAM_MIN_SHARE_OF_RUNNABLE: f64 = 0.10;
/// … and at least this much in all (a compiler run of a second is not a
/// finding).
pub const OTHER_PROGRAM_MIN_TOOK_S: f64 = 1.0;
/// A loop thread waiting for the GIL at least this share of its counted
/// time is reported.
pub const GIL_MIN_SHARE: f64 = 0.10;
/// Start-up and shutdown idle time worth a note (below it, rounding).
pub const EDGE_IDLE_NOTE_S: f64 = 0.05;
/// Without a measured GPU, start-up and shutdown told apart by the stacks
/// are noted when together at least this share of the run (below it they
/// change no finding much; their seconds are in each estimate's method).
pub const EDGE_NOTE_SHARE: f64 = 0.1;

/// Fewest stack samples of the main thread (weighted) for its account
/// (model, data path, the loop's own code) to decide between batch
/// preparation and the model: with 40 samples a share's standard error is
/// at most 8 points, so a model share above the data share is not one
/// or two samples' chance (a second of CPU at the default 99 Hz is ~99).
pub const ACCOUNT_MIN_SAMPLES: u64 = 40;
/// The share of the main thread's samples that the losing side of the
/// account (the data path, or the model) must reach for the finding of
/// the winning side to say that it matters too and what to do about it.
pub const ACCOUNT_SECOND_SHARE: f64 = 0.2;

// The live early warnings (`--warn-after`, `live::LiveState::alerts`): a
// condition must hold over the whole window. They also use the
// diagnosis' own thresholds above where the same figure is read
// (`MEMORY_PSI_SHARE`, `CPU_THROTTLED_SHARE`, `GPU_MEMORY_PRESSURE`,
// `IO_D_SHARE`, `MAIN_BUSY_CORES`, the saturation thresholds).

/// The GPU is mostly idle: busy below this share (the usual alerting rule
/// for training jobs: utilization under 30% for a sustained time).
pub const WARN_GPU_BUSY_BELOW: f64 = 0.30;
/// The clock-event reasons the diagnosis takes for thermal throttling
/// (`THERMAL_REASONS`), active at least this share of the window ...
pub const WARN_THERMAL_SHARE: f64 = 0.5;
/// ... and for a power cap (`POWER_REASONS`).
pub const WARN_POWER_SHARE: f64 = 0.5;
/// A disk with IO in flight at least this share of the window ...
pub const WARN_DISK_BUSY: f64 = 0.9;
/// ... while on average at least this many of the job's threads waited in
/// state D (uninterruptible, almost always storage).
pub const WARN_D_THREADS: f64 = 0.5;
/// A figure read from samples (PSI, GPU busy, disk counters) speaks for
/// the window when its samples span at least this share of it.
pub const WARN_WINDOW_COVERED: f64 = 0.8;
/// The cgroup's CPU limit is judged over at least this many scheduling
/// periods (a second's worth of the default 100 ms periods).
pub const WARN_MIN_CPU_PERIODS: u64 = 10;
/// Fewer worker processes than this on average over the window: batches
/// are built in the main process.
pub const WARN_NO_WORKERS: f64 = 0.5;
