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

use crate::diagnostics::{Diagnostic, Diagnostics, Kind, did_you_mean, suggest};
use crate::model::*;
use crate::validate::{self, LoadInfo, RefKind};

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
        docs,
        mut diags,
        broken,
        ..
    } = loader;

    let mut decoder = Decoder::new(&files);
    let mut decoded = Vec::new();
    for (id, doc) in docs.iter().enumerate() {
        if let Some(doc) = doc {
            decoded.push(decoder.file(id, doc));
        }
    }
    let Decoder {
        diags: decode_diags,
        mut info,
        ..
    } = decoder;
    diags.extend(decode_diags);
    info.broken = broken;

    let project = assemble(files, decoded, &mut info, &mut diags);
    diags.extend(validate::validate_loaded(&project, &info));

    if diags.is_empty() {
        Ok(project)
    } else {
        // Stable order: by file, then position; diagnostics without a file first.
        diags.sort_by_key(|d| (d.file.map_or(0, |f| f + 1), d.offset()));
        Err(Diagnostics::new(diags))
    }
}

// ---------------------------------------------------------------------------------------------
// Reading files and following includes

#[derive(Default)]
struct Loader {
    files: Vec<SourceFile>,
    docs: Vec<Option<KdlDocument>>,
    by_canonical: HashMap<PathBuf, FileId>,
    /// Files being loaded (outermost first), to detect include cycles.
    stack: Vec<(PathBuf, FileId)>,
    diags: Vec<Diagnostic>,
    broken: bool,
}

impl Loader {
    fn load_root(&mut self, path: &Path) {
        let name = display_name(path);
        match fs::metadata(path) {
            Err(e) => self.diags.push(
                Diagnostic::new(Kind::Io, format!("cannot read `{name}`: {e}"))
                    .with_help("give a `.kdl` suite file or a directory of them"),
            ),
            Ok(meta) if meta.is_dir() => {
                let mut found = Vec::new();
                for entry in walkdir::WalkDir::new(path).sort_by_file_name() {
                    match entry {
                        Ok(entry) => {
                            let p = entry.path();
                            if entry.file_type().is_file()
                                && p.extension().is_some_and(|e| e == "kdl")
                            {
                                found.push(p.to_path_buf());
                            }
                        }
                        Err(e) => self.diags.push(Diagnostic::new(
                            Kind::Io,
                            format!("cannot read directory `{name}`: {e}"),
                        )),
                    }
                }
                for p in found {
                    let name = display_name(&p);
                    self.load_file(&p, name);
                }
            }
            Ok(_) => {
                self.load_file(path, name);
            }
        }
    }

    fn load_file(&mut self, path: &Path, name: String) {
        let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if self.by_canonical.contains_key(&canonical) {
            return;
        }
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                self.diags.push(Diagnostic::new(
                    Kind::Io,
                    format!("cannot read `{name}`: {e}"),
                ));
                return;
            }
        };
        let id = self.files.len();
        self.files.push(SourceFile {
            path: path.to_path_buf(),
            name,
            text: Arc::from(text.as_str()),
        });
        self.docs.push(None);
        self.by_canonical.insert(canonical.clone(), id);

        let doc = match KdlDocument::parse_v2(&text) {
            Ok(doc) => doc,
            Err(err) => {
                self.broken = true;
                for d in err.diagnostics {
                    let message = d.message.unwrap_or_else(|| "invalid KDL".to_string());
                    let label = d.label.unwrap_or_else(|| "here".to_string());
                    let help = d
                        .help
                        .unwrap_or_else(|| "suite files are KDL v2 documents (https://kdl.dev)".into());
                    let diag = Diagnostic::at(
                        Kind::Syntax,
                        message,
                        id,
                        &self.files[id],
                        d.span,
                        label,
                    )
                    .with_help(help);
                    self.diags.push(diag);
                }
                return;
            }
        };

        self.stack.push((canonical, id));
        for node in doc.nodes() {
            if node.name().value() == "include" {
                self.include(id, node);
            }
        }
        self.stack.pop();
        if let Some(slot) = self.docs.get_mut(id) {
            *slot = Some(doc);
        }
    }

    fn include(&mut self, from: FileId, node: &KdlNode) {
        let file = &self.files[from];
        let view = View::of(node, &file.text);
        let mut problems = Vec::new();
        for prop in &view.props {
            problems.push(
                Diagnostic::at(
                    Kind::UnknownProperty,
                    "`include` takes no properties",
                    from,
                    file,
                    prop.span(),
                    "unknown property",
                )
                .with_help("write `include \"PATH\"`"),
            );
        }
        if let Some(extra) = view.args.get(1) {
            problems.push(
                Diagnostic::at(
                    Kind::UnexpectedArgument,
                    "`include` takes one path",
                    from,
                    file,
                    extra.span(),
                    "unexpected argument",
                )
                .with_help("write one `include \"PATH\"` per file"),
            );
        }
        let Some(arg) = view.args.first() else {
            problems.push(
                Diagnostic::at(
                    Kind::Missing,
                    "`include` needs a path",
                    from,
                    file,
                    view.name_span,
                    "missing path",
                )
                .with_help("write `include \"PATH\"`, relative to this file"),
            );
            self.diags.extend(problems);
            return;
        };
        let Some(rel) = arg.value().as_string() else {
            problems.push(
                Diagnostic::at(
                    Kind::WrongType,
                    format!("expected a string, found {}", value_kind(arg.value())),
                    from,
                    file,
                    arg.span(),
                    "expected a path string",
                )
                .with_help("write `include \"PATH\"`, relative to this file"),
            );
            self.diags.extend(problems);
            return;
        };
        self.diags.extend(problems);

        let base = file.path.parent().unwrap_or_else(|| Path::new(""));
        let target = base.join(rel);
        let shown_base = Path::new(&file.name)
            .parent()
            .unwrap_or_else(|| Path::new(""));
        let target_name = display_name(&normalize(&shown_base.join(rel)));
        if !target.is_file() {
            let diag = Diagnostic::at(
                Kind::MissingInclude,
                format!("included file `{rel}` not found"),
                from,
                file,
                arg.span(),
                "no such file",
            )
            .with_help(format!(
                "looked for `{target_name}`; include paths are relative to the including file"
            ));
            self.diags.push(diag);
            return;
        }
        let canonical = fs::canonicalize(&target).unwrap_or_else(|_| target.clone());
        if let Some(pos) = self.stack.iter().position(|(c, _)| *c == canonical) {
            let mut names: Vec<String> = self.stack[pos..]
                .iter()
                .map(|(_, id)| self.files[*id].name.clone())
                .collect();
            if let Some(first) = names.first().cloned() {
                names.push(first);
            }
            let names = strip_common_dir(&names);
            let diag = Diagnostic::at(
                Kind::IncludeCycle,
                format!("include cycle: {}", names.join(" -> ")),
                from,
                file,
                arg.span(),
                "this include closes the cycle",
            )
            .with_help("every file is loaded once anyway; remove one of the includes");
            self.diags.push(diag);
            return;
        }
        self.load_file(&target, target_name);
    }
}

/// The path as the user wrote it, with `/` separators.
fn display_name(path: &Path) -> String {
    let s = path.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").map(str::to_string).unwrap_or(s)
}

/// Removes `.` and resolvable `..` components without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out: Vec<Component> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                _ => out.push(c),
            },
            _ => out.push(c),
        }
    }
    out.iter().collect()
}

/// Drops the directory prefix shared by all names, so cycles read `a.kdl -> b.kdl -> a.kdl`.
fn strip_common_dir(names: &[String]) -> Vec<String> {
    let dirs: Vec<&str> = names
        .iter()
        .map(|n| n.rfind('/').map_or("", |i| &n[..=i]))
        .collect();
    let Some(first) = dirs.first() else {
        return names.to_vec();
    };
    let mut common = first.len();
    for d in &dirs {
        let shared = first
            .bytes()
            .zip(d.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        common = common.min(shared);
    }
    // Only cut at a directory boundary.
    let cut = first
        .get(..common)
        .and_then(|p| p.rfind('/'))
        .map_or(0, |i| i + 1);
    names
        .iter()
        .map(|n| n.get(cut..).unwrap_or(n).to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Node views and value helpers

/// A node split into arguments and properties. For inline criteria (`expect tool "x"`) the
/// first argument plays the node's name.
#[derive(Clone)]
struct View<'a> {
    name: &'a str,
    name_span: SourceSpan,
    /// The whole node, trailing whitespace trimmed.
    span: SourceSpan,
    args: Vec<&'a KdlEntry>,
    props: Vec<&'a KdlEntry>,
    children: Option<&'a KdlDocument>,
}

impl<'a> View<'a> {
    fn of(node: &'a KdlNode, text: &str) -> Self {
        let (args, props) = node.entries().iter().partition(|e| e.name().is_none());
        View {
            name: node.name().value(),
            name_span: node.name().span(),
            span: trim_span(text, node.span()),
            args,
            props,
            children: node.children(),
        }
    }

    /// The view with its first argument as the name (`expect reply contains="x"`).
    fn shifted(&self) -> Option<(View<'a>, &'a KdlEntry)> {
        let (first, rest) = self.args.split_first()?;
        let name = first.value().as_string()?;
        let start = first.span().offset();
        let end = self.span.offset() + self.span.len();
        Some((
            View {
                name,
                name_span: first.span(),
                span: SourceSpan::from(start..end.max(start)),
                args: rest.to_vec(),
                props: self.props.clone(),
                children: None,
            },
            first,
        ))
    }

    fn prop(&self, key: &str) -> Option<&'a KdlEntry> {
        self.props
            .iter()
            .rev()
            .find(|e| e.name().is_some_and(|n| n.value() == key))
            .copied()
    }
}

fn prop_name(e: &KdlEntry) -> &str {
    e.name().map_or("", |n| n.value())
}

/// The span without trailing whitespace (kdl includes it in node spans).
fn trim_span(text: &str, span: SourceSpan) -> SourceSpan {
    let start = span.offset();
    let end = start + span.len();
    match text.get(start..end) {
        Some(s) => SourceSpan::from(start..start + s.trim_end().len()),
        None => span,
    }
}

fn value_kind(v: &KdlValue) -> &'static str {
    match v {
        KdlValue::String(_) => "a string",
        KdlValue::Integer(_) => "an integer",
        KdlValue::Float(_) => "a float",
        KdlValue::Bool(_) => "a boolean",
        KdlValue::Null => "#null",
    }
}

/// Parses a size: an integer number of bytes or a string like `"8MiB"`, `"512KiB"`, `"1MB"`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num = num.replace('_', "");
    if num.is_empty() {
        return Err(format!("`{s}` does not start with a number"));
    }
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}`")),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(factor)
            .ok_or_else(|| format!("`{s}` is too large"));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{num}` is not a number"))?;
    let bytes = (n * factor as f64).round();
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration like `"2s"`, `"500ms"`, `"2m"`, `"1h 30m"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| e.to_string())
}

const STEP_NODES: &[&str] = &[
    "user", "simulate", "call", "expect", "capture", "hitl", "branch",
];
const SCENARIO_NODES: &[&str] = &[
    "name",
    "description",
    "difficulty",
    "tags",
    "status",
    "persona",
    "initial-message",
    "user-context",
    "max-turns",
    "outcome",
    "expect-tool",
    "criteria-override",
    "agent",
    "agents",
    "repeat",
    "needs",
    "timeout",
    "criteria",
];
const CRITERIA: &[&str] = &[
    "reply",
    "tool",
    "no-tool",
    "tools-in-order",
    "latency",
    "ttft",
    "turns",
    "tokens",
    "no-error",
    "judge",
    "outcome",
];
const TOP_LEVEL: &[&str] = &[
    "suite",
    "include",
    "agent",
    "persona",
    "tool",
    "provider",
    "simulator",
    "judge",
    "scenario",
];
const PARAM_TYPES: &[&str] = &["string", "number", "integer", "boolean", "object", "array"];

/// Builtin agents the engine embeds, per protocol.
pub const BUILTINS: &[(Protocol, &str)] = &[(Protocol::Connexity, "booking")];

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
    scenarios: Vec<Scenario>,
}

struct Decoder<'f> {
    files: &'f [SourceFile],
    file: FileId,
    diags: Vec<Diagnostic>,
    info: LoadInfo,
}

impl<'f> Decoder<'f> {
    fn new(files: &'f [SourceFile]) -> Self {
        Decoder {
            files,
            file: 0,
            diags: Vec::new(),
            info: LoadInfo::default(),
        }
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

    // ----- generic checks

    fn check_props(&mut self, v: &View, allowed: &[&str], repeatable: &[&str]) {
        let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
        for p in &v.props {
            let name = prop_name(p);
            if !allowed.contains(&name) {
                let help = if allowed.is_empty() {
                    format!("`{}` takes no properties", v.name)
                } else {
                    suggest(name, allowed.iter().copied(), "the properties")
                };
                let d = self
                    .diag(
                        Kind::UnknownProperty,
                        format!("unknown property `{name}` on `{}`", v.name),
                        p.span(),
                        "unknown property",
                    )
                    .with_help(help);
                self.report(d);
            } else if let Some(first) = seen.get(name) {
                if !repeatable.contains(&name) {
                    let d = self
                        .diag(
                            Kind::DuplicateSetting,
                            format!("`{name}` is given twice on `{}`", v.name),
                            p.span(),
                            "given again here",
                        )
                        .with_label(*first, "first given here")
                        .with_help("remove one of them");
                    self.report(d);
                }
            } else {
                seen.insert(name, p.span());
            }
        }
    }

    fn check_args(&mut self, v: &View, max: usize, usage: &str) {
        if let Some(extra) = v.args.get(max) {
            let msg = match max {
                0 => format!("`{}` takes no arguments", v.name),
                1 => format!("`{}` takes one argument", v.name),
                n => format!("`{}` takes {n} arguments", v.name),
            };
            let d = self
                .diag(Kind::UnexpectedArgument, msg, extra.span(), "unexpected argument")
                .with_help(format!("write `{usage}`"));
            self.report(d);
        }
    }

    fn check_no_children(&mut self, v: &View) {
        if let Some(children) = v.children {
            let d = self
                .diag(
                    Kind::UnknownNode,
                    format!("`{}` does not take a block", v.name),
                    trim_span(self.text(), children.span()),
                    "unexpected block",
                )
                .with_help("remove the `{ … }` block");
            self.report(d);
        }
    }

    fn missing(&mut self, v: &View, what: &str, usage: &str) {
        let d = self
            .diag(
                Kind::Missing,
                format!("`{}` needs {what}", v.name),
                v.name_span,
                format!("missing {what}"),
            )
            .with_help(format!("write `{usage}`"));
        self.report(d);
    }

    fn unknown_node(&mut self, node_name: &str, span: SourceSpan, context: &str, known: &[&str]) {
        let help = match did_you_mean(node_name, known.iter().copied()) {
            Some(best) => format!("did you mean `{best}`?"),
            None => format!(
                "{context} accepts: {}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let d = self
            .diag(
                Kind::UnknownNode,
                format!("unknown node `{node_name}` in {context}"),
                span,
                "unknown node",
            )
            .with_help(help);
        self.report(d);
    }

    fn wrong_type(&mut self, e: &KdlEntry, expected: &str, help: &str) {
        let d = self
            .diag(
                Kind::WrongType,
                format!("expected {expected}, found {}", value_kind(e.value())),
                e.span(),
                format!("expected {expected}"),
            )
            .with_help(help.to_string());
        self.report(d);
    }

    // ----- typed values

    fn string(&mut self, e: &KdlEntry) -> Option<String> {
        match e.value() {
            KdlValue::String(s) => Some(s.clone()),
            _ => {
                self.wrong_type(e, "a string", "write it in double quotes: \"…\"");
                None
            }
        }
    }

    fn spanned_string(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        let s = self.string(e)?;
        Some(Spanned::new(s, self.span(e.span())))
    }

    fn template(&mut self, e: &KdlEntry) -> Option<Template> {
        let s = self.string(e)?;
        Some(Template {
            source: s,
            span: self.span(e.span()),
        })
    }

    fn integer(&mut self, e: &KdlEntry, min: i128, max: i128) -> Option<i128> {
        match e.value() {
            KdlValue::Integer(i) if *i < min || *i > max => {
                let msg = if max == i128::from(u64::MAX) || max == i128::from(u32::MAX) {
                    format!("{i} is out of range: must be at least {min}")
                } else {
                    format!("{i} is out of range: must be between {min} and {max}")
                };
                let d = self
                    .diag(Kind::OutOfRange, msg, e.span(), "out of range")
                    .with_help(format!("use a whole number from {min}"));
                self.report(d);
                None
            }
            KdlValue::Integer(i) => Some(*i),
            _ => {
                self.wrong_type(e, "an integer", "write a whole number without quotes, e.g. 3");
                None
            }
        }
    }

    fn u32(&mut self, e: &KdlEntry, min: u32) -> Option<u32> {
        self.integer(e, i128::from(min), i128::from(u32::MAX))
            .and_then(|i| u32::try_from(i).ok())
    }

    fn u64(&mut self, e: &KdlEntry, min: u64) -> Option<u64> {
        self.integer(e, i128::from(min), i128::from(u64::MAX))
            .and_then(|i| u64::try_from(i).ok())
    }

    fn number(&mut self, e: &KdlEntry, range: Option<(f64, f64)>) -> Option<f64> {
        let n = match e.value() {
            KdlValue::Integer(i) => *i as f64,
            KdlValue::Float(f) => *f,
            _ => {
                self.wrong_type(e, "a number", "write a number without quotes, e.g. 0.7");
                return None;
            }
        };
        if let Some((lo, hi)) = range
            && !(lo..=hi).contains(&n)
        {
            let d = self
                .diag(
                    Kind::OutOfRange,
                    format!("{n} is out of range: must be between {lo} and {hi}"),
                    e.span(),
                    "out of range",
                )
                .with_help(format!("use a number from {lo} to {hi}"));
            self.report(d);
            return None;
        }
        Some(n)
    }

    fn boolean(&mut self, e: &KdlEntry) -> Option<bool> {
        match e.value() {
            KdlValue::Bool(b) => Some(*b),
            _ => {
                self.wrong_type(e, "a boolean", "write #true or #false");
                None
            }
        }
    }

    fn duration(&mut self, e: &KdlEntry) -> Option<Duration> {
        let s = match e.value() {
            KdlValue::String(s) => s,
            _ => {
                self.wrong_type(e, "a duration string", "write a duration like \"500ms\", \"2s\" or \"2m\"");
                return None;
            }
        };
        match parse_duration(s) {
            Ok(d) => Some(d),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidDuration,
                        format!("invalid duration `{s}`"),
                        e.span(),
                        err,
                    )
                    .with_help("write a duration like \"500ms\", \"2s\", \"2m\" or \"1h 30m\"");
                self.report(d);
                None
            }
        }
    }

    fn size(&mut self, e: &KdlEntry) -> Option<u64> {
        let s = match e.value() {
            KdlValue::Integer(_) => return self.u64(e, 1),
            KdlValue::String(s) => s,
            _ => {
                self.wrong_type(e, "a size", "write a number of bytes or a string like \"8MiB\"");
                return None;
            }
        };
        match parse_size(s) {
            Ok(n) => Some(n),
            Err(err) => {
                let d = self
                    .diag(Kind::InvalidSize, format!("invalid size `{s}`"), e.span(), err)
                    .with_help("write a number of bytes or a string like \"512KiB\" or \"8MiB\"");
                self.report(d);
                None
            }
        }
    }

    /// One of `choices`, reported with did-you-mean otherwise.
    fn choice<T: Copy>(&mut self, e: &KdlEntry, what: &str, choices: &[(&str, T)]) -> Option<T> {
        let s = self.string(e)?;
        if let Some((_, t)) = choices.iter().find(|(n, _)| *n == s) {
            return Some(*t);
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let help = suggest(&s, names.iter().copied(), "the values");
        let list = names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid {what} `{s}`"),
                e.span(),
                format!("expected one of {list}"),
            )
            .with_help(help);
        self.report(d);
        None
    }

    fn regex(&mut self, e: &KdlEntry) -> Option<regex::Regex> {
        let s = self.string(e)?;
        match regex::Regex::new(&s) {
            Ok(r) => Some(r),
            Err(err) => {
                let text = err.to_string();
                let short = text
                    .lines()
                    .rev()
                    .find_map(|l| l.strip_prefix("error: "))
                    .map(str::to_string)
                    .unwrap_or_else(|| text.lines().next().unwrap_or("").to_string());
                let d = self
                    .diag(
                        Kind::InvalidRegex,
                        format!("invalid regex: {short}"),
                        e.span(),
                        short,
                    )
                    .with_help(format!(
                        "{text}\nregexes use Rust `regex` syntax; write them as KDL raw strings: #\"\\d+\"#"
                    ));
                self.report(d);
                None
            }
        }
    }

    fn json(&mut self, e: &KdlEntry) -> Option<Value> {
        match e.value() {
            KdlValue::String(s) => Some(Value::String(s.clone())),
            KdlValue::Bool(b) => Some(Value::Bool(*b)),
            KdlValue::Null => Some(Value::Null),
            KdlValue::Integer(i) => {
                if let Ok(n) = i64::try_from(*i) {
                    Some(Value::Number(Number::from(n)))
                } else if let Ok(n) = u64::try_from(*i) {
                    Some(Value::Number(Number::from(n)))
                } else {
                    let d = self
                        .diag(
                            Kind::OutOfRange,
                            format!("{i} does not fit in a JSON number"),
                            e.span(),
                            "too large",
                        )
                        .with_help("write it as a string");
                    self.report(d);
                    None
                }
            }
            KdlValue::Float(f) => match Number::from_f64(*f) {
                Some(n) => Some(Value::Number(n)),
                None => {
                    let d = self
                        .diag(
                            Kind::OutOfRange,
                            "infinite and NaN numbers are not JSON".to_string(),
                            e.span(),
                            "not a JSON number",
                        )
                        .with_help("write it as a string");
                    self.report(d);
                    None
                }
            },
        }
    }

    /// A required first argument (an id or name).
    fn id_arg(&mut self, v: &View, what: &str, usage: &str) -> Option<Spanned<String>> {
        match v.args.first() {
            Some(e) => self.spanned_string(e),
            None => {
                self.missing(v, what, usage);
                None
            }
        }
    }

    /// Exactly one argument, no properties, no block.
    fn single(&mut self, v: &View, usage: &str) -> Option<&'f KdlEntry>
    where
        'f: 'f,
    {
        None.or_else(|| {
            let _ = usage;
            None
        })
    }
}
