//! What the health and metrics pages read of the service beside the queue: the background
//! processes' state (listener, catalogue, ColdStart) and the platform's services, asked when a
//! health check wants them (`externals=true`, as mula), all at once and within a bound.

use std::collections::HashMap;
use std::sync::Arc;

use crate::clients::bytes::Bytes;
use crate::clients::catalogue::Catalogue;
use crate::clients::katalogus::Katalogus;
use crate::clients::octopoes::Octopoes;
use crate::coldstart::ColdStartStatus;
use crate::listener::ListenerStatus;

/// What `/health` reports beside the database: the background processes' state and, when asked
/// (`externals=true`, as mula), whether the platform's services answer.
pub struct Observed {
    /// The AMQP listener (`off` when not configured).
    pub listener: Arc<ListenerStatus>,
    /// The plugin catalogue.
    pub catalogue: Catalogue,
    /// ColdStart (`off` when Octopoes is not configured).
    pub coldstart: Arc<ColdStartStatus>,
    /// Katalogus, when configured.
    pub katalogus: Option<Katalogus>,
    /// Octopoes, when configured.
    pub octopoes: Option<Octopoes>,
    /// Bytes, when configured.
    pub bytes: Option<Bytes>,
    /// The clock the components' failure times are read on.
    pub clock: crate::clock::SharedClock,
}

/// Longest `/health?externals=true` waits for the platform's services, all asked at once: a hung
/// one counts as unhealthy rather than holding the answer (and a probe) up.
pub const EXTERNALS_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a component's dependency may fail before the component says it is unhealthy: the
/// catalogue keeps the last known plugins and ColdStart retries, so a blip is no fault, but
/// Katalogus or Octopoes away for minutes is one an operator should see.
pub const DEPENDENCY_GRACE_SECS: i64 = 300;

/// Whether a dependency failing since `since` (if at all) is still within the grace at `now`.
pub(crate) fn within_grace(failing_for: Option<chrono::Duration>) -> bool {
    failing_for.is_none_or(|d| d < chrono::Duration::seconds(DEPENDENCY_GRACE_SECS))
}

/// `check`, or false once [`EXTERNALS_BOUND`] has passed.
async fn bounded(check: impl std::future::Future<Output = bool>) -> bool {
    tokio::time::timeout(EXTERNALS_BOUND, check)
        .await
        .unwrap_or(false)
}

impl Observed {
    /// Nothing observed but a listener (tests and tools that build the API alone).
    pub fn listener_only(listener: Arc<ListenerStatus>, clock: crate::clock::SharedClock) -> Self {
        Self {
            listener,
            catalogue: Catalogue::empty(clock.clone()),
            coldstart: Arc::default(),
            katalogus: None,
            octopoes: None,
            bytes: None,
            clock,
        }
    }

    /// Whether each configured platform service answers its health check: all asked at once,
    /// each within [`EXTERNALS_BOUND`].
    pub(crate) async fn externals(&self) -> HashMap<String, bool> {
        let katalogus = async {
            match &self.katalogus {
                Some(k) => Some(bounded(k.health()).await),
                None => None,
            }
        };
        let octopoes = async {
            match &self.octopoes {
                Some(o) => Some(bounded(o.service_health()).await),
                None => None,
            }
        };
        let bytes = async {
            match &self.bytes {
                Some(b) => Some(bounded(b.health()).await),
                None => None,
            }
        };
        let (k, o, b) = tokio::join!(katalogus, octopoes, bytes);
        [("katalogus", k), ("octopoes", o), ("bytes", b)]
            .into_iter()
            .filter_map(|(name, ok)| ok.map(|ok| (name.to_owned(), ok)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependency_failing_past_the_grace_makes_its_component_unhealthy() {
        assert!(within_grace(None));
        assert!(within_grace(Some(chrono::Duration::seconds(
            DEPENDENCY_GRACE_SECS - 1
        ))));
        assert!(!within_grace(Some(chrono::Duration::seconds(
            DEPENDENCY_GRACE_SECS
        ))));
    }
}
