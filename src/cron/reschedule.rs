//! Rescheduling: every tick, all of a component's due schedules (`enabled`, `deadline_at ≤ now`)
//! become tasks, oldest due first, a page at a time, with no cap (mula handles at most 100 a
//! minute, newest first).
//!
//! Per boefje schedule, as mula: its plugin gone or disabled, its object gone, or the object no
//! longer permitted (type not consumed, scan level too low) → the schedule is disabled with the
//! reason stored. Otherwise a task with the plugin's current data. A report schedule's task is
//! its data.
//!
//! **Unknown is not gone.** The frontier is a mirror, never the verdict: an object it lacks is
//! asked of Octopoes ([`ObjectLookup`]), and so is one whose frontier row is marked gone (it may
//! have come back unannounced): only Octopoes' own "not found" disables a schedule, or, with no
//! Octopoes configured, a frontier row marked gone. While Octopoes cannot answer (down, erroring, backing off,
//! this tick's budget of calls spent), or when none is configured to ask, the schedule waits:
//! neither fired nor disabled, its deadline kept, so it fires once on a later tick that knows.
//!
//! **Each fire once.** A fire's task id is derived from the schedule and the deadline it fires
//! for (UUID v5), and the schedule's next deadline is written only after the push committed: a
//! restart in between pushes the same fire again, which changes nothing (the id exists); one
//! before the push fires it after the restart. So no fire is skipped and none runs twice.
//! **No concurrent invocation.** A fire whose work already waits in the queue is skipped, and the
//! deadline moves on: that task is its run. One whose previous task (same hash) is still
//! dispatched or running waits, its deadline kept, and fires on the first tick after that task
//! ended, so a run asked for meanwhile is not lost and the cron fires that pass while it waits
//! are one run. Such waits are as many as the tasks out at once, so re-examining them every
//! tick stays small.
//!
//! **Every due fire accounted for.** Each due fire's [`Fate`] (fired with its task, skipped with
//! the reason, or waiting for what cannot answer yet) goes into the fire ledger in the same
//! transaction as its schedule's new deadline or disable ([`Schedules::settle`]), with how late
//! it was decided: a crash cannot record a fire whose schedule did not move on, nor move one on
//! without its record. A fire pushed before a restart that lost the schedule's update is
//! recorded `fired` when the next tick meets its task.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use crate::domain::event::{ObjectEvent, Operation};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::Tick;
use super::table::{CronError, Entry, Fut, Outcome};
use crate::clients::catalogue::{Catalogue, CatalogueError};
use crate::domain::fire::{Fate, FireReason};
use crate::domain::plugin::{Plugin, PluginType};
use crate::domain::schedule::Cadence;
use crate::domain::{SchedulerId, TaskStatus};
use crate::frontier::lookup::{Known, ObjectLookup};
use crate::planner::rules::boefje_data;
use crate::queue::{Broker, PushOutcome, PushRequest, QueueError};
use crate::schedules::Schedules;
use crate::scoring::{ScoreInput, Scorer};
use crate::storage::StorageError;
use crate::storage::frontier::FrontierRow;
use crate::storage::schedules::{Advance, Disable, Due, FireRow, ScheduleRow};

/// Due schedules handled per page (one read, one push, one write).
pub const PAGE: usize = 1_000;

/// The rescheduling entry of a component.
pub struct Reschedule {
    /// The schedules: due ones read, fired ones moved on, gone ones disabled (the table's only
    /// writer).
    pub schedules: Schedules,
    /// What is known of schedules' objects: the frontier, and Octopoes for what it lacks.
    pub lookup: ObjectLookup,
    /// Octopoes calls one tick may make; the schedules beyond wait for the next tick.
    pub lookup_budget: usize,
    /// Where tasks go.
    pub broker: Broker,
    /// Plugins, for boefje schedules.
    pub catalogue: Catalogue,
    /// Time before a boefje schedule without cron or plugin interval runs again.
    pub grace: Duration,
    /// Up to this much more, spread per schedule (so schedules created together do not all
    /// come due in the same tick).
    pub jitter: Duration,
    /// Each scheduler's ranking strategy.
    pub scorer: std::sync::Arc<Scorer>,
    /// The ticks' period: a fire decided more than one period after it was due was late.
    pub period: Duration,
}

/// What becomes of one due schedule.
enum Decision {
    /// Push this task (the fire's own id); then the next deadline.
    Fire {
        task: Uuid,
        request: Box<PushRequest>,
        next: Option<NaiveDateTime>,
        /// The same work for the organisations that share the boefje's runs (de-duplication),
        /// led by this fire.
        siblings: Vec<PushRequest>,
    },
    /// Not pushed: the fire's fate, and what its schedule does.
    Hold { fate: Fate, then: Then },
}

/// What a schedule does once its due fire is decided.
#[derive(Debug, Clone, PartialEq)]
enum Then {
    /// Moves on to this deadline (`None`: a one-off that ran).
    Advance(Option<NaiveDateTime>),
    /// Is disabled, saying why.
    Disable(String),
    /// Keeps its deadline: the fire is decided on a later tick.
    Keep,
}

/// A fire that waits for `reason`: the schedule keeps its deadline.
fn waiting(reason: FireReason, detail: Option<String>) -> Decision {
    Decision::Hold {
        fate: Fate::Waiting {
            reason,
            task: None,
            detail,
        },
        then: Then::Keep,
    }
}

/// Counts of one run, for the report.
#[derive(Default)]
struct Counts {
    fired: usize,
    skipped: usize,
    disabled: usize,
    waiting: usize,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.fired += o.fired;
        self.skipped += o.skipped;
        self.disabled += o.disabled;
        self.waiting += o.waiting;
    }
}

/// The task id of a schedule's fire for `deadline`: the same fire, the same id.
pub fn fire_id(schedule: &str, deadline: Option<NaiveDateTime>) -> Uuid {
    let name = format!(
        "{schedule}@{}",
        deadline
            .map(|d| d.and_utc().timestamp_micros())
            .unwrap_or(0)
    );
    Uuid::new_v5(&Uuid::NAMESPACE_OID, name.as_bytes())
}

/// The task id of a fire for `deadline` once the schedule was set again to a deadline that had
/// fired (`armed`: the schedule row's `modified_at` then). Rocky sets a report recipe's deadline
/// to the day's date on every edit, so an edit on the day the recipe first ran names a due time
/// that already has its task; [`fire_id`] alone would take that finished task for this fire.
pub fn rearmed_fire_id(schedule: &str, deadline: NaiveDateTime, armed: NaiveDateTime) -> Uuid {
    let name = format!(
        "{schedule}@{}#{}",
        deadline.and_utc().timestamp_micros(),
        armed.and_utc().timestamp_micros()
    );
    Uuid::new_v5(&Uuid::NAMESPACE_OID, name.as_bytes())
}

/// What a fire whose task id is taken already becomes ([`rearmed_fire_id`]).
#[derive(Debug)]
enum Rearm {
    /// The task is this fire's: pushed before (a restart between the push and the schedule's
    /// update), or waiting still.
    Taken,
    /// The task is a run from before the schedule was set again: the fire is pushed anew.
    Again,
    /// The task cannot be read now: the fire waits, its deadline kept, for the next tick.
    /// Taken for this fire instead, a one-off recipe set again to a day it ran would lose its
    /// deadline (no cron, no next) and never run.
    Wait(QueueError),
}

/// [`Rearm`] from the read of the task holding the fire's id, and the time the schedule's row
/// was read (its `modified_at`: when it was set).
fn rearm(earlier: Result<crate::domain::Task, QueueError>, read: NaiveDateTime) -> Rearm {
    let earlier = match earlier {
        Ok(t) => t,
        Err(e) => {
            return Rearm::Wait(QueueError::Unavailable(format!(
                "cannot read the task holding the fire's id: {e}"
            )));
        }
    };
    // Still dispatched or running, it is the run of the recipe before the edit: the edited fire
    // is pushed under its own id too, and waits for that run to end (the queue refuses planned
    // work whose hash is in flight), rather than being taken for it.
    let out = earlier.status.is_terminal()
        || matches!(earlier.status, TaskStatus::Dispatched | TaskStatus::Running);
    if out && earlier.created_at.naive_utc() < read {
        Rearm::Again
    } else {
        Rearm::Taken
    }
}

/// What a due boefje schedule becomes, from what is known of its plugin and object: the rule
/// alone, apart from the reads that feed it.
#[derive(Debug, PartialEq)]
enum Verdict<'a> {
    /// Disable it, saying why: its plugin is gone or disabled, its object gone (a frontier row
    /// marked gone, or Octopoes' own "not found"), or no longer permitted.
    Disable(FireReason, String),
    /// Nothing can say yet whether its object exists: neither fire nor disable.
    Wait(FireReason),
    /// Fire it with this plugin, on this object (`None`: a schedule without an object).
    Fire(&'a Plugin, Option<&'a FrontierRow>),
}

impl<'a> Verdict<'a> {
    /// The plugin and object to fire with; or, for a verdict that does not fire, what the
    /// ledger records of the fire and what its schedule does.
    fn split(self) -> Result<(&'a Plugin, Option<&'a FrontierRow>), (Fate, Then)> {
        match self {
            Verdict::Fire(p, object) => Ok((p, object)),
            Verdict::Disable(reason, why) => Err((
                Fate::Skipped {
                    reason,
                    task: None,
                    detail: Some(why.clone()),
                },
                Then::Disable(why),
            )),
            Verdict::Wait(reason) => Err((
                Fate::Waiting {
                    reason,
                    task: None,
                    detail: None,
                },
                Then::Keep,
            )),
        }
    }
}

/// What a fire's push made of it: its fate in the ledger and what its schedule does (moving on
/// to `next`, disabled, or kept due).
fn pushed(
    task: Uuid,
    result: Result<PushOutcome, QueueError>,
    next: Option<NaiveDateTime>,
) -> (Fate, Then) {
    let skipped = |reason, existing| Fate::Skipped {
        reason,
        task: Some(existing),
        detail: None,
    };
    match result {
        // A task of the fire's own id is this fire, pushed now or before a restart.
        Ok(o) if o.created || o.task.id == task => (Fate::Fired { task }, Then::Advance(next)),
        Err(QueueError::Duplicate { existing }) if existing == task => {
            (Fate::Fired { task }, Then::Advance(next))
        }
        // The same work waits: that task is this fire's run, so the schedule moves on.
        Ok(o) => (
            skipped(FireReason::DuplicateQueued, o.task.id),
            Then::Advance(next),
        ),
        Err(QueueError::Duplicate { existing }) => (
            skipped(FireReason::DuplicateQueued, existing),
            Then::Advance(next),
        ),
        // The previous run is still out: the fire waits for it (no concurrent invocation) and
        // runs once it has ended. Moving on would lose a run asked for after that one started
        // (a user's "run now", a one-off report's rerun, which has no next deadline at all),
        // as mula, which retries such a schedule every minute, does not.
        Err(QueueError::InFlight { existing }) => (
            Fate::Waiting {
                reason: FireReason::StillRunning,
                task: Some(existing),
                detail: None,
            },
            Then::Keep,
        ),
        Err(QueueError::QueueFull(s)) => (
            Fate::Waiting {
                reason: FireReason::QueueFull,
                task: None,
                detail: Some(QueueError::QueueFull(s).to_string()),
            },
            Then::Keep,
        ),
        // Passing: the same fire is pushed again on a later tick.
        Err(
            e @ (QueueError::Busy
            | QueueError::Unavailable(_)
            | QueueError::Moving(_)
            | QueueError::Internal(_)),
        ) => (
            Fate::Waiting {
                reason: FireReason::QueueUnavailable,
                task: None,
                detail: Some(e.to_string()),
            },
            Then::Keep,
        ),
        Err(e) => {
            let why = format!("{}: {e}", crate::domain::fire::TASK_REFUSED);
            (
                Fate::Skipped {
                    reason: FireReason::TaskRefused,
                    task: None,
                    detail: Some(why.clone()),
                },
                Then::Disable(why),
            )
        }
    }
}

fn verdict<'a>(
    boefje: &str,
    plugin: Option<&'a Plugin>,
    reference: Option<&str>,
    known: Option<&'a Known>,
) -> Verdict<'a> {
    let p = match plugin {
        None => {
            return Verdict::Disable(
                FireReason::PluginGone,
                format!("plugin {boefje} is gone from the catalogue"),
            );
        }
        Some(p) if !p.enabled => {
            return Verdict::Disable(
                FireReason::PluginDisabled,
                format!("plugin {boefje} is disabled"),
            );
        }
        Some(p) => p,
    };
    let Some(reference) = reference else {
        return Verdict::Fire(p, None);
    };
    match known {
        Some(Known::Gone) => Verdict::Disable(
            FireReason::ObjectGone,
            format!("object {reference} is gone"),
        ),
        Some(Known::Present(o)) => match p.permits(&o.object_type, o.scan_level) {
            Ok(()) => Verdict::Fire(p, Some(o)),
            Err(why) => Verdict::Disable(FireReason::NotPermitted, why),
        },
        Some(Known::Unavailable) => Verdict::Wait(FireReason::OctopoesUnavailable),
        Some(Known::Unverifiable) | None => Verdict::Wait(FireReason::ObjectUnverifiable),
    }
}

/// The object a schedule's data names (`data.input_ooi`); empty is none, as mula reads it (and
/// as the work's hash does).
fn input_ooi(data: &Map<String, Value>) -> Option<&str> {
    data.get("input_ooi")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
}

/// The boefje a schedule's data names (`data.boefje.id`).
fn boefje_id(data: &Map<String, Value>) -> &str {
    data.get("boefje")
        .and_then(|b| b.get("id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether the schedule of `data` would be disabled as not permitted: its plugin is enabled and
/// refuses the object as `objects` holds it (type not consumed, scan level too low).
fn refuses(
    plugins: &[Plugin],
    data: &Map<String, Value>,
    objects: &HashMap<String, Known>,
) -> bool {
    let Some(p) = plugin_of(plugins, data).filter(|p| p.enabled) else {
        return false;
    };
    let reference = input_ooi(data);
    matches!(
        reference.and_then(|r| objects.get(r)),
        Some(Known::Present(o)) if p.permits(&o.object_type, o.scan_level).is_err()
    )
}

/// The catalogue's boefje a schedule's data names.
fn plugin_of<'a>(plugins: &'a [Plugin], data: &Map<String, Value>) -> Option<&'a Plugin> {
    let boefje = boefje_id(data);
    plugins
        .iter()
        .find(|p| p.id == boefje && p.plugin_type == PluginType::Boefje)
}

impl Reschedule {
    /// The next deadline after a fire at `now`: the next cron fire, else the plugin's interval
    /// (or the grace period) plus the schedule's spread; a report without cron runs once.
    fn next(
        &self,
        row: &ScheduleRow,
        plugin: Option<&Plugin>,
        now: DateTime<Utc>,
    ) -> Option<NaiveDateTime> {
        let cadence = Cadence {
            grace: self.grace,
            jitter: self.jitter,
        };
        let wait = plugin.map(|p| p.interval.filter(|m| *m > 0).map(chrono::Duration::minutes));
        cadence
            .next(&row.id, row.schedule.as_deref(), wait, now)
            .map(|t| t.naive_utc())
    }

    async fn decide_boefjes(
        &self,
        rows: &[ScheduleRow],
        tick: &Tick,
        budget: &AtomicUsize,
    ) -> Vec<Decision> {
        // The catalogue and the frontier per organisation, read once for the page.
        let mut by_org: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            by_org.entry(r.organisation.as_str()).or_default().push(i);
        }
        let mut out: Vec<Option<Decision>> = rows.iter().map(|_| None).collect();
        if !self.catalogue.is_configured() {
            // No catalogue to ask: a plugin it lacks is unknown, not gone.
            return rows
                .iter()
                .map(|_| waiting(FireReason::CatalogueUnavailable, None))
                .collect();
        }
        // Set once Katalogus left a confirmation unanswered (`confirm_plugins`).
        let mut katalogus_hung: Option<String> = None;
        // Every organisation's plugins asked for at once: an organisation the catalogue has no
        // copy of waits for Katalogus (up to the catalogue's wait), and a hung Katalogus must
        // cost the page one wait, not one per organisation.
        let by_org: Vec<(&str, Vec<usize>)> = by_org.into_iter().collect();
        let answers = futures_util::future::join_all(
            by_org.iter().map(|(org, _)| self.catalogue.plugins(org)),
        )
        .await;
        for ((org, idx), answer) in by_org.into_iter().zip(answers) {
            let plugins = match answer {
                Ok(p) => p,
                Err(e) => {
                    for i in idx {
                        out[i] = Some(waiting(
                            FireReason::CatalogueUnavailable,
                            Some(e.to_string()),
                        ));
                    }
                    continue;
                }
            };
            let data: Vec<Map<String, Value>> = idx
                .iter()
                .map(|&i| serde_json::from_str(&rows[i].data).unwrap_or_default())
                .collect();
            // A plugin gone from the list or disabled disables its schedules for good, so that is
            // decided from Katalogus' answer of now: the list above may be a copy kept while
            // Katalogus fails, older than the plugin's re-enabling. Unconfirmed, those schedules
            // wait (the rest go on from the copy).
            let gone_or_disabled = data
                .iter()
                .any(|d| plugin_of(&plugins, d).is_none_or(|p| !p.enabled));
            let (plugins, unconfirmed) = self
                .confirm_plugins(org, plugins, gone_or_disabled, &mut katalogus_hung)
                .await;
            // The organisations sharing each de-duplicated boefje's runs, asked for at once
            // (Katalogus' `/v1/configs`, cached): each fire below reads its siblings from them,
            // and a page's fires must not wait for Katalogus one after another.
            let shared: BTreeSet<&str> = data
                .iter()
                .filter_map(|d| plugin_of(&plugins, d))
                .filter(|p| p.enabled && p.deduplicate)
                .map(|p| p.id.as_str())
                .collect();
            if katalogus_hung.is_none() {
                futures_util::future::join_all(
                    shared.iter().map(|b| self.catalogue.duplicates(org, b)),
                )
                .await;
            }
            // Only the objects of schedules that may fire are looked up (Octopoes calls are
            // bounded per tick; a schedule whose plugin is gone is disabled without one).
            let refs: Vec<String> = data
                .iter()
                .filter(|d| plugin_of(&plugins, d).is_some_and(|p| p.enabled))
                .filter_map(|d| input_ooi(d).map(str::to_owned))
                .collect();
            let hashes: Vec<String> = idx.iter().filter_map(|&i| rows[i].hash.clone()).collect();
            // Read whatever the strategy: the grace gate below needs the last runs too.
            let history = self.broker.last_runs(hashes).await.unwrap_or_default();
            // The objects as Octopoes holds them now, not as the frontier's rows say: a fire
            // runs a scan, which cannot be undone, and a row may lag a clearance lowered or an
            // object deleted (an event still queued or dead-lettered, a listener that was
            // down); mula asks Octopoes on every fire too. Then the plugins to decide by where
            // one refuses its schedule's object (which disables the schedule for good:
            // confirmed with Katalogus, the plugin's level and types).
            let known = async {
                let objects = self.lookup.confirmed(org, &refs, budget).await?;
                let confirmed = self
                    .confirm_refusals(org, plugins, &data, &objects, &mut katalogus_hung)
                    .await;
                Ok::<_, StorageError>((objects, confirmed))
            }
            .await;
            let (objects, (plugins, unpermitted)) = match known {
                Ok(known) => known,
                Err(e) => {
                    for i in idx {
                        out[i] = Some(waiting(
                            FireReason::FrontierUnavailable,
                            Some(e.to_string()),
                        ));
                    }
                    continue;
                }
            };
            for (&i, d) in idx.iter().zip(data) {
                let row = &rows[i];
                let boefje = boefje_id(&d);
                let plugin = plugin_of(&plugins, &d);
                if unconfirmed.is_some() && plugin.is_none_or(|p| !p.enabled) {
                    out[i] = Some(waiting(
                        FireReason::CatalogueUnavailable,
                        unconfirmed.clone(),
                    ));
                    continue;
                }
                if unpermitted.is_some() && refuses(&plugins, &d, &objects) {
                    out[i] = Some(waiting(
                        FireReason::CatalogueUnavailable,
                        unpermitted.clone(),
                    ));
                    continue;
                }
                let reference = input_ooi(&d);
                let known = reference.and_then(|r| objects.get(r));
                out[i] = Some(match verdict(boefje, plugin, reference, known).split() {
                    Err((fate, then)) => Decision::Hold { fate, then },
                    Ok((p, object)) => 'decided: {
                        let mut data = boefje_data(p, reference.unwrap_or_default(), org);
                        if reference.is_none() {
                            // A boefje without an object: null, as mula's `BoefjeTask` has it.
                            data["input_ooi"] = Value::Null;
                        }
                        let last = row.hash.as_ref().and_then(|h| history.get(h));
                        if let Some(held) = self.within_grace(row, p, last, tick.at) {
                            break 'decided held;
                        }
                        let input = ScoreInput {
                            now: tick.at,
                            last_run: last.map(|(t, _)| t.and_utc()),
                            last_failed: last.is_some_and(|(_, f)| *f),
                            findings_changed: match (object, last) {
                                (Some(o), Some((t, _))) => o.last_seen > *t,
                                _ => false,
                            },
                            scan_level: object.and_then(|o| o.scan_level),
                            grace_secs: self.wait(Some(p)).num_seconds(),
                        };
                        let mut decision = self.fire(row, data, Some(p), &input, tick);
                        // With Katalogus hung this page, the fire goes alone rather than wait;
                        // work without an object has no holders to share it with.
                        if let Decision::Fire {
                            request, siblings, ..
                        } = &mut decision
                            && katalogus_hung.is_none()
                            && let Some(reference) = reference
                        {
                            *siblings = self
                                .siblings(request, org, reference, &plugins, budget)
                                .await;
                        }
                        decision
                    }
                });
            }
        }
        out.into_iter()
            .map(|d| d.unwrap_or_else(|| waiting(FireReason::CatalogueUnavailable, None)))
            .collect()
    }

    /// The plugins of `org` to decide schedules by, and why they are unconfirmed. A plugin gone
    /// from the list, disabled, or refusing a schedule's object disables that schedule for good,
    /// so that is decided from Katalogus' answer of now: `plugins` may be the catalogue's copy
    /// kept while Katalogus fails, older than the plugin's re-enabling or its new scan level.
    /// When a schedule would be disabled so (`needed`), the list is confirmed; unconfirmed (the
    /// reason given), those schedules wait and the rest go on from the copy. Once Katalogus left a confirmation unanswered until the wait ran out (`hung`),
    /// the page's other organisations are not asked: a hung Katalogus costs the tick one wait
    /// ([`MISS_WAIT`](crate::clients::catalogue::MISS_WAIT)), not one per organisation. An
    /// answer that is an error (an organisation it does not list) holds back that one alone.
    async fn confirm_plugins(
        &self,
        org: &str,
        plugins: Arc<[Plugin]>,
        needed: bool,
        hung: &mut Option<String>,
    ) -> (Arc<[Plugin]>, Option<String>) {
        if !needed {
            return (plugins, None);
        }
        if let Some(why) = hung {
            return (plugins, Some(why.clone()));
        }
        match self.catalogue.plugins_confirmed(org).await {
            Ok(now) => (now, None),
            Err(e) => {
                let why = e.to_string();
                if matches!(e, CatalogueError::Unanswered(_)) {
                    *hung = Some(why.clone());
                }
                (plugins, Some(why))
            }
        }
    }

    /// The plugins to decide `data`'s schedules by where one would be disabled as not
    /// permitted, and why they are unconfirmed. A refusal disables for good, so it stands only on
    /// the word of now of both sides: `objects` are Octopoes' (asked for every fire); a plugin
    /// that refuses its object has the list confirmed with Katalogus
    /// ([`Self::confirm_plugins`]), since the plugin's level and types in a copy kept while
    /// Katalogus fails may predate Katalogus' own.
    async fn confirm_refusals(
        &self,
        org: &str,
        plugins: Arc<[Plugin]>,
        data: &[Map<String, Value>],
        objects: &HashMap<String, Known>,
        hung: &mut Option<String>,
    ) -> (Arc<[Plugin]>, Option<String>) {
        if !data.iter().any(|d| refuses(&plugins, d, objects)) {
            return (plugins, None);
        }
        self.confirm_plugins(org, plugins, true, hung).await
    }

    /// The wait of a boefje schedule without cron: its plugin's interval, else the grace period.
    fn wait(&self, plugin: Option<&Plugin>) -> chrono::Duration {
        plugin
            .and_then(|p| p.interval.filter(|m| *m > 0))
            .map(chrono::Duration::minutes)
            .unwrap_or_else(|| {
                chrono::Duration::from_std(self.grace).unwrap_or(chrono::Duration::days(1))
            })
    }

    /// mula's grace gate on rescheduled boefje work (`push_boefje_task`, whatever the ranker):
    /// work that finished within its plugin's interval (else the grace period) is not run again
    /// yet, so a scan a user ran by hand, or one an event planned, shortly before its
    /// schedule's deadline is not run twice. The schedule moves to the moment the wait ends
    /// (mula tries again every minute until then), not to a whole interval later. A schedule
    /// with a cron expression keeps its cron: its runs are at the times it names.
    fn within_grace(
        &self,
        row: &ScheduleRow,
        plugin: &Plugin,
        last: Option<&(NaiveDateTime, bool)>,
        at: DateTime<Utc>,
    ) -> Option<Decision> {
        if row.schedule.is_some() {
            return None;
        }
        let (ran, _) = last?;
        let open = ran.and_utc() + self.wait(Some(plugin));
        (at < open).then(|| Decision::Hold {
            fate: Fate::Skipped {
                reason: FireReason::WithinGracePeriod,
                task: None,
                detail: Some(format!(
                    "the same work finished at {}; it runs again from {}",
                    ran.and_utc().to_rfc3339(),
                    open.to_rfc3339()
                )),
            },
            then: Then::Advance(Some(open.naive_utc())),
        })
    }

    fn fire(
        &self,
        row: &ScheduleRow,
        data: Value,
        plugin: Option<&Plugin>,
        input: &ScoreInput,
        tick: &Tick,
    ) -> Decision {
        let Some((priority, why)) = self.scorer.score(tick.component, input) else {
            // Not now: the strategy says the work ran too recently.
            return Decision::Hold {
                fate: Fate::Skipped {
                    reason: FireReason::WithinGracePeriod,
                    task: None,
                    detail: None,
                },
                then: Then::Advance(self.next(row, plugin, tick.at)),
            };
        };
        let id = fire_id(&row.id, row.deadline_at);
        let mut data = match data {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        data.insert("id".into(), Value::String(id.hyphenated().to_string()));
        Decision::Fire {
            task: id,
            request: Box::new(PushRequest {
                id: Some(id),
                organisation: row.organisation.clone(),
                priority: Some(priority),
                data,
                planned: true,
                once: true,
                schedule_id: Uuid::parse_str(&row.id).ok(),
                explanation: serde_json::to_string(&why).ok(),
                ..PushRequest::default()
            }),
            next: self.next(row, plugin, tick.at),
            siblings: Vec::new(),
        }
    }

    /// A boefje fire's de-duplication siblings (mula's `push_boefje_task` asks
    /// `is_boefje_in_other_orgs` on every push, a schedule's fire included): the same work for
    /// every other organisation that runs the boefje with the same settings and holds the
    /// object, the fire their leader. Each then finds its own schedule's fire a duplicate of
    /// work waiting, or within the grace period of its run, so the target is scanned once for
    /// all of them, not once per organisation. Holders the frontier lacks are asked of Octopoes
    /// within the tick's budget of calls, beyond it left to their own schedules. When they cannot
    /// be known now (Katalogus or the lookup failing), the fire goes alone.
    async fn siblings(
        &self,
        request: &mut PushRequest,
        organisation: &str,
        reference: &str,
        plugins: &[Plugin],
        budget: &AtomicUsize,
    ) -> Vec<PushRequest> {
        let event = ObjectEvent {
            operation: Operation::Create,
            organisation: organisation.to_owned(),
            reference: reference.to_owned(),
            object: None,
        };
        let found = crate::planner::siblings(
            &self.catalogue,
            &self.lookup,
            Some(budget),
            request,
            &event,
            plugins,
        )
        .await;
        match found {
            Ok(siblings) => siblings,
            Err(e) => {
                tracing::debug!(organisation, object = reference, error = %e, "rescheduling: the fire's de-duplication siblings are unknown now; it goes alone");
                Vec::new()
            }
        }
    }

    /// One page's decisions, sorted by what the write stage does with them.
    async fn prepare(&self, rows: &[ScheduleRow], tick: &Tick, budget: &AtomicUsize) -> Prepared {
        let decisions = match tick.component {
            SchedulerId::Boefje => self.decide_boefjes(rows, tick, budget).await,
            _ => rows
                .iter()
                .map(|r| {
                    let data: Value = serde_json::from_str(&r.data).unwrap_or(Value::Null);
                    let input = ScoreInput::fresh(tick.at, self.wait(None));
                    self.fire(r, data, None, &input, tick)
                })
                .collect(),
        };
        let now = tick.at.naive_utc();
        let mut p = Prepared::default();
        for (row, d) in rows.iter().zip(decisions) {
            let due = row.due(now);
            match d {
                Decision::Fire {
                    task,
                    request,
                    next,
                    siblings,
                } => {
                    p.requests.push(*request);
                    p.fired.push((due, task, next));
                    p.siblings.push(siblings);
                }
                Decision::Hold { fate, then } => {
                    p.held.decide(due, fate, then, false, now, self.period);
                }
            }
        }
        p
    }

    /// Pushes one prepared page's fires at once; answers what the schedules' rows and the
    /// ledger need then.
    async fn push(&self, p: Prepared, tick: &Tick) -> Result<Settlement, CronError> {
        let Prepared {
            requests,
            mut fired,
            held: mut out,
            siblings,
        } = p;
        if requests.is_empty() {
            return Ok(out);
        }
        let sent = requests.clone();
        let mut results = self.broker.push_many(tick.component, requests).await?;
        self.push_rearmed(&mut fired, &mut results, sent, tick)
            .await?;
        let siblings: Vec<PushRequest> = siblings
            .into_iter()
            .zip(fired.iter().zip(&results))
            .filter(|(_, ((_, task, _), r))| matches!(r, Ok(o) if o.created && o.task.id == *task))
            .flat_map(|(s, _)| s)
            .collect();
        if !siblings.is_empty() {
            // Planned work: one that waits or runs already is refused and changes nothing.
            let n = siblings.len();
            let created = self
                .broker
                .push_many(tick.component, siblings)
                .await?
                .iter()
                .filter(|r| matches!(r, Ok(o) if o.created))
                .count();
            tracing::debug!(
                siblings = n,
                created,
                "rescheduling: de-duplication siblings of the page's fires"
            );
        }
        let now = tick.at.naive_utc();
        for ((due, task, next), r) in fired.into_iter().zip(results) {
            let created = matches!(&r, Ok(o) if o.created);
            let (fate, then) = pushed(task, r, next);
            out.decide(due, fate, then, created, now, self.period);
        }
        Ok(out)
    }

    /// The fires whose own task (by [`fire_id`]) exists, finished or out with a runner, and was
    /// made before their schedule was last changed: the schedule was set again to a deadline that had fired (a
    /// user's edit; a crash between a fire's push and its schedule's update leaves the row as it
    /// was, older than the task). Each is a new fire of that due time, pushed under an id of its
    /// own arming ([`rearmed_fire_id`]); `fired` and `results` then name it.
    async fn push_rearmed(
        &self,
        fired: &mut [(Due, Uuid, Option<NaiveDateTime>)],
        results: &mut [Result<PushOutcome, QueueError>],
        mut sent: Vec<PushRequest>,
        tick: &Tick,
    ) -> Result<(), CronError> {
        let mut again = Vec::new();
        for (k, (due, task, _)) in fired.iter().enumerate() {
            if !matches!(&results[k], Err(QueueError::Duplicate { existing }) if existing == task) {
                continue;
            }
            match rearm(self.broker.get_task(*task).await, due.read) {
                Rearm::Taken => continue,
                Rearm::Wait(e) => {
                    results[k] = Err(e);
                    continue;
                }
                Rearm::Again => {}
            }
            let id = rearmed_fire_id(&due.schedule_id, due.due_at, due.read);
            let mut request = std::mem::take(&mut sent[k]);
            request.id = Some(id);
            request
                .data
                .insert("id".into(), Value::String(id.hyphenated().to_string()));
            again.push((k, id, request));
        }
        if again.is_empty() {
            return Ok(());
        }
        let (at, requests): (Vec<_>, Vec<_>) =
            again.into_iter().map(|(k, id, r)| ((k, id), r)).unzip();
        let answers = self.broker.push_many(tick.component, requests).await?;
        for ((k, id), r) in at.into_iter().zip(answers) {
            fired[k].1 = id;
            results[k] = r;
        }
        Ok(())
    }

    /// After a page's push committed (its tasks with their explanations): its schedules' new
    /// deadlines and disables, and its fires in the ledger, in one transaction.
    async fn settle(&self, p: Settlement, tick: &Tick) -> Result<Counts, CronError> {
        let Settlement {
            advance,
            disable,
            fires,
            decided,
            mut counts,
        } = p;
        let asked = disable.len();
        let mut kept: std::collections::HashSet<String> =
            disable.iter().map(|d| d.id.clone()).collect();
        let disabled = self
            .schedules
            .settle(advance, disable, fires, tick.at.naive_utc())
            .await?;
        for d in &disabled {
            kept.remove(&d.id);
            tracing::info!(schedule.id = %d.id, reason = %d.reason, "schedule disabled");
        }
        // A disable that met a schedule changed since the tick read it (a user's edit) did not
        // apply: that fire waits for the next tick, which decides on the row as it is now.
        counts.disabled += disabled.len();
        counts.waiting += asked - disabled.len();
        for id in &kept {
            tracing::info!(schedule.id = %id, "schedule changed while the tick decided it: decided again next tick");
        }
        // Counted once committed: a page whose settle failed is decided again on a later tick.
        let metrics = self.broker.metrics();
        for (id, skipped, late) in decided {
            if !kept.contains(&id) {
                metrics.schedule_fire(tick.component, skipped, late);
            }
        }
        Ok(counts)
    }

    /// The next page of due schedules after `after`, prepared; `None` when there is none.
    async fn next_page(
        &self,
        tick: &Tick,
        after: Option<(NaiveDateTime, String)>,
        budget: &AtomicUsize,
    ) -> Result<Option<Page>, CronError> {
        let (s, now) = (tick.component, tick.at.naive_utc());
        let rows = self.schedules.due(s, now, after, PAGE).await?;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        let last = (last.deadline_at.unwrap_or(now), last.id.clone());
        Ok(Some(Page {
            full: rows.len() == PAGE,
            last,
            prepared: self.prepare(&rows, tick, budget).await,
        }))
    }
}

/// A page's writes, decided.
#[derive(Default)]
struct Prepared {
    /// The fires' tasks, in order.
    requests: Vec<PushRequest>,
    /// Per fire, in the same order: which fire it is, its task id and its schedule's next
    /// deadline.
    fired: Vec<(Due, Uuid, Option<NaiveDateTime>)>,
    /// The fires decided without a push (skipped, disabled, waiting).
    held: Settlement,
    /// Per fire, in the same order: its de-duplication siblings, pushed after it when it made
    /// its task under its own id (they name it as their group's leader).
    siblings: Vec<Vec<PushRequest>>,
}

/// What a page's schedules' rows and the ledger need once its fires are decided.
#[derive(Default)]
struct Settlement {
    /// Schedules whose deadline moves.
    advance: Vec<Advance>,
    /// Schedules to disable, with the reason.
    disable: Vec<Disable>,
    /// The page's due fires, as the ledger records them.
    fires: Vec<FireRow>,
    /// The decided ones (not waiting), for the metrics: the schedule, the skip's reason
    /// (`None`: fired), and whether it was late.
    decided: Vec<(String, Option<FireReason>, bool)>,
    counts: Counts,
}

impl Settlement {
    /// Takes one fire's decision, made at `now`; `created` says its push made its task now
    /// (counted as fired; otherwise a schedule moving on counts as skipped).
    fn decide(
        &mut self,
        due: Due,
        fate: Fate,
        then: Then,
        created: bool,
        now: NaiveDateTime,
        period: Duration,
    ) {
        let (from, read) = (due.due_at, due.read);
        let row = FireRow::decided(due, now, period, &fate);
        match &fate {
            Fate::Fired { .. } => self.decided.push((row.schedule_id.clone(), None, row.late)),
            Fate::Skipped { reason, .. } => {
                self.decided
                    .push((row.schedule_id.clone(), Some(*reason), row.late));
            }
            Fate::Waiting { .. } => {}
        }
        let id = row.schedule_id.clone();
        self.fires.push(row);
        match then {
            Then::Advance(next) => {
                match created {
                    true => self.counts.fired += 1,
                    false => self.counts.skipped += 1,
                }
                self.advance.push(Advance { id, from, to: next });
            }
            Then::Disable(reason) => self.disable.push(Disable { id, reason, read }),
            Then::Keep => self.counts.waiting += 1,
        }
    }
}

/// A page read and prepared.
struct Page {
    /// Whether it was a full page (more may follow).
    full: bool,
    /// Its last schedule's (deadline, id): where the next page starts.
    last: (NaiveDateTime, String),
    prepared: Prepared,
}

impl Entry for Reschedule {
    fn name(&self) -> &'static str {
        "reschedule"
    }

    /// Pages through the due schedules in a pipeline of three stages, each on connections of
    /// its own: page k's schedules settled (new deadlines, disables) while page k+1 is pushed
    /// (the engine's connection) and page k+2 read and decided (the frontier, the catalogue,
    /// scoring). A page's deadlines still move only after its push committed.
    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let s = tick.component;
            let mut n = Counts::default();
            let mut settling: Option<Fut<'a, Result<Counts, CronError>>> = None;
            let budget = AtomicUsize::new(self.lookup_budget);
            let mut next = self.next_page(tick, None, &budget).await?;
            while let Some(page) = next {
                let reading = async {
                    match page.full {
                        true => self.next_page(tick, Some(page.last), &budget).await,
                        false => Ok(None),
                    }
                };
                let previous = async {
                    match settling.take() {
                        Some(f) => f.await,
                        None => Ok(Counts::default()),
                    }
                };
                let (pushed, settled, following) =
                    tokio::join!(self.push(page.prepared, tick), previous, reading);
                n.add(settled?);
                let pushed = pushed?;
                settling = Some(Box::pin(self.settle(pushed, tick)));
                next = following?;
            }
            if let Some(f) = settling {
                n.add(f.await?);
            }
            if n.fired + n.skipped + n.disabled > 0 {
                tracing::info!(scheduler.id = %s, fired = n.fired, skipped = n.skipped, disabled = n.disabled, waiting = n.waiting, "due schedules handled");
            }
            Ok(format!(
                "fired {}, skipped {}, disabled {}, waiting {}",
                n.fired, n.skipped, n.disabled, n.waiting
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fire::FireOutcome;

    fn dns(enabled: bool) -> Plugin {
        Plugin {
            id: "dns-records".into(),
            plugin_type: PluginType::Boefje,
            name: None,
            version: None,
            enabled,
            consumes: vec!["Hostname".into()],
            scan_level: Some(2),
            interval: None,
            cron: None,
            run_on: None,
            oci_image: None,
            deduplicate: false,
        }
    }

    fn object(level: i64) -> FrontierRow {
        let t = chrono::DateTime::from_timestamp(1_700_000_000, 0)
            .unwrap()
            .naive_utc();
        FrontierRow {
            organisation: "org1".into(),
            reference: "Hostname|internet|a.nl".into(),
            object_type: "Hostname".into(),
            scan_level: Some(level),
            scan_profile_type: Some("declared".into()),
            first_seen: t,
            last_seen: t,
            gone_at: None,
            planned: true,
        }
    }

    const REF: Option<&str> = Some("Hostname|internet|a.nl");

    #[test]
    fn only_a_plugin_or_object_known_gone_disables_and_an_unknown_object_waits() {
        let (on, off) = (dns(true), dns(false));
        let present = Known::Present(object(2));
        let too_low = Known::Present(object(1));
        let disabled = |v: Verdict<'_>| match v {
            Verdict::Disable(reason, why) => (reason, why),
            other => panic!("{other:?}"),
        };
        let (reason, why) = disabled(verdict("dns-records", None, REF, Some(&present)));
        assert_eq!(reason, FireReason::PluginGone);
        assert!(why.contains("gone from the catalogue"), "{why}");
        let (reason, why) = disabled(verdict("dns-records", Some(&off), REF, Some(&present)));
        assert_eq!(reason, FireReason::PluginDisabled);
        assert!(why.contains("is disabled"), "{why}");
        let (reason, why) = disabled(verdict("dns-records", Some(&on), REF, Some(&Known::Gone)));
        assert_eq!(reason, FireReason::ObjectGone);
        assert!(why.contains("is gone"), "{why}");
        let (reason, why) = disabled(verdict("dns-records", Some(&on), REF, Some(&too_low)));
        assert_eq!(reason, FireReason::NotPermitted);
        assert!(why.contains("scan level"), "{why}");
        match verdict("dns-records", Some(&on), REF, Some(&present)) {
            Verdict::Fire(p, Some(o)) => {
                assert_eq!((p.id.as_str(), o.scan_level), ("dns-records", Some(2)))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            verdict("dns-records", Some(&on), None, None),
            Verdict::Fire(_, None)
        ));
        // Unknown is not gone: the frontier lacks it and Octopoes cannot (or was not) asked.
        assert_eq!(
            verdict("dns-records", Some(&on), REF, Some(&Known::Unavailable)),
            Verdict::Wait(FireReason::OctopoesUnavailable)
        );
        for unknown in [Some(&Known::Unverifiable), None] {
            assert_eq!(
                verdict("dns-records", Some(&on), REF, unknown),
                Verdict::Wait(FireReason::ObjectUnverifiable)
            );
        }
    }

    #[test]
    fn a_verdict_that_does_not_fire_is_recorded_with_its_reason_and_moves_its_schedule() {
        let on = dns(true);
        let present = Known::Present(object(2));
        let (fate, then) = verdict("dns-records", None, REF, Some(&present))
            .split()
            .unwrap_err();
        let why = "plugin dns-records is gone from the catalogue".to_owned();
        assert_eq!(
            fate,
            Fate::Skipped {
                reason: FireReason::PluginGone,
                task: None,
                detail: Some(why.clone())
            }
        );
        assert_eq!(then, Then::Disable(why), "a skip that disables says why");
        let (fate, then) = verdict("dns-records", Some(&on), REF, Some(&Known::Unavailable))
            .split()
            .unwrap_err();
        assert_eq!(
            (fate.outcome(), fate.reason(), then),
            (
                FireOutcome::Waiting,
                Some(FireReason::OctopoesUnavailable),
                Then::Keep
            ),
            "a wait keeps the deadline"
        );
        let (p, o) = verdict("dns-records", Some(&on), REF, Some(&present))
            .split()
            .unwrap();
        assert_eq!(
            (p.id.as_str(), o.map(|o| o.scan_level)),
            ("dns-records", Some(Some(2)))
        );
    }

    fn task(id: Uuid) -> crate::domain::Task {
        let t = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        crate::domain::Task {
            id,
            scheduler_id: SchedulerId::Boefje,
            schedule_id: None,
            organisation: "org1".into(),
            priority: 5,
            status: crate::domain::TaskStatus::Queued,
            task_type: "boefje".into(),
            hash: None,
            data: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            created_at: t,
            modified_at: t,
            attempts: 0,
            lease_expires_at: None,
            failure_reason: None,
        }
    }

    #[test]
    fn a_fire_whose_id_is_taken_is_pushed_anew_taken_or_left_waiting_when_unreadable() {
        let fire = Uuid::new_v4();
        let created = task(fire).created_at.naive_utc();
        let (before, after) = (
            created + chrono::Duration::hours(1),
            created - chrono::Duration::hours(1),
        );
        let with = |status| crate::domain::Task {
            status,
            ..task(fire)
        };
        // A run from before the schedule was set again, finished or out: the fire runs anew.
        for status in [TaskStatus::Completed, TaskStatus::Running] {
            assert!(matches!(rearm(Ok(with(status)), before), Rearm::Again));
        }
        // Waiting still, or made after the schedule was set: this fire's own task.
        assert!(matches!(
            rearm(Ok(with(TaskStatus::Queued)), before),
            Rearm::Taken
        ));
        assert!(matches!(
            rearm(Ok(with(TaskStatus::Completed)), after),
            Rearm::Taken
        ));
        // Unreadable: the fire waits with its deadline kept, rather than being taken as done
        // (a one-off recipe would lose its deadline for good).
        let Rearm::Wait(e) = rearm(
            Err(QueueError::Unavailable("pool timed out".into())),
            before,
        ) else {
            panic!("an unreadable task must leave the fire waiting");
        };
        let next = Some(before + chrono::Duration::days(1));
        let (fate, then) = pushed(fire, Err(e), next);
        assert_eq!(
            (fate.outcome(), fate.reason(), then),
            (
                FireOutcome::Waiting,
                Some(FireReason::QueueUnavailable),
                Then::Keep
            )
        );
    }

    #[test]
    fn a_push_result_maps_to_the_fate_the_ledger_records() {
        let (fire, other) = (Uuid::new_v4(), Uuid::new_v4());
        let next = chrono::DateTime::from_timestamp(1_700_003_600, 0).map(|t| t.naive_utc());
        let ok = |id, created| {
            Ok(PushOutcome {
                task: task(id),
                created,
            })
        };
        let skipped = |reason, existing| Fate::Skipped {
            reason,
            task: Some(existing),
            detail: None,
        };
        assert_eq!(
            pushed(fire, ok(fire, true), next),
            (Fate::Fired { task: fire }, Then::Advance(next))
        );
        // The same fire met again after a restart lost the schedule's update: it did fire.
        assert_eq!(
            pushed(fire, Err(QueueError::Duplicate { existing: fire }), next),
            (Fate::Fired { task: fire }, Then::Advance(next))
        );
        assert_eq!(
            pushed(fire, Err(QueueError::Duplicate { existing: other }), next),
            (
                skipped(FireReason::DuplicateQueued, other),
                Then::Advance(next)
            )
        );
        assert_eq!(
            pushed(fire, ok(other, false), next),
            (
                skipped(FireReason::DuplicateQueued, other),
                Then::Advance(next)
            )
        );
        assert_eq!(
            pushed(fire, Err(QueueError::InFlight { existing: other }), next),
            (
                Fate::Waiting {
                    reason: FireReason::StillRunning,
                    task: Some(other),
                    detail: None
                },
                Then::Keep
            )
        );
        for (e, reason) in [
            (
                QueueError::QueueFull(SchedulerId::Boefje),
                FireReason::QueueFull,
            ),
            (QueueError::Busy, FireReason::QueueUnavailable),
            (
                QueueError::Unavailable("down".into()),
                FireReason::QueueUnavailable,
            ),
            (
                QueueError::Moving(SchedulerId::Boefje),
                FireReason::QueueUnavailable,
            ),
        ] {
            let (fate, then) = pushed(fire, Err(e), next);
            assert_eq!(
                (fate.outcome(), fate.reason(), then),
                (FireOutcome::Waiting, Some(reason), Then::Keep)
            );
        }
        let (fate, then) = pushed(fire, Err(QueueError::Malformed("no boefje".into())), next);
        assert_eq!(fate.reason(), Some(FireReason::TaskRefused));
        assert!(matches!(then, Then::Disable(why) if why.contains("no boefje")));
    }

    #[test]
    fn a_settlement_records_every_fire_and_counts_as_the_log_line_does() {
        let at = |secs: i64| {
            chrono::DateTime::from_timestamp(1_700_000_000 + secs, 0)
                .unwrap()
                .naive_utc()
        };
        let due = |id: &str, secs| Due {
            schedule_id: id.into(),
            scheduler_id: "boefje".into(),
            organisation: "org1".into(),
            due_at: at(secs),
            read: at(-secs),
        };
        let fire = Uuid::new_v4();
        let period = Duration::from_secs(1);
        let mut s = Settlement::default();
        let now = at(3600);
        s.decide(
            due("a", 3600),
            Fate::Fired { task: fire },
            Then::Advance(None),
            true,
            now,
            period,
        );
        // Pushed before a restart: fired in the ledger, not a new task in the log line.
        s.decide(
            due("b", 0),
            Fate::Fired { task: fire },
            Then::Advance(None),
            false,
            now,
            period,
        );
        s.decide(
            due("c", 3599),
            Fate::Waiting {
                reason: FireReason::OctopoesUnavailable,
                task: None,
                detail: None,
            },
            Then::Keep,
            false,
            now,
            period,
        );
        s.decide(
            due("d", 3000),
            Fate::Skipped {
                reason: FireReason::ObjectGone,
                task: None,
                detail: Some("object x is gone".into()),
            },
            Then::Disable("object x is gone".into()),
            false,
            now,
            period,
        );
        let c = &s.counts;
        assert_eq!((c.fired, c.skipped, c.waiting), (1, 1, 1));
        assert_eq!(
            s.disable,
            vec![Disable {
                id: "d".into(),
                reason: "object x is gone".into(),
                read: at(-3000)
            }]
        );
        let advance = |id: &str, from| Advance {
            id: id.into(),
            from,
            to: None,
        };
        assert_eq!(s.advance, vec![advance("a", at(3600)), advance("b", at(0))]);
        let rows: Vec<(&str, &str, Option<&str>, i64, bool)> = s
            .fires
            .iter()
            .map(|r| {
                (
                    r.schedule_id.as_str(),
                    r.outcome.as_str(),
                    r.reason.as_deref(),
                    r.late_seconds,
                    r.late,
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                ("a", "fired", None, 0, false),
                ("b", "fired", None, 3600, true),
                ("c", "waiting", Some("octopoes_unavailable"), 1, false),
                ("d", "skipped", Some("object_gone"), 600, true),
            ]
        );
        assert_eq!(
            s.decided,
            vec![
                ("a".to_owned(), None, false),
                ("b".to_owned(), None, true),
                ("d".to_owned(), Some(FireReason::ObjectGone), true)
            ],
            "a waiting fire is counted once decided"
        );
    }
}
