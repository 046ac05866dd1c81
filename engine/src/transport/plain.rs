//! Plain HTTP/1.1 for agents reached directly, without TLS or a proxy: local agents, a dev
//! loop, a benchmark. hyper's connection API, driven inside the task that awaits the answer,
//! over a keep-alive pool of Trellis's own.
//!
//! Why not reqwest for these: every request through it crosses its redirect and retry
//! services, parses the URL again, clones its client several times and hands the request to
//! a connection task over a channel; against a loopback agent that was about half of a
//! turn's CPU (docs/performance.md, "The turn path: where a turn's CPU goes"). Here the
//! request is written, and the answer read, by the task that awaits it, with no task or
//! channel hop between them.
//! Everything else (https, proxies, credentials in the URL, streaming) stays on reqwest; the
//! caller ([`super::http`]) chooses, and maps failures of both to the same faults.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, Url};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Idle connections kept per agent address; more than the run's concurrency is never
/// useful, and the cap bounds what a run holds open.
const MAX_IDLE_PER_HOST: usize = 1024;

/// URLs whose [`Endpoint`] the pool keeps. A run calls a handful; one whose URLs vary per
/// call (a session id in the path) works the rest out at each request, as for the first.
const MAX_ENDPOINTS: usize = 64;

/// Whether `url` can take the plain path: `http`, no credentials in it (reqwest turns those
/// into an `Authorization` header), and no proxy that could apply to it.
pub(super) fn eligible(url: &Url, loopback: bool) -> bool {
    url.scheme() == "http"
        && url.username().is_empty()
        && url.password().is_none()
        && url.host().is_some()
        && (loopback || !proxy_configured())
}

/// Whether the environment names a proxy for plain HTTP (reqwest's variables). When it does,
/// only loopback agents bypass it, as they do on reqwest's path.
fn proxy_configured() -> bool {
    static CONFIGURED: OnceLock<bool> = OnceLock::new();
    *CONFIGURED.get_or_init(|| {
        ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
    })
}

/// Where a connection goes: the URL's host (as written, brackets and all) and port.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Address {
    host: String,
    port: u16,
}

impl Address {
    fn of(url: &Url) -> Option<Address> {
        Some(Address {
            host: url.host_str()?.to_owned(),
            port: url.port_or_known_default()?,
        })
    }
}

/// The connections of one address: those idle, and what its server was seen to do with
/// them.
type Idle = Arc<Pooled>;

#[derive(Default)]
struct Pooled {
    /// Idle connections, most recently used last, with when each went idle.
    conns: Mutex<Vec<(Conn, Instant)>>,
    /// A kept-alive connection answered a request: the server keeps connections.
    answered_on_reuse: AtomicBool,
    /// The server closes each connection after its answer, whatever HTTP/1.1 says, without
    /// a `Connection: close` (hand-written servers do): its connections are not kept, so no
    /// request races its close.
    closes_after_answer: AtomicBool,
}

/// What every request to one URL shares, worked out at its first request rather than at
/// each (a `Host` header formatted, a target parsed, an address allocated and hashed were
/// about 1,500 instructions of every turn against a local agent).
struct Endpoint {
    url: Box<str>,
    address: Address,
    /// The request target: the URL's path and query, origin-form.
    target: Option<hyper::Uri>,
    host: Option<HeaderValue>,
    /// Shared by every endpoint of the same address.
    idle: Idle,
}

impl Endpoint {
    fn new(url: &Url, address: Address, idle: Idle) -> Endpoint {
        let mut target =
            String::with_capacity(url.path().len() + url.query().map_or(0, |q| q.len() + 1));
        target.push_str(url.path());
        if let Some(query) = url.query() {
            target.push('?');
            target.push_str(query);
        }
        let host = match url.port() {
            Some(_) => format!("{}:{}", address.host, address.port),
            None => address.host.clone(),
        };
        Endpoint {
            url: url.as_str().into(),
            // A parsed `Url`'s path and query are always a valid origin-form target, and
            // its host a valid header value.
            target: hyper::Uri::try_from(target).ok(),
            host: HeaderValue::from_str(&host).ok(),
            address,
            idle,
        }
    }
}

impl Pooled {
    /// Learns from a request that a reused connection, `idle` before it, lost `after` it
    /// went out, before any answer: when no connection here ever answered a second request
    /// and this one was idle only moments, the server closes each after its answer (the
    /// close raced the request), and its connections are no longer kept. The lost request
    /// is not sent again for that (a server that read it and crashed looks the same:
    /// `retry-after-send`). A connection idle for long was closed as idle, as keep-alive
    /// servers do (uvicorn and Node after 5 s): nothing is learned from it.
    fn learn_from_loss(&self, error: &hyper::Error, after: Duration, idle: Duration) {
        if after < super::http::KEEP_ALIVE_RACE
            && idle < CLOSED_AS_IDLE
            && super::http::connection_closed(error)
            && !self.answered_on_reuse.load(Ordering::Relaxed)
        {
            self.closes_after_answer.store(true, Ordering::Relaxed);
        }
    }
}

/// One keep-alive connection: the handle requests are sent through and the state machine
/// that reads and writes the socket, polled by whichever task is using the connection.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// `None` once it finished (the peer closed, or the connection failed). Boxed: the
    /// driver is about 700 bytes that every request's futures, from the pool up to the
    /// protocol's turn, carried and moved at each level (one allocation per connection
    /// instead).
    driver: Option<Driver>,
}

type Driver = Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>;

/// Runs `work` while driving `conn`, so that whatever `work` waits for on the connection (a
/// request written, an answer read) happens in this task. The driver is polled between two
/// polls of `work`, so an answer it has just read is taken without another wake-up.
///
/// A driver that finishes is dropped at once. Its error, if any, reaches the request or the
/// body being read; and a request it had not taken yet (sent just as the agent closed the
/// connection) fails as canceled instead of waiting, until the turn's timeout, on a
/// connection nothing reads any more.
async fn drive<F: Future>(driver: &mut Option<Driver>, work: F) -> F::Output {
    let mut work = pin!(work);
    poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        if let Some(running) = driver.as_mut()
            && Pin::new(running).poll(cx).is_ready()
        {
            *driver = None;
        }
        work.as_mut().poll(cx)
    })
    .await
}

/// How an exchange on the plain path failed.
#[derive(Debug)]
pub(super) enum PlainError {
    /// The agent's address did not resolve.
    Resolve(io::Error),
    /// No connection could be made (refused, unreachable, timed out).
    Connect(io::Error),
    /// The connection failed while the request was written or the answer awaited;
    /// `reused`: it was a kept-alive connection that had served earlier requests; `after`:
    /// how long after the request started to go out (a kept-alive race takes moments, an
    /// agent that dies while working takes longer).
    Exchange {
        error: hyper::Error,
        reused: bool,
        after: Duration,
    },
}

/// The response of an exchange on the plain path, its body still to be read.
pub(super) struct Answer {
    pub(super) response: hyper::Response<Incoming>,
    conn: Conn,
    endpoint: Arc<Endpoint>,
}

/// The plain-HTTP connection pool of a run.
#[derive(Default)]
pub(super) struct PlainPool {
    known: Mutex<Known>,
    /// Connections made again because the agent's accept queue was full.
    pub(super) redone: super::connect::Redone,
}

#[derive(Default)]
struct Known {
    /// By URL, in the order first called; a run calls a handful, so a scan beats hashing.
    endpoints: Vec<Arc<Endpoint>>,
    /// The idle connections of every address called, those of URLs past
    /// [`MAX_ENDPOINTS`] included, so that those are reused too.
    idle: HashMap<Address, Idle>,
}

impl std::fmt::Debug for PlainPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainPool").finish_non_exhaustive()
    }
}

impl PlainPool {
    /// Sends one request and waits for the response headers. A pooled connection the agent
    /// closed while it was idle is found closed before the request goes out, and a fresh
    /// one is made. A request a pooled connection could not take (closed before it was
    /// written) is sent again, once, on a fresh connection; one lost after it was written,
    /// before any answer, only when `replay_lost` (see
    /// [`super::http::HttpTransport::replaying_lost`]): the agent may have read it.
    pub(super) async fn send(
        &self,
        method: &Method,
        url: &Url,
        headers: &HeaderMap,
        body: Option<&Bytes>,
        connect_timeout: Duration,
        replay_lost: bool,
    ) -> Result<Answer, PlainError> {
        let Some(endpoint) = self.endpoint(url) else {
            return Err(PlainError::Resolve(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the URL has no host",
            )));
        };
        let request = || build_request(method, &endpoint, headers, body);
        // Until a connection to the server has answered a second request, only one idle for
        // [`CLOSE_GRACE`] is reused: a server that closes each connection just after its
        // answer without saying so (no `Connection: close`) may still have its close on the
        // way, and a request sent into it is lost. A fresh connection costs less than
        // waiting.
        let proven = endpoint.idle.answered_on_reuse.load(Ordering::Relaxed);
        if let Some((mut conn, idle)) = take(&endpoint.idle, proven) {
            if !proven {
                // The runtime polls its I/O driver before this task goes on: a close that
                // has reached the socket is then seen by the poll below, even when this
                // thread was too busy to take the event in.
                tokio::task::yield_now().await;
            }
            // The agent may have closed it while it was idle: the driver, polled before
            // anything is sent, reads the end of the stream and finishes.
            poll_fn(|cx| {
                if let Some(running) = conn.driver.as_mut()
                    && Pin::new(running).poll(cx).is_ready()
                {
                    conn.driver = None;
                }
                Poll::Ready(())
            })
            .await;
            // Closed moments after its one answer: a server that closes each one (a fresh
            // connection for every request from now). Closed after a long idle: closed as
            // idle, as keep-alive servers do.
            if !proven && conn.driver.is_none() && idle < CLOSED_AS_IDLE {
                endpoint
                    .idle
                    .closes_after_answer
                    .store(true, Ordering::Relaxed);
            }
            let ready = {
                let Conn { sender, driver } = &mut conn;
                drive(driver, poll_fn(|cx| sender.poll_ready(cx))).await
            };
            if ready.is_ok() && conn.driver.is_some() {
                let sent = std::time::Instant::now();
                match exchange(&mut conn, request()).await {
                    Ok(response) => {
                        endpoint
                            .idle
                            .answered_on_reuse
                            .store(true, Ordering::Relaxed);
                        return Ok(Answer {
                            response,
                            conn,
                            endpoint,
                        });
                    }
                    Err(error) if !lost_unanswered(&error, replay_lost) => {
                        endpoint.idle.learn_from_loss(&error, sent.elapsed(), idle);
                        return Err(PlainError::Exchange {
                            error,
                            reused: true,
                            after: sent.elapsed(),
                        });
                    }
                    // Never written: a fresh connection, whose own failure is the answer.
                    Err(error) if error.is_canceled() => {}
                    // Lost before any answer, by a caller that may send it again: a fresh
                    // connection. Should that fail too, this loss is what the attempt
                    // reports: the agent may have run the request (a server that died
                    // under it), which a refused connect alone would hide.
                    Err(error) => {
                        endpoint.idle.learn_from_loss(&error, sent.elapsed(), idle);
                        let lost = PlainError::Exchange {
                            error,
                            reused: true,
                            after: sent.elapsed(),
                        };
                        let Ok(mut conn) =
                            connect(&endpoint.address, connect_timeout, &self.redone).await
                        else {
                            return Err(lost);
                        };
                        return fresh(&mut conn, request()).await.map(|response| Answer {
                            response,
                            conn,
                            endpoint,
                        });
                    }
                }
            }
        }
        let mut conn = connect(&endpoint.address, connect_timeout, &self.redone).await?;
        let response = fresh(&mut conn, request()).await?;
        Ok(Answer {
            response,
            conn,
            endpoint,
        })
    }

    /// Reads the next piece of `answer`'s body: `Ok(None)` at its end, when the connection
    /// goes back to the pool.
    pub(super) async fn next_chunk(
        &self,
        answer: &mut Answer,
    ) -> Result<Option<Bytes>, hyper::Error> {
        let Answer {
            response,
            conn,
            endpoint: _,
        } = answer;
        let body = response.body_mut();
        let Conn { driver, .. } = conn;
        loop {
            match drive(driver, body.frame()).await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(Some(data));
                    }
                    // Trailers, or an empty data frame: nothing to add.
                }
            }
        }
    }

    /// Gives a connection whose answer was read to its end back to the pool.
    pub(super) fn release(&self, answer: Answer) {
        let Answer { conn, endpoint, .. } = answer;
        if conn.driver.is_none()
            || conn.sender.is_closed()
            || endpoint.idle.closes_after_answer.load(Ordering::Relaxed)
        {
            return;
        }
        let Ok(mut idle) = endpoint.idle.conns.lock() else {
            return;
        };
        if idle.len() < MAX_IDLE_PER_HOST {
            idle.push((conn, Instant::now()));
        }
    }

    /// `url`'s endpoint, worked out at its first request; `None` when it has no host.
    fn endpoint(&self, url: &Url) -> Option<Arc<Endpoint>> {
        let mut known = self.known.lock().ok()?;
        if let Some(endpoint) = known.endpoints.iter().find(|e| *e.url == *url.as_str()) {
            return Some(endpoint.clone());
        }
        let address = Address::of(url)?;
        // Every URL of the same address (another path) shares its connections.
        let idle = known.idle.entry(address.clone()).or_default().clone();
        let endpoint = Arc::new(Endpoint::new(url, address, idle));
        if known.endpoints.len() < MAX_ENDPOINTS {
            known.endpoints.push(endpoint.clone());
        }
        Some(endpoint)
    }
}

/// How long a connection must have been idle before it is reused, until a connection to
/// its server has answered a second request (see [`PlainPool::send`]): a server that closes
/// each connection after its answer does so moments after it (a Python server's `close()`
/// after its `sendall`), and a request sent in between is lost. Until then, requests go on
/// fresh connections: a few connections more in a run's first milliseconds.
const CLOSE_GRACE: Duration = Duration::from_millis(5);

/// A connection found closed after being idle this long was closed as idle (keep-alive
/// servers close idle connections after seconds), not by a server that closes each
/// connection after its answer, which does so within moments.
const CLOSED_AS_IDLE: Duration = Duration::from_secs(1);

/// The most recently used idle connection of `idle` (the likeliest to still be open),
/// dropping those idle for longer than the pool keeps them.
/// Unless the server is `proven` to keep connections open after an answer, only one idle
/// for [`CLOSE_GRACE`] or longer (the oldest: the likeliest to show a close) is taken. With
/// how long it was idle.
fn take(idle: &Idle, proven: bool) -> Option<(Conn, Duration)> {
    let mut conns = idle.conns.lock().ok()?;
    if !proven {
        conns.retain(|(conn, since)| {
            since.elapsed() < super::http::POOL_IDLE_TIMEOUT && conn.driver.is_some()
        });
        let ready = conns
            .first()
            .is_some_and(|(_, since)| since.elapsed() >= CLOSE_GRACE);
        return ready.then(|| {
            let (conn, since) = conns.remove(0);
            (conn, since.elapsed())
        });
    }
    while let Some((conn, since)) = conns.pop() {
        if since.elapsed() < super::http::POOL_IDLE_TIMEOUT && conn.driver.is_some() {
            return Some((conn, since.elapsed()));
        }
    }
    None
}

/// Sends `request` on `conn` and waits for the response headers, driving the connection.
/// [`exchange`] on a connection just made: its failure is the attempt's.
async fn fresh(
    conn: &mut Conn,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, PlainError> {
    let sent = std::time::Instant::now();
    exchange(conn, request)
        .await
        .map_err(|error| PlainError::Exchange {
            error,
            reused: false,
            after: sent.elapsed(),
        })
}

async fn exchange(
    conn: &mut Conn,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, hyper::Error> {
    let Conn { sender, driver } = conn;
    let response = sender.send_request(request);
    drive(driver, response).await
}

/// Whether a request a reused connection failed before any byte of an answer may go again
/// on a fresh one: the connection could not take it at all (it was never written), or, for
/// a caller that may send it twice (`replay_lost`), it was closed (or reset) under it.
fn lost_unanswered(error: &hyper::Error, replay_lost: bool) -> bool {
    error.is_canceled() || (replay_lost && super::http::connection_closed(error))
}

/// A new connection to `address`: every resolved address is tried in turn, within
/// `timeout` overall.
async fn connect(
    address: &Address,
    timeout: Duration,
    redone: &super::connect::Redone,
) -> Result<Conn, PlainError> {
    let connecting = async {
        // An IP literal (brackets stripped for IPv6) needs no resolver round trip.
        let literal = address
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok();
        let addrs: Vec<SocketAddr> = match literal {
            Some(ip) => vec![SocketAddr::new(ip, address.port)],
            None if super::connect::is_localhost(&address.host) => {
                super::connect::loopbacks(address.port)
            }
            None => tokio::net::lookup_host((address.host.as_str(), address.port))
                .await
                .map_err(PlainError::Resolve)?
                .collect(),
        };
        super::connect::connect(&addrs, redone)
            .await
            .map_err(PlainError::Connect)
    };
    let stream = match tokio::time::timeout(timeout, connecting).await {
        Ok(stream) => stream?,
        Err(_) => {
            return Err(PlainError::Connect(io::Error::new(
                io::ErrorKind::TimedOut,
                "connect timed out",
            )));
        }
    };
    // Small requests go out at once rather than waiting for an acknowledgement.
    let _ = stream.set_nodelay(true);
    let (sender, driver) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|error| PlainError::Exchange {
            error,
            reused: false,
            after: Duration::ZERO,
        })?;
    Ok(Conn {
        sender,
        driver: Some(Box::new(driver)),
    })
}

/// The request as reqwest would send it: origin-form target, `Host`, the caller's headers,
/// a user agent and `Accept: */*` unless the caller set them, and the turn's trace context.
fn build_request(
    method: &Method,
    endpoint: &Endpoint,
    headers: &HeaderMap,
    body: Option<&Bytes>,
) -> hyper::Request<Full<Bytes>> {
    let mut request = hyper::Request::new(Full::new(body.cloned().unwrap_or_default()));
    *request.method_mut() = method.clone();
    if let Some(target) = &endpoint.target {
        *request.uri_mut() = target.clone();
    }
    let map = request.headers_mut();
    map.reserve(headers.len() + 4);
    if let Some(host) = &endpoint.host {
        map.insert(header::HOST, host.clone());
    }
    for (name, value) in headers {
        map.append(name, value.clone());
    }
    if !map.contains_key(header::USER_AGENT) {
        map.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("trellis/", env!("CARGO_PKG_VERSION"))),
        );
    }
    if !map.contains_key(header::ACCEPT) {
        map.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    }
    super::trace::insert_headers(map);
    request
}
