//! What is known of objects the frontier is asked about: the frontier is a mirror of Octopoes
//! fed by events and ColdStart, never the verdict. It lacks objects of organisations Katalogus
//! does not list, objects created while the listener was down or before it started, everything
//! while the first ColdStart runs and everything right after a switch from mula; and its rows
//! lag Octopoes by an event's delivery, or for good when an event was dead-lettered. So an
//! object a decision that cannot be undone rests on (a fire, a disable, a cancel) is asked of
//! Octopoes (mula's `GET /{org}/object`, which mula asks on every fire), the answer recorded in
//! the frontier, and only Octopoes' own "not found" says gone. Only with no Octopoes to ask does
//! a row's word stand.
//!
//! Octopoes unreachable, slow or erroring leaves the object [`Known::Unavailable`]: the caller
//! waits rather than decides. Calls are bounded (a budget per caller's run, a few at a time) and
//! an organisation whose calls fail is not asked again before its backoff has passed, so an
//! outage costs neither the cron tables nor the API; it is logged once when it starts and once
//! when it ends, and every lookup is counted (`scheduler_object_lookups_total`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use tracing::{info, warn};

use super::Frontier;
use crate::clients::ClientError;
use crate::clients::http::OUTAGE;
use crate::clients::octopoes::{Lookup, Octopoes, OctopoesObject};
use crate::clock::SharedClock;
use crate::domain::event::{ObjectEvent, ObjectState, Operation};
use crate::metrics::{LookupOutcome, Metrics};
use crate::storage::StorageError;
use crate::storage::frontier::FrontierRow;

/// Octopoes calls in flight at once per lookup.
const CONCURRENCY: usize = 8;
/// Default Octopoes calls one cron run may make (the rest wait for the next tick).
pub const DEFAULT_BUDGET: usize = 500;
/// Objects refused by Octopoes remembered at most (past these, they are asked at every run).
const REFUSALS_REMEMBERED: usize = 10_000;
/// How long an object Octopoes refused to read waits before it is asked again.
const REFUSED_WAIT_SECS: i64 = 300;
/// The backoff key of failures of Octopoes itself (unreachable, an error status): they hold
/// every organisation's lookups back. No organisation id is empty.
const SERVICE_WIDE: &str = "";

/// What is known of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Known {
    /// It exists, as the frontier (or Octopoes just now) holds it.
    Present(FrontierRow),
    /// Deleted: a frontier row marked gone, or Octopoes' own "not found".
    Gone,
    /// The frontier lacks it and no Octopoes is configured to ask: nothing says it is gone.
    Unverifiable,
    /// The frontier lacks it and Octopoes could not answer now (down, erroring, backing off, or
    /// this run's budget spent): ask again later.
    Unavailable,
}

/// Per organisation: failures in a row and when to try again.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    retry_at: DateTime<Utc>,
}

/// The backoffs of the scopes whose lookups failed (organisations, and [`SERVICE_WIDE`]).
#[derive(Debug, Default)]
struct Backoffs(HashMap<String, Backoff>);

impl Backoffs {
    /// Whether `organisation`'s lookups wait (its own backoff, or Octopoes' as a whole).
    fn backing_off(&self, organisation: &str, now: DateTime<Utc>) -> bool {
        [SERVICE_WIDE, organisation]
            .iter()
            .any(|k| self.0.get(*k).is_some_and(|b| now < b.retry_at))
    }

    /// Records a failure of `scope`: answers its wait, and whether it starts an outage (no
    /// other scope was backing off).
    fn failed(&mut self, scope: &str, now: DateTime<Utc>) -> (chrono::Duration, bool) {
        // A scope not asked again since its backoff passed long ago (an organisation deleted,
        // never looked up again) is forgotten: its streak is stale, and it would keep the map
        // from ever being empty, so no outage would be logged as starting again.
        let stale = now - OUTAGE.wait(u32::MAX);
        self.0.retain(|_, b| b.retry_at > stale);
        let first_of_outage = self.0.is_empty();
        let b = self.0.entry(scope.to_owned()).or_insert(Backoff {
            failures: 0,
            retry_at: now,
        });
        b.failures = b.failures.saturating_add(1);
        let wait = OUTAGE.wait(b.failures);
        b.retry_at = now + wait;
        (wait, first_of_outage)
    }

    /// `scope` answered: answers whether that ends the outage (no scope backs off any more).
    fn answered(&mut self, scope: &str) -> bool {
        self.0.remove(scope).is_some() && self.0.is_empty()
    }
}

/// Looks objects up: the frontier first, Octopoes for what it lacks.
#[derive(Clone)]
pub struct ObjectLookup {
    frontier: Frontier,
    octopoes: Option<Octopoes>,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    backoff: Arc<Mutex<Backoffs>>,
    /// Objects Octopoes refused to read (400), each with when to ask again: an object its model
    /// cannot read stays so until Octopoes changes, and asking again every tick would spend the
    /// tick's budget of calls on it.
    refused: Arc<Mutex<HashMap<String, DateTime<Utc>>>>,
    /// Longest one lookup waits for Octopoes' answers; the unanswered wait for a later try.
    window: std::time::Duration,
}

impl ObjectLookup {
    /// A lookup over `frontier`, asking `octopoes` (when configured) for what it lacks.
    pub fn new(
        frontier: Frontier,
        octopoes: Option<Octopoes>,
        clock: SharedClock,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            frontier,
            octopoes,
            clock,
            metrics,
            backoff: Arc::default(),
            refused: Arc::default(),
            window: std::time::Duration::from_secs(crate::config::DEFAULT_LOOKUP_WINDOW_SECS),
        }
    }

    /// The same lookup waiting `window` at most for Octopoes' answers
    /// (`clients.lookup_window_secs`).
    pub fn with_window(self, window: std::time::Duration) -> Self {
        Self { window, ..self }
    }

    /// Whether an Octopoes is configured to ask (else every answer is the frontier's).
    pub fn asks_octopoes(&self) -> bool {
        self.octopoes.is_some()
    }

    /// What Octopoes says now of `references` of `organisation`, whatever the frontier holds:
    /// for decisions that cannot be undone (a fire runs its scan; a scan level too low or an
    /// object gone disables a schedule), since a frontier row may lag Octopoes (an event not yet
    /// delivered, or dead-lettered; ColdStart passes daily) and a row marked gone may have come
    /// back with no event announcing it. Octopoes is asked within `budget` (each call takes one)
    /// and the organisation's backoff, and its answers recorded in the frontier before they are
    /// returned; with no Octopoes to ask, the frontier's rows are the best word there is. A
    /// storage error is the caller's to handle (it knows nothing then).
    pub async fn confirmed(
        &self,
        organisation: &str,
        references: &[String],
        budget: &AtomicUsize,
    ) -> Result<HashMap<String, Known>, StorageError> {
        let mut out: HashMap<String, Known> = HashMap::new();
        let rows = self.frontier.objects(organisation, references).await?;
        // With Octopoes to ask, the rows only say since when an object is as it is.
        let mut mirrored: HashMap<String, FrontierRow> = HashMap::new();
        if self.octopoes.is_none() {
            out.extend(rows.into_iter().map(|r| match r.gone_at {
                Some(_) => (r.reference, Known::Gone),
                None => (r.reference.clone(), Known::Present(r)),
            }));
        } else {
            mirrored.extend(
                rows.into_iter()
                    .filter(|r| r.gone_at.is_none())
                    .map(|r| (r.reference.clone(), r)),
            );
        }
        let mut missing: Vec<String> = references
            .iter()
            .filter(|r| !out.contains_key(*r))
            .cloned()
            .collect();
        missing.sort();
        missing.dedup();
        if missing.is_empty() {
            return Ok(out);
        }
        let Some(octopoes) = &self.octopoes else {
            out.extend(missing.into_iter().map(|r| (r, Known::Unverifiable)));
            return Ok(out);
        };
        let now = self.clock.now();
        if self.backing_off(organisation, now) {
            self.metrics
                .object_lookups(LookupOutcome::Deferred, missing.len() as u64);
            out.extend(missing.into_iter().map(|r| (r, Known::Unavailable)));
            return Ok(out);
        }
        let mut asked = Vec::new();
        for r in missing {
            // An object Octopoes could not read waits out its own backoff, costing no call.
            if self.refused_lately(organisation, &r, now) {
                self.metrics.object_lookups(LookupOutcome::Deferred, 1);
                out.insert(r, Known::Unavailable);
                continue;
            }
            let took = budget
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
                .is_ok();
            if took {
                asked.push(r);
            } else {
                self.metrics.object_lookups(LookupOutcome::Deferred, 1);
                out.insert(r, Known::Unavailable);
            }
        }
        let mut unanswered: std::collections::HashSet<String> = asked.iter().cloned().collect();
        let calls = futures_util::stream::iter(asked.into_iter().map(|r| async move {
            let answer = octopoes.object(organisation, &r, now).await;
            (r, answer)
        }))
        .buffer_unordered(CONCURRENCY);
        futures_util::pin_mut!(calls);
        // A hung Octopoes holds the caller (a cron table) no longer than this.
        let deadline = tokio::time::Instant::now() + self.window;
        let mut answers = Vec::new();
        while let Ok(Some((reference, answer))) =
            tokio::time::timeout_at(deadline, calls.next()).await
        {
            unanswered.remove(&reference);
            answers.push((reference, answer));
        }
        let mut events = Vec::new();
        // Octopoes itself failing (no answer, an error status) holds every organisation's
        // lookups back; a 404 that says nothing of the object holds back only its organisation.
        let mut service_failure: Option<String> = None;
        let mut organisation_failure: Option<String> = None;
        if !unanswered.is_empty() {
            // Nothing answered: Octopoes is down or hung. Some answered: it is slow for this
            // many objects, and the rest wait for the next run, without holding anyone back.
            if answers.is_empty() {
                self.metrics
                    .object_lookups(LookupOutcome::Failed, unanswered.len() as u64);
                service_failure = Some(format!("no answer within {} s", self.window.as_secs()));
            } else {
                self.metrics
                    .object_lookups(LookupOutcome::Deferred, unanswered.len() as u64);
            }
            out.extend(unanswered.into_iter().map(|r| (r, Known::Unavailable)));
        }
        for (reference, answer) in answers {
            match answer {
                Ok(Lookup::Found(o)) => {
                    self.metrics.object_lookups(LookupOutcome::Found, 1);
                    let mut row = row(organisation, &reference, &o, now);
                    // As the frontier holds it: the object is as it was since then (a change
                    // of it is what a strategy weighs, not that it was asked about).
                    if let Some(m) = mirrored.get(&reference).filter(|m| {
                        (&m.object_type, m.scan_level, &m.scan_profile_type)
                            == (&row.object_type, row.scan_level, &row.scan_profile_type)
                    }) {
                        row.first_seen = m.first_seen;
                        row.last_seen = m.last_seen;
                        row.planned = m.planned;
                    }
                    out.insert(reference.clone(), Known::Present(row));
                    events.push(event(organisation, &reference, Some(&o)));
                }
                Ok(Lookup::NotFound) => {
                    self.metrics.object_lookups(LookupOutcome::NotFound, 1);
                    out.insert(reference.clone(), Known::Gone);
                    events.push(event(organisation, &reference, None));
                }
                Ok(Lookup::Refused(why)) => {
                    // This object alone: it waits, and the others are asked as before.
                    self.metrics.object_lookups(LookupOutcome::Failed, 1);
                    self.refused_once(organisation, &reference, &why, now);
                    out.insert(reference, Known::Unavailable);
                }
                Ok(Lookup::Unanswered(why)) => {
                    self.metrics.object_lookups(LookupOutcome::Failed, 1);
                    out.insert(reference, Known::Unavailable);
                    organisation_failure.get_or_insert(why);
                }
                Err(e) => {
                    self.metrics.object_lookups(LookupOutcome::Failed, 1);
                    out.insert(reference, Known::Unavailable);
                    let scope = match e {
                        ClientError::Decode { .. } => &mut organisation_failure,
                        _ => &mut service_failure,
                    };
                    scope.get_or_insert(e.to_string());
                }
            }
        }
        match (service_failure, organisation_failure) {
            (Some(why), _) => self.failed(SERVICE_WIDE, now, &why),
            (None, Some(why)) => {
                self.answered(SERVICE_WIDE);
                self.failed(organisation, now, &why);
            }
            (None, None) => {
                self.answered(SERVICE_WIDE);
                self.answered(organisation);
            }
        }
        if !events.is_empty() {
            let refs: Vec<&ObjectEvent> = events.iter().collect();
            self.frontier.record_answers(&refs, now.naive_utc()).await?;
        }
        Ok(out)
    }

    /// Which of `organisations` hold `reference` (not gone): the frontier's rows, and for the
    /// organisations it has no row of, Octopoes' answer (`/object-clients`), recorded in the
    /// frontier. Best effort beyond the frontier: when Octopoes is not configured or cannot
    /// answer, or the caller's `budget` of Octopoes calls is spent (one call takes one; `None`:
    /// no bound), the frontier's rows alone (a holder left out only plans its own task later,
    /// from its own event or schedule, instead of sharing this run).
    pub async fn holders(
        &self,
        reference: &str,
        organisations: &[String],
        budget: Option<&AtomicUsize>,
    ) -> Result<Vec<FrontierRow>, StorageError> {
        let mut rows = self.frontier.holders(reference, organisations).await?;
        let missing: Vec<String> = organisations
            .iter()
            .filter(|o| !rows.iter().any(|r| &r.organisation == *o))
            .cloned()
            .collect();
        let now = self.clock.now();
        let Some(octopoes) = &self.octopoes else {
            return Ok(rows);
        };
        if missing.is_empty() || self.backing_off(SERVICE_WIDE, now) {
            return Ok(rows);
        }
        let took = budget.is_none_or(|b| {
            b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        });
        if !took {
            self.metrics.object_lookups(LookupOutcome::Deferred, 1);
            return Ok(rows);
        }
        let asked = tokio::time::timeout(
            self.window,
            octopoes.object_clients(reference, &missing, now),
        )
        .await;
        let held = match asked {
            Ok(Ok(held)) => {
                self.answered(SERVICE_WIDE);
                held
            }
            Ok(Err(e)) => {
                self.metrics.object_lookups(LookupOutcome::Failed, 1);
                self.failed(SERVICE_WIDE, now, &e.to_string());
                return Ok(rows);
            }
            Err(_) => {
                self.metrics.object_lookups(LookupOutcome::Failed, 1);
                let why = format!("no answer within {} s", self.window.as_secs());
                self.failed(SERVICE_WIDE, now, &why);
                return Ok(rows);
            }
        };
        self.metrics
            .object_lookups(LookupOutcome::Found, held.len() as u64);
        let events: Vec<ObjectEvent> = held
            .iter()
            .map(|(org, o)| event(org, reference, Some(o)))
            .collect();
        if !events.is_empty() {
            let refs: Vec<&ObjectEvent> = events.iter().collect();
            self.frontier.record_answers(&refs, now.naive_utc()).await?;
        }
        rows.extend(held.iter().map(|(org, o)| row(org, reference, o, now)));
        Ok(rows)
    }

    /// Records an object Octopoes refused to read: it is not asked again for
    /// [`REFUSED_WAIT_SECS`], and logged the first time.
    fn refused_once(&self, organisation: &str, reference: &str, why: &str, now: DateTime<Utc>) {
        let mut refused = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if refused.len() >= REFUSALS_REMEMBERED {
            refused.retain(|_, at| *at > now);
        }
        if refused.len() >= REFUSALS_REMEMBERED {
            return;
        }
        let key = format!("{organisation}\u{0}{reference}");
        let again = now + chrono::Duration::seconds(REFUSED_WAIT_SECS);
        if refused.insert(key, again).is_none() {
            warn!(organisation, reference, error = %why, retry_in_secs = REFUSED_WAIT_SECS, "Octopoes cannot read an object: what rests on it (a schedule's fire) waits until it can; the other objects are asked as before");
        }
    }

    /// Whether Octopoes refused to read this object lately (its wait has not passed).
    fn refused_lately(&self, organisation: &str, reference: &str, now: DateTime<Utc>) -> bool {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        refused
            .get(&format!("{organisation}\u{0}{reference}"))
            .is_some_and(|at| now < *at)
    }

    fn backing_off(&self, organisation: &str, now: DateTime<Utc>) -> bool {
        self.backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .backing_off(organisation, now)
    }

    /// Records a failure of `scope` (an organisation, or [`SERVICE_WIDE`]): its next try waits.
    fn failed(&self, scope: &str, now: DateTime<Utc>, why: &str) {
        let (wait, first_of_outage) = self
            .backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .failed(scope, now);
        if first_of_outage {
            let scope = if scope == SERVICE_WIDE {
                "all organisations"
            } else {
                scope
            };
            warn!(scope = %scope, error = %why, retry_in_secs = wait.num_seconds(), "Octopoes cannot say whether objects the frontier lacks exist; their due schedules wait until it answers");
        }
    }

    fn answered(&self, scope: &str) {
        let ended = self
            .backoff
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .answered(scope);
        if ended {
            info!("Octopoes answers object lookups again");
        }
    }
}

/// The frontier row of an object Octopoes just returned.
fn row(organisation: &str, reference: &str, o: &OctopoesObject, now: DateTime<Utc>) -> FrontierRow {
    FrontierRow {
        organisation: organisation.to_owned(),
        reference: reference.to_owned(),
        object_type: o.object_type.clone(),
        scan_level: o.scan_level,
        scan_profile_type: o.scan_profile_type.clone(),
        first_seen: now.naive_utc(),
        last_seen: now.naive_utc(),
        gone_at: None,
        planned: false,
    }
}

/// Octopoes' answer as the frontier records it: an upsert, or a delete.
fn event(organisation: &str, reference: &str, o: Option<&OctopoesObject>) -> ObjectEvent {
    ObjectEvent {
        operation: if o.is_some() {
            Operation::Update
        } else {
            Operation::Delete
        },
        organisation: organisation.to_owned(),
        reference: reference.to_owned(),
        object: o.map(|o| ObjectState {
            object_type: o.object_type.clone(),
            scan_level: o.scan_level,
            scan_profile_type: o.scan_profile_type.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_scope_failing_waits_doubling_and_octopoes_failing_holds_every_organisation() {
        let mut b = Backoffs::default();
        let (first, starts) = b.failed("org1", at(0));
        assert!(starts);
        assert!(b.backing_off("org1", at(0)) && !b.backing_off("org2", at(0)));
        assert!(!b.backing_off("org1", at(0) + first));
        let (second, starts) = b.failed("org1", at(0) + first);
        assert_eq!((second, starts), (first * 2, false));
        b.failed(SERVICE_WIDE, at(1));
        assert!(b.backing_off("org2", at(1)));
        assert!(!b.answered("org1"), "Octopoes itself still backs off");
        assert!(
            b.answered(SERVICE_WIDE),
            "the last scope answering ends the outage"
        );
    }

    #[test]
    fn a_scope_never_asked_again_is_forgotten_so_the_next_outage_is_logged_and_starts_afresh() {
        let mut b = Backoffs::default();
        for i in 0..6 {
            b.failed("deleted-org", at(i));
        }
        let later = at(5) + OUTAGE.wait(u32::MAX) * 3;
        let (wait, starts) = b.failed("org2", later);
        assert!(
            starts,
            "the deleted organisation's old streak hid the new outage"
        );
        assert_eq!(b.0.len(), 1, "the stale scope is forgotten: {:?}", b.0);
        let (again, _) = b.failed("deleted-org", later);
        assert_eq!(again, wait, "a fresh streak starts at the first wait");
    }
}
