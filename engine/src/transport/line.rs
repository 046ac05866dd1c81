//! The line transport: newline-delimited JSON with an agent process or over a socket, for
//! every protocol that speaks it (MultiAgentEval's `command=` and `socket=` agents).
//!
//! Written once, like [`super::http`]: it owns what does not depend on the protocol. A
//! request is one JSON document; the answer is one line, read with a bound on its length so
//! a 20 MB line is a `too_large` fault, not 20 MB of memory. Three ways to reach an agent:
//!
//! - a long-lived process that reads one request line on stdin and answers one line on
//!   stdout (what the spec describes);
//! - a process per call that gets the request without a trailing newline, stdin closed, and
//!   whose whole stdout is the answer (what the real harness does);
//! - a TCP or Unix socket (`tcp://host:port`, `tcp:host:port`, `unix:///path`, `unix:/path`),
//!   a connection per call or kept open.
//!
//! Processes run in their own process group: a timeout ends the whole tree, and every child
//! is waited for, so a run leaves no zombies. What a process writes on stderr is kept (the
//! most recent [`STDERR_KEPT`] bytes) and handed to the caller as the agent's log.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::record::{Fault, FaultCategory};

/// Bytes of a process's stderr kept for the records.
pub const STDERR_KEPT: usize = 64 * 1024;
/// How long an ended process may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// Where a line-speaking agent lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineEndpoint {
    Process(ProcessSpec),
    Tcp(String),
    Unix(PathBuf),
}

/// How to start an agent process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Run by `sh -c`, so users write commands as in a terminal.
    pub command: String,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub mode: ProcessMode,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProcessMode {
    /// One process for every call: a request line in, an answer line out.
    #[default]
    LongLived,
    /// A process per call: the request on stdin (no newline, then closed), the whole of
    /// stdout is the answer.
    PerCall,
}

/// A socket address could not be understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid socket address `{0}`: expected tcp://HOST:PORT, tcp:HOST:PORT, unix:///PATH or unix:/PATH"
)]
pub struct SocketAddressError(pub String);

impl LineEndpoint {
    /// Parses both spellings real agents and harnesses use: `tcp://host:port` and
    /// `tcp:host:port`, `unix:///path` and `unix:/path`.
    pub fn socket(address: &str) -> Result<Self, SocketAddressError> {
        let invalid = || SocketAddressError(address.to_owned());
        if let Some(rest) = address.strip_prefix("tcp:") {
            let host_port = rest.strip_prefix("//").unwrap_or(rest);
            let (host, port) = host_port.rsplit_once(':').ok_or_else(invalid)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(invalid());
            }
            return Ok(LineEndpoint::Tcp(host_port.to_owned()));
        }
        if let Some(rest) = address.strip_prefix("unix:") {
            // unix:///path → /path; unix:/path → /path; unix://path is not a path.
            let path = match rest.strip_prefix("//") {
                Some(p) => p,
                None => rest,
            };
            if !path.starts_with('/') || path.len() < 2 {
                return Err(invalid());
            }
            return Ok(LineEndpoint::Unix(PathBuf::from(path)));
        }
        Err(invalid())
    }
}

/// Per-call limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineLimits {
    /// The whole call: connect or start, send, answer.
    pub timeout: Duration,
    /// The longest answer line accepted, in bytes.
    pub max_line: u64,
}

/// The answer to one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LineReply {
    /// The answer, without its line ending.
    pub line: Vec<u8>,
    /// What the process wrote on stderr since the previous call (processes only).
    pub log: String,
    /// A line a connection of the call's own carried after the answer (its first 200
    /// bytes): the request was answered twice.
    pub extra: Option<String>,
}

/// A connection to one line-speaking agent. Calls on one pipe or socket are exclusive: a
/// line protocol has no request ids, so two calls in flight would swap their answers. A
/// process or a connection per call shares nothing between calls, so those calls run side
/// by side (the agent's `concurrency` bounds them, in the executor).
pub struct LineTransport {
    endpoint: LineEndpoint,
    limits: LineLimits,
    /// Keep a socket connection open between calls (processes: long-lived mode keeps its
    /// process regardless).
    keep_open: bool,
    open: tokio::sync::Mutex<Option<Connection>>,
    /// Where `tcp:` connections made again are counted ([`super::connect`]).
    redone: super::connect::Redone,
    /// Where requests sent again to a new process are counted, by command.
    resent: super::connect::Tally<String>,
}

enum Connection {
    Process(Box<LiveProcess>),
    /// Buffered once per connection, so nothing an agent sends ahead is lost between calls;
    /// with when its last answer was read ([`SETTLE`]).
    Socket(BufReader<Box<dyn Duplex>>, Option<tokio::time::Instant>),
}

trait Duplex: AsyncRead + AsyncWrite + AsRawFd + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + AsRawFd + Send + Unpin> Duplex for T {}

/// What an idle kept pipe or connection holds before a request is written, or right after
/// an answer was read.
enum Ahead {
    /// Nothing to read yet: open and quiet.
    Quiet,
    /// The agent closed (or broke) its end.
    Closed,
    /// The agent wrote something no request asked for (its first line, cut): the next
    /// answer read would be that, one behind, maybe another trajectory's.
    Sent(String),
}

/// Reads what `reader` holds without waiting for the agent; blank lines it wrote are
/// dropped. Whether `fd` has bytes is asked of the kernel: the runtime learns of them only
/// when its driver next runs, and a line that arrived after the answer's last read would
/// otherwise look like nothing until the next request had read it as its answer.
async fn ahead<R: AsyncRead + Unpin>(reader: &mut BufReader<R>, fd: RawFd) -> Ahead {
    loop {
        if reader.buffer().is_empty() && !readable_now(fd) {
            return Ahead::Quiet;
        }
        // Readable now: the read returns at once, once the runtime has seen it.
        let filled = tokio::time::timeout(Duration::from_millis(200), reader.fill_buf()).await;
        match filled {
            Err(_) => return Ahead::Quiet,
            Ok(Err(_)) | Ok(Ok([])) => return Ahead::Closed,
            Ok(Ok(buffered)) => {
                let blank = buffered
                    .iter()
                    .take_while(|b| b.is_ascii_whitespace())
                    .count();
                if blank < buffered.len() {
                    let line: Vec<u8> = buffered[blank..]
                        .iter()
                        .take_while(|&&b| b != b'\n')
                        .take(200)
                        .copied()
                        .collect();
                    return Ahead::Sent(String::from_utf8_lossy(&line).into_owned());
                }
                reader.consume(blank);
            }
        }
    }
}

/// Whether reading `fd` would not block now: bytes, end of stream or an error wait.
fn readable_now(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout; `fd` is open for as long as its reader.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents != 0
}

/// The fault of an answer followed at once by another line: which of the two answers the
/// request cannot be told, and the second would answer the next request.
fn answered_twice(line: &str, describe: &str) -> Fault {
    Fault::new(
        FaultCategory::Protocol,
        format!(
            "{describe} wrote another line after its answer: {line:?} (one line answers one \
             request; logs belong on stderr)"
        ),
    )
}

/// The note on a call whose kept pipe or connection held a line from before its request:
/// that line was dropped with the connection, and the call went to a fresh one.
fn stale_note(line: &str) -> String {
    format!(
        "trellis: the agent had written {line:?} after its previous answer, unasked; that \
         connection was closed and this request sent on a new one\n"
    )
}

struct LiveProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Arc<StderrLog>,
    /// Completes when stderr is closed: a process per call has written all of its log then.
    stderr_closed: tokio::task::JoinHandle<()>,
    /// Ends whatever the agent started when the process is dropped without `close`.
    _group: ProcessGroup,
    /// When a kept process's last answer was read ([`SETTLE`]).
    answered_at: Option<tokio::time::Instant>,
}

/// How long after a kept process's or connection's answer a line it writes is still taken
/// as written after that answer, not as the next request's: a request is written no
/// sooner. An agent that prints a log line right after its answer (`print(answer,
/// flush=True)`, then `print("handled")`) writes it microseconds later, but on a busy
/// machine the next request went out first and read it as its own answer, another
/// trajectory's turn. Paid only by a request that follows the previous answer closer than
/// this.
const SETTLE: Duration = Duration::from_millis(2);

/// Acknowledges what the agent sent at once, instead of with the next request. An agent
/// that writes a second line right after its answer (two `sendall`s, Nagle's algorithm on)
/// holds that line until its answer is acknowledged; delayed, the acknowledgement rode on
/// the next request, and the held line then arrived as that request's answer, another
/// trajectory's turn, with every answer after it one behind. Acknowledged now, the line
/// arrives before the next request goes out ([`SETTLE`]) and is found as the extra line it
/// is. Linux only keeps quick acknowledgements on until the next delayed one, so this is
/// asked after each answer; where the option is unknown it changes nothing.
fn ack_now(fd: RawFd) {
    #[cfg(target_os = "linux")]
    {
        let on: libc::c_int = 1;
        // SAFETY: `fd` is the open socket the answer was just read from; the value is an int
        // of the size given.
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                std::ptr::addr_of!(on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = fd;
}

/// A process group that is killed when dropped: `kill_on_drop` ends only the direct child,
/// and an agent started by `sh -c` usually is a grandchild.
struct ProcessGroup(Option<i32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // SAFETY: killpg has no memory-safety preconditions. The group outlives its
            // leader while any member runs, which is exactly when this matters.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl LineTransport {
    pub fn new(endpoint: LineEndpoint, limits: LineLimits, keep_open: bool) -> Self {
        LineTransport {
            endpoint,
            limits,
            keep_open,
            open: tokio::sync::Mutex::new(None),
            redone: super::connect::Redone::default(),
            resent: super::connect::Tally::default(),
        }
    }

    /// Counts `tcp:` connections made again in `redone`, the run's
    /// ([`super::http::HttpTransport::connections_redone`]), rather than in one of its own.
    pub fn counting_in(mut self, redone: super::connect::Redone) -> Self {
        self.redone = redone;
        self
    }

    /// Counts requests sent again to a long-lived process started afresh in `resent`, the
    /// run's ([`super::http::HttpTransport::requests_resent`]).
    pub fn counting_resent_in(mut self, resent: super::connect::Tally<String>) -> Self {
        self.resent = resent;
        self
    }

    pub fn endpoint(&self) -> &LineEndpoint {
        &self.endpoint
    }

    /// Sends `request` (one JSON document, no line ending) and reads the answer line,
    /// within `timeout` (at most the transport's own timeout).
    pub async fn call(&self, request: &[u8], timeout: Duration) -> Result<LineReply, Fault> {
        self.call_queued(request, timeout).await.1
    }

    /// [`LineTransport::call`], with the time the call waited for another call on the same
    /// pipe or socket to finish: that wait is not the agent's latency (the timeout starts
    /// after it).
    pub async fn call_queued(
        &self,
        request: &[u8],
        timeout: Duration,
    ) -> (Duration, Result<LineReply, Fault>) {
        let (queued, reply) = self
            .call_decoded(request, timeout, |line| Ok(line.to_vec()), |_| false)
            .await;
        (
            queued,
            reply.map(|(line, log)| LineReply {
                line,
                log,
                extra: None,
            }),
        )
    }

    /// [`LineTransport::call_queued`], with the answer line decoded by `decode` before the
    /// pipe or socket is free for the next call; with it, the process's stderr since the
    /// previous call. A line `decode` refuses ends a kept pipe or socket like any failure:
    /// an agent that wrote a stray line (a log line on stdout, or an error report before its
    /// real answer) may still have its answer in the pipe, and the next call, maybe another
    /// trajectory's, would read it as its own and every answer after would be one behind.
    /// An answer `ends` says ends it too (an agent's own error report: which of the two it
    /// was cannot be told from the line, and a wrong answer checked as right is worse than a
    /// process started again), though it is returned as decoded.
    pub async fn call_decoded<T>(
        &self,
        request: &[u8],
        timeout: Duration,
        decode: impl FnOnce(&[u8]) -> Result<T, Fault>,
        ends: impl FnOnce(&T) -> bool,
    ) -> (Duration, Result<(T, String), Fault>) {
        let timeout = timeout.min(self.limits.timeout);
        let describe = self.describe();
        let decoded = |reply: Result<LineReply, Fault>| {
            reply.and_then(|reply| {
                // What the process logged (and a resend's note) stays with a refused answer.
                let value = decode(&reply.line).map_err(|mut fault| {
                    append_log(&mut fault, &reply.log);
                    fault
                })?;
                match reply.extra {
                    Some(extra) => Err(answered_twice(&extra, &describe)),
                    None => Ok((value, reply.log)),
                }
            })
        };
        match &self.endpoint {
            LineEndpoint::Process(spec) if spec.mode == ProcessMode::PerCall => {
                return (
                    Duration::ZERO,
                    decoded(self.call_once(spec, request, timeout).await),
                );
            }
            LineEndpoint::Tcp(_) | LineEndpoint::Unix(_) if !self.keep_open => {
                // A connection of its own per call: nothing to wait for.
                return (
                    Duration::ZERO,
                    decoded(self.locked_call(&mut None, request, timeout).await),
                );
            }
            _ => {}
        }
        let waiting = tokio::time::Instant::now();
        let mut open = self.open.lock().await;
        // A turn queued behind others is not sent once the run stops.
        super::http::drop_unsent_turn_if_stopping().await;
        let queued = waiting.elapsed();
        let mut result = decoded(self.locked_call(&mut open, request, timeout).await);
        // An answer followed at once by another line: which of the two answers the request
        // cannot be told, and the second would answer the next call. (A line the decoder
        // refused, a log line before the answer, is reported as such above.)
        if result.is_ok()
            && let Some(connection) = open.as_mut()
            && let Ahead::Sent(extra) = connection.ahead().await
        {
            result = Err(answered_twice(&extra, &self.describe()));
        }
        if result.as_ref().map_or(true, |(value, _)| ends(value))
            && let Some(connection) = open.take()
        {
            connection.kill().await;
        }
        (queued, result)
    }

    async fn locked_call(
        &self,
        open: &mut Option<Connection>,
        request: &[u8],
        timeout: Duration,
    ) -> Result<LineReply, Fault> {
        // Whether the call went to a process or connection that served an earlier one:
        // `exchange` starts a fresh one when the kept one ended since.
        let mut fresh = false;
        let mut result = self.exchange(open, request, timeout, &mut fresh).await;
        let reused = !fresh;
        end_after_failure(open, &result).await;
        // A kept process or connection that ended without answering anything (most likely
        // it exited, or closed, after its last answer, racing the check in `exchange`, and
        // never read this request): started afresh and asked once more, as a long-lived
        // agent is restarted when it dies. An agent that read the request and then died is
        // sent it twice (docs/language.md says so); one that answered part of it is not.
        if reused
            && let Err(first) = &result
            && never_read(first)
        {
            // Said on the turn, so the agent's log showing the request twice is explained.
            let note = format!(
                "trellis: the request was sent again on a new {}: the first ended without \
                 answering ({})\n",
                match self.endpoint {
                    LineEndpoint::Process(_) => "process",
                    _ => "connection",
                },
                first.message
            );
            result = self.exchange(open, request, timeout, &mut fresh).await;
            end_after_failure(open, &result).await;
            match &mut result {
                Ok(reply) => {
                    // Counted for the run only when the new process answered: then the
                    // turn has no fault and nothing else shows the death. A socket's
                    // server closing a kept connection between calls is ordinary.
                    if let LineEndpoint::Process(spec) = &self.endpoint {
                        self.resent.add(spec.command.clone(), 1);
                    }
                    reply.log.insert_str(0, &note);
                }
                Err(fault) => {
                    fault.message.push_str("; ");
                    fault.message.push_str(note.trim_end());
                }
            }
        }
        result
    }

    fn timed_out(&self, timeout: Duration) -> Fault {
        Fault::new(
            FaultCategory::Timeout,
            format!(
                "no answer within {}ms from {}",
                timeout.as_millis(),
                self.describe()
            ),
        )
    }

    /// Sends `request` on the kept process or connection, or a fresh one (`fresh` is then
    /// set).
    async fn exchange(
        &self,
        open: &mut Option<Connection>,
        request: &[u8],
        timeout: Duration,
        fresh: &mut bool,
    ) -> Result<LineReply, Fault> {
        match &self.endpoint {
            LineEndpoint::Process(spec) if spec.mode == ProcessMode::PerCall => {
                *fresh = true;
                self.call_once(spec, request, timeout).await
            }
            LineEndpoint::Process(spec) => {
                // One that ended since its last answer is started again, not sent a request
                // it can never read.
                if let Some(Connection::Process(process)) = open.as_mut()
                    && matches!(process.child.try_wait(), Ok(Some(_)))
                    && let Some(ended) = open.take()
                {
                    ended.kill().await;
                }
                let mut stale = None;
                if let Some(Connection::Process(process)) = open.as_ref()
                    && let Some(answered) = process.answered_at
                {
                    tokio::time::sleep_until(answered + SETTLE).await;
                }
                if let Some(connection) = open.as_mut()
                    && let Ahead::Sent(line) = connection.ahead().await
                    && let Some(behind) = open.take()
                {
                    behind.kill().await;
                    stale = Some(stale_note(&line));
                }
                if open.is_none() {
                    *fresh = true;
                    *open = Some(Connection::Process(Box::new(spawn(spec)?)));
                }
                let Some(Connection::Process(process)) = open.as_mut() else {
                    return Err(internal("process connection missing"));
                };
                let result = tokio::time::timeout(
                    timeout,
                    exchange_line(
                        &mut process.stdin,
                        &mut process.stdout,
                        request,
                        self.limits.max_line,
                        &self.describe(),
                    ),
                )
                .await
                .unwrap_or_else(|_| Err(self.timed_out(timeout)));
                process.answered_at = Some(tokio::time::Instant::now());
                // What the agent wrote on stderr before its answer is already in the pipe:
                // let the collector read it before the log is taken.
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
                let mut log = process.stderr.take_new();
                if let Some(note) = stale {
                    log.insert_str(0, &note);
                }
                match result {
                    Ok(line) => Ok(LineReply {
                        line,
                        log,
                        extra: None,
                    }),
                    Err(mut fault) => {
                        // A process that closed stdout has usually exited: say how.
                        if fault.category != FaultCategory::Timeout
                            && let Some(status) = exit_status(&mut process.child).await
                        {
                            fault
                                .message
                                .push_str(&format!("; the process exited ({status})"));
                            if could_not_start(status) {
                                fault.category = FaultCategory::Setup;
                            }
                        }
                        append_log(&mut fault, &log);
                        Err(fault)
                    }
                }
            }
            LineEndpoint::Tcp(_) | LineEndpoint::Unix(_) => {
                tokio::time::timeout(timeout, self.socket_exchange(open, request, fresh))
                    .await
                    .unwrap_or_else(|_| Err(self.timed_out(timeout)))
            }
        }
    }

    async fn socket_exchange(
        &self,
        open: &mut Option<Connection>,
        request: &[u8],
        fresh: &mut bool,
    ) -> Result<LineReply, Fault> {
        // A kept connection the agent closed since its last answer (a server that closes
        // after each one) is opened again, not written to; so is one holding a line nobody
        // asked for.
        let mut stale = None;
        if let Some(Connection::Socket(_, Some(answered))) = open.as_ref() {
            tokio::time::sleep_until(*answered + SETTLE).await;
        }
        if let Some(connection) = open.as_mut() {
            match connection.ahead().await {
                Ahead::Quiet => {}
                Ahead::Closed => *open = None,
                Ahead::Sent(line) => {
                    stale = Some(stale_note(&line));
                    *open = None;
                }
            }
        }
        if open.is_none() {
            *fresh = true;
            *open = Some(Connection::Socket(
                BufReader::new(self.connect().await?),
                None,
            ));
        }
        let Some(Connection::Socket(stream, answered_at)) = open.as_mut() else {
            return Err(internal("socket connection missing"));
        };
        let describe = self.describe();
        let mut framed = Vec::with_capacity(request.len() + 1);
        framed.extend_from_slice(request);
        framed.push(b'\n');
        let sent = async {
            stream.get_mut().write_all(&framed).await?;
            stream.get_mut().flush().await
        }
        .await;
        sent.map_err(|e| io_fault(&e, &describe))?;
        let line = read_line(stream, self.limits.max_line, &describe).await;
        *answered_at = Some(tokio::time::Instant::now());
        if matches!(self.endpoint, LineEndpoint::Tcp(_)) {
            ack_now(stream.get_ref().as_raw_fd());
        }
        let mut extra = None;
        if !self.keep_open {
            // The connection is the call's own: a line after the answer is the agent
            // answering twice, not a stale line for the next call.
            if line.is_ok()
                && let Some(connection) = open.as_mut()
                && let Ahead::Sent(line) = connection.ahead().await
            {
                extra = Some(line);
            }
            *open = None;
        }
        line.map(|line| LineReply {
            line,
            log: stale.unwrap_or_default(),
            extra,
        })
    }

    /// The real harness's way: a process per call, stdin closed after the request, the
    /// whole of stdout is the answer.
    async fn call_once(
        &self,
        spec: &ProcessSpec,
        request: &[u8],
        timeout: Duration,
    ) -> Result<LineReply, Fault> {
        let LiveProcess {
            mut child,
            stdin,
            mut stdout,
            stderr,
            stderr_closed,
            _group,
            answered_at: _,
        } = spawn(spec)?;
        let describe = self.describe();
        let limit = self.limits.max_line;
        let mut out = Vec::new();
        let mut stdout_closed = false;
        let run = async {
            // An agent that exits without reading its input closes the pipe: what it
            // printed still decides, so a failed write is not the end. Dropping stdin
            // closes it: the agent reads to the end of its input. Written while stdout is
            // read, as `subprocess.communicate` does: an agent that prints more than a
            // pipe holds before it reads a request larger than one would otherwise wait on
            // Trellis while Trellis waits on it.
            let write = async move {
                let mut stdin = stdin;
                let _ = stdin.write_all(request).await;
                drop(stdin);
            };
            let read = {
                let read = async {
                    let read = (&mut stdout)
                        .take(limit.saturating_add(1))
                        .read_to_end(&mut out)
                        .await;
                    stdout_closed = true;
                    read
                };
                let (mut write, mut read) = (std::pin::pin!(write), std::pin::pin!(read));
                // The answer read (or over the limit) first: the rest of the request is
                // not waited for; dropping it closes stdin.
                tokio::select! {
                    read = &mut read => read,
                    () = &mut write => read.await,
                }
            };
            if out.len() as u64 > limit {
                return (read, None);
            }
            let status = child.wait().await;
            // What it wrote on stderr just before exiting may not be collected yet; a
            // child it left running may hold stderr open, so wait only briefly.
            let _ = tokio::time::timeout(EXIT_GRACE, stderr_closed).await;
            (read, Some(status))
        };
        let Ok((read, status)) = tokio::time::timeout(timeout, run).await else {
            // An agent that printed its answer but did not end is told apart from one that
            // never answered: the fix is in how it exits, not in how fast it thinks.
            let exited = child.try_wait().ok().flatten();
            let _ = kill_group(&mut child).await;
            let mut fault = self.timed_out(timeout);
            if !out.is_empty() {
                let printed = format!("{describe} printed {} bytes", out.len());
                fault.message = match (stdout_closed, exited) {
                    (_, Some(status)) => format!(
                        "{printed} and exited ({status}), but a process it started still held \
                         its stdout open {}ms later: a per-call agent's answer ends when its \
                         stdout closes",
                        timeout.as_millis()
                    ),
                    (true, None) => format!(
                        "{printed} and closed its stdout, but had not exited {}ms later: a \
                         per-call agent exits once it has answered",
                        timeout.as_millis()
                    ),
                    (false, None) => format!(
                        "{printed}, but neither closed its stdout nor exited within {}ms: a \
                         per-call agent exits once it has answered",
                        timeout.as_millis()
                    ),
                };
            }
            append_log(&mut fault, &stderr.take_new());
            return Err(fault);
        };
        let log = stderr.take_new();
        if let Err(e) = read {
            let _ = kill_group(&mut child).await;
            let mut fault = io_fault(&e, &describe);
            append_log(&mut fault, &log);
            return Err(fault);
        }
        let Some(status) = status else {
            let _ = kill_group(&mut child).await;
            return Err(Fault::new(
                FaultCategory::TooLarge,
                format!("{describe} wrote more than {limit} bytes on stdout (max-response-size)"),
            ));
        };
        match status {
            Ok(status) if !status.success() => {
                let mut fault = if could_not_start(status) {
                    Fault::new(
                        FaultCategory::Setup,
                        format!("{describe} could not be started by the shell ({status})"),
                    )
                } else {
                    Fault::new(
                        FaultCategory::Transport,
                        format!("{describe} exited with {status}"),
                    )
                };
                append_log(&mut fault, &log);
                Err(fault)
            }
            Err(e) => Err(io_fault(&e, &describe)),
            Ok(_) => {
                let line = trim_line_end(out);
                if line.iter().all(u8::is_ascii_whitespace) {
                    let mut fault = Fault::new(
                        FaultCategory::Transport,
                        format!("{describe} exited without printing an answer"),
                    );
                    append_log(&mut fault, &log);
                    return Err(fault);
                }
                Ok(LineReply {
                    line,
                    log,
                    extra: None,
                })
            }
        }
    }

    async fn connect(&self) -> Result<Box<dyn Duplex>, Fault> {
        let connect_fault = |e: io::Error| {
            Fault::new(
                FaultCategory::Connect,
                format!("could not connect to {}: {e}", self.describe()),
            )
        };
        match &self.endpoint {
            LineEndpoint::Tcp(address) => {
                let stream = super::connect::connect_host(address, &self.redone)
                    .await
                    .map_err(connect_fault)?;
                let _ = stream.set_nodelay(true);
                Ok(Box::new(stream))
            }
            LineEndpoint::Unix(path) => Ok(Box::new(
                UnixStream::connect(path).await.map_err(connect_fault)?,
            )),
            LineEndpoint::Process(_) => Err(internal("a process is not a socket")),
        }
    }

    fn describe(&self) -> String {
        match &self.endpoint {
            LineEndpoint::Process(spec) => format!("agent process `{}`", spec.command),
            LineEndpoint::Tcp(address) => format!("tcp:{address}"),
            LineEndpoint::Unix(path) => format!("unix:{}", path.display()),
        }
    }

    /// Ends the connection (and a long-lived process with its whole tree). Call when the
    /// run is over; dropping the transport also kills the process, without waiting.
    pub async fn close(&self) {
        if let Some(connection) = self.open.lock().await.take() {
            connection.close().await;
        }
    }
}

impl Connection {
    /// What the agent wrote that no request asked for yet ([`ahead`]).
    async fn ahead(&mut self) -> Ahead {
        match self {
            Connection::Process(process) => {
                let fd = process.stdout.get_ref().as_raw_fd();
                ahead(&mut process.stdout, fd).await
            }
            Connection::Socket(stream, _) => {
                let fd = stream.get_ref().as_raw_fd();
                ahead(stream, fd).await
            }
        }
    }

    /// Ends the connection at once; a process is killed with everything it started.
    async fn kill(self) {
        match self {
            Connection::Process(mut process) => {
                let _ = kill_group(&mut process.child).await;
            }
            Connection::Socket(mut stream, _) => {
                let _ = stream.get_mut().shutdown().await;
            }
        }
    }

    async fn close(self) {
        match self {
            Connection::Process(mut process) => {
                drop(process.stdin);
                // A well-behaved agent exits when its stdin closes; give it a moment.
                if tokio::time::timeout(EXIT_GRACE, process.child.wait())
                    .await
                    .is_err()
                {
                    let _ = kill_group(&mut process.child).await;
                }
            }
            Connection::Socket(mut stream, _) => {
                let _ = stream.get_mut().shutdown().await;
            }
        }
    }
}

/// Writes the request line and reads one answer line.
async fn exchange_line<W, R>(
    write: &mut W,
    read: &mut R,
    request: &[u8],
    max_line: u64,
    describe: &str,
) -> Result<Vec<u8>, Fault>
where
    W: AsyncWrite + Unpin,
    R: AsyncBufReadExt + Unpin,
{
    let mut framed = Vec::with_capacity(request.len() + 1);
    framed.extend_from_slice(request);
    framed.push(b'\n');
    write
        .write_all(&framed)
        .await
        .map_err(|e| io_fault(&e, describe))?;
    write.flush().await.map_err(|e| io_fault(&e, describe))?;
    read_line(read, max_line, describe).await
}

/// Reads one line of at most `max_line` bytes, without buffering more than that.
pub async fn read_line<R: AsyncBufReadExt + Unpin>(
    read: &mut R,
    max_line: u64,
    describe: &str,
) -> Result<Vec<u8>, Fault> {
    let mut line = Vec::new();
    loop {
        let available = read.fill_buf().await.map_err(|e| io_fault(&e, describe))?;
        if available.is_empty() {
            // A whole JSON document and then the end, without the newline: a server that
            // answers one request per connection and closes it has said all it will.
            if line.len() as u64 > max_line {
                return Err(Fault::new(
                    FaultCategory::TooLarge,
                    format!(
                        "{describe} sent an answer longer than {max_line} bytes \
                         (max-response-size)"
                    ),
                ));
            }
            if !line.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_ok() {
                return Ok(trim_line_end(line));
            }
            let what = if line.is_empty() {
                format!("{} {NO_ANSWER}", closed(describe))
            } else {
                format!(
                    "{} in the middle of its answer line: {} bytes and no newline, which are \
                     not one whole JSON document",
                    closed(describe),
                    line.len()
                )
            };
            return Err(Fault::new(
                FaultCategory::Transport,
                format!("{describe} {what}"),
            ));
        }
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        line.extend_from_slice(available.get(..taken).unwrap_or(available));
        read.consume(taken);
        if line.len() as u64 > max_line.saturating_add(1) {
            return Err(Fault::new(
                FaultCategory::TooLarge,
                format!(
                    "{describe} sent an answer line longer than {max_line} bytes \
                     (max-response-size); stopped reading after {} bytes",
                    line.len()
                ),
            ));
        }
        if done {
            return Ok(trim_line_end(line));
        }
    }
}

fn trim_line_end(mut line: Vec<u8>) -> Vec<u8> {
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    line
}

fn spawn(spec: &ProcessSpec) -> Result<LiveProcess, Fault> {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(&*shell_command(&spec.command))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout can end everything it started.
        .process_group(0)
        .kill_on_drop(true);
    for (key, value) in &spec.env {
        command.env(key, value);
    }
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    die_with_trellis(&mut command);
    let mut child = command.spawn().map_err(|e| {
        let message = match &spec.cwd {
            Some(cwd) if !std::path::Path::new(cwd).is_dir() => format!(
                "could not start agent process `{}`: its working directory {} (`cwd`) is not \
                 a directory: {e}",
                spec.command,
                std::path::Path::new(cwd).display()
            ),
            _ => format!("could not start agent process `{}`: {e}", spec.command),
        };
        Fault::new(FaultCategory::Setup, message)
    })?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(internal("the agent process has no pipes"));
    };
    let log = Arc::new(StderrLog::default());
    let stderr_closed = tokio::spawn(collect_stderr(stderr, log.clone()));
    let group = ProcessGroup(child.id().and_then(|pid| i32::try_from(pid).ok()));
    Ok(LiveProcess {
        child,
        stdin,
        stdout: BufReader::new(stdout),
        stderr: log,
        stderr_closed,
        _group: group,
        answered_at: None,
    })
}

/// The text `sh -c` runs for `command`: a single simple command (`python3 -u agent.py`) is
/// run with `exec`, so the agent is the shell's process rather than its child, and dies
/// with Trellis ([`die_with_trellis`]; dash, Debian's `sh`, keeps itself as the parent
/// otherwise). Anything else (lists, pipelines, redirections, assignments, compound
/// commands) is run as written.
fn shell_command(command: &str) -> std::borrow::Cow<'_, str> {
    // `cd agent && python3 main.py`, `. .venv/bin/activate && python3 main.py`: the last
    // command of an `&&` chain of simple steps is the agent.
    // A quoted `&&` is an argument's text, not a list: quoted chains run as written.
    if let Some((steps, last)) = command.rsplit_once("&&")
        && !command.contains(['"', '\'', '\\'])
        && is_simple(last)
        && !steps
            .replace("&&", "")
            .chars()
            .any(|c| matches!(c, ';' | '&' | '|' | '(' | ')' | '`' | '\n'))
    {
        return std::borrow::Cow::Owned(format!("{steps}&& exec {}", last.trim_start()));
    }
    if is_simple(command) {
        return std::borrow::Cow::Owned(format!("exec {command}"));
    }
    std::borrow::Cow::Borrowed(command)
}

/// Whether `command` is one simple command naming a program (no list, pipeline,
/// redirection, expansion or assignment; not a reserved word or a shell builtin, which
/// `exec` could not run).
fn is_simple(command: &str) -> bool {
    const NOT_PROGRAMS: &[&str] = &[
        "if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until", "for",
        "in", "{", "}", "!", "[[", "]]", "function", "select", "time", "exec", ".", ":", "source",
        "eval", "cd", "export", "set", "unset", "read", "wait", "trap", "exit", "return", "shift",
        "alias", "command", "builtin", "local", "readonly", "ulimit", "umask", "type", "hash",
    ];
    let compound = command.chars().any(|c| {
        matches!(
            c,
            ';' | '&' | '|' | '(' | ')' | '`' | '\n' | '<' | '>' | '$'
        )
    });
    let first = command.split_whitespace().next().unwrap_or_default();
    !compound && !first.is_empty() && !first.contains('=') && !NOT_PROGRAMS.contains(&first)
}

/// Asks the kernel to kill the agent process when Trellis dies without ending it (`kill -9`,
/// the OOM killer, `docker kill`): the run's own shutdown ends its whole process group, but a
/// process that is killed runs no shutdown, and its agents would be left running. The signal
/// comes when the *thread* that started the process ends: agents are started from the
/// run's own thread or watch's runtime workers, which live as long as the command; never
/// start one from `spawn_blocking`, whose threads end after a few idle seconds.
#[cfg(target_os = "linux")]
fn die_with_trellis(command: &mut Command) {
    // SAFETY: between fork and exec the closure calls only `prctl` and `getppid`, which
    // are async-signal-safe, and allocates nothing.
    let trellis = std::process::id();
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            // Trellis died before the request took effect: nothing would kill this one.
            if u32::try_from(libc::getppid()).ok() != Some(trellis) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_trellis(_command: &mut Command) {}

/// Ends a process and everything it started, and reaps it.
async fn kill_group(child: &mut Child) -> io::Result<()> {
    if let Some(pid) = child.id()
        && let Ok(pid) = i32::try_from(pid)
    {
        // SAFETY: killpg has no memory-safety preconditions; the group id is the child's
        // pid because it was started with process_group(0).
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
    }
    let _ = child.start_kill();
    child.wait().await.map(|_| ())
}

/// The exit status when the process has exited or exits within a moment.
async fn exit_status(child: &mut Child) -> Option<std::process::ExitStatus> {
    tokio::time::timeout(EXIT_GRACE, child.wait())
        .await
        .ok()
        .and_then(Result::ok)
}

/// The most recent bytes of a process's stderr, and where the last call's log ended.
#[derive(Default)]
struct StderrLog {
    inner: Mutex<StderrInner>,
}

#[derive(Default)]
struct StderrInner {
    kept: VecDeque<u8>,
    /// Bytes of `kept` already handed out.
    taken: usize,
}

impl StderrLog {
    fn push(&self, bytes: &[u8]) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.kept.extend(bytes);
            let excess = inner.kept.len().saturating_sub(STDERR_KEPT);
            if excess > 0 {
                inner.kept.drain(..excess);
                inner.taken = inner.taken.saturating_sub(excess);
            }
        }
    }

    fn take_new(&self) -> String {
        let Ok(mut inner) = self.inner.lock() else {
            return String::new();
        };
        let new: Vec<u8> = inner.kept.iter().skip(inner.taken).copied().collect();
        inner.taken = inner.kept.len();
        String::from_utf8_lossy(&new).into_owned()
    }
}

async fn collect_stderr(mut stderr: tokio::process::ChildStderr, log: Arc<StderrLog>) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        log.push(buf.get(..n).unwrap_or_default());
    }
}

fn append_log(fault: &mut Fault, log: &str) {
    let log = log.trim();
    if log.is_empty() {
        return;
    }
    let tail: String = {
        let chars: Vec<char> = log.chars().collect();
        chars
            .get(chars.len().saturating_sub(300)..)
            .unwrap_or_default()
            .iter()
            .collect()
    };
    fault.message.push_str("; stderr: ");
    fault.message.push_str(&tail);
}

/// Whether `sh -c` could not run the command at all: POSIX shells exit 127 for a command
/// not found and 126 for one that cannot be executed (a setup problem, not the agent's).
fn could_not_start(status: std::process::ExitStatus) -> bool {
    matches!(status.code(), Some(126 | 127))
}

fn io_fault(e: &io::Error, describe: &str) -> Fault {
    let what = match e.kind() {
        io::ErrorKind::ConnectionReset => "reset the connection".to_owned(),
        io::ErrorKind::BrokenPipe => NOT_READ.to_owned(),
        io::ErrorKind::UnexpectedEof => format!("{} early", closed(describe)),
        _ => format!("failed: {e}"),
    };
    Fault::new(FaultCategory::Transport, format!("{describe} {what}"))
}

/// After a failure the pipe or socket is in an unknown state: ends it (the whole process
/// tree, for a process), so the next call starts afresh.
async fn end_after_failure<T>(open: &mut Option<Connection>, result: &Result<T, Fault>) {
    if result.is_err()
        && let Some(connection) = open.take()
    {
        connection.kill().await;
    }
}

/// An agent that closed its end with nothing of an answer written (after [`closed`]).
const NO_ANSWER: &str = "without answering";

/// What an agent closed, in its transport's words: a process its stdout (a pipe, not a
/// connection), a socket agent the connection.
fn closed(describe: &str) -> &'static str {
    if describe.starts_with("agent process") {
        "closed its stdout"
    } else {
        "closed the connection"
    }
}
/// An agent whose input was closed when the request was written.
const NOT_READ: &str = "closed its input before reading the request";

/// Whether `fault` says the agent ended before it answered anything: on a kept process or
/// connection, one that ended between calls.
fn never_read(fault: &Fault) -> bool {
    fault.category == FaultCategory::Transport
        && (fault.message.contains(NO_ANSWER) || fault.message.contains(NOT_READ))
}

fn internal(message: &str) -> Fault {
    Fault::new(FaultCategory::Internal, message)
}

#[cfg(test)]
mod tests {
    use super::shell_command;

    #[test]
    fn only_a_single_simple_command_is_run_with_exec() {
        assert_eq!(
            shell_command("python3 -u agent.py"),
            "exec python3 -u agent.py"
        );
        assert_eq!(
            shell_command(r#"node agent.js --name "a b""#),
            r#"exec node agent.js --name "a b""#
        );
        assert_eq!(
            shell_command("cd agents && python3 main.py"),
            "cd agents && exec python3 main.py"
        );
        assert_eq!(
            shell_command(". .venv/bin/activate && cd $HOME/a && python3 main.py"),
            ". .venv/bin/activate && cd $HOME/a && exec python3 main.py"
        );
        for as_written in [
            "cd agents && python3 agent.py | tee log",
            "make build; cd agents && python3 agent.py",
            "cd agents && eval python3 agent.py",
            r#"node a.js --banner "R&&D""#,
            "cd a && python3 m.py --x 'a && b'",
            "eval python3 agent.py",
            "python3 a.py | tee log",
            "python3 a.py; echo done",
            "python3 a.py 2>log",
            "PORT=1 python3 a.py",
            "while read -r l; do echo \"$l\"; done",
            "exec python3 a.py",
            "python3 $HOME/a.py",
            "",
        ] {
            assert_eq!(shell_command(as_written), as_written);
        }
    }
}
