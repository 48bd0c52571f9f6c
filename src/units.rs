//! How figures are written for people: one place, so that the same amount
//! reads the same in the diagnosis, the summary, `compare` and the step
//! analysis. (Machine-readable outputs keep raw numbers: bytes, seconds,
//! shares.)

/// Bytes with a decimal unit and about three significant digits:
/// `512 B`, `12 kB`, `3.4 MB`, `123 MB`, `1.2 GB`, `12.3 GB`.
pub fn bytes(b: f64) -> String {
    let b = b.max(0.0);
    let (v, unit) = if b >= 1e12 {
        (b / 1e12, "TB")
    } else if b >= 1e9 {
        (b / 1e9, "GB")
    } else if b >= 1e6 {
        (b / 1e6, "MB")
    } else if b >= 1e3 {
        (b / 1e3, "kB")
    } else {
        return format!("{b:.0} B");
    };
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// A rate of bytes per second: `bytes(b) + "/s"`.
pub fn rate(bps: f64) -> String {
    format!("{}/s", bytes(bps))
}

/// A share (0..=1) as a whole percentage: `0.256` → `26%`.
pub fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// Seconds with one decimal: `12.3 s`.
pub fn secs(s: f64) -> String {
    format!("{s:.1} s")
}

/// "1 worker", "3 workers", "2 processes".
pub fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else if what.ends_with('s') {
        format!("{n} {what}es")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_keep_three_digits() {
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(12_345.0), "12.3 kB");
        assert_eq!(bytes(3_450_000.0), "3.5 MB");
        assert_eq!(bytes(123_400_000.0), "123 MB");
        assert_eq!(bytes(1_234_000_000.0), "1.2 GB");
        assert_eq!(bytes(-1.0), "0 B");
        assert_eq!(rate(2e6), "2.0 MB/s");
        assert_eq!(pct(0.256), "26%");
        assert_eq!(plural(1, "worker"), "1 worker");
        assert_eq!(plural(2, "process"), "2 processes");
        assert_eq!(secs(1.26), "1.3 s");
    }
}
