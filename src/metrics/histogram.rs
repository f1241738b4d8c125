//! A histogram recorded with relaxed atomic adds, encoded by prometheus-client like its own.
//!
//! prometheus-client's `Histogram` takes a mutex on every observation; the pop and push paths
//! observe a latency on every answer, from every HTTP worker at once, and must not queue on a
//! lock for it. This one is a count per bucket and a sum, each an atomic, and implements the
//! client's encoding traits so it is registered, labelled (`Family`) and written like any of
//! the client's metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A Prometheus histogram: a count per bucket (not cumulative; the encoder sums them) and the
/// sum of the observations. Clones share their figures, as the client's metrics do.
#[derive(Debug, Clone)]
pub struct Histogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    bounds: &'static [f64],
    /// One per bound, then one for `+Inf`.
    buckets: Box<[AtomicU64]>,
    /// The sum, in millionths of the unit (atomics hold integers).
    sum_micro: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending, finite).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            inner: Arc::new(Inner {
                bounds,
                buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
                sum_micro: AtomicU64::new(0),
            }),
        }
    }

    /// Records one observation of `value` (seconds, or a count).
    pub fn observe(&self, value: f64) {
        let inner = &*self.inner;
        let i = inner
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(inner.bounds.len());
        inner.buckets[i].fetch_add(1, Ordering::Relaxed);
        inner
            .sum_micro
            .fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    /// Records a duration, in seconds.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner
            .buckets
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        // The last bucket is written as `+Inf` and the count is the buckets' sum, both from the
        // one read of the buckets: an observation landing meanwhile cannot make the page's
        // `+Inf` bucket disagree with its `_count`.
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(inner.buckets.iter().map(|n| n.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = inner.sum_micro.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(
            sum,
            count,
            &buckets,
            None::<&HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::prometheus_text::encode;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;

    #[test]
    fn buckets_are_cumulative_with_sum_and_count() {
        let family =
            Family::<[(&str, &str); 1], Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(&[0.1, 1.0])
            });
        let h = family.get_or_create_owned(&[("a", "b")]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut registry = Registry::default();
        registry.register("x", "X", family);
        let mut page = String::new();
        encode(&mut page, &registry).unwrap();
        assert!(page.contains("# TYPE x histogram\n"), "{page}");
        assert!(page.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"), "{page}");
        assert!(page.contains("x_bucket{a=\"b\",le=\"1\"} 3\n"), "{page}");
        assert!(page.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), "{page}");
        assert_eq!(page.matches("le=\"+Inf\"").count(), 1, "{page}");
        assert!(page.contains("x_sum{a=\"b\"} 4.25\n"), "{page}");
        assert!(page.contains("x_count{a=\"b\"} 4\n"), "{page}");
        assert_eq!(h.count(), 4);
    }
}
