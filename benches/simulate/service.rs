//! The real service in process, on the simulation's `ManualClock`, and the HTTP calls the day
//! makes of it. Started again on the same database after the mid-day crash.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use kat_scheduler::clock::{Clock, ManualClock};
use kat_scheduler::config::Settings;
use kat_scheduler::cron::{Cron, Tick};
use kat_scheduler::domain::SchedulerId;
use kat_scheduler::queue::Broker;
use kat_scheduler::startup::Application;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Result;

/// A running instance of the service.
pub struct Service {
    pub address: String,
    pub client: reqwest::Client,
    pub broker: Broker,
    cron: Cron,
    clock: Arc<ManualClock>,
    token: CancellationToken,
    join: JoinHandle<anyhow::Result<()>>,
}

impl Service {
    /// Builds the service (migrations, heap rebuild, ownership of the schedulers) and serves.
    pub async fn start(settings: &Settings, clock: Arc<ManualClock>) -> Result<Service> {
        let app = Application::build(settings.clone(), clock.clone())
            .await
            .map_err(|e| format!("the service did not start: {e:#}"))?;
        let address = format!("http://127.0.0.1:{}", app.port());
        let broker = app.broker().clone();
        let cron = app.cron();
        let token = CancellationToken::new();
        let join = tokio::spawn(app.run_until_stopped(token.clone()));
        Ok(Service {
            address,
            // A hung request fails the run rather than stalling it.
            client: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()?,
            broker,
            cron,
            clock,
            token,
            join,
        })
    }

    /// Stops the service and waits until it has.
    pub async fn stop(self) -> Result<()> {
        self.token.cancel();
        self.join
            .await?
            .map_err(|e| format!("the service did not stop cleanly: {e:#}"))?;
        Ok(())
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Runs each scheduler's cron table for a tick at the clock's time, as the ticks generator
    /// does (the simulation's settings turn the generator off: its ticks are on wall time).
    pub async fn tick(&self) {
        for component in SchedulerId::ALL {
            self.cron
                .run(Tick {
                    component,
                    seq: 0,
                    at: self.clock.now(),
                })
                .await;
        }
    }

    /// One request; answers the status and the JSON body (`Null` when there is none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.address));
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok((status, json))
    }

    /// A call that must answer `want`.
    pub async fn call_ok(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        want: u16,
    ) -> Result<Value> {
        let (status, json) = self.call(method.clone(), path, body).await?;
        if status != want {
            return Err(format!("{method} {path} answered {status}, not {want}: {json}").into());
        }
        Ok(json)
    }
}
