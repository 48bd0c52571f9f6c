//! Helpers the exporters share, kept below them so that the files of one
//! output (`report*`, `trace*`) import this rather than each other.

use serde_json::{json, Value};

/// Round to `d` decimals (NaN/inf become null).
pub fn r(v: f64, d: i32) -> Value {
    if !v.is_finite() {
        return Value::Null;
    }
    let m = 10f64.powi(d);
    // `+ 0.0` turns -0.0 into 0.0.
    json!((v * m).round() / m + 0.0)
}

/// [`r`] for a typed `f64` field: the same number (NaN/inf are written as
/// null by serde_json, as [`r`] makes them).
pub fn rn(v: f64, d: i32) -> f64 {
    if !v.is_finite() {
        return v;
    }
    let m = 10f64.powi(d);
    (v * m).round() / m + 0.0
}
