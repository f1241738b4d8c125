//! What every service client shares: one `reqwest` client per service with the timeout and the
//! `User-Agent`, URLs built from a base plus percent-encoded segments and repeated query pairs,
//! retries, and the one error type.
//!
//! Retries follow mula: only a transport failure (refused, reset, timed out) is retried, with
//! exponential backoff; an HTTP status is an answer and is never retried. A health check tries
//! once, so `/health` stays quick when a service is down.
//!
//! This module must not know any service's paths or JSON shapes; those live in one file per
//! service. Errors name the service and the URL path, never the query, the host's credentials or
//! a response beyond a short excerpt.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::{Client, Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use tracing::debug;

/// Sent with every request, so a service's logs name the caller.
pub const USER_AGENT: &str = concat!("kat-scheduler/", env!("CARGO_PKG_VERSION"));
/// Default tries of one call (the first plus retries), as mula's five.
pub const DEFAULT_ATTEMPTS: u32 = 5;
/// Default wait before the first retry; it doubles with each further one.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default longest wait between two tries (mula's 60 s).
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Characters of an unexpected response's body kept in an error.
pub const EXCERPT_CHARS: usize = 200;

/// How long an idle connection to a service is kept for the next call.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Why a base URL is refused when it is `https://`: no TLS stack is compiled in.
pub const HTTPS_REFUSED: &str =
    "https is not built in: use http on the internal network or a TLS-terminating proxy";

/// The services whose failures are counted, in label order.
pub const SERVICES: [&str; 3] = ["katalogus", "octopoes", "bytes"];
/// The kinds of failure counted, in label order: no answer, an answer outside 2xx (404 aside:
/// callers read it as "none"), a 2xx body not as promised.
pub const FAILURE_KINDS: [&str; 3] = ["unreachable", "status", "decode"];

/// Failed calls by service and kind, for `scheduler_dependency_failures_total`. Process-wide
/// rather than in [`crate::metrics::Metrics`]: the clients are built from the settings in
/// several places (the catalogue, the lookups, ColdStart, health checks), and a service's
/// failures are the process' whatever client met them. Tests read increases, never totals.
static FAILURES: [[AtomicU64; 3]; 3] = [const { [const { AtomicU64::new(0) }; 3] }; 3];

/// Failed calls to `service` of `kind` (see [`SERVICES`], [`FAILURE_KINDS`]) so far.
pub fn failures(service: &str, kind: &str) -> u64 {
    let s = SERVICES.iter().position(|x| *x == service);
    let k = FAILURE_KINDS.iter().position(|x| *x == kind);
    match (s, k) {
        (Some(s), Some(k)) => FAILURES[s][k].load(Ordering::Relaxed),
        _ => 0,
    }
}

/// Counts a failed call of `error`'s kind (a 404 is an answer, not counted).
pub(crate) fn count_failure(error: &ClientError) {
    let (service, kind) = match error {
        ClientError::Unreachable { service, .. } => (service, 0),
        ClientError::Status { service, .. } => (service, 1),
        ClientError::Decode { service, .. } => (service, 2),
        ClientError::NotFound { .. } => return,
    };
    if let Some(s) = SERVICES.iter().position(|x| x == service) {
        FAILURES[s][kind].fetch_add(1, Ordering::Relaxed);
    }
}

/// How often and how patiently a call is retried after a transport failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Tries in all, at least one.
    pub attempts: u32,
    /// Wait before the first retry; doubled for each further retry.
    pub base: Duration,
    /// Longest wait between two tries.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            attempts: DEFAULT_ATTEMPTS,
            base: DEFAULT_BACKOFF_BASE,
            cap: DEFAULT_BACKOFF_CAP,
        }
    }
}

/// How long a dependency that failed (Octopoes' lookups, Bytes' runs) is left alone before it
/// is asked again: 5 s after the first failure in a row, doubling to 5 min.
pub const OUTAGE: Backoff = Backoff {
    attempts: 1,
    base: Duration::from_secs(5),
    cap: Duration::from_secs(300),
};

impl Backoff {
    /// [`Self::delay`] as a span of calendar time, for a retry time on the service's clock.
    pub fn wait(&self, failed: u32) -> chrono::Duration {
        chrono::Duration::from_std(self.delay(failed)).unwrap_or(chrono::Duration::MAX)
    }

    /// The wait after failed try number `failed` (1-based): `base × 2^(failed-1)`, at most `cap`.
    pub fn delay(&self, failed: u32) -> Duration {
        let factor = 2u32.saturating_pow(failed.saturating_sub(1));
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// A call to a service that did not give the expected answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// No HTTP answer: refused, reset or timed out on every try.
    #[error("{service} unreachable ({path}, {attempts} tries): {reason}")]
    Unreachable {
        /// The service (`katalogus`, `octopoes`, `bytes`).
        service: &'static str,
        /// The URL path called.
        path: String,
        /// Tries made.
        attempts: u32,
        /// The last transport error.
        reason: String,
    },
    /// A 404: callers map it to "none" where the service means that.
    #[error("{service} {path}: not found (404)")]
    NotFound {
        /// The service.
        service: &'static str,
        /// The URL path called.
        path: String,
        /// The `detail` of a JSON body (`{"detail": "…"}`, as the platform's FastAPI services
        /// answer), which tells the service's own 404 from a proxy's or a router's.
        detail: Option<String>,
    },
    /// Any other status outside 2xx.
    #[error("{service} {path}: HTTP {status}: {excerpt}")]
    Status {
        /// The service.
        service: &'static str,
        /// The URL path called.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body, at most [`EXCERPT_CHARS`] characters.
        excerpt: String,
    },
    /// A 2xx answer whose body is not what the service's API promises.
    #[error("{service} {path}: unexpected response: {error}")]
    Decode {
        /// The service.
        service: &'static str,
        /// The URL path called.
        path: String,
        /// What is wrong, with the JSON path where it is.
        error: String,
    },
}

impl ClientError {
    /// The HTTP status, when the service answered with one outside 2xx.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::NotFound { .. } => Some(404),
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Checks a service's base URL: `http://HOST[:PORT][/PATH]`. Messages never repeat the URL, which
/// may carry credentials.
pub fn parse_base(url: &str) -> Result<Url, String> {
    let mut parsed = Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    match parsed.scheme() {
        "http" => {}
        "https" => return Err(HTTPS_REFUSED.into()),
        other => {
            return Err(format!(
                "expected http://HOST[:PORT][/PATH], got {other}://"
            ));
        }
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("expected http://HOST[:PORT][/PATH]: no host".into());
    }
    parsed.set_query(None);
    parsed.set_fragment(None);
    Ok(parsed)
}

/// `url` with its password, if any, replaced by `***`, for Debug output.
pub fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Cannot fail: a URL with a password has a host.
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// The methods the clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Get,
    Post,
}

/// One request: method, URL and what it carries.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    method: Verb,
    url: &'a Url,
    bearer: Option<&'a str>,
    form: Option<&'a [(&'a str, &'a str)]>,
}

impl fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token and the form (a password) never reach a log.
        f.debug_struct("Call")
            .field("method", &self.method)
            .field("path", &self.url.path())
            .finish_non_exhaustive()
    }
}

impl<'a> Call<'a> {
    /// A GET of `url`.
    pub fn get(url: &'a Url) -> Self {
        Self {
            method: Verb::Get,
            url,
            bearer: None,
            form: None,
        }
    }

    /// A POST of `url` with a form-encoded body.
    pub fn post_form(url: &'a Url, form: &'a [(&'a str, &'a str)]) -> Self {
        Self {
            method: Verb::Post,
            url,
            bearer: None,
            form: Some(form),
        }
    }

    /// Sends `Authorization: bearer <token>`, as mula does for Bytes.
    pub fn bearer(self, token: &'a str) -> Self {
        Self {
            bearer: Some(token),
            ..self
        }
    }
}

/// One service's HTTP client.
#[derive(Clone)]
pub struct ServiceClient {
    /// The service's name in errors and logs.
    name: &'static str,
    /// Where it is; paths are appended to this.
    base: Url,
    /// Carries the timeout and the `User-Agent`; clones share one connection pool.
    client: Client,
    /// Retries after transport failures.
    backoff: Backoff,
}

impl fmt::Debug for ServiceClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceClient")
            .field("name", &self.name)
            .field("base", &redacted(&self.base))
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl ServiceClient {
    /// A client of service `name` at `base` (`http://` only); `timeout` bounds each try, from
    /// connecting to the last byte of the body.
    pub fn new(name: &'static str, base: &str, timeout: Duration) -> Result<Self, String> {
        let base = parse_base(base).map_err(|e| format!("{name}: {e}"))?;
        let client = Client::builder()
            .timeout(timeout)
            // Below the 5 s after which uvicorn, which serves the platform's services, closes
            // an idle connection: one it may be closing is not taken from the pool.
            .pool_idle_timeout(POOL_IDLE)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| format!("{name}: cannot build an HTTP client: {e}"))?;
        Ok(Self {
            name,
            base,
            client,
            backoff: Backoff::default(),
        })
    }

    /// The same client with other retries (tests keep them short).
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        Self { backoff, ..self }
    }

    /// The service's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The base URL followed by `segments`, each percent-encoded (a `/` in an organisation id
    /// stays inside its segment), then `query` in order; a key may repeat (`types=A&types=B`).
    pub fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// GETs `segments` with `query` and reads the JSON body as `T`.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, ClientError> {
        let url = self.url(segments, query);
        let body = self.send(Call::get(&url)).await?;
        self.decode(&url, &body)
    }

    /// Sends `call`, retrying transport failures; the body of a 2xx answer.
    pub async fn send(&self, call: Call<'_>) -> Result<Vec<u8>, ClientError> {
        let attempts = self.backoff.attempts.max(1);
        let (mut tried, mut redone) = (0, false);
        loop {
            tried += 1;
            match self.try_once(call, &mut redone).await {
                Ok((status, body)) => {
                    return self
                        .check(call.url, status, body)
                        .inspect_err(count_failure);
                }
                Err(reason) if tried >= attempts => {
                    let error = ClientError::Unreachable {
                        service: self.name,
                        path: call.url.path().to_owned(),
                        attempts: tried,
                        reason,
                    };
                    count_failure(&error);
                    return Err(error);
                }
                Err(reason) => {
                    let wait = self.backoff.delay(tried);
                    debug!(
                        service = self.name,
                        url.path = call.url.path(),
                        attempt = tried,
                        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        error = %reason,
                        "transport failure, retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Reads a 2xx body as JSON `T`; the error says where in the document it went wrong.
    pub fn decode<T: DeserializeOwned>(&self, url: &Url, body: &[u8]) -> Result<T, ClientError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(&mut de).map_err(|e| self.decode_error(url, e))
    }

    /// A [`ClientError::Decode`] for `url`.
    pub fn decode_error(&self, url: &Url, error: impl fmt::Display) -> ClientError {
        let error = ClientError::Decode {
            service: self.name,
            path: url.path().to_owned(),
            error: error.to_string(),
        };
        count_failure(&error);
        error
    }

    /// One try, no retries: whether `segments` answers 2xx and, when the body is a JSON object
    /// with `healthy`, that it is `true` (the platform's services answer `{"healthy": bool, …}`).
    pub async fn healthy(&self, segments: &[&str]) -> bool {
        let url = self.url(segments, &[]);
        let Ok((status, body)) = self.try_once(Call::get(&url), &mut false).await else {
            return false;
        };
        if !status.is_success() {
            return false;
        }
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(serde_json::Value::Object(map)) => map
                .get("healthy")
                .is_none_or(|h| h.as_bool().unwrap_or(false)),
            _ => true,
        }
    }

    /// One try: the status and body, or the transport error's text (without the URL).
    ///
    /// A request whose connection closed before any answer (most often a kept-alive one the
    /// server was closing as it arrived: uvicorn, which serves the platform's services, closes
    /// one idle for 5 s) is sent once more at once, once a call (`redone` says it was): that
    /// close says nothing of the service. Callers that try once (Octopoes' lookups, health
    /// checks) would otherwise count a healthy service as failing, and the rest would wait out
    /// a retry's backoff. Idle connections are not kept past [`POOL_IDLE`], so the race is rare
    /// to begin with.
    async fn try_once(
        &self,
        call: Call<'_>,
        redone: &mut bool,
    ) -> Result<(StatusCode, Vec<u8>), String> {
        match self.send_once(call).await {
            Err(Failure::Closed(reason)) if !*redone => {
                *redone = true;
                debug!(
                    service = self.name,
                    url.path = call.url.path(),
                    error = %reason,
                    "connection closed before an answer, sending again"
                );
                self.send_once(call).await.map_err(Failure::reason)
            }
            answer => answer.map_err(Failure::reason),
        }
    }

    async fn send_once(&self, call: Call<'_>) -> Result<(StatusCode, Vec<u8>), Failure> {
        let method = match call.method {
            Verb::Get => Method::GET,
            Verb::Post => Method::POST,
        };
        let mut request = self.client.request(method, call.url.clone());
        if let Some(token) = call.bearer {
            request = request.header(reqwest::header::AUTHORIZATION, format!("bearer {token}"));
        }
        if let Some(form) = call.form {
            let body = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(form)
                .finish();
            request = request
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(body);
        }
        let response = request.send().await.map_err(|e| {
            // hyper resends by itself a request that never left a reused connection; what
            // reaches here went out and met a close (or a reply that is not HTTP). Sending it
            // again is safe for the calls made: GETs, and Bytes' login, which only issues a
            // second token.
            if e.is_request() && !e.is_connect() && !e.is_timeout() {
                Failure::Closed(transport(e))
            } else {
                Failure::Other(transport(e))
            }
        })?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| Failure::Other(transport(e)))?;
        Ok((status, body.to_vec()))
    }

    fn check(&self, url: &Url, status: StatusCode, body: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        let path = url.path().to_owned();
        if status.is_success() {
            Ok(body)
        } else if status == StatusCode::NOT_FOUND {
            let detail = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("detail")?.as_str().map(str::to_owned));
            Err(ClientError::NotFound {
                service: self.name,
                path,
                detail,
            })
        } else {
            Err(ClientError::Status {
                service: self.name,
                path,
                status: status.as_u16(),
                // One line: a body's line breaks (most end with one) would break a log line
                // in two, or leave a blank one.
                excerpt: String::from_utf8_lossy(&body)
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(EXCERPT_CHARS)
                    .collect(),
            })
        }
    }
}

/// Why one send got no answer.
enum Failure {
    /// The connection closed after the request went out and before any answer.
    Closed(String),
    /// Anything else: refused, timed out, cut off mid-answer.
    Other(String),
}

impl Failure {
    fn reason(self) -> String {
        match self {
            Failure::Closed(r) | Failure::Other(r) => r,
        }
    }
}

/// A transport error's text with its causes (`error sending request: client error (Connect):
/// tcp connect error: Connection refused`), the URL left out.
fn transport(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        // A cause with no words of its own adds nothing but a dangling ": ".
        let words = cause.to_string();
        if !words.trim().is_empty() {
            text.push_str(": ");
            text.push_str(words.trim());
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
pub(crate) mod stub {
    //! A stub service for the clients' tests: the real app server on port 0, one handler that
    //! sees every request, and a record of what arrived.

    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use actix_web::dev::ServerHandle;
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

    /// One request as the stub received it.
    #[derive(Debug, Clone)]
    pub struct Seen {
        pub method: String,
        /// The path as sent, still percent-encoded.
        pub path: String,
        /// The raw query string.
        pub query: String,
        pub authorization: Option<String>,
        pub user_agent: Option<String>,
        pub content_type: Option<String>,
        pub body: String,
    }

    impl Seen {
        /// The query, decoded, in order (repeated keys kept).
        pub fn query_pairs(&self) -> Vec<(String, String)> {
            form_urlencoded::parse(self.query.as_bytes())
                .into_owned()
                .collect()
        }

        /// The form body, decoded.
        pub fn form_pairs(&self) -> Vec<(String, String)> {
            form_urlencoded::parse(self.body.as_bytes())
                .into_owned()
                .collect()
        }
    }

    type Handler = dyn Fn(&Seen) -> (u16, String) + Send + Sync;
    type State = (Arc<Mutex<Vec<Seen>>>, Arc<Handler>);

    /// A running stub; stops when dropped.
    pub struct Stub {
        /// `http://127.0.0.1:PORT`
        pub base: String,
        seen: Arc<Mutex<Vec<Seen>>>,
        handle: ServerHandle,
    }

    impl Stub {
        /// Serves `answer(request) -> (status, JSON body)` for every request.
        pub fn start(answer: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static) -> Self {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let answer: Arc<Handler> = Arc::new(answer);
            let state = (seen.clone(), answer);
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(web::Data::new(state.clone()))
                    .default_service(web::to(respond))
            })
            .workers(1)
            .disable_signals()
            .listen(listener)
            .unwrap()
            .run();
            let handle = server.handle();
            tokio::spawn(server);
            Self {
                base: format!("http://127.0.0.1:{port}"),
                seen,
                handle,
            }
        }

        /// Every request received so far, in order.
        pub fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }
    }

    impl Drop for Stub {
        fn drop(&mut self) {
            drop(self.handle.stop(false));
        }
    }

    async fn respond(req: HttpRequest, body: web::Bytes, state: web::Data<State>) -> HttpResponse {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let seen = Seen {
            method: req.method().to_string(),
            path: req.uri().path().to_owned(),
            query: req.query_string().to_owned(),
            authorization: header("authorization"),
            user_agent: header("user-agent"),
            content_type: header("content-type"),
            body: String::from_utf8_lossy(&body).into_owned(),
        };
        let (status, json) = (state.1)(&seen);
        state.0.lock().unwrap().push(seen);
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
            .content_type("application/json")
            .body(json)
    }

    /// A port nothing listens on.
    pub fn closed_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::stub::{Stub, closed_port};
    use super::*;

    fn quick() -> Backoff {
        Backoff {
            attempts: 3,
            base: Duration::from_millis(1),
            cap: Duration::from_millis(4),
        }
    }

    fn client(base: &str) -> ServiceClient {
        ServiceClient::new("katalogus", base, Duration::from_secs(5))
            .unwrap()
            .with_backoff(quick())
    }

    #[test]
    fn only_plain_http_base_urls_are_accepted() {
        assert_eq!(
            parse_base("https://katalogus:8000").unwrap_err(),
            HTTPS_REFUSED
        );
        let err =
            ServiceClient::new("bytes", "https://bytes:8000", Duration::from_secs(1)).unwrap_err();
        assert!(err.starts_with("bytes: https is not built in"), "{err}");
        assert!(parse_base("ftp://x").unwrap_err().contains("ftp://"));
        assert!(parse_base("katalogus:8000").is_err());
        let err = parse_base("http//user:secret@host").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        assert!(parse_base("http://katalogus:8000/prefix/").is_ok());
    }

    #[test]
    fn urls_encode_segments_and_repeat_query_keys_under_the_base_path() {
        let c = client("http://octopoes:8000/api/?dropped=1");
        let url = c.url(
            &["org 1/x", "objects"],
            &[
                ("types", "A"),
                ("types", "B"),
                ("valid_time", "2025-01-02T03:04:05+00:00"),
            ],
        );
        assert_eq!(
            url.as_str(),
            "http://octopoes:8000/api/org%201%2Fx/objects?types=A&types=B&valid_time=2025-01-02T03%3A04%3A05%2B00%3A00"
        );
        assert_eq!(
            client("http://k:1").url(&["health"], &[]).as_str(),
            "http://k:1/health"
        );
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_secs(1));
        assert_eq!(b.delay(2), Duration::from_secs(2));
        assert_eq!(b.delay(4), Duration::from_secs(8));
        assert_eq!(b.delay(10), Duration::from_secs(60));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_json_answer_is_read_and_the_user_agent_is_sent() {
        let stub = Stub::start(|_| (200, r#"{"a": [1, 2]}"#.into()));
        let v: serde_json::Value = client(&stub.base).get_json(&["x"], &[]).await.unwrap();
        assert_eq!(v["a"][1], 2);
        let seen = stub.seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].method, "GET");
        assert_eq!(seen[0].path, "/x");
        assert_eq!(
            seen[0].user_agent.as_deref(),
            Some(concat!("kat-scheduler/", env!("CARGO_PKG_VERSION")))
        );
    }

    #[tokio::test]
    async fn a_status_is_an_answer_and_is_not_retried() {
        let long = "e".repeat(500);
        let body = format!(r#"{{"detail":"{long}"}}"#);
        let stub = Stub::start(move |s| match s.path.as_str() {
            "/missing" => (404, r#"{"detail":"Unknown organisation"}"#.into()),
            _ => (500, body.clone()),
        });
        let c = client(&stub.base);
        let err = c
            .get_json::<serde_json::Value>(&["boom"], &[("q", "1")])
            .await
            .unwrap_err();
        let ClientError::Status {
            service,
            path,
            status,
            excerpt,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(
            (*service, path.as_str(), *status),
            ("katalogus", "/boom", 500)
        );
        assert_eq!(excerpt.chars().count(), EXCERPT_CHARS);
        assert!(
            err.to_string()
                .starts_with("katalogus /boom: HTTP 500: {\"detail\"")
        );
        let err = c
            .get_json::<serde_json::Value>(&["missing"], &[])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ClientError::NotFound {
                service: "katalogus",
                path: "/missing".into(),
                detail: Some("Unknown organisation".into()),
            }
        );
        assert_eq!(stub.seen().len(), 2, "one request each, no retries");
    }

    #[tokio::test]
    async fn a_body_that_is_not_the_promised_shape_is_a_decode_error_with_its_json_path() {
        let stub = Stub::start(|_| (200, r#"{"count": "many"}"#.into()));
        #[derive(Debug, serde::Deserialize)]
        #[expect(dead_code, reason = "only its decoding is under test")]
        struct Page {
            count: u64,
        }
        let err = client(&stub.base)
            .get_json::<Page>(&["v1", "things"], &[])
            .await
            .unwrap_err();
        let ClientError::Decode { path, error, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(path, "/v1/things");
        assert!(error.starts_with("count:"), "{error}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_unreachable_after_the_retries_without_credentials() {
        let port = closed_port();
        let c = client(&format!("http://user:secret@127.0.0.1:{port}/base/"));
        assert!(!format!("{c:?}").contains("secret"));
        let err = c
            .get_json::<serde_json::Value>(&["v1", "organisations"], &[])
            .await
            .unwrap_err();
        let ClientError::Unreachable {
            service,
            path,
            attempts,
            reason,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(
            (*service, path.as_str(), *attempts),
            ("katalogus", "/base/v1/organisations", 3)
        );
        assert!(reason.to_lowercase().contains("connect"), "{reason}");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(!c.healthy(&["health"]).await);
    }

    #[tokio::test]
    async fn failed_calls_are_counted_by_service_and_kind() {
        // The counts are the process' and other tests fail calls too: increases are read.
        let before = |kind| failures("bytes", kind);
        let (unreachable, status, decode) =
            (before("unreachable"), before("status"), before("decode"));
        let stub = Stub::start(|s| match s.path.as_str() {
            "/boom" => (500, "{}".into()),
            "/missing" => (404, r#"{"detail":"x"}"#.into()),
            _ => (200, "[]".into()),
        });
        let c = ServiceClient::new("bytes", &stub.base, Duration::from_secs(5))
            .unwrap()
            .with_backoff(quick());
        type Object = serde_json::Map<String, serde_json::Value>;
        let status_err = c.get_json::<Object>(&["boom"], &[]).await;
        assert!(matches!(status_err, Err(ClientError::Status { .. })));
        let not_found = c.get_json::<Object>(&["missing"], &[]).await;
        assert!(matches!(not_found, Err(ClientError::NotFound { .. })));
        let decode_err = c.get_json::<Object>(&["list"], &[]).await;
        assert!(matches!(decode_err, Err(ClientError::Decode { .. })));
        let closed = ServiceClient::new(
            "bytes",
            &format!("http://127.0.0.1:{}", closed_port()),
            Duration::from_secs(5),
        )
        .unwrap()
        .with_backoff(quick());
        assert!(
            closed
                .get_json::<serde_json::Value>(&["x"], &[])
                .await
                .is_err()
        );
        assert!(failures("bytes", "unreachable") > unreachable);
        assert!(failures("bytes", "status") > status);
        assert!(failures("bytes", "decode") > decode);
        assert_eq!(failures("bytes", "nonsense"), 0);
    }

    #[tokio::test]
    async fn a_dropped_connection_is_retried_until_the_tries_run_out() {
        // Accepts each connection and closes it unanswered, counting them.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        let err = client(&format!("http://127.0.0.1:{port}"))
            .get_json::<serde_json::Value>(&["x"], &[])
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Unreachable { attempts: 3, .. }),
            "{err:?}"
        );
        // The three tries, and the first closed one sent again at once (once a call).
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    /// A server closing a kept-alive connection as a request arrives on it (uvicorn, which
    /// serves the platform's services, closes one idle for 5 s): the request went out and got no
    /// answer through no fault of the service's.
    #[tokio::test]
    async fn a_request_on_a_connection_the_server_was_closing_is_made_again_at_once() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // (connections accepted, requests read on the first connection after its first)
        let seen = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let counters = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let n = counters.0.fetch_add(1, Ordering::SeqCst);
                let counters = counters.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let mut read = Vec::new();
                        while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => read.extend_from_slice(&buf[..k]),
                            }
                        }
                        if n == 0 && counters.1.fetch_add(1, Ordering::SeqCst) > 0 {
                            // The first connection's keep-alive ran out as this request came.
                            return;
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                      content-length: 2\r\n\r\n{}";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let c = ServiceClient::new(
            "octopoes",
            &format!("http://127.0.0.1:{port}"),
            Duration::from_secs(5),
        )
        .unwrap()
        .with_backoff(Backoff {
            attempts: 1,
            ..quick()
        });
        let first = c
            .get_json::<serde_json::Value>(&["org1", "object"], &[])
            .await;
        assert_eq!(first, Ok(serde_json::json!({})));
        // Lets the client put the connection back in its pool.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let second = c
            .get_json::<serde_json::Value>(&["org1", "object"], &[])
            .await;
        assert_eq!(
            seen.1.load(Ordering::SeqCst),
            2,
            "the second call went out on the kept-alive connection"
        );
        assert_eq!(
            second,
            Ok(serde_json::json!({})),
            "made again, and answered"
        );
        assert_eq!(
            seen.0.load(Ordering::SeqCst),
            2,
            "on a connection of its own"
        );
    }

    #[tokio::test]
    async fn a_service_that_does_not_answer_in_time_is_retried_then_unreachable() {
        // Accepts connections and holds them open without answering.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        let c = ServiceClient::new(
            "octopoes",
            &format!("http://127.0.0.1:{port}"),
            Duration::from_millis(100),
        )
        .unwrap()
        .with_backoff(quick());
        let err = c
            .get_json::<serde_json::Value>(&["org1", "objects"], &[])
            .await
            .unwrap_err();
        let ClientError::Unreachable {
            attempts, reason, ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(*attempts, 3);
        assert!(reason.contains("timed out"), "{reason}");
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn health_needs_2xx_and_healthy_true_when_the_body_says() {
        let stub = Stub::start(|s| match s.path.as_str() {
            "/up" => (200, r#"{"service":"katalogus","healthy":true}"#.into()),
            "/sick" => (200, r#"{"service":"katalogus","healthy":false}"#.into()),
            "/plain" => (200, "OK".into()),
            _ => (503, "{}".into()),
        });
        let c = client(&stub.base);
        assert!(c.healthy(&["up"]).await);
        assert!(!c.healthy(&["sick"]).await);
        assert!(c.healthy(&["plain"]).await);
        assert!(!c.healthy(&["down"]).await);
        assert_eq!(stub.seen().len(), 4, "a health check tries once");
    }
}
