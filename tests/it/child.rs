//! The real `kat-scheduler` binary as a child process, for tests that kill it.
//!
//! The binary is the one cargo built for this test run (`CARGO_BIN_EXE_kat-scheduler`), or the
//! path in `KAT_SCHEDULER_BIN` (CI points it at the release build).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running service process.
pub struct ChildApp {
    process: Child,
    pub address: String,
    /// Every log line the service wrote (JSON), as it comes.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

pub(crate) fn binary() -> String {
    std::env::var("KAT_SCHEDULER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kat-scheduler").to_owned())
}

impl ChildApp {
    /// Starts the binary on `db_uri` (port 0) and waits until it listens.
    pub fn start(db_uri: &str, env: &[(&str, &str)]) -> ChildApp {
        let mut cmd = Command::new(binary());
        cmd.env("SCHEDULER_DB_URI", db_uri);
        Self::launch(cmd, env, false)
    }

    /// Starts the binary in `dir` on its default database (no URI given), as a user's first
    /// `cargo run` does, and waits until it listens.
    pub fn start_in(dir: &std::path::Path, env: &[(&str, &str)]) -> ChildApp {
        let mut cmd = Command::new(binary());
        cmd.current_dir(dir).env_remove("SCHEDULER_DB_URI");
        Self::launch(cmd, env, false)
    }

    /// As [`ChildApp::start_in`], then closes the read end of the service's log pipe, as when a
    /// log collector goes away: the service's later log lines meet a broken pipe.
    pub fn start_in_then_close_log(dir: &std::path::Path) -> ChildApp {
        let mut cmd = Command::new(binary());
        cmd.current_dir(dir).env_remove("SCHEDULER_DB_URI");
        Self::launch(cmd, &[], true)
    }

    fn launch(mut cmd: Command, env: &[(&str, &str)], close_log: bool) -> ChildApp {
        cmd.env("SCHEDULER_API_HOST", "127.0.0.1")
            .env("SCHEDULER_API_PORT", "0")
            .env("SCHEDULER_API_WORKERS", "2")
            .env("SCHEDULER_LOGGING_FORMAT", "json")
            .env("SCHEDULER_WATCHDOG_INTERVAL", "0")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut process = cmd.spawn().expect("the binary starts");
        let stderr = process.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let show = std::env::var("TEST_LOG").is_ok();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if show {
                    eprintln!("child: {line}");
                }
                kept.lock().unwrap().push(line.clone());
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && v["message"] == "listening"
                {
                    let _ = tx.send(v["address"].as_str().unwrap_or_default().to_owned());
                    if close_log {
                        break;
                    }
                }
            }
        });
        let address = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the child listens (run with TEST_LOG=1 to see its log)");
        ChildApp {
            process,
            address: format!("http://{address}"),
            log,
        }
    }

    /// The log lines written so far whose message is `message`.
    pub fn logged(&self, message: &str) -> Vec<serde_json::Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Every log line written so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until this instance owns all three schedulers (on PostgreSQL, a restart after a
    /// SIGKILL waits for the dead process's leases to lapse; on SQLite it owns them at once).
    pub async fn wait_owning_all(&self) {
        let client = reqwest::Client::new();
        let started = std::time::Instant::now();
        loop {
            let page = client
                .get(format!("{}/metrics", self.address))
                .send()
                .await
                .expect("metrics")
                .text()
                .await
                .expect("metrics text");
            let owned = page
                .lines()
                .filter(|l| l.starts_with("scheduler_ownership_owned{") && l.ends_with(" 1"))
                .count();
            if owned == 3 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the instance did not take its schedulers over: {owned} of 3"
            );
            // Polling interval while the old leases lapse, not a wait for a state.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill_9(mut self) {
        self.process.kill().expect("kill");
        self.process.wait().expect("reap");
    }

    /// SIGTERM, then waits up to `bound`; returns whether it exited cleanly in time (a process
    /// still running then is killed).
    pub fn terminate_within(self, bound: Duration) -> bool {
        self.stop_within(bound).is_ok()
    }

    /// SIGTERM, then waits up to `bound`: `Ok` for a clean exit, else how it ended (the exit
    /// code or the signal, or still running at the bound) with the last lines it logged.
    pub fn stop_within(mut self, bound: Duration) -> Result<(), String> {
        use std::os::unix::process::ExitStatusExt;
        let pid = self.process.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(sent.success());
        let started = std::time::Instant::now();
        let ended = loop {
            if let Some(status) = self.process.try_wait().expect("wait") {
                if status.success() {
                    return Ok(());
                }
                break match (status.code(), status.signal()) {
                    (Some(code), _) => format!("exited with code {code}"),
                    (_, Some(sig)) => format!(
                        "killed by signal {sig}{}",
                        if status.core_dumped() {
                            " (core dumped)"
                        } else {
                            ""
                        }
                    ),
                    _ => format!("ended: {status}"),
                };
            }
            if started.elapsed() > bound {
                let _ = self.process.kill();
                let _ = self.process.wait();
                break format!("still running {bound:?} after SIGTERM");
            }
            // Polling the child's exit, not a wait for a state of our own.
            std::thread::sleep(Duration::from_millis(20));
        };
        let lines = self.log_lines();
        let tail = lines[lines.len().saturating_sub(8)..].join("\n");
        Err(format!("{ended}; its last log lines:\n{tail}"))
    }

    /// SIGTERM, then waits (a minute at most); returns whether it exited cleanly.
    pub fn terminate(self) -> bool {
        self.terminate_within(Duration::from_secs(60))
    }
}

/// A test that fails before it stops its service does not leave the process running.
impl Drop for ChildApp {
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}
