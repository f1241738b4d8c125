//! The fire ledger's terms: what became of one due fire of a schedule (the deadline that came
//! due): fired with its task, skipped for a reason, or waiting for what cannot answer yet; and
//! how late it was decided. Rescheduling decides a fire's [`Fate`], `schedules` keeps it (the
//! `schedule_fires` table), the API shows it as a [`Fire`] (`GET /schedules/{id}/history`).
//!
//! Pure: the times are the caller's.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::SchedulerId;

/// How a schedule's `disabled_reason` begins when its fire's task was refused (its data): the
/// work planned again does not enable such a schedule, as its data would be refused again.
pub const TASK_REFUSED: &str = "its task is refused";

/// What became of a due fire, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FireOutcome {
    /// Its task was pushed.
    Fired,
    /// It did not run and never will: the schedule moved on to its next deadline, or was
    /// disabled.
    Skipped,
    /// Not decided yet: something it needs cannot answer now, so the schedule keeps its
    /// deadline and the fire is decided on a later tick.
    Waiting,
}

impl FireOutcome {
    /// The stored and shown word.
    pub fn as_str(self) -> &'static str {
        match self {
            FireOutcome::Fired => "fired",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Waiting => "waiting",
        }
    }
}

impl std::str::FromStr for FireOutcome {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        [
            FireOutcome::Fired,
            FireOutcome::Skipped,
            FireOutcome::Waiting,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or(())
    }
}

/// Why a fire did not fire (yet), named after what rescheduling decides: the closed set of the
/// ledger's `reason`. [`FireReason::skips`] tells those that end a fire (skipped) from those that
/// make it wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FireReason {
    /// Skipped, the schedule disabled: its plugin is gone from the catalogue.
    PluginGone,
    /// Skipped, the schedule disabled: its plugin is disabled.
    PluginDisabled,
    /// Skipped, the schedule disabled: its object is gone (Octopoes' own "not found").
    ObjectGone,
    /// Skipped, the schedule disabled: its plugin may no longer run on the object (type not
    /// consumed, scan level too low).
    NotPermitted,
    /// Skipped, the schedule disabled: the queue refused its task for what the task is.
    TaskRefused,
    /// Waiting: the previous task of the same work is still dispatched or running (no
    /// concurrent invocation). The fire runs once that task has ended, so a run asked for
    /// meanwhile (a user's "run now", a one-off report's rerun) is neither lost nor run twice at
    /// once, and cron fires that pass while it waits are one run, not a pile.
    StillRunning,
    /// Skipped, the schedule moved on: the same work already waits in the queue.
    DuplicateQueued,
    /// Skipped, the schedule moved on: the scheduler's ranking strategy says the work ran too
    /// recently (inside its grace period).
    WithinGracePeriod,
    /// Waiting: no plugin catalogue is configured, or it cannot answer for the organisation.
    CatalogueUnavailable,
    /// Waiting: the frontier lacks the object and Octopoes cannot answer now (down, erroring,
    /// backing off, or the tick's budget of calls spent).
    OctopoesUnavailable,
    /// Waiting: the frontier lacks the object and no Octopoes is configured to ask.
    ObjectUnverifiable,
    /// Waiting: the frontier could not be read.
    FrontierUnavailable,
    /// Waiting: the scheduler's heap is full and it refuses automatic pushes.
    QueueFull,
    /// Waiting: the queue could not take the task now (busy, its database unavailable, its
    /// owner changing).
    QueueUnavailable,
    /// Skipped: while the fire waited, a client moved the schedule's deadline or disabled it
    /// (`PATCH /schedules/{id}`), so this due time is no longer the schedule's.
    ScheduleChanged,
}

impl FireReason {
    /// Every reason, in label order.
    pub const ALL: [FireReason; 15] = [
        FireReason::PluginGone,
        FireReason::PluginDisabled,
        FireReason::ObjectGone,
        FireReason::NotPermitted,
        FireReason::TaskRefused,
        FireReason::StillRunning,
        FireReason::DuplicateQueued,
        FireReason::WithinGracePeriod,
        FireReason::CatalogueUnavailable,
        FireReason::OctopoesUnavailable,
        FireReason::ObjectUnverifiable,
        FireReason::FrontierUnavailable,
        FireReason::QueueFull,
        FireReason::QueueUnavailable,
        FireReason::ScheduleChanged,
    ];

    /// The stored and shown word.
    pub fn as_str(self) -> &'static str {
        match self {
            FireReason::PluginGone => "plugin_gone",
            FireReason::PluginDisabled => "plugin_disabled",
            FireReason::ObjectGone => "object_gone",
            FireReason::NotPermitted => "not_permitted",
            FireReason::TaskRefused => "task_refused",
            FireReason::StillRunning => "still_running",
            FireReason::DuplicateQueued => "duplicate_queued",
            FireReason::WithinGracePeriod => "within_grace_period",
            FireReason::CatalogueUnavailable => "catalogue_unavailable",
            FireReason::OctopoesUnavailable => "octopoes_unavailable",
            FireReason::ObjectUnverifiable => "object_unverifiable",
            FireReason::FrontierUnavailable => "frontier_unavailable",
            FireReason::QueueFull => "queue_full",
            FireReason::QueueUnavailable => "queue_unavailable",
            FireReason::ScheduleChanged => "schedule_changed",
        }
    }

    /// Whether it ends the fire (skipped); else the fire waits.
    pub fn skips(self) -> bool {
        !matches!(
            self,
            FireReason::StillRunning
                | FireReason::CatalogueUnavailable
                | FireReason::OctopoesUnavailable
                | FireReason::ObjectUnverifiable
                | FireReason::FrontierUnavailable
                | FireReason::QueueFull
                | FireReason::QueueUnavailable
        )
    }
}

impl std::str::FromStr for FireReason {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        FireReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or(())
    }
}

/// What rescheduling decided of one due fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Its task is in the queue (pushed now, or before a restart that lost the schedule's
    /// update: the same fire has the same task id).
    Fired {
        /// The fire's task.
        task: Uuid,
    },
    /// It will not run.
    Skipped {
        /// Why; one of the reasons that [`FireReason::skips`].
        reason: FireReason,
        /// The task in its way, if one is (the same work already waiting).
        task: Option<Uuid>,
        /// The decision in words (a disabled schedule's reason, the queue's refusal).
        detail: Option<String>,
    },
    /// Not decided: the schedule keeps its deadline.
    Waiting {
        /// What it waits for.
        reason: FireReason,
        /// The task it waits for, if one (the previous run, still out).
        task: Option<Uuid>,
        /// The failure in words, where there is one.
        detail: Option<String>,
    },
}

impl Fate {
    /// Its outcome.
    pub fn outcome(&self) -> FireOutcome {
        match self {
            Fate::Fired { .. } => FireOutcome::Fired,
            Fate::Skipped { .. } => FireOutcome::Skipped,
            Fate::Waiting { .. } => FireOutcome::Waiting,
        }
    }

    /// Its reason (none for a fire).
    pub fn reason(&self) -> Option<FireReason> {
        match self {
            Fate::Fired { .. } => None,
            Fate::Skipped { reason, .. } | Fate::Waiting { reason, .. } => Some(*reason),
        }
    }

    /// The task it names: the fire's own, or the one in its way.
    pub fn task(&self) -> Option<Uuid> {
        match self {
            Fate::Fired { task } => Some(*task),
            Fate::Skipped { task, .. } | Fate::Waiting { task, .. } => *task,
        }
    }

    /// The decision in words, if any.
    pub fn detail(&self) -> Option<&str> {
        match self {
            Fate::Fired { .. } => None,
            Fate::Skipped { detail, .. } | Fate::Waiting { detail, .. } => detail.as_deref(),
        }
    }
}

/// How late a fire was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lateness {
    /// Whole seconds from its due time to its decision (0 when decided before it was due).
    pub seconds: i64,
    /// Decided more than one tick period after it was due: a tick that ran on time would have
    /// decided it sooner.
    pub late: bool,
}

impl Lateness {
    /// The lateness of a fire due at `due` and decided at `decided`, ticks coming every
    /// `period`.
    pub fn of(due: DateTime<Utc>, decided: DateTime<Utc>, period: Duration) -> Lateness {
        let by = decided - due;
        let period = chrono::Duration::from_std(period).unwrap_or(chrono::Duration::MAX);
        Lateness {
            seconds: by.num_seconds().max(0),
            late: by > period,
        }
    }
}

/// One due fire of a schedule, as the ledger keeps it and `GET /schedules/{id}/history` shows
/// it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Fire {
    /// The schedule.
    pub schedule_id: Uuid,
    /// Its scheduler.
    pub scheduler_id: SchedulerId,
    /// Its organisation.
    pub organisation: String,
    /// The deadline that came due: which fire this is.
    pub due_at: DateTime<Utc>,
    /// When it was decided (for `waiting`: when it first waited).
    pub decided_at: DateTime<Utc>,
    /// What became of it.
    pub outcome: FireOutcome,
    /// Why it was skipped or waits; for `fired`, why it had waited first, if it did.
    pub reason: Option<FireReason>,
    /// The fire's task (`fired`), or the task in its way (`duplicate_queued`; for `waiting` on
    /// `still_running`, the previous run it waits for).
    pub task_id: Option<Uuid>,
    /// The decision in words (a disabled schedule's reason, a refusal, a failure).
    pub detail: Option<String>,
    /// Whole seconds from `due_at` to `decided_at`.
    pub late_seconds: i64,
    /// Decided more than one cron tick after it was due.
    pub late: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn reasons_read_back_as_written_and_say_whether_they_end_the_fire() {
        for r in FireReason::ALL {
            assert_eq!(r.as_str().parse::<FireReason>(), Ok(r));
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::json!(r.as_str())
            );
        }
        assert!(!FireReason::StillRunning.skips());
        assert!(FireReason::DuplicateQueued.skips());
        assert!(FireReason::ObjectGone.skips());
        assert!(!FireReason::OctopoesUnavailable.skips());
        assert_eq!("late".parse::<FireReason>(), Err(()));
        for o in [
            FireOutcome::Fired,
            FireOutcome::Skipped,
            FireOutcome::Waiting,
        ] {
            assert_eq!(o.as_str().parse::<FireOutcome>(), Ok(o));
        }
    }

    #[test]
    fn a_fire_is_late_when_decided_more_than_a_tick_after_it_was_due() {
        let due = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
        let tick = Duration::from_secs(1);
        let at = |ms: i64| due + chrono::Duration::milliseconds(ms);
        assert_eq!(
            Lateness::of(due, at(900), tick),
            Lateness {
                seconds: 0,
                late: false
            }
        );
        assert_eq!(
            Lateness::of(due, at(1_000), tick),
            Lateness {
                seconds: 1,
                late: false
            },
            "the next tick is on time"
        );
        assert_eq!(
            Lateness::of(due, at(3_600_500), tick),
            Lateness {
                seconds: 3600,
                late: true
            }
        );
        assert_eq!(
            Lateness::of(due, at(-5_000), tick),
            Lateness {
                seconds: 0,
                late: false
            },
            "a decision before the due time (a deadline moved back) is not late"
        );
    }
}
