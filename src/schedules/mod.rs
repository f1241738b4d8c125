//! Schedules: recurring work, as mula's `/schedules` API keeps it (create, read, list, search,
//! change, delete) with its rules: a schedule's hash is its task data's hash and unique over all
//! schedules; it needs a cron expression or a deadline; without a deadline the next cron fire is
//! it. The `schedules` table's writer while the service runs, for the API and for rescheduling,
//! which reads the due schedules and settles a page of fires (next deadlines, disables) here;
//! the schedules of planned and pushed work (mula's `post_push`) it makes as rows
//! ([`Schedules::link_row`]) that the queue's engine writes in the transaction of the push that
//! needs one, so a push and its schedule are written together or not at all; `import-mula` copies
//! mula's rows in with the service stopped. Also the one writer of `schedule_fires`, the fire ledger: each
//! due fire's fate is recorded in the transaction that settles its schedule, shown by
//! [`Schedules::history`] and pruned past its retention by [`Schedules::prune_history`].

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::clock::SharedClock;
use crate::domain::SchedulerId;
use crate::domain::fire::Fire;
use crate::domain::limits::Limits;
use crate::domain::payload::hash_for;
use crate::domain::schedule::{CronExpr, Schedule};
use crate::storage::schedules::{self, FireRow, ScheduleQuery, ScheduleRow};
use crate::storage::{self, DbPool, StorageError};

/// Errors of the schedules layer; `api::error` maps each to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// No such schedule (404).
    #[error("schedule not found, by schedule_id: {0}")]
    NotFound(Uuid),
    /// A request that cannot be applied as it is (400).
    #[error("{0}")]
    BadRequest(String),
    /// A value mula reports as a validation error (400, `Validation error occurred: …`).
    #[error("{0}")]
    Invalid(String),
    /// Another schedule has the same hash (409).
    #[error("schedule with the same hash already exists: {0}")]
    Duplicate(String),
    /// The database cannot be reached (503).
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// A fault of ours (500); logged with its cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StorageError> for ScheduleError {
    fn from(e: StorageError) -> Self {
        if e.is_unavailable() || e.is_connection_lost() {
            tracing::warn!(error = %e, "a database call for schedules failed; answering 503");
            ScheduleError::Unavailable(e.client_text().into())
        } else if e.is_request_fault() {
            ScheduleError::BadRequest(format!("the database refused this request: {e}"))
        } else {
            ScheduleError::Internal(e.to_string())
        }
    }
}

impl From<diesel::result::Error> for ScheduleError {
    fn from(e: diesel::result::Error) -> Self {
        StorageError::from(e).into()
    }
}

/// A schedule to create (mula's `ScheduleCreate`).
#[derive(Debug, Clone, Default)]
pub struct NewSchedule {
    /// `boefje`, `normalizer` or `report`.
    pub scheduler_id: String,
    /// The organisation.
    pub organisation: String,
    /// The task data (the scheduler's item type).
    pub data: Map<String, Value>,
    /// A cron expression.
    pub schedule: Option<String>,
    /// When it is first due.
    pub deadline_at: Option<DateTime<Utc>>,
}

/// What a pushed task's schedule is made of, when it has none yet.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The organisation.
    pub organisation: String,
    /// The task's data.
    pub data: Map<String, Value>,
    /// The plugin's cron expression, if it has one.
    pub cron: Option<String>,
    /// When it is next due (the task just pushed is this fire).
    pub deadline_at: Option<DateTime<Utc>>,
}

/// The fields a `PATCH /schedules/{id}` may change; `None` leaves a field alone, `Some(None)`
/// clears it.
#[derive(Debug, Clone, Default)]
pub struct SchedulePatch {
    /// New task data (its hash follows).
    pub data: Option<Map<String, Value>>,
    /// Run it or not.
    pub enabled: Option<bool>,
    /// A new cron expression (the deadline is not recomputed, as in mula).
    pub schedule: Option<Option<String>>,
    /// A new deadline (`now` runs it at the next tick).
    pub deadline_at: Option<Option<DateTime<Utc>>>,
}

impl SchedulePatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.data.is_none()
            && self.enabled.is_none()
            && self.schedule.is_none()
            && self.deadline_at.is_none()
    }
}

/// The schedules and what they need.
#[derive(Clone)]
pub struct Schedules {
    pool: DbPool,
    clock: SharedClock,
    limits: Limits,
}

fn is_unique_violation(e: &diesel::result::Error) -> bool {
    matches!(
        e,
        diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _)
    )
}

impl Schedules {
    /// The schedules in `pool`.
    pub fn new(pool: DbPool, clock: SharedClock, limits: Limits) -> Self {
        Self {
            pool,
            clock,
            limits,
        }
    }

    async fn db<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut storage::AnyConnection) -> Result<T, ScheduleError> + Send + 'static,
    ) -> Result<T, ScheduleError> {
        let pool = self.pool.clone();
        storage::run(&self.pool, move |conn| {
            f(conn).map_err(|e| match e {
                ScheduleError::Internal(m) if !storage::reachable(&pool) => {
                    ScheduleError::Unavailable(m)
                }
                other => other,
            })
        })
        .await
    }

    fn check(&self, organisation: &str, data: &Map<String, Value>) -> Result<(), ScheduleError> {
        let over = |e: crate::domain::limits::LimitError| ScheduleError::BadRequest(e.0);
        self.limits
            .check_text("organisation", organisation)
            .map_err(over)?;
        self.limits.check_object("data", data).map_err(over)?;
        if organisation.trim().is_empty() {
            return Err(ScheduleError::BadRequest(
                "organisation: must not be empty".into(),
            ));
        }
        Ok(())
    }

    fn check_keys(
        &self,
        scheduler: SchedulerId,
        data: &Map<String, Value>,
    ) -> Result<(), ScheduleError> {
        check_keys(&self.limits, scheduler, data)
    }

    /// A schedule's cron expression, checked as mula checks it: croniter must read it and find
    /// its next fire from now (an expression that never fires within croniter's horizon, such
    /// as `0 0 31 2 *`, is refused like a malformed one).
    fn cron(&self, text: &str) -> Result<CronExpr, ScheduleError> {
        self.limits
            .check_text("schedule", text)
            .map_err(|e| ScheduleError::BadRequest(e.0))?;
        let cron = CronExpr::parse(text).map_err(|e| ScheduleError::Invalid(e.to_string()))?;
        if cron.next_after(self.clock.now()).is_none() {
            return Err(ScheduleError::Invalid(format!(
                "invalid cron expression '{text}': it never fires within {} years",
                crate::domain::cron::HORIZON_YEARS
            )));
        }
        Ok(cron)
    }

    /// Creates a schedule (201 in the API).
    pub async fn create(&self, new: NewSchedule) -> Result<Schedule, ScheduleError> {
        let scheduler: SchedulerId = new.scheduler_id.parse().map_err(|()| {
            ScheduleError::BadRequest(format!("Scheduler {} not found", new.scheduler_id))
        })?;
        self.check(&new.organisation, &new.data)?;
        let cron = new.schedule.as_deref().map(|c| self.cron(c)).transpose()?;
        let now = self.clock.now();
        let deadline_at = match (new.deadline_at, &cron) {
            (Some(d), _) => Some(d),
            (None, Some(c)) => c.next_after(now),
            (None, None) => {
                return Err(ScheduleError::BadRequest(
                    "Either deadline_at or schedule must be provided".into(),
                ));
            }
        };
        let hash = hash_for(scheduler, &new.data)
            .map_err(|e| ScheduleError::BadRequest(format!("malformed data: {}", e.0)))?;
        self.check_keys(scheduler, &new.data)?;
        crate::domain::payload::data_id(&new.data)
            .map_err(|e| ScheduleError::BadRequest(format!("malformed data: {}", e.0)))?;
        let at = now.naive_utc();
        let row = ScheduleRow {
            id: Uuid::new_v4().hyphenated().to_string(),
            scheduler_id: scheduler.as_str().to_owned(),
            organisation: new.organisation,
            hash: Some(hash.clone()),
            data: Value::Object(new.data).to_string(),
            enabled: true,
            schedule: cron.map(|c| c.as_str().to_owned()),
            deadline_at: deadline_at.map(|d| crate::clock::truncate_micros(d).naive_utc()),
            created_at: at,
            modified_at: at,
            disabled_reason: None,
        };
        self.db(move |c| {
            match schedules::insert(c, &row) {
                Err(e) if is_unique_violation(&e) => return Err(ScheduleError::Duplicate(hash)),
                other => other?,
            }
            Ok(row.into_schedule()?)
        })
        .await
    }

    /// One schedule.
    pub async fn get(&self, id: Uuid) -> Result<Schedule, ScheduleError> {
        self.db(move |c| {
            let row = schedules::get(c, &id.hyphenated().to_string())?
                .ok_or(ScheduleError::NotFound(id))?;
            Ok(row.into_schedule()?)
        })
        .await
    }

    /// A page of schedules, newest first, with the total count.
    pub async fn list(&self, query: ScheduleQuery) -> Result<(i64, Vec<Schedule>), ScheduleError> {
        self.db(move |c| {
            let (count, rows) = schedules::list(c, &query)?;
            let page = rows
                .into_iter()
                .map(|r| r.into_schedule().map_err(ScheduleError::from))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((count, page))
        })
        .await
    }

    /// Changes a schedule.
    pub async fn patch(&self, id: Uuid, patch: SchedulePatch) -> Result<Schedule, ScheduleError> {
        if patch.is_empty() {
            return Err(ScheduleError::BadRequest("no data to patch".into()));
        }
        if let Some(Some(c)) = &patch.schedule {
            self.cron(c)?;
        }
        if let Some(data) = &patch.data {
            self.check("-", data)?;
        }
        let now = self.clock.now().naive_utc();
        let limits = self.limits;
        self.db(move |c| {
            let key = id.hyphenated().to_string();
            let row = schedules::get(c, &key)?.ok_or(ScheduleError::NotFound(id))?;
            let scheduler: SchedulerId = row
                .scheduler_id
                .parse()
                .map_err(|()| ScheduleError::Internal("schedule of an unknown scheduler".into()))?;
            let mut change = schedules::ScheduleChange {
                enabled: patch.enabled,
                schedule: patch.schedule,
                deadline_at: patch
                    .deadline_at
                    .map(|d| d.map(|d| crate::clock::truncate_micros(d).naive_utc())),
                modified_at: now,
                ..Default::default()
            };
            if let Some(data) = patch.data {
                let hash = hash_for(scheduler, &data)
                    .map_err(|e| ScheduleError::BadRequest(format!("malformed data: {}", e.0)))?;
                check_keys(&limits, scheduler, &data)?;
                crate::domain::payload::data_id(&data)
                    .map_err(|e| ScheduleError::BadRequest(format!("malformed data: {}", e.0)))?;
                change.data = Some((hash, Value::Object(data).to_string()));
            }
            let written = match schedules::change(c, &key, &change) {
                Err(e) if is_unique_violation(&e) => {
                    let hash = change.data.map(|(h, _)| h).unwrap_or_default();
                    return Err(ScheduleError::Duplicate(hash));
                }
                other => other?,
            };
            // Read back: the answer is the row as it stands, with what a tick wrote beside.
            match schedules::get(c, &key)? {
                Some(row) if written > 0 => Ok(row.into_schedule()?),
                _ => Err(ScheduleError::NotFound(id)),
            }
        })
        .await
    }

    /// The schedule a task pushed by the planner or a client gets when its hash has none (mula's
    /// `post_push`), made from `seed`: the push carries it ([`crate::queue::PushRequest::link`])
    /// and the engine writes it in the transaction that creates the task, unless the hash has a
    /// schedule already, which the task then names. `None` for data that has no hash.
    pub fn link_row(&self, scheduler: SchedulerId, seed: Seed) -> Option<ScheduleRow> {
        let now = self.clock.now().naive_utc();
        let hash = hash_for(scheduler, &seed.data).ok()?;
        let mut data = seed.data;
        // The schedule keeps the work, not one task's identity.
        data.remove("id");
        data.remove("deduplication_key");
        Some(ScheduleRow {
            id: Uuid::new_v4().hyphenated().to_string(),
            scheduler_id: scheduler.as_str().to_owned(),
            organisation: seed.organisation,
            hash: Some(hash),
            data: Value::Object(data).to_string(),
            enabled: true,
            schedule: seed.cron,
            deadline_at: seed
                .deadline_at
                .map(|d| crate::clock::truncate_micros(d).naive_utc()),
            created_at: now,
            modified_at: now,
            disabled_reason: None,
        })
    }

    /// Writes each of `rows` whose hash has no schedule yet; a hash's schedule is kept as it is.
    pub async fn ensure(&self, rows: Vec<ScheduleRow>) -> Result<(), ScheduleError> {
        if rows.is_empty() {
            return Ok(());
        }
        // No transaction: a schedule written is written whatever becomes of the rest, and
        // writing again keeps it.
        self.db(move |c| {
            schedules::ensure(c, &rows)?;
            Ok(())
        })
        .await
    }

    /// Enables again the schedules of `hashes` that a fire disabled (see
    /// [`schedules::revive`]): work planned again is work its plugin and object permit now.
    /// Answers how many.
    pub async fn revive(&self, hashes: Vec<String>) -> Result<usize, ScheduleError> {
        if hashes.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now().naive_utc();
        self.db(move |c| Ok(schedules::revive(c, &hashes, now)?))
            .await
    }

    /// A page of `scheduler`'s due schedules (`enabled`, `deadline_at <= now`), oldest due first,
    /// after `(deadline, id)` when given: what rescheduling fires.
    pub async fn due(
        &self,
        scheduler: SchedulerId,
        now: NaiveDateTime,
        after: Option<(NaiveDateTime, String)>,
        limit: usize,
    ) -> Result<Vec<ScheduleRow>, ScheduleError> {
        self.db(move |c| Ok(schedules::due(c, scheduler, now, after, limit)?))
            .await
    }

    /// After a page of fires committed: the schedules' new deadlines, the ones to disable with
    /// the reason, and the page's due fires in the ledger, in one transaction: a fire is
    /// recorded exactly when its schedule's row says it was handled. Each row is written only as
    /// the tick read it (a deadline moves from the one that came due, a disable needs the row
    /// unchanged), so a user's edit made while the tick ran wins; a disable that did not apply
    /// leaves its fire unrecorded, to be decided again. Answers the disables that applied.
    pub async fn settle(
        &self,
        advance: Vec<schedules::Advance>,
        disable: Vec<schedules::Disable>,
        fires: Vec<FireRow>,
        now: NaiveDateTime,
    ) -> Result<Vec<schedules::Disable>, ScheduleError> {
        self.db(move |c| {
            c_transaction(c, |c| {
                schedules::advance(c, &advance, now)?;
                let mut done = Vec::with_capacity(disable.len());
                let mut kept = std::collections::HashSet::new();
                for d in disable {
                    match schedules::disable(c, &d, now)? {
                        true => done.push(d),
                        false => {
                            kept.insert(d.id);
                        }
                    }
                }
                let fires: Vec<FireRow> = match kept.is_empty() {
                    true => fires,
                    false => fires
                        .into_iter()
                        .filter(|f| !kept.contains(f.schedule_id.as_str()))
                        .collect(),
                };
                schedules::record_fires(c, &fires)?;
                Ok(done)
            })
        })
        .await
    }

    /// A page of a schedule's due fires, newest due first, with how many it has in all (the
    /// caller has checked that the schedule exists).
    pub async fn history(
        &self,
        id: Uuid,
        offset: i64,
        limit: i64,
    ) -> Result<(i64, Vec<Fire>), ScheduleError> {
        self.db(move |c| {
            let (count, rows) = schedules::fires(c, &id.hyphenated().to_string(), offset, limit)?;
            let page = rows
                .into_iter()
                .map(|r| r.into_fire().map_err(ScheduleError::from))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((count, page))
        })
        .await
    }

    /// Deletes `scheduler`'s fires decided before `before`, `batch` rows a statement, at most
    /// `batches` statements (the next run takes the rest); answers how many.
    pub async fn prune_history(
        &self,
        scheduler: SchedulerId,
        before: NaiveDateTime,
        batch: usize,
        batches: usize,
    ) -> Result<usize, ScheduleError> {
        self.db(move |c| {
            let mut deleted = 0;
            for _ in 0..batches {
                let n = schedules::prune_fires(c, scheduler, before, batch)?;
                deleted += n;
                if n < batch {
                    break;
                }
            }
            Ok(deleted)
        })
        .await
    }

    /// Deletes a schedule and its fires (a missing one is not an error, as in mula).
    pub async fn delete(&self, id: Uuid) -> Result<(), ScheduleError> {
        self.db(move |c| {
            c_transaction(c, |c| {
                Ok(schedules::delete(c, &id.hyphenated().to_string())?)
            })?;
            Ok(())
        })
        .await
    }
}

/// The payload's key fields (the ones its tasks are found by) are within their limits, as for a
/// push.
fn check_keys(
    limits: &Limits,
    scheduler: SchedulerId,
    data: &Map<String, Value>,
) -> Result<(), ScheduleError> {
    limits
        .check_keys(&crate::domain::keys::DataKeys::of(scheduler, data))
        .map_err(|e| ScheduleError::BadRequest(e.0))
}

/// Runs `f` in a transaction.
fn c_transaction<T>(
    c: &mut storage::AnyConnection,
    f: impl FnOnce(&mut storage::AnyConnection) -> Result<T, ScheduleError>,
) -> Result<T, ScheduleError> {
    use diesel::Connection;
    c.transaction(f)
}
