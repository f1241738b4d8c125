//! A cron table: an ordered list of entries, each a rule, an action, an optional schedule-next
//! and an optional on-remove, all given the tick (ccron's table). Periodic entries
//! ([`Periodic`]) keep their next run in `cron_state`: the rule holds once the tick reaches it,
//! and the next run is written *before* the action (LUCI's "state before side effects"), so a
//! restart neither repeats a run that started nor skips one that was due.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use tracing::{debug, warn};

use std::time::Instant;

use super::{EntryReport, Tick, TickReport};
use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::queue::QueueError;
use crate::schedules::ScheduleError;
use crate::storage::{self, DbPool, StorageError};

/// What an entry's action came to: a summary for logs and tests, or why it failed.
pub type Outcome = Result<String, CronError>;

/// Why an entry did not run or failed; the table logs it and runs the next entry. The messages
/// are those of the layer that failed.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    /// An engine refused or could not take the entry's command.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The schedules could not be read or settled.
    #[error(transparent)]
    Schedules(#[from] ScheduleError),
    /// The database could not be read or written (the entry's statements, or `cron_state`).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A retention too long to count back from the tick's time.
    #[error("retention {0:?} is too long to count back from the tick")]
    Retention(std::time::Duration),
}

/// A future an entry returns.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One entry of a cron table.
pub trait Entry: Send + Sync {
    /// Its name (unique in its table).
    fn name(&self) -> &'static str;

    /// Whether the action runs on `tick`.
    fn rule<'a>(&'a self, _tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async { true })
    }

    /// The work.
    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome>;

    /// Called when the rule held, before the action: record what must survive a restart.
    fn schedule_next<'a>(&'a self, _tick: &'a Tick) -> Fut<'a, Result<(), CronError>> {
        Box::pin(async { Ok(()) })
    }

    /// Called when the entry is taken out of its table.
    fn on_remove(&self) {}
}

/// An ordered list of entries.
#[derive(Default)]
pub struct CronTable {
    entries: Vec<Box<dyn Entry>>,
}

impl CronTable {
    /// Appends an entry; entries run in the order they were added.
    pub fn push(&mut self, entry: impl Entry + 'static) -> &mut Self {
        self.entries.push(Box::new(entry));
        self
    }

    /// Takes an entry out by name; answers whether there was one.
    pub fn remove(&mut self, name: &str) -> bool {
        match self.entries.iter().position(|e| e.name() == name) {
            Some(i) => {
                self.entries.remove(i).on_remove();
                true
            }
            None => false,
        }
    }

    /// The entries' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name()).collect()
    }

    /// Runs every entry for `tick`, in order; one entry failing does not stop the next. Each
    /// action's duration, and how late it started after the tick's time on `clock`, go to
    /// `metrics`.
    pub async fn run(&mut self, tick: &Tick, metrics: &Metrics, clock: &SharedClock) -> TickReport {
        let mut report = TickReport::default();
        for e in &self.entries {
            let mut r = EntryReport::default();
            if e.rule(tick).await {
                r.ran = true;
                r.summary = match e.schedule_next(tick).await {
                    Err(why) => format!("not run: {why}"),
                    Ok(()) => {
                        let lag = (clock.now() - tick.at).to_std().unwrap_or_default();
                        let started = Instant::now();
                        let outcome = e.action(tick).await;
                        metrics.cron_run(
                            tick.component.as_str(),
                            e.name(),
                            lag,
                            started.elapsed(),
                            outcome.is_err(),
                        );
                        match outcome {
                            Ok(s) => s,
                            Err(why) => {
                                warn!(component = %tick.component, entry = e.name(), error = %why, "cron entry failed");
                                format!("failed: {why}")
                            }
                        }
                    }
                };
                debug!(component = %tick.component, entry = e.name(), seq = tick.seq, summary = %r.summary, "cron entry ran");
            }
            report.entries.insert(e.name(), r);
        }
        report
    }
}

/// A periodic entry: runs `inner` once every `period`, its next run kept in `cron_state`.
pub struct Periodic<E> {
    inner: E,
    period: chrono::Duration,
    pool: DbPool,
}

impl<E: Entry> Periodic<E> {
    /// `inner` every `period`.
    pub fn new(inner: E, period: std::time::Duration, pool: DbPool) -> Self {
        Self {
            inner,
            period: chrono::Duration::from_std(period).unwrap_or(chrono::Duration::MAX),
            pool,
        }
    }

    async fn db<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut storage::AnyConnection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        storage::run(&self.pool, f).await
    }
}

impl<E: Entry> Entry for Periodic<E> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn rule<'a>(&'a self, tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async move {
            let (component, entry) = (tick.component.as_str(), self.inner.name());
            match self
                .db(move |c| Ok(storage::cron_state::next_run(c, component, entry)?))
                .await
            {
                // Never ran: due now.
                Ok(None) => true,
                // A next run more than a period ahead was set by a clock that ran ahead (this
                // host's before a correction, or an instance's with a skewed clock): trusted, it
                // would hold the entry (the lease watchdog, prune) off for the whole skew.
                Ok(Some(next)) => {
                    let next = next.and_utc();
                    tick.at >= next || next > tick.at + self.period
                }
                Err(e) => {
                    warn!(component, entry, error = %e, "cron state unreadable; entry skipped this tick");
                    false
                }
            }
        })
    }

    fn schedule_next<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Result<(), CronError>> {
        Box::pin(async move {
            let (component, entry) = (tick.component.as_str(), self.inner.name());
            let next: DateTime<Utc> = tick.at + self.period;
            let (ran, next) = (tick.at.naive_utc(), next.naive_utc());
            Ok(self
                .db(move |c| {
                    Ok(storage::cron_state::set_next_run(
                        c, component, entry, ran, next,
                    )?)
                })
                .await?)
        })
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        self.inner.action(tick)
    }

    fn on_remove(&self) {
        self.inner.on_remove();
    }
}
