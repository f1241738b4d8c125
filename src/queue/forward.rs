//! Forwarding: a scheduler's pushes, pops, patches, re-scores and cancellations go to the instance that owns
//! it, so any instance serves any request and clients need no change.
//!
//! One internal route takes them all (`POST /internal/forward/{scheduler_id}`, not in the public
//! API document); the body names the command with the broker's own arguments, and the answer is
//! the owner's `Result` as it is, errors included, so a 409 or a 429 reaches the client as the
//! owner gave it. The owner applies a forwarded command only if it still owns the scheduler
//! (never forwarding it again). An owner that cannot be reached did not apply it: the sender
//! waits for the scheduler's next owner (its lease lapses within seconds and another instance
//! takes over) and sends it there (the broker's routing); one that took the request and
//! did not answer may have applied it, and that is answered 503.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::debug;
use uuid::Uuid;

use super::push::PushRequest;
use super::types::{PushOutcome, QueueError, TaskPatch, Wait};
use crate::domain::{SchedulerId, Task};

/// The internal route a forwarded command goes to.
pub const FORWARD_PATH: &str = "/internal/forward";

/// A command for the owning instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Forward {
    /// [`super::Broker::push_many`]
    Push {
        /// The pushes, in order.
        requests: Vec<PushRequest>,
    },
    /// [`super::Broker::pop`]
    Pop {
        /// Tasks at most.
        limit: usize,
        /// The filter as the client sent it (mula's filter JSON).
        filter: Option<serde_json::Value>,
    },
    /// [`super::Broker::patch`]
    Patch {
        /// The task.
        id: Uuid,
        /// The change.
        patch: TaskPatch,
    },
    /// [`super::Broker::wait`]
    Explain {
        /// The task.
        id: Uuid,
    },
    /// [`super::Broker::rescore`]
    Rescore {
        /// `(task, priority it had, new priority, explanation)`.
        scores: Vec<(Uuid, i64, i64, crate::scoring::Explanation)>,
    },
    /// [`super::Broker::scheduler_view`]: the heap's counts, which only the owner knows (queued
    /// tasks are in its heap and have no queue row to count).
    Counts,
    /// [`super::Broker::cancel_object`] (or [`super::Broker::withdraw`]) on one scheduler
    Cancel {
        /// The organisation.
        organisation: String,
        /// The deleted object (or the object whose clearance was withdrawn).
        reference: String,
        /// Only these boefjes' tasks; absent (as from an instance of an earlier version): all.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plugins: Option<Vec<String>>,
    },
}

/// The owner's answer to a [`Forward`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "answer", content = "value", rename_all = "snake_case")]
pub enum Answer {
    /// To `Push`: one result per request.
    Pushed(Vec<Result<PushOutcome, QueueError>>),
    /// To `Pop`.
    Popped(Vec<Task>),
    /// To `Patch`.
    Patched(Task),
    /// To `Cancel`.
    Cancelled(Vec<Uuid>),
    /// To `Explain`.
    Explained(Option<Wait>),
    /// To `Rescore`: how many were waiting.
    Rescored(usize),
    /// To `Counts`: `(queued, pending)`.
    Counted((u64, u64)),
}

/// Why forwarding could not be set up. (A forwarded command's own failures are
/// [`QueueError`]s, the answer its caller gets.)
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The HTTP client could not be built (its TLS backend did not start); the cause is in the
    /// message, not repeated as `source()`.
    #[error("cannot build the forwarding client: {0}")]
    Client(reqwest::Error),
}

/// Longest wait for a peer to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The client instances forward with.
#[derive(Debug, Clone)]
pub struct Peers {
    client: reqwest::Client,
    /// Sent as a bearer token when the instances require one.
    token: Option<String>,
}

impl Peers {
    /// A client whose calls give up after `timeout`.
    pub fn new(timeout: Duration, token: Option<String>) -> Result<Peers, ForwardError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            // A peer is on the same network: one that does not accept within this is gone (a
            // killed container's address), and the command waits for the scheduler's next owner.
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(crate::clients::http::USER_AGENT)
            .build()
            .map_err(ForwardError::Client)?;
        Ok(Peers { client, token })
    }

    /// Sends `command` for `s` to the owner at `address`; answers what the owner answered.
    pub async fn forward<T: Answered>(
        &self,
        address: &str,
        s: SchedulerId,
        command: &Forward,
    ) -> Result<T, QueueError> {
        let url = format!("{}{FORWARD_PATH}/{s}", address.trim_end_matches('/'));
        let mut request = self.client.post(&url).json(command);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| {
            debug!(scheduler.id = %s, %url, error = %e, "owner unreachable");
            if e.is_connect() {
                // Never reached the owner, so not applied: the caller may send it where the
                // scheduler is once its owner changes.
                QueueError::Moving(s)
            } else {
                // Sent, with no answer: it may have been applied, and is not sent again.
                QueueError::Unavailable(format!(
                    "the instance owning scheduler {s} did not answer a forwarded request: {e}"
                ))
            }
        })?;
        let status = response.status();
        if !status.is_success() {
            let hint = if status == reqwest::StatusCode::UNAUTHORIZED
                || status == reqwest::StatusCode::FORBIDDEN
            {
                " (set cluster.peer_token to a token every instance accepts for all schedulers)"
            } else {
                ""
            };
            return Err(QueueError::Unavailable(format!(
                "the instance owning scheduler {s} refused a forwarded request with {status}{hint}"
            )));
        }
        let answer: Result<Answer, QueueError> = response.json().await.map_err(|e| {
            QueueError::Unavailable(format!(
                "the instance owning scheduler {s} answered a forwarded request unreadably: {e}"
            ))
        })?;
        T::from_answer(answer?).ok_or_else(|| {
            QueueError::Internal("a forwarded command got an answer of another kind".into())
        })
    }
}

/// What a command's caller expects back: its kind of [`Answer`].
pub trait Answered: Sized {
    /// The value, if `answer` is of this kind.
    fn from_answer(answer: Answer) -> Option<Self>;
}

macro_rules! answered {
    ($type:ty, $variant:ident) => {
        impl Answered for $type {
            fn from_answer(answer: Answer) -> Option<Self> {
                match answer {
                    Answer::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

answered!(Vec<Result<PushOutcome, QueueError>>, Pushed);
answered!(Vec<Task>, Popped);
answered!(usize, Rescored);
answered!(Option<Wait>, Explained);
answered!(Task, Patched);
answered!(Vec<Uuid>, Cancelled);
answered!((u64, u64), Counted);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_instances_as_they_are() {
        let sent: Result<Answer, QueueError> = Err(QueueError::Duplicate {
            existing: Uuid::nil(),
        });
        let text = serde_json::to_string(&sent).unwrap();
        let back: Result<Answer, QueueError> = serde_json::from_str(&text).unwrap();
        match back {
            Err(QueueError::Duplicate { existing }) => assert_eq!(existing, Uuid::nil()),
            other => panic!("{other:?} from {text}"),
        }
        let moving: Result<Answer, QueueError> = serde_json::from_str(
            &serde_json::to_string(&Err::<Answer, _>(QueueError::Moving(SchedulerId::Report)))
                .unwrap(),
        )
        .unwrap();
        assert!(matches!(
            moving,
            Err(QueueError::Moving(SchedulerId::Report))
        ));
    }
}
