//! `[database]`: where the tables are and how the pool and the engines' commits use them.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::storage::DbTarget;

/// Default database: an SQLite file under `./data/`, so `cargo run` needs no server.
pub const DEFAULT_DB_URI: &str = "sqlite://data/scheduler.db";
/// Default connections in the pool (one is the engine's).
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Default: pending migrations are applied at start.
pub const DEFAULT_MIGRATE: bool = true;
/// Default seconds to wait for a database connection before answering 503.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 5;

/// The database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `postgresql://…` or `sqlite://PATH`.
    pub uri: String,
    /// Connections in the pool (at least 2).
    pub pool_size: u32,
    /// Apply pending migrations at start; when false, start refuses an outdated schema.
    pub migrate: bool,
    /// Seconds to wait for a connection before answering 503.
    pub connect_timeout_secs: u64,
    /// Engines commit without waiting for the write-ahead log to reach disk and answer after a
    /// shared flush barrier, so one flush serves every batch committed meanwhile (on SQLite,
    /// the three schedulers' commits share one sync); every answer stays durable. When false,
    /// each commit waits for its own flush. Unset: on for SQLite, where it gave 1.2× the pops
    /// with a slow flush and 0.95–1.0× with a fast one, and off for PostgreSQL, where it
    /// cost 7–20 % of the pops on the project's 2-core machine (docs/BENCHMARKS.md); there it is
    /// for servers whose flush is slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_barrier: Option<bool>,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            uri: DEFAULT_DB_URI.into(),
            pool_size: DEFAULT_POOL_SIZE,
            migrate: DEFAULT_MIGRATE,
            connect_timeout_secs: DEFAULT_CONNECT_TIMEOUT_SECS,
            flush_barrier: None,
        }
    }
}

impl DatabaseSettings {
    /// Refuses a URI of another database and a pool without a connection besides the engine's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(why) = DbTarget::parse(&self.uri) {
            return Err(ConfigError::setting("database.uri", why));
        }
        if self.pool_size < 2 {
            return Err(ConfigError::setting(
                "database.pool_size",
                format!(
                    "must be at least 2 (one connection is the queue engine's), got {}",
                    self.pool_size
                ),
            ));
        }
        Ok(())
    }

    /// Whether the engines answer after a shared flush barrier: as configured, else on for
    /// SQLite and off for PostgreSQL (see [`DatabaseSettings::flush_barrier`]).
    pub fn flush_barrier(&self) -> bool {
        self.flush_barrier
            .unwrap_or_else(|| matches!(DbTarget::parse(&self.uri), Ok(DbTarget::Sqlite(_))))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn the_flush_barrier_is_on_for_sqlite_and_off_for_postgresql_unless_set() {
        let barrier = |vars: &[(&str, &str)]| load(vars).unwrap().queue_config().flush_barrier;
        assert!(barrier(&[]), "the default SQLite file");
        assert!(!barrier(&[(
            "SCHEDULER_DB_URI",
            "postgresql://postgres@db/s"
        )]));
        assert!(!barrier(&[("SCHEDULER_DB_FLUSH_BARRIER", "false")]));
        assert!(barrier(&[
            ("SCHEDULER_DB_URI", "postgresql://postgres@db/s"),
            ("SCHEDULER_DB_FLUSH_BARRIER", "true"),
        ]));
        assert!(load(&[("SCHEDULER_DB_FLUSH_BARRIER", "sometimes")]).is_err());
    }
    #[test]
    fn the_old_dsn_name_is_an_alias_and_the_new_name_wins() {
        let s = load(&[("SCHEDULER_DB_DSN", "sqlite:///tmp/a.db")]).unwrap();
        assert_eq!(s.database.uri, "sqlite:///tmp/a.db");
        let s = load(&[
            ("SCHEDULER_DB_URI", "sqlite:///tmp/new.db"),
            ("SCHEDULER_DB_DSN", "sqlite:///tmp/old.db"),
        ])
        .unwrap();
        assert_eq!(s.database.uri, "sqlite:///tmp/new.db");
    }
}
