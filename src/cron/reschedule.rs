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
//! **No concurrent invocation.** A fire whose previous task (same hash) still waits or runs is
//! skipped, and the deadline moves on: the schedule is not re-examined every tick until then.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::Tick;
use super::table::{CronError, Entry, Fut, Outcome};
use crate::clients::catalogue::Catalogue;
use crate::domain::SchedulerId;
use crate::domain::plugin::{Plugin, PluginType};
use crate::domain::schedule::Cadence;
use crate::frontier::lookup::{Known, ObjectLookup};
use crate::planner::rules::boefje_data;
use crate::queue::{Broker, PushRequest, QueueError};
use crate::schedules::Schedules;
use crate::scoring::{ScoreInput, Scorer};
use crate::storage::frontier::FrontierRow;
use crate::storage::schedules::ScheduleRow;

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
}

/// What becomes of one due schedule.
enum Decision {
    /// Push this task; then the next deadline.
    Fire {
        id: String,
        request: Box<PushRequest>,
        next: Option<NaiveDateTime>,
    },
    /// Disable it, saying why.
    Disable { id: String, reason: String },
    /// Leave it for the next tick (the catalogue cannot answer now).
    Wait,
    /// Not now (its strategy says the work ran too recently): only the next deadline.
    Later {
        id: String,
        next: Option<NaiveDateTime>,
    },
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

/// What a due boefje schedule becomes, from what is known of its plugin and object: the rule
/// alone, apart from the reads that feed it.
#[derive(Debug, PartialEq)]
enum Verdict<'a> {
    /// Disable it, saying why: its plugin is gone or disabled, its object gone (a frontier row
    /// marked gone, or Octopoes' own "not found"), or no longer permitted.
    Disable(String),
    /// Nothing can say yet whether its object exists: neither fire nor disable.
    Wait,
    /// Fire it with this plugin, on this object (`None`: a schedule without an object).
    Fire(&'a Plugin, Option<&'a FrontierRow>),
}

fn verdict<'a>(
    boefje: &str,
    plugin: Option<&'a Plugin>,
    reference: Option<&str>,
    known: Option<&'a Known>,
) -> Verdict<'a> {
    let p = match plugin {
        None => return Verdict::Disable(format!("plugin {boefje} is gone from the catalogue")),
        Some(p) if !p.enabled => return Verdict::Disable(format!("plugin {boefje} is disabled")),
        Some(p) => p,
    };
    let Some(reference) = reference else {
        return Verdict::Fire(p, None);
    };
    match known {
        Some(Known::Gone) => Verdict::Disable(format!("object {reference} is gone")),
        Some(Known::Present(o)) => match p.permits(&o.object_type, o.scan_level) {
            Ok(()) => Verdict::Fire(p, Some(o)),
            Err(why) => Verdict::Disable(why),
        },
        Some(Known::Unavailable | Known::Unverifiable) | None => Verdict::Wait,
    }
}

/// The boefje a schedule's data names (`data.boefje.id`).
fn boefje_id(data: &Map<String, Value>) -> &str {
    data.get("boefje")
        .and_then(|b| b.get("id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
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
            return rows.iter().map(|_| Decision::Wait).collect();
        }
        for (org, idx) in by_org {
            let plugins = match self.catalogue.plugins(org).await {
                Ok(p) => p,
                Err(_) => {
                    for i in idx {
                        out[i] = Some(Decision::Wait);
                    }
                    continue;
                }
            };
            let data: Vec<Map<String, Value>> = idx
                .iter()
                .map(|&i| serde_json::from_str(&rows[i].data).unwrap_or_default())
                .collect();
            // Only the objects of schedules that may fire are looked up (Octopoes calls are
            // bounded per tick; a schedule whose plugin is gone is disabled without one).
            let refs: Vec<String> = data
                .iter()
                .filter(|d| plugin_of(&plugins, d).is_some_and(|p| p.enabled))
                .filter_map(|d| {
                    d.get("input_ooi")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .collect();
            let hashes: Vec<String> = idx.iter().filter_map(|&i| rows[i].hash.clone()).collect();
            let history = if self.scorer.needs_history(SchedulerId::Boefje) {
                self.broker.last_runs(hashes).await.unwrap_or_default()
            } else {
                HashMap::new()
            };
            let objects: HashMap<String, Known> =
                match self.lookup.objects(org, &refs, budget).await {
                    Ok(known) => known,
                    Err(_) => {
                        for i in idx {
                            out[i] = Some(Decision::Wait);
                        }
                        continue;
                    }
                };
            for (&i, d) in idx.iter().zip(data) {
                let row = &rows[i];
                let disable = |reason: String| Decision::Disable {
                    id: row.id.clone(),
                    reason,
                };
                let boefje = boefje_id(&d);
                let plugin = plugin_of(&plugins, &d);
                let reference = d.get("input_ooi").and_then(Value::as_str);
                let known = reference.and_then(|r| objects.get(r));
                out[i] = Some(match verdict(boefje, plugin, reference, known) {
                    Verdict::Disable(reason) => disable(reason),
                    Verdict::Wait => Decision::Wait,
                    Verdict::Fire(p, object) => {
                        let data = boefje_data(p, reference.unwrap_or_default(), org);
                        let last = row.hash.as_ref().and_then(|h| history.get(h));
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
                        self.fire(row, data, Some(p), &input, tick)
                    }
                });
            }
        }
        out.into_iter()
            .map(|d| d.unwrap_or(Decision::Wait))
            .collect()
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

    fn fire(
        &self,
        row: &ScheduleRow,
        data: Value,
        plugin: Option<&Plugin>,
        input: &ScoreInput,
        tick: &Tick,
    ) -> Decision {
        let Some((priority, why)) = self.scorer.score(tick.component, input) else {
            return Decision::Later {
                id: row.id.clone(),
                next: self.next(row, plugin, tick.at),
            };
        };
        let id = fire_id(&row.id, row.deadline_at);
        let mut data = match data {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        data.insert("id".into(), Value::String(id.hyphenated().to_string()));
        Decision::Fire {
            id: row.id.clone(),
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
        let mut p = Prepared::default();
        for d in decisions {
            match d {
                Decision::Fire { id, request, next } => {
                    p.requests.push(*request);
                    p.fired.push((id, next));
                }
                Decision::Disable { id, reason } => p.disable.push((id, reason)),
                Decision::Wait => p.counts.waiting += 1,
                Decision::Later { id, next } => {
                    p.counts.skipped += 1;
                    p.advance.push((id, next));
                }
            }
        }
        p
    }

    /// Pushes one prepared page's fires at once; answers what the schedules' rows need then.
    async fn push(&self, p: Prepared, tick: &Tick) -> Result<Pushed, CronError> {
        let Prepared {
            requests,
            fired,
            advance,
            disable,
            counts,
        } = p;
        let mut out = Pushed {
            advance,
            disable,
            counts,
        };
        if requests.is_empty() {
            return Ok(out);
        }
        let results = self.broker.push_many(tick.component, requests).await?;
        for ((id, next), r) in fired.into_iter().zip(results) {
            match r {
                Ok(o) if o.created => {
                    out.counts.fired += 1;
                    out.advance.push((id, next));
                }
                // This fire was pushed before a restart, or the work waits or runs still:
                // either way the schedule moves on.
                Ok(_) | Err(QueueError::Duplicate { .. } | QueueError::InFlight { .. }) => {
                    out.counts.skipped += 1;
                    out.advance.push((id, next));
                }
                Err(
                    QueueError::QueueFull(_)
                    | QueueError::Busy
                    | QueueError::Unavailable(_)
                    | QueueError::Internal(_),
                ) => out.counts.waiting += 1,
                Err(e) => out.disable.push((id, format!("its task is refused: {e}"))),
            }
        }
        Ok(out)
    }

    /// After a page's push committed (its tasks with their explanations): its schedules' new
    /// deadlines and disables.
    async fn settle(&self, p: Pushed, tick: &Tick) -> Result<Counts, CronError> {
        let Pushed {
            advance,
            disable,
            mut counts,
        } = p;
        counts.disabled += disable.len();
        for (id, reason) in &disable {
            tracing::info!(schedule.id = %id, reason = %reason, "schedule disabled");
        }
        self.schedules
            .settle(advance, disable, tick.at.naive_utc())
            .await?;
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
    /// Per fire: its schedule and next deadline.
    fired: Vec<(String, Option<NaiveDateTime>)>,
    /// Schedules whose deadline moves without a task.
    advance: Vec<(String, Option<NaiveDateTime>)>,
    /// Schedules to disable, with the reason.
    disable: Vec<(String, String)>,
    /// What was decided without a write (waiting, later).
    counts: Counts,
}

/// A page pushed: what its schedules' rows need.
struct Pushed {
    /// Schedules whose deadline moves.
    advance: Vec<(String, Option<NaiveDateTime>)>,
    /// Schedules to disable, with the reason.
    disable: Vec<(String, String)>,
    counts: Counts,
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
        }
    }

    const REF: Option<&str> = Some("Hostname|internet|a.nl");

    #[test]
    fn only_a_plugin_or_object_known_gone_disables_and_an_unknown_object_waits() {
        let (on, off) = (dns(true), dns(false));
        let present = Known::Present(object(2));
        let too_low = Known::Present(object(1));
        let disabled = |v: Verdict<'_>| match v {
            Verdict::Disable(why) => why,
            other => panic!("{other:?}"),
        };
        assert!(
            disabled(verdict("dns-records", None, REF, Some(&present)))
                .contains("gone from the catalogue")
        );
        assert!(
            disabled(verdict("dns-records", Some(&off), REF, Some(&present)))
                .contains("is disabled")
        );
        assert!(
            disabled(verdict("dns-records", Some(&on), REF, Some(&Known::Gone)))
                .contains("is gone")
        );
        assert!(
            disabled(verdict("dns-records", Some(&on), REF, Some(&too_low))).contains("scan level")
        );
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
        for unknown in [Some(&Known::Unavailable), Some(&Known::Unverifiable), None] {
            assert_eq!(
                verdict("dns-records", Some(&on), REF, unknown),
                Verdict::Wait
            );
        }
    }
}
