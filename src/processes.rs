//! The home of the service's background processes: the AMQP listener, ColdStart, the catalogue
//! refresh and the cron ticks (whose tables hold the lease watchdog). Each is an async `run(deps, token)` that returns at a safe
//! point once its token is cancelled. Startup registers them in their stop order, and shutdown
//! stops them one by one in that order, each within a deadline, after the HTTP server has drained
//! and before the queue engines finish the commands they hold.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

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
    /// A process that panics, or returns while its token is not cancelled, is started again
    /// after a pause (1 s doubling to a minute), logged as an error: a background process that
    /// died would otherwise leave its work undone (events unconsumed, nothing rescheduled) in a
    /// service that still answers, until someone restarts it. What it held is safe to start
    /// again from, as after an abort (see [`Self::stop`]).
    pub fn spawn<F>(
        &mut self,
        name: &'static str,
        run: impl Fn(CancellationToken) -> F + Send + 'static,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = CancellationToken::new();
        let join = tokio::spawn(supervise(name, run, token.clone()));
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

/// First pause before a process that died is started again; it doubles per death in a row.
const RESTART_FIRST: Duration = Duration::from_secs(1);
/// Longest pause between two starts of a process that keeps dying.
const RESTART_CAP: Duration = Duration::from_secs(60);

/// Aborts the task it holds when dropped: a supervisor aborted at the stop deadline takes its
/// process with it.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `run` until `token` is cancelled, starting it again whenever it dies before that.
async fn supervise<F>(
    name: &'static str,
    run: impl Fn(CancellationToken) -> F,
    token: CancellationToken,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let mut pause = RESTART_FIRST;
    loop {
        let started = tokio::time::Instant::now();
        let mut task = AbortOnDrop(tokio::spawn(run(token.clone())));
        let ended = (&mut task.0).await;
        // Deaths "in a row": one that ran a while since the last starts the pauses over.
        if started.elapsed() >= RESTART_CAP {
            pause = RESTART_FIRST;
        }
        if token.is_cancelled() {
            if let Err(e) = ended
                && e.is_panic()
            {
                warn!(process = name, panic = %panic_text(e), "panicked while stopping");
            }
            return;
        }
        match ended {
            Ok(()) => {
                error!(
                    process = name,
                    restart_in_secs = pause.as_secs(),
                    "ended on its own; starting it again"
                );
            }
            Err(e) => {
                error!(process = name, panic = %panic_text(e), restart_in_secs = pause.as_secs(), "panicked; starting it again");
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RESTART_CAP);
    }
}

/// What a task that ended abnormally said: its panic's message, if it was a panic with one.
fn panic_text(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return e.to_string();
    }
    let payload = e.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
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
        ps.spawn("listener", move |token| {
            let (d, told) = (d.clone(), told.clone());
            async move {
                token.cancelled().await;
                told.cancelled().await;
                d.lock().unwrap().push("listener");
            }
        });
        let (d, told) = (done.clone(), second_told.clone());
        ps.spawn("ticks", move |token| {
            let (d, told) = (d.clone(), told.clone());
            async move {
                token.cancelled().await;
                told.cancel();
                d.lock().unwrap().push("ticks");
            }
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

    #[tokio::test(start_paused = true)]
    async fn a_process_that_panics_is_started_again_until_it_is_told_to_stop() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let starts = Arc::new(AtomicUsize::new(0));
        let (second, mut started_again) = tokio::sync::mpsc::unbounded_channel();
        let mut ps = Processes::default();
        let n = starts.clone();
        ps.spawn("listener", move |token| {
            let (n, second) = (n.clone(), second.clone());
            async move {
                if n.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("a bug in the first session");
                }
                let _ = second.send(());
                token.cancelled().await;
            }
        });
        // Virtual time: the restart's pause passes at once, and so would this bound.
        tokio::time::timeout(Duration::from_secs(600), started_again.recv())
            .await
            .expect("started again within the pause")
            .expect("the process' sender lives");
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        ps.stop(Duration::from_secs(30)).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            2,
            "not started again once told to stop"
        );
    }

    #[tokio::test]
    async fn an_aborted_process_is_dropped_with_its_supervisor() {
        struct Dropped(Arc<Mutex<bool>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = true;
            }
        }
        let dropped = Arc::new(Mutex::new(false));
        let mut ps = Processes::default();
        let d = dropped.clone();
        ps.spawn("stuck", move |_token| {
            let guard = Dropped(d.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
            }
        });
        ps.stop(Duration::from_millis(50)).await;
        // The abort reaches the process' own task as it is dropped, on the runtime's time.
        for _ in 0..100 {
            if *dropped.lock().unwrap() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(
            *dropped.lock().unwrap(),
            "the process' task was aborted too"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_pause_before_a_restart_starts_over_after_a_process_ran_a_while() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let n = Arc::new(AtomicUsize::new(0));
        let mut ps = Processes::default();
        let count = n.clone();
        ps.spawn("listener", move |token| {
            let (count, started) = (count.clone(), started.clone());
            async move {
                let i = count.fetch_add(1, Ordering::SeqCst);
                let _ = started.send(tokio::time::Instant::now());
                match i {
                    // Dies at once three times, then runs two minutes and dies, then stays.
                    0..=2 => {}
                    3 => tokio::time::sleep(Duration::from_secs(120)).await,
                    _ => token.cancelled().await,
                }
            }
        });
        let mut at = Vec::new();
        for _ in 0..5 {
            let t = tokio::time::timeout(Duration::from_secs(3600), starts.recv())
                .await
                .expect("started")
                .expect("sender lives");
            at.push(t);
        }
        let gaps: Vec<u64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
        // 1, 2, 4 s after quick deaths; after two minutes' run, 1 s again.
        assert_eq!(gaps, [1, 2, 4, 121]);
        ps.stop(Duration::from_secs(30)).await;
    }
}
