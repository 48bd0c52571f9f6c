//! The host clock's synchronisation state, from `adjtimex(2)` in read-only
//! mode (`modes = 0`, allowed without privileges). It bounds how well the
//! recording's wall-clock anchor places it among other hosts' recordings.

use crate::event::ClockSync;

/// `STA_UNSYNC`: the kernel's "clock not synchronised" status bit.
const STA_UNSYNC: i32 = 0x0040;
/// `TIME_ERROR`: adjtimex's return value when the clock is not synchronised.
const TIME_ERROR: i32 = 5;

/// The clock's state now; None when the call fails (seccomp, old kernels).
pub fn clock_sync() -> Option<ClockSync> {
    // SAFETY: an all-zero timex is valid input; modes = 0 only reads.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = 0;
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state < 0 {
        return None;
    }
    Some(ClockSync {
        synchronized: state != TIME_ERROR && (tx.status & STA_UNSYNC) == 0,
        max_error_us: tx.maxerror.max(0) as u64,
        est_error_us: tx.esterror.max(0) as u64,
        source: "adjtimex".into(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_clock_state() {
        // Every Linux answers a read-only adjtimex; the figures depend on
        // whether an NTP daemon runs here, so only their shape is checked.
        let c = super::clock_sync().expect("adjtimex answers");
        assert_eq!(c.source, "adjtimex");
        if c.synchronized {
            assert!(c.max_error_us < 16_000_000, "{c:?}");
        }
    }
}
