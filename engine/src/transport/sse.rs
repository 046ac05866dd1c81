//! The streaming HTTP transport: a POST answered with server-sent events, shared by every
//! streaming protocol.
//!
//! [`open`] sends the request on the run's connection pool ([`HttpTransport`]) and checks the
//! answer before anything is streamed: an error status is an `http_4xx`/`http_5xx` fault
//! quoting the body, a JSON body (a server that does not stream, or answers an error as JSON)
//! is handed back whole, and anything that is neither JSON nor `text/event-stream` is a
//! `protocol` fault. Events are then read one at a time from the [`EventStream`] (parsed by
//! the `sse-stream` crate), under four bounds:
//!
//! - time to first event: the response headers and the first event must arrive within the
//!   attempt's timeout (the agent's `timeout`);
//! - idle: no more than the agent's `timeout` between two events;
//! - size: the whole stream within `max-response-size`, and one event within
//!   [`MAX_EVENT_SIZE`] (or `max-response-size` when smaller), checked while the event is
//!   still arriving so a runaway event never sits whole in memory;
//! - the trajectory's deadline, whatever the other bounds allow.
//!
//! A stream that closes before the protocol saw its final event is an
//! [`FaultCategory::Incomplete`] fault ([`EventStream::ended_early`]). Retries are decided
//! before the stream starts (by [`super::http::with_retries`] around [`open`]): once the
//! response headers are in, the agent is working on the request and nothing is sent again.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use sse_stream::{ByteStreamBody, SseStream};
use tokio::time::Instant;

use super::http::{
    CallLimits, DisplayDuration, HttpTransport, request_fault, status_fault_with, too_large,
};
use crate::record::{Fault, FaultCategory};

/// The largest single event accepted (unless `max-response-size` is smaller). An event is
/// one message snapshot or one final response; one past this size is a runaway.
pub const MAX_EVENT_SIZE: u64 = 4 * 1024 * 1024;
/// How much of an unexpected body goes into a fault message.
const PREVIEW_BYTES: usize = 4096;

/// The bounds of one streamed exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// The longest silence between two events.
    pub idle: Duration,
    /// The whole stream (or JSON body).
    pub max_total: u64,
    /// One event.
    pub max_event: u64,
}

impl From<CallLimits> for StreamLimits {
    /// The agent's `timeout` bounds the wait for the first event and every gap after it;
    /// `max-response-size` bounds the stream and, below [`MAX_EVENT_SIZE`], each event.
    fn from(limits: CallLimits) -> Self {
        StreamLimits {
            idle: limits.timeout,
            max_total: limits.max_response_size,
            max_event: limits.max_response_size.min(MAX_EVENT_SIZE),
        }
    }
}

/// What a successful POST answered with.
pub enum Opened {
    /// `200 text/event-stream`: read the events.
    Events(Box<EventStream>),
    /// A 2xx JSON body, read in full (a server that does not stream, or was asked not to).
    Json(Bytes),
    /// HTTP 429, with the wait its `Retry-After` asks for: the caller decides whether to
    /// wait it out (a model provider) or fail.
    RateLimited(Option<Duration>),
}

impl Opened {
    /// For an agent under test: a 429 as the fault [`super::http::with_retries`] waits out.
    pub fn or_rate_limited(self) -> Result<Opened, Fault> {
        match self {
            Opened::RateLimited(asked) => Err(super::http::rate_limited_fault(asked)),
            opened => Ok(opened),
        }
    }
}

/// One server-sent event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when the server names its events.
    pub event: Option<String>,
    /// The `data:` lines, joined by newlines; empty when the event had none.
    pub data: String,
}

/// POSTs `body` and waits for the response headers, all within `timeout` (the attempt's
/// budget). The first event must then arrive within what is left of `timeout`.
///
/// `headers` must carry the content type and accept headers; they are sent as given.
pub async fn open(
    transport: &HttpTransport,
    url: &Url,
    headers: &HeaderMap,
    body: Bytes,
    limits: StreamLimits,
    timeout: Duration,
) -> Result<Opened, Fault> {
    let started = Instant::now();
    let first_event_by = started + timeout;
    let sent = transport.send(url, |client| {
        client
            .post(url.clone())
            .headers(headers.clone())
            .body(body.clone())
    });
    let response = match tokio::time::timeout_at(first_event_by, sent).await {
        Ok(Ok(Ok(response))) => response,
        Ok(Ok(Err(e))) => return Err(request_fault(&e, url, None, 0)),
        Ok(Err(fault)) => return Err(fault),
        Err(_elapsed) => {
            return Err(Fault::new(
                FaultCategory::Timeout,
                format!(
                    "no response headers within {} (time to first event; timeout)",
                    DisplayDuration(timeout)
                ),
            ));
        }
    };
    let status = response.status();
    // A value that is not text (bytes outside ASCII) is shown as it reads, not as missing.
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase());
    let media_type = content_type
        .as_deref()
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or("");

    if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        let asked = super::http::retry_after(response.headers(), std::time::SystemTime::now());
        return Ok(Opened::RateLimited(asked));
    }
    if !status.is_success() {
        let headers = response.headers().clone();
        let preview = read_body(response, url, PREVIEW_BYTES as u64, first_event_by, false)
            .await
            .unwrap_or_default();
        let preview =
            super::encoding::decoded_start(&headers, &preview, PREVIEW_BYTES).unwrap_or(preview);
        return Err(status_fault_with(status, Some(&headers), &preview));
    }
    if media_type == "text/event-stream" {
        let decoder =
            super::encoding::StreamDecoder::for_headers(response.headers(), limits.max_total)?;
        return Ok(Opened::Events(Box::new(EventStream::new(
            response,
            decoder,
            url.clone(),
            limits,
            started,
            first_event_by,
        ))));
    }
    let headers = response
        .headers()
        .contains_key(reqwest::header::CONTENT_ENCODING)
        .then(|| response.headers().clone());
    if media_type == "application/json" || media_type.ends_with("+json") {
        let body = read_body(response, url, limits.max_total, first_event_by, true).await?;
        let body = match &headers {
            Some(headers) => super::encoding::decoded(headers, body, limits.max_total)?,
            None => body,
        };
        return Ok(Opened::Json(body));
    }
    let preview = read_body(response, url, PREVIEW_BYTES as u64, first_event_by, false)
        .await
        .unwrap_or_default();
    let preview = headers
        .as_ref()
        .and_then(|h| super::encoding::decoded_start(h, &preview, PREVIEW_BYTES))
        .unwrap_or(preview);
    let mut message = match content_type.as_deref() {
        Some(given) => format!(
            "expected a stream of server-sent events (Content-Type: text/event-stream), got \
             Content-Type: {given}"
        ),
        None => "expected a stream of server-sent events, but the response has no \
                 Content-Type (text/event-stream)"
            .to_owned(),
    };
    let text = String::from_utf8_lossy(&preview);
    let text = text.trim();
    if !text.is_empty() {
        message.push_str(": ");
        message.extend(text.chars().take(200));
        if text.chars().nth(200).is_some() {
            message.push('…');
        }
    }
    Err(Fault::new(FaultCategory::Protocol, message))
}

/// Reads a body up to `limit` bytes by `deadline`. `strict`: more than `limit` bytes is a
/// `too_large` fault (a body to use); otherwise the first `limit` bytes are returned (a
/// body to quote).
async fn read_body(
    mut response: reqwest::Response,
    url: &Url,
    limit: u64,
    deadline: Instant,
    strict: bool,
) -> Result<Bytes, Fault> {
    let status = response.status();
    let mut buf: Vec<u8> = Vec::new();
    let read = async {
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let total = buf.len() as u64 + chunk.len() as u64;
                    if total > limit {
                        if strict {
                            return Err(too_large(
                                limit,
                                &format!("{total} bytes read before giving up"),
                            ));
                        }
                        let room = usize::try_from(limit)
                            .unwrap_or(usize::MAX)
                            .saturating_sub(buf.len());
                        buf.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or(&[]));
                        return Ok(());
                    }
                    buf.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(request_fault(&e, url, Some(status), buf.len() as u64));
                }
            }
        }
    };
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(())) => Ok(Bytes::from(buf)),
        Ok(Err(fault)) => Err(fault),
        Err(_elapsed) if strict => Err(Fault::new(
            FaultCategory::Timeout,
            format!(
                "HTTP {} received, then the body stopped after {} bytes (timeout)",
                status.as_u16(),
                buf.len()
            ),
        )),
        Err(_elapsed) => Ok(Bytes::from(buf)),
    }
}

/// Why the byte stream under the parser stopped: the fault, to hand back unchanged.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.message)]
struct BodyError(Fault);

type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send>>;

/// Bytes received, shared between the byte stream (which enforces the bounds as bytes
/// arrive) and the reader (which reports them).
#[derive(Debug, Default)]
struct Received {
    total: AtomicU64,
}

/// Counts the bytes of the event being received, by watching for the blank line that ends
/// every event (`\n\n`, `\r\r` or `\r\n\r\n`).
#[derive(Debug, Default)]
struct EventSizer {
    pending: u64,
    at_line_start: bool,
    after_cr: bool,
}

impl EventSizer {
    /// Feeds a chunk; returns the size of the largest event seen in it so far.
    fn feed(&mut self, chunk: &[u8]) -> u64 {
        let mut largest = self.pending;
        for &byte in chunk {
            match byte {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    if self.at_line_start {
                        self.pending = 0;
                    }
                    self.at_line_start = true;
                    self.after_cr = byte == b'\r';
                }
                _ => {
                    self.at_line_start = false;
                    self.after_cr = false;
                    self.pending += 1;
                    largest = largest.max(self.pending);
                }
            }
        }
        largest
    }
}

/// The events of one streamed response.
pub struct EventStream {
    events: SseStream<ByteStreamBody<Chunks, Bytes>>,
    received: Arc<Received>,
    url: Url,
    limits: StreamLimits,
    /// When the request was sent.
    started: Instant,
    first_event_by: Instant,
    /// The trajectory's deadline.
    deadline: Option<Instant>,
    ttft: Option<Duration>,
    count: u64,
    /// When the last event that was not a keep-alive arrived: the idle timeout runs from
    /// here, so a server that sends only heartbeats still stalls out.
    progress_at: Option<Instant>,
    /// `progress_at` before the last event, to undo it when that event was a keep-alive.
    progress_before: Option<Instant>,
}

impl EventStream {
    fn new(
        response: reqwest::Response,
        decoder: Option<super::encoding::StreamDecoder>,
        url: Url,
        limits: StreamLimits,
        started: Instant,
        first_event_by: Instant,
    ) -> Self {
        let received = Arc::new(Received::default());
        let status = response.status();
        let counter = Arc::clone(&received);
        let chunk_url = url.clone();
        // A limit reached by a small compressed stream (a bomb) is said to be after decoding.
        let coding = decoder.as_ref().map(|d| d.coding());
        let chunks = futures::stream::unfold(
            (response, EventSizer::default(), false, decoder),
            move |(mut response, mut sizer, failed, mut decoder)| {
                let counter = Arc::clone(&counter);
                let url = chunk_url.clone();
                async move {
                    if failed {
                        return None;
                    }
                    // Sizes and limits count the events as decoded, what the decoder
                    // still held when the body ended included.
                    let mut finished = false;
                    let read = match (response.chunk().await, decoder.as_mut()) {
                        (Ok(Some(chunk)), Some(decoder)) => decoder.feed(&chunk).map(Some),
                        (Ok(None), Some(decoder)) => {
                            finished = true;
                            match decoder.finish() {
                                Ok(rest) if !rest.is_empty() => Ok(Some(rest)),
                                Ok(_) => Ok(None),
                                Err(fault) => Err(fault),
                            }
                        }
                        (Ok(read), None) => Ok(read),
                        (Err(e), _) => {
                            let received = counter.total.load(Ordering::Relaxed);
                            let mut fault = request_fault(&e, &url, Some(status), received);
                            // Cut once it had started (a server that died, a handler that
                            // raised mid-stream): the stream is what ended early, as one
                            // closed cleanly before its end is.
                            if received > 0 && fault.category == FaultCategory::Transport {
                                fault.category = FaultCategory::Incomplete;
                                fault.message = format!(
                                    "the event stream broke off before its end: {}",
                                    fault.message
                                );
                            }
                            Err(fault)
                        }
                    };
                    // The body ended: the next read finds its end without a decoder.
                    if finished {
                        decoder = None;
                    }
                    let error = match read {
                        Ok(Some(chunk)) => {
                            let total = counter
                                .total
                                .fetch_add(chunk.len() as u64, Ordering::Relaxed)
                                + chunk.len() as u64;
                            let event = sizer.feed(&chunk);
                            // Said only when a limit is reached: no text per chunk.
                            let decoded = || {
                                coding.map_or_else(String::new, |c| {
                                    format!(", decoded from its {c}-compressed body")
                                })
                            };
                            if total > limits.max_total {
                                too_large(
                                    limits.max_total,
                                    &format!("the event stream reached {total} bytes{}", decoded()),
                                )
                            } else if event > limits.max_event {
                                Fault::new(
                                    FaultCategory::TooLarge,
                                    format!(
                                        "one event exceeded {} bytes{} (the limit of one \
                                         streamed event: {} or max-response-size if smaller)",
                                        limits.max_event,
                                        decoded(),
                                        MAX_EVENT_SIZE
                                    ),
                                )
                            } else {
                                return Some((Ok(chunk), (response, sizer, false, decoder)));
                            }
                        }
                        Ok(None) => return None,
                        Err(fault) => fault,
                    };
                    Some((Err(BodyError(error)), (response, sizer, true, None)))
                }
            },
        );
        let chunks: Chunks = Box::pin(chunks);
        EventStream {
            events: SseStream::from_bytes_stream(chunks),
            received,
            url,
            limits,
            started,
            first_event_by,
            deadline: None,
            progress_at: None,
            progress_before: None,
            ttft: None,
            count: 0,
        }
    }

    /// Also stop at `deadline` (the trajectory's), whatever the other bounds allow.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// Time from sending the request to the first event; `None` before it arrived.
    pub fn ttft(&self) -> Option<Duration> {
        self.ttft
    }

    /// When the request was sent.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Events received so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Bytes received so far.
    pub fn bytes(&self) -> u64 {
        self.received.total.load(Ordering::Relaxed)
    }

    /// The next event; `Ok(None)` when the server closed the stream cleanly (whether that
    /// was the end is the protocol's call: see [`EventStream::ended_early`]).
    pub async fn next(&mut self) -> Result<Option<SseEvent>, Fault> {
        let (wait_until, first) = match (self.ttft, self.progress_at) {
            (None, _) => (self.first_event_by, true),
            (Some(_), Some(progress)) => (progress + self.limits.idle, false),
            (Some(_), None) => (Instant::now() + self.limits.idle, false),
        };
        let trajectory_ends_first = self.deadline.is_some_and(|d| d < wait_until);
        let until = match self.deadline {
            Some(deadline) if trajectory_ends_first => deadline,
            _ => wait_until,
        };
        let next = match tokio::time::timeout_at(until, self.events.next()).await {
            Ok(next) => next,
            Err(_elapsed) => return Err(self.timed_out(first, trajectory_ends_first)),
        };
        match next {
            None => Ok(None),
            Some(Ok(sse)) => {
                if self.ttft.is_none() {
                    self.ttft = Some(self.started.elapsed());
                }
                self.progress_before = self.progress_at;
                self.progress_at = Some(Instant::now());
                self.count += 1;
                Ok(Some(SseEvent {
                    event: sse.event,
                    data: sse.data.unwrap_or_default(),
                }))
            }
            Some(Err(sse_stream::Error::Body(error))) => Err(match error.downcast::<BodyError>() {
                Ok(body) => body.0,
                Err(other) => Fault::new(FaultCategory::Transport, other.to_string()),
            }),
            Some(Err(error)) => Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "malformed server-sent events after {} from {}: {error}",
                    events(self.count),
                    self.url.path()
                ),
            )),
        }
    }

    /// The event just read was a keep-alive (a heartbeat), or carried nothing the answer
    /// keeps (an empty delta): it does not reset the idle timeout. A reader calls it for
    /// such events, so that a server stuck sending them stalls out.
    pub fn keepalive(&mut self) {
        if self.progress_before.is_some() {
            self.progress_at = self.progress_before;
        }
    }

    fn timed_out(&self, first: bool, trajectory: bool) -> Fault {
        let received = format!("{}, {} bytes received", events(self.count), self.bytes());
        let message = if trajectory {
            format!("trajectory timeout reached while streaming ({received})")
        } else if first {
            format!(
                "no event within {} of the request (time to first event; timeout)",
                DisplayDuration(self.first_event_by.saturating_duration_since(self.started))
            )
        } else {
            format!(
                "the stream stalled: no progress for {} (heartbeats do not count; {received}; idle timeout = \
                 the agent's timeout)",
                DisplayDuration(self.limits.idle)
            )
        };
        Fault::new(FaultCategory::Timeout, message)
    }

    /// The fault of a stream that closed before `awaited` arrived.
    pub fn ended_early(&self, awaited: &str) -> Fault {
        Fault::new(
            FaultCategory::Incomplete,
            format!(
                "the stream ended before {awaited} ({}, {} bytes received)",
                events(self.count),
                self.bytes()
            ),
        )
    }
}

/// `n` events, for a message: `1 event`, `3 events`.
fn events(n: impl Into<u64>) -> String {
    match n.into() {
        1 => "1 event".to_owned(),
        n => format!("{n} events"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_sizer_resets_at_blank_lines_of_every_line_ending() {
        let mut s = EventSizer::default();
        assert_eq!(s.feed(b"data: abc\n\ndata: de"), 9);
        assert_eq!(s.pending, 8);
        // The terminator split across chunks still ends the event.
        assert_eq!(s.feed(b"\r\n"), 8);
        assert_eq!(s.feed(b"\r\ndata: x\r\r"), 8);
        assert_eq!(s.pending, 0);
        assert_eq!(s.feed(b"data: 1\ndata: 2\n"), 14);
    }
}
