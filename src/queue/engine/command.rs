//! What callers ask of an engine, each request with a reply channel of its own answer type, and
//! the batch an engine forms from them.

use std::time::Instant;

use tokio::sync::oneshot;
use uuid::Uuid;

use crate::domain::SchedulerId;
use crate::domain::Task;
use crate::domain::filter::FilterNode;
use crate::domain::filter::plan::{Plan, plan};
use crate::queue::push::NewTask;
use crate::queue::types::{ExpiryReport, PushOutcome, QueueError, TaskPatch, Wait};

/// Where an answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, QueueError>>;

/// The answer to a push: one result per task pushed, in order.
pub(crate) type PushResults = Vec<Result<PushOutcome, QueueError>>;

/// A request to an engine.
pub(crate) enum Command {
    /// Store tasks (or boost or re-queue existing ones), all in one transaction: a task and its
    /// de-duplication siblings become visible to pops together.
    Push(Request<Vec<NewTask>, PushResults>),
    /// Hand out the best tasks, optionally matching a filter.
    Pop(Request<PopRequest, Vec<Task>>),
    /// Change a task's status or priority.
    Patch(Request<PatchRequest, Task>),
    /// The watchdog: re-queue or fail these tasks if their lease has ended.
    Expire(Request<Vec<Uuid>, ExpiryReport>),
    /// The watchdog: up to this many tasks whose lease has ended, longest ended first
    /// (answered from memory, no transaction).
    EndedLeases(Request<usize, Vec<Uuid>>),
    /// An object was deleted: cancel its organisation's waiting tasks for it.
    Cancel(Request<CancelObject, Vec<Uuid>>),
    /// Give waiting tasks new priorities and explanations (an event changed what their
    /// strategy reads), in one transaction; answers how many were still waiting.
    Rescore(Request<Vec<Rescored>, usize>),
    /// Where a queued task stands and what holds it back (answered from memory, no
    /// transaction); `None` if it is not in the heap.
    Explain(Request<Uuid, Option<Wait>>),
    /// Move the best pending tasks into the heap, as far as it has room (a refill runs with
    /// every batch; this one runs when nothing else comes); answers how many moved.
    Refill(Request<(), usize>),
    /// Ownership changed: take the scheduler over (rebuild) or drop it, now rather than at the
    /// next request.
    Wake,
    /// Stop after the commands already queued.
    Shutdown,
}

/// One request and where its answer goes.
pub(crate) struct Request<R, T> {
    pub body: R,
    pub reply: Reply<T>,
    /// When the caller sent it; a command that waited past the engine's deadline is shed.
    pub sent: Instant,
}

impl<R, T> Request<R, T> {
    pub fn new(body: R, reply: Reply<T>) -> Self {
        Self {
            body,
            reply,
            sent: Instant::now(),
        }
    }

    /// Sends the answer; false if the caller is gone.
    pub fn answer(self, result: Result<T, QueueError>) -> bool {
        self.reply.send(result).is_ok()
    }
}

/// A pop's parameters.
pub(crate) struct PopRequest {
    pub limit: usize,
    /// The filter as the client sent it, remembered to explain waits by the runners' filters.
    pub source: Option<serde_json::Value>,
    /// The filter and its plan for the scheduler, made by the caller so the engine's thread does
    /// not spend its time on it.
    pub filter: Option<(FilterNode, Plan)>,
}

impl PopRequest {
    /// A pop on `scheduler`, planning its filter.
    pub fn new(scheduler: SchedulerId, limit: usize, filter: Option<FilterNode>) -> Self {
        Self {
            limit,
            source: None,
            filter: filter.map(|f| {
                let p = plan(&f, scheduler);
                (f, p)
            }),
        }
    }
}

/// Which waiting tasks to cancel: those of `organisation` whose `data.input_ooi` is
/// `reference`, and with `plugins` only those of these boefjes (`data.boefje.id`).
pub(crate) struct CancelObject {
    pub organisation: String,
    pub reference: String,
    pub plugins: Option<Vec<String>>,
}

/// A task's new priority and the explanation (JSON) that goes with it, given while it had
/// priority `was`.
pub(crate) struct Rescored {
    pub id: Uuid,
    pub was: i64,
    pub priority: i64,
    pub explanation: String,
}

/// A patch's parameters.
pub(crate) struct PatchRequest {
    pub id: Uuid,
    pub patch: TaskPatch,
}

/// The commands an engine applies in one transaction, by kind, in arrival order within each.
#[derive(Default)]
pub(crate) struct Batch {
    pub pushes: Vec<Request<Vec<NewTask>, PushResults>>,
    pub pops: Vec<Request<PopRequest, Vec<Task>>>,
    pub patches: Vec<Request<PatchRequest, Task>>,
    pub expiries: Vec<Request<Vec<Uuid>, ExpiryReport>>,
    pub cancels: Vec<Request<CancelObject, Vec<Uuid>>>,
    pub rescores: Vec<Request<Vec<Rescored>, usize>>,
    pub refills: Vec<Request<(), usize>>,
    pub explains: Vec<Request<Uuid, Option<Wait>>>,
    pub ended_leases: Vec<Request<usize, Vec<Uuid>>>,
}

impl Batch {
    /// Adds a command (not `Shutdown`).
    pub fn add(&mut self, cmd: Command) {
        match cmd {
            Command::Push(r) => self.pushes.push(r),
            Command::Pop(r) => self.pops.push(r),
            Command::Patch(r) => self.patches.push(r),
            Command::Expire(r) => self.expiries.push(r),
            Command::Cancel(r) => self.cancels.push(r),
            Command::Rescore(r) => self.rescores.push(r),
            Command::Refill(r) => self.refills.push(r),
            Command::Explain(r) => self.explains.push(r),
            Command::EndedLeases(r) => self.ended_leases.push(r),
            Command::Wake | Command::Shutdown => {}
        }
    }

    /// How much work it holds: a command each, a push of several tasks one per task.
    pub fn len(&self) -> usize {
        // A push of several tasks counts each.
        let pushed: usize = self.pushes.iter().map(|r| r.body.len().max(1)).sum();
        self.commands() - self.pushes.len() + pushed
    }

    /// Commands (a push of several tasks is one): what [`Batch::into_singles`] splits into.
    pub fn commands(&self) -> usize {
        self.pushes.len()
            + self.pops.len()
            + self.patches.len()
            + self.expiries.len()
            + self.cancels.len()
            + self.rescores.len()
            + self.refills.len()
            + self.explains.len()
            + self.ended_leases.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One batch per command, to retry them apart after the batch failed.
    pub fn into_singles(self) -> Vec<Batch> {
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.pushes.into_iter().map(|r| Batch {
            pushes: vec![r],
            ..Default::default()
        }));
        out.extend(self.patches.into_iter().map(|r| Batch {
            patches: vec![r],
            ..Default::default()
        }));
        out.extend(self.expiries.into_iter().map(|r| Batch {
            expiries: vec![r],
            ..Default::default()
        }));
        out.extend(self.cancels.into_iter().map(|r| Batch {
            cancels: vec![r],
            ..Default::default()
        }));
        out.extend(self.pops.into_iter().map(|r| Batch {
            pops: vec![r],
            ..Default::default()
        }));
        out.extend(self.rescores.into_iter().map(|r| Batch {
            rescores: vec![r],
            ..Default::default()
        }));
        out.extend(self.refills.into_iter().map(|r| Batch {
            refills: vec![r],
            ..Default::default()
        }));
        out.extend(self.explains.into_iter().map(|r| Batch {
            explains: vec![r],
            ..Default::default()
        }));
        out.extend(self.ended_leases.into_iter().map(|r| Batch {
            ended_leases: vec![r],
            ..Default::default()
        }));
        out
    }

    /// Answers every command with `err`.
    pub fn fail(self, err: &QueueError) {
        for r in self.pushes {
            r.answer(Err(err.duplicate()));
        }
        for r in self.pops {
            r.answer(Err(err.duplicate()));
        }
        for r in self.patches {
            r.answer(Err(err.duplicate()));
        }
        for r in self.expiries {
            r.answer(Err(err.duplicate()));
        }
        for r in self.cancels {
            r.answer(Err(err.duplicate()));
        }
        for r in self.rescores {
            r.answer(Err(err.duplicate()));
        }
        for r in self.refills {
            r.answer(Err(err.duplicate()));
        }
        for r in self.explains {
            r.answer(Err(err.duplicate()));
        }
        for r in self.ended_leases {
            r.answer(Err(err.duplicate()));
        }
    }

    /// Takes out, unanswered, the pops whose caller has gone: nothing is done for them. Returns
    /// how many.
    pub fn drop_abandoned_pops(&mut self) -> usize {
        let before = self.pops.len();
        self.pops.retain(|r| !r.reply.is_closed());
        before - self.pops.len()
    }

    /// Answers `Busy` to the commands that waited longer than `deadline` (the caller has likely
    /// given up; doing the work would only delay the others). Returns how many.
    pub fn shed_older_than(&mut self, deadline: std::time::Duration) -> usize {
        let now = Instant::now();
        let old = |sent: Instant| now.duration_since(sent) > deadline;
        let mut shed = 0;
        macro_rules! shed {
            ($list:expr) => {{
                let (late, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut $list)
                    .into_iter()
                    .partition(|r| old(r.sent));
                $list = keep;
                shed += late.len();
                for r in late {
                    r.answer(Err(QueueError::Busy));
                }
            }};
        }
        shed!(self.pushes);
        shed!(self.pops);
        shed!(self.patches);
        shed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Answer = oneshot::Receiver<Result<Vec<Task>, QueueError>>;

    fn pop() -> (Request<PopRequest, Vec<Task>>, Answer) {
        let (tx, rx) = oneshot::channel();
        (
            Request::new(
                PopRequest {
                    limit: 1,
                    source: None,
                    filter: None,
                },
                tx,
            ),
            rx,
        )
    }

    #[test]
    fn a_pop_whose_caller_is_gone_is_dropped_before_any_work() {
        let mut batch = Batch::default();
        let (gone, rx) = pop();
        drop(rx);
        let (waiting, _rx) = pop();
        batch.add(Command::Pop(gone));
        batch.add(Command::Pop(waiting));
        assert_eq!(batch.drop_abandoned_pops(), 1);
        assert_eq!(batch.len(), 1);
    }

    #[test]
    fn a_command_that_waited_too_long_is_answered_busy_unapplied() {
        let mut batch = Batch::default();
        let (mut old, mut old_rx) = pop();
        old.sent = Instant::now() - Duration::from_secs(30);
        let (fresh, mut fresh_rx) = pop();
        batch.add(Command::Pop(old));
        batch.add(Command::Pop(fresh));
        assert_eq!(batch.shed_older_than(Duration::from_secs(20)), 1);
        assert_eq!(batch.len(), 1);
        assert!(matches!(old_rx.try_recv(), Ok(Err(QueueError::Busy))));
        assert!(fresh_rx.try_recv().is_err(), "not answered yet");
    }
}
