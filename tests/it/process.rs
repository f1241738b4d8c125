//! The binary as users and supervisors run it: the README's first command on a fresh machine
//! (no configuration at all, an empty directory: it serves on its embedded default, an SQLite
//! file under `./data/` it creates, and keeps what it acknowledged across a restart), a stop
//! after its log pipe is gone, stops on PostgreSQL as soon as it listens, and its text logs as a
//! pipe (`docker logs`, journald) gets them.

use std::time::Duration;

use serde_json::Value;

use crate::child::ChildApp;
use crate::helpers::*;

/// POSTs `body` (or nothing) to `address` + `path`.
async fn post(address: &str, path: &str, body: Option<&Value>) -> reqwest::Response {
    let request = reqwest::Client::new().post(format!("{address}{path}"));
    let request = match body {
        Some(b) => request.json(b),
        None => request,
    };
    request.send().await.unwrap()
}

/// Starts the binary in `dir` on its defaults, off the test's runtime (it waits for the child).
async fn start_in(dir: std::path::PathBuf) -> ChildApp {
    tokio::task::spawn_blocking(move || ChildApp::start_in(&dir, &[]))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_with_no_configuration_serves_from_an_empty_directory_and_keeps_its_work() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!dir.path().join("data").exists());

    let app = start_in(dir.path().to_owned()).await;
    let push = boefje_push("org", "nmap", Some("Hostname|internet|a.example"), 3);
    let resp = post(&app.address, "/schedulers/boefje/push", Some(&push)).await;
    assert_eq!(resp.status(), 201);
    let pushed: Value = resp.json().await.unwrap();
    let id = pushed["id"]
        .as_str()
        .expect("the push answered a task")
        .to_owned();
    assert!(
        dir.path().join("data/scheduler.db").is_file(),
        "the default database file is ./data/scheduler.db"
    );
    assert!(
        tokio::task::spawn_blocking(move || app.terminate())
            .await
            .unwrap(),
        "a clean stop exits 0"
    );

    // A second start on the same directory finds the task and pops it.
    let app = start_in(dir.path().to_owned()).await;
    let resp = post(&app.address, "/schedulers/boefje/pop", None).await;
    assert_eq!(resp.status(), 200);
    let popped: Value = resp.json().await.unwrap();
    assert_eq!(popped["results"][0]["id"], id.as_str(), "{popped}");
    assert!(
        tokio::task::spawn_blocking(move || app.terminate())
            .await
            .unwrap()
    );
}

/// A log collector that goes away must not take the service with it: log lines that meet the
/// broken pipe are dropped, requests are served, and SIGTERM still stops it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_log_pipe_is_gone_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let app = tokio::task::spawn_blocking(move || ChildApp::start_in_then_close_log(&path))
        .await
        .unwrap();
    // A 404 (an unknown scheduler), a push and a pop are served.
    let resp = post(&app.address, "/schedulers/nope/pop", None).await;
    assert_eq!(resp.status(), 404);
    let push = boefje_push("org", "nmap", Some("Hostname|internet|b.example"), 3);
    let resp = post(&app.address, "/schedulers/boefje/push", Some(&push)).await;
    assert_eq!(resp.status(), 201);
    let resp = post(&app.address, "/schedulers/boefje/pop", None).await;
    assert_eq!(resp.status(), 200);
    assert!(
        tokio::task::spawn_blocking(move || app.terminate_within(Duration::from_secs(30)))
            .await
            .unwrap(),
        "SIGTERM stops the service cleanly although its log pipe is closed"
    );
}

/// A supervisor that stops the service as soon as it listens (a rollout that is rolled back, a
/// health check that gives up) must see it exit cleanly, every time. The pool used to open a
/// spare connection on a thread of its own whenever a checkout took the last idle one, and the
/// service's last checkout (releasing its schedulers) did: a process that exited while that
/// connection was in its TLS handshake with PostgreSQL crashed in OpenSSL's exit handler
/// (SIGSEGV, 2 of 25 quick starts and stops in the pending benchmark). The pool keeps no spare
/// connection since, and the service waits at exit for any connection still being opened (one
/// such stop in ten failed once more on CI before it did). It is a race, so this stops the binary
/// ten times; each exit must be a clean one, and a failure says how it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_stopped_as_soon_as_it_listens_exits_cleanly_every_time() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    for round in 0..10 {
        let uri = db.uri.clone();
        let stopped = tokio::task::spawn_blocking(move || {
            ChildApp::start(&uri, &[]).stop_within(Duration::from_secs(30))
        })
        .await
        .unwrap();
        if let Err(how) = stopped {
            panic!("stop {round}: the service did not exit cleanly: {how}");
        }
    }
}

/// The binary in a fresh directory with text logs on a pipe, every line kept.
struct TextLogs {
    process: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
    _dir: tempfile::TempDir,
}

impl TextLogs {
    fn start(env: &[(&str, &str)]) -> TextLogs {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(crate::child::binary());
        cmd.current_dir(dir.path())
            .env_remove("SCHEDULER_DB_URI")
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .env("SCHEDULER_API_HOST", "127.0.0.1")
            .env("SCHEDULER_API_PORT", "0")
            .env("SCHEDULER_API_WORKERS", "1")
            .env("SCHEDULER_LOGGING_FORMAT", "text")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut process = cmd.spawn().unwrap();
        let stderr = process.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let show = std::env::var("TEST_LOG").is_ok();
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if show {
                    eprintln!("child: {line}");
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        TextLogs {
            process,
            lines,
            seen: Vec::new(),
            _dir: dir,
        }
    }

    /// The first line (from now on) that holds `needle`, within `bound`.
    fn wait_for(&mut self, needle: &str, bound: Duration) -> Option<String> {
        let until = std::time::Instant::now() + bound;
        loop {
            let left = until.checked_duration_since(std::time::Instant::now())?;
            let line = self.lines.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if line.contains(needle) {
                return Some(line);
            }
        }
    }

    /// SIGTERM, then every line the process wrote.
    fn stop(mut self) -> Vec<String> {
        let pid = self.process.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let _ = self.process.wait();
        // The reader ends with the pipe.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        self.seen
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_on_a_pipe_carry_no_colour_no_blank_line_and_no_error_for_a_clients_bad_request()
{
    let logs = tokio::task::spawn_blocking(|| {
        let mut logs = TextLogs::start(&[]);
        let listening = logs
            .wait_for(" listening ", Duration::from_secs(60))
            .expect("the service listens");
        let address = listening
            .split("address=")
            .nth(1)
            .expect("the address")
            .trim()
            .to_owned();
        // A request line that is not HTTP: the client's fault, answered 400.
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(&address).unwrap();
        conn.write_all(b"GET /a b c HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        logs.stop()
    })
    .await
    .unwrap();

    assert!(logs.len() > 5, "{logs:?}");
    for line in &logs {
        assert!(
            !line.contains('\u{1b}'),
            "an escape code on a pipe: {line:?}"
        );
        assert!(!line.trim().is_empty(), "a blank line in {logs:#?}");
        assert!(!line.contains(" ERROR "), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_rabbitmq_password_is_logged_as_a_refused_login_never_as_a_lost_connection() {
    let Some(url) = rabbitmq().await else {
        return;
    };
    let parsed: lapin::uri::AMQPUri = url.parse().unwrap();
    let vhost = if parsed.vhost == "/" {
        "%2f".to_owned()
    } else {
        parsed.vhost.clone()
    };
    let wrong = format!(
        "amqp://{}:not-the-password@{}:{}/{vhost}",
        parsed.authority.userinfo.username, parsed.authority.host, parsed.authority.port
    );
    let logs = tokio::task::spawn_blocking(move || {
        let mut logs = TextLogs::start(&[("QUEUE_URI", &wrong)]);
        let refused = logs.wait_for("refused the login", Duration::from_secs(30));
        // The second attempt comes a second after the first.
        let again = logs.wait_for("refused the login", Duration::from_secs(30));
        (refused, again, logs.stop())
    })
    .await
    .unwrap();

    let (refused, again, lines) = logs;
    let refused = refused.unwrap_or_else(|| panic!("no refusal logged: {lines:#?}"));
    assert!(refused.contains(" WARN "), "{refused}");
    assert!(
        refused.contains(&format!(
            "RabbitMQ refused the login for user {}: ACCESS_REFUSED",
            parsed.authority.userinfo.username
        )),
        "{refused}"
    );
    assert!(refused.contains("retry_in_ms=1000"), "{refused}");
    let again = again.unwrap_or_else(|| panic!("no second attempt: {lines:#?}"));
    assert!(again.contains("retry_in_ms=2000"), "backs off: {again}");
    for line in &lines {
        assert!(!line.contains("lost"), "{line}");
        assert!(!line.contains("not-the-password"), "{line}");
        assert!(
            !line.contains(" ERROR "),
            "one WARN per attempt only: {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_variable_is_named_in_a_warning_with_the_nearest_name_and_mulas_are_not() {
    let (warning, lines) = tokio::task::spawn_blocking(|| {
        let mut logs = TextLogs::start(&[
            ("SCHEDULER_API_PROT", "8001"),
            ("SCHEDULER_PQ_INTERVAL", "60"),
        ]);
        let warning = logs.wait_for("SCHEDULER_API_PROT", Duration::from_secs(60));
        let _ = logs.wait_for(" listening ", Duration::from_secs(60));
        (warning, logs.stop())
    })
    .await
    .unwrap();
    let warning = warning.unwrap_or_else(|| panic!("no warning: {lines:#?}"));
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(
        warning.contains("did you mean SCHEDULER_API_PORT?"),
        "{warning}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("SCHEDULER_PQ_INTERVAL")),
        "mula's ignored variable is not warned about"
    );
}

#[test]
fn help_names_the_variables_table_and_where_the_data_goes() {
    let out = std::process::Command::new(crate::child::binary())
        .arg("--help")
        .output()
        .expect("the binary runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("README's \"Configuration\" section"),
        "{help}"
    );
    assert!(help.contains("./data/scheduler.db"), "{help}");
    assert!(help.contains("docs/config.example.toml"), "{help}");
}

#[test]
fn a_database_that_refuses_is_reported_on_one_line_without_blank_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(crate::child::binary())
        .current_dir(dir.path())
        // Port 1: nothing listens, so libpq's message (a hint after a line break, a line break at
        // the end) is what is reported.
        .env("SCHEDULER_DB_URI", "postgresql://postgres@127.0.0.1:1/x")
        .env("SCHEDULER_DB_CONNECT_TIMEOUT", "1")
        .env("SCHEDULER_LOGGING_FORMAT", "text")
        .env("SCHEDULER_API_PORT", "0")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Connection refused"), "{stderr}");
    for line in stderr.lines() {
        assert!(!line.trim().is_empty(), "a blank line in {stderr:?}");
        assert!(!line.starts_with('\t'), "an orphaned line in {stderr:?}");
    }
}
