//! `[coldstart]`: how [`crate::coldstart`] pages every organisation's objects from Octopoes.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default seconds between two complete passes over an organisation.
pub const DEFAULT_COLDSTART_INTERVAL_SECS: u64 = 24 * 60 * 60;
/// Default objects per page (mula's).
pub const DEFAULT_COLDSTART_PAGE_SIZE: u64 = 1000;
/// Most objects per page.
pub const MAX_COLDSTART_PAGE_SIZE: u64 = 10_000;
/// Default organisations paged at once.
pub const DEFAULT_COLDSTART_CONCURRENCY: usize = 4;
/// Default tries of one page before the organisation is left for the next round.
pub const DEFAULT_COLDSTART_ATTEMPTS: u32 = 5;
/// Default first wait after a failed page, in milliseconds.
pub const DEFAULT_COLDSTART_BACKOFF_MS: u64 = 1000;

/// ColdStart: pages every organisation's objects from Octopoes into the frontier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct ColdStartSettings {
    /// Seconds between two complete passes over an organisation (the sanity check).
    pub interval_secs: u64,
    /// Objects per page asked of Octopoes.
    pub page_size: u64,
    /// Organisations paged at once.
    pub concurrency: usize,
    /// Tries of one page before its organisation waits for the next round.
    pub attempts: u32,
    /// Milliseconds before the second try of a page; doubles with each failure, to at most a
    /// minute.
    pub backoff_ms: u64,
}

impl Default for ColdStartSettings {
    fn default() -> Self {
        Self {
            interval_secs: DEFAULT_COLDSTART_INTERVAL_SECS,
            page_size: DEFAULT_COLDSTART_PAGE_SIZE,
            concurrency: DEFAULT_COLDSTART_CONCURRENCY,
            attempts: DEFAULT_COLDSTART_ATTEMPTS,
            backoff_ms: DEFAULT_COLDSTART_BACKOFF_MS,
        }
    }
}

impl ColdStartSettings {
    /// Refuses a zero interval, concurrency, number of tries or backoff, and a page size out of
    /// range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::at_least_one("coldstart.interval_secs", self.interval_secs)?;
        if !(1..=MAX_COLDSTART_PAGE_SIZE).contains(&self.page_size) {
            return Err(ConfigError::setting(
                "coldstart.page_size",
                format!(
                    "must be 1 to {MAX_COLDSTART_PAGE_SIZE}, got {}",
                    self.page_size
                ),
            ));
        }
        ConfigError::at_least_one("coldstart.concurrency", self.concurrency)?;
        ConfigError::at_least_one("coldstart.attempts", self.attempts)?;
        // The wait between tries doubles from this: zero would retry back to back.
        ConfigError::at_least_one("coldstart.backoff_ms", self.backoff_ms)
    }
}
