//! OpenTelemetry out: Trellis's own spans, built from the event stream and sent to a
//! collector over OTLP/HTTP protobuf (`--otlp-endpoint`, `OTEL_EXPORTER_OTLP_*`).
//!
//! The spans are made from the records, not from live instrumentation: a turn's span has the
//! very id its requests carried in `traceparent` (an SDK tracer cannot be told which ids to
//! use), so the agent's spans join it in the backend. The tree is run → node (an execution
//! node of a scenario × agent × repetition; nested as the nodes are) → turn → exchange, with
//! trajectory spans under the run, and the simulator's and judges' model calls as GenAI
//! `chat` spans (model, tokens, cost) under their turn or trajectory. Node and trajectory
//! span ids are derived from the run's trace and their keys (BLAKE3), so a node's children
//! can name it by its key. A node's span is held until no child node can come (its branches
//! run after it, and each widens it), so every span lies within its parent. Faults are an
//! `error` status and an `exception` event.
//!
//! Sending never slows or breaks a run: spans are batched ([`BATCH_SPANS`]) and handed to a
//! sender thread through a queue of [`QUEUE_BATCHES`]; when it is full, batches are dropped
//! and counted. A collector that is down costs each batch one bounded request, is reported
//! once as a warning, and the end of the run waits at most [`FLUSH_TIMEOUT`] for what is
//! queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event as SpanEvent, SpanKind};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message as _;

use crate::event::Event;
use crate::record::{Fault, LlmCall, NodeRecord, TrajectoryRecord, TurnRecord};
use crate::transport::trace::RunTrace;

/// Spans per export request (the SDKs' default `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
pub const BATCH_SPANS: usize = 512;
/// Batches waiting to be sent at most: beyond, new batches are dropped (and counted).
pub const QUEUE_BATCHES: usize = 16;
/// How long the end of the run waits for queued batches.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// One export request's limit when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    /// The full traces URL (`…/v1/traces`).
    pub url: String,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`: `key=value,…`).
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    /// `service.name` (`OTEL_SERVICE_NAME`, else `OTEL_RESOURCE_ATTRIBUTES`'s, default
    /// `trellis`).
    pub service: String,
    /// The other resource attributes (`OTEL_RESOURCE_ATTRIBUTES`: `key=value,…`,
    /// percent-encoded), such as `deployment.environment`.
    pub resource: Vec<(String, String)>,
    /// Bodies sent gzip-compressed (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`).
    pub gzip: bool,
}

/// Why the export settings cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExportConfigError {
    #[error("OTLP endpoint `{0}` is not an http:// or https:// URL")]
    BadEndpoint(String),
    #[error(
        "{var}={value} is not offered: Trellis exports OTLP over HTTP with protobuf (`http/protobuf`)"
    )]
    Protocol { var: &'static str, value: String },
    #[error("{var}={value} is not a compression Trellis sends: `gzip` or `none`")]
    BadCompression { var: &'static str, value: String },
    #[error(
        "{var}: {entry} is not `key=value` with a header name and value HTTP can carry (entries are separated by commas; a comma or an equals sign inside a value is written %2C or %3D, and percent escapes must spell UTF-8)"
    )]
    BadHeader { var: &'static str, entry: String },
    #[error("{var}={value} is not a whole number of milliseconds above 0")]
    BadTimeout { var: &'static str, value: String },
    #[error(
        "OTEL_RESOURCE_ATTRIBUTES={value} is not `key=value` entries separated by commas (percent-encoded)"
    )]
    BadResource { value: String },
    #[error(
        "OTLP endpoint `{0}` holds a user or password, which is not sent that way: give them as a header, OTEL_EXPORTER_OTLP_HEADERS=Authorization=Basic%20<base64 of user:password>"
    )]
    Credentials(String),
}

impl ExportConfig {
    /// The export settings from `--otlp-endpoint` (a base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`), else the standard environment variables; `None`
    /// when neither names an endpoint or `OTEL_SDK_DISABLED=true`.
    pub fn resolve(
        flag: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ExportConfigError> {
        let env = |name: &str| {
            env(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if flag.is_none()
            && (env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
                || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none")))
        {
            return Ok(None);
        }
        let url = match (flag, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(base), _) => traces_url(base),
            (None, Some(full)) => full,
            (None, None) => match env("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Some(base) => traces_url(&base),
                None => return Ok(None),
            },
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ExportConfigError::BadEndpoint(without_credentials(&url)));
        }
        // A user and password in the URL are not sent by the HTTP client, and the URL is in
        // the warnings CI logs keep: refused, saying where credentials go.
        if let Ok(parsed) = reqwest::Url::parse(&url)
            && (!parsed.username().is_empty() || parsed.password().is_some())
        {
            return Err(ExportConfigError::Credentials(without_credentials(&url)));
        }
        let first = |names: [&'static str; 2]| {
            names
                .into_iter()
                .find_map(|name| env(name).map(|value| (name, value)))
        };
        if let Some((var, value)) = first([
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ])
        .filter(|(_, p)| p != "http/protobuf")
        {
            return Err(ExportConfigError::Protocol { var, value });
        }
        let gzip = match first([
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ]) {
            None => false,
            Some((_, value)) if value.eq_ignore_ascii_case("none") => false,
            Some((_, value)) if value.eq_ignore_ascii_case("gzip") => true,
            Some((var, value)) => return Err(ExportConfigError::BadCompression { var, value }),
        };
        let headers = match first([
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ]) {
            Some((var, value)) => parse_headers(var, &value)?,
            None => Vec::new(),
        };
        let timeout = match first([
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]) {
            // 0 would make every request time out at once.
            Some((var, value)) => value
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or(ExportConfigError::BadTimeout { var, value })?,
            None => DEFAULT_TIMEOUT,
        };
        let mut resource = match env("OTEL_RESOURCE_ATTRIBUTES") {
            Some(value) => parse_headers("OTEL_RESOURCE_ATTRIBUTES", &value)
                .map_err(|_| ExportConfigError::BadResource { value })?,
            None => Vec::new(),
        };
        // `OTEL_SERVICE_NAME` wins over a `service.name` among the attributes, as the
        // specification says.
        let from_attributes = resource
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|at| resource.remove(at).1);
        Ok(Some(ExportConfig {
            url,
            headers,
            timeout,
            service: env("OTEL_SERVICE_NAME")
                .or(from_attributes)
                .unwrap_or_else(|| "trellis".to_owned()),
            resource,
            gzip,
        }))
    }
}

/// `body` gzip-compressed (writing to memory cannot fail; the body is sent as is if it did).
fn gzipped(body: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    match encoder.write_all(body).and_then(|()| encoder.finish()) {
        Ok(compressed) => compressed,
        Err(_) => body.to_vec(),
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value` entries separated by commas, keys and values
/// percent-encoded (the OpenTelemetry specification's format, the W3C baggage one):
/// `Authorization=Basic%20dXNlcjpwYXNz` is sent as `Authorization: Basic dXNlcjpwYXNz`, as
/// every OpenTelemetry SDK sends it. Empty entries (a trailing comma) are skipped.
fn parse_headers(
    var: &'static str,
    value: &str,
) -> Result<Vec<(String, String)>, ExportConfigError> {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text.trim())
            .decode_utf8()
            .ok()
            .map(|t| t.into_owned())
    };
    let mut headers = Vec::new();
    for entry in value.split(',').filter(|e| !e.trim().is_empty()) {
        // Only the name is said: the value may be a credential, and this goes to CI logs.
        let bad = || ExportConfigError::BadHeader {
            var,
            entry: match entry.split_once('=') {
                Some((key, _)) => format!("{}=…", key.trim()),
                None => "an entry without `=`".to_owned(),
            },
        };
        let (key, value) = entry.split_once('=').ok_or_else(bad)?;
        let (Some(key), Some(value)) = (decode(key), decode(value)) else {
            return Err(bad());
        };
        // What HTTP can carry: said now rather than as a collector that cannot be reached.
        if reqwest::header::HeaderName::from_bytes(key.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(&value).is_err()
        {
            return Err(bad());
        }
        headers.push((key, value));
    }
    Ok(headers)
}

/// The traces URL of a base URL: `/v1/traces` appended to its path, before a query
/// (`http://c:4318/otlp?tenant=a` → `http://c:4318/otlp/v1/traces?tenant=a`).
fn traces_url(base: &str) -> String {
    let (before_query, query) = match base.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (base, None),
    };
    let mut url = format!("{}/v1/traces", before_query.trim_end_matches('/'));
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

/// Export requests a retryable answer is sent again at most.
const EXPORT_RETRIES: u32 = 3;
/// The first backoff before a retry without `Retry-After`; each next one doubles.
const RETRY_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait before a retry, whatever `Retry-After` asks: the end of the run waits
/// [`FLUSH_TIMEOUT`] at most for all of the export.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(2);

/// The traces URL as warnings show it: without a query, which may hold a token.
fn shown_url(url: &str) -> String {
    match url.split_once('?') {
        Some((before, _)) => format!("{before}?…"),
        None => url.to_owned(),
    }
}

/// `url` with a user and password in it replaced by `…`, to be shown.
fn without_credentials(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            // A URL percent-encodes a `…` set as its user (`%E2%80%A6`): a marker put in
            // the text instead reads as what it is.
            let _ = parsed.set_username("CREDENTIALS");
            let _ = parsed.set_password(None);
            parsed.to_string().replacen("CREDENTIALS@", "…@", 1)
        }
        _ => url.to_owned(),
    }
}

/// What the export did, for the console.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportSummary {
    pub sent: u64,
    /// Spans dropped: the queue was full, their request failed, or they were still queued
    /// when the export stopped waiting.
    pub dropped: u64,
    /// Spans in a request the collector had not answered when the export stopped waiting:
    /// it may or may not have them. (Those still queued behind it are `dropped`.)
    pub unconfirmed: u64,
    /// The first failure, as the warning says it.
    pub failure: Option<String>,
}

/// Builds spans from the run's events and hands them to the sender thread.
pub struct SpanExporter {
    trace: RunTrace,
    trace_id: Vec<u8>,
    /// What node and trajectory span ids are derived from: the trace and this session's run
    /// span. The trace alone repeated ids across runs under one `TRACEPARENT` (a CI job's)
    /// and across the sessions of a resumed run.
    id_base: Vec<u8>,
    /// Unix nanoseconds of the run's start (`run_started`), the origin of `started_ms`.
    origin: u64,
    /// Nanoseconds the run's clock had run in earlier sessions when this one started
    /// ([`SpanExporter::resumed_after`]): a resumed run's `started_ms` go on from there.
    earlier: u64,
    batch: Vec<Span>,
    queue: Option<SyncSender<Vec<Span>>>,
    /// The sender thread; it ends with its first failure, if any.
    sender: Option<std::thread::JoinHandle<Option<String>>>,
    dropped: u64,
    /// Spans handed to the sender thread.
    queued: u64,
    /// What the sender thread has settled so far, readable while it still waits.
    progress: Arc<Progress>,
    /// Warns once, as soon as the first request fails (a callback: the console is the
    /// CLI's).
    warn: Arc<dyn Fn(&str) + Send + Sync>,
    /// Each execution node's span (start, end), by node span id: a trajectory's span runs
    /// over its path's nodes, in the run's clock. A node is on every path below it, so kept
    /// for the run (16 bytes a node, and only when spans are exported).
    node_times: std::collections::HashMap<Vec<u8>, (u64, u64)>,
    /// The latest end of any span so far: the run's span ends no earlier.
    latest_end: u64,
    /// Node spans not sent yet, by span id: a node's branches run after its own turns, so
    /// its span is widened over each child node as it comes, and sent once no child can
    /// come any more (a trajectory ended at it: a leaf; else at the end of the run). A
    /// span cannot be changed once sent, and every span lies within its parent.
    open_nodes: std::collections::HashMap<Vec<u8>, Span>,
    /// Set when the run has finished: what was held to its end goes out at once, so a full
    /// queue is waited on (until then) instead of dropping it; `finish` waits no later.
    deadline: Option<std::time::Instant>,
}

impl SpanExporter {
    /// Starts the sender thread. `warn` is called once, from that thread, on the first
    /// failed request.
    pub fn start(
        config: ExportConfig,
        trace: RunTrace,
        warn: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> Self {
        let (queue, batches) = sync_channel::<Vec<Span>>(QUEUE_BATCHES);
        let mut attributes = vec![
            text("service.name", &config.service),
            text("service.version", env!("CARGO_PKG_VERSION")),
        ];
        attributes.extend(
            config
                .resource
                .iter()
                .filter(|(k, _)| k != "service.version")
                .map(|(k, v)| text(k, v)),
        );
        let resource = Resource {
            attributes,
            ..Resource::default()
        };
        let progress = Arc::new(Progress::default());
        let sending = SendLoop {
            config,
            resource,
            warn: warn.clone(),
            progress: progress.clone(),
        };
        let sender = std::thread::Builder::new()
            .name("trellis-otlp-export".into())
            .spawn(move || sending.run(batches))
            .ok();
        SpanExporter {
            trace_id: trace.trace_id.0.to_vec(),
            id_base: [&trace.trace_id.0[..], &trace.run_span.0[..]].concat(),
            earlier: 0,
            trace,
            origin: now_nanos(),
            batch: Vec::with_capacity(BATCH_SPANS),
            queue: sender.as_ref().map(|_| queue),
            sender,
            dropped: 0,
            queued: 0,
            progress,
            warn,
            node_times: std::collections::HashMap::new(),
            latest_end: 0,
            open_nodes: std::collections::HashMap::new(),
            deadline: None,
        }
    }

    /// For a resumed run: the earlier sessions ran the run's clock for `earlier`
    /// (`Finished::elapsed`), from which this session's turn times go on. Without it, every
    /// span of the session was exported that much later than it happened.
    pub fn resumed_after(&mut self, earlier: Duration) {
        self.earlier = u64::try_from(earlier.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Takes one event of the run.
    pub fn push(&mut self, event: &Event) {
        match event {
            Event::RunStarted(info) => {
                // To the millisecond (`execute::rfc3339`): the times of nodes and turns
                // count from it.
                // A resumed session's `started_at` is its own start, and its turns count from
                // the earlier sessions' end: the run's clock began that much before it.
                self.origin = humantime::parse_rfc3339(&info.started_at)
                    .ok()
                    .map_or(self.origin, system_nanos)
                    .saturating_sub(self.earlier);
            }
            Event::Node(node) => self.node(node),
            Event::Trajectory(t) => self.trajectory(t),
            Event::RunFinished(summary) => {
                self.deadline = Some(std::time::Instant::now() + FLUSH_TIMEOUT);
                self.close_nodes();
                // Its trajectories' judges may end after the run's clock stopped.
                let end = (self.origin + ms_nanos(summary.duration_ms)).max(self.latest_end);
                let mut span = self.span(
                    self.trace.run_span.0.to_vec(),
                    self.trace.parent.map(|p| p.0.to_vec()).unwrap_or_default(),
                    format!("trellis run {}", summary.run_id),
                    (self.origin, end),
                );
                span.kind = SpanKind::Internal as i32;
                span.attributes = vec![
                    text("trellis.run.id", &summary.run_id),
                    int("trellis.run.trajectories", summary.trajectories),
                    int("trellis.run.passed", summary.passed),
                    int("trellis.run.failed", summary.failed),
                    int("trellis.run.errors", summary.errors),
                    int("trellis.run.turns", summary.turns),
                ];
                self.add(span);
            }
            Event::Agent(_) | Event::Spans(_) => {}
        }
    }

    /// Sends what is left and waits up to [`FLUSH_TIMEOUT`] for the sender, or until
    /// `cut_short` says to stop waiting (a signal after the results were written).
    pub fn finish(mut self, cut_short: &dyn Fn() -> bool) -> ExportSummary {
        let deadline = *self
            .deadline
            .get_or_insert_with(|| std::time::Instant::now() + FLUSH_TIMEOUT);
        self.close_nodes();
        self.flush();
        drop(self.queue.take());
        let Some(sender) = self.sender.take() else {
            return ExportSummary {
                dropped: self.dropped,
                failure: Some("the export thread did not start".to_owned()),
                ..ExportSummary::default()
            };
        };
        while !sender.is_finished() && std::time::Instant::now() < deadline && !cut_short() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let failure = if sender.is_finished() {
            sender
                .join()
                .unwrap_or_else(|_| Some("the export thread failed".to_owned()))
        } else {
            // The thread ends on its own when its request times out; nothing waits for it.
            Some("not confirmed in time".to_owned())
        };
        // The counts are the thread's, read as it left them: all of them once it ended.
        // Read `started` last: a request begun after `sent` was read is counted not sent
        // rather than twice.
        let sent = self.progress.sent.load(Ordering::Relaxed);
        let failed = self.progress.dropped.load(Ordering::Relaxed);
        let started = self
            .progress
            .started
            .load(Ordering::Relaxed)
            .max(sent + failed);
        // In a request the collector has not answered: it may or may not have them. Those
        // still queued behind it never left the process: dropped.
        let unconfirmed = started - sent - failed;
        let never_sent = self.queued.saturating_sub(started);
        if unconfirmed + never_sent > 0 {
            let queued = if never_sent > 0 {
                format!(", and {never_sent} more were still queued behind them")
            } else {
                String::new()
            };
            (self.warn)(&format!(
                "OTLP export: the collector did not confirm {unconfirmed} spans in time{queued}; \
                 the run does not wait for them"
            ));
        }
        ExportSummary {
            sent,
            dropped: self.dropped + failed + never_sent,
            unconfirmed,
            failure,
        }
    }

    fn node(&mut self, node: &NodeRecord) {
        let node_id = derived_id(
            &self.id_base,
            &[
                &node.suite,
                &node.scenario,
                &node.agent,
                &node.repetition.to_string(),
                &node.node,
            ],
        );
        let parent = match &node.parent {
            Some(parent) => derived_id(
                &self.id_base,
                &[
                    &node.suite,
                    &node.scenario,
                    &node.agent,
                    &node.repetition.to_string(),
                    parent,
                ],
            ),
            None => self.trace.run_span.0.to_vec(),
        };
        let times: Vec<(u64, u64)> = node.turns.iter().map(|t| self.turn_times(t)).collect();
        // A node without turns (checks after a branch) came as its parent's turns ended;
        // placed at the run's start it would lie outside its parent.
        let at = self
            .node_times
            .get(&parent)
            .map_or(self.origin, |(_, end)| *end);
        let start = times.iter().map(|t| t.0).min().unwrap_or(at);
        let end = times.iter().map(|t| t.1).max().unwrap_or(start);
        self.node_times.insert(node_id.clone(), (start, end));
        let name = format!(
            "node {}/{} {} [{} #{}]",
            node.suite, node.scenario, node.node, node.agent, node.repetition
        );
        self.widen_ancestors(&parent, (start, end));
        let mut span = self.span(node_id.clone(), parent, name, (start, end));
        span.attributes = vec![
            text("trellis.suite", &node.suite),
            text("trellis.scenario", &node.scenario),
            text("trellis.agent", &node.agent),
            int("trellis.repetition", u64::from(node.repetition)),
            text("trellis.node", &node.node),
        ];
        self.open_nodes.insert(node_id.clone(), span);
        for (turn, times) in node.turns.iter().zip(times) {
            self.turn(turn, &node_id, times, &node.agent);
        }
    }

    /// Widens the open node span `id` and its open ancestors over a child's `(start, end)`.
    /// A node whose span was sent already (a leaf) gets no children.
    fn widen_ancestors(&mut self, id: &[u8], (start, end): (u64, u64)) {
        let mut id = id.to_vec();
        // Bounded by the open nodes: ids are hashes of distinct paths, but a loop must not
        // hang the reporter whatever the records say.
        for _ in 0..=self.open_nodes.len() {
            let Some(span) = self.open_nodes.get_mut(&id) else {
                return;
            };
            if span.start_time_unix_nano <= start && end <= span.end_time_unix_nano {
                // Its ancestors already hold it.
                return;
            }
            span.start_time_unix_nano = span.start_time_unix_nano.min(start);
            span.end_time_unix_nano = span.end_time_unix_nano.max(end);
            id = span.parent_span_id.clone();
        }
    }

    /// Sends the open node span `id`, if it is open.
    fn close_node(&mut self, id: &[u8]) {
        if let Some(span) = self.open_nodes.remove(id) {
            self.add(span);
        }
    }

    /// Sends every open node span, by start (parents first, as widened); a hash map's order
    /// would differ from one run to the next.
    fn close_nodes(&mut self) {
        let mut open: Vec<Span> = self.open_nodes.drain().map(|(_, span)| span).collect();
        open.sort_by(|a, b| {
            (a.start_time_unix_nano, &a.span_id).cmp(&(b.start_time_unix_nano, &b.span_id))
        });
        for span in open {
            self.add(span);
        }
    }

    /// From the turn's start to its end, its retries and rate-limit waits included: the
    /// requests that carried its span id all fall inside it.
    fn turn_times(&self, turn: &TurnRecord) -> (u64, u64) {
        let start = self.origin + ms_nanos(turn.started_ms);
        // The simulated user wrote the turn's message before it was sent: its calls are
        // the turn's first part, so their spans lie inside it.
        let simulated: u64 = turn.simulator.iter().map(|c| ms_nanos(c.latency_ms)).sum();
        (
            start.saturating_sub(simulated),
            (self.origin + ms_nanos(turn.end_ms())).max(start),
        )
    }

    fn turn(&mut self, turn: &TurnRecord, node_id: &[u8], times: (u64, u64), agent: &str) {
        let Some(span_id) = turn.span_id.as_deref().and_then(|h| hex::decode(h).ok()) else {
            return;
        };
        let mut span = self.span(
            span_id.clone(),
            node_id.to_vec(),
            format!("turn {}", turn.turn_index),
            times,
        );
        span.kind = SpanKind::Client as i32;
        span.attributes = vec![
            text("gen_ai.operation.name", "invoke_agent"),
            text("gen_ai.agent.name", agent),
            int("trellis.turn.index", u64::from(turn.turn_index)),
            text("trellis.turn.kind", &turn.kind),
            int("trellis.turn.attempts", u64::from(turn.attempts)),
            // As the tool checks read them: the wire's calls, else those of the agent's
            // spans that arrived with the turn.
            int(
                "trellis.turn.tool_calls",
                if turn.tool_calls.is_empty() {
                    super::tools::tool_calls(&turn.spans).len()
                } else {
                    turn.tool_calls.len()
                } as u64,
            ),
            // OpenInference: what Phoenix and Langfuse show as the span's input and output.
            text("openinference.span.kind", "AGENT"),
            text("input.value", &turn.user_message),
        ];
        if let Some(reply) = &turn.reply {
            span.attributes.push(text("output.value", reply));
        }
        if let Some(model) = &turn.model {
            span.attributes.push(text("gen_ai.response.model", model));
        }
        if let Some(n) = turn.prompt_tokens {
            span.attributes.push(int("gen_ai.usage.input_tokens", n));
        }
        if let Some(n) = turn.completion_tokens {
            span.attributes.push(int("gen_ai.usage.output_tokens", n));
        }
        if let Some(ttft) = turn.ttft_ms {
            span.attributes.push(double("trellis.turn.ttft_ms", ttft));
        }
        fault_status(&mut span, turn.fault.as_ref());
        self.add(span);
        // Exchanges are listed only when they say more than the turn; laid end to end, each
        // as long as its attempts, the last ending with the turn (waits between attempts
        // are not recorded where they fell, and the answer that counted came last).
        // A turn recorded without its end (a journal from before `ended_ms`, a turn watch
        // reused) lasts its answers' latencies: its exchanges are those, as they were.
        let took = |e: &crate::record::ExchangeRecord| {
            ms_nanos(if turn.ended_ms.is_some() {
                exchange_ms(e)
            } else {
                e.latency_ms
            })
        };
        let lasted: u64 = turn.exchanges.iter().map(took).sum();
        let mut at = times.1.saturating_sub(lasted).max(times.0);
        for (i, exchange) in turn.exchanges.iter().enumerate() {
            let end = (at + took(exchange)).min(times.1.max(at));
            let id = derived_id(&span_id, &["exchange", &i.to_string()]);
            let name = exchange_span_name(&exchange.label);
            let mut span = self.span(id, span_id.clone(), name, (at, end));
            span.kind = SpanKind::Client as i32;
            span.attributes = vec![
                int("trellis.exchange.attempts", exchange.attempts.len() as u64),
                text("trellis.exchange.label", &exchange.label),
            ];
            fault_status(
                &mut span,
                exchange.attempts.last().and_then(|a| a.fault.as_ref()),
            );
            self.add(span);
            at = end;
        }
        // The simulated user's calls, one after another from the turn's start; then the
        // turn's other model calls, ending as the agent was called.
        let mut at = times.0;
        for (i, call) in turn.simulator.iter().chain(&turn.llm).enumerate() {
            let id = derived_id(&span_id, &["llm", &i.to_string()]);
            let took = ms_nanos(call.latency_ms);
            let span = self.chat(id, span_id.clone(), call, (at, (at + took).min(times.1)));
            at = (at + took).min(times.1);
            self.add(span);
        }
    }

    fn trajectory(&mut self, t: &TrajectoryRecord) {
        // A path ends at its last node: no branch runs below it, so its span is final.
        if let Some(last) = t.nodes.last() {
            let leaf = derived_id(
                &self.id_base,
                &[
                    &t.suite,
                    &t.scenario,
                    &t.agent,
                    &t.repetition.to_string(),
                    last,
                ],
            );
            self.close_node(&leaf);
        }
        let id = derived_id(
            &self.id_base,
            &[
                &t.suite,
                &t.scenario,
                &t.agent,
                &t.repetition.to_string(),
                "trajectory",
                &t.trajectory,
            ],
        );
        // Over its path's nodes, in the run's clock, then its judges one after another. A
        // path whose nodes were not seen (a journal without them) ends as the record came,
        // lasting its duration.
        let path: Vec<(u64, u64)> = t
            .nodes
            .iter()
            .filter_map(|node| {
                let node_id = derived_id(
                    &self.id_base,
                    &[
                        &t.suite,
                        &t.scenario,
                        &t.agent,
                        &t.repetition.to_string(),
                        node,
                    ],
                );
                self.node_times.get(&node_id).copied()
            })
            .collect();
        let (start, walked) = match (
            path.iter().map(|p| p.0).min(),
            path.iter().map(|p| p.1).max(),
        ) {
            (Some(start), Some(end)) => (start, end),
            _ => {
                let end = now_nanos();
                (end.saturating_sub(ms_nanos(t.duration_ms)), end)
            }
        };
        let judging: u64 = t
            .criteria
            .iter()
            .filter_map(|c| c.judge.as_ref())
            .map(|j| ms_nanos(j.call.latency_ms))
            .sum();
        let end = walked + judging;
        self.latest_end = self.latest_end.max(end);
        let mut span = self.span(
            id.clone(),
            self.trace.run_span.0.to_vec(),
            format!("trajectory {}/{} {}", t.suite, t.scenario, t.trajectory),
            (start, end),
        );
        span.attributes = vec![
            text("trellis.suite", &t.suite),
            text("trellis.scenario", &t.scenario),
            text("trellis.trajectory", &t.trajectory),
            text("trellis.agent", &t.agent),
            text("trellis.protocol", &t.protocol),
            int("trellis.repetition", u64::from(t.repetition)),
            text("trellis.status", t.status.as_str()),
            int("trellis.turns", u64::from(t.turns)),
        ];
        fault_status(&mut span, t.fault.as_ref());
        // A trajectory in error without a fault of its agent: a check could not be decided
        // (its judge failed). Not `ok`: nothing certified it.
        let unfaulted = match t.status.as_str() {
            "failed" => Some("checks failed"),
            "error" => Some("a check ended in an error"),
            _ => None,
        };
        if t.fault.is_none()
            && let Some(message) = unfaulted
        {
            span.status = Some(Status {
                code: StatusCode::Error as i32,
                message: message.to_owned(),
            });
        }
        self.add(span);
        let mut at = walked;
        for (i, c) in t.criteria.iter().enumerate() {
            if let Some(judge) = &c.judge {
                let cid = derived_id(&id, &["judge", &i.to_string()]);
                let took = ms_nanos(judge.call.latency_ms);
                let mut span = self.chat(cid, id.clone(), &judge.call, (at, at + took));
                at += took;
                span.attributes
                    .push(text("trellis.criterion", &c.criterion));
                if let Some(score) = judge.score {
                    span.attributes.push(double("trellis.judge.score", score));
                }
                self.add(span);
            }
        }
    }

    /// A GenAI `chat` span for one of the engine's model calls.
    fn chat(&self, id: Vec<u8>, parent: Vec<u8>, call: &LlmCall, times: (u64, u64)) -> Span {
        let mut span = self.span(id, parent, format!("chat {}", call.model), times);
        span.kind = SpanKind::Client as i32;
        span.attributes = vec![
            text("gen_ai.operation.name", "chat"),
            text("gen_ai.request.model", &call.model),
            text("gen_ai.provider.name", &call.provider),
            text("openinference.span.kind", "LLM"),
        ];
        if let Some(n) = call.input_tokens {
            span.attributes.push(int("gen_ai.usage.input_tokens", n));
        }
        if let Some(n) = call.output_tokens {
            span.attributes.push(int("gen_ai.usage.output_tokens", n));
        }
        if let Some(cost) = call.cost {
            span.attributes.push(double("trellis.cost_usd", cost));
        }
        if let Some(error) = &call.error {
            span.status = Some(Status {
                code: StatusCode::Error as i32,
                message: error.clone(),
            });
        }
        span
    }

    fn span(&self, id: Vec<u8>, parent: Vec<u8>, name: String, (start, end): (u64, u64)) -> Span {
        Span {
            trace_id: self.trace_id.clone(),
            span_id: id,
            parent_span_id: parent,
            trace_state: self
                .trace
                .tracestate
                .as_deref()
                .unwrap_or_default()
                .to_owned(),
            name,
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end.max(start),
            ..Span::default()
        }
    }

    fn add(&mut self, span: Span) {
        self.batch.push(span);
        if self.batch.len() >= BATCH_SPANS {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_SPANS));
        let n = batch.len() as u64;
        let Some(queue) = &self.queue else {
            self.dropped += n;
            return;
        };
        loop {
            match queue.try_send(batch) {
                Ok(()) => {
                    self.queued += n;
                    return;
                }
                // Once the run has finished nothing else is slowed by waiting, and the
                // spans held to its end come at once.
                Err(TrySendError::Full(back))
                    if self.deadline.is_some_and(|d| std::time::Instant::now() < d) =>
                {
                    batch = back;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.dropped += n;
                    return;
                }
            }
        }
    }
}

/// Spans the sender thread has sent or dropped so far.
#[derive(Default)]
struct Progress {
    /// Spans whose request was started (the first try).
    started: AtomicU64,
    sent: AtomicU64,
    dropped: AtomicU64,
}

/// The sender thread: one request per batch, on a runtime of its own.
struct SendLoop {
    config: ExportConfig,
    resource: Resource,
    warn: Arc<dyn Fn(&str) + Send + Sync>,
    progress: Arc<Progress>,
}

impl SendLoop {
    /// Sends every batch, counting into `progress`; returns the first failure.
    fn run(self, batches: Receiver<Vec<Span>>) -> Option<String> {
        let drop_all = |batches: Receiver<Vec<Span>>| {
            let n = batches.iter().map(|b| b.len() as u64).sum();
            self.progress.started.fetch_add(n, Ordering::Relaxed);
            self.progress.dropped.fetch_add(n, Ordering::Relaxed);
        };
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                let why = format!("OTLP export disabled: cannot start its runtime: {e}");
                (self.warn)(&why);
                drop_all(batches);
                return Some(why);
            }
        };
        let client = match crate::transport::tls::client_builder()
            .map_err(|e| e.to_string())
            .and_then(|b| b.build().map_err(|e| e.to_string()))
        {
            Ok(client) => client,
            Err(e) => {
                let why = format!("OTLP export disabled: cannot build its HTTP client: {e}");
                (self.warn)(&why);
                drop_all(batches);
                return Some(why);
            }
        };
        let mut first_failure = None;
        for batch in batches {
            let n = batch.len() as u64;
            self.progress.started.fetch_add(n, Ordering::Relaxed);
            let request = ExportTraceServiceRequest {
                resource_spans: vec![ResourceSpans {
                    resource: Some(self.resource.clone()),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: "trellis".to_owned(),
                            version: env!("CARGO_PKG_VERSION").to_owned(),
                            ..InstrumentationScope::default()
                        }),
                        spans: batch,
                        ..ScopeSpans::default()
                    }],
                    ..ResourceSpans::default()
                }],
            };
            let body = request.encode_to_vec();
            // Shared, not copied, by each try.
            let body = bytes::Bytes::from(if self.config.gzip {
                gzipped(&body)
            } else {
                body
            });
            let failure = runtime.block_on(async {
                // The OTLP specification's retries: 429, 502, 503 and 504 are sent again
                // after a backoff (the collector's `Retry-After`, when it gives one), a few
                // times; another answer or a failure to connect is not.
                let mut attempt = 0u32;
                loop {
                    let mut post = client
                        .post(&self.config.url)
                        .header("content-type", "application/x-protobuf")
                        .timeout(self.config.timeout)
                        .body(body.clone());
                    if self.config.gzip {
                        post = post.header("content-encoding", "gzip");
                    }
                    for (k, v) in &self.config.headers {
                        post = post.header(k, v);
                    }
                    let why = match post.send().await {
                        Ok(response) if response.status().is_success() => return None,
                        Ok(response) => {
                            let status = response.status();
                            let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
                            if retryable && attempt < EXPORT_RETRIES {
                                let wait = crate::transport::http::retry_after(
                                    response.headers(),
                                    SystemTime::now(),
                                )
                                .unwrap_or(RETRY_BACKOFF * 2u32.pow(attempt))
                                .min(MAX_RETRY_WAIT);
                                attempt += 1;
                                tokio::time::sleep(wait).await;
                                continue;
                            }
                            let tries = if attempt > 0 {
                                format!(" ({} tries)", attempt + 1)
                            } else {
                                String::new()
                            };
                            format!("the collector answered {status}{tries}")
                        }
                        Err(e) if e.is_timeout() => format!(
                            "the collector did not answer within {} ms \
                             (OTEL_EXPORTER_OTLP_TIMEOUT)",
                            self.config.timeout.as_millis()
                        ),
                        Err(e) => format!("cannot reach the collector: {}", error_chain(&e)),
                    };
                    return Some(why);
                }
            });
            match failure {
                None => {
                    self.progress.sent.fetch_add(n, Ordering::Relaxed);
                }
                Some(why) => {
                    self.progress.dropped.fetch_add(n, Ordering::Relaxed);
                    if first_failure.is_none() {
                        (self.warn)(&format!(
                            "OTLP export to {} failed ({why}); the run goes on, its spans are dropped",
                            shown_url(&self.config.url)
                        ));
                        first_failure = Some(why);
                    }
                }
            }
        }
        first_failure
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn fault_status(span: &mut Span, fault: Option<&Fault>) {
    if let Some(fault) = fault {
        span.status = Some(Status {
            code: StatusCode::Error as i32,
            message: fault.message.clone(),
        });
        span.events.push(SpanEvent {
            time_unix_nano: span.end_time_unix_nano,
            name: "exception".to_owned(),
            attributes: vec![
                text("exception.type", fault.category.as_str()),
                text("exception.message", &fault.message),
            ],
            ..SpanEvent::default()
        });
    }
}

/// An 8-byte span id derived from `base` and `parts`: the same keys give the same id, so a
/// node's children name it without anything being kept between events.
fn derived_id(base: &[u8], parts: &[&str]) -> Vec<u8> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(base);
    for part in parts {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    let hash = hasher.finalize();
    let mut id = hash.as_bytes()[..8].to_vec();
    if id.iter().all(|b| *b == 0) {
        id[7] = 1;
    }
    id
}

/// The span name of an exchange: its label when that is a request line (`POST /chat`),
/// else only the kind of wire, since a socket's path or port and a process's command line
/// change from run to run (a temporary directory, an ephemeral port) and a tracing backend
/// groups spans by name. The label is kept as `trellis.exchange.label`.
fn exchange_span_name(label: &str) -> String {
    for (prefix, name) in [
        ("exec `", "exec"),
        ("line `", "line"),
        ("tcp:", "tcp"),
        ("unix:", "unix"),
    ] {
        if label.starts_with(prefix) {
            return name.to_owned();
        }
    }
    label.to_owned()
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}

fn int(key: &str, value: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(
                i64::try_from(value).unwrap_or(i64::MAX),
            )),
        }),
        ..KeyValue::default()
    }
}

fn double(key: &str, value: f64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::DoubleValue(value)),
        }),
        ..KeyValue::default()
    }
}

/// How long an exchange's attempts took, together (its `latency_ms` is the last one's).
fn exchange_ms(exchange: &crate::record::ExchangeRecord) -> f64 {
    if exchange.attempts.is_empty() {
        exchange.latency_ms
    } else {
        exchange.attempts.iter().map(|a| a.latency_ms).sum()
    }
}

fn ms_nanos(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1e6) as u64
    } else {
        0
    }
}

fn system_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn now_nanos() -> u64 {
    system_nanos(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_span_is_named_by_its_wire_not_its_address() {
        for (label, name) in [
            ("POST /chat", "POST /chat"),
            ("tcp:127.0.0.1:42081", "tcp"),
            ("unix:/tmp/trellis-SUmyvN/support.sock", "unix"),
            ("exec `'/tmp/bin/trellis' agent support --per-call`", "exec"),
            ("line `python3 agent.py`", "line"),
        ] {
            assert_eq!(exchange_span_name(label), name);
        }
    }

    #[test]
    fn credentials_shown_are_masked_readably() {
        assert_eq!(
            without_credentials("http://u:p@127.0.0.1:4318/v1/traces"),
            "http://…@127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            without_credentials("http://127.0.0.1:4318/v1/traces"),
            "http://127.0.0.1:4318/v1/traces"
        );
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// `OTEL_RESOURCE_ATTRIBUTES` reaches the resource (its `service.name` when
    /// `OTEL_SERVICE_NAME` does not say), `OTEL_TRACES_EXPORTER=none` turns the variables off,
    /// and a timeout of 0 is refused rather than timing every request out.
    #[test]
    fn resource_attributes_the_exporter_switch_and_a_zero_timeout() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let config = ExportConfig::resolve(
            None,
            env(&[
                base,
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "service.name=evals,deployment.environment=ci%20main",
                ),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.service, "evals");
        assert_eq!(
            config.resource,
            [("deployment.environment".to_owned(), "ci main".to_owned())]
        );
        let named = ExportConfig::resolve(
            None,
            env(&[
                base,
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=evals"),
                ("OTEL_SERVICE_NAME", "mine"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(named.service, "mine");
        assert_eq!(
            ExportConfig::resolve(None, env(&[base, ("OTEL_TRACES_EXPORTER", "none")])),
            Ok(None)
        );
        assert!(matches!(
            ExportConfig::resolve(None, env(&[base, ("OTEL_EXPORTER_OTLP_TIMEOUT", "0")])),
            Err(ExportConfigError::BadTimeout { .. })
        ));
        assert!(matches!(
            ExportConfig::resolve(None, env(&[base, ("OTEL_RESOURCE_ATTRIBUTES", "novalue")])),
            Err(ExportConfigError::BadResource { .. })
        ));
    }

    /// `/v1/traces` goes on the path, before a query; a user and password in the URL are
    /// refused without being shown (they were printed in warnings, and never sent).
    #[test]
    fn the_endpoints_path_query_and_credentials() {
        let url = |base: &str| {
            ExportConfig::resolve(Some(base), env(&[]))
                .map(|c| c.map(|c| c.url))
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            url("http://c:4318/otlp/?tenant=a"),
            Ok(Some("http://c:4318/otlp/v1/traces?tenant=a".to_owned()))
        );
        assert_eq!(url("https://c"), Ok(Some("https://c/v1/traces".to_owned())));
        let refused = url("http://admin:s3cr3t@127.0.0.1:4318/").unwrap_err();
        assert!(refused.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{refused}");
        assert!(
            !refused.contains("s3cr3t") && !refused.contains("admin"),
            "{refused}"
        );
        let refused = url("ftp://admin:s3cr3t@h/").unwrap_err();
        assert!(!refused.contains("s3cr3t"), "{refused}");
        assert_eq!(
            shown_url("http://c/v1/traces?token=x"),
            "http://c/v1/traces?…"
        );
    }

    #[test]
    fn the_standard_variables_configure_the_export() {
        assert_eq!(ExportConfig::resolve(None, env(&[])), Ok(None));
        let config = ExportConfig::resolve(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer x, x-team = evals",
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_SERVICE_NAME", "evals"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.url, "http://collector:4318/v1/traces");
        assert_eq!(
            config.headers,
            [
                ("authorization".to_owned(), "Bearer x".to_owned()),
                ("x-team".to_owned(), "evals".to_owned())
            ]
        );
        assert_eq!(config.timeout, Duration::from_millis(2500));
        assert_eq!(config.service, "evals");
        // The flag wins; a traces endpoint is used as given; grpc is refused, saying so.
        let flagged = ExportConfig::resolve(
            Some("http://a:1"),
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/x")]),
        );
        assert_eq!(flagged.unwrap().unwrap().url, "http://a:1/v1/traces");
        let full = ExportConfig::resolve(
            None,
            env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/x")]),
        );
        assert_eq!(full.unwrap().unwrap().url, "http://b:2/x");
        assert_eq!(
            ExportConfig::resolve(
                Some("http://a:1"),
                env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
            ),
            Err(ExportConfigError::Protocol {
                var: "OTEL_EXPORTER_OTLP_PROTOCOL",
                value: "grpc".to_owned()
            })
        );
        // The variable named is the one set.
        let traces_only = ExportConfig::resolve(
            Some("http://a:1"),
            env(&[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")]),
        );
        assert!(
            traces_only
                .unwrap_err()
                .to_string()
                .starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc")
        );
        // Compression: gzip or none.
        let gzip = |value: &str| {
            ExportConfig::resolve(
                Some("http://a:1"),
                env(&[("OTEL_EXPORTER_OTLP_COMPRESSION", value)]),
            )
            .map(|c| c.unwrap().gzip)
        };
        assert_eq!(gzip("gzip"), Ok(true));
        assert_eq!(gzip("none"), Ok(false));
        assert!(gzip("zstd").is_err());
        assert!(ExportConfig::resolve(Some("collector:4318"), env(&[])).is_err());
        // Percent-encoded, as the specification writes them and every SDK reads them.
        let encoded = ExportConfig::resolve(
            Some("http://a:1"),
            env(&[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Basic%20dXNlcjpwYXNz,x-list=a%2Cb%3Dc,",
            )]),
        );
        assert_eq!(
            encoded.unwrap().unwrap().headers,
            [
                ("Authorization".to_owned(), "Basic dXNlcjpwYXNz".to_owned()),
                ("x-list".to_owned(), "a,b=c".to_owned())
            ]
        );
        // Malformed settings are said, not ignored.
        // A value that does not pass is not repeated: it may be a credential.
        let said = ExportConfig::resolve(
            Some("http://a:1"),
            env(&[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Basic%20s3cret%0A",
            )]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            said.contains("Authorization=…") && !said.contains("s3cret"),
            "{said}"
        );
        for bad in ["garbage", "bad key=v", "a=%e9", "a=x%0Ay"] {
            assert!(
                matches!(
                    ExportConfig::resolve(
                        Some("http://a:1"),
                        env(&[("OTEL_EXPORTER_OTLP_HEADERS", bad)])
                    ),
                    Err(ExportConfigError::BadHeader { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            ExportConfig::resolve(
                Some("http://a:1"),
                env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "abc")])
            ),
            Err(ExportConfigError::BadTimeout { .. })
        ));
        assert_eq!(
            ExportConfig::resolve(
                None,
                env(&[
                    ("OTEL_SDK_DISABLED", "true"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1")
                ])
            ),
            Ok(None)
        );
    }
}
