//! `[database]`: where the tables are and how the pool and the engines' commits use them.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::domain::SchedulerId;
use crate::storage::DbTarget;

/// Default database: an SQLite file under `./data/`, so `cargo run` needs no server.
pub const DEFAULT_DB_URI: &str = "sqlite://data/scheduler.db";
/// Default connections in the pool (each queue engine keeps one, the flush barrier one).
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Connections the pool must have beyond those the engines and the flush barrier keep: the
/// API's reads and the background processes share them.
pub const POOL_FREE_MIN: u32 = 2;
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
    /// Connections in the pool: each queue engine keeps one, the flush barrier one, and at
    /// least [`POOL_FREE_MIN`] are left for everything else ([`DatabaseSettings::pool_min`]).
    pub pool_size: u32,
    /// Apply pending migrations at start; when false, start refuses an outdated schema.
    pub migrate: bool,
    /// Seconds to wait for a connection before answering 503; also libpq's `connect_timeout`
    /// for every PostgreSQL connection opened, unless the URI sets one
    /// ([`DbTarget::with_connect_timeout`]).
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
    /// The smallest pool that serves: a connection for each queue engine and for the flush
    /// barrier when it is on, which they keep, and [`POOL_FREE_MIN`] for the API's reads and
    /// the background processes. A pool with fewer left every read waiting for a connection
    /// until it timed out (503).
    pub fn pool_min(&self) -> u32 {
        SchedulerId::ALL.len() as u32 + u32::from(self.flush_barrier()) + POOL_FREE_MIN
    }

    /// Refuses a URI of another database and a pool that would leave reads no connection.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Err(why) = DbTarget::parse(&self.uri) {
            return Err(ConfigError::setting("database.uri", why));
        }
        ConfigError::at_least_one("database.connect_timeout_secs", self.connect_timeout_secs)?;
        let min = self.pool_min();
        if self.pool_size < min {
            let barrier = match self.flush_barrier() {
                true => ", the flush barrier one",
                false => "",
            };
            return Err(ConfigError::setting(
                "database.pool_size",
                format!(
                    "must be at least {min}: the {} queue engines keep a connection each{barrier}, and the API's reads and the background processes need {POOL_FREE_MIN}; got {}",
                    SchedulerId::ALL.len(),
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
    fn a_pool_that_leaves_reads_no_connection_is_refused_naming_the_minimum() {
        // SQLite: three engines and the flush barrier keep four.
        let e = load(&[("SCHEDULER_DB_CONNECTION_POOL_SIZE", "4")]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("database.pool_size"), "{text}");
        assert!(text.contains("at least 6"), "{text}");
        assert!(text.contains("flush barrier"), "{text}");
        assert!(load(&[("SCHEDULER_DB_CONNECTION_POOL_SIZE", "6")]).is_ok());
        // PostgreSQL without the barrier: three kept, five in all.
        let pg = |n: &str| {
            load(&[
                ("SCHEDULER_DB_URI", "postgresql://postgres@db/s"),
                ("SCHEDULER_DB_CONNECTION_POOL_SIZE", n),
            ])
        };
        assert!(pg("5").is_ok());
        let e = pg("4").unwrap_err().to_string();
        assert!(e.contains("at least 5") && !e.contains("barrier"), "{e}");
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
