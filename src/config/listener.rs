//! `[listener]`: the AMQP listener's broker and queues, read by [`crate::listener`].

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default prefetch of the AMQP listener (mula's).
pub const DEFAULT_PREFETCH: u16 = 100;
/// Default seconds an event fails for a passing reason before it is parked.
pub const DEFAULT_PARK_AFTER_SECS: u64 = 60;
/// The longest wait before parking that may be set: a day. An event failing that long holds its
/// queue's head for as long; a longer wait is no safer, and 0 turns parking off.
pub const MAX_PARK_AFTER_SECS: u64 = 86_400;
/// Default queue of Octopoes' object events (mula's).
pub const DEFAULT_MUTATIONS_QUEUE: &str = "scan_profile_mutations";
/// Default queue of Bytes' raw file events (mula's).
pub const DEFAULT_RAW_FILES_QUEUE: &str = "raw_file_received";

/// The AMQP listener; off without a URI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSettings {
    /// `amqp://user:pass@host:5672/vhost` (mula's `QUEUE_URI`); empty: the listener is off.
    pub uri: String,
    /// Octopoes' object events.
    pub mutations_queue: String,
    /// Bytes' raw file events.
    pub raw_files_queue: String,
    /// Unacked messages RabbitMQ hands the listener at most.
    pub prefetch: u16,
    /// Seconds an event fails for a passing reason before it is parked in the database, off
    /// the head of its queue (`crate::listener::parked`); 0: never on its own failure.
    pub park_after_secs: u64,
}

impl Default for ListenerSettings {
    fn default() -> Self {
        Self {
            uri: String::new(),
            mutations_queue: DEFAULT_MUTATIONS_QUEUE.into(),
            raw_files_queue: DEFAULT_RAW_FILES_QUEUE.into(),
            prefetch: DEFAULT_PREFETCH,
            park_after_secs: DEFAULT_PARK_AFTER_SECS,
        }
    }
}

impl ListenerSettings {
    /// Refuses a URI that is not `amqp://`, a zero prefetch, a wait before parking over a day
    /// and an empty queue name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.uri.is_empty() && !self.uri.starts_with("amqp://") {
            return Err(ConfigError::setting(
                "listener.uri",
                "expected amqp://USER:PASS@HOST:PORT/VHOST (amqps is not built in)",
            ));
        }
        // Read as the connection will read it: a URI that cannot be (a port out of range) would
        // otherwise be found only at each connection attempt, with the service up and taking
        // no events.
        if !self.uri.is_empty()
            && let Err(why) = self.uri.parse::<lapin::uri::AMQPUri>()
        {
            return Err(ConfigError::setting(
                "listener.uri",
                format!("is not an AMQP URI: {why}"),
            ));
        }
        ConfigError::at_least_one("listener.prefetch", self.prefetch)?;
        if self.park_after_secs > MAX_PARK_AFTER_SECS {
            return Err(ConfigError::setting(
                "listener.park_after_secs",
                format!(
                    "{} is more than a day ({MAX_PARK_AFTER_SECS}); 0 turns parking off",
                    self.park_after_secs
                ),
            ));
        }
        for (key, q) in [
            ("listener.mutations_queue", &self.mutations_queue),
            ("listener.raw_files_queue", &self.raw_files_queue),
        ] {
            if q.trim().is_empty() {
                return Err(ConfigError::setting(key, "must not be empty"));
            }
        }
        Ok(())
    }
}
