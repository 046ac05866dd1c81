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

mod agent;
mod http;

/// Loads every given `.kdl` file or directory (all `*.kdl` below it, sorted), follows
/// `include`s, decodes and validates everything.
///
/// `protocols` are the protocols agents may speak (the engine's registry,
/// `trellis_engine::protocol::registry::specs()`): `protocol="…"` names one of them, and
/// its spec says which endpoints, settings and builtin agents it accepts.
///
/// Returns the project, or every problem found in all files.
pub fn load<P: AsRef<Path>>(
    paths: &[P],
    protocols: &[&'static crate::lang::ProtocolSpec],
) -> Result<Project, Diagnostics> {
    let mut loader = Loader::default();
    loader.info.protocols = protocols.to_vec();
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

// ---------------------------------------------------------------------------------------------
// Reading files and following includes

/// KDL syntax errors reported per file; more are counted in one last diagnostic.
const MAX_SYNTAX_ERRORS: usize = 20;

/// Reads files and decodes them as they are parsed, one top-level node at a time (see
/// `depth::parse_each`), so no whole-file parse tree is ever kept.
#[derive(Default)]
struct Loader {
    files: Vec<SourceFile>,
    /// What each file that parsed declares, in file order.
    decoded: Vec<FileItems>,
    /// The decoder's diagnostics and findings, kept apart from the loader's so they come in
    /// the same order as when all files were decoded after loading.
    decode_diags: Vec<Diagnostic>,
    info: LoadInfo,
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
                if found.is_empty() {
                    self.diags.push(
                        Diagnostic::new(Kind::NoSuite, format!("no .kdl files under `{name}`"))
                            .with_help(
                                "suite files end in `.kdl`; give a directory holding some, or \
                                 the suite file itself",
                            ),
                    );
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
        self.by_canonical.insert(canonical.clone(), id);

        // Through `depth::parse_each`: the parser recurses per block, comment piece and
        // syntax error, and a file beyond what it can take would abort the process instead
        // of getting a diagnostic; and a whole file's parse tree takes about 75 times its
        // size. Each node is decoded as soon as it is parsed; what a file that turns out not
        // to parse decoded is taken back, as if it had never been decoded.
        let before = (self.info.clone(), self.decode_diags.len());
        let mut items = FileItems {
            file: id,
            ..FileItems::default()
        };
        let mut includes = Vec::new();
        let mut nodes_seen = 0;
        let (files, info, decode_diags) = (&self.files, &mut self.info, &mut self.decode_diags);
        let parsed = depth::parse_each(&text, |doc| {
            nodes_seen += doc.nodes().len();
            let mut decoder = Decoder::new(files, id, decode_diags, info);
            decoder.nodes(&doc, &mut items, &mut includes);
            decoder.finish(decode_diags, info);
        });
        let whole = match parsed {
            Ok(depth::Parsed::Nodes) => None,
            Ok(depth::Parsed::Whole(whole)) => Some(Ok(whole)),
            Err(refused) => Some(Err(refused)),
        };
        let parsed = match whole {
            None => Ok(None),
            Some(whole) => {
                self.info = before.0;
                self.decode_diags.truncate(before.1);
                items = FileItems {
                    file: id,
                    ..FileItems::default()
                };
                includes.clear();
                whole.map(Some)
            }
        };
        let parsed = match parsed {
            Ok(None) => Ok(None),
            Ok(Some(Ok(doc))) => Ok(Some(doc)),
            Ok(Some(Err(err))) => Err(err),
            Err(refused) => {
                self.broken = true;
                let (label, help) = match refused {
                    depth::TooDeep::Blocks { .. } => (
                        "one block too many",
                        format!(
                            "a suite file nests at most {} `{{ … }}` blocks; move deep parts into scenarios of their own",
                            depth::MAX_BLOCK_DEPTH
                        ),
                    ),
                    depth::TooDeep::Comment { .. } => (
                        "this comment",
                        format!(
                            "a `/* … */` comment holds at most {} pieces (each `*`, each `/`, each run of other text); use `//` comments",
                            depth::MAX_COMMENT_PIECES
                        ),
                    ),
                    depth::TooDeep::Large | depth::TooDeep::NoStack => (
                        "not parsed",
                        format!(
                            "split the suite into files of at most {} MiB joined with `include`",
                            depth::MAX_FILE_SIZE / 1024 / 1024
                        ),
                    ),
                    depth::TooDeep::Node { .. } => (
                        "this node",
                        format!(
                            "a top-level node takes at most {} KiB; split it into several",
                            depth::MAX_NODE_SIZE / 1024
                        ),
                    ),
                };
                let span = SourceSpan::new(refused.offset().into(), usize::from(!text.is_empty()));
                let diag = Diagnostic::at(
                    Kind::TooDeep,
                    format!("cannot parse `{}`: {refused}", self.files[id].name),
                    id,
                    &self.files[id],
                    span,
                    label,
                )
                .with_help(help);
                self.diags.push(diag);
                return;
            }
        };
        let doc = match parsed {
            Ok(doc) => doc,
            Err(err) => {
                self.broken = true;
                let found = err.diagnostics.len();
                // The parser's error recovery can report one error per byte of a garbled
                // line, and each is shown with that line: past the first few they bury the
                // cause and make the report quadratic in the file's size.
                for d in err.diagnostics.into_iter().take(MAX_SYNTAX_ERRORS) {
                    let message = d.message.unwrap_or_else(|| "invalid KDL".to_string());
                    let label = d.label.unwrap_or_else(|| "here".to_string());
                    let snippet = text
                        .get(d.span.offset()..d.span.offset() + d.span.len())
                        .unwrap_or("");
                    let help = if snippet.starts_with('"') && snippet.contains('\\') {
                        "a backslash starts an escape in a quoted KDL string (`\\d` is not one); write regexes as raw strings: #\"\\d+\"#".to_string()
                    } else {
                        d.help.unwrap_or_else(|| {
                            "suite files are KDL v2 documents (https://kdl.dev)".into()
                        })
                    };
                    let diag =
                        Diagnostic::at(Kind::Syntax, message, id, &self.files[id], d.span, label)
                            .with_help(help);
                    self.diags.push(diag);
                }
                if found > MAX_SYNTAX_ERRORS {
                    self.diags.push(
                        Diagnostic::new(
                            Kind::Syntax,
                            format!(
                                "`{}`: {} more KDL syntax errors not shown",
                                self.files[id].name,
                                found - MAX_SYNTAX_ERRORS
                            ),
                        )
                        .with_help("fix the first ones: the rest often follow from them"),
                    );
                }
                return;
            }
        };

        // An empty file (or one of comments only) is almost always the wrong file.
        if doc.as_ref().map_or(nodes_seen, |doc| doc.nodes().len()) == 0 {
            self.diags.push(
                Diagnostic::new(
                    Kind::NoSuite,
                    format!("`{}` holds no suite: it has no nodes", self.files[id].name),
                )
                .with_help("write `scenario` nodes (and `agent`s) in it, or remove it"),
            );
        }
        // A file that parsed only as a whole (the parser accepted it although some node
        // alone did not parse) is decoded as a whole.
        if let Some(doc) = doc {
            let mut decoder = Decoder::new(&self.files, id, &mut self.decode_diags, &mut self.info);
            decoder.nodes(&doc, &mut items, &mut includes);
            decoder.finish(&mut self.decode_diags, &mut self.info);
        }
        // Decoded before what it includes, as the files are numbered.
        self.decoded.push(items);
        self.stack.push((canonical, id));
        for node in &includes {
            self.include(id, node);
        }
        self.stack.pop();
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
            // Its definitions are unknown, like those of an unparsable file.
            self.broken = true;
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

/// The span of an entry's value, without `key=` (entry spans cover the whole property).
fn value_span(e: &KdlEntry) -> SourceSpan {
    let span = e.span();
    match (e.name(), e.format()) {
        (Some(_), Some(f)) if !f.value_repr.is_empty() && f.value_repr.len() <= span.len() => {
            let end = span.offset() + span.len();
            SourceSpan::from(end - f.value_repr.len()..end)
        }
        _ => span,
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

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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
    "initial-state",
    "undeclared-tools",
    "tool",
    "max-turns",
    "agent-branches",
    "outcome",
    "expect-tool",
    "criteria-override",
    "agent",
    "agents",
    "repeat",
    "needs",
    "timeout",
    "first-turn",
    "criteria",
    "simulator",
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
    "state",
    "violations",
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
    "panel",
    "scenario",
];
const PARAM_TYPES: &[&str] = &["string", "number", "integer", "boolean", "object", "array"];

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
                .diag(
                    Kind::UnexpectedArgument,
                    msg,
                    extra.span(),
                    "unexpected argument",
                )
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
                value_span(e),
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
        Some(Spanned::new(s, self.span(value_span(e))))
    }

    fn template(&mut self, e: &KdlEntry) -> Option<Template> {
        let s = self.string(e)?;
        Some(Template {
            source: s,
            span: self.span(value_span(e)),
        })
    }

    fn integer(&mut self, e: &KdlEntry, min: i128, max: i128) -> Option<i128> {
        match e.value() {
            KdlValue::Integer(i) if *i < min || *i > max => {
                let unbounded = max == i128::from(u64::MAX) || max == i128::from(u32::MAX);
                let msg = if *i < min && unbounded {
                    format!("{i} is out of range: must be at least {min}")
                } else if unbounded {
                    format!("{i} is out of range: must be at most {max}")
                } else {
                    format!("{i} is out of range: must be between {min} and {max}")
                };
                let d = self
                    .diag(Kind::OutOfRange, msg, value_span(e), "out of range")
                    .with_help(if *i < min {
                        format!("use a whole number from {min}")
                    } else {
                        format!("use a whole number up to {max}")
                    });
                self.report(d);
                None
            }
            KdlValue::Integer(i) => Some(*i),
            _ => {
                self.wrong_type(
                    e,
                    "an integer",
                    "write a whole number without quotes, e.g. 3",
                );
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
                    value_span(e),
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
                self.wrong_type(
                    e,
                    "a duration string",
                    "write a duration like \"500ms\", \"2s\" or \"2m\"",
                );
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
                        value_span(e),
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
                self.wrong_type(
                    e,
                    "a size",
                    "write a number of bytes or a string like \"8MiB\"",
                );
                return None;
            }
        };
        match parse_size(s) {
            Ok(n) => Some(n),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidSize,
                        format!("invalid size `{s}`"),
                        value_span(e),
                        err,
                    )
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
        let list = names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let help = match did_you_mean(&s, names.iter().copied()) {
            Some(best) => format!("did you mean `{best}`?"),
            None => format!("use one of {list}"),
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid {what} `{s}`"),
                value_span(e),
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
                let span = self.regex_error_span(e, &s, &text).unwrap_or(value_span(e));
                let d = self
                    .diag(Kind::InvalidRegex, format!("invalid regex: {short}"), span, short)
                    .with_help(
                        "regexes use Rust `regex` syntax (https://docs.rs/regex); write them as KDL raw strings: #\"\\d+\"#",
                    );
                self.report(d);
                None
            }
        }
    }

    /// Where in the source the regex error points, read from the caret line of the error
    /// (only when the pattern is one line and written without escapes, so offsets match).
    fn regex_error_span(&self, e: &KdlEntry, pattern: &str, error: &str) -> Option<SourceSpan> {
        if pattern.contains('\n') {
            return None;
        }
        let lines: Vec<&str> = error.lines().collect();
        let caret_line = lines.iter().position(|l| l.trim_start().starts_with('^'))?;
        let carets = lines.get(caret_line)?;
        let pattern_line = lines.get(caret_line.checked_sub(1)?)?;
        let indent = pattern_line.len() - pattern_line.trim_start().len();
        let col = carets.find('^')?.checked_sub(indent)?;
        let width = carets.trim().chars().filter(|c| *c == '^').count().max(1);
        let start = pattern.char_indices().nth(col).map(|(i, _)| i)?;
        let end = pattern
            .char_indices()
            .nth(col + width)
            .map_or(pattern.len(), |(i, _)| i);
        let vspan = value_span(e);
        let raw = self.source_of(vspan);
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let inner = raw
            .get(hashes..raw.len().checked_sub(hashes)?)?
            .strip_prefix('"')?
            .strip_suffix('"')?;
        if inner != pattern {
            return None;
        }
        let base = vspan.offset() + hashes + 1;
        Some(SourceSpan::from(base + start..base + end))
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
                            value_span(e),
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
                            value_span(e),
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
    fn single<'a>(&mut self, v: &View<'a>, usage: &str) -> Option<&'a KdlEntry> {
        self.check_props(v, &[], &[]);
        self.check_args(v, 1, usage);
        self.check_no_children(v);
        match v.args.first() {
            Some(e) => Some(*e),
            None => {
                self.missing(v, "a value", usage);
                None
            }
        }
    }
}

const PERSONA_SETTINGS: &[(&str, Arity)] = &[
    ("type", Arity::One),
    ("description", Arity::One),
    ("instructions", Arity::One),
];
const PROVIDER_SETTINGS: &[(&str, Arity)] = &[
    ("kind", Arity::One),
    ("base-url", Arity::One),
    ("model", Arity::One),
    ("api-key-env", Arity::One),
    ("temperature", Arity::One),
    ("max-tokens", Arity::One),
    ("header", Arity::Pair),
    ("timeout", Arity::One),
    ("retries", Arity::One),
    ("concurrency", Arity::One),
    ("requests-per-minute", Arity::One),
    ("tokens-per-minute", Arity::One),
    ("input-price", Arity::One),
    ("output-price", Arity::One),
];
const SIMULATOR_SETTINGS: &[(&str, Arity)] = &[
    ("provider", Arity::One),
    ("model", Arity::One),
    ("temperature", Arity::One),
    ("instructions", Arity::One),
    ("system-prompt", Arity::One),
    ("opening-prompt", Arity::One),
    ("retry-prompt", Arity::One),
];
const JUDGE_SETTINGS: &[(&str, Arity)] = &[
    ("provider", Arity::One),
    ("model", Arity::One),
    ("temperature", Arity::One),
    ("rubric", Arity::One),
    ("threshold", Arity::One),
];
const PANEL_SETTINGS: &[(&str, Arity)] = &[("consensus", Arity::One), ("judges", Arity::Many)];
const SUITE_SETTINGS: &[(&str, Arity)] = &[("description", Arity::One), ("tags", Arity::Many)];

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
                    let d = self
                        .diag(
                            Kind::UnknownProperty,
                            format!("unknown property `{name}` on {context}"),
                            p.span(),
                            "unknown property",
                        )
                        .with_help(suggest(name, names.iter().copied(), "the properties"));
                    self.report(d);
                }
                Some((_, Arity::Pair)) => {
                    let d = self
                        .diag(
                            Kind::UnknownProperty,
                            format!("`{name}` cannot be a property"),
                            p.span(),
                            "write this as a child node",
                        )
                        .with_help(format!(
                            "write `{name} \"NAME\" \"VALUE\"` inside the block"
                        ));
                    self.report(d);
                }
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
                    self.unknown_node(cv.name, cv.name_span, context, &known);
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
                let d = self
                    .diag(
                        Kind::DuplicateSetting,
                        format!("`{}` is set twice", s.name),
                        s.name_span,
                        "set again here",
                    )
                    .with_label(*first, "first set here")
                    .with_help("remove one of them");
                self.report(d);
            } else {
                seen.insert(s.name, s.name_span);
            }
        }
        Settings { items }
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

    // ----- top level

    /// Decodes the top-level nodes of `doc` (all or some of the current file's) into `items`,
    /// and keeps its `include` nodes for the loader.
    fn nodes(&mut self, doc: &KdlDocument, items: &mut FileItems, includes: &mut Vec<KdlNode>) {
        for node in doc.nodes() {
            let v = View::of(node, self.text());
            match v.name {
                "include" => includes.push(node.clone()),
                "suite" => self.suite(&v, items),
                "agent" => items.agents.extend(self.agent(&v)),
                "persona" => items.personas.extend(self.persona(&v)),
                "tool" => items.tools.extend(self.tool(&v)),
                "provider" => items.providers.extend(self.provider(&v)),
                "simulator" => items.simulators.extend(self.simulator(&v)),
                "judge" => items.judges.extend(self.judge(&v)),
                "panel" => items.panels.extend(self.panel(&v)),
                "scenario" => items.scenarios.extend(self.scenario(&v)),
                other => self.unknown_node(other, v.name_span, "a suite file", TOP_LEVEL),
            }
        }
    }

    fn suite(&mut self, v: &View, items: &mut FileItems) {
        let usage = "suite \"NAME\" { description \"…\"; tags \"…\" }";
        let Some(name) = self.id_arg(v, "a name", usage) else {
            return;
        };
        self.check_args(v, 1, usage);
        let s = self.settings(v, SUITE_SETTINGS, "`suite`", &[]);
        let description = self.s_string(&s, "description");
        let tags = self.s_strings(&s, "tags");
        if let Some((_, first, _, _)) = &items.suite {
            let d = self
                .diag(
                    Kind::DuplicateSetting,
                    "a file holds one `suite` node",
                    v.name_span,
                    "second `suite`",
                )
                .with_label(first.span, "first `suite`")
                .with_help("one file is one suite; move the scenarios to another file");
            self.report(d);
            return;
        }
        items.suite = Some((name.value, name.span, description, tags));
    }

    fn persona(&mut self, v: &View) -> Option<Persona> {
        let usage = "persona \"ID\" type=\"…\" { description \"…\"; instructions \"…\" }";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args(v, 1, usage);
        Some(self.persona_body(v, id))
    }

    fn persona_body(&mut self, v: &View, id: Spanned<String>) -> Persona {
        let s = self.settings(v, PERSONA_SETTINGS, "`persona`", &[]);
        let kind = self
            .s_string(&s, "type")
            .unwrap_or_else(|| id.value.clone());
        Persona {
            description: self.s_string(&s, "description"),
            instructions: self.s_string(&s, "instructions"),
            kind,
            id,
            span: self.span(v.span),
        }
    }

    fn tool(&mut self, v: &View) -> Option<Tool> {
        let usage = "tool \"NAME\" { description \"…\"; param …; mock …; sequence { … }; state …; policy … }";
        let name = self.id_arg(v, "a name", usage)?;
        self.check_args(v, 1, usage);
        let s = self.settings(
            v,
            &[("description", Arity::One)],
            "`tool`",
            &["param", "mock", "sequence", "state", "policy"],
        );
        let description = self.s_string(&s, "description");
        let mut params = Vec::new();
        let mut mocks = Vec::new();
        let mut policies = Vec::new();
        let mut sequence: Option<ToolSequence> = None;
        let mut state_changes = Vec::new();
        let mut first_mock: Option<SourceSpan> = None;
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            match cv.name {
                "param" => {
                    if let Some(p) = self.tool_param(&cv) {
                        params.push(p);
                    }
                }
                "mock" => {
                    first_mock.get_or_insert(cv.name_span);
                    if let Some(m) = self.tool_mock(&cv) {
                        mocks.push(m);
                    }
                }
                "sequence" => {
                    if let Some(first) = &sequence {
                        let d = self
                            .diag(
                                Kind::DuplicateSetting,
                                format!("tool `{}` has two `sequence` blocks", name.value),
                                cv.name_span,
                                "second sequence",
                            )
                            .with_label(first.span.span, "first sequence")
                            .with_help("put every output in one `sequence { output …; … }`");
                        self.report(d);
                    } else {
                        sequence = self.tool_sequence(&cv);
                    }
                }
                "state" => state_changes.extend(self.state_change(&cv)),
                "policy" => {
                    if let Some(p) = self.tool_policy(&cv) {
                        policies.push(p);
                    }
                }
                _ => {}
            }
        }
        if let (Some(seq), Some(mock)) = (&sequence, first_mock) {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!(
                        "tool `{}` has both `mock` and `sequence` outputs",
                        name.value
                    ),
                    seq.span.span,
                    "outputs in order",
                )
                .with_label(mock, "outputs matched on parameters")
                .with_help("a tool answers either by matching parameters (`mock`) or in order (`sequence`); keep one");
            self.report(d);
        }
        Some(Tool {
            name,
            description,
            params,
            mocks,
            sequence,
            state_changes,
            policies,
            span: self.span(v.span),
        })
    }

    fn tool_param(&mut self, v: &View) -> Option<ToolParam> {
        let usage = "param \"NAME\" type=\"string\" required=#true description=\"…\"";
        let name = self.id_arg(v, "a name", usage)?;
        self.check_args(v, 1, usage);
        self.check_props(v, &["type", "required", "description"], &[]);
        self.check_no_children(v);
        let ty = match v.prop("type") {
            Some(e) => {
                let choices: Vec<(&str, &str)> = PARAM_TYPES.iter().map(|t| (*t, *t)).collect();
                self.choice(e, "parameter type", &choices)
                    .unwrap_or("string")
            }
            None => "string",
        };
        let required = v
            .prop("required")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let description = v.prop("description").and_then(|e| self.string(e));
        Some(ToolParam {
            name: name.value,
            ty: ty.to_string(),
            required,
            description,
        })
    }

    fn tool_mock(&mut self, v: &View) -> Option<ToolMock> {
        let usage = "mock returns=#\"{\"ok\": true}\"# KEY=VALUE… { state path=\"…\" value=… }";
        self.check_args(v, 0, usage);
        let mut state_changes = Vec::new();
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            if cv.name == "state" {
                state_changes.extend(self.state_change(&cv));
            } else {
                self.unknown_node(cv.name, cv.name_span, "a `mock`", &["state"]);
            }
        }
        let Some(returns) = v.prop("returns") else {
            self.missing(v, "`returns=…`", usage);
            return None;
        };
        let returns = match returns.value() {
            // JSON text when it parses, else the string itself.
            KdlValue::String(s) => {
                serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
            }
            _ => self.json(returns)?,
        };
        let mut when = Map::new();
        for p in &v.props {
            let key = prop_name(p);
            if key == "returns" {
                continue;
            }
            if let Some(val) = self.json(p) {
                when.insert(key.to_string(), val);
            }
        }
        Some(ToolMock {
            when,
            returns,
            state_changes,
            span: self.span(v.span),
        })
    }

    /// A JSON output written as one value: JSON text when a string parses as JSON, else the
    /// string itself (as `mock returns=`).
    fn output_value(&mut self, e: &KdlEntry) -> Option<Value> {
        match e.value() {
            KdlValue::String(s) => {
                Some(serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())))
            }
            _ => self.json(e),
        }
    }

    fn tool_sequence(&mut self, v: &View) -> Option<ToolSequence> {
        let usage =
            "sequence when-exhausted=\"repeat-last\" { output #\"{\"ok\": true}\"# KEY=VALUE…; … }";
        self.check_args(v, 0, usage);
        self.check_props(v, &["when-exhausted"], &[]);
        let when_exhausted = v
            .prop("when-exhausted")
            .and_then(|e| self.choice(e, "when-exhausted", &WhenExhausted::ALL))
            .unwrap_or_default();
        let mut outputs = Vec::new();
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            if cv.name != "output" {
                self.unknown_node(cv.name, cv.name_span, "a `sequence`", &["output"]);
                continue;
            }
            let output_usage = "output #\"{\"ok\": true}\"# KEY=VALUE…";
            self.check_args(&cv, 1, output_usage);
            self.check_no_children(&cv);
            let Some(first) = cv.args.first() else {
                self.missing(&cv, "the output value", output_usage);
                continue;
            };
            let Some(value) = self.output_value(first) else {
                continue;
            };
            let mut when = Map::new();
            for p in &cv.props {
                if let Some(val) = self.json(p) {
                    when.insert(prop_name(p).to_string(), val);
                }
            }
            outputs.push(SequenceOutput { value, when });
        }
        if outputs.is_empty() {
            self.missing(v, "at least one `output`", usage);
            return None;
        }
        Some(ToolSequence {
            outputs,
            when_exhausted,
            span: self.span(v.span),
        })
    }

    /// `state path="a.b" value=…` or `state path="a.b" json=#"{…}"#`.
    fn state_change(&mut self, v: &View) -> Option<StateChange> {
        let usage = "state path=\"orders.0.status\" value=\"refunded\"";
        self.check_args(v, 0, usage);
        self.check_props(v, &["path", "value", "json"], &[]);
        self.check_no_children(v);
        let path = self.state_path(v, usage);
        let value = match (v.prop("value"), v.prop("json")) {
            (Some(e), None) => self.json(e),
            (None, Some(e)) => self.json_text(e),
            (None, None) => {
                self.missing(v, "`value=…` or `json=…`", usage);
                None
            }
            (Some(_), Some(e)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "`state` takes `value=` or `json=`, not both".to_string(),
                        e.span(),
                        "second value",
                    )
                    .with_help("`value=` for a string, number or boolean; `json=` for JSON text (objects, arrays)");
                self.report(d);
                None
            }
        };
        Some(StateChange {
            path: path?,
            value: value?,
            span: self.span(v.span),
        })
    }

    /// A required `path=` of the state document: a JSON pointer (`/a/b`) or dotted (`a.b.0`)
    /// without empty segments.
    fn state_path(&mut self, v: &View, usage: &str) -> Option<String> {
        let Some(e) = v.prop("path") else {
            self.missing(v, "`path=…`", usage);
            return None;
        };
        let path = self.string(e)?;
        let problem = if path.is_empty() {
            Some("the path is empty")
        } else if !path.starts_with('/') && path.split('.').any(str::is_empty) {
            Some("a dotted path has an empty segment")
        } else {
            None
        };
        match problem {
            None => Some(path),
            Some(why) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid state path `{path}`: {why}"),
                        value_span(e),
                        why,
                    )
                    .with_help("write a dotted path like \"orders.0.status\" or a JSON pointer like \"/orders/0/status\"");
                self.report(d);
                None
            }
        }
    }

    /// A string property holding JSON text, parsed.
    fn json_text(&mut self, e: &KdlEntry) -> Option<Value> {
        let text = self.string(e)?;
        match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid JSON: {err}"),
                        value_span(e),
                        "not JSON",
                    )
                    .with_help("write JSON text in a KDL raw string: #\"{\"a\": 1}\"#");
                self.report(d);
                None
            }
        }
    }

    /// `policy "PARAM" max=N`, `policy "PARAM" allowed="A" "B"…` (the arguments after the
    /// parameter are further allowed values), or the harness's `policy max-limit=N` (on
    /// `amount` unless `param="…"` names another parameter).
    fn tool_policy(&mut self, v: &View) -> Option<ToolPolicy> {
        let usage = "policy \"PARAM\" max=3, policy \"PARAM\" allowed=\"EUR\" \"USD\" or policy max-limit=50";
        self.check_props(v, &["param", "max", "max-limit", "allowed"], &[]);
        self.check_no_children(v);
        let allowed = v.prop("allowed");
        if allowed.is_none() {
            self.check_args(v, 1, usage);
        }
        let param = match (v.args.first().copied(), v.prop("param")) {
            (Some(_), Some(p)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "the parameter is named twice".to_string(),
                        p.span(),
                        "second name",
                    )
                    .with_help(
                        "write the parameter as the first argument: policy \"amount\" max=50",
                    );
                self.report(d);
                None
            }
            (Some(e), None) | (None, Some(e)) => self.string(e),
            // The harness's `max_limit` always checks `amount`.
            (None, None) if v.prop("max-limit").is_some() => Some("amount".to_string()),
            (None, None) => {
                self.missing(v, "a parameter", usage);
                None
            }
        };
        let maximum = [v.prop("max"), v.prop("max-limit")];
        let rules: Vec<&KdlEntry> = maximum.iter().flatten().copied().chain(allowed).collect();
        let rule = match rules.as_slice() {
            [] => {
                self.missing(v, "a rule (`max=…` or `allowed=…`)", usage);
                None
            }
            [e] if allowed.is_some_and(|a| std::ptr::eq(a, *e)) => {
                let mut values: Vec<Value> = self.json(e).into_iter().collect();
                for extra in v.args.iter().skip(1) {
                    values.extend(self.json(extra));
                }
                Some(PolicyRule::Allowed(values))
            }
            [e] => self.number(e, None).map(PolicyRule::Maximum),
            [_, second, ..] => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "a `policy` has one rule".to_string(),
                        second.span(),
                        "second rule",
                    )
                    .with_help("write one `policy` node per rule");
                self.report(d);
                None
            }
        };
        Some(ToolPolicy {
            param: param?,
            rule: rule?,
            span: self.span(v.span),
        })
    }

    fn provider(&mut self, v: &View) -> Option<Provider> {
        let usage = "provider \"ID\" kind=\"openai\" model=\"…\" api-key-env=\"OPENAI_API_KEY\"";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args(v, 1, usage);
        let s = self.settings(v, PROVIDER_SETTINGS, "`provider`", &[]);
        let kind = match s.value("kind") {
            Some(e) => self.choice(
                e,
                "provider kind",
                &[
                    ("openai", ProviderKind::OpenAi),
                    ("anthropic", ProviderKind::Anthropic),
                ],
            ),
            None => {
                self.missing(v, "`kind=…`", usage);
                None
            }
        };
        let base_url = self.s_string(&s, "base-url");
        let model = self.s_string(&s, "model");
        let api_key_env = self.s_string(&s, "api-key-env");
        if let (Some(e), Some(url)) = (s.value("base-url"), &base_url)
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!("provider base URL `{url}` must be http or https"),
                    value_span(e),
                    "not an http(s) URL",
                )
                .with_help("e.g. base-url=\"http://127.0.0.1:8080/v1\"");
            self.report(d);
        }
        if let (Some(e), Some(var)) = (s.value("api-key-env"), &api_key_env)
            && !is_env_var_name(var)
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    "`api-key-env` takes the name of an environment variable, not a key"
                        .to_string(),
                    value_span(e),
                    "not a variable name",
                )
                .with_help(
                    "write the variable's name, never the key: api-key-env=\"OPENAI_API_KEY\"",
                );
            self.report(d);
        }
        let temperature = self.s_number(&s, "temperature", (0.0, 2.0));
        let max_tokens = s.value("max-tokens").and_then(|e| self.u32(e, 1));
        let headers = self.headers(
            &s,
            "header \"NAME\" \"VALUE\"; secrets belong in `api-key-env`",
            Self::string,
            String::as_str,
        );
        let timeout = s.value("timeout").and_then(|e| self.duration(e));
        let retries = s.value("retries").and_then(|e| self.u32(e, 0));
        let concurrency = s
            .value("concurrency")
            .and_then(|e| self.u32(e, 1))
            .and_then(|c| usize::try_from(c).ok());
        let requests_per_minute = s.value("requests-per-minute").and_then(|e| self.u32(e, 1));
        let tokens_per_minute = s.value("tokens-per-minute").and_then(|e| self.u32(e, 1));
        let input_price = self.s_number(&s, "input-price", (0.0, 1_000_000.0));
        let output_price = self.s_number(&s, "output-price", (0.0, 1_000_000.0));
        let Some(kind) = kind else {
            self.info.declare(RefKind::Provider, &id.value);
            return None;
        };
        Some(Provider {
            id,
            kind,
            base_url,
            model,
            api_key_env,
            temperature,
            max_tokens,
            headers,
            timeout,
            retries,
            concurrency,
            requests_per_minute,
            tokens_per_minute,
            input_price,
            output_price,
            span: self.span(v.span),
        })
    }

    /// The project's `simulator`: `provider` is required.
    fn simulator(&mut self, v: &View) -> Option<Simulator> {
        let usage = "simulator provider=\"ID\" model=\"…\" temperature=0.7";
        let s = self.simulator_settings(v, usage);
        if s.provider.is_none() {
            self.missing(v, "`provider=…`", usage);
            return None;
        }
        Some(s)
    }

    fn simulator_settings(&mut self, v: &View, usage: &str) -> Simulator {
        self.check_args(v, 0, usage);
        let s = self.settings(v, SIMULATOR_SETTINGS, "`simulator`", &[]);
        Simulator {
            provider: self.s_spanned(&s, "provider"),
            model: self.s_string(&s, "model"),
            temperature: self.s_number(&s, "temperature", (0.0, 2.0)),
            instructions: self.s_template(&s, "instructions"),
            system_prompt: self.s_template(&s, "system-prompt"),
            opening_prompt: self.s_template(&s, "opening-prompt"),
            retry_prompt: self.s_template(&s, "retry-prompt"),
            outer: None,
            span: self.span(v.span),
        }
    }

    /// A `simulator` inside a scenario or a branch: a layer over the enclosing simulator for
    /// the `simulate` steps there. Every setting is optional; without `provider` it keeps the
    /// enclosing provider, so a branch can add only `instructions` or a prompt.
    fn nested_simulator(&mut self, v: &View) -> Option<Simulator> {
        let usage = "simulator provider=\"ID\" model=\"…\" temperature=0.7 instructions=\"…\"";
        Some(self.simulator_settings(v, usage))
    }

    fn panel(&mut self, v: &View) -> Option<Panel> {
        let usage = "panel \"ID\" consensus=\"majority\" { judges \"A\" \"B\" \"C\" }";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args(v, 1, usage);
        let s = self.settings(v, PANEL_SETTINGS, "`panel`", &[]);
        let consensus = match s.value("consensus") {
            Some(e) => self.choice(e, "consensus", &Consensus::ALL),
            None => Some(Consensus::default()),
        };
        let mut judges = Vec::new();
        if let Some(set) = s.get("judges") {
            for e in set.values.clone() {
                if let Some(j) = self.spanned_string(e) {
                    judges.push(j);
                }
            }
        }
        if judges.is_empty() {
            self.missing(v, "`judges \"A\" \"B\"…`", usage);
        }
        // Declared even when broken, so criteria naming it are not reported again.
        self.info.declare(RefKind::Judge, &id.value);
        let consensus = consensus?;
        (!judges.is_empty()).then(|| Panel {
            id,
            judges,
            consensus,
            span: self.span(v.span),
        })
    }

    fn judge(&mut self, v: &View) -> Option<Judge> {
        let usage = "judge \"ID\" provider=\"ID\" model=\"…\" threshold=0.7";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args(v, 1, usage);
        let s = self.settings(v, JUDGE_SETTINGS, "`judge`", &[]);
        let provider = self.s_required_spanned(v, &s, "provider", usage);
        let model = self.s_string(&s, "model");
        let temperature = self.s_number(&s, "temperature", (0.0, 2.0));
        let rubric = self.s_string(&s, "rubric");
        let threshold = self.s_number(&s, "threshold", (0.0, 1.0));
        let Some(provider) = provider else {
            self.info.declare(RefKind::Judge, &id.value);
            return None;
        };
        Some(Judge {
            id,
            provider,
            model,
            temperature,
            rubric,
            threshold,
            span: self.span(v.span),
        })
    }
}

/// A portable environment variable name: `[A-Za-z_][A-Za-z0-9_]*`. Anything else written as
/// `api-key-env` is most likely the key itself.
fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Per-scenario decoding state.
struct ScenarioState {
    /// Singular nodes already seen, for duplicate reports.
    seen: HashMap<&'static str, SourceSpan>,
    /// Captures that failed to decode: templates using them must not be reported again.
    failed_captures: HashSet<String>,
}

impl<'f> Decoder<'f> {
    fn scenario(&mut self, v: &View) -> Option<Scenario> {
        let usage = "scenario \"ID\" { … }";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args(v, 1, usage);
        self.check_props(v, &[], &[]);
        self.scenario_id_ok(&id);
        let mut sc = Scenario {
            id: id.clone(),
            name: None,
            description: None,
            difficulty: Difficulty::default(),
            tags: Vec::new(),
            status: Status::default(),
            agents: Vec::new(),
            persona: None,
            user_context: Map::new(),
            initial_state: Map::new(),
            undeclared_tools: UndeclaredTools::default(),
            tools: Vec::new(),
            max_turns: None,
            agent_branches: AgentBranches::default(),
            outcomes: Vec::new(),
            expect_tools: Vec::new(),
            criteria_override: None,
            repeat: 1,
            needs: Vec::new(),
            timeout: None,
            first_turn: FirstTurn::default(),
            steps: Vec::new(),
            criteria: Vec::new(),
            span: self.span(v.span),
        };
        let mut st = ScenarioState {
            seen: HashMap::new(),
            failed_captures: HashSet::new(),
        };
        let mut initial: Option<Step> = None;
        let mut scenario_simulator: Option<Simulator> = None;
        let mut has_initial = false;
        let mut step_nodes: Vec<&KdlNode> = Vec::new();
        let nodes = v.children.map(|c| c.nodes()).unwrap_or_default();
        for node in nodes {
            let cv = View::of(node, self.text());
            let name = cv.name;
            if STEP_NODES.contains(&name) {
                step_nodes.push(node);
                continue;
            }
            let Some(key) = SCENARIO_NODES.iter().find(|n| **n == name).copied() else {
                let mut known: Vec<&str> = SCENARIO_NODES.to_vec();
                known.extend_from_slice(STEP_NODES);
                self.unknown_node(name, cv.name_span, "a `scenario`", &known);
                continue;
            };
            let repeatable = matches!(key, "outcome" | "expect-tool" | "criteria" | "tool");
            if !repeatable {
                if let Some(first) = st.seen.get(key) {
                    let d = self
                        .diag(
                            Kind::DuplicateSetting,
                            format!("`{key}` is set twice in scenario `{}`", id.value),
                            cv.name_span,
                            "set again here",
                        )
                        .with_label(*first, "first set here")
                        .with_help("remove one of them");
                    self.report(d);
                    continue;
                }
                st.seen.insert(key, cv.name_span);
            }
            match key {
                "name" => sc.name = self.single(&cv, "name \"…\"").and_then(|e| self.string(e)),
                "description" => {
                    sc.description = self
                        .single(&cv, "description \"…\"")
                        .and_then(|e| self.string(e))
                }
                "criteria-override" => {
                    sc.criteria_override = self
                        .single(&cv, "criteria-override \"…\"")
                        .and_then(|e| self.string(e))
                }
                "difficulty" => {
                    if let Some(d) = self.single(&cv, "difficulty \"normal\"").and_then(|e| {
                        self.choice(
                            e,
                            "difficulty",
                            &[("normal", Difficulty::Normal), ("hard", Difficulty::Hard)],
                        )
                    }) {
                        sc.difficulty = d;
                    }
                }
                "status" => {
                    if let Some(s) = self.single(&cv, "status \"active\"").and_then(|e| {
                        self.choice(
                            e,
                            "status",
                            &[
                                ("active", Status::Active),
                                ("draft", Status::Draft),
                                ("archived", Status::Archived),
                            ],
                        )
                    }) {
                        sc.status = s;
                    }
                }
                "tags" => sc.tags = self.strings(&cv, "tags \"…\" \"…\""),
                "persona" => sc.persona = self.persona_ref(&cv),
                "initial-message" => {
                    has_initial = true;
                    if let Some(t) = self
                        .single(&cv, "initial-message \"…\"")
                        .and_then(|e| self.template(e))
                    {
                        initial = Some(Step {
                            kind: StepKind::User(t),
                            span: self.span(cv.span),
                        });
                    }
                }
                "user-context" => {
                    if let Some(context) = self.json_object_node(&cv, "user-context") {
                        sc.user_context = context;
                    }
                }
                "initial-state" => {
                    if let Some(state) = self.json_object_node(&cv, "initial-state") {
                        sc.initial_state = state;
                    }
                }
                "undeclared-tools" => {
                    if let Some(u) = self
                        .single(&cv, "undeclared-tools \"error\"")
                        .and_then(|e| self.choice(e, "undeclared-tools", &UndeclaredTools::ALL))
                    {
                        sc.undeclared_tools = u;
                    }
                }
                "max-turns" => {
                    sc.max_turns = self.single(&cv, "max-turns 8").and_then(|e| self.u32(e, 1))
                }
                "agent-branches" => {
                    let usage = "agent-branches breadth=5 depth=3";
                    self.check_args(&cv, 0, usage);
                    self.check_props(&cv, &["breadth", "depth"], &[]);
                    self.check_no_children(&cv);
                    if cv.props.is_empty() {
                        self.missing(&cv, "`breadth=` or `depth=`", usage);
                    }
                    if let Some(n) = cv.prop("breadth").and_then(|e| self.u32(e, 1)) {
                        sc.agent_branches.breadth = n;
                    }
                    if let Some(n) = cv.prop("depth").and_then(|e| self.u32(e, 1)) {
                        sc.agent_branches.depth = n;
                    }
                }
                "repeat" => {
                    if let Some(n) = self.single(&cv, "repeat 3").and_then(|e| self.u32(e, 1)) {
                        sc.repeat = n;
                    }
                }
                "timeout" => {
                    sc.timeout = self
                        .single(&cv, "timeout \"2m\"")
                        .and_then(|e| self.duration(e))
                }
                "simulator" => scenario_simulator = self.nested_simulator(&cv),
                "first-turn" => {
                    if let Some(t) = self
                        .single(&cv, "first-turn \"agent\"")
                        .and_then(|e| self.choice(e, "first-turn", &FirstTurn::ALL))
                    {
                        sc.first_turn = t;
                    }
                }
                "outcome" => {
                    self.check_no_children(&cv);
                    if let Some(o) = self.outcome(&cv) {
                        sc.outcomes.push(Spanned::new(o, self.span(cv.span)));
                    }
                }
                "tool" => {
                    if let Some(tool) = self.tool(&cv) {
                        self.push_scenario_tool(&mut sc.tools, tool, &id.value);
                    }
                }
                "expect-tool" => {
                    self.check_no_children(&cv);
                    let text = self.criterion_text(&cv);
                    let mut templates = Vec::new();
                    if let Some(kind) = self.tool_criterion(&cv, &mut templates) {
                        sc.expect_tools.push(Criterion {
                            kind,
                            text,
                            templates,
                            span: self.span(cv.span),
                        });
                    }
                }
                "agent" => {
                    if let Some(e) = self.single(&cv, "agent \"ID\"")
                        && let Some(a) = self.spanned_string(e)
                    {
                        self.push_scenario_agent(&mut sc.agents, a);
                    }
                }
                "agents" => {
                    for a in self.spanned_strings(&cv, "agents \"ID\" \"ID\"") {
                        self.push_scenario_agent(&mut sc.agents, a);
                    }
                }
                "needs" => sc.needs = self.spanned_strings(&cv, "needs \"SCENARIO\"…"),
                "criteria" => {
                    self.check_props(&cv, &[], &[]);
                    self.check_args(&cv, 0, "criteria { CRITERION… }");
                    for child in cv.children.map(|c| c.nodes()).unwrap_or_default() {
                        let ccv = View::of(child, self.text());
                        if let Some(c) = self.criterion(&ccv, "`criteria`") {
                            sc.criteria.push(c);
                        }
                    }
                }
                _ => {}
            }
        }
        // With `first-turn "agent"` the agent has spoken before the first step.
        let has_turn = has_initial || sc.first_turn == FirstTurn::Agent;
        let (steps, _) = self.steps(&step_nodes, has_turn, &mut st);
        sc.steps = initial.into_iter().chain(steps).collect();
        if let Some(simulator) = scenario_simulator {
            assign_simulator(&mut sc.steps, &std::sync::Arc::new(simulator));
        }
        if !st.failed_captures.is_empty() {
            self.info
                .failed_captures
                .insert(id.span, st.failed_captures.clone());
        }
        Some(sc)
    }

    /// `initial-state { KEY VALUE; … }` (as `user-context`) or `initial-state json=#"{…}"#`
    /// (JSON text, for documents with arrays of objects the block form cannot write).
    fn json_object_node(&mut self, v: &View, node: &str) -> Option<Map<String, Value>> {
        let usage = format!("{node} {{ KEY VALUE; … }} or {node} json=#\"{{…}}\"#");
        self.check_props(v, &["json"], &[]);
        self.check_args(v, 0, &usage);
        match (v.prop("json"), v.children) {
            (Some(e), Some(children)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("`{node}` takes `json=` or a block, not both"),
                        trim_span(self.text(), children.span()),
                        "block",
                    )
                    .with_label(e.span(), "JSON text")
                    .with_help("keep one of them");
                self.report(d);
                None
            }
            (Some(e), None) => match self.json_text(e)? {
                Value::Object(map) => Some(map),
                other => {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!(
                                "the {} must be a JSON object, not {}",
                                node.replace('-', " "),
                                json_kind(&other)
                            ),
                            value_span(e),
                            "not an object",
                        )
                        .with_help("write an object: json=#\"{\"orders\": []}\"#");
                    self.report(d);
                    None
                }
            },
            (None, Some(children)) => Some(self.json_object(children)),
            (None, None) => Some(Map::new()),
        }
    }

    /// One or more string arguments, no properties, no block.
    fn strings(&mut self, v: &View, usage: &str) -> Vec<String> {
        self.spanned_strings(v, usage)
            .into_iter()
            .map(|s| s.value)
            .collect()
    }

    fn spanned_strings(&mut self, v: &View, usage: &str) -> Vec<Spanned<String>> {
        self.check_props(v, &[], &[]);
        self.check_no_children(v);
        if v.args.is_empty() {
            self.missing(v, "at least one value", usage);
        }
        let mut out = Vec::new();
        for e in v.args.clone() {
            if let Some(s) = self.spanned_string(e) {
                out.push(s);
            }
        }
        out
    }

    fn persona_ref(&mut self, v: &View) -> Option<PersonaRef> {
        if v.props.is_empty() && v.children.is_none() {
            let e = self.single(v, "persona \"ID\"")?;
            return self.spanned_string(e).map(PersonaRef::Named);
        }
        let usage = "persona type=\"…\" { description \"…\"; instructions \"…\" }";
        self.check_args(v, 0, usage);
        let s = self.settings(v, PERSONA_SETTINGS, "an inline `persona`", &[]);
        let Some(kind) = self.s_spanned(&s, "type") else {
            if s.get("type").is_none() {
                self.missing(v, "`type=…`", usage);
            }
            return None;
        };
        Some(PersonaRef::Inline(Persona {
            id: kind.clone(),
            kind: kind.value,
            description: self.s_string(&s, "description"),
            instructions: self.s_string(&s, "instructions"),
            span: self.span(v.span),
        }))
    }

    /// Scenario ids are written `SUITE/ID` from other suites (`needs`, `--filter`, reports), so
    /// an id holding `/` would make such a reference mean two scenarios.
    fn scenario_id_ok(&mut self, id: &Spanned<String>) {
        let problem = if id.value.contains('/') {
            "`/` separates the suite from the scenario in `SUITE/ID` references"
        } else if id.value.trim().is_empty() {
            "a scenario needs an id to be referred to and reported"
        } else {
            return;
        };
        let suggestion = id.value.replace('/', "-");
        let help = if id.value.contains('/') {
            format!("{problem}; choose another id, e.g. `{suggestion}`")
        } else {
            format!("{problem}; write `scenario \"ID\"`")
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid scenario id `{}`", id.value),
                id.span.span,
                "this id",
            )
            .with_help(help);
        self.report(d);
    }

    /// Branch names become trajectory names (joined with `/`) and execution node ids, where
    /// `start` and `then` name the segments before and after a fork.
    fn branch_name_ok(&mut self, name: &Spanned<String>) -> bool {
        let problem = if name.value.contains('/') {
            Some("`/` separates branch names in trajectory names")
        } else if matches!(name.value.as_str(), "start" | "then") {
            Some("`start` and `then` name the steps before and after a fork")
        } else if name.value.trim().is_empty() {
            Some("a branch needs a name to tell its trajectories apart")
        } else {
            None
        };
        let Some(why) = problem else {
            return true;
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid branch name `{}`", name.value),
                name.span.span,
                "this name",
            )
            .with_help(format!("{why}; choose another name"));
        self.report(d);
        false
    }

    /// Adds a scenario's own `tool`; a name declared twice in one scenario is an error (the
    /// global duplicate check does not see scenario tools).
    fn push_scenario_tool(&mut self, tools: &mut Vec<Tool>, tool: Tool, scenario: &str) {
        if let Some(first) = tools.iter().find(|t| t.name.value == tool.name.value) {
            let d = self
                .diag(
                    Kind::DuplicateId,
                    format!(
                        "tool `{}` is declared twice in scenario `{scenario}`",
                        tool.name.value
                    ),
                    tool.name.span.span,
                    "declared again here",
                )
                .with_label(first.name.span.span, "first declared here")
                .with_help("merge the two `tool` nodes into one");
            self.report(d);
            return;
        }
        tools.push(tool);
    }

    /// Adds an agent to a scenario's list; naming one twice would run it twice.
    fn push_scenario_agent(&mut self, agents: &mut Vec<Spanned<String>>, agent: Spanned<String>) {
        if let Some(first) = agents.iter().find(|a| a.value == agent.value) {
            let d = self
                .diag(
                    Kind::DuplicateId,
                    format!("agent `{}` is listed twice", agent.value),
                    agent.span.span,
                    "listed again here",
                )
                .with_label(first.span.span, "first listed here")
                .with_help("list each agent once; `repeat N` runs a scenario several times");
            self.report(d);
            return;
        }
        agents.push(agent);
    }

    /// `user-context { … }` children as a JSON object.
    fn json_object(&mut self, doc: &KdlDocument) -> Map<String, Value> {
        let mut map = Map::new();
        let mut seen: HashMap<String, SourceSpan> = HashMap::new();
        for node in doc.nodes() {
            let v = View::of(node, self.text());
            let key = v.name.to_string();
            if let Some(first) = seen.get(&key) {
                let d = self
                    .diag(
                        Kind::DuplicateId,
                        format!("duplicate key `{key}`"),
                        v.name_span,
                        "written again here",
                    )
                    .with_label(*first, "first written here")
                    .with_help(
                        "each key is written once; several values make an array: KEY \"a\" \"b\"",
                    );
                self.report(d);
                continue;
            }
            seen.insert(key.clone(), v.name_span);
            let value = self.json_node(&v);
            map.insert(key, value);
        }
        map
    }

    fn json_node(&mut self, v: &View) -> Value {
        if !v.args.is_empty() && (!v.props.is_empty() || v.children.is_some()) {
            let at = v
                .props
                .first()
                .map(|p| p.span())
                .or_else(|| v.children.map(|c| trim_span(self.text(), c.span())))
                .unwrap_or(v.span);
            let d = self
                .diag(
                    Kind::UnexpectedArgument,
                    format!("`{}` mixes values with an object", v.name),
                    at,
                    "object part",
                )
                .with_help("write either values (KEY \"a\" \"b\") or an object (KEY { k \"v\" } or KEY k=\"v\")");
            self.report(d);
            return Value::Null;
        }
        match v.args.as_slice() {
            [one] => return self.json(one).unwrap_or(Value::Null),
            [] => {}
            many => {
                let many = many.to_vec();
                return Value::Array(many.into_iter().filter_map(|e| self.json(e)).collect());
            }
        }
        if v.props.is_empty() && v.children.is_none() {
            return Value::Null;
        }
        let mut map = Map::new();
        for p in v.props.clone() {
            if let Some(val) = self.json(p) {
                map.insert(prop_name(p).to_string(), val);
            }
        }
        if let Some(children) = v.children {
            map.extend(self.json_object(children));
        }
        Value::Object(map)
    }

    // ----- steps

    /// Decodes a block of steps; returns them and whether a turn has been taken at its end.
    fn steps(
        &mut self,
        nodes: &[&KdlNode],
        mut has_turn: bool,
        st: &mut ScenarioState,
    ) -> (Vec<Step>, bool) {
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(node) = nodes.get(i) {
            if node.name().value() != "branch" {
                let v = View::of(node, self.text());
                if let Some(step) = self.step(&v, &mut has_turn, st) {
                    out.push(step);
                }
                i += 1;
                continue;
            }
            let group: Vec<&KdlNode> = nodes[i..]
                .iter()
                .take_while(|n| n.name().value() == "branch")
                .copied()
                .collect();
            i += group.len();
            let mut branches = Vec::new();
            let mut all_turn = true;
            let mut start = usize::MAX;
            let mut end = 0;
            for b in group {
                let v = View::of(b, self.text());
                start = start.min(v.span.offset());
                end = end.max(v.span.offset() + v.span.len());
                let usage = "branch \"NAME\" { steps… }";
                let name = self
                    .id_arg(&v, "a name", usage)
                    .filter(|name| self.branch_name_ok(name));
                self.check_args(&v, 1, usage);
                self.check_props(&v, &[], &[]);
                let mut inner = Vec::new();
                let mut simulator = None;
                let mut persona = None;
                for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
                    if STEP_NODES.contains(&child.name().value()) {
                        inner.push(child);
                    } else if child.name().value() == "simulator" {
                        let cv = View::of(child, self.text());
                        simulator = self.nested_simulator(&cv);
                    } else if child.name().value() == "persona" {
                        let cv = View::of(child, self.text());
                        persona = self.persona_ref(&cv);
                    } else {
                        let cv = View::of(child, self.text());
                        self.unknown_node(
                            cv.name,
                            cv.name_span,
                            "a `branch` (steps only)",
                            STEP_NODES,
                        );
                    }
                }
                let (mut steps, turn) = self.steps(&inner, has_turn, st);
                if let Some(simulator) = simulator {
                    assign_simulator(&mut steps, &std::sync::Arc::new(simulator));
                }
                if let Some(persona) = persona {
                    assign_persona(&mut steps, &std::sync::Arc::new(persona));
                }
                all_turn &= turn;
                if let Some(name) = name {
                    branches.push(Branch { name, steps });
                }
            }
            has_turn = all_turn;
            if !branches.is_empty() {
                out.push(Step {
                    kind: StepKind::Fork(branches),
                    span: self.span(SourceSpan::from(start..end.max(start))),
                });
            }
        }
        (out, has_turn)
    }

    fn step(&mut self, v: &View, has_turn: &mut bool, st: &mut ScenarioState) -> Option<Step> {
        let span = self.span(v.span);
        let kind = match v.name {
            "user" => {
                *has_turn = true;
                let e = self.single(v, "user \"MESSAGE\"")?;
                StepKind::User(self.template(e)?)
            }
            "simulate" => {
                *has_turn = true;
                self.simulate(v)?
            }
            "call" => {
                *has_turn = true;
                let usage = "call \"FUNCTION\" \"INPUT\"";
                self.check_props(v, &[], &[]);
                self.check_args(v, 2, usage);
                self.check_no_children(v);
                let (Some(f), Some(input)) = (v.args.first(), v.args.get(1)) else {
                    self.missing(v, "a function and an input", usage);
                    return None;
                };
                let (f, input) = (*f, *input);
                StepKind::Call {
                    function: self.string(f)?,
                    input: self.template(input)?,
                }
            }
            "hitl" => {
                // Answering a pause is not an agent turn: an `expect` after it would have
                // nothing to look at.
                let usage = "hitl \"approve\" message=\"…\"";
                self.check_props(v, &["message"], &[]);
                self.check_args(v, 1, usage);
                self.check_no_children(v);
                let Some(e) = v.args.first() else {
                    self.missing(v, "`approve` or `reject`", usage);
                    return None;
                };
                let approve =
                    self.choice(e, "hitl answer", &[("approve", true), ("reject", false)]);
                let message = v.prop("message").and_then(|e| self.template(e));
                StepKind::Hitl {
                    approve: approve?,
                    message,
                }
            }
            "expect" => {
                self.no_turn_check(v, *has_turn);
                StepKind::Expect(self.expect(v)?)
            }
            "capture" => {
                self.no_turn_check(v, *has_turn);
                self.capture(v, st)?
            }
            _ => return None,
        };
        Some(Step { kind, span })
    }

    fn no_turn_check(&mut self, v: &View, has_turn: bool) {
        if !has_turn {
            let d = self
                .diag(
                    Kind::NoTurnYet,
                    format!("`{}` before any agent turn", v.name),
                    v.name_span,
                    "no turn has been taken yet",
                )
                .with_help(format!(
                    "`{}` looks at the last reply; put a `user`, `simulate` or `call` step (or `initial-message`) before it",
                    v.name
                ));
            self.report(d);
        }
    }

    fn simulate(&mut self, v: &View) -> Option<StepKind> {
        let usage = "simulate turns=3` or `simulate until-done";
        self.check_props(v, &["turns"], &[]);
        self.check_args(v, 1, usage);
        self.check_no_children(v);
        let turns = v.prop("turns");
        match (v.args.first(), turns) {
            (Some(a), Some(t)) => {
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`simulate` takes either `turns=N` or `until-done`",
                        a.span(),
                        "remove this",
                    )
                    .with_label(t.span(), "or this")
                    .with_help(format!("write `{usage}`"));
                self.report(d);
                None
            }
            (Some(a), None) => {
                if a.value().as_string() == Some("until-done") {
                    Some(StepKind::Simulate {
                        turns: None,
                        simulator: None,
                        persona: None,
                    })
                } else {
                    let help = match a.value().as_string() {
                        Some(s) if did_you_mean(s, ["until-done"]).is_some() => {
                            "did you mean `until-done`?".to_string()
                        }
                        _ => format!("write `{usage}`"),
                    };
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            "invalid `simulate` argument",
                            a.span(),
                            "expected `until-done`",
                        )
                        .with_help(help);
                    self.report(d);
                    None
                }
            }
            (None, Some(t)) => self.u32(t, 1).map(|n| StepKind::Simulate {
                turns: Some(n),
                simulator: None,
                persona: None,
            }),
            (None, None) => Some(StepKind::Simulate {
                turns: None,
                simulator: None,
                persona: None,
            }),
        }
    }

    fn capture(&mut self, v: &View, st: &mut ScenarioState) -> Option<StepKind> {
        let usage = "capture \"NAME\" regex=#\"…\"#` or `capture \"NAME\" json-path=\"$.a\"";
        let name = self.id_arg(v, "a name", usage)?;
        self.check_args(v, 1, usage);
        self.check_props(v, &["regex", "json-path"], &[]);
        self.check_no_children(v);
        let source = match (v.prop("regex"), v.prop("json-path")) {
            (Some(r), None) => self.regex(r).map(CaptureSource::Regex),
            (None, Some(p)) => self.json_path(p),
            (Some(r), Some(p)) => {
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`capture` takes either `regex=` or `json-path=`",
                        p.span(),
                        "second source",
                    )
                    .with_label(r.span(), "first source")
                    .with_help("keep one of them");
                self.report(d);
                None
            }
            (None, None) => {
                // A misspelt source is already reported as an unknown property.
                if v.props.is_empty() {
                    self.missing(v, "`regex=…` or `json-path=…`", usage);
                }
                None
            }
        };
        match source {
            Some(source) => Some(StepKind::Capture {
                name: name.value,
                source,
            }),
            None => {
                st.failed_captures.insert(name.value);
                None
            }
        }
    }

    fn json_path(&mut self, e: &KdlEntry) -> Option<CaptureSource> {
        let s = self.string(e)?;
        match serde_json_path::JsonPath::parse(&s) {
            Ok(path) => Some(CaptureSource::JsonPath { path, source: s }),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidJsonPath,
                        format!("invalid JSON path `{s}`"),
                        value_span(e),
                        err.to_string(),
                    )
                    .with_help(
                        "JSON paths follow RFC 9535, e.g. \"$.booking.id\" or \"$.items[0].price\"",
                    );
                self.report(d);
                None
            }
        }
    }

    fn expect(&mut self, v: &View) -> Option<Vec<Criterion>> {
        let usage = "expect reply contains=\"…\"` or `expect { … }";
        match (v.args.is_empty(), v.children) {
            (true, None) => {
                self.missing(v, "a criterion", usage);
                None
            }
            (false, Some(children)) => {
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`expect` takes either an inline criterion or a block",
                        trim_span(self.text(), children.span()),
                        "block after an inline criterion",
                    )
                    .with_help(format!("write `{usage}`"));
                self.report(d);
                None
            }
            (true, Some(children)) => {
                self.check_props(v, &[], &[]);
                let mut out = Vec::new();
                for child in children.nodes() {
                    let cv = View::of(child, self.text());
                    if let Some(c) = self.criterion(&cv, "an `expect` block") {
                        out.push(c);
                    }
                }
                Some(out)
            }
            (false, None) => {
                let Some((inner, first)) = v.shifted() else {
                    if let Some(first) = v.args.first() {
                        self.wrong_type(
                            first,
                            "a criterion name",
                            "write e.g. `expect reply contains=\"…\"`",
                        );
                    }
                    return None;
                };
                let _ = first;
                self.criterion(&inner, "`expect`").map(|c| vec![c])
            }
        }
    }

    // ----- criteria

    /// The criterion as written, on one line.
    fn criterion_text(&self, v: &View) -> String {
        let mut text = v.name.to_string();
        for e in v.args.iter().chain(v.props.iter()) {
            let src = self.source_of(e.span());
            text.push(' ');
            if src.contains('\n') {
                text.push_str(&src.lines().map(str::trim).collect::<Vec<_>>().join(" "));
            } else {
                text.push_str(src);
            }
        }
        text
    }

    fn criterion(&mut self, v: &View, context: &str) -> Option<Criterion> {
        if !CRITERIA.contains(&v.name) {
            let help = match did_you_mean(v.name, CRITERIA.iter().copied()) {
                Some(best) => format!("did you mean `{best}`?"),
                None => format!("criteria are: {}", CRITERIA.join(", ")),
            };
            let d = self
                .diag(
                    Kind::UnknownNode,
                    format!("unknown criterion `{}` in {context}", v.name),
                    v.name_span,
                    "unknown criterion",
                )
                .with_help(help);
            self.report(d);
            return None;
        }
        self.check_no_children(v);
        let text = self.criterion_text(v);
        let mut templates = Vec::new();
        let kind = match v.name {
            "reply" => self.reply_criterion(v, &mut templates)?,
            "tool" => self.tool_criterion(v, &mut templates)?,
            "no-tool" => {
                let usage = "no-tool \"NAME\" (or `no-tool` alone: no tool call at all)";
                self.check_props(v, &[], &[]);
                if v.args.is_empty() {
                    CriterionKind::NoTool { name: None }
                } else {
                    self.check_args(v, 1, usage);
                    let name = self.id_arg(v, "a tool name", usage)?;
                    CriterionKind::NoTool {
                        name: Some(name.value),
                    }
                }
            }
            "tools-in-order" => {
                let names = self.strings(v, "tools-in-order \"A\" \"B\"");
                if names.is_empty() {
                    return None;
                }
                CriterionKind::ToolsInOrder(names)
            }
            "latency" | "ttft" => {
                let usage = format!("{} max=\"2s\"", v.name);
                self.check_props(v, &["max"], &[]);
                self.check_args(v, 0, &usage);
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", &usage);
                    return None;
                };
                let max = self.duration(e)?;
                if v.name == "latency" {
                    CriterionKind::Latency { max }
                } else {
                    CriterionKind::Ttft { max }
                }
            }
            "turns" | "tokens" => {
                let usage = format!("{} max=8", v.name);
                self.check_props(v, &["max"], &[]);
                self.check_args(v, 0, &usage);
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", &usage);
                    return None;
                };
                if v.name == "turns" {
                    CriterionKind::Turns {
                        max: self.u32(e, 0)?,
                    }
                } else {
                    CriterionKind::Tokens {
                        max: self.u64(e, 0)?,
                    }
                }
            }
            "no-error" => {
                self.check_props(v, &[], &[]);
                self.check_args(v, 0, "no-error");
                CriterionKind::NoError
            }
            "state" => self.state_criterion(v)?,
            "violations" => {
                let usage = "violations max=0";
                self.check_props(v, &["max"], &[]);
                self.check_args(v, 0, usage);
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", usage);
                    return None;
                };
                CriterionKind::Violations {
                    max: self.u32(e, 0)?,
                }
            }
            "judge" => {
                let usage = "judge \"CRITERION\" threshold=0.7 judge=\"ID\" rubric=\"…\"";
                self.check_props(v, &["threshold", "judge", "rubric"], &[]);
                self.check_args(v, 1, usage);
                let criterion = self.id_arg(v, "a criterion", usage)?;
                let threshold = v
                    .prop("threshold")
                    .and_then(|e| self.number(e, Some((0.0, 1.0))));
                let judge = v.prop("judge").and_then(|e| self.spanned_string(e));
                let rubric = v.prop("rubric").and_then(|e| self.string(e));
                CriterionKind::Judge {
                    criterion: criterion.value,
                    threshold,
                    judge,
                    rubric,
                }
            }
            _ => CriterionKind::Outcome(self.outcome(v)?),
        };
        Some(Criterion {
            kind,
            text,
            templates,
            span: self.span(v.span),
        })
    }

    /// `state path=… CHECK`: exactly one of `equals`, `contains`, `matches`, `near` (with an
    /// optional `tolerance`), `exists`, `absent`.
    fn state_criterion(&mut self, v: &View) -> Option<CriterionKind> {
        let checks = [
            "equals",
            "equals-json",
            "contains",
            "contains-json",
            "matches",
            "near",
            "exists",
            "absent",
        ];
        let usage = "state path=\"orders.0.status\" equals=\"refunded\"";
        self.check_args(v, 0, usage);
        let mut allowed = vec!["path", "tolerance"];
        allowed.extend(checks);
        self.check_props(v, &allowed, &[]);
        let path = self.state_path(v, usage);
        let given: Vec<&KdlEntry> = v
            .props
            .iter()
            .copied()
            .filter(|p| checks.contains(&prop_name(p)))
            .collect();
        let e = match given.as_slice() {
            [] => {
                self.missing(
                    v,
                    "a check (`equals`, `equals-json`, `contains`, `contains-json`, `matches`, \
                     `near`, `exists` or `absent`)",
                    usage,
                );
                return None;
            }
            [e] => *e,
            [_, second, ..] => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "a `state` criterion has one check".to_string(),
                        second.span(),
                        "second check",
                    )
                    .with_help("write one `state` criterion per check");
                self.report(d);
                return None;
            }
        };
        let tolerance = v.prop("tolerance");
        if let Some(t) = tolerance
            && prop_name(e) != "near"
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    "`tolerance` belongs to `near`".to_string(),
                    t.span(),
                    "without `near=`",
                )
                .with_help(
                    "write state path=\"…\" near=9.99 tolerance=0.01, or remove `tolerance`",
                );
            self.report(d);
            return None;
        }
        let check = match prop_name(e) {
            "equals" => StateCheck::Equals(self.json(e)?),
            // JSON text, for objects and arrays a KDL value cannot write.
            "equals-json" => StateCheck::Equals(self.json_text(e)?),
            "contains" => StateCheck::Contains(self.json(e)?),
            "contains-json" => StateCheck::Contains(self.json_text(e)?),
            "matches" => StateCheck::Matches(self.regex(e)?),
            "near" => {
                let value = self.number(e, None)?;
                let tolerance = match tolerance {
                    Some(t) => {
                        let tolerance = self.number(t, None)?;
                        if !(tolerance >= 0.0 && tolerance.is_finite()) {
                            let d = self
                                .diag(
                                    Kind::OutOfRange,
                                    format!(
                                        "{tolerance} is out of range: a tolerance is at least 0"
                                    ),
                                    value_span(t),
                                    "negative tolerance",
                                )
                                .with_help(
                                    "write the largest allowed difference, e.g. tolerance=0.01",
                                );
                            self.report(d);
                            return None;
                        }
                        tolerance
                    }
                    None => DEFAULT_STATE_TOLERANCE,
                };
                StateCheck::Near { value, tolerance }
            }
            name => {
                let exists = self.boolean(e)?;
                if exists == (name == "exists") {
                    StateCheck::Exists
                } else {
                    StateCheck::Absent
                }
            }
        };
        Some(CriterionKind::State { path: path?, check })
    }

    /// `reply json-path="$.a" equals=VALUE`: a check on the turn's structured data.
    fn reply_json_path(&mut self, v: &View, p: &KdlEntry) -> Option<CriterionKind> {
        self.check_props(v, &["json-path", "equals"], &[]);
        self.check_args(v, 0, "reply json-path=\"$.a\" equals=VALUE");
        let equals = v.prop("equals").map(|e| match e.value() {
            KdlValue::String(s) => serde_json::Value::String(s.clone()),
            KdlValue::Integer(i) => match i64::try_from(*i) {
                Ok(i) => serde_json::Value::from(i),
                Err(_) => serde_json::Value::from(*i as f64),
            },
            KdlValue::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            KdlValue::Bool(b) => serde_json::Value::Bool(*b),
            KdlValue::Null => serde_json::Value::Null,
        });
        match self.json_path(p)? {
            CaptureSource::JsonPath { path, source } => {
                Some(CriterionKind::Reply(vec![ReplyCheck::JsonPath {
                    path,
                    source,
                    equals,
                }]))
            }
            CaptureSource::Regex(_) => None,
        }
    }

    /// `reply …`; string checks written with template syntax are added to `templates`.
    fn reply_criterion(
        &mut self,
        v: &View,
        templates: &mut Vec<CriterionTemplate>,
    ) -> Option<CriterionKind> {
        let checks = ["contains", "not-contains", "matches", "equals"];
        let usage = "reply contains=\"…\"";
        if let Some(p) = v.prop("json-path") {
            return self.reply_json_path(v, p);
        }
        self.check_props(v, &checks, &checks);
        self.check_args(v, 0, usage);
        let mut out = Vec::new();
        let mut failed = false;
        for p in v.props.clone() {
            let name = prop_name(p);
            if matches!(name, "contains" | "not-contains" | "equals")
                && let Some(source) = p.value().as_string()
                && template::is_template(source)
            {
                templates.push(CriterionTemplate {
                    slot: ValueSlot::ReplyCheck(out.len()),
                    template: Template {
                        source: source.to_string(),
                        span: self.span(value_span(p)),
                    },
                });
            }
            let check = match name {
                "contains" => self.string(p).map(ReplyCheck::Contains),
                "not-contains" => self.string(p).map(ReplyCheck::NotContains),
                "equals" => self.string(p).map(ReplyCheck::Equals),
                "matches" if self.templated_regex(p) => None,
                "matches" => self.regex(p).map(ReplyCheck::Matches),
                _ => continue,
            };
            match check {
                Some(c) => out.push(c),
                None => failed = true,
            }
        }
        if out.is_empty() {
            if !failed && v.props.is_empty() {
                self.missing(
                    v,
                    "a check",
                    "reply contains=\"…\"` (or `not-contains=`, `matches=`, `equals=`",
                );
            }
            return None;
        }
        Some(CriterionKind::Reply(out))
    }

    /// A regex is fixed when the suite is checked, so that a bad pattern fails `check`;
    /// one written like a template is reported instead of silently matching `{{`.
    fn templated_regex(&mut self, e: &KdlEntry) -> bool {
        let Some(pattern) = e.value().as_string() else {
            return false;
        };
        let Some(open) = pattern.find("{{") else {
            return false;
        };
        if !pattern[open..].contains("}}") {
            return false;
        }
        let d = self
            .diag(
                Kind::InvalidValue,
                "`matches` is a regex, not a template",
                value_span(e),
                "template syntax in a regex",
            )
            .with_help(
                "regexes are compiled when the suite is checked; to compare the reply with a \
                 variable write `contains=\"{{ … }}\"` or `equals=\"{{ … }}\"`",
            );
        self.report(d);
        true
    }

    /// `tool` / `expect-tool`; string parameters written with template syntax are added to
    /// `templates`.
    fn tool_criterion(
        &mut self,
        v: &View,
        templates: &mut Vec<CriterionTemplate>,
    ) -> Option<CriterionKind> {
        let usage = format!("{} \"NAME\" KEY=VALUE… count=N", v.name);
        self.check_args(v, 1, &usage);
        let name = self.id_arg(v, "a tool name", &usage)?;
        let mut params = Map::new();
        let mut count = None;
        for p in v.props.clone() {
            let key = prop_name(p);
            if key == "count" {
                count = self.u32(p, 0);
            } else if let Some(val) = self.json(p) {
                if let Value::String(source) = &val
                    && template::is_template(source)
                {
                    templates.push(CriterionTemplate {
                        slot: ValueSlot::ToolParam(key.to_string()),
                        template: Template {
                            source: source.clone(),
                            span: self.span(value_span(p)),
                        },
                    });
                }
                params.insert(key.to_string(), val);
            }
        }
        Some(CriterionKind::Tool {
            name: name.value,
            params,
            count,
            loose: v.name == "expect-tool",
        })
    }

    fn outcome(&mut self, v: &View) -> Option<Outcome> {
        let usage = "outcome \"STATEMENT\"` or `outcome LABEL=VALUE";
        match (v.args.as_slice(), v.props.as_slice()) {
            ([arg], []) => self.string(arg).map(Outcome::Statement),
            ([], [prop]) => Some(Outcome::Labeled {
                label: prop_name(prop).to_string(),
                value: self.json(prop)?,
            }),
            ([], []) => {
                self.missing(v, "a statement", usage);
                None
            }
            _ => {
                let extra = v
                    .args
                    .get(1)
                    .or(v.props.get(1))
                    .or(v.props.first())
                    .map_or(v.span, |e| e.span());
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`outcome` takes one statement or one LABEL=VALUE",
                        extra,
                        "unexpected",
                    )
                    .with_help("write one `outcome` per expected outcome");
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
            scenarios: items.scenarios,
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

/// Gives `persona` to every `simulate` step of a branch's `steps` (and of their branches)
/// that has none yet: the innermost branch's persona wins.
fn assign_persona(steps: &mut [Step], persona: &std::sync::Arc<PersonaRef>) {
    for step in steps {
        match &mut step.kind {
            StepKind::Simulate {
                persona: slot @ None,
                ..
            } => *slot = Some(persona.clone()),
            StepKind::Fork(branches) => {
                for branch in branches {
                    assign_persona(&mut branch.steps, persona);
                }
            }
            _ => {}
        }
    }
}

/// Gives `simulator` to every `simulate` step of `steps` (and of their branches): a step that
/// already has one (an inner branch's, assigned first) gets it layered over `simulator`.
fn assign_simulator(steps: &mut [Step], simulator: &std::sync::Arc<Simulator>) {
    for step in steps {
        match &mut step.kind {
            StepKind::Simulate {
                simulator: slot, ..
            } => {
                *slot = Some(match slot.as_deref() {
                    None => simulator.clone(),
                    Some(inner) => std::sync::Arc::new(inner.over(simulator)),
                })
            }
            StepKind::Fork(branches) => {
                for branch in branches {
                    assign_simulator(&mut branch.steps, simulator);
                }
            }
            _ => {}
        }
    }
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
