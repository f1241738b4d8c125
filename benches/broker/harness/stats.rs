//! Timing and statistics: a measurement's figure (operations, ops/s, p50, p99 in µs), medians
//! over rounds, and numbers written for reading.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, Default)]
pub struct Figure {
    /// Operations done in the measurement.
    pub ops: usize,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The machine's CPU busy while it was measured, as a share of all cores (NaN where not
    /// measured).
    pub busy: f64,
}

pub fn percentile(sorted: &[u32], pct: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    f64::from(sorted[(sorted.len() * pct / 100).min(sorted.len() - 1)])
}

pub fn figure(ops: usize, elapsed: Duration, mut latencies: Vec<u32>) -> Figure {
    latencies.sort_unstable();
    Figure {
        ops,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&latencies, 50),
        p99_us: percentile(&latencies, 99),
        busy: f64::NAN,
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

pub fn median_figure(figs: &[Figure]) -> Figure {
    Figure {
        ops: figs.iter().map(|f| f.ops).sum(),
        ops_per_sec: median(figs.iter().map(|f| f.ops_per_sec).collect()),
        p50_us: median(figs.iter().map(|f| f.p50_us).collect()),
        p99_us: median(figs.iter().map(|f| f.p99_us).collect()),
        busy: median(figs.iter().map(|f| f.busy).collect()),
    }
}

pub fn micros_since(start: Instant) -> u32 {
    u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX)
}

pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The machine's CPU time so far, in clock ticks: (busy, all), from the first line of
/// `/proc/stat` (idle and I/O wait are not busy). None off Linux.
pub fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let all: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some((all - idle, all))
}

/// CPU ticks summed over several stretches of load: (busy, all).
#[derive(Default)]
pub struct CpuSpan(u64, u64);

impl CpuSpan {
    /// Adds the stretch between two readings of [`cpu_ticks`].
    pub fn add(&mut self, from: Option<(u64, u64)>, to: Option<(u64, u64)>) {
        if let (Some((b0, a0)), Some((b1, a1))) = (from, to) {
            self.0 += b1.saturating_sub(b0);
            self.1 += a1.saturating_sub(a0);
        }
    }

    /// The busy share over the stretches (NaN for none).
    pub fn share(&self) -> f64 {
        match self.1 {
            0 => f64::NAN,
            all => self.0 as f64 / all as f64,
        }
    }
}
