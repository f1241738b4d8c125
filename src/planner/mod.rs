//! Planning: frontier × plugin catalogue → tasks. The listener (events) and ColdStart (objects new
//! to the frontier) hand objects and raw files to the [`Planner`], which asks the catalogue what
//! may run on them, applies the rules in [`rules`] (pure), links de-duplication siblings across
//! organisations, and pushes the result as the planner's work: one engine command per call, so a
//! batch of events costs one transaction, and a task never waits in the queue while the same
//! work is still dispatched or running (no concurrent invocation).
//!
//! Priorities are the scheduler's strategy's ([`crate::scoring`]; time-based by default, mula's
//! ranker: the task's creation time in seconds), so anything a user pushes (priority 1) goes
//! before all of it. Work that already waits is re-scored when the event changed what its
//! strategy reads (`rescore`). Whatever the strategy, work that ran less than its plugin's
//! interval (else the grace period) ago is not planned again (mula's gate; `within_grace`).

mod bytes_runs;
mod post_push;
mod rescore;
pub mod rules;

pub use bytes_runs::BytesRuns;

pub use post_push::PushLinker;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::clients::catalogue::{Catalogue, CatalogueError};
use crate::clock::SharedClock;
use crate::domain::SchedulerId;
use crate::domain::event::{ObjectEvent, RawFileEvent};
use crate::domain::payload::hash_for;
use crate::domain::plugin::Plugin;
use crate::domain::schedule::Cadence;
use crate::frontier::lookup::ObjectLookup;
use crate::queue::{Broker, PushRequest, QueueError};
use crate::schedules::{Schedules, Seed};
use crate::scoring::{ScoreInput, Scorer};

/// Why an event's work was not (all) planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A passing failure (the catalogue, the database or the queue cannot take it now): the
    /// same event later will succeed.
    #[error("{0}")]
    Passing(String),
    /// The work it asks for is refused as it is (a malformed payload): retrying changes nothing.
    #[error("{0}")]
    Refused(String),
}

impl PlanError {
    /// How a refused push counts for the event that asked for it; `None`: it does not count
    /// against it (the work already waits, or still runs).
    pub fn of_push(e: QueueError) -> Option<PlanError> {
        match e {
            QueueError::Duplicate { .. } | QueueError::InFlight { .. } => None,
            QueueError::QueueFull(_)
            | QueueError::Busy
            | QueueError::Unavailable(_)
            | QueueError::Moving(_)
            | QueueError::Internal(_) => Some(PlanError::Passing(e.to_string())),
            other => Some(PlanError::Refused(format!("refused: {other}"))),
        }
    }

    fn worst(self, other: PlanError) -> PlanError {
        // A refusal is final; a passing failure only delays.
        match (&self, &other) {
            (PlanError::Refused(_), _) => self,
            _ => other,
        }
    }
}

/// What planning one event came to: the tasks it created, or why it did not.
pub type Planned = Result<usize, PlanError>;

/// The planner and what it needs.
#[derive(Clone)]
pub struct Planner {
    /// Where tasks go.
    pub broker: Broker,
    /// Who else holds an object (de-duplication siblings): the frontier, and Octopoes for the
    /// organisations it has no row of.
    pub objects: ObjectLookup,
    /// Which plugins run where.
    pub catalogue: Catalogue,
    /// Priorities are creation times.
    pub clock: SharedClock,
    /// Where planned boefje work gets its schedule (mula's `post_push`), and when it is next
    /// due.
    pub schedules: Option<(Schedules, Cadence)>,
    /// Each scheduler's CalculateScore strategy.
    pub scorer: Arc<Scorer>,
    /// Bytes, asked when work the table has no finished run of last ran (mula's check before
    /// every push); none: the table's word alone.
    pub runs: Option<BytesRuns>,
}

/// Planned work held back by its grace period that may have no schedule yet.
struct Held {
    request: PushRequest,
    cron: Option<String>,
    interval: Option<chrono::Duration>,
    /// When it last ran, if known.
    ran: Option<chrono::DateTime<chrono::Utc>>,
}

/// What schedule a planned boefje task gets: its plugin's cron expression and interval, or none
/// for a plugin that runs only on events (`run_on`).
pub(crate) fn schedule_of(
    task: &PushRequest,
    plugins: &[Plugin],
) -> Option<(Option<String>, Option<chrono::Duration>)> {
    let boefje = task.data.get("boefje")?.get("id")?.as_str()?;
    let p = plugins.iter().find(|p| p.id == boefje)?;
    if p.run_on.is_some() {
        return None;
    }
    let cron = p
        .cron
        .clone()
        .filter(|c| crate::domain::schedule::CronExpr::parse(c).is_ok());
    let interval = p.interval.filter(|m| *m > 0).map(chrono::Duration::minutes);
    Some((cron, interval))
}

/// Which planned boefje work ran (completed or failed) less than its wait ago (the plugin's
/// interval, else the grace period): mula's gate on every boefje task it plans, whatever its
/// ranker, so an object's events (a scan profile recalculated, a level raised) do not run again
/// what ran on it an hour ago. A de-duplication group is gated as one, by its leader (the member
/// whose id is the group's key), as mula gates the task it then copies to the siblings.
fn within_grace(
    requests: &[PushRequest],
    hashes: &[String],
    history: &HashMap<String, (chrono::NaiveDateTime, bool)>,
    waits: &[chrono::Duration],
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<bool> {
    let own: Vec<bool> = hashes
        .iter()
        .zip(waits)
        .map(|(h, wait)| {
            history
                .get(h)
                .is_some_and(|(ran, _)| now - ran.and_utc() < *wait)
        })
        .collect();
    let key = |r: &PushRequest| {
        r.data
            .get("deduplication_key")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let leaders: HashMap<String, bool> = requests
        .iter()
        .zip(&own)
        .filter_map(|(r, gated)| {
            let id = r.id?.hyphenated().to_string();
            (key(r).as_deref() == Some(id.as_str())).then_some((id, *gated))
        })
        .collect();
    requests
        .iter()
        .zip(own)
        .map(|(r, gated)| {
            key(r)
                .and_then(|k| leaders.get(&k).copied())
                .unwrap_or(gated)
        })
        .collect()
}

fn merge(slot: &mut Planned, e: PlanError) {
    *slot = Err(match std::mem::replace(slot, Ok(0)) {
        Ok(_) => e,
        Err(prev) => prev.worst(e),
    });
}

impl Planner {
    /// Plans the boefje tasks of object events (creates and updates; a delete plans nothing) and
    /// pushes them all at once; answers, per event, how many tasks it created.
    pub async fn objects(&self, events: &[&ObjectEvent]) -> Vec<Planned> {
        self.objects_of(events, None).await
    }

    /// [`Self::objects`] for one boefje alone: the work a boefje enabled since it was last
    /// looked at asks for on objects no event announces (ColdStart's new boefjes).
    pub async fn objects_for_boefje(&self, events: &[&ObjectEvent], boefje: &str) -> Vec<Planned> {
        self.objects_of(events, Some(boefje)).await
    }

    async fn objects_of(&self, events: &[&ObjectEvent], only: Option<&str>) -> Vec<Planned> {
        let priority = self.clock.now().timestamp();
        let mut results: Vec<Planned> = vec![Ok(0); events.len()];
        let mut requests = Vec::new();
        let mut owners = Vec::new();
        let mut cadences = Vec::new();
        let mut levels = Vec::new();
        let catalogue = self
            .plugins_of(events.iter().map(|e| e.organisation.as_str()))
            .await;
        for (i, event) in events.iter().enumerate() {
            if event.object.is_none() {
                continue;
            }
            let plugins = match &catalogue[&event.organisation] {
                Ok(p) => p.clone(),
                Err(e) => {
                    merge(&mut results[i], PlanError::Passing(e.to_string()));
                    continue;
                }
            };
            let mut planned = Vec::new();
            let runs = match only {
                None => rules::boefje_tasks(event, &plugins, priority),
                Some(id) => rules::enabled_boefje_tasks(event, &plugins, id, priority),
            };
            for mut task in runs {
                match self.siblings(&mut task, event, &plugins).await {
                    Ok(siblings) => {
                        planned.push(task);
                        planned.extend(siblings);
                    }
                    Err(e) => merge(&mut results[i], e),
                }
            }
            owners.extend(std::iter::repeat_n(i, planned.len()));
            cadences.extend(planned.iter().map(|t| schedule_of(t, &plugins)));
            let level = event.object.as_ref().and_then(|o| o.scan_level);
            levels.extend(std::iter::repeat_n(level, planned.len()));
            requests.extend(planned);
        }
        let (inputs, hashes) = match self
            .score(&mut requests, &mut owners, &mut cadences, &levels)
            .await
        {
            Ok(scored) => scored,
            Err(e) => {
                for &i in &owners {
                    merge(&mut results[i], e.clone());
                }
                return results;
            }
        };
        // The hashes of the work with a schedule, to enable again the schedules a fire disabled
        // once a push made their task; work that already waits (most updates) needs no read.
        let scheduled: Vec<Option<String>> = hashes
            .into_iter()
            .zip(&cadences)
            .map(|(h, plan)| (plan.is_some() && !h.is_empty()).then_some(h))
            .collect();
        self.link(&mut requests, cadences);
        let waiting = self
            .push(SchedulerId::Boefje, requests, &owners, &mut results)
            .await;
        let created: Vec<String> = scheduled
            .into_iter()
            .zip(&waiting)
            .filter_map(|(h, w)| if w.is_none() { h } else { None })
            .collect();
        if let Err(e) = self.revive(created).await {
            // The tasks are made; the schedules come back with the work's next planning.
            tracing::warn!(error = %e, "schedules a fire disabled could not be enabled again now");
        }
        // The work that already waits: re-scored if this event changed what its strategy reads.
        let mut rescore = Vec::new();
        let mut rescore_owners = Vec::new();
        for ((existing, input), &i) in waiting.into_iter().zip(inputs).zip(&owners) {
            if let Some(id) = existing {
                rescore.push((id, input));
                rescore_owners.push(i);
            }
        }
        if let Err(e) = self.rescore_waiting(SchedulerId::Boefje, rescore).await {
            // Handed back: the same event again finds the same tasks and re-scores them.
            for i in rescore_owners {
                merge(&mut results[i], e.clone());
            }
        }
        results
    }

    /// Ranks planned boefje work by the boefje scheduler's strategy: sets each task's priority
    /// and the explanation stored with it, and drops the work the strategy does not schedule now
    /// (inside its grace period). Answers the kept work's inputs and hashes, in order.
    async fn score(
        &self,
        requests: &mut Vec<PushRequest>,
        owners: &mut Vec<usize>,
        plans: &mut Vec<Option<(Option<String>, Option<chrono::Duration>)>>,
        levels: &[Option<i64>],
    ) -> Result<(Vec<ScoreInput>, Vec<String>), PlanError> {
        let now = self.clock.now();
        let grace = self.schedules.as_ref().map(|(_, c)| c.grace).unwrap_or(
            std::time::Duration::from_secs(crate::config::DEFAULT_GRACE_PERIOD_SECS),
        );
        let mut hashes: Vec<String> = requests
            .iter()
            .map(|r| hash_for(SchedulerId::Boefje, &r.data).unwrap_or_default())
            .collect();
        // Read whatever the strategy: the grace gate below needs the last runs too.
        let mut history = self
            .broker
            .last_runs(hashes.clone())
            .await
            .map_err(|e| PlanError::Passing(e.to_string()))?;
        let known: HashSet<String> = history.keys().cloned().collect();
        let waits: Vec<chrono::Duration> = plans
            .iter()
            .map(|plan| {
                plan.as_ref()
                    .and_then(|(_, interval)| *interval)
                    .unwrap_or_else(|| {
                        chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::days(1))
                    })
            })
            .collect();
        self.runs_in_bytes(requests, &hashes, &waits, &mut history, now)
            .await;
        let within = within_grace(requests, &hashes, &history, &waits, now);
        // Work held back is work its plugin and object permit now: a schedule a fire disabled
        // for what no longer holds is enabled again (the work pushed, once its push made a task).
        let mut revive: Vec<String> = Vec::new();
        let mut keep = Vec::with_capacity(requests.len());
        let mut inputs = Vec::with_capacity(requests.len());
        let mut unscheduled = Vec::new();
        for (i, r) in requests.iter_mut().enumerate() {
            if within[i] {
                if plans[i].is_some() && !hashes[i].is_empty() {
                    revive.push(hashes[i].clone());
                }
                // Work that ran where the table does not show it (Bytes said so) has no
                // schedule yet: it gets one, due when its wait ends, or it would not come
                // back until its object changes.
                if !known.contains(&hashes[i])
                    && let Some((cron, interval)) = &plans[i]
                {
                    let ran = history.get(&hashes[i]).map(|(t, _)| t.and_utc());
                    unscheduled.push(Held {
                        request: r.clone(),
                        cron: cron.clone(),
                        interval: *interval,
                        ran,
                    });
                }
                keep.push(false);
                continue;
            }
            let wait = waits[i];
            let last = history.get(&hashes[i]);
            let input = ScoreInput {
                now,
                last_run: last.map(|(t, _)| t.and_utc()),
                last_failed: last.is_some_and(|(_, failed)| *failed),
                // Planning follows a change of the object (an event, or ColdStart seeing it new
                // or changed): a run before it saw the object as it was.
                findings_changed: last.is_some(),
                scan_level: levels[i],
                grace_secs: wait.num_seconds(),
            };
            match self.scorer.score(SchedulerId::Boefje, &input) {
                Some((priority, e)) => {
                    r.priority = Some(priority);
                    r.explanation = serde_json::to_string(&e).ok();
                    keep.push(true);
                    inputs.push(input);
                }
                None => keep.push(false),
            }
        }
        let mut k = keep.iter();
        requests.retain(|_| *k.next().unwrap_or(&true));
        let mut k = keep.iter();
        owners.retain(|_| *k.next().unwrap_or(&true));
        let mut k = keep.iter();
        plans.retain(|_| *k.next().unwrap_or(&true));
        let mut k = keep.iter();
        hashes.retain(|_| *k.next().unwrap_or(&true));
        self.schedule_alone(unscheduled).await?;
        self.revive(revive).await?;
        Ok((inputs, hashes))
    }

    /// Enables again the schedules of `hashes` a fire disabled (a plugin gone or disabled, an
    /// object gone or its level too low, then back), as mula does not: there a clearance lowered
    /// for a day, or a host deleted and created again, ends its recurring scans for good.
    async fn revive(&self, hashes: Vec<String>) -> Result<(), PlanError> {
        let Some((schedules, _)) = &self.schedules else {
            return Ok(());
        };
        match schedules.revive(hashes).await {
            Ok(0) => Ok(()),
            Ok(n) => {
                tracing::info!(
                    schedules = n,
                    "schedules disabled by a fire enabled again: their work is planned again"
                );
                Ok(())
            }
            Err(e) => Err(PlanError::Passing(e.to_string())),
        }
    }

    /// Adds to `history` when Bytes says the boefje of each request the table has no run of
    /// last ran on its object, for the requests whose wait reaches back before the table's
    /// history (see [`BytesRuns`]); nothing without Bytes.
    async fn runs_in_bytes(
        &self,
        requests: &[PushRequest],
        hashes: &[String],
        waits: &[chrono::Duration],
        history: &mut HashMap<String, (chrono::NaiveDateTime, bool)>,
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let Some(runs) = &self.runs else {
            return;
        };
        let horizon = runs.horizon(now);
        let mut at = Vec::new();
        let mut asks = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if history.contains_key(&hashes[i]) || hashes[i].is_empty() {
                continue;
            }
            // A run within the wait would be in the table: nothing to ask.
            if now - waits[i] >= horizon {
                continue;
            }
            let boefje = r.data.get("boefje").and_then(|b| b.get("id"));
            let ooi = r.data.get("input_ooi");
            if let (Some(boefje), Some(ooi)) = (
                boefje.and_then(serde_json::Value::as_str),
                ooi.and_then(serde_json::Value::as_str),
            ) {
                at.push(i);
                asks.push(bytes_runs::Ask {
                    organisation: &r.organisation,
                    input_ooi: ooi,
                    boefje,
                });
            }
        }
        let found = runs.last_runs(&asks, now).await;
        for (i, ran) in at.into_iter().zip(found) {
            if let Some(t) = ran {
                // Bytes does not say whether a run failed.
                history.insert(hashes[i].clone(), (t.naive_utc(), false));
            }
        }
    }

    /// Writes a schedule for work held back by its grace period that has none (mula's
    /// `post_push` would have written it when the work was pushed): due when its wait after the
    /// run ends, or at its cron's next fire. A schedule its hash has already is kept.
    async fn schedule_alone(&self, work: Vec<Held>) -> Result<(), PlanError> {
        let Some((schedules, cadence)) = &self.schedules else {
            return Ok(());
        };
        if work.is_empty() {
            return Ok(());
        }
        let now = self.clock.now();
        let rows: Vec<_> = work
            .into_iter()
            .filter_map(|h| {
                let from = if h.cron.is_some() {
                    now
                } else {
                    h.ran.unwrap_or(now)
                };
                self.seed_row(schedules, cadence, &h.request, h.cron, h.interval, from)
            })
            .collect();
        schedules
            .ensure(rows)
            .await
            .map_err(|e| PlanError::Passing(e.to_string()))
    }

    /// The schedule `r`'s hash gets when it has none: its cron's next fire after `from`, else
    /// `from` + its wait + the key's spread.
    fn seed_row(
        &self,
        schedules: &Schedules,
        cadence: &Cadence,
        r: &PushRequest,
        cron: Option<String>,
        interval: Option<chrono::Duration>,
        from: chrono::DateTime<chrono::Utc>,
    ) -> Option<crate::storage::schedules::ScheduleRow> {
        let key = serde_json::Value::Object(r.data.clone()).to_string();
        let seed = Seed {
            organisation: r.organisation.clone(),
            data: r.data.clone(),
            deadline_at: cadence.next(&key, cron.as_deref(), Some(interval), from),
            cron,
        };
        schedules.link_row(SchedulerId::Boefje, seed)
    }

    /// Gives each task the schedule its hash gets if it has none, due next (`None` in `plans`: a
    /// plugin that runs only on events gets no schedule, as in mula); the engine writes it with
    /// the task, or names the schedule the hash has.
    fn link(
        &self,
        requests: &mut [PushRequest],
        plans: Vec<Option<(Option<String>, Option<chrono::Duration>)>>,
    ) {
        let Some((schedules, cadence)) = &self.schedules else {
            return;
        };
        let now = self.clock.now();
        for (r, plan) in requests.iter_mut().zip(plans) {
            let Some((cron, interval)) = plan else {
                continue;
            };
            r.link = self.seed_row(schedules, cadence, r, cron, interval, now);
        }
    }

    /// Plans the normalizer tasks of raw files and pushes them all at once; answers, per file,
    /// how many tasks it created.
    pub async fn raw_files(&self, events: &[&RawFileEvent]) -> Vec<Planned> {
        let now = self.clock.now().timestamp();
        let mut results: Vec<Planned> = vec![Ok(0); events.len()];
        let mut requests = Vec::new();
        let mut owners = Vec::new();
        let catalogue = self
            .plugins_of(events.iter().map(|e| e.organisation.as_str()))
            .await;
        for (i, event) in events.iter().enumerate() {
            match &catalogue[&event.organisation] {
                Ok(plugins) => {
                    // mula's ranking: files whose boefje run ended earliest first.
                    let priority = event.ended_at.map_or(now, |t| t.timestamp());
                    let planned = rules::normalizer_tasks(event, plugins, priority);
                    owners.extend(std::iter::repeat_n(i, planned.len()));
                    requests.extend(planned);
                }
                Err(e) => merge(&mut results[i], PlanError::Passing(e.to_string())),
            }
        }
        self.push(SchedulerId::Normalizer, requests, &owners, &mut results)
            .await;
        results
    }

    /// The plugins of each organisation named, asked for all at once: an organisation
    /// Katalogus is slow on delays only its own events (see [`Catalogue::plugins`]).
    async fn plugins_of<'a>(
        &self,
        organisations: impl Iterator<Item = &'a str>,
    ) -> HashMap<String, Result<Arc<[Plugin]>, CatalogueError>> {
        let distinct: BTreeSet<&str> = organisations.collect();
        let answers =
            futures_util::future::join_all(distinct.iter().map(|org| self.catalogue.plugins(org)))
                .await;
        distinct
            .into_iter()
            .map(str::to_owned)
            .zip(answers)
            .collect()
    }

    /// An object is gone: its organisation's waiting tasks for it are cancelled (tasks already
    /// handed out run on). Answers how many.
    pub async fn gone(&self, organisation: &str, reference: &str) -> Planned {
        match self.broker.cancel_object(organisation, reference).await {
            Ok(ids) => Ok(ids.len()),
            Err(e) => match PlanError::of_push(e) {
                Some(e) => Err(e),
                None => Ok(0),
            },
        }
    }

    /// De-duplication siblings of `task` when its boefje shares runs across organisations: one
    /// per organisation that runs it with the same settings and holds the object.
    async fn siblings(
        &self,
        task: &mut PushRequest,
        event: &ObjectEvent,
        plugins: &[Plugin],
    ) -> Result<Vec<PushRequest>, PlanError> {
        siblings(&self.catalogue, &self.objects, None, task, event, plugins).await
    }

    /// Pushes `requests` in one command; each result counts for the event `owners` names.
    /// Answers, per request, the task that already waited with the same work (a duplicate).
    async fn push(
        &self,
        scheduler: SchedulerId,
        requests: Vec<PushRequest>,
        owners: &[usize],
        results: &mut [Planned],
    ) -> Vec<Option<uuid::Uuid>> {
        let mut waiting = vec![None; requests.len()];
        if requests.is_empty() {
            return waiting;
        }
        match self.broker.push_many(scheduler, requests).await {
            Ok(outcomes) => {
                for (k, (outcome, &i)) in outcomes.into_iter().zip(owners).enumerate() {
                    if let Err(QueueError::Duplicate { existing }) = &outcome {
                        waiting[k] = Some(*existing);
                    }
                    match outcome {
                        Ok(o) => {
                            if o.created
                                && let Ok(n) = &mut results[i]
                            {
                                *n += 1;
                            }
                        }
                        Err(e) => {
                            if let Some(e) = PlanError::of_push(e) {
                                merge(&mut results[i], e);
                            }
                        }
                    }
                }
            }
            Err(e) => {
                let e = PlanError::of_push(e)
                    .unwrap_or_else(|| PlanError::Passing("the push was not applied".into()));
                for &i in owners {
                    merge(&mut results[i], e.clone());
                }
            }
        }
        waiting
    }
}

/// De-duplication siblings of `task` when its boefje shares runs across organisations: one per
/// organisation that runs it with the same settings and holds the object; `task` becomes their
/// leader. The planner's, and rescheduling's for a fire (mula's `push_boefje_task` asks
/// `is_boefje_in_other_orgs` on every push, a schedule's included), whose Octopoes calls come
/// out of its tick's `budget` ([`ObjectLookup::holders`]).
pub(crate) async fn siblings(
    catalogue: &Catalogue,
    objects: &ObjectLookup,
    budget: Option<&std::sync::atomic::AtomicUsize>,
    task: &mut PushRequest,
    event: &ObjectEvent,
    plugins: &[Plugin],
) -> Result<Vec<PushRequest>, PlanError> {
    let boefje = task
        .data
        .get("boefje")
        .and_then(|b| b.get("id"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if !plugins.iter().any(|p| p.id == boefje && p.deduplicate) {
        return Ok(Vec::new());
    }
    let others = catalogue
        .duplicates(&event.organisation, &boefje)
        .await
        .map_err(|e| PlanError::Passing(e.to_string()))?;
    if others.is_empty() {
        return Ok(Vec::new());
    }
    let rows = objects
        .holders(&event.reference, &others, budget)
        .await
        .map_err(|e| PlanError::Passing(e.to_string()))?;
    let mut their_plugins: Vec<Arc<[Plugin]>> = Vec::with_capacity(rows.len());
    for row in &rows {
        their_plugins.push(
            catalogue
                .plugins(&row.organisation)
                .await
                .map_err(|e| PlanError::Passing(e.to_string()))?,
        );
    }
    let holders: Vec<rules::Holder<'_>> = rows
        .iter()
        .zip(&their_plugins)
        .map(|(row, plugins)| rules::Holder {
            organisation: &row.organisation,
            object_type: &row.object_type,
            scan_level: row.scan_level,
            plugins,
        })
        .collect();
    Ok(rules::siblings(task, event.operation, &holders))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone, Utc};
    use serde_json::{Value, json};

    fn request(org: &str, key: Option<&str>, id: Option<uuid::Uuid>) -> PushRequest {
        let mut data = serde_json::Map::new();
        data.insert("organization".into(), json!(org));
        if let Some(k) = key {
            data.insert("deduplication_key".into(), Value::String(k.to_owned()));
        }
        PushRequest {
            id,
            organisation: org.to_owned(),
            data,
            ..PushRequest::default()
        }
    }

    #[test]
    fn work_that_ran_within_its_wait_is_gated_and_a_group_follows_its_leader() {
        let now = Utc.with_ymd_and_hms(2027, 1, 2, 0, 0, 0).unwrap();
        let leader = uuid::Uuid::new_v4();
        let key = leader.hyphenated().to_string();
        let requests = vec![
            request("a", Some(&key), Some(leader)),
            request("b", Some(&key), None),
            request("c", None, None),
            request("d", None, None),
        ];
        let hashes: Vec<String> = ["ha", "hb", "hc", "hd"].map(String::from).to_vec();
        let ran = |hours: i64| ((now - Duration::hours(hours)).naive_utc(), false);
        // The leader ran an hour ago; its sibling never ran; c ran an hour ago with a plugin
        // interval of 30 minutes; d ran 23 hours ago under the grace period of a day.
        let history: HashMap<String, (chrono::NaiveDateTime, bool)> =
            [("ha", ran(1)), ("hc", ran(1)), ("hd", ran(23))]
                .into_iter()
                .map(|(h, r)| (h.to_owned(), r))
                .collect();
        let waits = [
            Duration::days(1),
            Duration::days(1),
            Duration::minutes(30),
            Duration::days(1),
        ];
        assert_eq!(
            within_grace(&requests, &hashes, &history, &waits, now),
            vec![true, true, false, true]
        );
        // Once the leader's wait has passed, the group is planned, whatever a sibling's history.
        let later = now + Duration::hours(24);
        let mut history = history;
        history.insert(
            "hb".into(),
            ((later - Duration::hours(1)).naive_utc(), false),
        );
        assert_eq!(
            within_grace(&requests, &hashes, &history, &waits, later),
            vec![false, false, false, false]
        );
    }
}
