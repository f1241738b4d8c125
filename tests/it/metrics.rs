//! `/metrics`: what the service counts, read back from the page an operator's Prometheus scrapes,
//! and the Grafana dashboard in docs/ built only on what the page serves.

use std::collections::{BTreeSet, HashMap};

use chrono::Duration;
use kat_scheduler::domain::SchedulerId;
use serde_json::{Value, json};

use crate::helpers::*;

/// The page's samples: `name{labels}` → value.
fn samples(page: &str) -> HashMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The families the page declares (`# TYPE name kind`).
fn families(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// The families the page declares with their type (`# TYPE name kind`).
fn types(page: &str) -> BTreeSet<(String, String)> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

async fn metrics(app: &TestApp) -> String {
    let resp = app.get("/metrics").await;
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    // Served as the format it is written in, so Prometheus parses it with the right parser.
    assert_eq!(
        resp.headers()[reqwest::header::CONTENT_TYPE],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    resp.text().await.unwrap()
}

fn leases(s: &mut kat_scheduler::config::Settings) {
    s.queue.dispatch_timeout_secs = 60;
    s.queue.max_attempts = 3;
}

async fn requests_transitions_batches_and_ages_are_counted(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    let mut ids = Vec::new();
    for (i, p) in [3, 5, 7].into_iter().enumerate() {
        ids.push(id_of(
            &app.push_ok("report", &report_push("org1", &format!("r{i}"), p))
                .await,
        ));
    }
    // The same work again, no sooner: refused as a duplicate (409), not an error.
    let again = app.push("report", &report_push("org1", "r0", 3)).await;
    assert_eq!(again.status(), reqwest::StatusCode::CONFLICT);
    app.advance(Duration::seconds(90));
    let m = samples(&metrics(&app).await);
    assert_eq!(m["scheduler_qsize{scheduler_id=\"report\"}"], 3.0);
    assert_eq!(
        m["scheduler_oldest_queued_age_seconds{scheduler_id=\"report\"}"], 90.0,
        "the three waited 90 s on the service's clock"
    );
    assert_eq!(
        m["scheduler_oldest_queued_age_seconds{scheduler_id=\"boefje\"}"], 0.0,
        "an empty heap has no age"
    );
    assert_eq!(
        m["scheduler_requests_total{scheduler_id=\"report\",op=\"push\",outcome=\"ok\"}"],
        3.0
    );
    assert_eq!(
        m["scheduler_requests_total{scheduler_id=\"report\",op=\"push\",outcome=\"refused\"}"],
        1.0
    );
    assert_eq!(
        m["scheduler_requests_total{scheduler_id=\"report\",op=\"push\",outcome=\"error\"}"], 0.0,
        "a duplicate is no error"
    );
    assert_eq!(
        m["scheduler_task_transitions_total{scheduler_id=\"report\",status=\"queued\"}"],
        3.0
    );

    let popped = app.pop_ok("report", 2, None).await;
    assert_eq!(popped.len(), 2);
    let done = id_of(&popped[0]);
    assert_eq!(
        app.patch_task(&done, &json!({"status": "completed"}))
            .await
            .status(),
        reqwest::StatusCode::OK
    );
    // completed → running is not an edge of the state machine: refused, and counted so (not as
    // an error).
    assert!(
        app.patch_task(&done, &json!({"status": "running"}))
            .await
            .status()
            .is_client_error()
    );
    // The second popped task is never started: its lease ends.
    app.advance(Duration::seconds(61));
    assert_eq!(app.sweep().await.requeued.len(), 1);

    let page = metrics(&app).await;
    let m = samples(&page);
    let report = |name: &str, labels: &str| {
        m.get(&format!("{name}{{scheduler_id=\"report\"{labels}}}"))
            .copied()
            .unwrap_or_else(|| panic!("{name} {labels} missing:\n{page}"))
    };
    assert_eq!(
        report("scheduler_requests_total", ",op=\"pop\",outcome=\"ok\""),
        1.0
    );
    assert_eq!(
        report("scheduler_requests_total", ",op=\"patch\",outcome=\"ok\""),
        1.0
    );
    assert_eq!(
        report(
            "scheduler_requests_total",
            ",op=\"patch\",outcome=\"refused\""
        ),
        1.0
    );
    assert_eq!(
        report(
            "scheduler_requests_total",
            ",op=\"patch\",outcome=\"error\""
        ),
        0.0
    );
    assert_eq!(
        report("scheduler_request_duration_seconds_count", ",op=\"pop\""),
        1.0
    );
    assert_eq!(
        report(
            "scheduler_request_duration_seconds_bucket",
            ",op=\"patch\",le=\"+Inf\""
        ),
        2.0
    );
    assert_eq!(
        report("scheduler_task_transitions_total", ",status=\"dispatched\""),
        2.0
    );
    assert_eq!(
        report("scheduler_task_transitions_total", ",status=\"completed\""),
        1.0
    );
    assert_eq!(
        report("scheduler_task_transitions_total", ",status=\"queued\""),
        4.0,
        "three pushes and one re-queue after the lease ended"
    );
    assert_eq!(
        report("scheduler_lease_expiries_total", ",outcome=\"requeued\""),
        1.0
    );
    assert_eq!(
        report("scheduler_lease_expiries_total", ",outcome=\"failed\""),
        0.0
    );
    // Every push, pop, patch and expiry was a committed command.
    assert!(report("scheduler_batch_commands_count", "") >= 5.0);
    assert_eq!(
        m["scheduler_requests_total{scheduler_id=\"boefje\",op=\"pop\",outcome=\"ok\"}"],
        0.0
    );
    assert!(m["scheduler_db_pool_max"] >= 1.0);
    assert_eq!(m["scheduler_listener_up"], 0.0, "no listener configured");
}

async fn cron_entries_report_their_runs(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let report = app.tick(SchedulerId::Boefje).await;
    assert!(report.entries["reschedule"].ran);
    let m = samples(&metrics(&app).await);
    assert_eq!(
        m["scheduler_cron_duration_seconds_count{component=\"boefje\",entry=\"reschedule\"}"],
        1.0
    );
    assert_eq!(
        m["scheduler_cron_failures_total{component=\"boefje\",entry=\"reschedule\"}"],
        0.0
    );
    assert_eq!(
        m["scheduler_cron_lag_seconds{component=\"boefje\",entry=\"reschedule\"}"], 0.0,
        "the tick ran at its own time"
    );
    assert!(
        !m.contains_key(
            "scheduler_cron_duration_seconds_count{component=\"normalizer\",entry=\"reschedule\"}"
        ),
        "the normalizer table has no reschedule entry"
    );
}

async fn the_page_serves_exactly_the_documented_families(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.tick(SchedulerId::Boefje).await;
    let page = metrics(&app).await;
    let served = families(&page);
    let catalogue: BTreeSet<String> = kat_scheduler::metrics::CATALOGUE
        .iter()
        .map(|f| f.name.to_owned())
        .collect();
    assert_eq!(served, catalogue);
    let typed: BTreeSet<(String, String)> = kat_scheduler::metrics::CATALOGUE
        .iter()
        .map(|f| (f.name.to_owned(), f.kind.to_string()))
        .collect();
    assert_eq!(types(&page), typed, "each family has the catalogue's type");
}

/// Units Prometheus' conventions replace by a base unit (promtool's lint: seconds and bytes).
const NON_BASE_UNITS: [&str; 14] = [
    "milliseconds",
    "microseconds",
    "nanoseconds",
    "minutes",
    "hours",
    "days",
    "weeks",
    "kilobytes",
    "megabytes",
    "gigabytes",
    "kibibytes",
    "mebibytes",
    "percent",
    "millis",
];
/// Abbreviated units promtool's lint refuses as a word of a name.
const ABBREVIATED_UNITS: [&str; 12] = [
    "ms", "us", "ns", "sec", "secs", "kb", "mb", "gb", "b", "min", "h", "d",
];

/// What promtool's `check metrics` would say of `page`, checked without promtool: each family
/// has a HELP and a TYPE, a valid snake_case name, `_total` on counters and only there, no
/// `_count`/`_sum`/`_bucket` outside histograms, base units, and no sample label Prometheus sets
/// itself (`instance`, `job`).
fn lint(page: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut helped = BTreeSet::new();
    let mut typed = HashMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            if help.trim().is_empty() {
                problems.push(format!("{name}: no help text"));
            }
            helped.insert(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            typed.insert(name.to_owned(), kind.to_owned());
        } else if !line.is_empty() && !line.starts_with('#') {
            let labels = line
                .split_once('{')
                .map(|(_, l)| l.split_once('}').map_or(l, |(l, _)| l))
                .unwrap_or("");
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let key = pair.split('=').next().unwrap_or("");
                if ["instance", "job"].contains(&key) {
                    problems.push(format!("label {key} is Prometheus' own: {line}"));
                }
            }
        }
    }
    for (name, kind) in &typed {
        if !helped.contains(name) {
            problems.push(format!("{name}: no HELP"));
        }
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            problems.push(format!("{name}: not a snake_case name"));
        }
        let total = name.ends_with("_total");
        match kind.as_str() {
            "counter" if !total => problems.push(format!("{name}: a counter without _total")),
            "counter" | "gauge" | "histogram" => {}
            other => problems.push(format!("{name}: unknown type {other}")),
        }
        if total && kind != "counter" {
            problems.push(format!("{name}: _total on a {kind}"));
        }
        if kind != "histogram"
            && ["_count", "_sum", "_bucket"]
                .iter()
                .any(|s| name.ends_with(s))
        {
            problems.push(format!("{name}: a histogram's suffix on a {kind}"));
        }
        for word in name.split('_') {
            if NON_BASE_UNITS.contains(&word) {
                problems.push(format!("{name}: {word} is not a base unit"));
            }
            if ABBREVIATED_UNITS.contains(&word) {
                problems.push(format!("{name}: {word} is an abbreviated unit"));
            }
        }
    }
    problems
}

async fn the_page_keeps_to_prometheus_naming_rules(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.tick(SchedulerId::Boefje).await;
    let page = metrics(&app).await;
    let problems = lint(&page);
    assert!(problems.is_empty(), "{problems:#?}");
    // promtool itself, where it is installed (Debian: the prometheus package); CI has none.
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(page.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) => eprintln!("SKIPPED promtool check metrics: promtool not found ({e})"),
    }
}

#[test]
fn the_lint_finds_what_promtool_finds() {
    let page = "# HELP a_microseconds_total x\n# TYPE a_microseconds_total counter\n\
                a_microseconds_total 1\n# HELP b_count x\n# TYPE b_count counter\nb_count 1\n\
                # HELP c x\n# TYPE c gauge\nc{instance=\"i\"} 1\n# TYPE d_ms gauge\nd_ms 1\n";
    let problems = lint(page).join("\n");
    for expected in [
        "a_microseconds_total: microseconds is not a base unit",
        "b_count: a counter without _total",
        "b_count: a histogram's suffix on a counter",
        "label instance is Prometheus' own",
        "d_ms: no HELP",
        "d_ms: ms is an abbreviated unit",
    ] {
        assert!(problems.contains(expected), "{expected} not in {problems}");
    }
}

async fn mulas_task_status_counts_count_the_table(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for i in 0..3 {
        app.push_ok("report", &report_push("org1", &format!("r{i}"), 3))
            .await;
    }
    let popped = app.pop_ok("report", 1, None).await;
    let done = id_of(&popped[0]);
    app.patch_task(&done, &json!({"status": "completed"})).await;
    let m = samples(&metrics(&app).await);
    let count = |s: &str, status: &str| {
        m[&format!("scheduler_task_status_counts{{scheduler_id=\"{s}\",status=\"{status}\"}}")]
    };
    assert_eq!(count("report", "queued"), 2.0);
    assert_eq!(count("report", "completed"), 1.0);
    assert_eq!(
        count("report", "dispatched"),
        0.0,
        "every status is written"
    );
    assert_eq!(count("boefje", "queued"), 0.0);
    // And mula's queue size, under its own name.
    assert_eq!(m["scheduler_qsize{scheduler_id=\"report\"}"], 2.0);
}

/// A count that takes longer than a scrape waits (here: the table locked by another session)
/// still lands, and the next scrape serves it rather than the count from before the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_count_slower_than_a_scrape_is_served_by_the_next() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    app.push_ok("report", &report_push("org1", "r1", 3)).await;
    // Another session takes the table: counting it waits until that session ends.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let db = app.db.uri.clone();
    let holder = std::thread::spawn(move || {
        use diesel::{Connection, connection::SimpleConnection};
        let mut conn = diesel::PgConnection::establish(&db).unwrap();
        conn.batch_execute("BEGIN; LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        conn.batch_execute("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    let key = "scheduler_task_status_counts{scheduler_id=\"report\",status=\"queued\"}";
    let first = samples(&metrics(&app).await);
    assert!(
        !first.contains_key(key),
        "the table could not be counted yet: {:?}",
        first.get(key)
    );
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    // Well within the counts' period of a minute: this is the count the first scrape started.
    let second = samples(&metrics(&app).await);
    assert_eq!(
        second.get(key),
        Some(&1.0),
        "the count that outlived a scrape"
    );
}

async fn http_answers_and_the_process_are_counted(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    assert_eq!(app.get("/schedulers/nope").await.status(), 404);
    assert_eq!(app.get("/schedulers").await.status(), 200);
    let m = samples(&metrics(&app).await);
    assert!(m["scheduler_http_responses_total{status_class=\"4xx\"}"] >= 1.0);
    assert!(m["scheduler_http_responses_total{status_class=\"2xx\"}"] >= 1.0);
    assert_eq!(
        m["scheduler_http_responses_total{status_class=\"5xx\"}"],
        0.0
    );
    for service in ["katalogus", "octopoes", "bytes"] {
        for kind in ["unreachable", "status", "decode"] {
            let key = format!(
                "scheduler_dependency_failures_total{{service=\"{service}\",kind=\"{kind}\"}}"
            );
            assert!(m.contains_key(&key), "{key} missing");
        }
    }
    if cfg!(target_os = "linux") {
        assert!(m["process_resident_memory_bytes"] > 1e6);
        assert!(m["process_open_fds"] >= 3.0);
        assert!(m["process_max_fds"] >= m["process_open_fds"]);
        assert!(m["process_cpu_seconds_total"] > 0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = m["process_start_time_seconds"];
        assert!(
            started <= now + 1.0 && started > now - 86_400.0,
            "started at {started}, now {now}"
        );
    }
}

/// The metric names a PromQL expression reads: identifiers that are not functions (followed by
/// `(`), keywords, or inside label matchers, ranges, strings or a `by (...)`-style label list.
fn names_in(expr: &str) -> Vec<String> {
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    // Aggregations may put their `by (...)` before the parenthesis: `sum by (le) (...)`.
    const OTHER_KEYWORDS: [&str; 16] = [
        "bool", "offset", "and", "or", "unless", "sum", "min", "max", "avg", "count", "stddev",
        "stdvar", "topk", "bottomk", "quantile", "group",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let skip_to = |from: usize, close: char| {
        let mut j = from;
        while j < chars.len() && chars[j] != close {
            j += 1;
        }
        j + 1
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '"' => i = skip_to(i + 1, '"'),
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let call = chars.get(next) == Some(&'(');
                if LABEL_LISTS.contains(&word.as_str()) && call {
                    i = skip_to(next, ')');
                } else if !call
                    && !LABEL_LISTS.contains(&word.as_str())
                    && !OTHER_KEYWORDS.contains(&word.as_str())
                {
                    out.push(word);
                }
            }
            _ => i += 1,
        }
    }
    out
}

async fn the_dashboard_reads_only_metrics_the_page_serves(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.tick(SchedulerId::Boefje).await;
    let page = metrics(&app).await;
    let served = families(&page);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana/kat-scheduler.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10, "a dashboard of {} queries", exprs.len());
    let named = families_read(&exprs, &served, "the dashboard");
    // Its variables: Prometheus' own target label, and the scheduler; every query keeps to the
    // instances chosen (ownership aside, which is the cluster's).
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(variables.contains(&"instance"), "{variables:?}");
    assert!(variables.contains(&"scheduler"), "{variables:?}");
    for expr in &exprs {
        assert!(
            expr.contains("$instance") || expr.contains("scheduler_ownership_owned"),
            "{expr} ignores the instance variable"
        );
    }
    // And the families an operator runs the service by are on it.
    for needed in [
        "scheduler_qsize",
        "scheduler_pending",
        "scheduler_oldest_queued_age_seconds",
        "scheduler_request_duration_seconds",
        "scheduler_task_transitions_total",
        "scheduler_lease_expiries_total",
        "scheduler_batch_commands",
        "scheduler_listener_lag_messages",
        "scheduler_coldstart_objects",
        "scheduler_cron_lag_seconds",
        "scheduler_db_pool_connections",
        "scheduler_task_status_counts",
        "scheduler_http_responses_total",
        "scheduler_dependency_failures_total",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ] {
        assert!(named.contains(needed), "the dashboard leaves out {needed}");
    }
}

/// The families `exprs` read (a histogram's `_bucket`, `_sum` and `_count` as the histogram),
/// each of them checked to be in `served`.
fn families_read(exprs: &[String], served: &BTreeSet<String>, source: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for expr in exprs {
        let names = names_in(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        for name in names {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| served.contains(*f)))
                .unwrap_or(&name)
                .to_owned();
            assert!(
                served.contains(&family),
                "{source} reads {name} ({expr}), which /metrics does not serve"
            );
            named.insert(family);
        }
    }
    named
}

#[test]
fn the_alert_rules_read_only_catalogued_metrics_and_cover_what_an_operator_acts_on() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/alerts.yaml");
    let rules = std::fs::read_to_string(path).unwrap();
    // Each expression is on one line (the file says so), so no YAML parser is needed.
    let exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| e.trim().to_owned())
        .collect();
    assert!(
        exprs.iter().all(|e| !e.is_empty() && e != "|" && e != ">"),
        "an expression over several lines: {exprs:?}"
    );
    let catalogue: BTreeSet<String> = kat_scheduler::metrics::CATALOGUE
        .iter()
        .map(|f| f.name.to_owned())
        .collect();
    let named = families_read(&exprs, &catalogue, "alerts.yaml");
    for needed in [
        "scheduler_oldest_queued_age_seconds",
        "scheduler_requests_total",
        "scheduler_listener_lag_messages",
        "scheduler_lease_expiries_total",
        "scheduler_ownership_owned",
        "scheduler_dependency_failures_total",
    ] {
        assert!(named.contains(needed), "no alert reads {needed}");
    }
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("scheduler_requests_total{outcome=\"error\"}")),
        "the error rate alert counts errors, not refusals"
    );
    // promtool itself, where it is installed (Debian: the prometheus package); CI has none.
    match std::process::Command::new("promtool")
        .args(["check", "rules", path])
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("SKIPPED promtool check rules: promtool not found ({e})"),
    }
}

#[test]
fn promql_names_are_found_and_functions_left_out() {
    assert_eq!(
        names_in(
            "histogram_quantile(0.99, sum by (le, op) (rate(scheduler_request_duration_seconds_bucket{op=\"pop\"}[5m])))"
        ),
        vec!["scheduler_request_duration_seconds_bucket"]
    );
    assert_eq!(
        names_in(
            "sum without (state) (scheduler_db_pool_connections) / ignoring(state) group_left scheduler_db_pool_max"
        ),
        vec!["scheduler_db_pool_connections", "scheduler_db_pool_max"]
    );
}

crate::backend_tests!(
    requests_transitions_batches_and_ages_are_counted,
    the_page_keeps_to_prometheus_naming_rules,
    mulas_task_status_counts_count_the_table,
    http_answers_and_the_process_are_counted,
    cron_entries_report_their_runs,
    the_page_serves_exactly_the_documented_families,
    the_dashboard_reads_only_metrics_the_page_serves,
);
