//! The time source. Everything that reads the time takes a [`Clock`], so tests drive time by hand
//! instead of sleeping, and timestamps are cut to the microsecond both databases keep.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Duration, Utc};

/// A source of "now".
pub trait Clock: Send + Sync + 'static {
    /// The current time, truncated to whole microseconds.
    fn now(&self) -> DateTime<Utc>;
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        truncate_micros(Utc::now())
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    micros: AtomicI64,
}

impl ManualClock {
    /// A clock standing still at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            micros: AtomicI64::new(start.timestamp_micros()),
        }
    }

    /// Moves the clock forward (or back, with a negative duration).
    pub fn advance(&self, by: Duration) {
        let step = by.num_microseconds().unwrap_or(i64::MAX);
        self.micros.fetch_add(step, Ordering::SeqCst);
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: DateTime<Utc>) {
        self.micros.store(to.timestamp_micros(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(self.micros.load(Ordering::SeqCst)).unwrap_or_default()
    }
}

/// Cuts a time to whole microseconds: PostgreSQL keeps no more, and a task's rank in the heap must
/// be the same before and after a restart.
pub fn truncate_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}
