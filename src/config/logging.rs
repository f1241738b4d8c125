//! `[logging]`: the log lines' format and filter, read by [`crate::telemetry`].

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default log line format.
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
/// Default tracing filter.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `kat_scheduler=debug,info`); `RUST_LOG` overrides it.
    pub level: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for LoggingSettings {
    fn default() -> Self {
        Self {
            format: DEFAULT_LOG_FORMAT,
            level: DEFAULT_LOG_LEVEL.into(),
        }
    }
}

impl LoggingSettings {
    /// Refuses a level that is no tracing filter.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match tracing_subscriber::EnvFilter::try_new(&self.level) {
            Ok(_) => Ok(()),
            Err(e) => Err(ConfigError::setting(
                "logging.level",
                format!("'{}' is not a log filter: {e}", self.level),
            )),
        }
    }
}
