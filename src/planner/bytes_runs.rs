//! When planned work last ran, as Bytes recorded it. mula asks Bytes before every boefje push
//! whether the boefje ran on the object within its grace period, or is running still. Here the
//! `tasks` table answers for the work handed out since its history begins; Bytes is asked only
//! for work whose wait reaches back before that (the history's horizon): after a switch from
//! mula without `import-mula`, or a database started afresh, for a grace period (a plugin's
//! interval, if longer); and where tasks older than `SCHEDULER_TASK_RETENTION_DAYS` are pruned,
//! for work whose wait is longer. Without it, the first ColdStart of such a deployment runs every
//! boefje on every object again at once, whatever ran an hour before. Once the history covers
//! the waits, Bytes is not asked at all, so planning costs it nothing.
//!
//! Each piece of work is one call, mula's (`boefje_id`, `input_ooi`, `organization`, `limit=1`,
//! which Bytes' index on organisation and boefje serves), a few at a time, for 30 s at most a
//! planning step. Bytes down, slow or
//! refusing never holds work up: what it did not answer is planned as the table says, as with no
//! Bytes configured, and Bytes is not asked again before its backoff has passed (5 s doubling to
//! 5 min); the outage is logged once when it starts and once when it ends, and every piece of
//! work asked about is counted (`scheduler_run_lookups_total`).

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use tracing::{info, warn};

use crate::clients::bytes::{BoefjeMeta, Bytes};
use crate::clients::http::OUTAGE;
use crate::metrics::{Metrics, RunLookupOutcome};

/// Bytes calls in flight at once.
const CONCURRENCY: usize = 8;
/// Longest one planning step goes on asking Bytes: work whose call has not started by then is
/// planned as the table says (a slow Bytes delays planning by this at most, plus a call).
const WINDOW: std::time::Duration = std::time::Duration::from_secs(30);

/// One piece of planned work to ask about: a boefje on an object of an organisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The organisation.
    pub organisation: &'a str,
    /// The object's reference (`input_ooi`).
    pub input_ooi: &'a str,
    /// The boefje's id.
    pub boefje: &'a str,
}

/// Failures in a row and when Bytes may be asked again.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    retry_at: DateTime<Utc>,
}

/// Asks Bytes when planned work last ran.
#[derive(Clone)]
pub struct BytesRuns {
    bytes: Arc<Bytes>,
    metrics: Arc<Metrics>,
    backoff: Arc<Mutex<Option<Backoff>>>,
    /// Since when every run is in the tasks table: its oldest task's creation, or the service's
    /// start when it was empty (work since ran through it).
    since: DateTime<Utc>,
    /// Tasks finished longer ago than this are pruned (`SCHEDULER_TASK_RETENTION_DAYS`).
    retention: Option<chrono::Duration>,
}

impl BytesRuns {
    /// Asks `bytes`; the tasks table holds every run since `since`, and those of the last
    /// `retention` when it prunes; counts into `metrics`.
    pub fn new(
        bytes: Bytes,
        since: DateTime<Utc>,
        retention: Option<chrono::Duration>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            bytes: Arc::new(bytes),
            metrics,
            backoff: Arc::default(),
            since,
            retention,
        }
    }

    /// The moment before which the tasks table may lack runs, at `now`.
    pub fn horizon(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self.retention.and_then(|kept| now.checked_sub_signed(kept)) {
            Some(cut) => self.since.max(cut),
            None => self.since,
        }
    }

    /// For each ask, when Bytes says its boefje last ran on its object: when the newest run
    /// ended, or, for one still running, when it started (mula holds work back while Bytes
    /// says it runs). `None` where Bytes has no run, or did not answer.
    pub async fn last_runs(
        &self,
        asks: &[Ask<'_>],
        now: DateTime<Utc>,
    ) -> Vec<Option<DateTime<Utc>>> {
        if asks.is_empty() {
            return Vec::new();
        }
        // Owned, so the calls' futures borrow nothing but the client.
        let owned: Vec<(String, String, String)> = asks
            .iter()
            .map(|a| {
                (
                    a.organisation.to_owned(),
                    a.input_ooi.to_owned(),
                    a.boefje.to_owned(),
                )
            })
            .collect();
        let deadline = tokio::time::Instant::now() + WINDOW;
        let calls = owned.into_iter().map(|(org, ooi, boefje)| async move {
            // Once a call failed, the rest wait for the backoff: a hung Bytes costs one call's
            // timeout a backoff, not one per piece of work.
            if self.backing_off(now) || tokio::time::Instant::now() >= deadline {
                self.metrics.run_lookups(RunLookupOutcome::Deferred, 1);
                return None;
            }
            match self
                .bytes
                .boefje_metas(&org, Some(&ooi), Some(&boefje), 1)
                .await
            {
                Ok(runs) => {
                    let ran = runs.first().and_then(when);
                    let outcome = match ran {
                        Some(_) => RunLookupOutcome::Ran,
                        None => RunLookupOutcome::None,
                    };
                    self.metrics.run_lookups(outcome, 1);
                    self.answered();
                    ran
                }
                Err(e) => {
                    self.metrics.run_lookups(RunLookupOutcome::Failed, 1);
                    self.failed(now, &e.to_string());
                    None
                }
            }
        });
        futures_util::stream::iter(calls)
            .buffered(CONCURRENCY)
            .collect()
            .await
    }

    fn backing_off(&self, now: DateTime<Utc>) -> bool {
        self.backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|b| now < b.retry_at)
    }

    fn failed(&self, now: DateTime<Utc>, why: &str) {
        let mut backoff = self
            .backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Calls in flight together fail together: one failure a backoff counts.
        if backoff.is_some_and(|b| now < b.retry_at) {
            return;
        }
        let first_of_outage = backoff.is_none();
        let failures = backoff.map_or(0, |b| b.failures).saturating_add(1);
        let wait = OUTAGE.wait(failures);
        *backoff = Some(Backoff {
            failures,
            retry_at: now + wait,
        });
        if first_of_outage {
            warn!(error = %why, retry_in_secs = wait.num_seconds(), "Bytes cannot say when work the tasks table has no run of last ran; it is planned as the table says until Bytes answers");
        }
    }

    fn answered(&self) {
        let mut backoff = self
            .backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if backoff.take().is_some() {
            info!(
                "Bytes answers again: planned work the tasks table has no run of is checked against its runs"
            );
        }
    }
}

/// When a run counts as the last: when it ended, else (still running) when it started.
fn when(meta: &BoefjeMeta) -> Option<DateTime<Utc>> {
    meta.ended_at.or(meta.started_at)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use chrono::TimeZone;

    use super::*;
    use crate::clients::http::Backoff as Retries;
    use crate::clients::http::stub::Stub;

    /// Bytes answering `org1`'s object runs, or 500 while `failing`.
    fn stub(failing: Arc<AtomicBool>) -> Stub {
        Stub::start(move |s| match s.path.as_str() {
            "/token" => (200, r#"{"access_token":"t1"}"#.into()),
            _ if failing.load(Ordering::SeqCst) => (500, r#"{"detail":"boom"}"#.into()),
            _ if !s.query.contains("boefje_id=dns-records") => (200, "[]".into()),
            _ => (
                200,
                r#"[{"id": "6f1a3f5e-9b4c-4d8e-8a57-0f6b2a1c9d10", "boefje": {"id": "dns-records"},
                     "started_at": "2026-01-01T10:00:00", "ended_at": null}]"#
                    .into(),
            ),
        })
    }

    fn runs(stub: &Stub) -> BytesRuns {
        let bytes = Bytes::new(&stub.base, "u", "p", Duration::from_secs(5))
            .unwrap()
            .with_backoff(Retries {
                attempts: 1,
                ..Retries::default()
            });
        let since = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        BytesRuns::new(bytes, since, None, Arc::new(Metrics::default()))
    }

    fn listings(stub: &Stub) -> usize {
        stub.seen()
            .iter()
            .filter(|s| s.path == "/bytes/boefje_meta")
            .count()
    }

    #[tokio::test]
    async fn a_failing_bytes_answers_nothing_and_is_asked_again_only_after_its_backoff() {
        let failing = Arc::new(AtomicBool::new(true));
        let stub = stub(failing.clone());
        let runs = runs(&stub);
        let asks = [
            Ask {
                organisation: "org1",
                input_ooi: "Hostname|internet|a.nl",
                boefje: "dns-records",
            },
            Ask {
                organisation: "org1",
                input_ooi: "Hostname|internet|a.nl",
                boefje: "nmap",
            },
        ];
        let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
        assert_eq!(runs.last_runs(&asks, t0).await, [None, None]);
        let failed = listings(&stub);
        assert!(
            (1..=2).contains(&failed),
            "{failed}: those in flight together"
        );

        // Within the backoff Bytes is not asked, even once it would answer.
        failing.store(false, Ordering::SeqCst);
        let t1 = t0 + chrono::Duration::seconds(4);
        assert_eq!(runs.last_runs(&asks, t1).await, [None, None]);
        assert_eq!(listings(&stub), failed);

        // After it, Bytes' word counts: dns-records runs still, started at ten.
        let t2 = t0 + chrono::Duration::seconds(6);
        let started = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap();
        assert_eq!(runs.last_runs(&asks, t2).await, [Some(started), None]);
        assert_eq!(
            listings(&stub),
            failed + 2,
            "one call for each piece of work"
        );
        let asked: Vec<Vec<(String, String)>> = stub
            .seen()
            .iter()
            .filter(|s| s.path == "/bytes/boefje_meta")
            .map(|s| s.query_pairs())
            .collect();
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert!(asked.contains(&vec![
            pair("boefje_id", "nmap"),
            pair("input_ooi", "Hostname|internet|a.nl"),
            pair("organization", "org1"),
            pair("limit", "1"),
            pair("descending", "true"),
        ]));
    }

    #[test]
    fn the_tables_history_begins_at_its_oldest_task_or_where_pruning_cuts_it() {
        let since = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        // Never called: the horizon is arithmetic.
        let bytes = || Bytes::new("http://127.0.0.1:9", "u", "p", Duration::from_secs(5)).unwrap();
        let metrics = || Arc::new(Metrics::default());
        let kept = BytesRuns::new(bytes(), since, None, metrics());
        let later = since + chrono::Duration::days(400);
        assert_eq!(kept.horizon(later), since);
        let pruned = BytesRuns::new(bytes(), since, Some(chrono::Duration::days(30)), metrics());
        assert_eq!(pruned.horizon(later), later - chrono::Duration::days(30));
        assert_eq!(pruned.horizon(since + chrono::Duration::days(1)), since);
    }
}
