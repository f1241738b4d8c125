//! What a row of mula's becomes in kat-scheduler, or why it is refused. Pure: no IO, no clock
//! (the import's start time comes in as [`TaskRules::now`]).
//!
//! The rules are kat-scheduler's own, as its API applies them to new work, minus what only
//! concerns a client's request: a row keeps its id, its priority, its status and its times.
//!
//! | mula status | becomes | why |
//! |---|---|---|
//! | `PENDING`, `QUEUED` | `pending`, `queued` | waiting work; the heap is rebuilt from the table at start (the excess over its bound goes to `pending`) |
//! | `DISPATCHED`, `RUNNING`, changed within its lease (the dispatch lease; a running one: the unrenewed run lease) | the same, with a fresh lease from the import's time | a runner of mula's may still hold it: its late `PATCH` is accepted; if none comes, the lease ends and the watchdog re-queues it, so the work is neither lost nor run twice while the runner lives |
//! | `DISPATCHED`, `RUNNING`, unchanged for longer than that | `failed`, the reason saying so | mula never takes work back: its runner lost it, and it blocks its work in mula for good; leased again, its old payload would run and withdraw a newer copy of the work. Its schedule plans the work afresh |
//! | `COMPLETED`, `FAILED`, `CANCELLED` | the same | history: "last run", de-duplication and scoring read it |
//!
//! A row of a scheduler per organisation (`boefje-org1`: mula before OpenKAT 1.19, left so by
//! its migrations) belongs to its type's scheduler when it names the row's organisation: its
//! schedules and history are imported there, and its work still waiting or handed out, which
//! mula has not served since, is `cancelled` with the reason.

use std::time::Duration;

use chrono::NaiveDateTime;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::domain::keys::DataKeys;
use crate::domain::limits::Limits;
use crate::domain::payload::{data_id, hash_for};
use crate::domain::schedule::CronExpr;
use crate::domain::{PerScheduler, SchedulerId, TaskStatus};
use crate::storage::mula::{MulaSchedule, MulaTask};
use crate::storage::rows::TaskRow;
use crate::storage::schedules::ScheduleRow;

/// A row that is not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The row's id in mula.
    pub id: String,
    /// The rule it breaks, short and stable (the summary groups by it).
    pub rule: &'static str,
    /// What exactly is wrong.
    pub detail: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

fn refuse(id: &str, rule: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        id: id.to_owned(),
        rule,
        detail: detail.into(),
    }
}

/// A converted row and whether its hash had to be recomputed (mula's differed from the one
/// kat-scheduler derives from the payload, or was missing).
#[derive(Debug, Clone, PartialEq)]
pub struct Converted<R> {
    /// The row to write.
    pub row: R,
    /// mula's hash was not the payload's.
    pub rehashed: bool,
    /// A task mula held dispatched or running for longer than its lease: written failed.
    pub stalled: bool,
    /// A row of a scheduler per organisation (`boefje-org1`, mula before OpenKAT 1.19), written
    /// under its type's scheduler (its waiting or handed-out work cancelled).
    pub legacy: bool,
}

fn uuid_text(id: &str, what: &str) -> Result<String, String> {
    Uuid::parse_str(id)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| format!("{what} '{id}' is not a UUID"))
}

/// The scheduler a row of mula's belongs to, and whether it named it the way mula did before
/// OpenKAT 1.19: a scheduler per organisation, `<type>-<organisation>`. mula's migration to one
/// scheduler per type added the `organisation` column but left `scheduler_id` as it was, so an
/// upgraded database still holds such rows: schedules whose hash new work is linked to, and the
/// history of the work. Each belongs to its type's scheduler, when the organisation it names is
/// the row's own.
fn scheduler(
    id: &str,
    scheduler_id: &str,
    organisation: &str,
) -> Result<(SchedulerId, bool), Refusal> {
    if let Ok(s) = scheduler_id.parse() {
        return Ok((s, false));
    }
    if let Some((kind, org)) = scheduler_id.split_once('-')
        && let Ok(s) = kind.parse::<SchedulerId>()
    {
        if org == organisation {
            return Ok((s, true));
        }
        return Err(refuse(
            id,
            "unknown scheduler",
            format!(
                "scheduler_id '{scheduler_id}' is {s}'s of organisation '{org}', not of the row's '{organisation}'"
            ),
        ));
    }
    Err(refuse(
        id,
        "unknown scheduler",
        format!(
            "scheduler_id '{scheduler_id}' is none of boefje, normalizer, report (nor one of them for the row's organisation, as mula named them before OpenKAT 1.19)"
        ),
    ))
}

fn payload(id: &str, data: &str, limits: &Limits) -> Result<Map<String, Value>, Refusal> {
    let data: Value = serde_json::from_str(data)
        .map_err(|e| refuse(id, "malformed data", format!("not JSON: {e}")))?;
    let Value::Object(map) = data else {
        return Err(refuse(id, "malformed data", "data is not a JSON object"));
    };
    limits
        .check_object("data", &map)
        .map_err(|e| refuse(id, "malformed data", e.0))?;
    Ok(map)
}

fn organisation(id: &str, organisation: &str, limits: &Limits) -> Result<(), Refusal> {
    if organisation.trim().is_empty() {
        return Err(refuse(id, "organisation", "organisation is empty"));
    }
    limits
        .check_text("organisation", organisation)
        .map_err(|e| refuse(id, "organisation", e.0))
}

fn keys(
    id: &str,
    s: SchedulerId,
    data: &Map<String, Value>,
    limits: &Limits,
) -> Result<DataKeys, Refusal> {
    let keys = DataKeys::of(s, data);
    limits
        .check_keys(&keys)
        .map_err(|e| refuse(id, "malformed data", e.0))?;
    Ok(keys)
}

/// The reason an imported schedule carries for being disabled. mula's rescheduling disables a
/// boefje schedule itself when its plugin is gone or disabled, its object gone or its clearance
/// too low, and the webapp disables report schedules only: so a disabled boefje schedule is
/// taken as mula's doing, and is enabled again when its work is planned again, as the
/// service's own disables are. A report schedule disabled was a user's, and stays so.
pub const DISABLED_IN_MULA: &str = "disabled in mula (its plugin, object or clearance at the time); enabled again when its work is planned again";

fn disabled_by_mula(s: SchedulerId, enabled: bool) -> Option<String> {
    (!enabled && s == SchedulerId::Boefje).then(|| DISABLED_IN_MULA.to_owned())
}

/// A schedule of mula's as kat-scheduler stores it: the same id, data, cron, deadline, times
/// and enabled flag; the hash is the payload's (kat-scheduler's de-duplication key).
pub fn schedule(m: MulaSchedule, limits: &Limits) -> Result<Converted<ScheduleRow>, Refusal> {
    let raw_id = m.id.clone();
    let id = uuid_text(&m.id, "id").map_err(|e| refuse(&raw_id, "malformed id", e))?;
    let (s, legacy) = scheduler(&raw_id, &m.scheduler_id, &m.organisation)?;
    organisation(&raw_id, &m.organisation, limits)?;
    let data = payload(&raw_id, &m.data, limits)?;
    let hash = hash_for(s, &data).map_err(|e| refuse(&raw_id, "malformed data", e.0))?;
    keys(&raw_id, s, &data, limits)?;
    data_id(&data).map_err(|e| refuse(&raw_id, "malformed data", e.0))?;
    if let Some(cron) = &m.schedule {
        limits
            .check_text("schedule", cron)
            .map_err(|e| refuse(&raw_id, "cron expression", e.0))?;
        CronExpr::parse(cron).map_err(|e| refuse(&raw_id, "cron expression", e.to_string()))?;
    }
    let rehashed = m.hash.as_deref() != Some(hash.as_str());
    Ok(Converted {
        row: ScheduleRow {
            id,
            scheduler_id: s.as_str().to_owned(),
            organisation: m.organisation,
            hash: Some(hash),
            data: Value::Object(data).to_string(),
            enabled: m.enabled,
            schedule: m.schedule,
            deadline_at: m.deadline_at,
            created_at: m.created_at,
            modified_at: m.modified_at,
            disabled_reason: disabled_by_mula(s, m.enabled),
        },
        rehashed,
        stalled: false,
        legacy,
    })
}

/// What converting tasks needs besides the row.
#[derive(Debug, Clone)]
pub struct TaskRules {
    /// Input limits, as the API applies them.
    pub limits: Limits,
    /// Each scheduler's dispatch and run leases.
    pub leases: PerScheduler<(Duration, Duration)>,
    /// The import's start: leases of imported dispatched and running tasks run from here.
    pub now: NaiveDateTime,
}

/// mula's status label (uppercase enum label) as kat-scheduler's status.
pub fn status(label: &str) -> Option<TaskStatus> {
    Some(match label {
        "PENDING" => TaskStatus::Pending,
        "QUEUED" => TaskStatus::Queued,
        "DISPATCHED" => TaskStatus::Dispatched,
        "RUNNING" => TaskStatus::Running,
        "COMPLETED" => TaskStatus::Completed,
        "FAILED" => TaskStatus::Failed,
        "CANCELLED" => TaskStatus::Cancelled,
        _ => return None,
    })
}

/// A task of mula's as kat-scheduler stores it (see the module's table for statuses). The
/// payload's `id` is the task's (kat-scheduler's invariant, mula's too for boefje and
/// normalizer tasks; report payloads get it added, as a push does).
pub fn task(m: MulaTask, rules: &TaskRules) -> Result<Converted<TaskRow>, Refusal> {
    let raw_id = m.id.clone();
    let id = uuid_text(&m.id, "id").map_err(|e| refuse(&raw_id, "malformed id", e))?;
    let (s, legacy) = scheduler(&raw_id, &m.scheduler_id, &m.organisation)?;
    if m.task_type != s.as_str() {
        return Err(refuse(
            &raw_id,
            "type",
            format!(
                "type '{}' is not the scheduler's ('{}')",
                m.task_type,
                s.as_str()
            ),
        ));
    }
    let st = status(&m.status)
        .ok_or_else(|| refuse(&raw_id, "status", format!("unknown status '{}'", m.status)))?;
    let priority = m
        .priority
        .ok_or_else(|| refuse(&raw_id, "priority", "priority is missing"))?;
    organisation(&raw_id, &m.organisation, &rules.limits)?;
    let schedule_id = m
        .schedule_id
        .as_deref()
        .map(|s| uuid_text(s, "schedule_id"))
        .transpose()
        .map_err(|e| refuse(&raw_id, "malformed id", e))?;
    let mut data = payload(&raw_id, &m.data, &rules.limits)?;
    let hash = hash_for(s, &data).map_err(|e| refuse(&raw_id, "malformed data", e.0))?;
    match data_id(&data).map_err(|e| refuse(&raw_id, "malformed data", e.0))? {
        Some(in_data) if in_data.hyphenated().to_string() != id => {
            return Err(refuse(
                &raw_id,
                "data.id",
                format!("data.id '{in_data}' is not the task's id"),
            ));
        }
        _ => {}
    }
    data.insert("id".into(), Value::String(id.clone()));
    let keys = keys(&raw_id, s, &data, &rules.limits)?;
    let (dispatch, run) = rules.leases[s];
    let ttl = match st {
        TaskStatus::Dispatched => Some(dispatch),
        TaskStatus::Running => Some(run),
        _ => None,
    }
    .map(|ttl| chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX));
    // mula never takes work back from a runner: a task its runner lost stays dispatched or
    // running for good, and blocks its work (mula's "hanging tasks"). One held past its lease
    // is such a task; leased again, it would run its old payload once the lease ended and
    // withdraw a newer copy of the same work. It is failed, as mula means to fail a stalled
    // task, and its schedule plans the work afresh.
    let stalled = ttl.is_some_and(|ttl| {
        m.modified_at
            .checked_add_signed(ttl)
            .is_some_and(|end| end <= rules.now)
    });
    let (status, lease, failure_reason) = match ttl {
        // mula has not served a scheduler per organisation since OpenKAT 1.19: work still
        // waiting or handed out under one is from before the upgrade, and nothing ran it since.
        _ if legacy && !st.is_terminal() => (
            TaskStatus::Cancelled,
            None,
            Some(format!(
                "{st} under mula's scheduler '{}', which mula no longer serves (a scheduler per organisation, before OpenKAT 1.19); cancelled by import-mula at {}",
                m.scheduler_id,
                rules.now.and_utc().to_rfc3339()
            )),
        ),
        Some(_) if stalled => (
            TaskStatus::Failed,
            None,
            Some(format!(
                "stalled in mula: {st} since {}, longer than its lease; failed by import-mula at {}",
                m.modified_at.and_utc().to_rfc3339(),
                rules.now.and_utc().to_rfc3339()
            )),
        ),
        Some(ttl) => (
            st,
            Some(
                rules
                    .now
                    .checked_add_signed(ttl)
                    .unwrap_or(NaiveDateTime::MAX),
            ),
            None,
        ),
        None => (st, None, None),
    };
    let rehashed = m.hash.as_deref() != Some(hash.as_str());
    Ok(Converted {
        row: TaskRow {
            id,
            scheduler_id: s.as_str().to_owned(),
            schedule_id,
            organisation: m.organisation,
            task_type: s.as_str().to_owned(),
            hash: Some(hash),
            priority: i64::from(priority),
            data: Value::Object(data).to_string(),
            status,
            attempts: 0,
            lease_expires_at: lease,
            failure_reason,
            created_at: m.created_at,
            modified_at: m.modified_at,
            plugin_id: keys.plugin_id,
            oci_image: keys.oci_image,
            input_ooi: keys.input_ooi,
            deduplication_key: keys.deduplication_key,
        },
        rehashed,
        stalled: stalled && !legacy,
        legacy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    fn rules() -> TaskRules {
        TaskRules {
            limits: Limits::default(),
            leases: PerScheduler::from_fn(|_| (Duration::from_secs(60), Duration::from_secs(600))),
            now: at("2026-01-01 12:00:00"),
        }
    }

    fn boefje_task(status: &str) -> MulaTask {
        let id = "0b8c7f7e-3f5e-4b8a-9d7e-3c1f2a4b5c6d";
        MulaTask {
            id: id.into(),
            scheduler_id: "boefje".into(),
            schedule_id: None,
            organisation: "org1".into(),
            task_type: "boefje".into(),
            hash: Some("74956880324db1838156e1ebf7847448".into()),
            priority: Some(7),
            data: json!({"id": id, "boefje": {"id": "dns-records"},
                "input_ooi": "Hostname|internet|example.com", "organization": "org1"})
            .to_string(),
            status: status.into(),
            created_at: at("2025-12-01 10:00:00"),
            modified_at: at("2025-12-01 10:05:00"),
        }
    }

    #[test]
    fn a_queued_boefje_task_keeps_its_id_priority_hash_and_times() {
        let c = task(boefje_task("QUEUED"), &rules()).unwrap();
        assert!(!c.rehashed);
        let r = c.row;
        assert_eq!(r.status, TaskStatus::Queued);
        assert_eq!(r.priority, 7);
        assert_eq!(r.created_at, at("2025-12-01 10:00:00"));
        assert_eq!(r.lease_expires_at, None);
        assert_eq!(r.plugin_id.as_deref(), Some("dns-records"));
        assert_eq!(
            r.input_ooi.as_deref(),
            Some("Hostname|internet|example.com")
        );
    }

    /// A mula task changed `ago` before the import, in `status`.
    fn held(status: &str, ago: chrono::Duration) -> MulaTask {
        MulaTask {
            modified_at: rules().now - ago,
            ..boefje_task(status)
        }
    }

    #[test]
    fn dispatched_and_running_tasks_within_their_lease_get_one_from_the_import_time() {
        let secs = chrono::Duration::seconds;
        let d = task(held("DISPATCHED", secs(59)), &rules()).unwrap();
        assert!(!d.stalled);
        assert_eq!(d.row.status, TaskStatus::Dispatched);
        assert_eq!(d.row.lease_expires_at, Some(at("2026-01-01 12:01:00")));
        let r = task(held("RUNNING", secs(599)), &rules()).unwrap().row;
        assert_eq!(r.status, TaskStatus::Running);
        assert_eq!(r.lease_expires_at, Some(at("2026-01-01 12:10:00")));
    }

    #[test]
    fn dispatched_and_running_tasks_held_past_their_lease_are_failed_as_stalled() {
        let secs = chrono::Duration::seconds;
        // Each status by its own lease: 60 s dispatched, 600 s running.
        for (status, ago) in [("DISPATCHED", secs(60)), ("RUNNING", secs(600))] {
            let c = task(held(status, ago), &rules()).unwrap();
            assert!(c.stalled, "{status}");
            let r = c.row;
            assert_eq!(r.status, TaskStatus::Failed, "{status}");
            assert_eq!(r.lease_expires_at, None);
            assert_eq!(r.modified_at, rules().now - ago, "mula's last change kept");
            let why = r.failure_reason.unwrap();
            assert!(
                why.contains(&format!("stalled in mula: {}", status.to_lowercase())),
                "{why}"
            );
        }
        let long_ago = task(boefje_task("RUNNING"), &rules()).unwrap();
        assert_eq!(long_ago.row.status, TaskStatus::Failed);
        // A queued task of any age waits.
        let queued = task(boefje_task("QUEUED"), &rules()).unwrap();
        assert!(!queued.stalled);
        assert_eq!(queued.row.status, TaskStatus::Queued);
    }

    #[test]
    fn every_mula_status_label_is_known_and_a_lowercase_one_is_refused() {
        for label in [
            "PENDING",
            "QUEUED",
            "DISPATCHED",
            "RUNNING",
            "COMPLETED",
            "FAILED",
            "CANCELLED",
        ] {
            assert!(status(label).is_some(), "{label}");
        }
        let e = task(boefje_task("queued"), &rules()).unwrap_err();
        assert_eq!(e.rule, "status");
    }

    #[test]
    fn a_report_task_gets_its_id_in_the_payload() {
        let mut m = boefje_task("COMPLETED");
        m.scheduler_id = "report".into();
        m.task_type = "report".into();
        m.data = json!({"report_recipe_id": "r1", "organisation_id": "org1"}).to_string();
        let r = task(m, &rules()).unwrap();
        assert!(r.rehashed, "the boefje hash is not this payload's");
        let data: Value = serde_json::from_str(&r.row.data).unwrap();
        assert_eq!(data["id"], json!(r.row.id));
    }

    #[test]
    fn rows_kat_scheduler_would_refuse_are_refused_with_the_rule_they_break() {
        let mut m = boefje_task("QUEUED");
        m.scheduler_id = "boefje-org2".into();
        let e = task(m.clone(), &rules()).unwrap_err();
        assert_eq!(e.rule, "unknown scheduler");
        assert!(e.detail.contains("organisation 'org2'"), "{}", e.detail);
        m.scheduler_id = "scanner".into();
        assert_eq!(task(m, &rules()).unwrap_err().rule, "unknown scheduler");

        let mut m = boefje_task("QUEUED");
        m.data = json!({"id": m.id, "boefje": {}, "organization": "org1"}).to_string();
        let e = task(m, &rules()).unwrap_err();
        assert_eq!(
            (e.rule, e.detail.as_str()),
            ("malformed data", "data.boefje.id: required")
        );

        let mut m = boefje_task("QUEUED");
        m.data = json!({"id": "11111111-1111-4111-8111-111111111111",
            "boefje": {"id": "x"}, "organization": "org1"})
        .to_string();
        assert_eq!(task(m, &rules()).unwrap_err().rule, "data.id");

        let mut m = boefje_task("QUEUED");
        m.priority = None;
        assert_eq!(task(m, &rules()).unwrap_err().rule, "priority");
    }

    fn schedule_row(cron: Option<&str>) -> MulaSchedule {
        MulaSchedule {
            id: "9f0c2b1e-5d3a-4c7b-8e6f-1a2b3c4d5e6f".into(),
            scheduler_id: "report".into(),
            organisation: "org1".into(),
            hash: None,
            data: json!({"report_recipe_id": "r1", "organisation_id": "org1"}).to_string(),
            enabled: true,
            schedule: cron.map(str::to_owned),
            deadline_at: Some(at("2026-02-01 00:00:00")),
            created_at: at("2025-12-01 10:00:00"),
            modified_at: at("2025-12-01 10:00:00"),
        }
    }

    #[test]
    fn a_schedule_keeps_its_cron_and_deadline_and_gets_the_payload_hash() {
        let c = schedule(schedule_row(Some("0 0 * * *")), &Limits::default()).unwrap();
        assert!(c.rehashed);
        assert_eq!(c.row.schedule.as_deref(), Some("0 0 * * *"));
        assert_eq!(c.row.deadline_at, Some(at("2026-02-01 00:00:00")));
        assert_eq!(
            c.row.hash.as_deref(),
            Some(crate::domain::hash::task_hash("r1-org1").as_str())
        );
        let one_off = schedule(schedule_row(None), &Limits::default()).unwrap();
        assert_eq!(one_off.row.schedule, None);
    }

    #[test]
    fn rows_of_a_scheduler_per_organisation_belong_to_their_types() {
        let legacy = |status: &str| MulaTask {
            scheduler_id: "boefje-org1".into(),
            ..boefje_task(status)
        };
        let done = task(legacy("COMPLETED"), &rules()).unwrap();
        assert!(done.legacy);
        assert_eq!(done.row.scheduler_id, "boefje");
        assert_eq!(done.row.status, TaskStatus::Completed);
        assert_eq!(done.row.failure_reason, None);
        for status in ["QUEUED", "PENDING", "DISPATCHED", "RUNNING"] {
            let c = task(legacy(status), &rules()).unwrap();
            assert!(!c.stalled, "{status}");
            assert_eq!(c.row.status, TaskStatus::Cancelled, "{status}");
            let why = c.row.failure_reason.unwrap();
            assert!(why.contains("mula's scheduler 'boefje-org1'"), "{why}");
        }
        let s = schedule(
            MulaSchedule {
                scheduler_id: "report-org1".into(),
                ..schedule_row(Some("0 0 * * *"))
            },
            &Limits::default(),
        )
        .unwrap();
        assert!(s.legacy);
        assert_eq!(s.row.scheduler_id, "report");
        assert!(s.row.enabled);
    }

    #[test]
    fn a_cron_expression_kat_scheduler_does_not_run_is_refused() {
        let e = schedule(
            schedule_row(Some("0 12 * * MON-FRI 30")),
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(e.rule, "cron expression");
    }
}
