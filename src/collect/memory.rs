//! gpuprof under a memory limit (`ulimit -v`, a cgroup, a container): it
//! must degrade, never abort, since an aborted gpuprof loses the recording's
//! end and the job's exit status.
//!
//! Two mechanisms:
//! - buffers that only hold stack samples (the in-process agents' rings,
//!   2 MiB each, one per Python process) are mapped only while they fit well
//!   inside the address-space limit ([`may_map_stack_buffer`]): stacks are
//!   the first thing dropped, and the loss is counted;
//! - the allocator ([`Guarded`]) keeps an emergency reserve of address space
//!   while a limit is set: when an allocation fails it releases the reserve,
//!   raises [`under_pressure`] (the stack collectors then stop taking new
//!   processes), and tries again, so that the rest of the run and the final
//!   outputs have room.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The allocator of the gpuprof binary: the system's, with the reserve.
pub struct Guarded;

/// Bytes of the emergency reserve.
const RESERVE_BYTES: usize = 32 << 20;
static RESERVE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static PRESSURE: AtomicBool = AtomicBool::new(false);
static STACK_BUFFERS_SKIPPED: AtomicU64 = AtomicU64::new(0);

fn reserve_layout() -> Layout {
    Layout::from_size_align(RESERVE_BYTES, 4096).expect("valid layout")
}

/// Set the reserve aside when gpuprof runs under an address-space or data
/// limit (without one, a failed allocation is the kernel's OOM killer's
/// business, not something a reserve changes). Untouched, it costs address
/// space only.
pub fn arm() {
    if as_limit().is_none() && data_limit().is_none() {
        return;
    }
    // glibc reserves 64 MiB of address space for each thread's arena: two
    // threads' worth is most of a 200 MB `ulimit -v`. One arena for all of
    // gpuprof's few threads. The job is not affected: a process's own
    // setting, which its exec discards.
    #[cfg(target_env = "gnu")]
    // SAFETY: a documented tunable, set before gpuprof starts its threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    // SAFETY: a valid, non-zero layout.
    let p = unsafe { System.alloc(reserve_layout()) };
    if !p.is_null()
        && RESERVE
            .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        // SAFETY: allocated just above with this layout.
        unsafe { System.dealloc(p, reserve_layout()) };
    }
}

/// Release the reserve (once); true if there was one.
fn release() -> bool {
    let p = RESERVE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    PRESSURE.store(true, Ordering::Release);
    if p.is_null() {
        return false;
    }
    // SAFETY: allocated by `arm` with this layout, taken out of RESERVE once.
    unsafe { System.dealloc(p, reserve_layout()) };
    true
}

/// Whether an allocation has failed: gpuprof is short of memory, and the
/// collectors of stacks take nothing new.
pub fn under_pressure() -> bool {
    PRESSURE.load(Ordering::Acquire)
}

// SAFETY: every call is passed to System; a null result is retried once
// after the reserve is released, which frees memory System allocated.
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if p.is_null() && release() {
            return System.alloc(layout);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if p.is_null() && release() {
            return System.alloc_zeroed(layout);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if p.is_null() && release() {
            return System.realloc(ptr, layout, new_size);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn limit(r: nix::sys::resource::Resource) -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(r).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

fn as_limit() -> Option<u64> {
    limit(nix::sys::resource::Resource::RLIMIT_AS)
}

fn data_limit() -> Option<u64> {
    limit(nix::sys::resource::Resource::RLIMIT_DATA)
}

/// gpuprof's mapped address space now, in bytes.
fn vm_size() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(pages * procfs::page_size())
}

/// Whether a buffer of `bytes` that only holds stack samples may be mapped:
/// not under memory pressure, and, under an address-space limit, only while
/// gpuprof's mappings stay within three quarters of it (the rest is for the
/// collectors, the analysis and the outputs). A refusal is counted.
pub fn may_map_stack_buffer(bytes: u64) -> bool {
    let ok = !under_pressure()
        && match (as_limit(), vm_size()) {
            (Some(lim), Some(vm)) => vm.saturating_add(bytes) <= lim / 4 * 3,
            _ => true,
        };
    if !ok {
        STACK_BUFFERS_SKIPPED.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// What the memory limit cost, for the losses' coverage entry.
pub fn losses() -> Vec<String> {
    let mut out = Vec::new();
    let skipped = STACK_BUFFERS_SKIPPED.load(Ordering::Relaxed);
    if skipped > 0 {
        let lim = as_limit().map_or("its memory limit".into(), |l| {
            format!("its address-space limit (ulimit -v {} KiB)", l / 1024)
        });
        out.push(format!(
            "the stack samples of {skipped} process(es) were not read: their in-process buffers did not fit within {lim}; raise the limit to see them"
        ));
    }
    if under_pressure() {
        out.push(
            "an allocation failed: gpuprof released its reserve and stopped taking new processes' stacks from then on".into(),
        );
    }
    out
}
