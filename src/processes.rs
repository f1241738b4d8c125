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

    /// Stops every process in order, giving each `deadline` to return; one that does not is
    /// aborted and logged.
    pub async fn stop(self, deadline: Duration) {
        for p in self.running {
            p.token.cancel();
            let abort = p.join.abort_handle();
            match tokio::time::timeout(deadline, p.join).await {
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
    async fn processes_stop_in_the_order_they_were_registered() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut ps = Processes::default();
        for name in ["listener", "ticks"] {
            let order = order.clone();
            ps.spawn(name, move |token| async move {
                token.cancelled().await;
                order.lock().unwrap().push(name);
            });
        }
        assert_eq!(ps.names(), vec!["listener", "ticks"]);
        ps.stop(Duration::from_secs(5)).await;
        assert_eq!(*order.lock().unwrap(), vec!["listener", "ticks"]);
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
