//! Tasks, scheduler ids and the task state machine.
//!
//! ```text
//!            refill                 pop                  PATCH running
//!  pending ─────────► queued ─────────────► dispatched ─────────────► running ──┐ PATCH running
//!     ▲   ◄─────────    │  ▲                  │  │                      │  ▲   ◄──┘ (renews the lease)
//!     │     evict       │  └── PATCH queued / re-push ◄──────────────────┘  │
//!     │                 │                     │                           │
//!     └─ push when full │ PATCH cancelled     │ PATCH completed|failed    │ PATCH completed|failed
//!                       ▼                     ▼                           ▼
//!                  cancelled            completed | failed | cancelled (terminal)
//! ```
//!
//! `pending`, `dispatched` and the moves between `pending` and `queued` belong to the broker;
//! clients move a task with `PATCH /tasks/{id}` along the edges [`TaskStatus::check_patch`] allows.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use uuid::Uuid;

/// Pushes with a priority at or below this number are user scans (Rocky pushes priority 1): they
/// may evict automatic work from a full heap.
pub const USER_PRIORITY_MAX: i64 = 1;

/// One of the three schedulers; each has its own heap and only its own workers pop from it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerId {
    /// Scanner plugins run against one object.
    Boefje,
    /// Parsers of the raw files boefjes produce.
    Normalizer,
    /// Report builders, run from report schedules.
    Report,
}

impl SchedulerId {
    /// Every scheduler, in index order.
    pub const ALL: [SchedulerId; 3] = [Self::Boefje, Self::Normalizer, Self::Report];

    /// The id as it appears in paths and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Boefje => "boefje",
            Self::Normalizer => "normalizer",
            Self::Report => "report",
        }
    }

    /// The name mula gives the payload schema of this scheduler's tasks.
    pub fn item_type(self) -> &'static str {
        match self {
            Self::Boefje => "BoefjeTask",
            Self::Normalizer => "NormalizerTask",
            Self::Report => "ReportTask",
        }
    }

    /// A dense index, for per-scheduler arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for SchedulerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SchedulerId {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|id| id.as_str() == s).ok_or(())
    }
}

/// One `T` per scheduler, indexed by [`SchedulerId`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PerScheduler<T>([T; 3]);

impl<T> PerScheduler<T> {
    /// Builds each scheduler's value.
    pub fn from_fn(mut f: impl FnMut(SchedulerId) -> T) -> Self {
        Self(SchedulerId::ALL.map(&mut f))
    }

    /// Each scheduler's value turned into another.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> PerScheduler<U> {
        PerScheduler(self.0.map(&mut f))
    }

    /// Each scheduler with its value, in [`SchedulerId::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (SchedulerId, &T)> {
        SchedulerId::ALL.into_iter().zip(self.0.iter())
    }
}

impl<T> TryFrom<Vec<T>> for PerScheduler<T> {
    type Error = Vec<T>;

    /// One value per scheduler, in [`SchedulerId::ALL`] order.
    fn try_from(v: Vec<T>) -> Result<Self, Vec<T>> {
        <[T; 3]>::try_from(v).map(Self)
    }
}

impl<T> std::ops::Index<SchedulerId> for PerScheduler<T> {
    type Output = T;

    fn index(&self, s: SchedulerId) -> &T {
        &self.0[s as usize]
    }
}

impl<T> std::ops::IndexMut<SchedulerId> for PerScheduler<T> {
    fn index_mut(&mut self, s: SchedulerId) -> &mut T {
        &mut self.0[s as usize]
    }
}

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Stored but waiting outside the heap, because the heap was full.
    Pending,
    /// In the heap, waiting to be popped.
    Queued,
    /// Handed to a worker by a pop.
    Dispatched,
    /// The worker reported it started.
    Running,
    /// Finished successfully.
    Completed,
    /// Finished unsuccessfully.
    Failed,
    /// Withdrawn before it finished.
    Cancelled,
}

/// A status change the state machine does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IllegalTransition {
    /// The task's current status.
    pub from: TaskStatus,
    /// The status asked for.
    pub to: TaskStatus,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a task cannot move from status '{}' to '{}'",
            self.from, self.to
        )
    }
}

impl TaskStatus {
    /// Every status.
    pub const ALL: [TaskStatus; 7] = [
        Self::Pending,
        Self::Queued,
        Self::Dispatched,
        Self::Running,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The status as it appears in JSON and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Queued => "queued",
            Self::Dispatched => "dispatched",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the task has finished for good.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Whether the task waits in the queue (in the heap or as pending).
    pub fn is_waiting(self) -> bool {
        matches!(self, Self::Pending | Self::Queued)
    }

    /// Checks a client's `PATCH` from `self` to `to`.
    ///
    /// Allowed, besides staying put (idempotent, and `running → running` renews a lease):
    /// - `dispatched → running | completed | failed | queued | cancelled`: the runtime fails tasks it
    ///   cannot hydrate, completes or re-queues de-duplicated siblings, gives back what it did not run;
    /// - `running → completed | failed | queued | cancelled`;
    /// - `queued | pending → cancelled | failed`: an operator withdraws waiting work.
    ///
    /// Everything else is refused, notably leaving a terminal status (a failed job later marked
    /// completed) and moving to `pending` or `dispatched`, which only the broker does.
    pub fn check_patch(self, to: TaskStatus) -> Result<(), IllegalTransition> {
        use TaskStatus::*;
        let allowed = self == to
            || matches!(
                (self, to),
                (
                    Dispatched,
                    Running | Completed | Failed | Queued | Cancelled
                ) | (Running, Completed | Failed | Queued | Cancelled)
                    | (Queued | Pending, Cancelled | Failed)
            );
        if allowed {
            Ok(())
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    /// [`Self::check_patch`] for a task the broker took back from a holder whose lease expired
    /// (re-queued, or failed with its attempts used up). Its holder may still report: a late
    /// `running` or a late result is accepted, since the work did start or finish, so a waiting
    /// task may also move to `running` or `completed`, and a failed one to `running` or
    /// `completed`. Running it again, or refusing the result it produced, helps nobody.
    pub fn check_late_patch(self, to: TaskStatus) -> Result<(), IllegalTransition> {
        use TaskStatus::*;
        let late = matches!(
            (self, to),
            (Queued | Pending, Running | Completed) | (Failed, Running | Completed)
        );
        if late { Ok(()) } else { self.check_patch(to) }
    }
}

/// Where the broker puts a waiting task: in its scheduler's heap (`queued`) or, when the heap is
/// full, in the backlog outside it (`pending`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the heap.
    Heap,
    /// Outside the full heap.
    Backlog,
}

impl TaskStatus {
    /// The status of a new task placed at `p`.
    pub fn new_task(p: Placement) -> TaskStatus {
        match p {
            Placement::Heap => Self::Queued,
            Placement::Backlog => Self::Pending,
        }
    }

    /// The broker (re-)places a task: a worker gives it back (re-push, `PATCH queued`), a pop's
    /// answer was not delivered, a better task evicts it from the full heap, room or a boost
    /// lets it into the heap.
    pub fn enqueue(self, p: Placement) -> Result<TaskStatus, IllegalTransition> {
        let to = Self::new_task(p);
        match self {
            Self::Dispatched | Self::Running | Self::Queued | Self::Pending => Ok(to),
            from => Err(IllegalTransition { from, to }),
        }
    }

    /// A pop hands the task to a worker.
    pub fn dispatch(self) -> Result<TaskStatus, IllegalTransition> {
        match self {
            Self::Queued | Self::Pending => Ok(Self::Dispatched),
            from => Err(IllegalTransition {
                from,
                to: Self::Dispatched,
            }),
        }
    }

    /// The task's lease ended: it waits again at `p`, or fails once its attempts are used up.
    pub fn expire(self, exhausted: bool, p: Placement) -> Result<TaskStatus, IllegalTransition> {
        let to = if exhausted {
            Self::Failed
        } else {
            Self::new_task(p)
        };
        match self {
            Self::Dispatched | Self::Running => Ok(to),
            from => Err(IllegalTransition { from, to }),
        }
    }
}

impl TryFrom<String> for TaskStatus {
    type Error = UnknownStatus;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse().map_err(|()| UnknownStatus(s))
    }
}

/// A status name that is not one of [`TaskStatus::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task status '{0}'")]
pub struct UnknownStatus(pub String);

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskStatus {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or(())
    }
}

/// A stored task, in the JSON shape mula's clients expect (every key always present).
///
/// It is also the wire format: serialising the domain type directly keeps the hot pop path free of
/// a copy into a separate DTO; `data` stays the raw JSON text it was stored as.
// Deserialize: an instance reads the owner's answer to a forwarded request back into a Task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Task {
    /// The task id; equal to `data.id`.
    pub id: Uuid,
    /// The scheduler the task belongs to.
    pub scheduler_id: SchedulerId,
    /// The schedule that produced the task, if any.
    pub schedule_id: Option<Uuid>,
    /// The organisation the task runs for.
    pub organisation: String,
    /// Lower is more urgent.
    pub priority: i64,
    /// Where the task is in its life.
    pub status: TaskStatus,
    /// The task type (equal to the scheduler id).
    #[serde(rename = "type")]
    pub task_type: String,
    /// De-duplication key: MurmurHash3 of the payload's identity.
    pub hash: Option<String>,
    /// The payload for the worker (BoefjeTask, NormalizerTask or ReportTask).
    #[schema(value_type = Object)]
    pub data: Box<RawValue>,
    /// When the task was created.
    pub created_at: DateTime<Utc>,
    /// When the task last changed.
    pub modified_at: DateTime<Utc>,
    /// How many times a lease on this task expired (the watchdog re-queued or failed it).
    pub attempts: i32,
    /// When the current lease ends (`dispatched` and `running` tasks); a task that is neither
    /// running nor finished by then goes back to the queue.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Why the broker re-queued or failed the task, if it did.
    pub failure_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::TaskStatus::{self, *};

    #[test]
    fn transitions_the_real_clients_use_are_allowed() {
        for (from, to) in [
            (Dispatched, Running),
            (Running, Completed),
            (Running, Failed),
            (Dispatched, Failed),
            (Dispatched, Completed),
            (Dispatched, Queued),
            (Running, Running),
            (Queued, Cancelled),
        ] {
            assert!(from.check_patch(to).is_ok(), "{from} -> {to}");
        }
    }

    #[test]
    fn a_task_taken_back_for_an_expired_lease_takes_its_holders_late_word() {
        for from in [Queued, Pending, Failed] {
            for to in [Running, Completed] {
                assert_eq!(from.check_late_patch(to), Ok(()), "{from} -> {to}");
                assert!(from.check_patch(to).is_err(), "{from} -> {to} only late");
            }
        }
        assert_eq!(Queued.check_late_patch(Failed), Ok(()));
        // Nothing else opens: a completed or cancelled task stays so, only the broker dispatches.
        assert!(Completed.check_late_patch(Running).is_err());
        assert!(Cancelled.check_late_patch(Completed).is_err());
        assert!(Failed.check_late_patch(Queued).is_err());
        assert!(Queued.check_late_patch(Dispatched).is_err());
    }

    #[test]
    fn terminal_statuses_cannot_be_left() {
        for from in [Completed, Failed, Cancelled] {
            for to in TaskStatus::ALL {
                assert_eq!(from.check_patch(to).is_ok(), from == to, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn only_the_broker_moves_tasks_to_pending_or_dispatched() {
        for from in [Queued, Running] {
            assert!(from.check_patch(Pending).is_err());
            assert!(from.check_patch(Dispatched).is_err());
        }
    }

    #[test]
    fn an_illegal_transition_names_both_states() {
        let err = Completed.check_patch(Running).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a task cannot move from status 'completed' to 'running'"
        );
    }

    #[test]
    fn the_broker_moves_only_along_its_own_edges() {
        use super::Placement::*;
        assert_eq!(Queued.dispatch(), Ok(Dispatched));
        assert_eq!(Pending.dispatch(), Ok(Dispatched));
        assert!(Running.dispatch().is_err());
        assert_eq!(Queued.enqueue(Backlog), Ok(Pending), "evicted");
        assert_eq!(Dispatched.enqueue(Heap), Ok(Queued), "given back");
        assert!(Completed.enqueue(Heap).is_err());
        assert_eq!(Running.expire(true, Heap), Ok(Failed));
        assert_eq!(Dispatched.expire(false, Backlog), Ok(Pending));
        assert!(Queued.expire(false, Heap).is_err());
    }

    #[test]
    fn statuses_parse_case_insensitively() {
        assert_eq!("QUEUED".parse::<TaskStatus>(), Ok(Queued));
        assert!("queud".parse::<TaskStatus>().is_err());
    }
}
