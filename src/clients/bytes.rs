//! Bytes: when a boefje last ran on an object (`GET /bytes/boefje_meta`), which mula checks
//! before pushing a boefje task again, and its health.
//!
//! Bytes wants a bearer token from `POST /token`. As mula, the client logs in on first use and
//! again when a call is answered 401, then retries that call once; expiry is not tracked. The
//! password and the token never reach Debug output, a log or an error.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Deserializer};
use tokio::sync::Mutex;
use tracing::debug;
use uuid::Uuid;

use super::http::{Backoff, Call, ClientError, ServiceClient};

/// The service's name in errors and logs.
pub const SERVICE: &str = "bytes";

/// A boefje run as Bytes recorded it; the fields the scheduler reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BoefjeMeta {
    /// The run's id (the boefje task's id).
    pub id: Uuid,
    /// When it started; absent if it has not.
    #[serde(default, deserialize_with = "utc_or_naive")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended; absent while it runs.
    #[serde(default, deserialize_with = "utc_or_naive")]
    pub ended_at: Option<DateTime<Utc>>,
    /// The boefje that ran.
    #[serde(default)]
    pub boefje: Option<BoefjeRef>,
}

/// The boefje of a run, as Bytes records it (`{"id": "dns-records", "version": null}`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BoefjeRef {
    /// The boefje's id.
    pub id: String,
}

/// The Bytes client.
pub struct Bytes {
    http: ServiceClient,
    username: String,
    password: String,
    /// The token of the last login; the lock also makes concurrent callers share one login.
    token: Mutex<Option<String>>,
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes")
            .field("http", &self.http)
            .field("username", &self.username)
            .field("password", &"***")
            .finish_non_exhaustive()
    }
}

impl Bytes {
    /// A client of Bytes at `base` (`http://bytes:8000`) logging in as `username`; `timeout`
    /// bounds each try.
    pub fn new(
        base: &str,
        username: &str,
        password: &str,
        timeout: Duration,
    ) -> Result<Self, String> {
        Ok(Self {
            http: ServiceClient::new(SERVICE, base, timeout)?,
            username: username.to_owned(),
            password: password.to_owned(),
            token: Mutex::new(None),
        })
    }

    /// The same client with other retries.
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        Self {
            http: self.http.with_backoff(backoff),
            ..self
        }
    }

    /// The latest run of `boefje_id` on `input_ooi` for `organization`, if Bytes has one
    /// (`GET /bytes/boefje_meta?boefje_id=&input_ooi=&organization=&limit=1&descending=true`).
    ///
    /// Without an `input_ooi` the parameter is left out, which Bytes reads as "no input object".
    /// (mula sends it empty, which matches no run, since Bytes stores a missing input as null.)
    /// A 404 is `None`.
    pub async fn last_boefje_meta(
        &self,
        boefje_id: &str,
        input_ooi: Option<&str>,
        organization: &str,
    ) -> Result<Option<BoefjeMeta>, ClientError> {
        let runs = self
            .boefje_metas(organization, input_ooi, Some(boefje_id), 1)
            .await?;
        Ok(runs.into_iter().next())
    }

    /// The latest `limit` runs on `input_ooi` for `organization`, of `boefje_id` or of every
    /// boefje when it is `None`, newest start first (Bytes orders by `started_at`). A 404 is
    /// no run.
    pub async fn boefje_metas(
        &self,
        organization: &str,
        input_ooi: Option<&str>,
        boefje_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<BoefjeMeta>, ClientError> {
        let limit = limit.to_string();
        let mut query = Vec::with_capacity(5);
        if let Some(boefje) = boefje_id {
            query.push(("boefje_id", boefje));
        }
        if let Some(ooi) = input_ooi {
            query.push(("input_ooi", ooi));
        }
        query.extend([
            ("organization", organization),
            ("limit", limit.as_str()),
            ("descending", "true"),
        ]);
        let url = self.http.url(&["bytes", "boefje_meta"], &query);
        let body = match self.authorized_get(&url).await {
            Err(ClientError::NotFound { .. }) => return Ok(Vec::new()),
            other => other?,
        };
        self.http.decode(&url, &body)
    }

    /// Whether Bytes answers `GET /health` with 2xx and, if it says, `healthy: true`.
    pub async fn health(&self) -> bool {
        self.http.healthy(&["health"]).await
    }

    /// GETs `url` with the token; on 401 logs in again and retries once.
    async fn authorized_get(&self, url: &reqwest::Url) -> Result<Vec<u8>, ClientError> {
        let token = self.token(None).await?;
        match self.http.send(Call::get(url).bearer(&token)).await {
            Err(ClientError::Status { status: 401, .. }) => {
                debug!(service = SERVICE, "token refused, logging in again");
                let token = self.token(Some(&token)).await?;
                self.http.send(Call::get(url).bearer(&token)).await
            }
            other => other,
        }
    }

    /// The current token, logging in when there is none or it is still `refused` (another
    /// caller may have logged in meanwhile).
    async fn token(&self, refused: Option<&str>) -> Result<String, ClientError> {
        let mut current = self.token.lock().await;
        if let Some(t) = current.as_deref()
            && Some(t) != refused
        {
            return Ok(t.to_owned());
        }
        #[derive(Deserialize)]
        struct Token {
            access_token: String,
        }
        let url = self.http.url(&["token"], &[]);
        let form = [
            ("username", self.username.as_str()),
            ("password", self.password.as_str()),
        ];
        let body = self.http.send(Call::post_form(&url, &form)).await?;
        let token: Token = self.http.decode(&url, &body)?;
        debug!(service = SERVICE, user = %self.username, "logged in");
        *current = Some(token.access_token.clone());
        Ok(token.access_token)
    }
}

/// An ISO-8601 time with an offset, or without one read as UTC; null is none.
fn utc_or_naive<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(&text) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(&text, f).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or_else(|| serde::de::Error::custom(format!("not an ISO-8601 time: {text}")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use chrono::TimeZone;

    use super::super::http::stub::{Stub, closed_port};
    use super::*;

    fn bytes(stub: &Stub) -> Bytes {
        Bytes::new(&stub.base, "scheduler", "s3cr3t-pw", Duration::from_secs(5))
            .unwrap()
            .with_backoff(Backoff {
                attempts: 2,
                base: Duration::from_millis(1),
                cap: Duration::from_millis(2),
            })
    }

    const META: &str = r#"[{"id": "6f1a3f5e-9b4c-4d8e-8a57-0f6b2a1c9d10",
        "started_at": "2025-01-02T03:04:05.123456+00:00", "ended_at": "2025-01-02T03:05:00",
        "boefje": {"id": "dns-records", "version": null},
        "input_ooi": "Hostname|internet|example.com", "arguments": {},
        "organization": "org1", "runnable_hash": null, "environment": {}}]"#;

    /// Bytes with tokens `t1`, `t2`, … per login, accepting only the latest.
    fn bytes_stub() -> Stub {
        let logins = Arc::new(AtomicUsize::new(0));
        Stub::start(move |s| match s.path.as_str() {
            "/token" => {
                let n = logins.fetch_add(1, Ordering::SeqCst) + 1;
                (
                    200,
                    format!(
                        r#"{{"access_token":"t{n}","token_type":"bearer","expires_at":"2025-01-02T04:00:00"}}"#
                    ),
                )
            }
            "/bytes/boefje_meta" => {
                let latest = format!("bearer t{}", logins.load(Ordering::SeqCst));
                if s.authorization.as_deref() != Some(latest.as_str()) {
                    (401, r#"{"detail":"Invalid token"}"#.into())
                } else if s
                    .query_pairs()
                    .iter()
                    .any(|(k, v)| k == "organization" && v == "org9")
                {
                    (404, r#"{"detail":"Not Found"}"#.into())
                } else if s
                    .query_pairs()
                    .iter()
                    .any(|(k, v)| k == "organization" && v == "org2")
                {
                    (200, "[]".into())
                } else {
                    (200, META.into())
                }
            }
            _ => (404, "{}".into()),
        })
    }

    #[tokio::test]
    async fn the_first_call_logs_in_and_reads_the_latest_run() {
        let stub = bytes_stub();
        let b = bytes(&stub);
        let meta = b
            .last_boefje_meta("dns-records", Some("Hostname|internet|example.com"), "org1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            meta,
            BoefjeMeta {
                id: "6f1a3f5e-9b4c-4d8e-8a57-0f6b2a1c9d10".parse().unwrap(),
                started_at: Some(
                    Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap()
                        + chrono::Duration::microseconds(123_456)
                ),
                ended_at: Some(Utc.with_ymd_and_hms(2025, 1, 2, 3, 5, 0).unwrap()),
                boefje: Some(BoefjeRef {
                    id: "dns-records".into()
                }),
            }
        );
        let seen = stub.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            (seen[0].method.as_str(), seen[0].path.as_str()),
            ("POST", "/token")
        );
        assert_eq!(
            seen[0].content_type.as_deref(),
            Some("application/x-www-form-urlencoded")
        );
        assert_eq!(
            seen[0].form_pairs(),
            [("username", "scheduler"), ("password", "s3cr3t-pw")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(seen[1].authorization.as_deref(), Some("bearer t1"));
        assert_eq!(
            seen[1].query_pairs(),
            [
                ("boefje_id", "dns-records"),
                ("input_ooi", "Hostname|internet|example.com"),
                ("organization", "org1"),
                ("limit", "1"),
                ("descending", "true"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        // The token is kept: a second call does not log in.
        b.last_boefje_meta("dns-records", None, "org2")
            .await
            .unwrap();
        let seen = stub.seen();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2].authorization.as_deref(), Some("bearer t1"));
        assert!(
            seen[2].query_pairs().iter().all(|(k, _)| k != "input_ooi"),
            "no input object: the parameter is left out"
        );
    }

    #[tokio::test]
    async fn a_refused_token_logs_in_again_and_the_call_is_retried_once() {
        let stub = bytes_stub();
        let b = bytes(&stub);
        b.last_boefje_meta("dns-records", None, "org2")
            .await
            .unwrap();
        // Another client logs in as the same user: this client's token t1 is now refused.
        bytes(&stub).token(None).await.unwrap();
        let meta = b
            .last_boefje_meta("dns-records", None, "org1")
            .await
            .unwrap();
        assert!(meta.is_some());
        let calls: Vec<(String, Option<String>)> = stub
            .seen()
            .into_iter()
            .map(|s| (s.path, s.authorization))
            .collect();
        let call = |p: &str, a: Option<&str>| (p.to_owned(), a.map(str::to_owned));
        assert_eq!(
            calls,
            [
                call("/token", None),
                call("/bytes/boefje_meta", Some("bearer t1")),
                call("/token", None),
                call("/bytes/boefje_meta", Some("bearer t1")),
                call("/token", None),
                call("/bytes/boefje_meta", Some("bearer t3")),
            ]
        );
    }

    #[tokio::test]
    async fn no_run_or_a_404_is_none_and_bad_credentials_are_an_error_without_the_password() {
        let stub = bytes_stub();
        let b = bytes(&stub);
        assert_eq!(b.last_boefje_meta("x", None, "org2").await.unwrap(), None);
        assert_eq!(b.last_boefje_meta("x", None, "org9").await.unwrap(), None);

        let refusing =
            Stub::start(|_| (401, r#"{"detail":"Incorrect username or password"}"#.into()));
        let b = bytes(&refusing);
        let err = b.last_boefje_meta("x", None, "org1").await.unwrap_err();
        assert_eq!(err.status(), Some(401));
        assert!(
            err.to_string().starts_with("bytes /token: HTTP 401"),
            "{err}"
        );
        assert!(!err.to_string().contains("s3cr3t"));
        assert_eq!(refusing.seen().len(), 1, "a refused login is not retried");
    }

    #[tokio::test]
    async fn the_password_never_shows_in_debug_output() {
        let stub = bytes_stub();
        let b = bytes(&stub);
        b.last_boefje_meta("x", None, "org1").await.unwrap();
        let shown = format!("{b:?}");
        assert!(shown.contains("scheduler"), "{shown}");
        assert!(!shown.contains("s3cr3t-pw"), "{shown}");
        assert!(!shown.contains("t1"), "{shown}");
    }

    #[tokio::test]
    async fn health_reads_bytes_health() {
        let stub = Stub::start(|s| match s.path.as_str() {
            "/health" => (200, r#"{"service":"bytes","healthy":true}"#.into()),
            _ => (404, "{}".into()),
        });
        assert!(bytes(&stub).health().await);
        assert!(stub.seen()[0].authorization.is_none());
        let down = Bytes::new(
            &format!("http://127.0.0.1:{}", closed_port()),
            "u",
            "p",
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(!down.health().await);
    }
}
