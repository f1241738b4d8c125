//! The environment: the one list of variables read ([`ENV_VARS`], under mula's names where mula
//! has one), the settings no variable sets ([`FILE_ONLY`]), mula's variables ignored on purpose
//! ([`IGNORED_MULA_VARS`]), and the warning about a `SCHEDULER_*` variable that is none of these.
//! README.md's table of variables is checked against [`ENV_VARS`] both ways.

/// Environment variables read, with the setting each sets and what it means.
pub const ENV_VARS: &[(&str, &str, &str)] = &[
    (
        "SCHEDULER_API_HOST",
        "api.host",
        "address to listen on (default 0.0.0.0)",
    ),
    (
        "SCHEDULER_API_PORT",
        "api.port",
        "port to listen on (default 8000)",
    ),
    (
        "SCHEDULER_API_WORKERS",
        "api.workers",
        "HTTP worker threads, 0 = one per CPU",
    ),
    (
        "SCHEDULER_API_MAX_BODY_BYTES",
        "api.max_body_bytes",
        "largest request body (default 1 MiB)",
    ),
    (
        "SCHEDULER_API_KEEP_ALIVE",
        "api.keep_alive_secs",
        "seconds an idle keep-alive connection stays open (default 75)",
    ),
    (
        "SCHEDULER_API_REQUEST_HEAD_TIMEOUT",
        "api.request_head_timeout_secs",
        "seconds to send a request's head before 408 (default 10)",
    ),
    (
        "SCHEDULER_API_BODY_TIMEOUT",
        "api.body_timeout_secs",
        "seconds to send a whole request body before 408 (default 30)",
    ),
    (
        "SCHEDULER_API_SHUTDOWN_TIMEOUT",
        "api.shutdown_timeout_secs",
        "seconds in-flight requests get to finish at shutdown (default 30)",
    ),
    (
        "SCHEDULER_API_TOKENS",
        "auth.spec",
        "bearer tokens, role[@scheduler,...]=secret separated by ';' (default none: open)",
    ),
    (
        "QUEUE_URI",
        "listener.uri",
        "RabbitMQ, amqp://USER:PASS@HOST:5672/VHOST (default none: the listener is off)",
    ),
    (
        "SCHEDULER_RABBITMQ_DSN",
        "listener.uri",
        "mula's old name of QUEUE_URI",
    ),
    (
        "SCHEDULER_RABBITMQ_PREFETCH_COUNT",
        "listener.prefetch",
        "unacked messages per queue (default 100)",
    ),
    (
        "SCHEDULER_LISTENER_PARK_AFTER",
        "listener.park_after_secs",
        "seconds an event fails for a passing reason before it is parked in the database (default 60; 0: never)",
    ),
    (
        "SCHEDULER_QUEUE_MUTATIONS",
        "listener.mutations_queue",
        "Octopoes' object events (default scan_profile_mutations)",
    ),
    (
        "SCHEDULER_QUEUE_RAW_FILES",
        "listener.raw_files_queue",
        "Bytes' raw file events (default raw_file_received)",
    ),
    (
        "SCHEDULER_INSTANCE_ID",
        "cluster.instance_id",
        "this instance's name in the ownership rows (default: host, pid and a random part)",
    ),
    (
        "SCHEDULER_ADVERTISE_URL",
        "cluster.advertise_url",
        "http://HOST:PORT where other instances forward to this one (default: host name and bound port)",
    ),
    (
        "SCHEDULER_LEASE_MS",
        "cluster.lease_ms",
        "milliseconds a scheduler's ownership lease runs without renewal (default 2000)",
    ),
    (
        "SCHEDULER_PEER_TOKEN",
        "cluster.peer_token",
        "bearer token instances forward each other's requests with, when tokens are required",
    ),
    (
        "SCHEDULER_CRON_TICK",
        "cron.tick_secs",
        "seconds between cron ticks, 0 = off (default 1)",
    ),
    (
        "SCHEDULER_PQ_GRACE_PERIOD",
        "cron.grace_period_secs",
        "seconds before a boefje schedule without cron, or an object's events, run the same boefje again (default 86400)",
    ),
    (
        "SCHEDULER_RESCHEDULE_JITTER",
        "cron.jitter_secs",
        "up to this many seconds more per schedule (default 18000)",
    ),
    (
        "SCHEDULER_RESCORE_INTERVAL",
        "cron.rescore_secs",
        "no longer has an effect: priorities do not age, so there is no periodic re-score (accepted, with a warning when set to anything but its old default)",
    ),
    (
        "SCHEDULER_TASK_RETENTION_DAYS",
        "cron.task_retention_days",
        "days finished tasks are kept, 0 = forever (default 0)",
    ),
    (
        "SCHEDULER_SCHEDULE_HISTORY_DAYS",
        "cron.schedule_history_days",
        "days a schedule's due fires are kept in its history, 0 = forever (default 30)",
    ),
    (
        "SCHEDULER_COLDSTART_INTERVAL",
        "coldstart.interval_secs",
        "seconds between two complete ColdStart passes over an organisation (default 86400)",
    ),
    (
        "SCHEDULER_COLDSTART_PAGE_SIZE",
        "coldstart.page_size",
        "objects per page asked of Octopoes (default 1000)",
    ),
    (
        "SCHEDULER_COLDSTART_CONCURRENCY",
        "coldstart.concurrency",
        "organisations paged at once (default 4)",
    ),
    (
        "SCHEDULER_COLDSTART_ATTEMPTS",
        "coldstart.attempts",
        "tries of one page before its organisation waits for the next round (default 5)",
    ),
    (
        "SCHEDULER_COLDSTART_BACKOFF_MS",
        "coldstart.backoff_ms",
        "milliseconds before a page's second try, doubling to at most a minute (default 1000)",
    ),
    (
        "SCHEDULER_CATALOGUE_TTL",
        "catalogue.ttl_secs",
        "seconds a Katalogus answer is cached (default 60)",
    ),
    (
        "SCHEDULER_CATALOGUE_FILE",
        "catalogue.file",
        "TOML file of plugins standing in for Katalogus (default none)",
    ),
    (
        "KATALOGUS_API",
        "clients.katalogus_api",
        "Katalogus, http://HOST:PORT (default none)",
    ),
    (
        "OCTOPOES_API",
        "clients.octopoes_api",
        "Octopoes, http://HOST:PORT (default none)",
    ),
    (
        "BYTES_API",
        "clients.bytes_api",
        "Bytes, http://HOST:PORT (default none); needs BYTES_USERNAME and BYTES_PASSWORD",
    ),
    ("BYTES_USERNAME", "clients.bytes_username", "the Bytes user"),
    (
        "BYTES_PASSWORD",
        "clients.bytes_password",
        "the Bytes password (never logged)",
    ),
    (
        "SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
        "clients.request_timeout_secs",
        "seconds each try of a call to Katalogus, Octopoes or Bytes may take (default 10)",
    ),
    (
        "SCHEDULER_OCTOPOES_LOOKUP_WINDOW",
        "clients.lookup_window_secs",
        "seconds one lookup of objects waits for Octopoes' answers: a page of due schedules, a listener batch (default 5, at most 60)",
    ),
    (
        "SCHEDULER_LIMIT_FILTER_CONDITIONS",
        "limits.max_filter_conditions",
        "conditions in one filter (default 100)",
    ),
    (
        "SCHEDULER_LIMIT_FILTER_DEPTH",
        "limits.max_filter_depth",
        "nesting of lists and and/or/not in one filter (default 32)",
    ),
    (
        "SCHEDULER_LIMIT_IN_VALUES",
        "limits.max_in_values",
        "values in one in/not_in list (default 1000)",
    ),
    (
        "SCHEDULER_LIMIT_STRING_CHARS",
        "limits.max_string_chars",
        "characters in one organisation, id or key field (default 512); an object reference or a filter value may have 8192",
    ),
    (
        "SCHEDULER_LIMIT_JSON_DEPTH",
        "limits.max_json_depth",
        "nesting of a task payload (default 32)",
    ),
    (
        "SCHEDULER_LIMIT_OFFSET",
        "limits.max_offset",
        "largest offset of a task listing (default 100000000)",
    ),
    (
        "SCHEDULER_DB_URI",
        "database.uri",
        "postgresql://USER@HOST/DB or sqlite://PATH (default sqlite://data/scheduler.db)",
    ),
    (
        "SCHEDULER_DB_DSN",
        "database.uri",
        "old name of SCHEDULER_DB_URI",
    ),
    (
        "SCHEDULER_DB_CONNECTION_POOL_SIZE",
        "database.pool_size",
        "database connections (default 10)",
    ),
    (
        "SCHEDULER_DB_MIGRATE",
        "database.migrate",
        "apply migrations at start (default true)",
    ),
    (
        "DATABASE_MIGRATION",
        "database.migrate",
        "mula's name of SCHEDULER_DB_MIGRATE",
    ),
    (
        "SCHEDULER_DB_CONNECT_TIMEOUT",
        "database.connect_timeout_secs",
        "seconds to wait for a connection before 503 (default 5)",
    ),
    (
        "SCHEDULER_DB_FLUSH_BARRIER",
        "database.flush_barrier",
        "group WAL flushes behind a shared barrier (default true on SQLite, false on PostgreSQL)",
    ),
    (
        "SCHEDULER_LOGGING_FORMAT",
        "logging.format",
        "text or json (default text)",
    ),
    (
        "SCHEDULER_LOG_LEVEL",
        "logging.level",
        "tracing filter (default info); RUST_LOG overrides",
    ),
    (
        "SCHEDULER_PQ_MAXSIZE",
        "queue.maxsize",
        "queued tasks per heap (default 100000)",
    ),
    (
        "SCHEDULER_PQ_WHEN_FULL",
        "queue.when_full",
        "pending or reject (default pending)",
    ),
    (
        "SCHEDULER_PQ_MAX_BATCH",
        "queue.max_batch",
        "commands per transaction (default 512)",
    ),
    (
        "SCHEDULER_PQ_CHANNEL_CAPACITY",
        "queue.channel_capacity",
        "commands waiting for an engine before callers get 503 (default 16384)",
    ),
    (
        "SCHEDULER_PQ_SHED_AFTER",
        "queue.shed_after_secs",
        "seconds a command may wait for its engine before 503 (default 20)",
    ),
    (
        "SCHEDULER_DISPATCH_TIMEOUT",
        "queue.dispatch_timeout_secs",
        "seconds a popped task may stay dispatched (default 86400)",
    ),
    (
        "SCHEDULER_RUN_TIMEOUT",
        "queue.run_timeout_secs",
        "seconds a running task may go without finishing or a heartbeat, once it sent one (default 14400)",
    ),
    (
        "SCHEDULER_UNRENEWED_RUN_TIMEOUT",
        "queue.unrenewed_run_timeout_secs",
        "seconds a running task that never sent a heartbeat may go without finishing (default 86400)",
    ),
    (
        "SCHEDULER_MAX_ATTEMPTS",
        "queue.max_attempts",
        "expired leases before a task is failed (default 3)",
    ),
    (
        "SCHEDULER_WATCHDOG_INTERVAL",
        "queue.watchdog_interval_secs",
        "seconds between lease sweeps, 0 = off (default 30)",
    ),
    (
        "SCHEDULER_BOEFJE_PQ_MAXSIZE",
        "schedulers.boefje.maxsize",
        "boefje heap bound",
    ),
    (
        "SCHEDULER_NORMALIZER_PQ_MAXSIZE",
        "schedulers.normalizer.maxsize",
        "normalizer heap bound",
    ),
    (
        "SCHEDULER_REPORT_PQ_MAXSIZE",
        "schedulers.report.maxsize",
        "report heap bound",
    ),
    (
        "SCHEDULER_BOEFJE_PQ_WHEN_FULL",
        "schedulers.boefje.when_full",
        "boefje full-heap policy",
    ),
    (
        "SCHEDULER_NORMALIZER_PQ_WHEN_FULL",
        "schedulers.normalizer.when_full",
        "normalizer full-heap policy",
    ),
    (
        "SCHEDULER_REPORT_PQ_WHEN_FULL",
        "schedulers.report.when_full",
        "report full-heap policy",
    ),
    (
        "SCHEDULER_BOEFJE_DISPATCH_TIMEOUT",
        "schedulers.boefje.dispatch_timeout_secs",
        "boefje dispatch lease",
    ),
    (
        "SCHEDULER_NORMALIZER_DISPATCH_TIMEOUT",
        "schedulers.normalizer.dispatch_timeout_secs",
        "normalizer dispatch lease",
    ),
    (
        "SCHEDULER_REPORT_DISPATCH_TIMEOUT",
        "schedulers.report.dispatch_timeout_secs",
        "report dispatch lease",
    ),
    (
        "SCHEDULER_BOEFJE_RUN_TIMEOUT",
        "schedulers.boefje.run_timeout_secs",
        "boefje run lease",
    ),
    (
        "SCHEDULER_NORMALIZER_RUN_TIMEOUT",
        "schedulers.normalizer.run_timeout_secs",
        "normalizer run lease",
    ),
    (
        "SCHEDULER_REPORT_RUN_TIMEOUT",
        "schedulers.report.run_timeout_secs",
        "report run lease",
    ),
    (
        "SCHEDULER_BOEFJE_UNRENEWED_RUN_TIMEOUT",
        "schedulers.boefje.unrenewed_run_timeout_secs",
        "boefje run lease of a holder that never renews it",
    ),
    (
        "SCHEDULER_NORMALIZER_UNRENEWED_RUN_TIMEOUT",
        "schedulers.normalizer.unrenewed_run_timeout_secs",
        "normalizer run lease of a holder that never renews it",
    ),
    (
        "SCHEDULER_REPORT_UNRENEWED_RUN_TIMEOUT",
        "schedulers.report.unrenewed_run_timeout_secs",
        "report run lease of a holder that never renews it",
    ),
    (
        "SCHEDULER_BOEFJE_MAX_ATTEMPTS",
        "schedulers.boefje.max_attempts",
        "boefje attempts",
    ),
    (
        "SCHEDULER_NORMALIZER_MAX_ATTEMPTS",
        "schedulers.normalizer.max_attempts",
        "normalizer attempts",
    ),
    (
        "SCHEDULER_REPORT_MAX_ATTEMPTS",
        "schedulers.report.max_attempts",
        "report attempts",
    ),
    (
        "SCHEDULER_BOEFJE_SCORING",
        "schedulers.boefje.scoring",
        "boefje ranking strategy",
    ),
    (
        "SCHEDULER_NORMALIZER_SCORING",
        "schedulers.normalizer.scoring",
        "normalizer ranking strategy",
    ),
    (
        "SCHEDULER_REPORT_SCORING",
        "schedulers.report.scoring",
        "report ranking strategy",
    ),
    (
        "SCHEDULER_BOEFJE_FAIRNESS",
        "schedulers.boefje.fairness",
        "boefje: organisations take turns for automatic work, organisation|off (default organisation)",
    ),
    (
        "SCHEDULER_BOEFJE_FAIRNESS_WEIGHTS",
        "schedulers.boefje.fairness_weights",
        "boefje: organisations' weights in their turns, org=weight;... (default 1 each)",
    ),
    (
        "SCHEDULER_NORMALIZER_FAIRNESS",
        "schedulers.normalizer.fairness",
        "normalizer: organisations take turns for automatic work, organisation|off (default organisation)",
    ),
    (
        "SCHEDULER_NORMALIZER_FAIRNESS_WEIGHTS",
        "schedulers.normalizer.fairness_weights",
        "normalizer: organisations' weights in their turns, org=weight;... (default 1 each)",
    ),
    (
        "SCHEDULER_REPORT_FAIRNESS",
        "schedulers.report.fairness",
        "report: organisations take turns for automatic work, organisation|off (default off)",
    ),
    (
        "SCHEDULER_REPORT_FAIRNESS_WEIGHTS",
        "schedulers.report.fairness_weights",
        "report: organisations' weights in their turns, org=weight;... (default 1 each)",
    ),
    (
        "SCHEDULER_BOEFJE_RATE_LIMITS",
        "schedulers.boefje.rate_limits",
        "boefje: at most N tasks of a key's value dispatched in any S seconds, key=value:N/S;... (default none)",
    ),
    (
        "SCHEDULER_BOEFJE_CONCURRENCY",
        "schedulers.boefje.concurrency",
        "boefje: at most N tasks of a key's value dispatched or running at once, key=value:N;... (default none)",
    ),
    (
        "SCHEDULER_NORMALIZER_RATE_LIMITS",
        "schedulers.normalizer.rate_limits",
        "normalizer: at most N tasks of a key's value dispatched in any S seconds, key=value:N/S;... (default none)",
    ),
    (
        "SCHEDULER_NORMALIZER_CONCURRENCY",
        "schedulers.normalizer.concurrency",
        "normalizer: at most N tasks of a key's value dispatched or running at once, key=value:N;... (default none)",
    ),
    (
        "SCHEDULER_REPORT_RATE_LIMITS",
        "schedulers.report.rate_limits",
        "report: at most N tasks of a key's value dispatched in any S seconds, key=value:N/S;... (default none)",
    ),
    (
        "SCHEDULER_REPORT_CONCURRENCY",
        "schedulers.report.concurrency",
        "report: at most N tasks of a key's value dispatched or running at once, key=value:N;... (default none)",
    ),
];

/// Settings no variable sets, and why.
pub const FILE_ONLY: &[(&str, &str)] = &[(
    "auth.tokens",
    "a list of tables; SCHEDULER_API_TOKENS (auth.spec) is its form for the environment",
)];

/// mula's `SCHEDULER_*` variables this service reads no value from, on purpose, with the reason.
/// A deployment moved from mula keeps setting them, so they are not reported as unknown.
pub const IGNORED_MULA_VARS: &[(&str, &str)] = &[
    (
        "SCHEDULER_API",
        "the scheduler's address as its clients (Rocky, the runners) read it, not a setting of the scheduler",
    ),
    (
        "SCHEDULER_DEBUG",
        "SCHEDULER_LOG_LEVEL (e.g. debug) sets what is logged",
    ),
    (
        "SCHEDULER_LOG_CFG",
        "mula's logging configuration file: SCHEDULER_LOG_LEVEL and SCHEDULER_LOGGING_FORMAT set logging",
    ),
    (
        "SCHEDULER_DB",
        "a part OpenKAT's .env builds SCHEDULER_DB_URI from, read by neither mula nor this service",
    ),
    (
        "SCHEDULER_DB_USER",
        "a part OpenKAT's .env builds SCHEDULER_DB_URI from, read by neither mula nor this service",
    ),
    (
        "SCHEDULER_DB_PASSWORD",
        "a part OpenKAT's .env builds SCHEDULER_DB_URI from, read by neither mula nor this service",
    ),
    (
        "SCHEDULER_COLLECT_METRICS",
        "metrics are always collected and served on /metrics",
    ),
    (
        "SCHEDULER_PQ_INTERVAL",
        "no polling populate loop: events are planned as they arrive and schedules fire on the cron ticks (SCHEDULER_CRON_TICK)",
    ),
    (
        "SCHEDULER_PQ_MAX_RANDOM_OBJECTS",
        "no random rescans: ColdStart and the schedules bring objects round again",
    ),
    (
        "SCHEDULER_MONITOR_ORGANISATIONS_INTERVAL",
        "organisations come with the plugin catalogue, refreshed every half of SCHEDULER_CATALOGUE_TTL",
    ),
    (
        "SCHEDULER_OCTOPOES_REQUEST_TIMEOUT",
        "one timeout for every client: SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
    ),
    (
        "SCHEDULER_KATALOGUS_REQUEST_TIMEOUT",
        "one timeout for every client: SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
    ),
    (
        "SCHEDULER_BYTES_REQUEST_TIMEOUT",
        "one timeout for every client: SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
    ),
    (
        "SCHEDULER_OCTOPOES_POOL_CONNECTIONS",
        "the HTTP clients keep their connections alive and open more as needed",
    ),
    (
        "SCHEDULER_KATALOGUS_POOL_CONNECTIONS",
        "the HTTP clients keep their connections alive and open more as needed",
    ),
    (
        "SCHEDULER_BYTES_POOL_CONNECTIONS",
        "the HTTP clients keep their connections alive and open more as needed",
    ),
];

/// A `SCHEDULER_*` variable that is set but neither read nor one of mula's that are ignored on
/// purpose: most likely a misspelling, reported with the nearest name that is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariable {
    /// The variable as set.
    pub name: String,
    /// The read variable nearest to it, when one is near enough to be a likely intent.
    pub suggestion: Option<&'static str>,
}

impl std::fmt::Display for UnknownVariable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not a setting of kat-scheduler; it is ignored",
            self.name
        )?;
        if let Some(s) = self.suggestion {
            write!(f, " (did you mean {s}?)")?;
        }
        Ok(())
    }
}

/// Of the variables `names`, those under `SCHEDULER_` this service does not know (see
/// [`UnknownVariable`]). Other variables are a deployment's business and are not looked at.
pub fn unknown_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<UnknownVariable> {
    let mut unknown: Vec<UnknownVariable> = names
        .into_iter()
        .filter(|n| n.starts_with("SCHEDULER_"))
        .filter(|n| !ENV_VARS.iter().any(|(v, _, _)| v == n))
        .filter(|n| !IGNORED_MULA_VARS.iter().any(|(v, _)| v == n))
        .map(|n| UnknownVariable {
            name: n.to_owned(),
            suggestion: nearest_variable(n),
        })
        .collect();
    unknown.sort_by(|a, b| a.name.cmp(&b.name));
    unknown
}

/// The read variable with the smallest edit distance to `name`, if that distance is small: at
/// most a quarter of the name's length, and at least 2 allowed.
fn nearest_variable(name: &str) -> Option<&'static str> {
    let most = (name.len() / 4).max(2);
    ENV_VARS
        .iter()
        .map(|(v, _, _)| (edit_distance(name, v), *v))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Where a key's value came from, for messages: its variable when that is set.
pub(super) fn source_of(key: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    ENV_VARS
        .iter()
        .find(|(var, k, _)| *k == key && env(var).is_some())
        .map(|(var, _, _)| format!(" (from {var})"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{generic, setting_keys};

    #[test]
    fn every_variable_the_readme_documents_is_read() {
        let readme = include_str!("../../README.md");
        let table = readme
            .lines()
            .filter(|l| l.starts_with("| `"))
            .take_while(|l| !l.starts_with("| `GET") && !l.starts_with("| `POST"));
        let mut named = 0;
        for line in table {
            let first = line.split(" | ").next().unwrap_or_default();
            for var in first.split('`').skip(1).step_by(2) {
                named += 1;
                assert!(
                    ENV_VARS.iter().any(|(v, _, _)| *v == var),
                    "the README documents {var}, which the configuration does not read"
                );
            }
        }
        assert!(
            named >= ENV_VARS.len(),
            "{named} variables found in the README's table"
        );
    }
    #[test]
    fn the_readme_documents_every_environment_variable() {
        let readme = include_str!("../../README.md");
        for (var, key, _) in ENV_VARS {
            assert!(readme.contains(var), "README lacks {var}");
            assert!(
                readme.contains(key.split('.').next().unwrap_or(key)),
                "README lacks {key}"
            );
        }
    }
    #[test]
    fn every_setting_has_a_variable_or_a_stated_reason() {
        let keys = setting_keys();
        assert!(keys.len() > 60, "{keys:?}");
        for key in &keys {
            let by_variable = ENV_VARS.iter().any(|(_, k, _)| generic(k) == *key);
            let file_only = FILE_ONLY.iter().any(|(k, _)| k == key);
            assert!(
                by_variable != file_only,
                "{key}: no variable sets it and FILE_ONLY gives no reason (or both)"
            );
        }
        for (_, key, _) in ENV_VARS {
            assert!(keys.contains(&generic(key)), "{key} is not a setting");
        }
    }
    #[test]
    fn a_misspelt_variable_is_reported_with_the_nearest_name_and_mulas_ignored_ones_are_not() {
        let unknown = unknown_variables([
            "SCHEDULER_API_PROT",
            "SCHEDULER_API_PORT",
            "SCHEDULER_DEBUG",
            "SCHEDULER_PQ_INTERVAL",
            "PATH",
            "SCHEDULER_SOMETHING_ELSE_ENTIRELY",
        ]);
        assert_eq!(
            unknown,
            [
                UnknownVariable {
                    name: "SCHEDULER_API_PROT".into(),
                    suggestion: Some("SCHEDULER_API_PORT"),
                },
                UnknownVariable {
                    name: "SCHEDULER_SOMETHING_ELSE_ENTIRELY".into(),
                    suggestion: None,
                },
            ]
        );
        assert_eq!(
            unknown[0].to_string(),
            "SCHEDULER_API_PROT is not a setting of kat-scheduler; it is ignored (did you mean \
             SCHEDULER_API_PORT?)"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
    #[test]
    fn mulas_ignored_variables_are_not_read_and_the_readme_names_each() {
        let readme = include_str!("../../README.md");
        for (var, why) in IGNORED_MULA_VARS {
            assert!(!ENV_VARS.iter().any(|(v, _, _)| v == var), "{var} is read");
            assert!(!why.is_empty());
            assert!(readme.contains(&format!("`{var}`")), "README lacks {var}");
        }
        for (key, _) in FILE_ONLY {
            assert!(readme.contains(&format!("`{key}`")), "README lacks {key}");
        }
    }
}
