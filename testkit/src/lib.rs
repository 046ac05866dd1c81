//! Test support shared by every Trellis crate's tests: small raw-TCP HTTP servers that
//! misbehave in one precise way each, counting what they saw, so protocol and CLI tests run
//! against real sockets; and helpers to drive a Connexity client against them. [`llm`] is a
//! scripted fake LLM endpoint (OpenAI and Anthropic shapes); [`browser`] drives a headless
//! chromium for tests of what a page does.

pub mod browser;
pub mod llm;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions};
use trellis_engine::plan::{Plan, Selection};
use trellis_engine::protocol::connexity::{ConnexityClient, HistoryMode, ParsedReply};
use trellis_engine::protocol::{CallContext, ChatMessage};
use trellis_engine::record::{Fault, NodeRecord, RunSummary, TrajectoryRecord};
use trellis_engine::render::EnvSnapshot;
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};

/// A minimal valid Connexity answer.
pub const OK_BODY: &str =
    r#"{"messages":[{"role":"assistant","content":"Hello there."}],"model":"m","provider":"p"}"#;

/// What a [`MisbehavingServer`] does with each request.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Answer every request with this status and body.
    Respond { status: u16, body: String },
    /// Answer the n-th request with the n-th entry; the last entry repeats.
    Sequence(Vec<(u16, String)>),
    /// Send headers announcing a body, then one byte per `interval`, forever.
    SlowDrip { interval: Duration },
    /// Read the request, then close with SO_LINGER 0 so the client sees a reset.
    Reset,
    /// Announce a 100-byte body, send 10 bytes, then close.
    Truncated,
    /// Send a 200 with a body of `bytes` bytes, with or without a Content-Length header.
    Huge { bytes: u64, content_length: bool },
    /// Answer every request with a 200 and this body after `delay` (a slow but healthy agent).
    Delayed { delay: Duration, body: String },
    /// Answer the first request on each connection with `body` and keep the connection
    /// open; close it, without a byte, when the next request arrives on it (a server that
    /// times out idle keep-alive connections just as the client reuses one).
    CloseReused {
        body: String,
        /// How long each answer takes (a turn that takes a while leaves the connection
        /// of the turn before idle long enough for the client to reuse it).
        delay: Duration,
    },
    /// Answer every request with a 200 and `body`, except requests whose header `header`
    /// is `value` once `after` of those were answered: they get no answer, their connection
    /// held open until the client goes (a process stalled mid-run, to be killed there).
    HangAfter {
        body: String,
        header: String,
        value: String,
        after: usize,
    },
    /// Answer every request with this status and body (framed by Content-Length, without
    /// `Connection: close`), then close the connection 20 ms later: a server that keeps no
    /// connection alive and does not say so.
    RespondThenClose { status: u16, body: String },
    /// Answer every request with a 200 and [`OK_BODY`] (without `Connection: close`), then
    /// close the connection `after` it, without reading anything more: a hand-written
    /// HTTP/1.1 server that keeps no connection and does not say so, closing sooner than
    /// the client's next turn can wait for.
    CloseAfterAnswer { after: Duration },
    /// Read a request's head; when it announces a body over `limit` bytes, drop the
    /// connection without reading the body or answering (as some servers with a body size
    /// limit do; the client sees the connection reset while it sends).
    RefuseLargeBody { limit: usize },
    /// Answer every request with a 200 whose body is `body` as given, with
    /// `Content-Encoding: coding` (a server that compresses unasked).
    Encoded { coding: String, body: Vec<u8> },
    /// Answer the first `times` requests with HTTP 429 (with `Retry-After: retry_after` when
    /// given, and `body`, which may be an HTML page), the later ones with a 200 and
    /// [`OK_BODY`]: a gateway's rate limit in front of an agent.
    RateLimited {
        times: usize,
        retry_after: Option<String>,
        body: String,
    },
    /// Answer the first `times` requests with HTTP 503 and `Retry-After: retry_after`, the
    /// later ones with a 200 and [`OK_BODY`]: a server restarting that says when it is back.
    Unavailable { times: usize, retry_after: String },
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Request line and headers.
    pub head: String,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// The value of header `name` (case-insensitive), if sent.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

/// What a server observed.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicUsize,
    pub requests: AtomicUsize,
    /// Body bytes the server managed to write (for [`Behavior::Huge`]).
    pub body_bytes_written: AtomicU64,
    pub recorded: Mutex<Vec<Recorded>>,
    /// Requests [`Behavior::HangAfter`] recognised by their header, answered or not.
    pub tagged: AtomicUsize,
    /// Connections [`Behavior::CloseReused`] closed on a second request, unanswered.
    pub closed_unanswered: AtomicUsize,
    /// Signalled each time a connection handler finishes.
    pub connection_done: Notify,
}

/// A one-behaviour HTTP/1.1 server on 127.0.0.1, stopped when dropped.
pub struct MisbehavingServer {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl Drop for MisbehavingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MisbehavingServer {
    pub async fn start(behavior: Behavior) -> Self {
        Self::listen(
            (Ipv4Addr::LOCALHOST, 0).into(),
            behavior,
            64,
            Duration::ZERO,
        )
    }

    /// An agent on `addr` (an agent that was down coming back on its address, for one).
    pub async fn start_at(addr: SocketAddr, behavior: Behavior) -> Self {
        Self::listen(addr, behavior, 64, Duration::ZERO)
    }

    /// A healthy agent (every request answered with [`OK_BODY`]) whose accept queue holds
    /// two connections and which accepts nothing for `accepting_after`: connections past the
    /// queue's room have their SYN dropped until then (as an agent on Python's
    /// `http.server`, whose queue is 5, does under load).
    pub async fn overflowing(accepting_after: Duration) -> Self {
        let behavior = Behavior::Respond {
            status: 200,
            body: OK_BODY.to_owned(),
        };
        // Linux queues backlog + 1 connections.
        Self::listen(
            (Ipv4Addr::LOCALHOST, 0).into(),
            behavior,
            1,
            accepting_after,
        )
    }

    fn listen(
        addr: SocketAddr,
        behavior: Behavior,
        backlog: u32,
        accepting_after: Duration,
    ) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        // A small send buffer keeps what the kernel absorbs on behalf of a client that
        // stopped reading small, so byte counts reflect what the client actually pulled.
        socket.set_send_buffer_size(64 * 1024).unwrap();
        socket.bind(addr).unwrap();
        let listener = socket.listen(backlog).unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn({
            let stats = stats.clone();
            async move {
                if !accepting_after.is_zero() {
                    tokio::time::sleep(accepting_after).await;
                }
                accept_loop(listener, behavior, stats).await;
            }
        });
        MisbehavingServer { addr, stats, task }
    }

    pub async fn respond(status: u16, body: impl Into<String>) -> Self {
        Self::start(Behavior::Respond {
            status,
            body: body.into(),
        })
        .await
    }

    pub fn url(&self) -> String {
        format!("http://{}/agent/respond", self.addr)
    }

    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.stats.connections.load(Ordering::SeqCst)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.stats.recorded.lock().unwrap().clone()
    }

    /// Requests received whose header `name` was `value` (case-insensitive name).
    pub fn requests_with(&self, name: &str, value: &str) -> usize {
        self.stats
            .recorded
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.header(name).as_deref() == Some(value))
            .count()
    }

    /// Requests [`Behavior::HangAfter`] recognised by their header so far.
    pub fn tagged(&self) -> usize {
        self.stats.tagged.load(Ordering::SeqCst)
    }

    /// Connections [`Behavior::CloseReused`] closed on a second request, unanswered.
    pub fn closed_unanswered(&self) -> usize {
        self.stats.closed_unanswered.load(Ordering::SeqCst)
    }
}

/// An address with nothing listening (bound, then released).
pub async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

/// A Connexity client for `url` with its own transport, retrying only what never reached
/// the agent (the default rule).
pub fn client(url: &str, retries: u32, limits: CallLimits) -> ConnexityClient {
    client_with(
        url,
        RetryPolicy {
            retries,
            after_send: false,
        },
        limits,
    )
}

/// A Connexity client for `url` with its own transport, which sends a request lost after it
/// was written again only when `retry.after_send` says so, as a run sets it up.
pub fn client_with(url: &str, retry: RetryPolicy, limits: CallLimits) -> ConnexityClient {
    ConnexityClient::new(
        url,
        Vec::new(),
        limits,
        retry,
        HistoryMode::Messages,
        HttpTransport::new().replaying_lost(retry.after_send),
    )
    .unwrap()
}

/// One request's result with every attempt's fault, as the tests look at it.
#[derive(Debug)]
pub struct CallOutcome {
    pub result: Result<ParsedReply, Fault>,
    pub attempts: u32,
    /// The fault of each failed attempt, in order.
    pub faults: Vec<Fault>,
}

pub async fn respond(
    client: &ConnexityClient,
    history: &[ChatMessage],
    ctx: &CallContext<'_>,
) -> CallOutcome {
    let (exchange, result) = client.respond(history, ctx).await;
    CallOutcome {
        result,
        attempts: exchange.attempts.len() as u32,
        faults: exchange
            .attempts
            .iter()
            .filter_map(|a| a.fault.clone())
            .collect(),
    }
}

pub fn limits(timeout: Duration) -> CallLimits {
    CallLimits {
        timeout,
        max_response_size: 8 * 1024 * 1024,
    }
}

pub fn ctx(turn_index: u32) -> CallContext<'static> {
    CallContext {
        test_case_id: "case-1",
        turn_index,
        deadline: None,
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    }
}

async fn accept_loop(listener: TcpListener, behavior: Behavior, stats: Arc<Stats>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        stats.connections.fetch_add(1, Ordering::SeqCst);
        let behavior = behavior.clone();
        let stats = stats.clone();
        tokio::spawn(async move {
            // Errors only mean the client went away, which is the point of most behaviours.
            let _ = serve_connection(stream, &behavior, &stats).await;
            stats.connection_done.notify_one();
        });
    }
}

async fn serve_connection(
    mut stream: TcpStream,
    behavior: &Behavior,
    stats: &Stats,
) -> io::Result<()> {
    let mut buf = Vec::new();
    if let Behavior::RefuseLargeBody { limit } = behavior {
        let head = loop {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break String::from_utf8_lossy(&buf[..pos]).into_owned();
            }
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        stats.requests.fetch_add(1, Ordering::SeqCst);
        if length > *limit {
            stream.set_zero_linger()?;
            return Ok(());
        }
        buf.clear();
        write_response(&mut stream, 200, OK_BODY).await?;
        return Ok(());
    }
    let mut on_connection = 0usize;
    loop {
        let Some(request) = read_request(&mut stream, &mut buf).await? else {
            return Ok(());
        };
        on_connection += 1;
        if matches!(behavior, Behavior::CloseReused { .. }) && on_connection > 1 {
            stats.closed_unanswered.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        let n = stats.requests.fetch_add(1, Ordering::SeqCst);
        let hang = match behavior {
            Behavior::HangAfter {
                header,
                value,
                after,
                ..
            } if request.header(header).as_deref() == Some(value.as_str()) => {
                stats.tagged.fetch_add(1, Ordering::SeqCst) >= *after
            }
            _ => false,
        };
        stats.recorded.lock().unwrap().push(request);
        if hang {
            // Silent until the client closes the connection (or is killed).
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            return Ok(());
        }
        match behavior {
            Behavior::HangAfter { body, .. } => write_response(&mut stream, 200, body).await?,
            Behavior::CloseReused { body, delay } => {
                tokio::time::sleep(*delay).await;
                write_response(&mut stream, 200, body).await?
            }
            Behavior::RefuseLargeBody { .. } => return Ok(()),
            Behavior::Respond { status, body } => {
                write_response(&mut stream, *status, body).await?
            }
            Behavior::Encoded { coding, body } => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: \
                     {coding}\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                stream.write_all(head.as_bytes()).await?;
                stream.write_all(body).await?;
            }
            Behavior::RespondThenClose { status, body } => {
                write_response(&mut stream, *status, body).await?;
                // After the client has taken the answer (and kept the connection), before it
                // would send again.
                tokio::time::sleep(Duration::from_millis(20)).await;
                stream.shutdown().await?;
                return Ok(());
            }
            Behavior::CloseAfterAnswer { after } => {
                write_response(&mut stream, 200, OK_BODY).await?;
                tokio::time::sleep(*after).await;
                stream.shutdown().await?;
                return Ok(());
            }
            Behavior::Sequence(answers) => {
                let (status, body) = answers
                    .get(n)
                    .or(answers.last())
                    .cloned()
                    .unwrap_or((200, OK_BODY.to_owned()));
                write_response(&mut stream, status, &body).await?;
            }
            Behavior::RateLimited {
                times,
                retry_after,
                body,
            } => {
                if n < *times {
                    let content_type = if body.trim_start().starts_with('<') {
                        "text/html"
                    } else {
                        "application/json"
                    };
                    let retry_after = retry_after
                        .as_ref()
                        .map(|v| format!("retry-after: {v}\r\n"))
                        .unwrap_or_default();
                    let head = format!(
                        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: {content_type}\r\n\
                         {retry_after}content-length: {}\r\n\r\n",
                        body.len()
                    );
                    stream.write_all(head.as_bytes()).await?;
                    stream.write_all(body.as_bytes()).await?;
                } else {
                    write_response(&mut stream, 200, OK_BODY).await?;
                }
            }
            Behavior::Unavailable { times, retry_after } => {
                if n < *times {
                    let head = format!(
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
                         retry-after: {retry_after}\r\ncontent-length: 10\r\n\r\nrestarting"
                    );
                    stream.write_all(head.as_bytes()).await?;
                } else {
                    write_response(&mut stream, 200, OK_BODY).await?;
                }
            }
            Behavior::Delayed { delay, body } => {
                tokio::time::sleep(*delay).await;
                write_response(&mut stream, 200, body).await?
            }
            Behavior::SlowDrip { interval } => {
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n",
                    )
                    .await?;
                loop {
                    stream.write_all(b" ").await?;
                    tokio::time::sleep(*interval).await;
                }
            }
            Behavior::Reset => {
                stream.set_zero_linger()?;
                return Ok(());
            }
            Behavior::Truncated => {
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"messages\"",
                    )
                    .await?;
                stream.shutdown().await?;
                return Ok(());
            }
            Behavior::Huge {
                bytes,
                content_length,
            } => {
                let mut head =
                    String::from("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n");
                if *content_length {
                    head.push_str(&format!("content-length: {bytes}\r\n"));
                } else {
                    head.push_str("connection: close\r\n");
                }
                head.push_str("\r\n");
                stream.write_all(head.as_bytes()).await?;
                let chunk = vec![b' '; 16 * 1024];
                let mut left = *bytes;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    stream.write_all(&chunk[..n]).await?;
                    stats
                        .body_bytes_written
                        .fetch_add(n as u64, Ordering::SeqCst);
                    left -= n as u64;
                }
                stream.shutdown().await?;
                return Ok(());
            }
        }
    }
}

/// Reads one request (head and Content-Length body); `None` at a clean end of stream.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Option<Recorded>> {
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let body_start = head_end + 4;
    while buf.len() < body_start + length {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[body_start..body_start + length].to_vec();
    buf.drain(..body_start + length);
    Ok(Some(Recorded { head, body }))
}

async fn write_response(stream: &mut TcpStream, status: u16, body: &str) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await
}

/// What a run sent on its event stream, collected.
#[derive(Debug, Default)]
pub struct Run {
    pub nodes: Vec<NodeRecord>,
    pub trajectories: Vec<TrajectoryRecord>,
    pub summary: RunSummary,
}

/// Runs `plan` with `jobs` calls in flight and collects every event.
pub async fn run_plan(plan: Plan, jobs: usize) -> Run {
    run_plan_with_cache(plan, jobs, trellis_engine::llm::LlmCache::disabled()).await
}

/// Runs `plan` like [`run_plan`], with `llm_cache` as the LLM response cache.
pub async fn run_plan_with_cache(
    plan: Plan,
    jobs: usize,
    llm_cache: trellis_engine::llm::LlmCache,
) -> Run {
    let (tx, mut rx) = event::channel();
    let options = RunOptions {
        run_id: "test".into(),
        jobs,
        stop: Default::default(),
        abandon: Default::default(),
        grace_end: Default::default(),
        strict: false,
        reuse: None,
        transport: None,
        llm_cache,
        launcher: Some(std::sync::Arc::new(trellis_agents::BuiltinLauncher::new())),
        resume: None,
        replay_users: None,
        first: Vec::new(),
        llm_budget: Default::default(),
        telemetry: Default::default(),
    };
    let engine = execute::spawn(plan, options, tx);
    let mut run = Run::default();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Node(n) => run.nodes.push(n),
            Event::Trajectory(t) => run.trajectories.push(*t),
            Event::RunFinished(s) => run.summary = s,
            Event::RunStarted(_) | Event::Agent(_) | Event::Spans(_) => {}
        }
    }
    engine.await.unwrap();
    run
}

/// Loads `text` as one suite file and runs all of it, with `env` as the environment
/// templates see (never the process's).
pub async fn run_suite(text: &str, jobs: usize, env: EnvSnapshot) -> Run {
    run_suite_with_cache(text, jobs, env, trellis_engine::llm::LlmCache::disabled()).await
}

/// [`run_suite`] with `llm_cache` as the LLM response cache.
pub async fn run_suite_with_cache(
    text: &str,
    jobs: usize,
    env: EnvSnapshot,
    llm_cache: trellis_engine::llm::LlmCache,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.kdl");
    std::fs::write(&path, text).unwrap();
    let project = match trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs()) {
        Ok(p) => p,
        Err(d) => panic!("{}", d.render_plain()),
    };
    let plan = Plan::build_with_env(&project, &Selection::default(), Arc::new(env)).unwrap();
    run_plan_with_cache(plan, jobs, llm_cache).await
}
