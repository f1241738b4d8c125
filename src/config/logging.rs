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
    /// Refuses a level that is no tracing filter, and one that sets no level at all: a bare
    /// word tracing does not know as a level names a target (`WARNINGS` would log that target
    /// alone, at every level, and nothing else).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let filter =
            filter_of(&self.level).map_err(|why| ConfigError::setting("logging.level", why))?;
        if !sets_a_level(&filter) {
            return Err(ConfigError::setting(
                "logging.level",
                format!(
                    "'{}' sets no level, so it would log only the targets it names: give a level (trace, debug, info, warn, error or off), as in 'info' or 'info,{}', or a target's, as in '{}=debug'",
                    self.level,
                    self.level.trim(),
                    self.level.trim()
                ),
            ));
        }
        Ok(())
    }
}

/// Levels as tracing names them.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// `level` as a tracing filter. Python's level names, which mula's operators know (`WARNING`,
/// `CRITICAL`, `FATAL`), stand for tracing's `warn` and `error`, case aside; everything else is
/// read as tracing reads it (a bare word that is no level names a target).
pub fn filter_of(level: &str) -> Result<String, String> {
    let filter = level
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| match d.to_ascii_lowercase().as_str() {
            "warning" => "warn".to_owned(),
            "critical" | "fatal" => "error".to_owned(),
            _ => d.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",");
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(_) => Ok(filter),
        Err(e) => Err(format!("'{level}' is not a log filter: {e}")),
    }
}

/// Whether a directive of `filter` sets a level: a bare level, or a target's (`lapin=debug`).
fn sets_a_level(filter: &str) -> bool {
    filter
        .split(',')
        .any(|d| d.contains('=') || LEVELS.contains(&d.to_ascii_lowercase().as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_level_names_read_as_tracing_s_and_a_filter_that_sets_no_level_is_refused() {
        assert_eq!(filter_of("info").unwrap(), "info");
        assert_eq!(filter_of("WARNING").unwrap(), "warn");
        assert_eq!(
            filter_of("Critical, kat_scheduler=debug").unwrap(),
            "error,kat_scheduler=debug"
        );
        assert_eq!(
            filter_of("info,kat_scheduler::queue").unwrap(),
            "info,kat_scheduler::queue"
        );
        assert!(filter_of("kat_scheduler=loud").is_err());
        let settings = |level: &str| LoggingSettings {
            level: level.into(),
            ..LoggingSettings::default()
        };
        for ok in [
            "WARNING",
            "info,kat_scheduler::queue",
            "kat_scheduler=debug",
            "INFO",
        ] {
            assert!(settings(ok).validate().is_ok(), "{ok}");
        }
        let why = settings("WARNINGS").validate().unwrap_err().to_string();
        assert!(
            why.contains("logging.level") && why.contains("sets no level"),
            "{why}"
        );
    }
}
