//! Typed settings, layered: built-in defaults → an optional TOML file (`--config PATH`) → the
//! environment, under the names mula uses (`SCHEDULER_DB_URI`, `SCHEDULER_API_PORT`, …) so the
//! service drops into an existing deployment.
//!
//! Only the variables in [`ENV_VARS`] are read: a deployment's other mula settings do not stop
//! start-up. Anything invalid stops start-up with one line naming the key and its variable.
//!
//! # Layout
//!
//! This file holds [`Settings`], the loading and the error; each area has a file with its
//! settings, its defaults as `DEFAULT_…` constants, its `Default` and its own `validate`, which
//! [`Settings`]' validation calls in turn: `api`, `database`, `queue` (with the per-scheduler
//! overrides), `cluster`, `listener`, `catalogue`, `clients`, `coldstart`, `cron`, `auth`,
//! `limits` (the ceilings of [`crate::domain::limits::Limits`]) and `logging`. `env` is the one
//! list of environment variables. Every item is re-exported here, so users write
//! `crate::config::X`. The processes read their defaults from here, never the other way round.

use std::path::Path;

use config::{Config, File, FileFormat};
use serde::{Deserialize, Serialize};

use crate::domain::limits::Limits;

mod api;
mod auth;
mod catalogue;
mod clients;
mod cluster;
mod coldstart;
mod cron;
mod database;
mod env;
mod limits;
mod listener;
mod logging;
mod queue;

pub use api::*;
pub use auth::*;
pub use catalogue::*;
pub use clients::*;
pub use cluster::*;
pub use coldstart::*;
pub use cron::*;
pub use database::*;
pub use env::*;
pub use limits::*;
pub use listener::*;
pub use logging::*;
pub use queue::*;

/// All settings; their defaults are each area's.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The HTTP server.
    pub api: ApiSettings,
    /// The database.
    pub database: DatabaseSettings,
    /// Logs.
    pub logging: LoggingSettings,
    /// Defaults for every scheduler's queue.
    pub queue: QueueSettings,
    /// How large inputs may be.
    pub limits: Limits,
    /// Optional bearer tokens.
    #[serde(default)]
    pub auth: AuthSettings,
    /// The AMQP listener.
    pub listener: ListenerSettings,
    /// The plugin catalogue.
    pub catalogue: CatalogueSettings,
    /// ColdStart (runs when Octopoes is configured).
    #[serde(default)]
    pub coldstart: ColdStartSettings,
    /// The cron ticks and what their tables do.
    #[serde(default)]
    pub cron: CronSettings,
    /// Katalogus, Octopoes and Bytes.
    #[serde(default)]
    pub clients: ClientSettings,
    /// Per-scheduler overrides of `queue`.
    #[serde(default)]
    pub schedulers: SchedulerOverrides,
    /// Several instances on one PostgreSQL database.
    #[serde(default)]
    pub cluster: ClusterSettings,
}

/// A configuration that cannot be used; one line, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    /// `key`'s value is refused, for `why`. Written `key: why`, so that loading can name the
    /// variable the value came from after the key.
    pub fn setting(key: &str, why: impl std::fmt::Display) -> Self {
        Self(format!("{key}: {why}"))
    }

    /// Refuses `value` for `key` when it is zero (`0`, or the type's default).
    pub fn at_least_one<T: Default + PartialEq>(key: &str, value: T) -> Result<(), Self> {
        if value == T::default() {
            return Err(Self::setting(key, "must be at least 1"));
        }
        Ok(())
    }

    /// Names, after the key, the variable a refused value came from when that variable is set:
    /// the areas validate values without knowing where they came from.
    fn with_variable(self, env: &dyn Fn(&str) -> Option<String>) -> Self {
        match self.0.split_once(": ") {
            Some((key, why)) => Self(format!("{key}{}: {why}", env::source_of(key, env))),
            None => self,
        }
    }
}

impl Settings {
    /// Loads the settings from the process environment and an optional file.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, &|name| std::env::var(name).ok())
    }

    /// Loads the settings with `env` as the environment (tests pass a map).
    pub fn load_with(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let defaults = Config::try_from(&Settings::default())
            .map_err(|e| ConfigError(format!("built-in defaults: {e}")))?;
        let mut builder = Config::builder().add_source(defaults);
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        // Later entries of ENV_VARS are aliases; the first one set for a key wins.
        let mut seen: Vec<&str> = Vec::new();
        for (var, key, _) in ENV_VARS {
            if seen.contains(key) {
                continue;
            }
            if let Some(value) = env(var) {
                seen.push(key);
                builder = builder
                    .set_override(*key, value)
                    .map_err(|e| ConfigError(format!("{key} (from {var}): {e}")))?;
            }
        }
        let settings: Settings =
            builder
                .build()
                .and_then(Config::try_deserialize)
                .map_err(|e| {
                    let msg = e.to_string();
                    let key = ENV_VARS.iter().map(|(_, k, _)| *k).find(|k| {
                        msg.contains(&format!("`{k}`")) || msg.contains(&format!("\"{k}\""))
                    });
                    match key {
                        Some(k) => ConfigError(format!("{msg}{}", env::source_of(k, env))),
                        None => ConfigError(msg),
                    }
                })?;
        settings.validate(env)?;
        Ok(settings)
    }

    /// Each area in turn; the first refusal stops start-up, naming the variable it came from.
    fn validate(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        self.validate_areas().map_err(|e| e.with_variable(env))
    }

    fn validate_areas(&self) -> Result<(), ConfigError> {
        self.database.validate()?;
        self.api.validate()?;
        self.queue.validate()?;
        self.cluster.validate()?;
        self.listener.validate()?;
        self.catalogue.validate()?;
        self.clients.validate()?;
        self.coldstart.validate()?;
        self.cron.validate()?;
        self.auth.validate()?;
        self.validate_peer_token()?;
        validate_limits(&self.limits)?;
        self.schedulers.validate(&self.queue)?;
        self.logging.validate()
    }

    /// Refuses a peer token the instances would refuse: with tokens required, a forwarded
    /// push, pop or patch carries it, and one it does not allow was found only as a 503 on
    /// the first request another instance forwarded.
    fn validate_peer_token(&self) -> Result<(), ConfigError> {
        use crate::domain::auth::Action;
        let peer = &self.cluster.peer_token;
        let Ok(tokens) = self.auth.tokens() else {
            return Ok(());
        };
        // Only instances on one PostgreSQL database forward to each other: elsewhere the token
        // is never sent, and a leftover one is no reason to refuse to start.
        let clustered = matches!(
            crate::storage::DbTarget::parse(&self.database.uri),
            Ok(crate::storage::DbTarget::Postgres(_))
        );
        if peer.is_empty() || !tokens.enabled() || !clustered {
            return Ok(());
        }
        let Some(grant) = tokens.grant(peer) else {
            return Err(ConfigError::setting(
                "cluster.peer_token",
                "is none of the configured tokens (auth), so every instance would refuse the requests it forwards",
            ));
        };
        for s in crate::domain::SchedulerId::ALL {
            for (action, what) in [
                (Action::Push, "push"),
                (Action::Pop, "pop"),
                (Action::Patch, "patch"),
            ] {
                if !grant.allows(action, Some(s)) {
                    return Err(ConfigError::setting(
                        "cluster.peer_token",
                        format!(
                            "must allow push, pop and patch on every scheduler (it is forwarded with them), but token '{}' does not allow {what} on {}",
                            grant.name,
                            s.as_str()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether the engines answer after a shared flush barrier: as configured, else on for
    /// SQLite and off for PostgreSQL (see [`DatabaseSettings::flush_barrier`]).
    pub fn flush_barrier(&self) -> bool {
        self.database.flush_barrier()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SchedulerId;
    use crate::domain::auth::Role;
    use crate::queue::WhenFull;
    use std::collections::HashMap;

    pub(super) fn load(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::load_with(None, &move |k| map.get(k).cloned())
    }
    #[test]
    fn defaults_serve_on_8000_with_an_sqlite_file() {
        let s = load(&[]).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!((s.api.host.as_str(), s.api.port), ("0.0.0.0", 8000));
        assert_eq!(s.database.uri, "sqlite://data/scheduler.db");
    }
    #[test]
    fn mula_environment_names_work_as_is() {
        let s = load(&[
            ("SCHEDULER_API_HOST", "127.0.0.1"),
            ("SCHEDULER_API_PORT", "8004"),
            ("SCHEDULER_DB_URI", "postgresql://postgres@db/scheduler"),
            ("SCHEDULER_LOGGING_FORMAT", "json"),
        ])
        .unwrap();
        assert_eq!(s.api.host, "127.0.0.1");
        assert_eq!(s.api.port, 8004);
        assert_eq!(s.database.uri, "postgresql://postgres@db/scheduler");
        assert_eq!(s.logging.format, LogFormat::Json);
    }
    #[test]
    fn a_bad_value_names_the_key_and_the_variable() {
        let err = load(&[("SCHEDULER_API_PORT", "eighty")]).unwrap_err().0;
        assert!(err.contains("api.port"), "{err}");
        assert!(err.contains("SCHEDULER_API_PORT"), "{err}");
        let err = load(&[("SCHEDULER_DB_URI", "mysql://x")]).unwrap_err().0;
        assert!(
            err.starts_with("database.uri (from SCHEDULER_DB_URI)"),
            "{err}"
        );
        let err = load(&[("SCHEDULER_PQ_WHEN_FULL", "drop")]).unwrap_err().0;
        assert!(err.contains("queue.when_full"), "{err}");
    }
    #[test]
    fn values_that_would_fail_later_are_refused_at_start_naming_their_variable() {
        for (var, value, says) in [
            ("SCHEDULER_DB_CONNECT_TIMEOUT", "0", "at least 1"),
            (
                "QUEUE_URI",
                "amqp://guest:guest@rabbit:99999/%2f",
                "not an AMQP URI",
            ),
            ("SCHEDULER_LIMIT_JSON_DEPTH", "200", "at most 120"),
            ("SCHEDULER_COLDSTART_BACKOFF_MS", "0", "at least 1"),
            ("SCHEDULER_LOG_LEVEL", "WARNINGS", "sets no level"),
            (
                "SCHEDULER_LISTENER_PARK_AFTER",
                "18446744073709551615",
                "more than a day",
            ),
        ] {
            let err = load(&[(var, value)]).unwrap_err().0;
            assert!(
                err.contains(var) && err.contains(says),
                "{var}={value}: {err}"
            );
        }
        for (var, value) in [
            ("QUEUE_URI", "amqp://guest:guest@rabbit:5672/%2f"),
            ("SCHEDULER_LIMIT_JSON_DEPTH", "120"),
            ("SCHEDULER_LOG_LEVEL", "WARNING"),
            ("SCHEDULER_LISTENER_PARK_AFTER", "86400"),
            ("SCHEDULER_LISTENER_PARK_AFTER", "0"),
        ] {
            assert!(load(&[(var, value)]).is_ok(), "{var}={value}");
        }
    }
    #[test]
    fn a_peer_token_the_instances_would_refuse_is_refused_at_start() {
        let tokens = "admin=s3cret-admin-token;runner@boefje=s3cret-runner-token";
        let pg = "postgresql://postgres@db/scheduler";
        assert!(
            load(&[
                ("SCHEDULER_API_TOKENS", tokens),
                ("SCHEDULER_PEER_TOKEN", "unknown-token-value"),
            ])
            .is_ok(),
            "on SQLite no instance forwards: a leftover token is never sent"
        );
        let err = load(&[
            ("SCHEDULER_DB_URI", pg),
            ("SCHEDULER_API_TOKENS", tokens),
            ("SCHEDULER_PEER_TOKEN", "unknown-token-value"),
        ])
        .unwrap_err()
        .0;
        assert!(
            err.contains("SCHEDULER_PEER_TOKEN") && err.contains("none of the configured"),
            "{err}"
        );
        assert!(
            !err.contains("unknown-token-value"),
            "the secret is not logged: {err}"
        );
        let err = load(&[
            ("SCHEDULER_DB_URI", pg),
            ("SCHEDULER_API_TOKENS", tokens),
            ("SCHEDULER_PEER_TOKEN", "s3cret-runner-token"),
        ])
        .unwrap_err()
        .0;
        assert!(err.contains("does not allow push on boefje"), "{err}");
        assert!(
            load(&[
                ("SCHEDULER_DB_URI", pg),
                ("SCHEDULER_API_TOKENS", tokens),
                ("SCHEDULER_PEER_TOKEN", "s3cret-admin-token"),
            ])
            .is_ok()
        );
        assert!(
            load(&[
                ("SCHEDULER_DB_URI", pg),
                ("SCHEDULER_PEER_TOKEN", "anything")
            ])
            .is_ok(),
            "no tokens required"
        );
    }
    #[test]
    fn unknown_keys_in_a_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[api]\nprot = 1\n").unwrap();
        let err = Settings::load_with(Some(&path), &|_| None).unwrap_err().0;
        assert!(err.contains("prot"), "{err}");
    }
    #[test]
    fn the_shipped_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.example.toml");
        let s = Settings::load_with(Some(&path), &|_| None).unwrap();
        assert_eq!(s.api.port, 8000);
    }
    /// Every setting's dotted key, from the defaults with every optional setting filled in
    /// (a per-scheduler override, the flush barrier, a token); a scheduler's id is `<id>`.
    pub(super) fn setting_keys() -> Vec<String> {
        fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
            match v.as_object() {
                Some(map) => {
                    for (k, child) in map {
                        let key = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        walk(&key, child, out);
                    }
                }
                None => out.push(prefix.to_owned()),
            }
        }
        let mut full = Settings::default();
        full.database.flush_barrier = Some(true);
        full.schedulers.boefje = SchedulerOverride {
            maxsize: Some(1),
            when_full: Some(WhenFull::Reject),
            dispatch_timeout_secs: Some(1),
            run_timeout_secs: Some(1),
            unrenewed_run_timeout_secs: Some(1),
            max_attempts: Some(1),
            scoring: Some(crate::scoring::Strategy::TimeBased),
            fairness: Some(crate::queue::fair::Fairness::Organisation),
            fairness_weights: Some("o=2".into()),
            rate_limits: Some("boefje.id=x:1/1".into()),
            concurrency: Some("input_ooi=*:1".into()),
        };
        full.auth.tokens.push(TokenSettings {
            name: "n".into(),
            role: Role::Admin,
            schedulers: vec![],
            token: "t".into(),
        });
        let mut keys = Vec::new();
        walk("", &serde_json::to_value(&full).unwrap(), &mut keys);
        keys.into_iter()
            .map(|k| k.replace("schedulers.boefje.", "schedulers.<id>."))
            .collect()
    }
    /// A variable's setting, with a scheduler's id as `<id>`.
    pub(super) fn generic(key: &str) -> String {
        let mut key = key.to_owned();
        for s in SchedulerId::ALL {
            key = key.replace(&format!("schedulers.{s}."), "schedulers.<id>.");
        }
        key
    }
    /// The keys the example file shows, set or commented out, by table (`[schedulers.report]`
    /// counts as `schedulers.<id>`).
    fn example_keys() -> Vec<String> {
        let text = include_str!("../../docs/config.example.toml");
        let mut table = String::new();
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            let line = line.split(" #").next().unwrap_or_default().trim();
            if let Some(header) = line.strip_prefix('[') {
                table = generic(&format!("{}.", header.trim_matches(['[', ']']).trim()))
                    .trim_end_matches('.')
                    .to_owned();
                keys.push(table.clone());
            } else if let Some((key, _)) = line.split_once('=')
                && !key.trim().is_empty()
                && key
                    .trim()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            {
                keys.push(format!("{table}.{}", key.trim()));
            }
        }
        keys
    }
    #[test]
    fn the_example_config_shows_every_setting_and_no_other() {
        let shown = example_keys();
        for key in setting_keys() {
            assert!(shown.contains(&key), "docs/config.example.toml lacks {key}");
        }
        let keys = setting_keys();
        for key in &shown {
            let known = keys
                .iter()
                .any(|k| k == key || k.starts_with(&format!("{key}.")))
                || key.starts_with("auth.tokens.");
            assert!(
                known,
                "docs/config.example.toml shows {key}, which is no setting"
            );
        }
    }
    #[test]
    fn the_example_config_with_every_key_uncommented_loads() {
        let text = include_str!("../../docs/config.example.toml");
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest.split_once('=').is_some_and(|(k, _)| {
                            k.trim().chars().all(|c| c.is_ascii_lowercase() || c == '_')
                        }) =>
                {
                    rest
                }
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("all.toml");
        std::fs::write(&path, uncommented).unwrap();
        Settings::load_with(Some(&path), &|_| None).unwrap();
    }
}
