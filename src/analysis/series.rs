//! Bounded time series: at most `cap` points whatever the run length. When
//! full, neighbouring points are merged pairwise (time-weighted mean), so a
//! day-long run keeps the same memory as a minute-long one at a coarser
//! resolution.

use crate::event::MonoNs;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub t0: MonoNs,
    pub t1: MonoNs,
    /// Mean value over [t0, t1).
    pub v: f64,
}

impl Point {
    pub fn dur_s(&self) -> f64 {
        self.t1.0.saturating_sub(self.t0.0) as f64 / 1e9
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pts: Vec<Point>,
    cap: usize,
    max: f64,
    /// Times the points were merged pairwise (each halves the resolution).
    halvings: u32,
}

pub const DEFAULT_CAP: usize = 8192;

impl Default for Series {
    fn default() -> Self {
        Series::with_cap(DEFAULT_CAP)
    }
}

impl Series {
    pub fn with_cap(cap: usize) -> Series {
        Series {
            pts: Vec::new(),
            cap: cap.max(2),
            max: f64::NAN,
            halvings: 0,
        }
    }

    /// Add the mean value over [t0, t1). Intervals must come in time order.
    pub fn push(&mut self, t0: MonoNs, t1: MonoNs, v: f64) {
        if t1 <= t0 || !v.is_finite() {
            return;
        }
        if self.max.is_nan() || v > self.max {
            self.max = v;
        }
        self.pts.push(Point { t0, t1, v });
        if self.pts.len() > self.cap {
            self.halve();
        }
    }

    fn halve(&mut self) {
        let mut out = Vec::with_capacity(self.pts.len() / 2 + 1);
        for pair in self.pts.chunks(2) {
            if pair.len() == 2 {
                let (a, b) = (pair[0], pair[1]);
                let (da, db) = (a.dur_s(), b.dur_s());
                let v = (a.v * da + b.v * db) / (da + db);
                out.push(Point {
                    t0: a.t0,
                    t1: b.t1,
                    v,
                });
            } else {
                out.push(pair[0]);
            }
        }
        self.pts = out;
        self.halvings += 1;
    }

    /// How many times neighbouring points were merged pairwise to stay
    /// within the cap (0: every pushed interval is kept).
    pub fn halvings(&self) -> u32 {
        self.halvings
    }

    pub fn points(&self) -> &[Point] {
        &self.pts
    }
    pub fn is_empty(&self) -> bool {
        self.pts.is_empty()
    }
    /// Largest value pushed (before any merging), NaN when empty.
    pub fn max(&self) -> f64 {
        self.max
    }

    /// Time-weighted mean over the whole series.
    pub fn mean(&self) -> f64 {
        let (mut sum, mut dur) = (0.0, 0.0);
        for p in &self.pts {
            sum += p.v * p.dur_s();
            dur += p.dur_s();
        }
        if dur > 0.0 {
            sum / dur
        } else {
            f64::NAN
        }
    }

    /// Time-weighted mean over [from, to) (partial overlaps weighted).
    pub fn mean_in(&self, from: MonoNs, to: MonoNs) -> Option<f64> {
        let (mut sum, mut dur) = (0.0, 0.0);
        let start = self.pts.partition_point(|p| p.t1 <= from);
        for p in &self.pts[start..] {
            if p.t0 >= to {
                break;
            }
            let a = p.t0.max(from).0;
            let b = p.t1.min(to).0;
            if b > a {
                let d = (b - a) as f64;
                sum += p.v * d;
                dur += d;
            }
        }
        (dur > 0.0).then(|| sum / dur)
    }

    /// ∫ value dt over [from, to), in value × seconds (a point partly
    /// inside counts for the part inside, its value spread evenly).
    pub fn integral_in(&self, from: MonoNs, to: MonoNs) -> f64 {
        let mut sum = 0.0;
        let start = self.pts.partition_point(|p| p.t1 <= from);
        for p in &self.pts[start..] {
            if p.t0 >= to {
                break;
            }
            let a = p.t0.max(from).0;
            let b = p.t1.min(to).0;
            if b > a {
                sum += p.v * (b - a) as f64 / 1e9;
            }
        }
        sum
    }

    /// The value at `t` (None outside the points).
    pub fn value_at(&self, t: MonoNs) -> Option<f64> {
        let i = self.pts.partition_point(|p| p.t1 <= t);
        self.pts.get(i).filter(|p| p.t0 <= t).map(|p| p.v)
    }

    /// Time-weighted quantile (0..=1) of the values.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v: Vec<(f64, f64)> = self.pts.iter().map(|p| (p.v, p.dur_s())).collect();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = v.iter().map(|x| x.1).sum();
        let mut acc = 0.0;
        for (val, d) in &v {
            acc += d;
            if acc >= q * total {
                return *val;
            }
        }
        v.last().map(|x| x.0).unwrap_or(f64::NAN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_mean_preserving() {
        let mut s = Series::with_cap(16);
        for i in 0..1000u64 {
            s.push(MonoNs(i * 100), MonoNs((i + 1) * 100), (i % 2) as f64);
        }
        assert!(s.points().len() <= 16);
        assert!((s.mean() - 0.5).abs() < 1e-9);
        assert_eq!(s.points()[0].t0, MonoNs(0));
        assert_eq!(s.points().last().unwrap().t1, MonoNs(100_000));
        assert_eq!(s.max(), 1.0);
    }

    #[test]
    fn windowed_mean_and_quantile() {
        let mut s = Series::default();
        s.push(MonoNs(0), MonoNs(10), 1.0);
        s.push(MonoNs(10), MonoNs(20), 3.0);
        assert_eq!(s.mean_in(MonoNs(5), MonoNs(15)), Some(2.0));
        assert_eq!(s.mean_in(MonoNs(30), MonoNs(40)), None);
        assert_eq!(s.quantile(0.25), 1.0);
        assert_eq!(s.quantile(0.95), 3.0);
        // 1.0 × 5 ns + 3.0 × 5 ns.
        assert!((s.integral_in(MonoNs(5), MonoNs(15)) - 20e-9).abs() < 1e-18);
        assert_eq!(s.value_at(MonoNs(10)), Some(3.0));
        assert_eq!(s.value_at(MonoNs(20)), None);
    }
}
