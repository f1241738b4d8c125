//! The home of the service's background processes: the AMQP listener, ColdStart, the catalogue
//! refresh and the cron ticks (whose tables hold the lease watchdog). Each is an async `run(deps, token)` that returns at a safe
//! point once its token is cancelled. Startup registers them in their stop order, and shutdown
//! stops them one by one in that order, each within a deadline, after the HTTP server has drained
//! and before the queue engines finish the commands they hold.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The running background processes, in stop order.
#[derive(Default)]
pub struct Processes {
    running: Vec<Running>,
}

struct Running {
    name: &'static str,
    token: CancellationToken,
    join: JoinHandle<()>,
}

impl Processes {
    /// Starts `run` with a token of its own; the process stops after those registered before it.
    pub fn spawn<F>(&mut self, name: &'static str, run: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = CancellationToken::new();
        let join = tokio::spawn(run(token.clone()));
        info!(process = name, "started");
        self.running.push(Running { name, token, join });
    }

    /// The names of the running processes, in stop order.
    pub fn names(&self) -> Vec<&'static str> {
        self.running.iter().map(|p| p.name).collect()
    }

    /// Stops every process: all are told at once (so a process waiting on a hung dependency
    /// starts winding down while the ones before it finish), then awaited in order, all within
    /// one `deadline` together; one still running then is aborted and logged. Aborting is safe:
    /// each process resumes from what it committed (the listener's unacked messages go back to
    /// RabbitMQ, ColdStart resumes at its checkpoint, a fire whose push did not commit fires
    /// again), and it is what cancels an outbound call that hangs.
    pub async fn stop(self, deadline: Duration) {
        for p in &self.running {
            p.token.cancel();
        }
        let until = tokio::time::Instant::now() + deadline;
        for p in self.running {
            let abort = p.join.abort_handle();
            match tokio::time::timeout_at(until, p.join).await {
                Ok(Ok(())) => info!(process = p.name, "stopped"),
                Ok(Err(e)) => warn!(process = p.name, error = %e, "ended abnormally"),
                Err(_) => {
                    abort.abort();
                    warn!(
                        process = p.name,
                        deadline_ms = deadline.as_millis() as u64,
                        "did not stop in time; aborted"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn every_process_is_told_at_once_so_none_waits_for_the_one_before_it() {
        // The first process can only wind down once the second has been told to stop: told one
        // after the other, the first would run into the deadline and be aborted.
        let done = Arc::new(Mutex::new(Vec::new()));
        let second_told = CancellationToken::new();
        let mut ps = Processes::default();
        let (d, told) = (done.clone(), second_told.clone());
        ps.spawn("listener", move |token| async move {
            token.cancelled().await;
            told.cancelled().await;
            d.lock().unwrap().push("listener");
        });
        let (d, told) = (done.clone(), second_told.clone());
        ps.spawn("ticks", move |token| async move {
            token.cancelled().await;
            told.cancel();
            d.lock().unwrap().push("ticks");
        });
        assert_eq!(ps.names(), vec!["listener", "ticks"]);
        ps.stop(Duration::from_secs(30)).await;
        let mut done = done.lock().unwrap().clone();
        done.sort();
        assert_eq!(
            done,
            vec!["listener", "ticks"],
            "both returned, none aborted"
        );
    }

    #[tokio::test]
    async fn a_process_that_ignores_its_token_is_aborted_at_the_deadline() {
        let mut ps = Processes::default();
        ps.spawn("stuck", |_token| std::future::pending::<()>());
        let started = std::time::Instant::now();
        ps.stop(Duration::from_millis(50)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
