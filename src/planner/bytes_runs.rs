//! When planned work last ran, as Bytes recorded it. mula asks Bytes before every boefje push
//! whether the boefje ran on the object within its grace period, or is running still. Here the
//! `tasks` table answers for the work this service handed out; Bytes is asked only for work the
//! table has no finished run of: after a switch from mula without `import-mula`, after history
//! was pruned (`SCHEDULER_TASK_RETENTION_DAYS`), after a database was started afresh. Without
//! it, the first ColdStart of such a deployment runs every boefje on every object again at once,
//! whatever ran an hour before.
//!
//! Bytes lists an object's runs newest first, so one call per object and organisation answers
//! for all its boefjes (a boefje missing from a full page is asked alone). Calls go a few at a
//! time within a window. Bytes down, slow or refusing never holds work up: what it did not answer
//! is planned as the table says, as it would be with no Bytes configured, and Bytes is not asked
//! again before its backoff has passed; the outage is logged once when it starts and once when
//! it ends, and every piece of work asked about is counted (`scheduler_run_lookups_total`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use tracing::{info, warn};

use crate::clients::ClientError;
use crate::clients::bytes::{BoefjeMeta, Bytes};
use crate::metrics::{Metrics, RunLookupOutcome};

/// Bytes calls in flight at once.
const CONCURRENCY: usize = 8;
/// Runs read per object in one call: an object's boefjes, with room for their reruns.
const PAGE: usize = 50;
/// Longest one planning step waits for Bytes; what it has not answered by then is planned as the
/// table says.
const WINDOW: Duration = Duration::from_secs(5);
/// First wait before Bytes is asked again after a failure; it doubles per failure in a row.
const BACKOFF_FIRST_SECS: i64 = 5;
/// Longest wait between two tries while Bytes keeps failing.
const BACKOFF_CAP_SECS: i64 = 300;

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
}

impl BytesRuns {
    /// Asks `bytes`; counts into `metrics`.
    pub fn new(bytes: Bytes, metrics: Arc<Metrics>) -> Self {
        Self {
            bytes: Arc::new(bytes),
            metrics,
            backoff: Arc::default(),
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
        let mut out = vec![None; asks.len()];
        if asks.is_empty() {
            return out;
        }
        if self.backing_off(now) {
            self.metrics
                .run_lookups(RunLookupOutcome::Deferred, asks.len() as u64);
            return out;
        }
        // Owned, so the calls' futures borrow nothing but the client.
        let mut objects: HashMap<(String, String), Vec<(usize, String)>> = HashMap::new();
        for (i, a) in asks.iter().enumerate() {
            objects
                .entry((a.organisation.to_owned(), a.input_ooi.to_owned()))
                .or_default()
                .push((i, a.boefje.to_owned()));
        }
        let bytes = self.bytes.clone();
        let calls = objects.into_iter().map(move |((org, ooi), boefjes)| {
            let bytes = bytes.clone();
            async move {
                let answer = object(&bytes, &org, &ooi, &boefjes).await;
                (boefjes, answer)
            }
        });
        let mut answers = futures_util::stream::iter(calls).buffer_unordered(CONCURRENCY);
        let deadline = tokio::time::Instant::now() + WINDOW;
        let mut failure = None;
        let mut asked = 0_usize;
        loop {
            match tokio::time::timeout_at(deadline, answers.next()).await {
                Ok(Some((at, Ok(runs)))) => {
                    asked += at.len();
                    let ran = runs.iter().filter(|r| r.is_some()).count() as u64;
                    self.metrics.run_lookups(RunLookupOutcome::Ran, ran);
                    self.metrics
                        .run_lookups(RunLookupOutcome::None, at.len() as u64 - ran);
                    for ((i, _), run) in at.into_iter().zip(runs) {
                        out[i] = run;
                    }
                }
                Ok(Some((at, Err(e)))) => {
                    asked += at.len();
                    self.metrics
                        .run_lookups(RunLookupOutcome::Failed, at.len() as u64);
                    failure.get_or_insert(e.to_string());
                }
                Ok(None) => break,
                Err(_) => {
                    let left = asks.len().saturating_sub(asked) as u64;
                    self.metrics.run_lookups(RunLookupOutcome::Failed, left);
                    failure.get_or_insert(format!("no answer within {} s", WINDOW.as_secs()));
                    break;
                }
            }
        }
        match failure {
            Some(why) => self.failed(now, &why),
            None => self.answered(),
        }
        out
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
        let first_of_outage = backoff.is_none();
        let failures = backoff.map_or(0, |b| b.failures).saturating_add(1);
        let wait = BACKOFF_FIRST_SECS
            .saturating_mul(1_i64 << failures.saturating_sub(1).min(16))
            .min(BACKOFF_CAP_SECS);
        *backoff = Some(Backoff {
            failures,
            retry_at: now + chrono::Duration::seconds(wait),
        });
        if first_of_outage {
            warn!(error = %why, retry_in_secs = wait, "Bytes cannot say when work the tasks table has no run of last ran; it is planned as the table says until Bytes answers");
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

/// The last runs of `boefjes` (each with its ask's index) on one object.
async fn object(
    bytes: &Bytes,
    organisation: &str,
    input_ooi: &str,
    boefjes: &[(usize, String)],
) -> Result<Vec<Option<DateTime<Utc>>>, ClientError> {
    let page = bytes
        .boefje_metas(organisation, Some(input_ooi), None, PAGE)
        .await?;
    let full = page.len() >= PAGE;
    let mut out = Vec::with_capacity(boefjes.len());
    for (_, boefje) in boefjes {
        // Newest first: the first run of the boefje is its last.
        let mut run = page
            .iter()
            .find(|m| m.boefje.as_ref().is_some_and(|b| &b.id == boefje))
            .and_then(when);
        if run.is_none() && full {
            // The page holds other boefjes' runs only; this one may have run before them.
            run = bytes
                .boefje_metas(organisation, Some(input_ooi), Some(boefje), 1)
                .await?
                .first()
                .and_then(when);
        }
        out.push(run);
    }
    Ok(out)
}

/// When a run counts as the last: when it ended, else (still running) when it started.
fn when(meta: &BoefjeMeta) -> Option<DateTime<Utc>> {
    meta.ended_at.or(meta.started_at)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use chrono::TimeZone;

    use super::*;
    use crate::clients::http::Backoff as Retries;
    use crate::clients::http::stub::Stub;

    /// Bytes answering `org1`'s object runs, or 500 while `failing`.
    fn stub(failing: Arc<AtomicBool>) -> Stub {
        Stub::start(move |s| match s.path.as_str() {
            "/token" => (200, r#"{"access_token":"t1"}"#.into()),
            _ if failing.load(Ordering::SeqCst) => (500, r#"{"detail":"boom"}"#.into()),
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
        BytesRuns::new(bytes, Arc::new(Metrics::default()))
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
        assert_eq!(listings(&stub), 1, "one call for the object's two boefjes");

        // Within the backoff Bytes is not asked, even once it would answer.
        failing.store(false, Ordering::SeqCst);
        let t1 = t0 + chrono::Duration::seconds(4);
        assert_eq!(runs.last_runs(&asks, t1).await, [None, None]);
        assert_eq!(listings(&stub), 1);

        // After it, Bytes' word counts: dns-records runs still, started at ten.
        let t2 = t0 + chrono::Duration::seconds(6);
        let started = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap();
        assert_eq!(runs.last_runs(&asks, t2).await, [Some(started), None]);
        assert_eq!(listings(&stub), 2);
    }
}
