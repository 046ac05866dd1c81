//! The typed suite model: what a set of suite files means once parsed and validated.
//!
//! Everything here is plain data. The parser (`crate::parse`) builds it, validation
//! (`crate::validate`) guarantees its invariants (references resolve, ids are unique,
//! templates only use variables that exist), and the engine consumes it read-only.
//! Every user-written item keeps a [`Span`] so later stages can point back at the source.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::columns::{BlockCounts, Unit};
use crate::lang::{Capabilities, ProtocolSpec};
use miette::{NamedSource, SourceSpan};
use regex::Regex;
use serde_json::{Map, Value};

/// Index of a file in [`Project::files`].
pub type FileId = usize;

/// A location in one of the project's source files.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    pub file: FileId,
    pub span: SourceSpan,
}

impl Span {
    pub fn new(file: FileId, span: SourceSpan) -> Self {
        Span { file, span }
    }
}

/// As derived (`Span { file: 0, span: SourceSpan { … } }`), or `_` inside
/// [`debug_without_spans`].
impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if ERASING_SPANS.get() {
            return f.write_str("_");
        }
        f.debug_struct("Span")
            .field("file", &self.file)
            .field("span", &self.span)
            .finish()
    }
}

thread_local! {
    static ERASING_SPANS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `write` with every [`Span`] this thread formats with `Debug` written as `_`: the
/// model's `Debug` text without where things were written, which is what the engine's
/// fingerprints hash (a value's meaning, unmoved by formatting and comments). The same text
/// as erasing each span's derived form from the output afterwards, without a second pass
/// over it.
pub fn debug_without_spans<R>(write: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ERASING_SPANS.set(self.0);
        }
    }
    let _restore = Restore(ERASING_SPANS.replace(true));
    write()
}

/// A value together with where it was written.
#[derive(Clone, Debug)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

impl<T> Spanned<T> {
    pub fn new(value: T, span: Span) -> Self {
        Spanned { value, span }
    }
}

impl<T> std::ops::Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// A file's text as miette reads it, with the column of `file:line:column` counted in
/// characters.
///
/// miette counts that column in bytes, so an error after `é` on its line pointed one column
/// too far for each such character, and an editor or terminal link jumped to the wrong place.
/// Lines are counted as miette counts them (`\n`, `\r\n` and a lone `\r` each end one).
///
/// miette finds a span's line by reading the text from its start, once for each label it
/// draws: 20,000 diagnostics in one 1.5 MB file took 36 s to print. The file's
/// [`LineStarts`] say where the span's lines are, and miette reads only those.
#[derive(Clone, Debug)]
pub struct CharColumns {
    text: Arc<str>,
    lines: LineStarts,
}

impl CharColumns {
    /// The text of `file`, sharing its line starts.
    pub fn of(file: &SourceFile) -> Self {
        CharColumns {
            text: file.text.clone(),
            lines: file.lines.clone(),
        }
    }

    /// What miette's own reading of the whole text gives for `span`, reading only the lines
    /// it can reach: from `context_lines_before` lines above the span's first line to a
    /// few more than `context_lines_after` below its last (miette stops reading after at
    /// most `context_lines_after + 2` line ends past the span).
    fn read_lines<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let text = &*self.text;
        let end = span.offset().saturating_add(span.len());
        if end > text.len() {
            return <str as miette::SourceCode>::read_span(
                text,
                span,
                context_lines_before,
                context_lines_after,
            );
        }
        let starts = self.lines.of(text);
        let line_of = |at: usize| line_holding(starts, at);
        // miette finds the span's end at its last byte: for an empty span at a line's start,
        // the line before. Starting at any line before the span reads the same.
        let first =
            line_of(span.offset().min(end.saturating_sub(1))).saturating_sub(context_lines_before);
        let last = line_of(end)
            .saturating_add(context_lines_after)
            .saturating_add(3);
        let from = starts[first];
        let to = starts.get(last).copied().unwrap_or(text.len());
        // Read from a line's start, the part's lines are the text's, `first` lines down.
        let part = &text.as_bytes()[from..to];
        let local = SourceSpan::new((span.offset() - from).into(), span.len());
        let read = <[u8] as miette::SourceCode>::read_span(
            part,
            &local,
            context_lines_before,
            context_lines_after,
        )?;
        Ok(Box::new(miette::MietteSpanContents::new(
            read.data(),
            SourceSpan::new((read.span().offset() + from).into(), read.span().len()),
            read.line() + first,
            read.column(),
            read.line_count() + first,
        )))
    }
}

impl miette::SourceCode for CharColumns {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let contents = self.read_lines(span, context_lines_before, context_lines_after)?;
        // miette reports a column only for a span read without lines before it (the
        // `file:line:column` line); elsewhere it is 0 and stays so.
        if context_lines_before != 0 {
            return Ok(contents);
        }
        let text = &*self.text;
        let mut offset = span.offset().min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line_start = text[..offset].rfind(['\n', '\r']).map_or(0, |i| i + 1);
        let column = text[line_start..offset].chars().count();
        Ok(Box::new(miette::MietteSpanContents::new(
            contents.data(),
            *contents.span(),
            contents.line(),
            column,
            contents.line_count(),
        )))
    }
}

/// Where each line of a file's text starts (0 first), lines ending as miette ends them:
/// built the first time a diagnostic of the file is drawn, and shared by all of them.
#[derive(Clone, Debug, Default)]
pub struct LineStarts(Arc<OnceLock<Box<[usize]>>>);

impl LineStarts {
    fn of(&self, text: &str) -> &[usize] {
        self.0.get_or_init(|| {
            let b = text.as_bytes();
            let mut starts = vec![0];
            let mut i = 0;
            while i < b.len() {
                match b[i] {
                    b'\r' if b.get(i + 1) == Some(&b'\n') => {
                        i += 2;
                        starts.push(i);
                    }
                    b'\n' | b'\r' => {
                        i += 1;
                        starts.push(i);
                    }
                    _ => i += 1,
                }
            }
            starts.into_boxed_slice()
        })
    }
}

/// The index in `starts` (a [`LineStarts`] list) of the line holding byte `offset`.
fn line_holding(starts: &[usize], offset: usize) -> usize {
    // `starts[0]` is 0, so every offset has a line.
    starts.partition_point(|&s| s <= offset) - 1
}

/// One loaded `*.kdl` file.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub path: PathBuf,
    /// The path as shown in diagnostics (relative to the working directory when possible).
    pub name: String,
    pub text: Arc<str>,
    /// Where the lines of `text` start, for drawing diagnostics ([`CharColumns`]).
    lines: LineStarts,
    /// Characters before each block of `text`, for columns on long lines: made the first
    /// time such a column is counted, and shared by every such count.
    chars: Arc<OnceLock<BlockCounts>>,
}

impl SourceFile {
    pub fn new(path: PathBuf, name: String, text: Arc<str>) -> Self {
        SourceFile {
            path,
            name,
            text,
            lines: LineStarts::default(),
            chars: Arc::default(),
        }
    }

    pub fn named_source(&self) -> NamedSource<CharColumns> {
        NamedSource::new(self.name.clone(), CharColumns::of(self))
    }

    /// The 0-based line holding byte `offset`, lines ending as miette ends them, and the
    /// byte range of its text without its line end.
    pub fn line_at(&self, offset: usize) -> (usize, std::ops::Range<usize>) {
        let text = &*self.text;
        let starts = self.lines.of(text);
        let line = line_holding(starts, offset.min(text.len()));
        let end = match starts.get(line + 1) {
            Some(&next) if text.as_bytes().get(next.wrapping_sub(2)..next) == Some(b"\r\n") => {
                next - 2
            }
            Some(&next) => next - 1,
            None => text.len(),
        };
        (line, starts[line]..end)
    }

    /// The characters in `text[from..to]`, both character boundaries: a column on a line of
    /// any length, reading at most a block of the text on each side.
    pub fn chars_between(&self, from: usize, to: usize) -> usize {
        let text = &*self.text;
        self.chars
            .get_or_init(|| BlockCounts::new(text, Unit::Char))
            .between(text, from, to)
    }

    /// 1-based line and column of a byte offset, for messages outside miette.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, col)
    }
}

/// Everything loaded together: names (agents, personas, tools, providers, judges) are global
/// across these files, scenario ids are unique per suite.
#[derive(Clone, Debug, Default)]
pub struct Project {
    pub files: Vec<SourceFile>,
    pub suites: Vec<Suite>,
    pub agents: Vec<Agent>,
    pub personas: Vec<Persona>,
    pub tools: Vec<Tool>,
    pub providers: Vec<Provider>,
    pub judges: Vec<Judge>,
    /// `panel` nodes: several judges deciding one criterion together.
    pub panels: Vec<Panel>,
    pub simulator: Option<Simulator>,
    /// `dataset` nodes: tables of cases that `for-each` scenarios expand over.
    pub datasets: Vec<Dataset>,
    /// `for-each` scenarios whose dataset kept no row (so no instance runs), with why:
    /// `trellis check` warns about them.
    pub empty_expansions: Vec<(Spanned<String>, String)>,
    /// Every `env.NAME` a template reads, where it is written (filled by validation).
    pub env_reads: Vec<Spanned<String>>,
    /// Files with no nodes (empty, or comments only), loaded as nothing: `trellis check`
    /// warns about them (`trellis::empty_file`).
    pub empty_files: Vec<FileId>,
    /// `simulator` (of a scenario or branch) and `persona` (of a branch) nodes no `simulate`
    /// step under them plays, by their names' spans: `trellis check` warns about them
    /// (`trellis::unplayed`).
    pub unplayed: Vec<Spanned<&'static str>>,
    /// CSV dataset columns of two types, found as their files were read: `trellis check`
    /// warns about them (`trellis::mixed_column`).
    pub column_warnings: Vec<crate::diagnostics::Diagnostic>,
}

impl Project {
    pub fn agent(&self, id: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.id.value == id)
    }
    /// The agents `scenario` runs against: those it names (undefined ones left out), or
    /// the project's only agent; none when it names none and that is ambiguous (validation
    /// reports it).
    pub fn scenario_agents(&self, scenario: &Scenario) -> Vec<&Agent> {
        if scenario.agents.is_empty() {
            match self.agents.as_slice() {
                [only] => vec![only],
                _ => Vec::new(),
            }
        } else {
            scenario
                .agents
                .iter()
                .filter_map(|a| self.agent(&a.value))
                .collect()
        }
    }
    pub fn persona(&self, id: &str) -> Option<&Persona> {
        self.personas.iter().find(|p| p.id.value == id)
    }
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name.value == name)
    }
    pub fn provider(&self, id: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| p.id.value == id)
    }
    pub fn judge(&self, id: &str) -> Option<&Judge> {
        self.judges.iter().find(|j| j.id.value == id)
    }
    pub fn panel(&self, id: &str) -> Option<&Panel> {
        self.panels.iter().find(|p| p.id.value == id)
    }
    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id]
    }
    /// Every scenario with the suite it belongs to, in file order.
    pub fn scenarios(&self) -> impl Iterator<Item = (&Suite, &Scenario)> {
        self.suites
            .iter()
            .flat_map(|s| s.scenarios.iter().map(move |sc| (s, &**sc)))
    }
}

/// One suite file (files that only hold shared definitions and no scenarios are not suites).
#[derive(Clone, Debug)]
pub struct Suite {
    /// `suite "NAME"`, or the file stem.
    pub name: String,
    pub file: FileId,
    pub description: Option<String>,
    pub tags: Vec<String>,
    /// Shared, so a plan refers to a scenario instead of copying it (a copy per scenario
    /// was a quarter of the memory of planning a suite of 30,000 small scenarios).
    pub scenarios: Vec<std::sync::Arc<Scenario>>,
}

/// The protocol an agent speaks: one entry of the protocol registry the loader was handed
/// (the engine's, `engine/src/protocol/registry.rs`). Two are equal when their names are.
/// Code that depends on what a protocol can do asks [`Protocol::capabilities`] or whether
/// it [`declares`](Protocol::declares) a setting, never its name.
#[derive(Clone, Copy)]
pub struct Protocol(&'static ProtocolSpec);

impl Protocol {
    pub fn new(spec: &'static ProtocolSpec) -> Self {
        Protocol(spec)
    }

    pub fn spec(self) -> &'static ProtocolSpec {
        self.0
    }

    /// The value of `protocol="…"`.
    pub fn as_str(self) -> &'static str {
        self.0.name
    }

    pub fn capabilities(self) -> Capabilities {
        self.0.capabilities
    }

    /// A model under test whose tool loop the engine runs (`openai`, `anthropic`).
    pub fn is_model(self) -> bool {
        self.0.capabilities.model_api
    }

    /// Whether `setting` is one of the protocol's own settings (beyond those every agent
    /// takes).
    pub fn declares(self, setting: &str) -> bool {
        self.0.settings.iter().any(|s| s.name == setting)
    }
}

impl PartialEq for Protocol {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Protocol {}

impl std::hash::Hash for Protocol {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl std::fmt::Debug for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Protocol({:?})", self.0.name)
    }
}

/// Where an agent lives.
#[derive(Clone)]
pub enum Endpoint {
    /// `url="…"` (or `base-url` for `openai`): a template that may read `env`
    /// (`http://127.0.0.1:{{ env.AGENT_PORT }}/agent/respond`), rendered once per run.
    Url(Template),
    /// `builtin="NAME"`: an embedded reference agent the engine serves on loopback.
    Builtin(Spanned<String>),
    /// `command="…"`: a process speaking newline-delimited JSON on stdin/stdout (multiagent).
    Command(String),
    /// `socket="tcp://host:port"`, `"tcp:host:port"`, `"unix:///path"` or `"unix:/path"`
    /// (multiagent).
    Socket(SocketAddress),
    /// `provider="ID"` (`openai`/`anthropic`): the model is reached through a `provider` node,
    /// with its base URL, key, headers, limits and prices.
    Provider(Spanned<String>),
}

/// Written as before a URL could be a template (`Url("…")`): the scenario fingerprints are
/// this text's digest, compared with those of runs older binaries made (`--resume`).
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Url(url) => f.debug_tuple("Url").field(&url.source).finish(),
            Endpoint::Builtin(name) => f.debug_tuple("Builtin").field(name).finish(),
            Endpoint::Command(command) => f.debug_tuple("Command").field(command).finish(),
            Endpoint::Socket(address) => f.debug_tuple("Socket").field(address).finish(),
            Endpoint::Provider(id) => f.debug_tuple("Provider").field(id).finish(),
        }
    }
}

/// Where a `socket=` agent listens, both spellings decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketAddress {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// `process` of a `command=` agent (and of a `builtin=` agent with `transport="process"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessMode {
    /// One process per call: the payload without a trailing newline, stdin closed, the whole
    /// stdout is the answer (what the real harness does; agents that loop over stdin lines
    /// work this way too).
    #[default]
    PerCall,
    /// One process for the run, one JSON line in and one out per call (the spec), one call
    /// at a time; restarted if it dies, ended with its process tree when the run ends.
    LongLived,
}

impl ProcessMode {
    pub const ALL: [(&'static str, ProcessMode); 2] = [
        ("per-call", ProcessMode::PerCall),
        ("long-lived", ProcessMode::LongLived),
    ];
}

/// `transport` of a `builtin=` multiagent agent: how the engine serves the embedded agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BuiltinTransport {
    /// `POST /execute_task` on a loopback port.
    #[default]
    Http,
    /// The trellis executable itself as the agent process (`trellis agent NAME --per-call`,
    /// or `--stdio` with `process "long-lived"`).
    Process,
    /// Newline-delimited JSON on a loopback TCP port.
    Tcp,
    /// Newline-delimited JSON on a Unix socket in a fresh temporary directory.
    Unix,
}

impl BuiltinTransport {
    pub const ALL: [(&'static str, BuiltinTransport); 4] = [
        ("http", BuiltinTransport::Http),
        ("process", BuiltinTransport::Process),
        ("tcp", BuiltinTransport::Tcp),
        ("unix", BuiltinTransport::Unix),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BuiltinTransport::Http => "http",
            BuiltinTransport::Process => "process",
            BuiltinTransport::Tcp => "tcp",
            BuiltinTransport::Unix => "unix",
        }
    }
}

/// Limits on exploring agent-initiated branches (a MultiAgentEval `branch` action): at most
/// `breadth` alternatives per branch action, nested at most `depth` deep (deeper branch
/// actions continue their first alternative only). The original harness's caps by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentBranches {
    pub breadth: u32,
    pub depth: u32,
}

impl Default for AgentBranches {
    fn default() -> Self {
        AgentBranches {
            breadth: 5,
            depth: 3,
        }
    }
}

/// `first-turn` of a scenario: who speaks first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FirstTurn {
    /// The first user step opens the conversation.
    #[default]
    User,
    /// The agent is called before any user step (Connexity: with `messages: []`).
    Agent,
}

impl FirstTurn {
    pub const ALL: [(&'static str, FirstTurn); 2] =
        [("user", FirstTurn::User), ("agent", FirstTurn::Agent)];
}

pub const DEFAULT_MAX_RESPONSE_SIZE: u64 = 8 * 1024 * 1024;
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The agent's protocol's own settings as written (those its spec declares as one-value
/// settings), type-checked by the loader against the spec, for the protocol's module to
/// decode into its own typed settings ([`ProtocolSettings::decode`]).
#[derive(Clone, Debug, Default)]
pub struct ProtocolSettings(pub Vec<ProtocolSetting>);

/// One protocol setting as written: its value as JSON (an array for a setting that takes
/// several values), where the values are, and where each one is.
#[derive(Clone, Debug)]
pub struct ProtocolSetting {
    pub name: &'static str,
    /// Where its name is written (a property's key or a child node's name).
    pub name_span: Span,
    pub value: Spanned<Value>,
    /// The span of each value, in order (one for a one-value setting).
    pub items: Vec<Span>,
    /// The loader decodes and checks this setting by hand (its own model field), so the
    /// checks a value's type gets (references, templates) are not made again.
    pub checked: bool,
}

impl ProtocolSettings {
    /// The value of setting `name`, if written.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.spanned(name).map(|v| &v.value)
    }

    /// The value of setting `name` with where it is written, if written.
    pub fn spanned(&self, name: &str) -> Option<&Spanned<Value>> {
        self.setting(name).map(|s| &s.value)
    }

    /// Setting `name` as written, if written.
    pub fn setting(&self, name: &str) -> Option<&ProtocolSetting> {
        self.0.iter().find(|s| s.name == name)
    }

    /// The settings as a typed struct (serde, from an object of the written settings).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        let object: Map<String, Value> = self
            .0
            .iter()
            .map(|s| (s.name.to_owned(), s.value.value.clone()))
            .collect();
        serde_json::from_value(Value::Object(object))
    }
}

#[derive(Clone)]
pub struct Agent {
    pub id: Spanned<String>,
    pub protocol: Protocol,
    pub endpoint: Endpoint,
    /// `header NAME TEMPLATE`: once per run when it reads only `env`, else for each turn with
    /// the turn's variables (`trellis_dsl::template::reads_turn_scope`).
    pub headers: Vec<(String, Template)>,
    /// Per agent call; [`DEFAULT_CALL_TIMEOUT`] when not written.
    pub timeout: Option<Duration>,
    /// Retries of failures that provably never reached the agent (connect errors) and of
    /// 5xx answers (never 4xx); timeouts and broken connections only with
    /// [`Agent::retry_after_send`].
    pub retries: u32,
    /// `retry-after-send`: also retry timeouts and connections broken after the request was
    /// sent, accepting that the agent may run the turn (and its side effects) twice.
    pub retry_after_send: bool,
    /// At most this many calls in flight to this agent.
    pub concurrency: Option<usize>,
    /// `per-shard #true`: `concurrency` is each shard's own instead of divided among the
    /// shards of a sharded run.
    pub per_shard: bool,
    /// `spans #true`: the agent's OpenTelemetry spans are collected for its turns (an OTLP
    /// receiver is started for the run) and checks may read them.
    pub spans: bool,
    /// `max-response-size`: bytes read at most from one response.
    pub max_response_size: u64,
    /// `openai`: the model; others: informational.
    pub model: Option<String>,
    /// `provider="ID"`: on `openai`/`anthropic` agents the endpoint (also in
    /// [`Agent::endpoint`]); on `fixie` agents the provider that plays Fixie's LLM; on the
    /// others the provider whose server runs the agent's own model (each turn holds one of
    /// its slots).
    pub provider: Option<Spanned<String>>,
    /// `secret-env "NAME"…`: environment variables whose values are secrets of this agent
    /// (a process agent's inherited API key, a key its `url` carries), redacted wherever it
    /// echoes them, as the values its headers read.
    pub secret_env: Vec<Spanned<String>>,
    /// The protocol's own one-value settings as written, for its module.
    pub settings: ProtocolSettings,
    pub span: Span,
}

/// The derived form without `secret_env`: the debug form is what fingerprints hash
/// (engine/src/fingerprint.rs), and which variables are redacted changes no conversation,
/// so declaring one must not make finished runs' trajectories run again.
impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("id", &self.id)
            .field("protocol", &self.protocol)
            .field("endpoint", &self.endpoint)
            .field("headers", &self.headers)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("retry_after_send", &self.retry_after_send)
            .field("concurrency", &self.concurrency)
            .field("per_shard", &self.per_shard)
            .field("spans", &self.spans)
            .field("max_response_size", &self.max_response_size)
            .field("model", &self.model)
            .field("provider", &self.provider)
            .field("settings", &self.settings)
            .field("span", &self.span)
            .finish()
    }
}

#[derive(Clone)]
pub struct Persona {
    pub id: Spanned<String>,
    pub kind: String,
    pub description: Option<String>,
    pub instructions: Option<String>,
    /// `description` and `instructions` where they are written as templates, with their
    /// place: each scenario that plays the persona fills them in from its own scope.
    pub templates: Vec<Template>,
    pub span: Span,
}

/// Without `templates`, which the texts already say: the debug form is what fingerprints
/// hash (engine/src/fingerprint.rs), and a run's must not change when a field is derived.
impl std::fmt::Debug for Persona {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persona")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("description", &self.description)
            .field("instructions", &self.instructions)
            .field("span", &self.span)
            .finish()
    }
}

#[derive(Clone, Debug)]
pub enum PersonaRef {
    Named(Spanned<String>),
    /// Boxed: most scenarios name a persona or none, and every scenario holds the room of
    /// the largest variant.
    Inline(Box<Persona>),
}

#[derive(Clone, Debug)]
pub struct Tool {
    pub name: Spanned<String>,
    pub description: Option<String>,
    pub params: Vec<ToolParam>,
    pub mocks: Vec<ToolMock>,
    /// `sequence { output …; … }`: outputs consumed one per call (then `mocks` is empty).
    pub sequence: Option<ToolSequence>,
    /// `state path=… value=…` directly in the `tool` block: applied on every executed call,
    /// before the answering mock's own changes.
    pub state_changes: Vec<StateChange>,
    pub policies: Vec<ToolPolicy>,
    pub span: Span,
}

#[derive(Clone)]
pub struct ToolParam {
    pub name: String,
    /// JSON-schema type name: string, number, integer, boolean, object, array.
    pub ty: String,
    pub required: bool,
    pub description: Option<String>,
    pub span: Span,
}

/// Without its span, as before it had one: the fingerprints are this text's digest
/// (see [`Endpoint`]'s `Debug`).
impl std::fmt::Debug for ToolParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolParam")
            .field("name", &self.name)
            .field("ty", &self.ty)
            .field("required", &self.required)
            .field("description", &self.description)
            .finish()
    }
}

/// `mock returns=JSON key=value…`: answer with `returns` when the call's arguments contain
/// the given key/values (subset match; no keys = any call).
#[derive(Clone, Debug)]
pub struct ToolMock {
    pub when: Map<String, Value>,
    pub returns: Value,
    /// `mock … { state path=… value=… }`: applied when this mock answers.
    pub state_changes: Vec<StateChange>,
    pub span: Span,
}

/// `state path="orders.0.status" value="refunded"`: set a value in the sandbox's state
/// document. The path is dotted (a decimal segment indexes an array) or a JSON pointer.
#[derive(Clone, Debug, PartialEq)]
pub struct StateChange {
    pub path: String,
    pub value: Value,
    pub span: Span,
}

/// `sequence when-exhausted=… { output …; … }`.
#[derive(Clone, Debug)]
pub struct ToolSequence {
    pub outputs: Vec<SequenceOutput>,
    pub when_exhausted: WhenExhausted,
    pub span: Span,
}

/// `output JSON KEY=VALUE…` in a `sequence`: without keys, the next call's answer; with keys,
/// the answer of the first call whose arguments match them (Connexity's `mock_responses`
/// rules: strings case-insensitively, `#null` anything), consumed by that call.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceOutput {
    pub value: Value,
    pub when: Map<String, Value>,
}

/// What a call past the end of a [`ToolSequence`] gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenExhausted {
    /// The last output again.
    #[default]
    RepeatLast,
    /// An error result.
    Error,
}

impl WhenExhausted {
    pub const ALL: [(&'static str, WhenExhausted); 2] = [
        ("repeat-last", WhenExhausted::RepeatLast),
        ("error", WhenExhausted::Error),
    ];
}

/// A governance policy on one parameter of a tool: a breaching call is not executed, the
/// agent gets governance feedback and the violation is recorded.
///
/// Written `policy "PARAM" max=N`, `policy "PARAM" allowed="A" "B"…`, or the harness's
/// `policy max-limit=N` (on `amount`; `param="…"` names another parameter).
#[derive(Clone, Debug)]
pub struct ToolPolicy {
    pub param: String,
    pub rule: PolicyRule,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PolicyRule {
    /// The parameter, when numeric, must not exceed this.
    Maximum(f64),
    /// The parameter, when present, must equal one of these (JSON equality).
    Allowed(Vec<Value>),
}

/// `undeclared-tools` of a scenario: what a call to a tool no `tool` node declares gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UndeclaredTools {
    /// The harness's `{"status":"success","message":"Executed NAME"}`.
    #[default]
    Default,
    /// An error result, counted as an error of the trajectory.
    Error,
}

impl UndeclaredTools {
    pub const ALL: [(&'static str, UndeclaredTools); 2] = [
        ("default", UndeclaredTools::Default),
        ("error", UndeclaredTools::Error),
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

/// `provider "ID" kind=…`: an LLM endpoint for the simulator and judges.
#[derive(Clone, Debug)]
pub struct Provider {
    pub id: Spanned<String>,
    pub kind: ProviderKind,
    pub base_url: Option<String>,
    pub model: Option<String>,
    /// The environment variable holding the API key (the key itself is never in a suite),
    /// where the suite names it.
    pub api_key_env: Option<Spanned<String>>,
    /// The header the key is sent in, as is, instead of the API's own (`Authorization:
    /// Bearer …`, `x-api-key`): Azure OpenAI's `api-key`.
    pub api_key_header: Option<String>,
    /// Default sampling temperature of calls through this provider (0–2).
    pub temperature: Option<f64>,
    /// Default cap on generated tokens per call.
    pub max_tokens: Option<u32>,
    /// `header "NAME" "VALUE"`: extra headers sent with every call.
    pub headers: Vec<(String, String)>,
    /// Per call attempt; [`Provider::call_timeout`] when not written.
    pub timeout: Option<Duration>,
    /// Retries of connect errors, timeouts, broken connections and 5xx answers
    /// ([`DEFAULT_PROVIDER_RETRIES`] when not written). HTTP 429 is waited out, not retried.
    pub retries: Option<u32>,
    /// At most this many calls in flight through this provider.
    pub concurrency: Option<usize>,
    /// Requests started per minute, spaced evenly.
    pub requests_per_minute: Option<u32>,
    /// Tokens (prompt estimate plus `max-tokens`) reserved per minute.
    pub tokens_per_minute: Option<u32>,
    /// `per-shard #true`: `concurrency`, `requests-per-minute` and `tokens-per-minute` are
    /// each shard's own instead of divided among the shards of a sharded run.
    pub per_shard: bool,
    /// Price per million prompt (input) tokens.
    pub input_price: Option<f64>,
    /// Price per million completion (output) tokens.
    pub output_price: Option<f64>,
    pub span: Span,
}

/// Per-attempt limit of a hosted (`https://`) provider's calls.
pub const DEFAULT_PROVIDER_TIMEOUT: Duration = Duration::from_secs(120);
/// Per-attempt limit of a plain-`http://` (local or LAN) provider's calls: a small model on a
/// CPU writes 20–30 tokens a second after reading a long prompt at a few hundred, so a
/// judge's answer can take minutes, and a timed-out request only starts the work again.
pub const DEFAULT_LOCAL_PROVIDER_TIMEOUT: Duration = Duration::from_secs(300);

impl Provider {
    /// Its `timeout`, else [`DEFAULT_LOCAL_PROVIDER_TIMEOUT`] for a plain-`http://` base URL
    /// and [`DEFAULT_PROVIDER_TIMEOUT`] otherwise.
    pub fn call_timeout(&self) -> Duration {
        let local = self.base_url.as_deref().is_some_and(|u| {
            u.get(..7)
                .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
        });
        self.timeout.unwrap_or(if local {
            DEFAULT_LOCAL_PROVIDER_TIMEOUT
        } else {
            DEFAULT_PROVIDER_TIMEOUT
        })
    }
}
pub const DEFAULT_PROVIDER_RETRIES: u32 = 2;

/// `simulator provider=… model=… temperature=… instructions=… { system-prompt …; … }`: the
/// LLM playing the user. The project's is the default; a scenario's or branch's is a layer
/// over the enclosing one (see [`Simulator::layers`]).
#[derive(Clone, Debug)]
pub struct Simulator {
    /// Required on the project's simulator. A layer without one keeps the enclosing
    /// simulator's provider (and its model and temperature unless it sets its own).
    pub provider: Option<Spanned<String>>,
    pub model: Option<String>,
    pub temperature: Option<f64>,
    /// Added to the enclosing layers' instructions (they accumulate, outermost first).
    pub instructions: Option<Template>,
    /// `system-prompt`: the template of the simulator's system message.
    pub system_prompt: Option<Template>,
    /// `opening-prompt`: the template of the message that asks for the first user message.
    pub opening_prompt: Option<Template>,
    /// `retry-prompt`: the template of the note that asks again after an unusable answer.
    pub retry_prompt: Option<Template>,
    /// `fidelity`: judge the simulated user's turns for breaks of character. `None`: the
    /// enclosing layer's, else on whenever a judge can be resolved.
    pub fidelity: Option<bool>,
    /// `retries-invalid`: how many times an `invalid` trajectory is simulated again (each
    /// attempt a fresh draw: the attempt is part of the LLM cache key). `None`: the
    /// enclosing layer's, else 0.
    pub retries_invalid: Option<u32>,
    /// The simulator of the enclosing branch or scenario this layer is written over (set on
    /// the copies the `simulate` steps hold; `None` on the project's).
    pub outer: Option<std::sync::Arc<Simulator>>,
    pub span: Span,
}

impl Simulator {
    /// This layer, then the enclosing ones outwards (the project's simulator is not among
    /// them: the engine adds it last).
    pub fn layers(&self) -> impl Iterator<Item = &Simulator> {
        std::iter::successors(Some(self), |s| s.outer.as_deref())
    }

    /// This simulator written over `outer`: the copy a `simulate` step holds.
    pub fn over(&self, outer: &std::sync::Arc<Simulator>) -> Simulator {
        let mut layered = self.clone();
        layered.outer = Some(match &self.outer {
            None => outer.clone(),
            Some(next) => std::sync::Arc::new(next.over(outer)),
        });
        layered
    }

    /// The prompt templates a suite may write (`instructions` and the three prompts).
    pub fn templates(&self) -> impl Iterator<Item = &Template> {
        [
            &self.instructions,
            &self.system_prompt,
            &self.opening_prompt,
            &self.retry_prompt,
        ]
        .into_iter()
        .flatten()
    }
}

#[derive(Clone, Debug)]
pub struct Judge {
    pub id: Spanned<String>,
    pub provider: Spanned<String>,
    pub model: Option<String>,
    pub temperature: Option<f64>,
    pub rubric: Option<String>,
    pub threshold: Option<f64>,
    pub span: Span,
}

/// `panel "ID" consensus=… { judges "A" "B"… }`: judges scoring one criterion together;
/// a criterion names it like a judge (`judge="ID"`).
#[derive(Clone, Debug)]
pub struct Panel {
    pub id: Spanned<String>,
    pub judges: Vec<Spanned<String>>,
    pub consensus: Consensus,
    pub span: Span,
}

/// How a panel's judges decide together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Consensus {
    /// The mean score against the threshold.
    #[default]
    Mean,
    /// More than half of the judges pass it.
    Majority,
    /// The lowest score against the threshold.
    Minimum,
    /// Every judge passes it.
    Unanimous,
}

impl Consensus {
    pub const ALL: [(&'static str, Consensus); 4] = [
        ("mean", Consensus::Mean),
        ("majority", Consensus::Majority),
        ("minimum", Consensus::Minimum),
        ("unanimous", Consensus::Unanimous),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Consensus::Mean => "mean",
            Consensus::Majority => "majority",
            Consensus::Minimum => "minimum",
            Consensus::Unanimous => "unanimous",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Difficulty {
    #[default]
    Normal,
    Hard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Status {
    #[default]
    Active,
    Draft,
    Archived,
}

/// An expected outcome for the judge: `outcome "statement"` or `outcome LABEL=VALUE`.
#[derive(Clone, Debug)]
pub enum Outcome {
    Statement(String),
    Labeled { label: String, value: Value },
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub id: Spanned<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    pub difficulty: Difficulty,
    pub tags: Vec<String>,
    pub status: Status,
    /// `agent ID` / `agents ID…`; empty means "the project's only agent" (validation
    /// rejects an empty list when the project has several).
    pub agents: Vec<Spanned<String>>,
    pub persona: Option<PersonaRef>,
    /// `user-context { … }` as a JSON object, keys exactly as written.
    pub user_context: Map<String, Value>,
    /// `initial-state { … }`: the sandbox's state document at the start of every trajectory.
    pub initial_state: Map<String, Value>,
    /// `undeclared-tools`: the sandbox's answer to a tool no `tool` node declares.
    pub undeclared_tools: UndeclaredTools,
    /// `tool` nodes written inside the scenario: its own sandbox tools, which replace a
    /// project `tool` of the same name for this scenario only (scenario files imported side
    /// by side each declare their own `process_refund`).
    pub tools: Vec<Tool>,
    pub max_turns: Option<u32>,
    /// `stop-on-failure #true`: a failed `expect` ends the trajectory at that step (an AES
    /// workflow's failing node stops the scenario).
    pub stop_on_failure: bool,
    /// `agent-branches breadth=N depth=N`: how far the engine explores the forks an agent
    /// asks for (MultiAgentEval `branch` actions).
    pub agent_branches: AgentBranches,
    /// Scenario-level expected outcomes (judged).
    pub outcomes: Vec<Spanned<Outcome>>,
    /// `expect-tool NAME key=value…`: checked deterministically on the whole trajectory.
    pub expect_tools: Vec<Criterion>,
    /// `criteria-override "…"`: the rubric of the scenario's judged checks (a template).
    pub criteria_override: Option<Spanned<String>>,
    /// `test-case-id "…"`: what a Connexity agent is sent as `metadata.test_case_id` (the
    /// platform's case UUID), instead of the scenario id.
    pub test_case_id: Option<Spanned<String>>,
    pub repeat: u32,
    /// Scenario ids (same suite, or `suite/scenario`) that must finish first.
    pub needs: Vec<Spanned<String>>,
    /// Whole-trajectory time limit.
    pub timeout: Option<Duration>,
    /// `first-turn`: whether the agent speaks before the first user step.
    pub first_turn: FirstTurn,
    /// Shared by the instances of a `for-each` or `matrix` scenario, as `criteria` is: an
    /// instance copies them only when its row or values change a judged text in them (a
    /// copy for each row made a dataset of 60,000 rows take 300 MB more).
    pub steps: Arc<Vec<Step>>,
    /// `criteria { … }`: checked on the whole trajectory after its last step.
    pub criteria: Arc<Vec<Criterion>>,
    // The dataset fields are boxed: most scenarios have none, and every scenario's size
    // counts in the memory a suite of thousands takes (`dsl/tests/load_memory.rs`).
    /// `for-each=DATASET`: one scenario per row (set on the scenario as written; the loader
    /// replaces it with its instances).
    pub for_each: Option<Box<Spanned<String>>>,
    /// `row-id "TEMPLATE"`: an instance's stable key; default a hash of the row's content.
    pub row_id: Option<Box<Template>>,
    /// `matrix { NAME VALUE…; … }`: one instance per combination.
    pub matrix: Vec<MatrixVar>,
    /// Set on each instance of a `for-each` or `matrix` scenario: which row and values it
    /// runs with. Its id is `ID[ROW-ID]`, `ID[NAME=VALUE,…]` or both.
    pub instance: Option<Arc<Instance>>,
    /// `history …`: the recorded conversation that opens every trajectory.
    pub history: Option<Box<History>>,
    pub span: Span,
}

/// A scenario's `history`: where it comes from, and once loaded, its messages.
#[derive(Clone, Debug)]
pub struct History {
    pub source: HistorySource,
    /// OpenAI-style messages (`role`, `content` as text, `tool_calls`, `tool_call_id`,
    /// `name`), checked; set by the loader (per instance for a template over `row`).
    pub messages: Option<Arc<Vec<Value>>>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum HistorySource {
    /// `history "{{ row.messages }}"`: a list, or JSON text of one.
    Template(Template),
    /// `history path="conv.json"`: resolved against the suite file's directory.
    File {
        path: Spanned<String>,
        resolved: PathBuf,
    },
}

/// `dataset ID path=… limit=N sample=N seed=N filter="TEMPLATE"`: a table of cases.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub id: Spanned<String>,
    /// The path as written, where it is written.
    pub path: Spanned<String>,
    /// The path resolved against the directory of the file that declares the dataset.
    pub resolved: PathBuf,
    pub limit: Option<usize>,
    pub sample: Option<usize>,
    pub seed: u64,
    /// Renders `true` for the rows to keep; `row` is its only variable.
    pub filter: Option<Template>,
    pub span: Span,
}

/// One `matrix` line: `NAME VALUE…`.
#[derive(Clone, Debug)]
pub struct MatrixVar {
    pub name: Spanned<String>,
    pub values: Vec<Value>,
}

/// What one instance of a `for-each` or `matrix` scenario runs with.
#[derive(Clone, Debug, Default)]
pub struct Instance {
    /// The scenario's id as written (what `--filter ID` also selects, with every instance).
    pub base: String,
    pub dataset: Option<String>,
    /// The row's id: `row-id` rendered, or a hash of its content.
    pub row_id: Option<String>,
    /// The row's number in its file, from 1 (for diagnostics).
    pub row_number: Option<usize>,
    /// The row's fields, typed: `row` in templates.
    pub row: Option<Arc<Map<String, Value>>>,
    /// The matrix values, in the order written: `vars.NAME` in templates.
    pub vars: Vec<(String, Value)>,
}

impl Scenario {
    /// Gives back the spare room of every list the decoder grew: a list's first push makes
    /// room for four items, so a scenario with one criterion per `expect` held four
    /// criteria's worth of memory for each (the model of a suite of thousands of small
    /// scenarios was ~15x its text).
    pub fn shrink_to_fit(&mut self) {
        self.tags.shrink_to_fit();
        self.agents.shrink_to_fit();
        self.tools.shrink_to_fit();
        for tool in &mut self.tools {
            tool.shrink_to_fit();
        }
        self.outcomes.shrink_to_fit();
        shrink_criteria(&mut self.expect_tools);
        self.needs.shrink_to_fit();
        // Only while they are the scenario's own (as decoded): shared with instances, a
        // copy made to shrink them would undo the sharing.
        if let Some(steps) = Arc::get_mut(&mut self.steps) {
            shrink_steps(steps);
        }
        if let Some(criteria) = Arc::get_mut(&mut self.criteria) {
            shrink_criteria(criteria);
        }
    }
}

impl Tool {
    /// As [`Scenario::shrink_to_fit`].
    pub fn shrink_to_fit(&mut self) {
        self.params.shrink_to_fit();
        self.mocks.shrink_to_fit();
        for mock in &mut self.mocks {
            mock.state_changes.shrink_to_fit();
        }
        self.state_changes.shrink_to_fit();
        self.policies.shrink_to_fit();
    }
}

impl Scenario {
    /// The checks of this scenario written as `text` (a result's `criterion`) that a check
    /// on turn `turn` of `trajectory` (`None`: a trajectory-level check) may be: the source
    /// a failure points at. Usually one; more when the same check is written at several
    /// places the trajectory's name and turn cannot tell apart, none when nothing matches
    /// (a check the engine adds, such as a simulated user's fidelity).
    pub fn checks_written_as<'a>(
        &'a self,
        trajectory: &str,
        turn: Option<u32>,
        text: &str,
    ) -> Vec<&'a Criterion> {
        let Some(turn) = turn else {
            return self
                .criteria
                .iter()
                .chain(&self.expect_tools)
                .filter(|c| c.text == text)
                .collect();
        };
        let mut branches = (trajectory != crate::graph::MAIN_TRAJECTORY)
            .then(|| trajectory.split('/'))
            .into_iter()
            .flatten();
        let mut on_path = Vec::new();
        let mut turns = Some(u32::from(self.first_turn == FirstTurn::Agent));
        checks_on_path(&self.steps, &mut branches, &mut turns, text, &mut on_path);
        let at_turn: Vec<&Criterion> = on_path
            .iter()
            .filter(|(t, _)| *t == Some(turn))
            .map(|&(_, c)| c)
            .collect();
        if !at_turn.is_empty() {
            return at_turn;
        }
        if !on_path.is_empty() {
            return on_path.into_iter().map(|(_, c)| c).collect();
        }
        // The name did not lead through the branches (an agent's fork, an attack's path):
        // every place the check is written.
        let mut anywhere = Vec::new();
        walk_steps(&self.steps, &mut |step| {
            if let StepKind::Expect(criteria) = &step.kind {
                anywhere.extend(criteria.iter().filter(|c| c.text == text));
            }
        });
        anywhere
    }
}

/// The checks written as `text` along the branches `names` picks, each with the turn it
/// checks while that is known (`turns`: turns taken so far; `None` once a step that takes
/// a number of turns not written in the suite has run).
fn checks_on_path<'a, 'n>(
    steps: &'a [Step],
    names: &mut impl Iterator<Item = &'n str>,
    turns: &mut Option<u32>,
    text: &str,
    out: &mut Vec<(Option<u32>, &'a Criterion)>,
) {
    for step in steps {
        match &step.kind {
            // A Fixie `call` is one turn, as a `user` step is; a `hitl` step is one only on
            // an agent that paused (a `multiagent` one), which the suite does not say.
            StepKind::User(_) | StepKind::Call { .. } => *turns = turns.map(|t| t + 1),
            StepKind::Simulate { .. } | StepKind::Hitl { .. } | StepKind::Attack(_) => {
                *turns = None
            }
            StepKind::Capture { .. } => {}
            StepKind::Expect(criteria) => {
                let turn = turns.and_then(|t| t.checked_sub(1));
                out.extend(
                    criteria
                        .iter()
                        .filter(|c| c.text == text)
                        .map(|c| (turn, c)),
                );
            }
            StepKind::Fork(branches) => {
                let Some(name) = names.next() else { return };
                let Some(branch) = branches.iter().find(|b| b.name.value == name) else {
                    return;
                };
                checks_on_path(&branch.steps, names, turns, text, out);
            }
        }
    }
}

/// Calls `f` on every step, branches included, in source order.
pub fn walk_steps<'a>(steps: &'a [Step], f: &mut impl FnMut(&'a Step)) {
    for step in steps {
        f(step);
        if let StepKind::Fork(branches) = &step.kind {
            for b in branches {
                walk_steps(&b.steps, f);
            }
        }
    }
}

fn shrink_steps(steps: &mut Vec<Step>) {
    steps.shrink_to_fit();
    for step in steps {
        match &mut step.kind {
            StepKind::Expect(criteria) => shrink_criteria(criteria),
            StepKind::Fork(branches) => {
                branches.shrink_to_fit();
                for branch in branches {
                    shrink_steps(&mut branch.steps);
                }
            }
            StepKind::User(_)
            | StepKind::Attack(_)
            | StepKind::Simulate { .. }
            | StepKind::Call { .. }
            | StepKind::Capture { .. }
            | StepKind::Hitl { .. } => {}
        }
    }
}

fn shrink_criteria(criteria: &mut Vec<Criterion>) {
    criteria.shrink_to_fit();
    for criterion in criteria {
        criterion.text.shrink_to_fit();
        criterion.templates.shrink_to_fit();
        match &mut criterion.kind {
            CriterionKind::Reply(checks) => checks.shrink_to_fit(),
            CriterionKind::ToolsInOrder(names) | CriterionKind::SpansInOrder(names) => {
                names.shrink_to_fit()
            }
            _ => {}
        }
    }
}

/// `attack`: an attacker LLM proposes `width` user messages per kept path and turn, a judge
/// scores each reply against the goal, the best `keep` paths go on, up to `depth` turns.
#[derive(Clone, Debug)]
pub struct Attack {
    pub goal: String,
    /// What reaching the goal looks like (the judge's criterion); the goal when unset.
    pub judge: Option<String>,
    pub width: u32,
    pub keep: u32,
    pub depth: u32,
    /// The provider playing the attacker; `None`: the simulator's, else the lone provider.
    pub attacker: Option<Spanned<String>>,
}

impl Attack {
    pub const DEFAULT_WIDTH: u32 = 3;
    pub const DEFAULT_KEEP: u32 = 2;
    pub const DEFAULT_DEPTH: u32 = 3;

    /// The judge's criterion.
    pub fn success(&self) -> &str {
        self.judge.as_deref().unwrap_or(&self.goal)
    }
}

/// A template string (minijinja) with where it was written.
#[derive(Clone, Debug)]
pub struct Template {
    pub source: String,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Step {
    pub kind: StepKind,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum StepKind {
    /// `user "TEMPLATE"` (and `initial-message`): one scripted user message, one agent turn.
    User(Template),
    /// `simulate turns=N` / `simulate until-done`. `simulator`: the `simulator` of the
    /// innermost enclosing `branch` that sets one, else the scenario's; `None`: the project's.
    Simulate {
        turns: Option<u32>,
        simulator: Option<std::sync::Arc<Simulator>>,
        /// The `persona` of the innermost enclosing `branch` that sets one, played by the
        /// simulator in place of the scenario's; `None`: the scenario's.
        persona: Option<std::sync::Arc<PersonaRef>>,
    },
    /// `call FUNC "TEMPLATE"` (Fixie).
    Call { function: String, input: Template },
    /// `expect CRITERION` / `expect { … }`: checks on the turn just taken.
    Expect(Vec<Criterion>),
    /// `capture NAME regex=… | json-path=…`.
    Capture { name: String, source: CaptureSource },
    /// `hitl approve|reject message=…`.
    Hitl {
        approve: bool,
        message: Option<Template>,
    },
    /// Consecutive `branch` nodes: the conversation forks, one trajectory per branch.
    Fork(Vec<Branch>),
    /// `attack goal=… { judge "…" }`: a beam search of adversarial user messages.
    Attack(std::sync::Arc<Attack>),
}

#[derive(Clone, Debug)]
pub struct Branch {
    pub name: Spanned<String>,
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug)]
pub enum CaptureSource {
    /// First capture group if the regex has one, else the whole match.
    Regex(Pattern),
    /// Evaluated on the last reply parsed as JSON; the first node found.
    JsonPath {
        path: serde_json_path::JsonPath,
        source: String,
    },
}

/// One check, on a turn (`expect`) or on a whole trajectory (`criteria`).
#[derive(Clone, Debug)]
pub struct Criterion {
    pub kind: CriterionKind,
    /// The criterion as written in the suite (the KDL node, normalised to one line).
    pub text: String,
    /// The string values of [`Criterion::kind`] written with template syntax, rendered at run
    /// time with the scope of a user message at the same place. Empty for most criteria.
    pub templates: Vec<CriterionTemplate>,
    pub span: Span,
}

/// A templated value of a criterion and where it sits in the [`CriterionKind`].
#[derive(Clone, Debug)]
pub struct CriterionTemplate {
    pub slot: ValueSlot,
    pub template: Template,
}

/// Which value of a criterion a template renders.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueSlot {
    /// The `n`th check of a `reply` criterion (`contains`, `not-contains`, `equals`, or the
    /// `equals` of `json-path`, its only check).
    ReplyCheck(usize),
    /// A top-level string parameter of `tool` / `expect-tool`.
    ToolParam(String),
    /// The statement of a `judge` or `outcome "…"` criterion: the judge reads it rendered.
    JudgeStatement,
    /// A `judge` criterion's `rubric=` text: the judge is instructed with it rendered.
    JudgeRubric,
}

#[derive(Clone, Debug)]
pub enum CriterionKind {
    /// `reply contains=… not-contains=… matches=… equals=…`: all given checks must hold.
    Reply(Vec<ReplyCheck>),
    /// `tool NAME key=value… count=N` (also `expect-tool`).
    Tool {
        name: String,
        params: Map<String, Value>,
        count: Option<u32>,
        /// `expect-tool` (Connexity's expected tool calls): strings compare
        /// case-insensitively and an expected `null` matches any value, as the reference
        /// implementation matches `expected_params`.
        loose: bool,
    },
    /// `no-tool "NAME"`: no call to NAME; `no-tool` alone (`name` `None`): no tool call at
    /// all (Connexity's `expected_tool_calls: []`).
    NoTool {
        name: Option<String>,
    },
    ToolsInOrder(Vec<String>),
    Latency {
        max: Duration,
    },
    Ttft {
        max: Duration,
    },
    Turns {
        max: u32,
    },
    Tokens {
        max: u64,
    },
    NoError,
    Judge {
        criterion: String,
        threshold: Option<f64>,
        judge: Option<Spanned<String>>,
        rubric: Option<String>,
    },
    Outcome(Outcome),
    /// `state path=… equals=…|contains=…|matches=…|near=… tolerance=…|exists=#true|absent=#true`:
    /// a value of the sandbox's state document (after the turn, or at the trajectory's end).
    State {
        path: String,
        check: StateCheck,
    },
    /// `violations max=N`: at most N policy violations (in the turn, or the trajectory).
    Violations {
        max: u32,
    },
    /// `span "NAME" KEY=VALUE… count=N`: the agent reported a span of that name with those
    /// attributes (exactly N such spans with `count`).
    Span {
        name: String,
        attributes: Map<String, Value>,
        count: Option<u32>,
    },
    /// `span-count "NAME" min=N max=N`: how many spans of that name the agent reported.
    SpanCount {
        name: String,
        min: Option<u32>,
        max: Option<u32>,
    },
    /// `spans-in-order "A" "B"…`: spans of those names, each starting after the one before
    /// it ended (overlapping spans ran in parallel and are not in order).
    SpansInOrder(Vec<String>),
    /// `span-duration "NAME" max="2s"`: every span of that name took at most `max`.
    SpanDuration {
        name: String,
        max: Duration,
    },
}

/// The check of a `state` criterion (MultiAgentEval's assertion modes).
#[derive(Clone, Debug)]
pub enum StateCheck {
    /// JSON equality, numbers by value.
    Equals(Value),
    /// A string contains the text, an array has an equal element, an object has the key.
    Contains(Value),
    /// The regex finds a match in the value's text (a string as is, else compact JSON).
    Matches(Pattern),
    /// A number within `tolerance` of `value`.
    Near {
        value: f64,
        tolerance: f64,
    },
    Exists,
    Absent,
}

/// `tolerance` of `state near=…` when not written (the harness's `numerical_tolerance`).
pub const DEFAULT_STATE_TOLERANCE: f64 = 1e-9;

impl CriterionKind {
    /// Stable short name, used as the `kind` column of results.
    pub fn name(&self) -> &'static str {
        match self {
            CriterionKind::Reply(_) => "reply",
            CriterionKind::Tool { .. } => "tool",
            CriterionKind::NoTool { .. } => "no-tool",
            CriterionKind::ToolsInOrder(_) => "tools-in-order",
            CriterionKind::Latency { .. } => "latency",
            CriterionKind::Ttft { .. } => "ttft",
            CriterionKind::Turns { .. } => "turns",
            CriterionKind::Tokens { .. } => "tokens",
            CriterionKind::NoError => "no-error",
            CriterionKind::Judge { .. } => "judge",
            CriterionKind::Outcome(_) => "outcome",
            CriterionKind::State { .. } => "state",
            CriterionKind::Violations { .. } => "violations",
            CriterionKind::Span { .. } => "span",
            CriterionKind::SpanCount { .. } => "span-count",
            CriterionKind::SpansInOrder(_) => "spans-in-order",
            CriterionKind::SpanDuration { .. } => "span-duration",
        }
    }
}

#[derive(Clone, Debug)]
pub enum ReplyCheck {
    /// `json-path="$.a"` with optional `equals=VALUE`: the first node the path selects in
    /// the turn's structured data (an A2A task and its artifacts), else in the reply parsed
    /// as JSON, equals VALUE (any scalar; a string is text, which a number or boolean
    /// written that way equals, and may be a template: [`Criterion::templates`]); without
    /// `equals`, the path selects something.
    JsonPath {
        path: serde_json_path::JsonPath,
        source: String,
        equals: Option<serde_json::Value>,
    },
    Contains(String),
    NotContains(String),
    Matches(Pattern),
    Equals(String),
}

/// A regex written in a suite (`matches=`, `capture … regex=`): compiled once when the suite
/// loads, so a bad pattern is a `check` error, then dropped, and compiled again on first use.
/// A compiled regex takes kilobytes (`\d` alone, every digit of Unicode, is tens of them):
/// kept from loading, the regexes of a suite of thousands of scenarios were most of what
/// `check` and `list` held, for checks neither of them runs.
#[derive(Clone)]
pub struct Pattern {
    source: Box<str>,
    compiled: OnceLock<Regex>,
}

impl Pattern {
    /// The pattern, if it compiles: with the error `Regex::new` gives otherwise.
    pub fn new(source: &str) -> Result<Self, regex::Error> {
        check_compiles(source)?;
        Ok(Pattern {
            source: source.into(),
            compiled: OnceLock::new(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The compiled regex, compiled on the first call.
    pub fn regex(&self) -> &Regex {
        self.compiled.get_or_init(|| {
            // `Pattern::new` compiled this very pattern with the same (default) settings, and
            // compiling is deterministic, so it compiles again; were it ever not to, a regex
            // that matches nothing makes the check fail rather than the run panic.
            Regex::new(&self.source).unwrap_or_else(|_| {
                Regex::new(r"[^\s\S]").expect("a constant pattern that matches nothing")
            })
        })
    }
}

impl std::ops::Deref for Pattern {
    type Target = Regex;
    fn deref(&self) -> &Regex {
        self.regex()
    }
}

/// Whether `Regex::new(source)` succeeds, with its error if not, without compiling when the
/// pattern cannot fail to compile once parsed.
///
/// `Regex::new` fails in two ways: the syntax (parsing and translating, regex-syntax with
/// the same defaults as `regex`), or a compiled program over its 10 MiB limit. Compiling is
/// most of the cost of loading a suite's regexes, and the first one with a Unicode class
/// (`\d`, `\w`, `(?i)`) writes a fresh 400 KB table: 1.5 ms of a 12 ms `trellis check
/// suites/`. Without a counted repetition (`{n}`, `{n,m}`), each piece of a pattern is
/// compiled once, and the largest per byte written is `\w` at about 48 KB for two bytes
/// (`\w` written 210 times is the shortest such pattern over the limit, 420 bytes); so a
/// pattern of at most [`PARSED_IS_ENOUGH`] bytes without one stays under a third of the
/// limit and is only parsed. Any other pattern is compiled, as before.
fn check_compiles(source: &str) -> Result<(), regex::Error> {
    let hir = regex_syntax::Parser::new()
        .parse(source)
        .map_err(|e| regex::Error::Syntax(e.to_string()))?;
    if source.len() > PARSED_IS_ENOUGH || has_counted_repetition(&hir) {
        Regex::new(source)?;
    }
    Ok(())
}

/// The longest pattern [`check_compiles`] only parses (when it has no counted repetition).
const PARSED_IS_ENOUGH: usize = 128;

fn has_counted_repetition(hir: &regex_syntax::hir::Hir) -> bool {
    use regex_syntax::hir::HirKind;
    match hir.kind() {
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => false,
        HirKind::Repetition(rep) => {
            rep.min > 1 || rep.max.is_some_and(|max| max > 1) || has_counted_repetition(&rep.sub)
        }
        HirKind::Capture(capture) => has_counted_repetition(&capture.sub),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => {
            subs.iter().any(has_counted_repetition)
        }
    }
}

/// Written as a compiled [`Regex`] writes itself: scenario fingerprints
/// (`engine/src/fingerprint.rs`) hash the `Debug` form of checks, and those of earlier runs
/// must still match.
impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Regex").field(&self.as_str()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each field of what miette reads for a span, to compare.
    fn read(
        source: &dyn miette::SourceCode,
        span: SourceSpan,
        before: usize,
        after: usize,
    ) -> Option<(Vec<u8>, SourceSpan, usize, usize, usize)> {
        source.read_span(&span, before, after).ok().map(|c| {
            (
                c.data().to_vec(),
                *c.span(),
                c.line(),
                c.column(),
                c.line_count(),
            )
        })
    }

    #[test]
    fn a_span_reads_as_miette_reads_it_from_the_whole_text() {
        let texts = [
            "",
            "one line",
            "a\nb\n",
            "a\r\nb\r\n\r\nc",
            "x\ry\r\rz\n\r\n",
            "é = 1\n  ü {\n    \"ß\"\n  }\n\n\nlast",
            "\n\n\n",
            "a\n\rb\r\n\nc\r",
        ];
        for text in texts {
            let file = SourceFile::new("t.kdl".into(), "t.kdl".into(), Arc::from(text));
            let fast = CharColumns::of(&file);
            for offset in 0..=text.len() {
                // Spans within the text: miette panics on some beyond it.
                for len in [0, 1, 2, 3, 5, 9, text.len()].map(|n| n.min(text.len() - offset)) {
                    let span = SourceSpan::new(offset.into(), len);
                    for before in 0..4 {
                        for after in 0..4 {
                            assert_eq!(
                                read(&fast, span, before, after).map(|r| (r.0, r.1, r.2, r.4)),
                                read(&text.as_bytes(), span, before, after)
                                    .map(|r| (r.0, r.1, r.2, r.4)),
                                "{text:?} at {offset}+{len}, {before} before, {after} after"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Random texts of line ends, characters and spaces, random spans within them.
    #[test]
    fn random_spans_read_as_miette_reads_them_from_the_whole_text() {
        use proptest::prelude::*;
        const PIECES: &[&str] = &["a", "\n", "\r", "\r\n", "é", " ", "{", "\n\n"];
        proptest!(crate::fuzz_config(512), |(
            pieces in prop::collection::vec(0..PIECES.len(), 0..40),
            at in 0.0f64..=1.0,
            len in 0usize..12,
            before in 0usize..4,
            after in 0usize..4,
        )| {
            let text: String = pieces.iter().map(|&i| PIECES[i]).collect();
            let offset = ((text.len() as f64) * at) as usize;
            let span = SourceSpan::new(offset.into(), len.min(text.len() - offset));
            let file = SourceFile::new("t.kdl".into(), "t.kdl".into(), Arc::from(text.as_str()));
            let fast = read(&CharColumns::of(&file), span, before, after).map(|r| (r.0, r.1, r.2, r.4));
            let whole = read(&text.as_bytes(), span, before, after).map(|r| (r.0, r.1, r.2, r.4));
            prop_assert_eq!(fast, whole, "{:?} {:?} {} {}", text, span, before, after);
        });
    }

    /// The line of every offset as miette numbers lines, and its text without the line end.
    #[test]
    fn every_offset_has_its_line_and_the_lines_text() {
        for text in ["", "a", "ab\ncd\r\nef\rg\n", "\n\r\n\r\r\n", "é\r\nü\n"] {
            let file = SourceFile::new("t.kdl".into(), "t.kdl".into(), Arc::from(text));
            let mut lines = Vec::new();
            let (mut start, mut i) = (0, 0);
            let b = text.as_bytes();
            while i < b.len() {
                let brk = match (b[i], b.get(i + 1)) {
                    (b'\r', Some(b'\n')) => 2,
                    (b'\r' | b'\n', _) => 1,
                    _ => 0,
                };
                if brk > 0 {
                    lines.push(start..i);
                    i += brk;
                    start = i;
                } else {
                    i += 1;
                }
            }
            lines.push(start..text.len());
            for offset in 0..=text.len() {
                let (line, range) = file.line_at(offset);
                assert_eq!(range, lines[line], "{text:?} at {offset}");
                assert!(range.start <= offset, "{text:?} at {offset}");
                assert!(
                    lines.get(line + 1).is_none_or(|next| offset < next.start),
                    "{text:?} at {offset}"
                );
            }
        }
    }

    #[test]
    fn characters_between_two_offsets_are_counted_as_the_text_counts_them() {
        // Two- to four-byte characters across the block edges, and a text ending on one.
        let mut text = String::new();
        for i in 0..3 * crate::columns::BLOCK {
            text.push(['a', 'é', '€', '𝄞', '\n'][i % 5]);
        }
        let file = SourceFile::new("t.kdl".into(), "t.kdl".into(), Arc::from(text.as_str()));
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for (k, &from) in bounds.iter().enumerate().step_by(97) {
            for &to in bounds[k..].iter().step_by(13) {
                assert_eq!(
                    file.chars_between(from, to),
                    text[from..to].chars().count(),
                    "{from}..{to}"
                );
            }
        }
        assert_eq!(file.chars_between(0, text.len()), text.chars().count());
    }

    #[test]
    fn a_span_far_into_a_large_file_is_read_from_its_own_lines() {
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!("node{i} {{\r\n    child \"é\"\n}}\r"));
        }
        let file = SourceFile::new("t.kdl".into(), "t.kdl".into(), Arc::from(text.as_str()));
        let fast = CharColumns::of(&file);
        for at in [0, 7, text.len() / 2, text.len() - 3, text.len()] {
            for (before, after) in [(0, 0), (1, 1), (2, 3)] {
                let span = SourceSpan::new(at.into(), 2);
                let want = read(&text.as_bytes(), span, before, after).map(|mut r| {
                    // The column of `file:line:column` is counted in characters.
                    if before == 0 {
                        let line = text[..at].rfind(['\n', '\r']).map_or(0, |i| i + 1);
                        r.3 = text[line..at].chars().count();
                    }
                    r
                });
                assert_eq!(read(&fast, span, before, after), want, "at {at}");
            }
        }
    }

    #[test]
    fn a_span_is_written_as_derived_or_erased() {
        let span = Span::new(3, SourceSpan::from(12..17));
        let spanned = Spanned::new("hi".to_string(), span);
        let derived = "Spanned { value: \"hi\", span: Span { file: 3, span: SourceSpan { offset: \
             SourceOffset(12), length: 5 } } }";
        assert_eq!(format!("{spanned:?}"), derived);
        let erased = debug_without_spans(|| format!("{spanned:?}"));
        assert_eq!(erased, "Spanned { value: \"hi\", span: _ }");
        // Nested, and after: each returns to what it was.
        let nested = debug_without_spans(|| {
            debug_without_spans(|| ());
            format!("{span:?}")
        });
        assert_eq!(nested, "_");
        assert_eq!(format!("{spanned:?}"), derived);
        // A panic inside does not leave spans erased.
        let _ = std::panic::catch_unwind(|| debug_without_spans(|| panic!("inside")));
        assert_eq!(format!("{spanned:?}"), derived);
    }

    #[test]
    fn a_pattern_is_written_as_its_compiled_regex_is() {
        let source = r#"(?i)\$(\d+) "quoted""#;
        let pattern = Pattern::new(source).expect("a valid pattern");
        let regex = Regex::new(source).expect("a valid pattern");
        assert_eq!(format!("{pattern:?}"), format!("{regex:?}"));
        assert!(pattern.is_match("It is $120 \"quoted\""));
        assert!(Pattern::new("(unclosed").is_err());
    }

    /// Whether `Regex::new` accepts it, with its error text otherwise.
    fn compiled(source: &str) -> Result<(), String> {
        Regex::new(source).map(drop).map_err(|e| e.to_string())
    }

    fn loaded(source: &str) -> Result<(), String> {
        Pattern::new(source).map(drop).map_err(|e| e.to_string())
    }

    #[test]
    fn a_pattern_is_refused_exactly_when_regex_new_refuses_it() {
        let w = |n: usize| r"\w".repeat(n);
        let nested = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
        let cases = [
            r"(?i)booked|confirmed".to_string(),
            r"^-?\d+$".into(),
            "(unclosed".into(),
            "a{2,1}".into(),
            r"(?=look)ahead".into(),
            r"(a)\1".into(),
            r"(?-u)\xFF".into(),
            r"\p{NotAClass}".into(),
            "[z-a]".into(),
            // Too big once compiled: counted repetitions, and long patterns.
            r"\w{1000}{1000}".into(),
            r"(?:\w{100}){100}".into(),
            r"(?:\w{20}|x){1,20}".into(),
            w(210),
            // The longest parsed-only patterns of the densest piece stay far below the limit.
            w(PARSED_IS_ENOUGH / 2),
            format!("(?i){}", w(PARSED_IS_ENOUGH / 2 - 2)),
            // The nesting limit (250) is the parser's.
            nested(250),
            nested(251),
        ];
        for source in &cases {
            assert_eq!(loaded(source), compiled(source), "{source}");
        }
        assert!(compiled(&w(210)).is_err() && compiled(r"\w{1000}{1000}").is_err());
        assert!(compiled(&nested(251)).is_err());
    }

    /// Random patterns over regex syntax: loading agrees with `Regex::new`.
    #[test]
    fn random_patterns_load_as_regex_new_compiles_them() {
        use proptest::prelude::*;
        const PIECES: &[&str] = &[
            "a", "b", "\\", "\\w", "\\d", "\\b", "\\p{L}", "\\1", "(", ")", "(?i)", "(?:", "(?=",
            "[", "]", "^", "-", "{", "}", "2", "0", ",", "*", "+", "?", "|", ".", "$", "\\x", "F",
        ];
        proptest!(crate::fuzz_config(256), |(pieces in prop::collection::vec(0..PIECES.len(), 0..24))| {
            let source: String = pieces.iter().map(|&i| PIECES[i]).collect();
            prop_assert_eq!(loaded(&source), compiled(&source), "{}", source);
        });
    }
}
