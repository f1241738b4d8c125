//! Parking: events that keep failing for a passing reason are set aside in the database, so
//! that they stop holding the head of their queue.
//!
//! A message handed back (`nack`, requeue) goes back where it was in its queue. For a short
//! failure that costs a pause. For a long one it is a stall: when the cause is one
//! organisation's (Katalogus failing for it alone), its events fill the prefetch window, each
//! handed back again and again, and every other organisation's events wait behind them for as
//! long as the failure lasts. When the cause is the whole queue's (Katalogus away, a scheduler
//! full that refuses), nothing else could be applied either, and parking moves the backlog from
//! RabbitMQ into the table, from where it is applied once the cause ends.
//!
//! - **When.** A message that has failed for a passing reason for `listener.park_after_secs`
//!   (since this instance first handed it back) is parked: written to `listener_parked`, and
//!   only then acked. For `park_after_secs` after such a park, its organisation's other events
//!   that fail on their own are parked at their first failure, so a failing organisation's
//!   backlog moves aside at the pace it arrives, not one prefetch window per wait. With
//!   `park_after_secs` 0 nothing is parked on its own failure; an event about an object with
//!   an event parked already is still parked behind it.
//! - **Order.** An object's events apply in the order Octopoes sent them: an event about an
//!   object with an event parked is parked behind it without being applied, and the events held
//!   behind one handed back (`mutations::Holds`) are parked with it, in order. A row is placed
//!   after its object's rows already parked, whatever the parking instance's clock. When the
//!   table cannot be read, no event of the batch is parked on its own (one held may be behind
//!   it). Raw files need no order.
//! - **Nothing lost.** A message is acked only once its row is committed; when the write fails
//!   (the database away) it is handed back as before. An ack lost after the commit brings the
//!   message back: an object event is parked a second time behind its first copy, a raw file
//!   applied or parked again on its own. Applying an event twice changes nothing.
//! - **Applied again** by the cron entry `parked` (the boefje table for object events, the
//!   normalizer table for raw files: one instance at a time, the scheduler's owner, whether or
//!   not its listener is on), through the same code as the listener: the first parked event of
//!   each object, those due longest first, taken for [`CLAIM_FOR`] so that no other instance
//!   applies it meanwhile. A row is first due [`FIRST_AGAIN`] after it was parked. Applied:
//!   deleted. Failed again for a passing reason: due again after a wait doubling from
//!   [`FIRST_AGAIN`] to [`MAX_AGAIN`], its object's later events no sooner, and behind the
//!   events not tried since, so one organisation's failures do not starve the others'. Refused
//!   for what it says: kept with the reason, never tried again, and no longer holding its
//!   object's later events.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};
use diesel::Connection;
use lapin::message::Delivery;
use serde::Serialize;
use tracing::warn;

use super::{Listener, Outcome, Source};
use crate::domain::event::{ObjectEvent, RawFileEvent, parse_object_event, parse_raw_file_event};
use crate::storage::parked::{self as rows, Claimed, NewParked};
use crate::storage::{self, DbPool, StorageError};

/// Events taken at a time by the cron entry.
pub const CLAIM_LIMIT: i64 = 100;
/// Claims per tick at most: an object's later event is claimable once its first is applied, so
/// a tick goes on while events are applied, up to this.
pub const ROUNDS_PER_TICK: usize = 10;
/// How long a claim keeps other instances off an event: longer than applying a batch can take
/// (a Katalogus or Octopoes call waits seconds at most), so that only a stopped instance's
/// claims run out.
pub const CLAIM_FOR: chrono::Duration = chrono::Duration::minutes(5);
/// The first wait before a parked event that failed again is tried again.
pub const FIRST_AGAIN: chrono::Duration = chrono::Duration::seconds(10);
/// The longest such wait.
pub const MAX_AGAIN: chrono::Duration = chrono::Duration::minutes(10);

/// The object an event is about, as `listener_parked.object_key`: a digest of its organisation
/// and reference, of fixed length whatever the reference's.
pub fn object_key(organisation: &str, reference: &str) -> String {
    let mut name = Vec::with_capacity(organisation.len() + reference.len() + 1);
    name.extend_from_slice(organisation.as_bytes());
    // A byte no organisation code holds, so that ("a", "bc") and ("ab", "c") differ.
    name.push(0);
    name.extend_from_slice(reference.as_bytes());
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &name).to_string()
}

/// The wait before a parked event that failed `attempts` times from the table is tried again.
pub fn again_after(attempts: i32) -> chrono::Duration {
    let doublings = u32::try_from(attempts.clamp(0, 16)).unwrap_or(0);
    FIRST_AGAIN
        .checked_mul(1 << doublings)
        .map_or(MAX_AGAIN, |w| w.min(MAX_AGAIN))
}

/// The listener's parking: when to park ([`Failures`]), and where.
pub struct Parking {
    pool: DbPool,
    failures: Failures,
}

impl Parking {
    /// Parking into `pool`'s database after `park_after_secs` of failures (0: never).
    pub fn new(pool: DbPool, park_after_secs: u64) -> Self {
        Self {
            pool,
            failures: Failures::new(park_after_secs),
        }
    }

    /// Of `object_keys`, those with an event parked.
    pub(super) async fn parked_objects(
        &self,
        object_keys: Vec<String>,
    ) -> Result<HashSet<String>, StorageError> {
        if object_keys.is_empty() {
            return Ok(HashSet::new());
        }
        storage::run(&self.pool, move |c| {
            Ok(rows::parked_objects(c, &object_keys)?)
        })
        .await
    }
}

/// What this instance saw fail, to tell when to park.
pub struct Failures {
    /// How long a message fails before it is parked; `None`: never (handed back for ever).
    park_after: Option<chrono::Duration>,
    /// Messages handed back (a digest of each body) and when this instance first did.
    failing: Mutex<HashMap<u64, DateTime<Utc>>>,
    /// Organisations and when an event of theirs was last parked here.
    organisations: Mutex<HashMap<String, DateTime<Utc>>>,
    /// The last `seq` given.
    seq: AtomicI64,
}

impl Failures {
    /// Parking after `park_after_secs` of failures (0: never).
    pub fn new(park_after_secs: u64) -> Self {
        let park_after = i64::try_from(park_after_secs)
            .ok()
            .filter(|s| *s > 0)
            .and_then(chrono::Duration::try_seconds);
        Self {
            park_after,
            failing: Mutex::default(),
            organisations: Mutex::default(),
            seq: AtomicI64::new(0),
        }
    }

    /// A place after every one given before, and after `now` in microseconds (so that places
    /// given after a restart come after those before it).
    fn next_seq(&self, now: DateTime<Utc>) -> i64 {
        let floor = now.timestamp_micros();
        let mut last = self.seq.load(Ordering::Relaxed);
        loop {
            let next = last.saturating_add(1).max(floor);
            match self
                .seq
                .compare_exchange(last, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// Whether a message that failed on its own now (`digest` of its body, for `organisation`)
    /// is to be parked: it has failed for `park_after`, or another of its organisation's events
    /// was parked within that time.
    fn due(&self, digest: u64, organisation: &str, now: DateTime<Utc>) -> bool {
        let Some(after) = self.park_after else {
            return false;
        };
        let mut failing = lock(&self.failing);
        // Forgotten past a few waits: a message that succeeded since, or one another instance
        // took.
        failing.retain(|_, first| now - *first < after * 4);
        let first = *failing.entry(digest).or_insert(now);
        if now - first >= after {
            return true;
        }
        lock(&self.organisations)
            .get(organisation)
            .is_some_and(|t| now - *t < after)
    }

    /// A message (`digest` of its body) of `organisation` was parked at `now`.
    fn parked(&self, digest: u64, organisation: &str, now: DateTime<Utc>) {
        lock(&self.failing).remove(&digest);
        let mut orgs = lock(&self.organisations);
        if let Some(after) = self.park_after {
            orgs.retain(|_, t| now - *t < after);
        }
        orgs.insert(organisation.to_owned(), now);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn digest(body: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

/// Who a message is about: its organisation and, for an object event, the object's reference.
fn subject(source: Source, body: &[u8]) -> Option<(String, Option<String>)> {
    match source {
        Source::Mutations => parse_object_event(body)
            .ok()
            .map(|e| (e.organisation, Some(e.reference))),
        Source::RawFiles => parse_raw_file_event(body)
            .ok()
            .map(|e| (e.organisation, None)),
    }
}

/// A failed delivery sorted out: parked (with its row) or handed back (with why).
pub(super) struct Sorted {
    /// Each with its row and its mark ([`Mark`]).
    pub park: Vec<(Delivery, NewParked, Mark)>,
    pub retry: Vec<(Delivery, String)>,
}

/// What a park, once committed, is to note of a message: its organisation, its object's
/// reference (its hold is released), and, when it failed on its own rather than behind another
/// event of its object, the digest of its body (its organisation's other failures are then
/// parked at once for a while).
#[derive(Debug, Clone)]
pub(super) struct Mark {
    pub organisation: String,
    pub reference: Option<String>,
    pub own_failure: Option<u64>,
}

/// What one tick of the cron entry did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Redriven {
    /// Events applied (and deleted).
    pub applied: usize,
    /// Events that failed again for a passing reason.
    pub again: usize,
    /// Events refused for what they say (kept, not tried again).
    pub refused: usize,
}

impl Listener {
    /// Sorts the failed deliveries of a batch, in order, into those to park and those to hand
    /// back. `Outcome::Park` is parked; `Outcome::Behind` (held behind an earlier event of its
    /// object) only when that earlier event is parked in this batch; `Outcome::Retry` when it is
    /// due ([`Failures::due`]).
    pub(super) fn sort_out(
        &self,
        source: Source,
        failed: Vec<(Delivery, Outcome)>,
        now: DateTime<Utc>,
    ) -> Sorted {
        let mut sorted = Sorted {
            park: Vec::new(),
            retry: Vec::new(),
        };
        let mut parked_objects: HashSet<String> = HashSet::new();
        for (delivery, outcome) in failed {
            let (reason, park) = match outcome {
                Outcome::Park(r) => (r, Some(true)),
                Outcome::Behind(r) => (r, Some(false)),
                Outcome::Retry(r) => (r, None),
                Outcome::Done | Outcome::Poison(_) => continue,
            };
            let subject = subject(source, &delivery.data);
            let body = std::str::from_utf8(&delivery.data).ok().map(str::to_owned);
            let (Some((organisation, reference)), Some(body)) = (subject, body) else {
                // Read before, so never here; handed back as it would have been.
                sorted.retry.push((delivery, reason));
                continue;
            };
            let key = reference.as_deref().map(|r| object_key(&organisation, r));
            let d = digest(&delivery.data);
            let (park, own_failure) = match park {
                Some(true) => (true, None),
                Some(false) => (
                    key.as_ref().is_some_and(|k| parked_objects.contains(k)),
                    None,
                ),
                None => (self.parking.failures.due(d, &organisation, now), Some(d)),
            };
            if !park {
                sorted.retry.push((delivery, reason));
                continue;
            }
            if let Some(k) = &key {
                parked_objects.insert(k.clone());
            }
            let mark = Mark {
                organisation: organisation.clone(),
                reference,
                own_failure,
            };
            let row = NewParked {
                id: uuid::Uuid::new_v4().to_string(),
                source: source.name(),
                seq: self.parking.failures.next_seq(now),
                organisation,
                object_key: key,
                body,
                reason,
            };
            sorted.park.push((delivery, row, mark));
        }
        sorted
    }

    /// Writes `rows`, all or none; they are first tried again after [`FIRST_AGAIN`] (they
    /// have just failed).
    pub(super) async fn park(
        &self,
        rows: Vec<NewParked>,
        now: DateTime<Utc>,
    ) -> Result<(), StorageError> {
        storage::run(&self.parking.pool, move |c| {
            Ok(rows::park(
                c,
                &rows,
                now.naive_utc(),
                (now + FIRST_AGAIN).naive_utc(),
            )?)
        })
        .await
    }

    /// After a park was committed: the failures of the messages that failed on their own are
    /// forgotten and their organisations marked, and the objects' holds released (their later
    /// events now wait behind the parked one).
    pub(super) fn after_park(&self, parked: &[Mark], now: DateTime<Utc>) {
        for m in parked {
            if let Some(d) = m.own_failure {
                self.parking.failures.parked(d, &m.organisation, now);
            }
            if let Some(r) = &m.reference {
                self.holds.release(&(m.organisation.clone(), r.clone()));
            }
        }
    }

    /// Applies `source`'s parked events due now (the cron entry `parked`): claims of up to
    /// [`CLAIM_LIMIT`] while there are some, at most [`ROUNDS_PER_TICK`]. Those that fail again
    /// are due later, so each claim takes others.
    pub async fn redrive(&self, source: Source) -> Result<Redriven, StorageError> {
        let mut done = Redriven::default();
        for _ in 0..ROUNDS_PER_TICK {
            // The clock of now, not the tick's: a claim runs for CLAIM_FOR from when it is made.
            let now = self.planner.clock.now();
            let (at, until) = (now.naive_utc(), (now + CLAIM_FOR).naive_utc());
            let name = source.name();
            let claimed = storage::run(&self.parking.pool, move |c| {
                Ok::<_, StorageError>(rows::claim(c, name, at, until, CLAIM_LIMIT)?)
            })
            .await?;
            if claimed.is_empty() {
                break;
            }
            let round = self.apply_claimed(source, claimed, now, until).await?;
            done.applied += round.applied;
            done.again += round.again;
            done.refused += round.refused;
        }
        Ok(done)
    }

    async fn apply_claimed(
        &self,
        source: Source,
        claimed: Vec<Claimed>,
        now: DateTime<Utc>,
        until: chrono::NaiveDateTime,
    ) -> Result<Redriven, StorageError> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; claimed.len()];
        match source {
            Source::Mutations => {
                let mut run: Vec<(usize, ObjectEvent)> = Vec::new();
                for (i, c) in claimed.iter().enumerate() {
                    match parse_object_event(c.body.as_bytes()) {
                        Ok(e) => run.push((i, e)),
                        Err(e) => outcomes[i] = Some(Outcome::Poison(e.0)),
                    }
                }
                // The claim took one event per object: they make one run.
                self.apply_run(run, &mut outcomes).await;
            }
            Source::RawFiles => {
                let mut files: Vec<(usize, RawFileEvent)> = Vec::new();
                for (i, c) in claimed.iter().enumerate() {
                    match parse_raw_file_event(c.body.as_bytes()) {
                        Ok(e) => files.push((i, e)),
                        Err(e) => outcomes[i] = Some(Outcome::Poison(e.0)),
                    }
                }
                self.apply_files(files, &mut outcomes).await;
            }
        }
        let mut round = Redriven::default();
        let mut applied = Vec::new();
        let mut again = Vec::new();
        let mut refused = Vec::new();
        for (c, outcome) in claimed.into_iter().zip(outcomes) {
            match outcome.unwrap_or(Outcome::Done) {
                Outcome::Done => applied.push(c.id),
                Outcome::Poison(why) => refused.push((c.id, why)),
                Outcome::Retry(why) | Outcome::Behind(why) | Outcome::Park(why) => {
                    let next = (now + again_after(c.attempts)).naive_utc();
                    again.push((c.id, c.object_key, why, next));
                }
            }
        }
        round.applied = applied.len();
        round.again = again.len();
        round.refused = refused.len();
        if !refused.is_empty() {
            warn!(
                queue = source.name(),
                events = refused.len(),
                reason = %refused[0].1,
                "parked events refused for what they say: kept in listener_parked, not tried again"
            );
        }
        if let Some((_, _, why, _)) = again.first() {
            warn!(
                queue = source.name(),
                events = again.len(),
                reason = %why,
                "parked events failed again: tried again later"
            );
        }
        // One transaction: a round's outcomes are written together (an event failed again
        // and its object's later events pushed back with it, never one without the other),
        // and on SQLite with one sync to disk.
        storage::run(&self.parking.pool, move |c| {
            c.transaction(|c| {
                storage::begin_write(c)?;
                rows::applied(c, &applied)?;
                for (id, why) in &refused {
                    rows::refuse(c, id, until, why)?;
                }
                for (id, key, why, next) in &again {
                    rows::again(c, id, until, key.as_deref(), why, *next)?;
                }
                Ok::<_, diesel::result::Error>(())
            })?;
            Ok::<_, StorageError>(())
        })
        .await?;
        Ok(round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_key_is_fixed_length_and_tells_organisation_and_reference_apart() {
        let long = "x".repeat(10_000);
        assert_eq!(object_key("org1", &long).len(), 36);
        assert_ne!(object_key("a", "bc"), object_key("ab", "c"));
        assert_eq!(object_key("o", "r"), object_key("o", "r"));
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_message_is_parked_once_it_has_failed_for_the_wait_and_its_organisations_at_once_after() {
        let f = Failures::new(60);
        assert!(!f.due(1, "broken", at(0)));
        assert!(!f.due(1, "broken", at(59)), "failing for 59 s");
        // Another message of the same organisation, failing since 30 s, is not due either.
        assert!(!f.due(2, "broken", at(30)));
        assert!(f.due(1, "broken", at(60)), "failing for 60 s");
        f.parked(1, "broken", at(60));
        // Its organisation's other messages are parked at their first failure for as long again,
        // another organisation's are not.
        assert!(f.due(3, "broken", at(61)));
        assert!(!f.due(4, "other", at(61)));
        assert!(!f.due(5, "broken", at(121)), "a minute after the last park");
        // The parked message's failure is forgotten: if it failed again, its wait starts again.
        assert!(!f.due(1, "other", at(130)));
    }

    #[test]
    fn with_no_wait_set_nothing_is_ever_parked() {
        let f = Failures::new(0);
        assert!(!f.due(1, "broken", at(0)));
        assert!(!f.due(1, "broken", at(1_000_000)));
    }

    #[test]
    fn places_follow_each_other_and_the_clock() {
        let f = Failures::new(60);
        let a = f.next_seq(at(0));
        let b = f.next_seq(at(0));
        assert!(b > a);
        let c = f.next_seq(at(10));
        assert_eq!(c, at(10).timestamp_micros());
        assert!(f.next_seq(at(5)) > c, "never back with the clock");
    }

    #[test]
    fn a_parked_event_is_tried_again_after_a_doubling_wait_up_to_the_longest() {
        assert_eq!(again_after(0), FIRST_AGAIN);
        assert_eq!(again_after(1), FIRST_AGAIN * 2);
        assert_eq!(again_after(5), MAX_AGAIN.min(FIRST_AGAIN * 32));
        assert_eq!(again_after(40), MAX_AGAIN);
        assert_eq!(again_after(-3), FIRST_AGAIN);
    }
}
