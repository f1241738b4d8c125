//! Routing: where a scheduler's commands go when several instances share the database. Each
//! scheduler is owned by one instance (its heap, its engine); a command for a scheduler owned
//! here goes to the local engine, one owned elsewhere is forwarded to its owner
//! ([`super::forward`]), and one whose owner is changing waits for the new owner, a few seconds
//! at most, before it is answered 503 with `Retry-After`.

use std::sync::Arc;

use super::Broker;
use super::engine::command::Command;
use super::forward::{Answered, Forward, Peers};
use super::types::QueueError;
use crate::domain::SchedulerId;
use crate::ownership::{Ownership, Route};

/// How soon a command waiting for a scheduler's new owner looks again first; the pause doubles
/// to [`SETTLE_POLL_MAX`].
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(25);
/// Longest pause between two looks for a scheduler's new owner.
const SETTLE_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(200);
/// Shortest wait for a scheduler's new owner, whatever the lease.
const MIN_SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// Longest a command waits for a scheduler's new owner (a long `cluster.lease_ms` is not
/// waited out whole; the client is answered 503 with `Retry-After`).
const MAX_SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How the queue works with other instances on the same database.
#[derive(Clone, Default)]
pub struct Cluster {
    /// Who owns which scheduler; `None` when this instance runs alone (SQLite).
    pub ownership: Option<Arc<Ownership>>,
    /// The client that forwards to owners.
    pub peers: Option<Peers>,
}

impl Broker {
    /// The same queue, for a command another instance forwarded: applied here if this instance
    /// owns the scheduler, else answered 503; never forwarded again.
    pub fn local_only(&self) -> Broker {
        Broker {
            inner: self.inner.clone(),
            local_only: true,
        }
    }

    /// Who owns which scheduler, when several instances share the database.
    pub fn ownership(&self) -> Option<&Arc<Ownership>> {
        self.inner.cluster.ownership.as_ref()
    }

    /// Where `s`'s writes go.
    pub(super) fn route(&self, s: SchedulerId) -> Route {
        match &self.inner.cluster.ownership {
            None => Route::Local(0),
            Some(own) => match own.route(s) {
                Route::Remote(_) if self.local_only => Route::Moving,
                r => r,
            },
        }
    }

    /// Whether `s`'s heap is on this instance.
    pub(super) fn is_local(&self, s: SchedulerId) -> bool {
        matches!(self.route(s), Route::Local(_))
    }

    /// For the owner's own background work (the cron entries): 503 `Moving` elsewhere, where
    /// the owner's own tick does it.
    pub(super) fn owner_only(&self, s: SchedulerId) -> Result<(), QueueError> {
        match self.is_local(s) {
            true => Ok(()),
            false => Err(QueueError::Moving(s)),
        }
    }

    /// Runs a command where `s`'s heap is: `here` on this instance's engine, or the command
    /// `there` makes from the same payload, forwarded to the owner. Requests are counted in the
    /// metrics by the instance that applies them (`here`), so sums over instances count each once.
    ///
    /// While the scheduler changes owner (its owner killed and its lease not yet lapsed, or an
    /// instance taking it over) the command waits for the new owner, up to [`Self::settle_wait`],
    /// rather than being answered 503 at once: OpenKAT's runners never retry a `PATCH`, so a
    /// 503 to one lost a task's `running` or `completed`. A forward the owner did not take (it
    /// could not be reached, or no longer owns the scheduler) was not applied, and is sent again
    /// where the scheduler is then; a forwarded command is never waited for or sent on again
    /// here (its sender waits).
    pub(super) async fn routed<P, T, F>(
        &self,
        s: SchedulerId,
        payload: P,
        here: impl FnOnce(P) -> F,
        there: impl Fn(P) -> Forward,
    ) -> Result<T, QueueError>
    where
        P: Clone,
        F: std::future::Future<Output = Result<T, QueueError>>,
        T: Answered,
    {
        self.routed_within(self.settle_wait(), s, payload, here, there)
            .await
    }

    /// [`Self::routed`], waiting at most `wait` for a scheduler changing owner. Reads (a heap's
    /// counts, a task's place) wait for none: the reader has an answer without the owner (the
    /// table's counts) or needs none.
    pub(super) async fn routed_within<P, T, F>(
        &self,
        wait: std::time::Duration,
        s: SchedulerId,
        payload: P,
        here: impl FnOnce(P) -> F,
        there: impl Fn(P) -> Forward,
    ) -> Result<T, QueueError>
    where
        P: Clone,
        F: std::future::Future<Output = Result<T, QueueError>>,
        T: Answered,
    {
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = SETTLE_POLL;
        loop {
            match self.route(s) {
                Route::Local(_) => return here(payload).await,
                Route::Moving => {}
                Route::Remote(address) => {
                    if let Some(peers) = &self.inner.cluster.peers {
                        match peers.forward(&address, s, &there(payload.clone())).await {
                            Err(QueueError::Moving(_)) => {}
                            answered => return answered,
                        }
                    }
                }
            }
            if self.local_only || tokio::time::Instant::now() >= deadline {
                return Err(QueueError::Moving(s));
            }
            // Doubling: an owner refusing connections is not asked 40 times a second.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(SETTLE_POLL_MAX);
        }
    }

    /// How long a command waits for a scheduler changing owner: twice the lease, within which a
    /// killed owner's lease lapses and another instance takes it (about 4/3 of the lease), and
    /// loads its heap (a second or so for 100,000 tasks: [`MIN_SETTLE_WAIT`] at least).
    fn settle_wait(&self) -> std::time::Duration {
        self.inner
            .cluster
            .ownership
            .as_ref()
            .map_or(std::time::Duration::ZERO, |own| {
                (own.lease() * 2).clamp(MIN_SETTLE_WAIT, MAX_SETTLE_WAIT)
            })
    }

    /// Wakes `s`'s engine after its ownership changed, so it rebuilds or drops its heap now.
    pub fn wake(&self, s: SchedulerId) {
        // A full channel means the engine is busy and checks its ownership before the next
        // batch anyway.
        let _ = self.inner.txs[s].try_send(Command::Wake);
    }
}
