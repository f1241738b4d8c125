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

async fn metrics(app: &TestApp) -> String {
    let resp = app.get("/metrics").await;
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
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
    // completed → running is not an edge of the state machine: refused, and counted so.
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
            ",op=\"patch\",outcome=\"error\""
        ),
        1.0
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
    let served = families(&metrics(&app).await);
    let catalogue: BTreeSet<String> = kat_scheduler::metrics::CATALOGUE
        .iter()
        .map(|f| f.name.to_owned())
        .collect();
    assert_eq!(served, catalogue);
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
    let mut named = BTreeSet::new();
    for expr in &exprs {
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
                "the dashboard reads {name} ({expr}), which /metrics does not serve"
            );
            named.insert(family);
        }
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
    ] {
        assert!(named.contains(needed), "the dashboard leaves out {needed}");
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
    cron_entries_report_their_runs,
    the_page_serves_exactly_the_documented_families,
    the_dashboard_reads_only_metrics_the_page_serves,
);
