//! The HTTP transport shared by every HTTP protocol.
//!
//! One [`HttpTransport`] (one connection pool) serves a whole run. It owns the parts of a call
//! that do not depend on the protocol: a bounded POST (the whole exchange under one deadline,
//! the body read chunk by chunk and abandoned as soon as it is too large), the mapping of every
//! way an exchange can go wrong to a categorised [`Fault`] whose message a human can act on,
//! and the retry loop ([`with_retries`]) that retries transient faults with backoff without
//! ever running past the trajectory's deadline.

use std::cell::Cell;
use std::error::Error as StdError;
use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{StatusCode, Url};
use tokio::time::Instant;

use super::Attempt;
use crate::record::{Fault, FaultCategory, RateLimited};

/// How much of an error body goes into a fault message.
const ERROR_BODY_PREVIEW_CHARS: usize = 200;
/// Bytes reserved for a response body before any arrive.
const INITIAL_BODY_CAPACITY: u64 = 64 * 1024;
/// A request body at least this large that the agent drops unsent is named as a likely
/// body size limit of the agent's (servers' defaults start at 1 MB).
const LARGE_REQUEST: u64 = 1024 * 1024;
/// Idle keep-alive connections are dropped after this long.
pub(super) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A TCP connect that takes longer than this is hopeless whatever the per-call timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// First retry delay; later delays double up to [`MAX_BACKOFF`], plus jitter.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Per-attempt limits of one agent's calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// The whole exchange of one attempt (connect, request, headers, body).
    pub timeout: Duration,
    /// Bodies larger than this are abandoned mid-read.
    pub max_response_size: u64,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            timeout: Duration::from_secs(30),
            max_response_size: 8 * 1024 * 1024,
        }
    }
}

/// An agent `header` that cannot be sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("invalid header name `{0}`")]
    InvalidName(String),
    // The value is left out on purpose: header values usually carry secrets.
    #[error(
        "header `{0}` has an invalid value (control characters or line breaks are not allowed)"
    )]
    InvalidValue(String),
}

/// An HTTP agent endpoint that cannot be used, whatever the protocol.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("invalid agent URL `{url}`: {source}")]
    InvalidUrl {
        url: String,
        #[source]
        source: UrlParseError,
    },
    #[error("agent URL `{0}` must be http or https")]
    UnsupportedScheme(String),
    #[error(transparent)]
    Header(#[from] HeaderError),
}

/// `reqwest` re-exports the URL type but not its parse error under a stable path.
pub type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// Parses an agent's URL: absolute, `http` or `https`.
pub fn agent_url(url: &str) -> Result<Url, EndpointError> {
    let parsed: Url = url.parse().map_err(|source| EndpointError::InvalidUrl {
        url: url.to_owned(),
        source,
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(EndpointError::UnsupportedScheme(url.to_owned()));
    }
    Ok(parsed)
}

/// `base` with `over`'s headers in place of any of the same names; borrowed when there
/// is nothing over it (an agent's headers with a turn's own `header` values).
pub fn headers_over<'h>(
    base: &'h HeaderMap,
    over: Option<&HeaderMap>,
) -> std::borrow::Cow<'h, HeaderMap> {
    match over {
        None => std::borrow::Cow::Borrowed(base),
        Some(over) => {
            let mut headers = base.clone();
            for name in over.keys() {
                headers.remove(name);
            }
            for (name, value) in over {
                headers.append(name, value.clone());
            }
            std::borrow::Cow::Owned(headers)
        }
    }
}

/// Lays the agent's rendered `header` nodes over a protocol's default headers. Values are
/// marked sensitive (never printed); a repeated name sends several values, and its first
/// occurrence replaces the default of that name.
pub fn with_agent_headers(
    mut defaults: HeaderMap,
    headers: &[(String, String)],
) -> Result<HeaderMap, HeaderError> {
    let mut given: Vec<reqwest::header::HeaderName> = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let header = reqwest::header::HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| HeaderError::InvalidName(name.clone()))?;
        let mut value = reqwest::header::HeaderValue::from_str(value.trim())
            .map_err(|_| HeaderError::InvalidValue(name.clone()))?;
        value.set_sensitive(true);
        if given.contains(&header) {
            defaults.append(header, value);
        } else {
            defaults.insert(header.clone(), value);
            given.push(header);
        }
    }
    Ok(defaults)
}

/// A successful (2xx) HTTP response, body read in full.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub body: Bytes,
}

/// A complete HTTP response of any status, for callers that act on error statuses themselves
/// (an LLM provider's 429 and its `Retry-After`). Error bodies are read only far enough to
/// quote them.
#[derive(Clone, Debug)]
pub struct RawResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl RawResponse {
    /// The response with its body's `Content-Encoding` undone (`super::encoding`). An error
    /// status's body, read only far enough to quote, is quoted as it came when it does not
    /// decode.
    fn decoded(mut self, max_response_size: u64) -> Result<RawResponse, Fault> {
        if !self.headers.contains_key(reqwest::header::CONTENT_ENCODING) {
            return Ok(self);
        }
        match super::encoding::decoded(&self.headers, self.body.clone(), max_response_size) {
            Ok(body) => {
                self.body = body;
                Ok(self)
            }
            Err(fault) if self.status.is_success() => Err(fault),
            Err(_) => {
                // Read only far enough to quote, so usually cut mid-stream: what decodes.
                if let Some(start) = super::encoding::decoded_start(&self.headers, &self.body, 4096)
                {
                    self.body = start;
                }
                Ok(self)
            }
        }
    }

    /// The 2xx response, or the fault an error status maps to.
    pub fn success(self) -> Result<HttpResponse, Fault> {
        if self.status.is_success() {
            Ok(HttpResponse {
                status: self.status,
                body: self.body,
            })
        } else {
            Err(status_fault_with(
                self.status,
                Some(&self.headers),
                &self.body,
            ))
        }
    }
}

/// The HTTP client of a run: one keep-alive pool shared by every agent and call.
///
/// Cheap to clone (the clients inside are reference counted). Clients are built on first
/// use (a run against local agents never needs the proxied client); the system's CA bundle
/// is loaded at the first TLS handshake, not here (see [`super::tls`]).
#[derive(Clone, Debug, Default)]
pub struct HttpTransport {
    clients: Arc<Clients>,
    /// Whether a request a kept-alive connection lost after it was written, before any byte
    /// of an answer, is sent again on a fresh connection ([`Self::replaying_lost`]).
    replay_lost: bool,
}

#[derive(Debug, Default)]
struct Clients {
    /// Honours the proxy environment variables, for remote agents.
    proxied: OnceLock<Result<reqwest::Client, String>>,
    /// Never goes through a proxy: loopback agents (builtins, local dev servers) must not be
    /// sent to a proxy configured for the outside world.
    direct: OnceLock<Result<reqwest::Client, String>>,
    /// Without a pool, for a request a pooled connection lost (see [`HttpTransport::send`]).
    fresh_proxied: OnceLock<Result<reqwest::Client, String>>,
    fresh_direct: OnceLock<Result<reqwest::Client, String>>,
    /// Plain HTTP/1.1 to agents reached directly (see [`super::plain`]).
    plain: super::plain::PlainPool,
    /// Requests sent again to a long-lived agent process started afresh, by its command
    /// ([`super::line::LineTransport::counting_resent_in`]).
    resent: super::connect::Tally<String>,
}

tokio::task_local! {
    /// Set in the task sending a request when a connection is made for it: a request that
    /// fails without it went out on a pooled connection.
    static CONNECTED_FOR_REQUEST: Cell<bool>;
}

/// A connector layer that marks, in the sending task, that a new connection was made.
/// hyper's pool makes the connection in the task that sends the request (only a connection
/// that lost the race to a pooled one finishes in the background, and then the request went
/// out on the pooled one, which is the conservative side: it is not resent).
#[derive(Clone, Copy, Debug)]
struct MarkNewConnections;

impl<S> tower_layer::Layer<S> for MarkNewConnections {
    type Service = MarkingConnector<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MarkingConnector(inner)
    }
}

#[derive(Clone, Debug)]
struct MarkingConnector<S>(S);

impl<S: tower_service::Service<R>, R> tower_service::Service<R> for MarkingConnector<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        let _ = CONNECTED_FOR_REQUEST.try_with(|made| made.set(true));
        self.0.call(request)
    }
}

/// Whether a request failed because its connection closed before any byte of an answer
/// (closed, reset, or the request could not be written): on a pooled connection, the server
/// had closed it as idle, so the request never reached the agent.
fn closed_before_answer(err: &reqwest::Error) -> bool {
    !(err.is_connect() || err.is_timeout() || err.status().is_some())
        && err.source().is_some_and(connection_closed)
}

/// Whether an error chain says the connection was closed under the exchange: hyper's
/// incomplete message, or a reset or broken pipe (the first I/O error decides).
pub(super) fn connection_closed(err: &(dyn StdError + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(hyper) = e.downcast_ref::<hyper::Error>()
            && hyper.is_incomplete_message()
        {
            return true;
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            );
        }
        source = e.source();
    }
    false
}

impl HttpTransport {
    /// The run's transport. Call once per run and clone the result.
    pub fn new() -> Self {
        Self::default()
    }

    /// This transport, sharing its pool, sending again (once, on a fresh connection, within
    /// the same attempt) a request a kept-alive connection lost after it was written and
    /// before any byte of an answer: a server closes idle connections when it likes,
    /// possibly just as a request goes out (llama.cpp does), but an agent that read the
    /// request and then reset the connection looks the same, and may have acted on it.
    /// So only callers for which a second sending is harmless say `true`: model requests,
    /// and agents with `retry-after-send #true`. A request the connection could not take at
    /// all (closed before it was written) is sent again in every case.
    pub fn replaying_lost(mut self, replay: bool) -> Self {
        self.replay_lost = replay;
        self
    }

    /// Connections to loopback agents made again because the agent's accept queue was
    /// full (see [`super::connect`]), counted over this transport's life: plain HTTP and
    /// line agents on `tcp:` given it ([`super::line::LineTransport::counting_in`]).
    pub fn connections_redone(&self) -> super::connect::Redone {
        self.clients.plain.redone.clone()
    }

    /// Requests a long-lived agent process ended on without answering, sent again to the
    /// process started in its place, by the agent's command, over this transport's life.
    /// The turn gets its answer from the new process, so nothing on the turn fails: the
    /// run's summary says how often the agent died under a request.
    pub fn requests_resent(&self) -> super::connect::Tally<String> {
        self.clients.resent.clone()
    }

    fn builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            // An agent's answer is the answer of the URL the suite names: a redirect is a
            // fault like any other unexpected status, as on the plain path. Followed, a
            // stream re-posted the turn (with the suite's headers but `Authorization`) to
            // wherever the agent pointed, `/shutdown` on another host included, and the
            // reply from there was checked as the agent's.
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .connector_layer(MarkNewConnections)
            .user_agent(concat!("trellis/", env!("CARGO_PKG_VERSION")))
    }

    /// Sends the request `build` makes on the client for `url`. A request lost by a pooled
    /// connection before any byte of an answer is sent again, once, on a fresh connection,
    /// within the same attempt, when this transport replays lost requests
    /// ([`Self::replaying_lost`]; hyper's pool already sends again what it could not write).
    /// A fresh connection closing that way is the agent's doing and is returned as is.
    pub(super) async fn send(
        &self,
        url: &Url,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Result<reqwest::Response, reqwest::Error>, Fault> {
        // The turn's trace context, when one is in scope (a resend carries it too).
        let build = |client: &reqwest::Client| super::trace::add_headers(build(client));
        let request = build(self.client_for(url)?).send();
        let (sent, connected) = CONNECTED_FOR_REQUEST
            .scope(Cell::new(false), async {
                let sent = request.await;
                (sent, CONNECTED_FOR_REQUEST.with(Cell::get))
            })
            .await;
        match sent {
            Err(e) if self.replay_lost && !connected && closed_before_answer(&e) => {
                Ok(build(self.client(url, true)?).send().await)
            }
            sent => Ok(sent),
        }
    }

    /// Builds the client `url` will use now, so the cost of building it (loading the CA
    /// bundle) is paid at setup and never counted in a measured latency or timeout.
    pub fn warm(&self, url: &str) {
        if let Ok(url) = url.parse::<Url>() {
            let _ = self.client_for(&url);
        }
    }

    pub(super) fn client_for(&self, url: &Url) -> Result<&reqwest::Client, Fault> {
        self.client(url, false)
    }

    /// The client for `url`: pooled, or `fresh` (a new connection for every request).
    fn client(&self, url: &Url, fresh: bool) -> Result<&reqwest::Client, Fault> {
        let loopback = is_loopback(url);
        let clients = &self.clients;
        let (cell, fresh_cell) = if loopback {
            (&clients.direct, &clients.fresh_direct)
        } else {
            (&clients.proxied, &clients.fresh_proxied)
        };
        let build = || {
            let tls = super::tls::client_config().map_err(|e| e.to_string())?;
            let builder = Self::builder().tls_backend_preconfigured(tls);
            let builder = if loopback {
                builder.no_proxy()
            } else {
                builder
            };
            let builder = if fresh {
                builder.pool_max_idle_per_host(0)
            } else {
                builder
            };
            builder.build().map_err(|e| e.to_string())
        };
        let client = if fresh {
            fresh_cell.get_or_init(build)
        } else {
            cell.get_or_init(build)
        };
        client.as_ref().map_err(|e| {
            Fault::new(
                FaultCategory::Setup,
                format!("could not build the HTTP client: {e}"),
            )
        })
    }

    /// POSTs `body` (already serialised JSON) and reads the whole answer, all within
    /// `timeout`. Returns the 2xx response or the fault that describes what went wrong.
    ///
    /// `headers` must carry the content type; they are sent as given.
    pub async fn post_json(
        &self,
        url: &Url,
        headers: &HeaderMap,
        body: Bytes,
        max_response_size: u64,
        timeout: Duration,
    ) -> Result<HttpResponse, Fault> {
        self.bounded(
            reqwest::Method::POST,
            url,
            headers,
            Some(body),
            max_response_size,
            timeout,
        )
        .await?
        .success()
    }

    /// [`HttpTransport::post_json`] with another method that carries a body (`PUT`,
    /// `PATCH`: an `http` agent's `method`).
    pub async fn send_json(
        &self,
        method: reqwest::Method,
        url: &Url,
        headers: &HeaderMap,
        body: Bytes,
        max_response_size: u64,
        timeout: Duration,
    ) -> Result<HttpResponse, Fault> {
        self.bounded(method, url, headers, Some(body), max_response_size, timeout)
            .await?
            .success()
    }

    /// Like [`HttpTransport::post_json`], but an error status is returned with its headers
    /// instead of becoming a fault; only transport failures, timeouts and oversized bodies
    /// are faults.
    pub async fn post_json_raw(
        &self,
        url: &Url,
        headers: &HeaderMap,
        body: Bytes,
        max_response_size: u64,
        timeout: Duration,
    ) -> Result<RawResponse, Fault> {
        self.bounded(
            reqwest::Method::POST,
            url,
            headers,
            Some(body),
            max_response_size,
            timeout,
        )
        .await
    }

    /// GETs `url` and reads the whole answer within `timeout`, with the same size bound and
    /// fault mapping as [`HttpTransport::post_json`] (Fixie's handshake).
    pub async fn get(
        &self,
        url: &Url,
        headers: &HeaderMap,
        max_response_size: u64,
        timeout: Duration,
    ) -> Result<HttpResponse, Fault> {
        self.bounded(
            reqwest::Method::GET,
            url,
            headers,
            None,
            max_response_size,
            timeout,
        )
        .await?
        .success()
    }

    async fn bounded(
        &self,
        method: reqwest::Method,
        url: &Url,
        headers: &HeaderMap,
        body: Option<Bytes>,
        max_response_size: u64,
        timeout: Duration,
    ) -> Result<RawResponse, Fault> {
        let mut progress = Progress::default();
        // Boxed: every level above (the request's retries, the protocol's call, its turn)
        // would otherwise hold this future inline and move it whole as it is awaited, about
        // 10 KB of copies per request instead of one allocation.
        let exchange =
            Box::pin(self.exchange(method, url, headers, body, max_response_size, &mut progress));
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result.and_then(|response| response.decoded(max_response_size)),
            Err(_elapsed) => Err(Fault::new(
                FaultCategory::Timeout,
                format!(
                    "no complete response within {} (timeout); {}",
                    DisplayDuration(timeout),
                    progress.describe()
                ),
            )),
        }
    }

    async fn exchange(
        &self,
        method: reqwest::Method,
        url: &Url,
        headers: &HeaderMap,
        body: Option<Bytes>,
        max_response_size: u64,
        progress: &mut Progress,
    ) -> Result<RawResponse, Fault> {
        progress.request_bytes = body.as_ref().map_or(0, |b| b.len() as u64);
        if super::plain::eligible(url, is_loopback(url)) {
            return self
                .plain_exchange(&method, url, headers, body, max_response_size, progress)
                .await;
        }
        let build = |client: &reqwest::Client| {
            let request = client
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            match &body {
                Some(body) => request.body(body.clone()),
                None => request,
            }
        };
        let mut response = self
            .send(url, build)
            .await?
            .map_err(|e| classify(&e, url, progress))?;
        let status = response.status();
        progress.status = Some(status);
        progress.content_length = response.content_length();
        let (body, _) = read_body(
            status,
            max_response_size,
            url,
            progress,
            BodySource::Reqwest(&mut response),
        )
        .await?;
        Ok(RawResponse {
            status,
            headers: std::mem::take(response.headers_mut()),
            body,
        })
    }

    /// [`HttpTransport::exchange`] over [`super::plain`]; the connection goes back to the
    /// pool only when its answer was read to the end.
    async fn plain_exchange(
        &self,
        method: &reqwest::Method,
        url: &Url,
        headers: &HeaderMap,
        body: Option<Bytes>,
        max_response_size: u64,
        progress: &mut Progress,
    ) -> Result<RawResponse, Fault> {
        let pool = &self.clients.plain;
        let mut answer = pool
            .send(
                method,
                url,
                headers,
                body.as_ref(),
                CONNECT_TIMEOUT,
                self.replay_lost,
            )
            .await
            .map_err(|e| plain_fault(&e, url, progress, self.replay_lost))?;
        let status = answer.response.status();
        progress.status = Some(status);
        progress.content_length = hyper::body::Body::size_hint(answer.response.body()).exact();
        let (body, complete) = read_body(
            status,
            max_response_size,
            url,
            progress,
            BodySource::Plain(pool, &mut answer),
        )
        .await?;
        let headers = std::mem::take(answer.response.headers_mut());
        if complete {
            pool.release(answer);
        }
        Ok(RawResponse {
            status,
            headers,
            body,
        })
    }
}

/// Where a response body comes from.
enum BodySource<'a> {
    Reqwest(&'a mut reqwest::Response),
    Plain(&'a super::plain::PlainPool, &'a mut super::plain::Answer),
}

enum BodyError {
    Reqwest(reqwest::Error),
    Hyper(hyper::Error),
}

impl BodySource<'_> {
    async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        match self {
            BodySource::Reqwest(response) => response.chunk().await.map_err(BodyError::Reqwest),
            BodySource::Plain(pool, answer) => {
                pool.next_chunk(answer).await.map_err(BodyError::Hyper)
            }
        }
    }
}

impl BodyError {
    fn fault(&self, url: &Url, progress: &Progress) -> Fault {
        match self {
            BodyError::Reqwest(e) => classify(e, url, progress),
            BodyError::Hyper(e) => classify_chain(e, Flags::default(), url, progress),
        }
    }
}

/// Reads a response body within `max_response_size`: a success's body in full (a fault when
/// it runs over), an error status's only as far as a fault message quotes it. Returns the
/// body and whether it was read to its end.
async fn read_body(
    status: StatusCode,
    max_response_size: u64,
    url: &Url,
    progress: &mut Progress,
    mut source: BodySource<'_>,
) -> Result<(Bytes, bool), Fault> {
    if status.is_success()
        && let Some(len) = progress.content_length
        && len > max_response_size
    {
        return Err(too_large(
            max_response_size,
            &format!("Content-Length is {len}"),
        ));
    }

    // Error bodies are read only far enough to quote them.
    let limit = if status.is_success() {
        max_response_size
    } else {
        max_response_size.min(4096)
    };
    // Content-Length is the agent's word: reserve no more than a typical answer up
    // front, and let the buffer grow with what actually arrives.
    let capacity = progress
        .content_length
        .unwrap_or(0)
        .min(limit)
        .min(INITIAL_BODY_CAPACITY);
    let mut buf: Vec<u8> = Vec::new();
    let mut first = true;
    let read = loop {
        match source.next().await {
            Ok(Some(chunk)) => {
                progress.body_bytes += chunk.len() as u64;
                if progress.body_bytes > limit {
                    if status.is_success() {
                        return Err(too_large(
                            max_response_size,
                            &format!("{} bytes read before giving up", progress.body_bytes),
                        ));
                    }
                    let room = usize::try_from(limit)
                        .unwrap_or(usize::MAX)
                        .saturating_sub(buf.len());
                    buf.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or(&[]));
                    break Ok(false);
                }
                // A body that arrives in one piece (the usual answer) is kept as it came.
                if first {
                    first = false;
                    if progress.content_length == Some(chunk.len() as u64) {
                        match source.next().await {
                            Ok(None) => return Ok((without_bom(chunk), true)),
                            Ok(Some(more)) => {
                                progress.body_bytes += more.len() as u64;
                                buf.reserve(chunk.len() + more.len());
                                buf.extend_from_slice(&chunk);
                                buf.extend_from_slice(&more);
                                continue;
                            }
                            Err(e) => break Err(e.fault(url, progress)),
                        }
                    }
                    buf.reserve(usize::try_from(capacity).unwrap_or(0));
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => break Ok(true),
            Err(e) => break Err(e.fault(url, progress)),
        }
    };

    let complete = match read {
        Ok(complete) => complete,
        // The status is what matters for a failed exchange, even when its body broke off.
        Err(fault) if status.is_success() => return Err(fault),
        Err(_) => false,
    };
    Ok((without_bom(Bytes::from(buf)), complete))
}

/// `body` without a leading UTF-8 byte order mark, which some Windows and .NET servers put
/// before their JSON: RFC 8259 (section 8.1) lets a parser ignore it, and `serde_json` does
/// not. Sliced, not copied.
fn without_bom(body: Bytes) -> Bytes {
    if body.starts_with(BOM) {
        body.slice(BOM.len()..)
    } else {
        body
    }
}

/// The UTF-8 byte order mark.
pub(crate) const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Whether `url` names this machine: loopback agents (builtins, local dev servers) never go
/// through a proxy configured for the outside world.
fn is_loopback(url: &Url) -> bool {
    url.host_str().is_some_and(|host| {
        super::connect::is_localhost(host)
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}

/// The fault of an exchange on the plain path: [`classify_chain`], as on reqwest's path,
/// told what reqwest's error would say about a failed resolve or connect. `replayed`: lost
/// requests are already sent again ([`HttpTransport::replaying_lost`]), so the hint to allow
/// it is left out.
fn plain_fault(
    err: &super::plain::PlainError,
    url: &Url,
    progress: &Progress,
    replayed: bool,
) -> Fault {
    use super::plain::PlainError;
    let err_kind = err;
    let (err, flags): (&(dyn StdError + 'static), Flags) = match err {
        PlainError::Resolve(e) => (
            e,
            Flags {
                connect: true,
                dns: true,
                ..Flags::default()
            },
        ),
        PlainError::Connect(e) => (
            e,
            Flags {
                connect: true,
                ..Flags::default()
            },
        ),
        PlainError::Exchange { error, .. } => (error, Flags::default()),
    };
    let mut fault = classify_chain(err, flags, url, progress);
    if let PlainError::Exchange {
        error,
        reused,
        after,
    } = err_kind
        && connection_closed(error)
        && progress.status.is_none()
    {
        // Not sent again by default: the agent may have read it (see `RetryPolicy`). A
        // kept-alive connection closed as the request went out is the server's idle close
        // racing it; one closed later is an agent that stopped while it worked.
        let raced = *reused && *after < KEEP_ALIVE_RACE;
        let allow = if replayed {
            ""
        } else if raced {
            "; `retry-after-send #true` sends such a request again on a new connection"
        } else {
            ". `retry-after-send #true` sends such a request again"
        };
        fault.message.push_str(&if raced {
            format!(
                " (on a kept-alive connection the agent closed as the request went out: servers \
                 that close idle connections or restart their workers do this{allow})"
            )
        } else {
            format!(
                " (closed {} after the request went out, before any answer: an agent that \
                 crashed, restarted its workers or shed connections under load; it may have \
                 acted on the request{allow})",
                DisplayDuration(*after)
            )
        });
    }
    fault
}

/// How soon after a request goes out a kept-alive connection's close is taken for the
/// server's idle close racing it, rather than an agent that stopped while it worked.
pub(super) const KEEP_ALIVE_RACE: Duration = Duration::from_millis(50);

/// What an exchange had achieved when it failed, for the fault message.
#[derive(Debug, Default)]
struct Progress {
    status: Option<StatusCode>,
    content_length: Option<u64>,
    body_bytes: u64,
    /// Size of the request body sent.
    request_bytes: u64,
}

impl Progress {
    fn describe(&self) -> String {
        match self.status {
            None => "no response headers received".to_owned(),
            Some(status) => {
                let mut s = format!(
                    "HTTP {} received, then {}",
                    status.as_u16(),
                    self.body_bytes
                );
                if let Some(len) = self.content_length {
                    let _ = write!(s, " of {len}");
                }
                s.push_str(" body bytes");
                s
            }
        }
    }
}

/// A duration as a person reads it in a report: `700ms`, `30s`, `1.5s`.
pub(super) struct DisplayDuration(pub(super) Duration);

impl std::fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms < 1000 {
            write!(f, "{ms}ms")
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{:.1}s", self.0.as_secs_f64())
        }
    }
}

pub(super) fn too_large(max: u64, detail: &str) -> Fault {
    Fault::new(
        FaultCategory::TooLarge,
        format!("response exceeded {max} bytes (max-response-size); {detail}"),
    )
}

pub(crate) fn status_fault(status: StatusCode, body: &[u8]) -> Fault {
    status_fault_with(status, None, body)
}

/// [`status_fault`], with the answer's headers when they are at hand: a redirect names
/// where it points, and an HTML error page (a proxy's 502) is named by its title instead of
/// quoted line by line.
pub(crate) fn status_fault_with(
    status: StatusCode,
    headers: Option<&HeaderMap>,
    body: &[u8],
) -> Fault {
    let mut fault = described_status(status, headers, body);
    let asked = || headers.and_then(|h| retry_after(h, std::time::SystemTime::now()));
    if status == StatusCode::TOO_MANY_REQUESTS {
        fault.rate_limited = Some(RateLimited {
            retry_after: asked(),
        });
    } else if status.is_server_error() {
        fault.back_after = asked();
    }
    fault
}

/// The status of an error answer [`status_fault`] described (`HTTP 404 …`), for a caller
/// that acts on which status it was; `None` for any other fault.
pub(crate) fn status_of(fault: &Fault) -> Option<u16> {
    if !matches!(
        fault.category,
        FaultCategory::Http4xx | FaultCategory::Http5xx
    ) {
        return None;
    }
    fault.message.strip_prefix("HTTP ")?.get(..3)?.parse().ok()
}

fn described_status(status: StatusCode, headers: Option<&HeaderMap>, body: &[u8]) -> Fault {
    let category = if status.is_client_error() {
        FaultCategory::Http4xx
    } else if status.is_server_error() {
        FaultCategory::Http5xx
    } else {
        FaultCategory::Protocol
    };
    // Statuses the HTTP registry does not name, which model providers send.
    let mut message = match (status.canonical_reason(), status.as_u16()) {
        (Some(_), _) => format!("HTTP {status}"),
        (None, 529) => "HTTP 529 (overloaded)".to_owned(),
        (None, code) => format!("HTTP {code}"),
    };
    if !status.is_client_error() && !status.is_server_error() {
        message.insert_str(0, "unexpected status ");
    }
    let header = |name: reqwest::header::HeaderName| {
        headers
            .and_then(|h| h.get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    if status.is_redirection() {
        match header(reqwest::header::LOCATION) {
            Some(to) => message.push_str(&format!(
                " to {}: Trellis does not follow redirects (the turn and the suite's headers \
                 would go wherever the agent points); put that address in the agent's url={}",
                super::quote::cut(to, 300),
                // Starlette and Werkzeug send a path alone.
                if to.starts_with('/') && !to.starts_with("//") {
                    " (on the same host and port)"
                } else {
                    ""
                }
            )),
            None => message.push_str(": Trellis does not follow redirects"),
        }
        return Fault::new(category, message);
    }
    if let Some(page) = html_page(headers, body) {
        message.push_str(": ");
        message.push_str(&page);
        return Fault::new(category, message);
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if !text.is_empty() {
        message.push_str(": ");
        // One line: a multi-line error body (a stack trace, pretty-printed JSON) would
        // otherwise be quoted with its line breaks escaped.
        let mut words = text
            .split_whitespace()
            .flat_map(|w| " ".chars().chain(w.chars()))
            .skip(1);
        message.extend(words.by_ref().take(ERROR_BODY_PREVIEW_CHARS));
        if words.next().is_some() {
            message.push('…');
        }
    }
    Fault::new(category, message)
}

/// The fault of an HTTP 429 answer whose body was not read (an event stream's opening).
pub(crate) fn rate_limited_fault(retry_after: Option<Duration>) -> Fault {
    let mut fault = status_fault(StatusCode::TOO_MANY_REQUESTS, b"");
    fault.rate_limited = Some(RateLimited { retry_after });
    fault
}

/// `an HTML page (its title)` (else its text, tags left out: `<body>Invalid API key</body>`)
/// when `body` is one, by its `Content-Type` or its start: a proxy's or a framework's page
/// where an agent's answer was expected, said as such rather than quoted as markup.
pub(crate) fn html_page(headers: Option<&HeaderMap>, body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let start: String = text
        .chars()
        .take(15)
        .collect::<String>()
        .to_ascii_lowercase();
    let html = headers
        .and_then(|h| h.get(reqwest::header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim().to_ascii_lowercase().starts_with("text/html"))
        || start.starts_with("<!doctype html")
        || start.starts_with("<html");
    if !html {
        return None;
    }
    let mut page = "an HTML page".to_owned();
    match html_title(text) {
        Some(title) => page.push_str(&format!(" ({title})")),
        None => {
            let words = html_text(text);
            if !words.is_empty() {
                page.push_str(&format!(": {}", super::quote::cut(&words, 200)));
            }
        }
    }
    Some(page)
}

/// The text of an HTML page without its tags (and what `<script>`/`<style>` hold), its
/// spaces collapsed.
fn html_text(page: &str) -> String {
    let mut out = String::new();
    let mut rest = page;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        out.push(' ');
        let tag = &rest[open..];
        let lower: String = tag.chars().take(7).collect::<String>().to_ascii_lowercase();
        let skip_to = if lower.starts_with("<script") {
            tag.to_ascii_lowercase()
                .find("</script")
                .unwrap_or(tag.len())
        } else if lower.starts_with("<style") {
            tag.to_ascii_lowercase()
                .find("</style")
                .unwrap_or(tag.len())
        } else {
            0
        };
        let after = &tag[skip_to..];
        rest = after.find('>').map_or("", |close| &after[close + 1..]);
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `<title>` of an HTML page (else its first `<h1>`), its spaces collapsed.
fn html_title(page: &str) -> Option<String> {
    let lower = page.to_ascii_lowercase();
    let inside = |open: &str, close: &str| {
        let start = lower.find(open)?;
        let start = start + lower[start..].find('>')? + 1;
        let end = start + lower[start..].find(close)?;
        let text = page
            .get(start..end)?
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        (!text.is_empty()).then(|| super::quote::cut(&text, 120))
    };
    inside("<title", "</title>").or_else(|| inside("<h1", "</h1>"))
}

/// The fault of a request or body read that failed, for the other transports on this
/// client ([`super::sse`]): `status` and `body_bytes` say how far the exchange got.
pub(super) fn request_fault(
    err: &reqwest::Error,
    url: &Url,
    status: Option<StatusCode>,
    body_bytes: u64,
) -> Fault {
    let progress = Progress {
        status,
        content_length: None,
        body_bytes,
        request_bytes: 0,
    };
    classify(err, url, &progress)
}

/// Maps a reqwest error to a fault, looking through its source chain for the I/O error or
/// the hyper condition that tells a refused connection from a reset or a truncated body.
fn classify(err: &reqwest::Error, url: &Url, progress: &Progress) -> Fault {
    let flags = Flags {
        connect: err.is_connect(),
        timeout: err.is_timeout(),
        dns: err.is_dns(),
    };
    classify_chain(err, flags, url, progress)
}

/// What the client that failed knows about the failure beyond its error chain.
#[derive(Clone, Copy, Debug, Default)]
struct Flags {
    /// No connection was made.
    connect: bool,
    timeout: bool,
    /// The host did not resolve.
    dns: bool,
}

/// Maps an HTTP client's error (reqwest's or hyper's) to a fault, from its whole chain.
fn classify_chain(
    err: &(dyn StdError + 'static),
    flags: Flags,
    url: &Url,
    progress: &Progress,
) -> Fault {
    let mut io_kind = None;
    let mut incomplete = false;
    let mut parse = None;
    let mut innermost = err.to_string();
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io_kind.is_none()
        {
            io_kind = Some(io.kind());
        }
        // hyper's stable descriptions of its conditions; matching the text also covers the
        // I/O errors hyper makes itself (an end of file inside a body).
        let text = e.to_string();
        if text.contains("connection closed before message completed")
            || text.contains("end of file before message length reached")
        {
            incomplete = true;
        }
        if text.starts_with("invalid HTTP") || text.contains("message head is too large") {
            parse = Some(text.clone());
        }
        innermost = text;
        source = e.source();
    }
    let target = target(url);

    if flags.connect
        || (progress.status.is_none() && io_kind == Some(io::ErrorKind::ConnectionRefused))
    {
        let why = match io_kind {
            Some(io::ErrorKind::ConnectionRefused) => "connection refused".to_owned(),
            Some(io::ErrorKind::TimedOut) => "connect timed out".to_owned(),
            _ if flags.dns => format!("could not resolve host ({innermost})"),
            _ => innermost,
        };
        return Fault::new(
            FaultCategory::Connect,
            format!("could not connect to {target}: {why}"),
        );
    }
    if let Some(parse) = parse {
        return Fault::new(
            FaultCategory::Protocol,
            format!("malformed HTTP response from {target}: {parse}"),
        );
    }
    if flags.timeout && io_kind != Some(io::ErrorKind::ConnectionReset) {
        return Fault::new(
            FaultCategory::Timeout,
            format!("timed out talking to {target}; {}", progress.describe()),
        );
    }
    let what = match io_kind {
        Some(io::ErrorKind::ConnectionReset) => "connection reset by peer".to_owned(),
        Some(io::ErrorKind::ConnectionAborted) => "connection aborted".to_owned(),
        Some(io::ErrorKind::BrokenPipe) => "connection closed while sending the request".to_owned(),
        Some(io::ErrorKind::UnexpectedEof) => "connection closed early".to_owned(),
        _ if incomplete => "connection closed early".to_owned(),
        _ => innermost,
    };
    let when = match progress.status {
        // A server with a request size limit may drop a large request unread instead of
        // answering 413; Trellis itself sets no limit on what it sends.
        None if progress.request_bytes >= LARGE_REQUEST
            && matches!(
                io_kind,
                Some(io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset)
            ) =>
        {
            format!(
                "before the response headers, while sending a {}-byte request: probably over \
                 the agent's request size limit (Trellis sets none)",
                progress.request_bytes
            )
        }
        None => "before the response headers".to_owned(),
        Some(_) => {
            let mut s = format!("after {} bytes of body", progress.body_bytes);
            if let Some(len) = progress.content_length {
                let _ = write!(s, " (Content-Length {len}; truncated response)");
            }
            s
        }
    };
    Fault::new(
        FaultCategory::Transport,
        format!("{what} {when} ({target})"),
    )
}

/// `host:port` of `url`, as fault messages name an agent.
fn target(url: &Url) -> String {
    url.host_str().map_or_else(
        || url.to_string(),
        |host| match url.port_or_known_default() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        },
    )
}

/// When a failed attempt may be tried again.
///
/// The rule, the same for every protocol: a fault that provably never reached the agent
/// (`connect`: nothing was sent) and an answer the agent gave as a server error (`http_5xx`)
/// are retried up to `retries` times. A timeout or a broken connection may have happened
/// after the agent received the request and acted on it (a booking made twice), so those
/// are retried only when the suite says the agent tolerates it (`retry-after-send #true`).
/// Everything else (4xx, malformed answers) would come back the same and is never retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    /// Also retry timeouts and broken connections.
    pub after_send: bool,
}

impl RetryPolicy {
    pub fn allows(&self, category: FaultCategory) -> bool {
        match category {
            FaultCategory::Connect | FaultCategory::Http5xx => true,
            FaultCategory::Timeout | FaultCategory::Transport => self.after_send,
            _ => false,
        }
    }
}

/// What [`with_retries`] ended with.
#[derive(Clone, Debug)]
pub struct Attempted<T> {
    pub result: Result<T, Fault>,
    /// Every attempt started, with its fault; empty only when the deadline had already
    /// passed.
    pub attempts: Vec<Attempt>,
}

/// Runs `attempt` up to `1 + policy.retries` times, retrying only what `policy` allows,
/// with exponential backoff and jitter between attempts, and never past `deadline`.
///
/// `attempt` receives the timeout it must respect: `timeout`, shrunk when the deadline is
/// closer. A timeout fault of an attempt cut short by the deadline is reported as the
/// trajectory timeout it really is. An attempt answered HTTP 429 (its fault marked
/// [`RateLimited`]) is waited out ([`RateLimitWaits`]) and sent again without spending a
/// retry.
pub async fn with_retries<T, F, Fut>(
    policy: RetryPolicy,
    timeout: Duration,
    deadline: Option<Instant>,
    mut attempt: F,
) -> Attempted<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, Fault>>,
{
    let mut backoff = ExponentialBuilder::new()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .with_max_times(usize::try_from(policy.retries).unwrap_or(usize::MAX))
        .with_jitter()
        .with_jitter_seed(jitter_seed())
        .build();
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut rate_limits = RateLimitWaits::default();
    loop {
        let started = Instant::now();
        let (budget, cut_by_deadline) = match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(started);
                if left.is_zero() {
                    return Attempted {
                        result: Err(Fault::new(
                            FaultCategory::Timeout,
                            "trajectory timeout: no time left for the call",
                        )),
                        attempts,
                    };
                }
                if left < timeout {
                    (left, true)
                } else {
                    (timeout, false)
                }
            }
            None => (timeout, false),
        };
        let mut result = attempt(budget).await;
        let latency = started.elapsed();
        let fault = match &mut result {
            Ok(_) => {
                attempts.push(Attempt {
                    latency,
                    fault: None,
                });
                break Attempted { result, attempts };
            }
            Err(fault) => fault,
        };
        // A 429: the agent did not take the request. It is waited out as a model provider's
        // is, without spending a retry: a rate limit in front of an agent says nothing of
        // the agent.
        if let Some(limited) = fault.rate_limited.take() {
            attempts.push(Attempt {
                latency,
                fault: Some(fault.clone()),
            });
            match rate_limits.next(limited.retry_after, deadline) {
                Some(wait) => {
                    wait_out_rate_limit(wait).await;
                    continue;
                }
                None => {
                    *fault = rate_limits.gave_up("the agent's `concurrency`");
                    break Attempted { result, attempts };
                }
            }
        }
        let n = attempts.len() + 1;
        if cut_by_deadline && fault.category == FaultCategory::Timeout {
            *fault = trajectory_timeout(n, &fault.message);
        }
        attempts.push(Attempt {
            latency,
            fault: Some(fault.clone()),
        });
        if cut_by_deadline && fault.category == FaultCategory::Timeout {
            break Attempted { result, attempts };
        }
        if !policy.allows(fault.category) {
            if policy.retries > 0
                && fault.category.is_retryable()
                && !fault.message.contains("retry-after-send")
            {
                fault.message.push_str(
                    " (not retried: the request may have reached the agent; \
                     `retry-after-send #true` allows it)",
                );
            }
            break Attempted { result, attempts };
        }
        let Some(mut delay) = backoff.next() else {
            if n > 1 {
                fault.message.push_str(&format!(" (after {n} attempts)"));
            }
            break Attempted { result, attempts };
        };
        // A 503's `Retry-After` says when the server is back: a retry before then meets
        // the same outage and spends itself for nothing.
        let asked = fault.back_after.take();
        if let Some(asked) = asked {
            delay = delay.max(asked.min(MAX_SINGLE_RATE_LIMIT_WAIT));
        }
        if let Some(deadline) = deadline
            && Instant::now() + delay >= deadline
        {
            let wait = match asked {
                Some(asked) => format!("before the {asked:?} its Retry-After asked for"),
                None => "during backoff".to_owned(),
            };
            fault.message.push_str(&format!(
                " (attempt {n}; not retried: the trajectory timeout would pass {wait})"
            ));
            break Attempted { result, attempts };
        }
        // No new call starts once the run stops: a backoff (a 503's `Retry-After` of a
        // minute, say) ends there with the fault it would have retried, recorded on the
        // turn, not sat out until the stop's grace drops the call with its trajectory.
        let stopped = async {
            match this_turns_run() {
                Some(run) => run.stop().cancelled().await,
                None => std::future::pending().await,
            }
        };
        let cut = tokio::select! {
            biased;
            () = stopped => true,
            () = tokio::time::sleep(delay) => false,
        };
        if cut {
            fault
                .message
                .push_str(&format!(" (attempt {n}; not retried: the run was stopped)"));
            break Attempted { result, attempts };
        }
    }
}

fn trajectory_timeout(attempts: usize, detail: &str) -> Fault {
    Fault::new(
        FaultCategory::Timeout,
        format!("trajectory timeout reached during attempt {attempts}: {detail}"),
    )
}

/// Seeds backoff jitter differently per call so that agents failing together do not retry in
/// lockstep (backon's own seeding needs its `std` feature, which the workspace leaves off).
fn jitter_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    nanos ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

/// What a wait out of a 429 needs of its run's stop ([`droppable_while_rate_limited`]):
/// the executor's shared state, behind one reference count per turn.
pub trait RunStop: Send + Sync {
    /// Cancelled when the run stops.
    fn stop(&self) -> &tokio_util::sync::CancellationToken;
    /// When the stop's grace period ends, for a stop that has one: calls still in flight
    /// then are dropped.
    fn grace_end(&self) -> &tokio::sync::watch::Sender<Option<Instant>>;
}

/// Ends once the run is stopping and its calls in flight are dropped before `ends`.
async fn outlasted_by(run: &dyn RunStop, ends: Instant) {
    run.stop().cancelled().await;
    let mut grace_end = run.grace_end().subscribe();
    loop {
        if grace_end
            .borrow_and_update()
            .is_some_and(|grace| ends > grace)
        {
            return;
        }
        if grace_end.changed().await.is_err() {
            // The run is over: nothing will drop the call.
            std::future::pending::<()>().await;
        }
    }
}

/// What a turn's call knows of its run ([`droppable_while_rate_limited`]).
struct TurnScope {
    run: Arc<dyn RunStop>,
    /// Whether it wrote a request to a one-call-at-a-time agent yet
    /// ([`drop_unsent_turn_if_stopping`]).
    sent: Cell<bool>,
}

tokio::task_local! {
    /// Around a turn ([`droppable_while_rate_limited`]): one scope, since each wraps (and
    /// moves) the whole call's future.
    static RUN_STOP: TurnScope;
}

thread_local! {
    /// Set by a wait out of a 429, in the poll of the turn's call, when the call is to be
    /// dropped; read and cleared by the turn right after that poll, on the same thread.
    static DROP_THE_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Called right before a request of a turn ([`droppable_while_rate_limited`]) is written
/// to an agent that takes one call at a time (a kept process or connection), after the
/// turn waited for it: when the run was stopped by a signal (a stop with a grace) before
/// the turn sent anything, drops the turn, as the run starts no agent call once it stops.
/// A turn that already sent a request is in flight and goes on; so does every turn of a
/// stop without a grace (an LLM budget's, which lets calls finish). Outside a turn, returns
/// at once.
pub(crate) async fn drop_unsent_turn_if_stopping() {
    let unsent_and_stopping = RUN_STOP
        .try_with(|turn| {
            !turn.sent.replace(true)
                && turn.run.stop().is_cancelled()
                && turn.run.grace_end().borrow().is_some()
        })
        .unwrap_or(false);
    if unsent_and_stopping {
        DROP_THE_CALL.with(|drop| drop.set(true));
        std::future::pending::<()>().await;
    }
}

/// Waits `wait` out of an HTTP 429. In a turn ([`droppable_while_rate_limited`]), a stop
/// that drops calls in flight before the wait would end drops this call at once.
/// The run of the turn this task is taking (`droppable_while_rate_limited` sets it), if
/// any: a judge's or a provider's call outside a turn has none.
fn this_turns_run() -> Option<Arc<dyn RunStop>> {
    RUN_STOP.try_with(|turn| Arc::clone(&turn.run)).ok()
}

pub async fn wait_out_rate_limit(wait: Duration) {
    let ends = Instant::now() + wait;
    let outlasted = async {
        match this_turns_run() {
            Some(run) => outlasted_by(&*run, ends).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        () = outlasted => {
            DROP_THE_CALL.with(|drop| drop.set(true));
            std::future::pending::<()>().await;
        }
    }
}

/// Runs a turn's `call`; `None`, with the call dropped, when its run stops (`run`) and drops
/// calls in flight at a time (a signal's grace period) before the call's wait
/// out of a rate limit ends. Such a call has nothing in flight to finish: the run would
/// only sit out the grace period to drop it then, and the agent has not taken its request,
/// so its trajectory is as unfinished as one never started. A wait that ends within the
/// grace, or a stop that lets calls finish (an LLM budget's), keeps the call.
///
/// Only the wait and a turn queued at a one-call-at-a-time agent
/// ([`drop_unsent_turn_if_stopping`]) watch the stop: a turn pays a reference count, a
/// task-local and a flag read per poll (docs/architecture.md, "Key decisions", the
/// graceful stop).
pub async fn droppable_while_rate_limited<F: Future>(
    run: Arc<dyn RunStop>,
    call: F,
) -> Option<F::Output> {
    let scope = TurnScope {
        run,
        sent: Cell::new(false),
    };
    let mut call = std::pin::pin!(RUN_STOP.scope(scope, call));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if DROP_THE_CALL.with(|drop| drop.replace(false)) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// The longest a call waits out HTTP 429 answers in total before it gives up.
pub const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(300);
/// One `Retry-After` is honoured up to this long.
const MAX_SINGLE_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);
/// Wait after a 429 without `Retry-After`; doubles each time.
const FIRST_RATE_LIMIT_WAIT: Duration = Duration::from_secs(1);
/// The least a 429 is waited out: `Retry-After: 0` (or a date in the past) must not make a
/// tight request loop.
const MIN_RATE_LIMIT_WAIT: Duration = Duration::from_millis(200);
/// 429 answers a call takes at most before it gives up, however short their waits.
const MAX_RATE_LIMIT_ANSWERS: u32 = 30;

/// Waiting out HTTP 429 answers of one call. A 429 is the server asking for patience, not a
/// failure of whoever answers: each wait is the answer's `Retry-After` (capped), else
/// exponential, for up to [`MAX_RATE_LIMIT_WAIT`] in total and never past the deadline.
#[derive(Debug)]
pub struct RateLimitWaits {
    waited: Duration,
    next: Duration,
    count: u32,
    /// The wait refused because it would have passed the deadline.
    past_deadline: Option<Duration>,
}

impl Default for RateLimitWaits {
    fn default() -> Self {
        RateLimitWaits {
            waited: Duration::ZERO,
            next: FIRST_RATE_LIMIT_WAIT,
            count: 0,
            past_deadline: None,
        }
    }
}

impl RateLimitWaits {
    /// After a 429 that asked for `retry_after`: how long to wait before trying again, or
    /// `None` when the call must give up (waited long enough, or the deadline is nearer).
    pub fn next(
        &mut self,
        retry_after: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Option<Duration> {
        self.count += 1;
        let wait = retry_after
            .unwrap_or(self.next)
            .clamp(MIN_RATE_LIMIT_WAIT, MAX_SINGLE_RATE_LIMIT_WAIT);
        self.next = (self.next * 2).min(MAX_SINGLE_RATE_LIMIT_WAIT);
        if deadline.is_some_and(|d| Instant::now() + wait >= d) {
            self.past_deadline = Some(wait);
            return None;
        }
        if self.waited + wait > MAX_RATE_LIMIT_WAIT || self.count >= MAX_RATE_LIMIT_ANSWERS {
            return None;
        }
        self.waited += wait;
        Some(wait)
    }

    /// 429 answers seen so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Time waited so far.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The fault of a call that gave up; `load` names the settings that lower the load.
    pub fn gave_up(&self, load: &str) -> Fault {
        let answers = match self.count {
            1 => "1 answer".to_owned(),
            n => format!("{n} answers"),
        };
        let message = match self.past_deadline {
            Some(wait) => format!(
                "HTTP 429 Too Many Requests: still rate limited after {answers} and {:.0} s of \
                 waiting, and the next wait ({:.1} s) would pass the trajectory's timeout; \
                 lower the load ({load}) or raise the `timeout`",
                self.waited.as_secs_f64(),
                wait.as_secs_f64()
            ),
            None => format!(
                "HTTP 429 Too Many Requests: still rate limited after {answers} and {:.0} s of \
                 waiting; lower the load ({load}) or retry later",
                self.waited.as_secs_f64()
            ),
        };
        Fault::new(FaultCategory::Http4xx, message)
    }
}

/// The wait a `Retry-After` header asks for: delay-seconds or an HTTP date (relative to
/// `now`); `None` when absent or unreadable. Azure OpenAI's `retry-after-ms` (milliseconds,
/// sometimes without `Retry-After`, and finer when both are sent) comes first.
pub fn retry_after(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
    }
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = value.parse::<f64>()
        && seconds.is_finite()
        && seconds >= 0.0
    {
        return Some(Duration::from_secs_f64(seconds.min(86_400.0)));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A 2xx or 429 response goes back to the caller's loop; any other status is the fault it
/// maps to (5xx retried, 4xx not).
pub fn answer_or_fault(response: RawResponse) -> Result<RawResponse, Fault> {
    if response.status.is_success() || response.status == StatusCode::TOO_MANY_REQUESTS {
        Ok(response)
    } else {
        Err(status_fault_with(
            response.status,
            Some(&response.headers),
            &response.body,
        ))
    }
}

#[cfg(test)]
mod rate_limit_tests {
    use super::*;

    #[test]
    fn zero_waits_are_floored_and_a_call_gives_up() {
        let mut waits = RateLimitWaits::default();
        let mut total = Duration::ZERO;
        let mut answers = 0;
        while let Some(wait) = waits.next(Some(Duration::ZERO), None) {
            assert!(wait >= MIN_RATE_LIMIT_WAIT);
            total += wait;
            answers += 1;
            assert!(answers <= MAX_RATE_LIMIT_ANSWERS, "never gives up");
        }
        // The last answer is not waited out: the call gives up on it, "30 answers in all".
        assert_eq!(answers, MAX_RATE_LIMIT_ANSWERS - 1);
        assert!(total <= MAX_RATE_LIMIT_WAIT);
        let message = waits.gave_up("`concurrency`").message;
        assert!(
            message.contains("429") && message.contains("after 30 answers"),
            "{message}"
        );
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn a_status_the_registry_does_not_name_reads_as_its_number() {
        let message = |code: u16| {
            status_fault(StatusCode::from_u16(code).unwrap(), b"{\"type\":\"error\"}").message
        };
        assert_eq!(message(529), "HTTP 529 (overloaded): {\"type\":\"error\"}");
        assert_eq!(message(599), "HTTP 599: {\"type\":\"error\"}");
        assert_eq!(
            message(503),
            "HTTP 503 Service Unavailable: {\"type\":\"error\"}"
        );
    }
}
