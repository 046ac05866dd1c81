//! Loading suite files: reading paths and directories, following `include`s, parsing KDL and
//! decoding every node into the typed [`model`](crate::model).
//!
//! Decoding is error-tolerant: a bad value is reported and decoding goes on, so one run of
//! [`load`] reports every problem of every file. Cross-references, templates and the `needs`
//! graph are checked afterwards by [`crate::validate`].

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};
use miette::SourceSpan;
use serde_json::{Map, Number, Value};

use crate::depth;
use crate::diagnostics::{Diagnostic, Diagnostics, Kind, did_you_mean, suggest};
use crate::model::*;
use crate::template;
use crate::validate::{self, LoadInfo, RefKind};

mod criteria;
mod decls;
mod http;
mod include;
mod json_path;
mod scenario;
mod steps;
mod tool;
mod values;

use crate::lang::check::{self, Problem};
use crate::lang::{self, NodeSpec};

use include::*;
use scenario::*;
use values::*;
pub use values::{parse_duration, parse_size};

/// Loads every given `.kdl` file or directory (all `*.kdl` below it, sorted), follows
/// `include`s, decodes and validates everything.
///
/// Returns the project, or every problem found in all files.
pub fn load<P: AsRef<Path>>(paths: &[P]) -> Result<Project, Diagnostics> {
    let mut loader = Loader::default();
    for path in paths {
        loader.load_root(path.as_ref());
    }
    let Loader {
        files,
        decoded,
        mut diags,
        decode_diags,
        mut info,
        broken,
        ..
    } = loader;
    diags.extend(decode_diags);
    info.broken = broken;

    let mut project = assemble(files, decoded, &mut info, &mut diags);
    let (problems, env_reads) = validate::validate_reading_env(&project, &info);
    diags.extend(problems);
    project.env_reads = env_reads;

    if diags.is_empty() {
        Ok(project)
    } else {
        // Stable order: by file, then position; diagnostics without a file first.
        diags.sort_by_key(|d| (d.file.map_or(0, |f| f + 1), d.offset()));
        Err(Diagnostics::new(diags))
    }
}

/// Builtin agents the engine embeds, per protocol.
pub const BUILTINS: &[(Protocol, &str)] = &[
    (Protocol::Connexity, "booking"),
    (Protocol::AgentScope, "weather"),
    (Protocol::Fixie, "numbers"),
    (Protocol::MultiAgent, "support"),
    (Protocol::A2a, "travel"),
    (Protocol::Http, "langserve"),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Arity {
    /// Exactly one value; a property or a child node with one argument.
    One,
    /// One or more values; a child node (or a property holding one).
    Many,
    /// `header NAME VALUE`: a repeatable child node with two arguments.
    Pair,
}

struct Setting<'a> {
    name: &'a str,
    name_span: SourceSpan,
    values: Vec<&'a KdlEntry>,
}

struct Settings<'a> {
    items: Vec<Setting<'a>>,
}

impl<'a> Settings<'a> {
    fn get(&self, name: &str) -> Option<&Setting<'a>> {
        self.items.iter().find(|s| s.name == name)
    }
    fn value(&self, name: &str) -> Option<&'a KdlEntry> {
        self.get(name).and_then(|s| s.values.first().copied())
    }
    fn all(&self, name: &'a str) -> impl Iterator<Item = &Setting<'a>> + '_ {
        self.items.iter().filter(move |s| s.name == name)
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// What one file declares.
#[derive(Default)]
struct FileItems {
    file: FileId,
    suite: Option<(String, Span, Option<String>, Vec<String>)>,
    agents: Vec<Agent>,
    personas: Vec<Persona>,
    tools: Vec<Tool>,
    providers: Vec<Provider>,
    simulators: Vec<Simulator>,
    judges: Vec<Judge>,
    panels: Vec<Panel>,
    scenarios: Vec<Scenario>,
}

struct Decoder<'f> {
    files: &'f [SourceFile],
    file: FileId,
    diags: Vec<Diagnostic>,
    info: LoadInfo,
}

impl<'f> Decoder<'f> {
    /// A decoder of file `file` that adds to `diags` and `info` (taken until [`Self::finish`]
    /// gives them back).
    fn new(
        files: &'f [SourceFile],
        file: FileId,
        diags: &mut Vec<Diagnostic>,
        info: &mut LoadInfo,
    ) -> Self {
        Decoder {
            files,
            file,
            diags: std::mem::take(diags),
            info: std::mem::take(info),
        }
    }

    fn finish(self, diags: &mut Vec<Diagnostic>, info: &mut LoadInfo) {
        *diags = self.diags;
        *info = self.info;
    }

    fn text(&self) -> &'f str {
        self.files.get(self.file).map_or("", |f| &f.text)
    }

    fn span(&self, span: SourceSpan) -> Span {
        Span::new(self.file, span)
    }

    fn diag(
        &self,
        kind: Kind,
        message: impl Into<String>,
        span: SourceSpan,
        label: impl Into<String>,
    ) -> Diagnostic {
        match self.files.get(self.file) {
            Some(f) => Diagnostic::at(kind, message, self.file, f, span, label),
            None => Diagnostic::new(kind, message),
        }
    }

    fn report(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn source_of(&self, span: SourceSpan) -> &'f str {
        let start = span.offset();
        self.text().get(start..start + span.len()).unwrap_or("")
    }

    // ----- generic checks: the problems are built by `lang::check`

    /// Reports a problem the checker found in this file.
    fn problem(&mut self, p: Problem) {
        let mut d = self
            .diag(p.kind, p.message, p.span, p.label)
            .with_help(p.help);
        if let Some((span, label)) = p.also {
            d = d.with_label(span, label);
        }
        self.report(d);
    }

    /// The node as the checker sees it.
    fn node<'s, 'a>(&self, v: &'s View<'a>) -> check::Node<'s, 'a> {
        check::Node {
            name: v.name,
            name_span: v.name_span,
            args: &v.args,
            props: &v.props,
            block: v.children.map(|c| trim_span(self.text(), c.span())),
        }
    }

    /// Checks `v`'s arguments, properties and block against `spec`.
    fn check(&mut self, v: &View, spec: &NodeSpec, usage: &str) {
        self.check_entries(v, spec, usage);
        self.check_block_of(v, spec);
    }

    /// Checks `v`'s arguments and properties against `spec` (its block is the caller's).
    fn check_entries(&mut self, v: &View, spec: &NodeSpec, usage: &str) {
        self.check_args_of(v, spec, usage);
        self.check_props_of(v, spec);
    }

    /// Reports arguments past those `spec` takes.
    fn check_args_of(&mut self, v: &View, spec: &NodeSpec, usage: &str) {
        let node = self.node(v);
        let mut found = Vec::new();
        check::check_args(&node, spec, usage, &mut |p| found.push(p));
        found.into_iter().for_each(|p| self.problem(p));
    }

    /// Reports properties `spec` does not take, and properties given twice.
    fn check_props_of(&mut self, v: &View, spec: &NodeSpec) {
        let node = self.node(v);
        let mut found = Vec::new();
        check::check_props(&node, spec, &[], &mut |p| found.push(p));
        found.into_iter().for_each(|p| self.problem(p));
    }

    /// Reports a block on a node whose spec takes none.
    fn check_block_of(&mut self, v: &View, spec: &NodeSpec) {
        let node = self.node(v);
        let mut found = Vec::new();
        check::check_block(&node, spec, &mut |p| found.push(p));
        found.into_iter().for_each(|p| self.problem(p));
    }

    /// Reports unknown properties of `v` (those not `allowed`) and properties given twice
    /// (unless `repeatable`).
    fn check_props(&mut self, v: &View, allowed: &[&str], repeatable: &[&str]) {
        let node = self.node(v);
        let mut found = Vec::new();
        check::check_props_in(&node, allowed, repeatable, &mut |p| found.push(p));
        for p in found {
            self.problem(p);
        }
    }

    fn check_args(&mut self, v: &View, max: usize, usage: &str) {
        if let Some(extra) = v.args.get(max) {
            let p = check::unexpected_argument(v.name, max, extra.span(), usage);
            self.problem(p);
        }
    }

    fn check_no_children(&mut self, v: &View) {
        if let Some(children) = v.children {
            let p = check::unexpected_block(v.name, trim_span(self.text(), children.span()));
            self.problem(p);
        }
    }

    fn missing(&mut self, v: &View, what: &str, usage: &str) {
        let p = check::missing(v.name, v.name_span, what, usage);
        self.problem(p);
    }

    fn unknown_node<'k>(
        &mut self,
        node_name: &str,
        span: SourceSpan,
        context: &str,
        known: impl IntoIterator<Item = &'k str>,
    ) {
        let p = check::unknown_node(node_name, span, context, known);
        self.problem(p);
    }

    fn wrong_type(&mut self, e: &KdlEntry, expected: &str, help: &str) {
        let p = check::wrong_type(expected, value_kind(e.value()), value_span(e), help);
        self.problem(p);
    }
}

const AGENT_SETTINGS: &[(&str, Arity)] = &[
    ("protocol", Arity::One),
    ("url", Arity::One),
    ("base-url", Arity::One),
    ("builtin", Arity::One),
    ("command", Arity::One),
    ("socket", Arity::One),
    ("header", Arity::Pair),
    ("timeout", Arity::One),
    ("retries", Arity::One),
    ("concurrency", Arity::One),
    ("max-response-size", Arity::One),
    ("model", Arity::One),
    ("system-prompt", Arity::One),
    ("tools", Arity::Many),
    ("max-tool-rounds", Arity::One),
    ("provider", Arity::One),
    ("temperature", Arity::One),
    ("max-tokens", Arity::One),
    ("stream", Arity::One),
    ("history", Arity::One),
    ("retry-after-send", Arity::One),
    ("request", Arity::One),
    ("feedback", Arity::One),
    ("max-actions", Arity::One),
    ("process", Arity::One),
    ("keep-open", Arity::One),
    ("cwd", Arity::One),
    ("transport", Arity::One),
    ("method", Arity::One),
];
/// Agent settings only `multiagent` agents take, with the endpoint each needs (if any).
const MULTIAGENT_SETTINGS: &[(&str, Option<&str>)] = &[
    ("request", None),
    ("feedback", None),
    ("max-actions", None),
    ("process", Some("command")),
    ("env", Some("command")),
    ("cwd", Some("command")),
    ("keep-open", Some("socket")),
];
const ENDPOINTS: &[&str] = &["url", "base-url", "builtin", "command", "socket"];

impl<'f> Decoder<'f> {
    /// Settings written as properties (`timeout="30s"`) or child nodes (`timeout "30s"`).
    /// Child nodes named in `other_children` are left to the caller.
    fn settings<'a>(
        &mut self,
        v: &View<'a>,
        spec: &[(&str, Arity)],
        context: &str,
        other_children: &[&str],
    ) -> Settings<'a> {
        let names: Vec<&str> = spec.iter().map(|(n, _)| *n).collect();
        let mut items: Vec<Setting<'a>> = Vec::new();
        for p in &v.props {
            let name = p.name().map_or("", |n| n.value());
            let name_span = p.name().map_or(p.span(), |n| n.span());
            match spec.iter().find(|(n, _)| *n == name) {
                None => {
                    let p = check::unknown_property(name, p.span(), v.name, context, names.clone());
                    self.problem(p);
                }
                Some((_, Arity::Pair)) => self.problem(check::not_a_property(name, p.span())),
                Some(_) => items.push(Setting {
                    name: p.name().map_or("", |n| n.value()),
                    name_span,
                    values: vec![*p],
                }),
            }
        }
        if let Some(children) = v.children {
            let mut known = names.clone();
            known.extend_from_slice(other_children);
            for child in children.nodes() {
                let cv = View::of(child, self.text());
                if other_children.contains(&cv.name) {
                    continue;
                }
                let Some((_, arity)) = spec.iter().find(|(n, _)| *n == cv.name) else {
                    self.unknown_node(cv.name, cv.name_span, context, known.iter().copied());
                    continue;
                };
                self.check_props(&cv, &[], &[]);
                self.check_no_children(&cv);
                let usage = match arity {
                    Arity::One => format!("{} VALUE", cv.name),
                    Arity::Many => format!("{} VALUE…", cv.name),
                    Arity::Pair => format!("{} \"NAME\" \"VALUE\"", cv.name),
                };
                let (min, max) = match arity {
                    Arity::One => (1, 1),
                    Arity::Many => (1, usize::MAX),
                    Arity::Pair => (2, 2),
                };
                if cv.args.len() < min {
                    self.missing(
                        &cv,
                        if min == 2 {
                            "a name and a value"
                        } else {
                            "a value"
                        },
                        &usage,
                    );
                    continue;
                }
                if max != usize::MAX {
                    self.check_args(&cv, max, &usage);
                }
                items.push(Setting {
                    name: child.name().value(),
                    name_span: cv.name_span,
                    values: cv.args.clone(),
                });
            }
        }
        // A setting written twice (as properties, children, or both) is ambiguous.
        let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
        for s in &items {
            let repeatable = spec.iter().any(|(n, a)| *n == s.name && *a == Arity::Pair);
            if repeatable {
                continue;
            }
            if let Some(first) = seen.get(s.name) {
                let p = check::setting_twice(s.name, "", s.name_span, *first);
                self.problem(p);
            } else {
                seen.insert(s.name, s.name_span);
            }
        }
        Settings { items }
    }

    /// The settings of `v` as its spec in the language table declares them (properties or
    /// child nodes); child nodes named in `others` are left to the caller.
    fn settings_of<'a>(
        &mut self,
        v: &View<'a>,
        spec: &NodeSpec,
        context: &str,
        others: &[&str],
    ) -> Settings<'a> {
        let views: Vec<View<'a>> = v
            .children
            .map(|c| c.nodes())
            .unwrap_or_default()
            .iter()
            .map(|n| View::of(n, self.text()))
            .collect();
        let node = self.node(v);
        let children = views.iter().map(|cv| self.node(cv));
        let mut found = Vec::new();
        let items = check::settings(&node, children, spec, context, others, &mut |p| {
            found.push(p)
        });
        for p in found {
            self.problem(p);
        }
        Settings {
            items: items
                .into_iter()
                .map(|s| Setting {
                    name: s.name,
                    name_span: s.name_span,
                    values: s.values,
                })
                .collect(),
        }
    }

    fn s_string(&mut self, s: &Settings, name: &str) -> Option<String> {
        let e = s.value(name)?;
        self.string(e)
    }

    /// The `header NAME VALUE` settings, each value read by `value`: names must be RFC 9110
    /// tokens, and a value (its `text`) may not hold a line break, which would split the
    /// request. A bad one is a diagnostic with `help` and is left out.
    fn headers<T>(
        &mut self,
        s: &Settings,
        help: &str,
        value: impl Fn(&mut Self, &KdlEntry) -> Option<T>,
        text: impl Fn(&T) -> &str,
    ) -> Vec<(String, T)> {
        let mut headers = Vec::new();
        for set in s.all("header") {
            let (Some(&n), Some(&val)) = (set.values.first(), set.values.get(1)) else {
                continue;
            };
            let (Some(name), Some(v)) = (self.string(n), value(self, val)) else {
                continue;
            };
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            let problem = if name.is_empty() || !name.chars().all(token) {
                Some((n, "not a valid header name"))
            } else if text(&v).contains(['\r', '\n']) {
                Some((val, "a header value cannot contain a line break"))
            } else {
                None
            };
            match problem {
                None => headers.push((name, v)),
                Some((at, why)) => {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!("invalid header: {why}"),
                            value_span(at),
                            why,
                        )
                        .with_help(help);
                    self.report(d);
                }
            }
        }
        headers
    }

    fn s_template(&mut self, s: &Settings, name: &str) -> Option<Template> {
        let e = s.value(name)?;
        self.template(e)
    }

    fn s_spanned(&mut self, s: &Settings, name: &str) -> Option<Spanned<String>> {
        let e = s.value(name)?;
        self.spanned_string(e)
    }

    /// A required string setting: reports it missing (with `usage`) when absent.
    fn s_required_spanned(
        &mut self,
        v: &View,
        s: &Settings,
        name: &str,
        usage: &str,
    ) -> Option<Spanned<String>> {
        if s.get(name).is_none() {
            self.missing(v, &format!("`{name}=…`"), usage);
            return None;
        }
        self.s_spanned(s, name)
    }

    fn s_number(&mut self, s: &Settings, name: &str, range: (f64, f64)) -> Option<f64> {
        let e = s.value(name)?;
        self.number(e, Some(range))
    }

    fn s_strings(&mut self, s: &Settings, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(set) = s.get(name) {
            for e in set.values.clone() {
                if let Some(v) = self.string(e) {
                    out.push(v);
                }
            }
        }
        out
    }

    fn agent(&mut self, v: &View) -> Option<Agent> {
        let usage = "agent \"ID\" protocol=\"connexity\" url=\"https://…\"";
        let id = self.id_arg(v, "an id", usage)?;
        let agent = self.agent_body(v, &id, usage);
        if agent.is_none() {
            self.info.declare(RefKind::Agent, &id.value);
        }
        agent
    }

    fn agent_body(&mut self, v: &View, id: &Spanned<String>, usage: &str) -> Option<Agent> {
        self.check_args(v, 1, usage);
        // `http` agents' answer nodes take properties, so they are decoded in `http.rs`.
        let mut other_children = vec!["env"];
        other_children.extend_from_slice(http::HTTP_NODES);
        if http::is_http(v) {
            other_children.push("stream");
        }
        let s = self.settings(v, AGENT_SETTINGS, "`agent`", &other_children);
        let protocol = match s.value("protocol") {
            None => {
                let d = self
                    .diag(
                        Kind::Missing,
                        format!("agent `{}` needs a `protocol`", id.value),
                        id.span.span,
                        "no protocol",
                    )
                    .with_help(
                        "add protocol=\"…\": one of connexity, agentscope, multiagent, fixie, openai, anthropic, a2a, http",
                    );
                self.report(d);
                None
            }
            Some(e) => self.choice(e, "protocol", &Protocol::ALL),
        };
        let headers = self.headers(
            &s,
            "header \"NAME\" \"VALUE\", e.g. header \"Authorization\" \"Bearer {{ env.TOKEN }}\"",
            Self::template,
            |t| &t.source,
        );
        let timeout = s.value("timeout").and_then(|e| self.duration(e));
        let retries = s.value("retries").and_then(|e| self.u32(e, 0)).unwrap_or(0);
        let concurrency = s
            .value("concurrency")
            .and_then(|e| self.u32(e, 1))
            .and_then(|c| usize::try_from(c).ok());
        let max_response_size = s
            .value("max-response-size")
            .and_then(|e| self.size(e))
            .unwrap_or(DEFAULT_MAX_RESPONSE_SIZE);
        let model = self.s_string(&s, "model");
        let provider = self.s_spanned(&s, "provider");
        let temperature = self.s_number(&s, "temperature", (0.0, 2.0));
        let max_tokens = s.value("max-tokens").and_then(|e| self.u32(e, 1));
        let system_prompt = self.s_template(&s, "system-prompt");
        let mut tools = Vec::new();
        if let Some(set) = s.get("tools") {
            for e in set.values.clone() {
                if let Some(t) = self.spanned_string(e) {
                    tools.push(t);
                }
            }
        }
        let stream_written = s.value("stream").and_then(|e| self.boolean(e));
        let max_tool_rounds_written = s.value("max-tool-rounds").and_then(|e| self.u32(e, 1));
        let retry_after_send = s
            .value("retry-after-send")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let history_entry = s.value("history");
        let history = history_entry
            .and_then(|e| self.choice(e, "history", &History::ALL))
            .unwrap_or_default();

        let protocol = protocol?;
        // AgentScope streams unless told not to; a model (OpenAI-compatible or Anthropic) is
        // asked for one JSON body unless `stream #true`.
        let stream = stream_written.unwrap_or(!protocol.is_model());
        if let (Some(set), Some(e)) = (s.get("max-tool-rounds"), s.value("max-tool-rounds"))
            && !protocol.is_model()
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!(
                        "`max-tool-rounds` is a setting of `openai` and `anthropic` agents; agent `{}` \
                         is `{}`",
                        id.value,
                        protocol.as_str()
                    ),
                    set.name_span,
                    "not a setting of this protocol",
                )
                .with_label(value_span(e), "this value")
                .with_help(
                    "remove `max-tool-rounds`; it caps the tool loop the engine runs for an \
                     `openai` agent",
                );
            self.report(d);
        }
        let max_tool_rounds = max_tool_rounds_written.unwrap_or(DEFAULT_MAX_TOOL_ROUNDS);
        if let (Some(e), Some(set)) = (history_entry, s.get("history"))
            && protocol != Protocol::Connexity
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!(
                        "`history` is a `connexity` setting; agent `{}` is `{}`",
                        id.value,
                        protocol.as_str()
                    ),
                    set.name_span,
                    "not a setting of this protocol",
                )
                .with_label(value_span(e), "this value")
                .with_help(if protocol == Protocol::AgentScope {
                    "AgentScope keeps the conversation on the server (`session_id`); remove `history`"
                } else if protocol == Protocol::A2a {
                    "an A2A agent keeps the conversation on its server (`contextId`); remove `history`"
                } else {
                    "only `connexity` agents choose what each request carries; remove `history`"
                });
            self.report(d);
        }
        if let (Some(e), Some(set)) = (s.value("stream"), s.get("stream"))
            && matches!(protocol, Protocol::Connexity | Protocol::Fixie)
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!(
                        "`stream` is a setting of streaming protocols; agent `{}` is `{}`, which \
                         answers with one JSON body",
                        id.value,
                        protocol.as_str()
                    ),
                    set.name_span,
                    "not a setting of this protocol",
                )
                .with_label(value_span(e), "this value")
                .with_help(
                    "remove `stream`; it chooses between SSE and one JSON body for `agentscope`",
                );
            self.report(d);
        }
        if protocol.is_model() && s.get("provider").is_some() {
            for name in ["retries", "retry-after-send"] {
                if let Some(set) = s.get(name) {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!(
                                "agent `{}` reaches its model through a provider, whose `retries` \
                                 apply",
                                id.value
                            ),
                            set.name_span,
                            "the provider decides this",
                        )
                        .with_help(
                            "remove it here and set `retries` on the provider (its calls are \
                             retried after send: asking a model again has no side effect)",
                        );
                    self.report(d);
                }
            }
        }
        for name in ["temperature", "max-tokens"] {
            if let Some(set) = s.get(name)
                && !protocol.is_model()
            {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!(
                            "`{name}` is a setting of `openai` and `anthropic` agents; agent `{}` \
                             is `{}`",
                            id.value,
                            protocol.as_str()
                        ),
                        set.name_span,
                        "not a setting of this protocol",
                    )
                    .with_help(format!(
                        "remove `{name}`: it is sent to a model under test that the engine calls"
                    ));
                self.report(d);
            }
        }
        let multiagent = self.multiagent_settings(v, &s, id, protocol);
        let http = self.http_settings(v, &s, id, protocol);
        let stream = http.as_ref().map_or(stream, |h| h.stream.is_some());
        let endpoint = self.endpoint(&s, id, protocol)?;
        // A model agent reached through a `provider` may take the provider's model.
        if protocol.is_model() && s.get("model").is_none() && s.get("provider").is_none() {
            let d = self
                .diag(
                    Kind::Missing,
                    format!("agent `{}` needs a `model`", id.value),
                    id.span.span,
                    "no model",
                )
                .with_help(format!(
                    "`{}` agents name the model to call: model=\"gpt-4o-mini\"",
                    protocol.as_str()
                ));
            self.report(d);
        }
        Some(Agent {
            id: id.clone(),
            protocol,
            endpoint,
            headers,
            timeout,
            retries,
            retry_after_send,
            history,
            concurrency,
            max_response_size,
            model,
            provider,
            temperature,
            max_tokens,
            system_prompt,
            tools,
            max_tool_rounds,
            stream,
            multiagent,
            a2a: A2aSettings {
                stream: stream_written.filter(|_| protocol == Protocol::A2a),
            },
            http,
            span: self.span(v.span),
        })
    }

    /// The `multiagent` settings; each one on another protocol, or on an endpoint it does not
    /// apply to, is an error pointing at it.
    fn multiagent_settings(
        &mut self,
        v: &View,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
    ) -> MultiAgentSettings {
        let mut out = MultiAgentSettings::default();
        let env_nodes: Vec<View> = v
            .children
            .map(|c| c.nodes())
            .unwrap_or_default()
            .iter()
            .map(|n| View::of(n, self.text()))
            .filter(|cv| cv.name == "env")
            .collect();
        let endpoint = ENDPOINTS.iter().find(|e| s.get(e).is_some()).copied();
        out.transport = self.builtin_transport(s, id, protocol, endpoint);
        for (name, needs) in MULTIAGENT_SETTINGS {
            // A builtin served as a process takes `process` like a `command=` agent, one
            // served on a socket `keep-open` like a `socket=` agent.
            let served_as = match out.transport {
                BuiltinTransport::Process => Some("process"),
                BuiltinTransport::Tcp | BuiltinTransport::Unix => Some("keep-open"),
                BuiltinTransport::Http => None,
            };
            if endpoint == Some("builtin") && served_as == Some(*name) {
                continue;
            }
            // `request` of an `http` agent is its body template.
            if protocol == Protocol::Http && *name == "request" {
                continue;
            }
            let at = match s.get(name) {
                Some(set) => set.name_span,
                None if *name == "env" => match env_nodes.first() {
                    Some(cv) => cv.name_span,
                    None => continue,
                },
                None => continue,
            };
            if protocol != Protocol::MultiAgent {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!(
                            "`{name}` is a `multiagent` setting; agent `{}` is `{}`",
                            id.value,
                            protocol.as_str()
                        ),
                        at,
                        "not a setting of this protocol",
                    )
                    .with_help(format!("remove `{name}`"));
                self.report(d);
            } else if let Some(needed) = needs
                && endpoint.is_some_and(|e| e != *needed)
            {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!(
                            "`{name}` is a setting of `{needed}=` agents; agent `{}` uses `{}=`",
                            id.value,
                            endpoint.unwrap_or_default()
                        ),
                        at,
                        format!("only for `{needed}=`"),
                    )
                    .with_help(match (*name, endpoint) {
                        ("process", Some("builtin")) => "add transport=\"process\" to run the \
                             builtin as a process of the trellis executable, or remove `process`"
                            .to_owned(),
                        ("keep-open", Some("builtin")) => "add transport=\"tcp\" or \
                             transport=\"unix\" to serve the builtin on a socket, or remove \
                             `keep-open`"
                            .to_owned(),
                        _ => format!("remove `{name}`"),
                    });
                self.report(d);
            }
        }
        if let Some(r) = s
            .value("request")
            .filter(|_| protocol != Protocol::Http)
            .and_then(|e| self.choice(e, "request", &MultiAgentRequest::ALL))
        {
            out.request = r;
        }
        if let Some(f) = s
            .value("feedback")
            .and_then(|e| self.choice(e, "feedback", &Feedback::ALL))
        {
            out.feedback = f;
        }
        if let Some(n) = s.value("max-actions").and_then(|e| self.u32(e, 1)) {
            out.max_actions = n;
        }
        if let Some(p) = s
            .value("process")
            .and_then(|e| self.choice(e, "process", &ProcessMode::ALL))
        {
            out.process = p;
        }
        if let Some(k) = s.value("keep-open").and_then(|e| self.boolean(e)) {
            out.keep_open = k;
        }
        if let Some(cwd) = self.s_string(s, "cwd") {
            let base = self
                .files
                .get(self.file)
                .and_then(|f| f.path.parent())
                .map(Path::to_path_buf)
                .unwrap_or_default();
            out.cwd = Some(base.join(cwd));
        }
        let mut first_env: Option<SourceSpan> = None;
        for cv in &env_nodes {
            if let Some(first) = first_env {
                let d = self
                    .diag(
                        Kind::DuplicateSetting,
                        "`env` is set twice".to_string(),
                        cv.name_span,
                        "set again here",
                    )
                    .with_label(first, "first set here")
                    .with_help("put every variable in one `env { KEY \"VALUE\" }` block");
                self.report(d);
                continue;
            }
            first_env = Some(cv.name_span);
            out.env = self.env_block(cv);
        }
        out
    }

    /// `transport` of a `builtin=` multiagent agent; anywhere else it is an error pointing at
    /// it (and the default, HTTP, is used).
    fn builtin_transport(
        &mut self,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
        endpoint: Option<&str>,
    ) -> BuiltinTransport {
        let (Some(set), Some(e)) = (s.get("transport"), s.value("transport")) else {
            return BuiltinTransport::default();
        };
        let Some(transport) = self.choice(e, "transport", &BuiltinTransport::ALL) else {
            return BuiltinTransport::default();
        };
        let problem = if protocol != Protocol::MultiAgent {
            Some((
                format!(
                    "`transport` is a setting of builtin `multiagent` agents; agent `{}` is `{}`",
                    id.value,
                    protocol.as_str()
                ),
                "not a setting of this protocol",
                format!(
                    "remove `transport`: builtin `{}` agents are always served over HTTP",
                    protocol.as_str()
                ),
            ))
        } else {
            endpoint.filter(|e| *e != "builtin").map(|other| {
                (
                    format!(
                        "`transport` chooses how a builtin agent is served; agent `{}` uses \
                         `{other}=`",
                        id.value
                    ),
                    "only for `builtin=`",
                    "remove `transport`: `url=`, `command=` and `socket=` already say how to \
                     reach the agent"
                        .to_owned(),
                )
            })
        };
        match problem {
            Some((message, label, help)) => {
                let d = self
                    .diag(Kind::InvalidValue, message, set.name_span, label)
                    .with_label(value_span(e), "this transport")
                    .with_help(help);
                self.report(d);
                BuiltinTransport::default()
            }
            None => transport,
        }
    }

    /// `env { KEY "VALUE"; … }`: names must be valid environment variable names.
    fn env_block(&mut self, v: &View) -> Vec<(String, String)> {
        let usage = "env { KEY \"VALUE\" }";
        self.check_props(v, &[], &[]);
        self.check_args(v, 0, usage);
        let mut out: Vec<(String, String)> = Vec::new();
        let mut seen: HashMap<String, SourceSpan> = HashMap::new();
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            self.check_props(&cv, &[], &[]);
            self.check_no_children(&cv);
            self.check_args(&cv, 1, usage);
            let Some(e) = cv.args.first() else {
                self.missing(&cv, "a value", usage);
                continue;
            };
            let Some(value) = self.string(e) else {
                continue;
            };
            let name = cv.name;
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid environment variable name `{name}`"),
                        cv.name_span,
                        "not a variable name",
                    )
                    .with_help("use letters, digits and `_`, not starting with a digit");
                self.report(d);
                continue;
            }
            if let Some(first) = seen.get(name) {
                let d = self
                    .diag(
                        Kind::DuplicateSetting,
                        format!("`{name}` is set twice in `env`"),
                        cv.name_span,
                        "set again here",
                    )
                    .with_label(*first, "first set here")
                    .with_help("remove one of them");
                self.report(d);
                continue;
            }
            seen.insert(name.to_string(), cv.name_span);
            out.push((name.to_string(), value));
        }
        out
    }

    /// A `socket=` address: `tcp://HOST:PORT` or `tcp:HOST:PORT`, `unix:///PATH` or
    /// `unix:/PATH` (the spec's and the harness's spellings).
    fn socket_address(&mut self, e: &KdlEntry) -> Option<SocketAddress> {
        let text = self.string(e)?;
        let parsed = if let Some(rest) = text.strip_prefix("tcp:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            match rest.rsplit_once(':') {
                None => Err("a TCP address needs a port: tcp://HOST:PORT"),
                Some((host, port)) => {
                    let host = host
                        .strip_prefix('[')
                        .and_then(|h| h.strip_suffix(']'))
                        .unwrap_or(host);
                    match port.parse::<u16>() {
                        _ if host.is_empty() => Err("the TCP address has no host"),
                        _ if host.contains(['/', ' ']) => Err("the host is not a host name"),
                        Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
                        Ok(port) => Ok(SocketAddress::Tcp {
                            host: host.to_string(),
                            port,
                        }),
                    }
                }
            }
        } else if let Some(rest) = text.strip_prefix("unix:") {
            // `unix:///p` and `unix:/p` both mean `/p`; `unix://p` would be a host, not a path.
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                Err("the Unix socket address has no path")
            } else if rest.starts_with("//") && !path.starts_with('/') {
                Err("`unix://` is followed by the path: write unix:///PATH")
            } else {
                Ok(SocketAddress::Unix(PathBuf::from(path)))
            }
        } else {
            Err("expected tcp://HOST:PORT, tcp:HOST:PORT, unix:///PATH or unix:/PATH")
        };
        match parsed {
            Ok(address) => Some(address),
            Err(why) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid socket address `{text}`"),
                        value_span(e),
                        why,
                    )
                    .with_help(
                        "write socket=\"tcp://127.0.0.1:9000\" or socket=\"unix:///tmp/agent.sock\"",
                    );
                self.report(d);
                None
            }
        }
    }

    fn endpoint(
        &mut self,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
    ) -> Option<Endpoint> {
        let allowed: &[&str] = match protocol {
            Protocol::Connexity
            | Protocol::AgentScope
            | Protocol::Fixie
            | Protocol::A2a
            | Protocol::Http => &["url", "builtin"],
            Protocol::MultiAgent => &["url", "builtin", "command", "socket"],
            Protocol::OpenAi | Protocol::Anthropic => &["base-url", "builtin", "provider"],
        };
        let allowed_list = allowed
            .iter()
            .map(|a| format!("{a}=…"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut ok = true;
        let mut valid = Vec::new();
        for name in ENDPOINTS {
            let Some(set) = s.get(name) else { continue };
            if allowed.contains(name) {
                valid.push(set);
                continue;
            }
            ok = false;
            let help = match did_you_mean(name, allowed.iter().copied()) {
                Some(best) => format!(
                    "did you mean `{best}`? `{}` agents use {allowed_list}",
                    protocol.as_str()
                ),
                None => format!("`{}` agents use {allowed_list}", protocol.as_str()),
            };
            let d = self
                .diag(
                    Kind::InvalidEndpoint,
                    format!(
                        "`{name}` is not supported by protocol `{}`",
                        protocol.as_str()
                    ),
                    set.name_span,
                    "not supported by this protocol",
                )
                .with_help(help);
            self.report(d);
        }
        // A model under test can be reached through a `provider` node instead: its endpoint,
        // key, limits and prices (`provider` on a Fixie agent is not an endpoint).
        let via_provider = s.get("provider").filter(|_| protocol.is_model());
        if let Some(set) = via_provider {
            match valid.first() {
                None => {
                    let name = set.values.first().and_then(|e| self.spanned_string(e))?;
                    return Some(Endpoint::Provider(name));
                }
                Some(other) => {
                    let d = self
                        .diag(
                            Kind::InvalidEndpoint,
                            format!("agent `{}` has more than one endpoint", id.value),
                            set.name_span,
                            "the provider's endpoint",
                        )
                        .with_label(other.name_span, "an endpoint of its own")
                        .with_help(
                            "keep `provider=` (the provider's base URL, key, limits and prices) \
                             or `base-url=` (headers written on the agent), not both",
                        );
                    self.report(d);
                    return None;
                }
            }
        }
        let first = match valid.as_slice() {
            [] => {
                if ok {
                    let d = self
                        .diag(
                            Kind::InvalidEndpoint,
                            format!("agent `{}` has no endpoint", id.value),
                            id.span.span,
                            "no endpoint",
                        )
                        .with_help(format!("add one of {allowed_list}"));
                    self.report(d);
                }
                return None;
            }
            [first] => *first,
            [first, second, ..] => {
                let d = self
                    .diag(
                        Kind::InvalidEndpoint,
                        format!("agent `{}` has more than one endpoint", id.value),
                        second.name_span,
                        "second endpoint",
                    )
                    .with_label(first.name_span, "first endpoint")
                    .with_help(format!("keep exactly one of {allowed_list}"));
                self.report(d);
                return None;
            }
        };
        let e = first.values.first().copied()?;
        match first.name {
            "url" | "base-url" => {
                let url = self.string(e)?;
                let rest = url
                    .strip_prefix("http://")
                    .or_else(|| url.strip_prefix("https://"));
                let problem = match rest {
                    None => Some("it must start with http:// or https://"),
                    Some(r) if r.is_empty() || r.starts_with('/') => Some("it has no host"),
                    Some(_) if url.chars().any(char::is_whitespace) => {
                        Some("it contains whitespace")
                    }
                    Some(_) => None,
                };
                match problem {
                    None => Some(Endpoint::Url(url)),
                    Some(why) => {
                        let d = self
                            .diag(
                                Kind::InvalidValue,
                                format!("invalid URL `{url}`: {why}"),
                                value_span(e),
                                "this URL",
                            )
                            .with_help(
                                "write the full endpoint, e.g. \"https://host/agent/respond\"",
                            );
                        self.report(d);
                        None
                    }
                }
            }
            "command" => self.string(e).map(Endpoint::Command),
            "socket" => self.socket_address(e).map(Endpoint::Socket),
            _ => {
                let name = self.spanned_string(e)?;
                let known: Vec<&str> = BUILTINS
                    .iter()
                    .filter(|(p, _)| *p == protocol)
                    .map(|(_, n)| *n)
                    .collect();
                if known.contains(&name.value.as_str()) {
                    return Some(Endpoint::Builtin(name));
                }
                let help = if known.is_empty() {
                    format!(
                        "protocol `{}` has no builtin agents; use {allowed_list}",
                        protocol.as_str()
                    )
                } else {
                    suggest(&name.value, known.iter().copied(), "the builtin agents")
                };
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("unknown builtin agent `{}`", name.value),
                        value_span(e),
                        format!("no such `{}` builtin", protocol.as_str()),
                    )
                    .with_help(help);
                self.report(d);
                None
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Assembling the project

fn assemble(
    files: Vec<SourceFile>,
    decoded: Vec<FileItems>,
    info: &mut LoadInfo,
    diags: &mut Vec<Diagnostic>,
) -> Project {
    let mut project = Project {
        files,
        ..Project::default()
    };
    let mut simulators = Vec::new();
    for items in decoded {
        project.agents.extend(items.agents);
        project.personas.extend(items.personas);
        project.tools.extend(items.tools);
        project.providers.extend(items.providers);
        project.judges.extend(items.judges);
        project.panels.extend(items.panels);
        simulators.extend(items.simulators);
        if items.suite.is_none() && items.scenarios.is_empty() {
            continue;
        }
        let (name, span, description, tags) = match items.suite {
            Some((name, span, description, tags)) => (name, Some(span), description, tags),
            None => {
                let stem = project
                    .files
                    .get(items.file)
                    .and_then(|f| f.path.file_stem())
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (stem, None, None, Vec::new())
            }
        };
        info.suite_spans.push(span);
        project.suites.push(Suite {
            name,
            file: items.file,
            description,
            tags,
            scenarios: items.scenarios.into_iter().map(Arc::new).collect(),
        });
    }
    let mut simulators = simulators.into_iter();
    project.simulator = simulators.next();
    if let Some(first) = &project.simulator {
        for extra in simulators {
            let d = Diagnostic::at_span(
                Kind::DuplicateId,
                "more than one `simulator`",
                &project.files,
                Span::new(
                    extra.span.file,
                    SourceSpan::from(
                        extra.span.span.offset()..extra.span.span.offset() + "simulator".len(),
                    ),
                ),
                "second simulator",
            )
            .with_other(&project.files, first.span, "first defined here")
            .with_help("the project has one default simulator; remove one of them");
            diags.push(d);
        }
    }
    project
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8MiB"), Ok(8 * 1024 * 1024));
        assert_eq!(parse_size("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("8 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2 fortnights ago").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn common_dir_is_stripped() {
        let names = vec![
            "tests/golden/x/a.kdl".to_string(),
            "tests/golden/x/sub/b.kdl".to_string(),
            "tests/golden/x/a.kdl".to_string(),
        ];
        assert_eq!(
            strip_common_dir(&names),
            vec!["a.kdl", "sub/b.kdl", "a.kdl"]
        );
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(
            normalize(Path::new("a/./b/../c.kdl")),
            PathBuf::from("a/c.kdl")
        );
        assert_eq!(normalize(Path::new("../c.kdl")), PathBuf::from("../c.kdl"));
    }

    fn decode_context(src: &str) -> (Map<String, Value>, Vec<Diagnostic>) {
        let files = vec![SourceFile {
            path: PathBuf::from("t.kdl"),
            name: "t.kdl".into(),
            text: Arc::from(src),
        }];
        let doc = KdlDocument::parse_v2(src).unwrap();
        let (mut diags, mut info) = Default::default();
        let mut d = Decoder::new(&files, 0, &mut diags, &mut info);
        let map = d.json_object(doc.nodes()[0].children().unwrap());
        (map, d.diags)
    }

    #[test]
    fn user_context_decoding() {
        let (map, diags) = decode_context(
            "user-context {\n  postal_code \"V4T 0A7\"\n  n 3\n  f 1.5\n  ok #true\n  none #null\n  days \"Mon\" \"Tue\"\n  address { city \"Surrey\"; zip 123 }\n  flat a=1 b=\"x\"\n  empty\n}\n",
        );
        assert!(diags.is_empty());
        assert_eq!(
            Value::Object(map),
            serde_json::json!({
                "postal_code": "V4T 0A7",
                "n": 3,
                "f": 1.5,
                "ok": true,
                "none": null,
                "days": ["Mon", "Tue"],
                "address": {"city": "Surrey", "zip": 123},
                "flat": {"a": 1, "b": "x"},
                "empty": null
            })
        );
    }

    #[test]
    fn user_context_rejects_duplicates_and_mixes() {
        let (_, diags) = decode_context("user-context {\n  a 1\n  a 2\n  b 1 { c 2 }\n}\n");
        let kinds: Vec<Kind> = diags.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, vec![Kind::DuplicateId, Kind::UnexpectedArgument]);
    }
}
