//! Routing: where a scheduler's commands go when several instances share the database. Each
//! scheduler is owned by one instance (its heap, its engine); a command for a scheduler owned
//! here goes to the local engine, one owned elsewhere is forwarded to its owner
//! ([`super::forward`]), and one whose owner is changing is answered 503 with `Retry-After`.

use std::sync::Arc;

use super::Broker;
use super::engine::command::Command;
use super::forward::{Answered, Forward, Peers};
use super::types::QueueError;
use crate::domain::SchedulerId;
use crate::ownership::{Ownership, Route};

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
    pub(super) async fn routed<P, T, F>(
        &self,
        s: SchedulerId,
        payload: P,
        here: impl FnOnce(P) -> F,
        there: impl FnOnce(P) -> Forward,
    ) -> Result<T, QueueError>
    where
        F: std::future::Future<Output = Result<T, QueueError>>,
        T: Answered,
    {
        match self.route(s) {
            Route::Local(_) => here(payload).await,
            Route::Moving => Err(QueueError::Moving(s)),
            Route::Remote(address) => match &self.inner.cluster.peers {
                Some(peers) => peers.forward(&address, s, &there(payload)).await,
                None => Err(QueueError::Moving(s)),
            },
        }
    }

    /// Wakes `s`'s engine after its ownership changed, so it rebuilds or drops its heap now.
    pub fn wake(&self, s: SchedulerId) {
        // A full channel means the engine is busy and checks its ownership before the next
        // batch anyway.
        let _ = self.inner.txs[s].try_send(Command::Wake);
    }
}
