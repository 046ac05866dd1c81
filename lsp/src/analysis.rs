//! What the editor asks about a position, answered from the language table
//! (`trellis_dsl::lang`) and the forgiving syntax tree of every file of the project: which
//! node kind the cursor is in, what a value's type is, where ids are defined and used.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use trellis_dsl::lang::{self, Children, Form, NodeSpec, ProtocolSpec, ValueType};

use crate::syntax::{self, Node, Value};

/// The node kinds whose first argument is an id that others refer to, with the name that
/// `ValueType::Ref` gives their kind.
pub const DECLARATIONS: &[&str] = &[
    "agent",
    "persona",
    "tool",
    "provider",
    "judge",
    "panel",
    "simulator",
    "scenario",
    "dataset",
];

/// The spec of each node of `chain` (top level first); `None` from the first node the
/// language does not know.
pub fn specs_of(chain: &[&Node], protocols: &[&'static ProtocolSpec]) -> Vec<&'static NodeSpec> {
    let mut out: Vec<&'static NodeSpec> = Vec::new();
    for (i, node) in chain.iter().enumerate() {
        let spec = if i == 0 {
            lang::top(&node.name)
        } else {
            child_specs(chain[i - 1], out[i - 1], protocols)
                .into_iter()
                .find(|s| s.name == node.name)
        };
        match spec {
            Some(s) => out.push(s),
            None => break,
        }
    }
    out
}

/// The node kinds `parent`'s block takes; an agent's also those of its protocol.
pub fn child_specs(
    parent: &Node,
    spec: &'static NodeSpec,
    protocols: &[&'static ProtocolSpec],
) -> Vec<&'static NodeSpec> {
    let mut out: Vec<&'static NodeSpec> = spec.child_specs().to_vec();
    if spec.name == "agent"
        && let Some(p) = protocol_of(parent, protocols)
    {
        out.extend(p.settings.iter());
    }
    out
}

/// What an agent's block can still take: its settings and its protocol's, less a setting
/// it already has (`url` written on its line: "set twice") and an endpoint its protocol
/// does not take or beside the one it has ("more than one endpoint"), which `check` refuses.
pub fn agent_settings_left(
    agent: &Node,
    spec: &'static NodeSpec,
    protocols: &[&'static ProtocolSpec],
) -> Vec<&'static NodeSpec> {
    let protocol = protocol_of(agent, protocols);
    let endpoints = [
        lang::EndpointKind::Url,
        lang::EndpointKind::BaseUrl,
        lang::EndpointKind::Builtin,
        lang::EndpointKind::Command,
        lang::EndpointKind::Socket,
    ];
    let endpoint_of = |name: &str| endpoints.into_iter().find(|e| e.property() == name);
    let has_endpoint = endpoints
        .into_iter()
        .any(|e| agent.setting(e.property()).is_some());
    child_specs(agent, spec, protocols)
        .into_iter()
        .filter(|s| !(s.form == Form::Setting && agent.setting(s.name).is_some()))
        .filter(|s| match endpoint_of(s.name) {
            None => true,
            Some(kind) => !has_endpoint && protocol.is_none_or(|p| p.endpoints.contains(&kind)),
        })
        .collect()
}

pub fn protocol_of(
    agent: &Node,
    protocols: &[&'static ProtocolSpec],
) -> Option<&'static ProtocolSpec> {
    let name = agent.setting("protocol")?;
    protocols.iter().copied().find(|p| p.name == name.text)
}

/// What a node's line is read with: the spec itself, or, for an inline criterion
/// (`expect reply contains=…`), the criterion its first argument names, whose arguments
/// start after that name (the second value: how many arguments to skip).
pub fn line_spec(node: &Node, spec: &'static NodeSpec) -> (&'static NodeSpec, usize) {
    if spec.name == "expect"
        && let Some(criterion) = node.arg(0).and_then(|a| spec.child(&a.text))
    {
        return (criterion, 1);
    }
    (spec, 0)
}

/// The properties a node takes: its own and its settings (a setting may be a property).
pub fn property_names(
    node: &Node,
    spec: &'static NodeSpec,
    protocols: &[&'static ProtocolSpec],
) -> Vec<(&'static str, &'static str, ValueType)> {
    let (spec, _) = line_spec(node, spec);
    let mut out: Vec<(&str, &str, ValueType)> = spec
        .props
        .iter()
        .filter(|p| p.name != lang::ANY_KEY)
        .map(|p| (p.name, p.help, p.ty))
        .collect();
    // Settings a node's line may also carry as properties: an agent's less those it has
    // and the endpoints it cannot take, as its block's completion leaves them out; none of
    // a scenario's, whose line takes only `for-each` (`dsl/src/parse/scenario.rs`: `check`
    // refuses `name=` there).
    let settings = match spec.name {
        "scenario" => Vec::new(),
        "agent" => agent_settings_left(node, spec, protocols),
        _ => child_specs(node, spec, protocols),
    };
    for child in settings {
        if child.form == Form::Setting
            && let Some(arg) = child.args.first()
        {
            out.push((child.name, child.help, arg.ty));
        }
    }
    out
}

/// The type of the value written at `value` of `node`: its `n`th argument or a property.
pub fn value_type(
    node: &Node,
    spec: &'static NodeSpec,
    value: &Value,
    protocols: &[&'static ProtocolSpec],
) -> Option<ValueType> {
    let entry = node
        .entries
        .iter()
        .find(|e| e.value.as_ref().is_some_and(|v| v.span == value.span))?;
    let (spec, skipped) = line_spec(node, spec);
    match &entry.key {
        Some((key, _)) => property_names(node, spec, protocols)
            .into_iter()
            .find(|(name, _, _)| name == key)
            .map(|(_, _, ty)| ty)
            .or_else(|| spec.prop(lang::ANY_KEY).map(|p| p.ty)),
        None => {
            let n = node
                .entries
                .iter()
                .filter(|e| e.key.is_none() && !e.commented)
                .position(|e| e.value.as_ref().is_some_and(|v| v.span == value.span))?
                .checked_sub(skipped)?;
            let arg = spec.args.get(n).or_else(|| {
                spec.args
                    .last()
                    .filter(|a| matches!(a.repeat, lang::Repeat::Many | lang::Repeat::Any))
            })?;
            Some(arg.ty)
        }
    }
}

/// Where an id is defined or used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occurrence {
    /// Shared by every occurrence in the file: an index of a large project holds one per id
    /// written, and it is made again after every edit.
    pub file: Rc<Path>,
    /// The id's text, between the quotes.
    pub content: Range<usize>,
    /// The node that defines it (for a definition), from its name to its block's end.
    pub node: Range<usize>,
    /// Written without quotes (`agent demo`): a new name that is not a bare identifier
    /// must be quoted there.
    pub bare: bool,
}

/// The namespace of captures, whose ids are their scenario's: `SUITE/SCENARIO/NAME`.
pub const CAPTURE: &str = "capture";

/// Each `vars.NAME` inside a template's `{{ … }}` and `{% … %}`, with where `NAME` starts
/// (prose that mentions `vars.x` is not a use).
fn vars_used(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(open) = text[from..].find(['{']).map(|at| from + at) {
        let close = match text.get(open..open + 2) {
            Some("{{") => "}}",
            Some("{%") => "%}",
            _ => {
                from = open + 1;
                continue;
            }
        };
        let inner = open + 2;
        let end = text[inner..]
            .find(close)
            .map_or(text.len(), |at| inner + at);
        found.extend(
            vars_in(&text[inner..end])
                .into_iter()
                .map(|(at, name)| (inner + at, name)),
        );
        from = end;
    }
    found
}

/// Each `vars.NAME` in `text`, with where `NAME` starts.
fn vars_in(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("vars.") {
        let start = from + at + "vars.".len();
        // `myvars.x` is another variable's attribute.
        let before = text[..from + at].chars().next_back();
        let name_len = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(text.len() - start);
        if name_len > 0 && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            found.push((start, &text[start..start + name_len]));
        }
        from = start;
    }
    found
}

/// The namespace an id of `kind` lives in: panels are judges to whoever names one.
pub fn namespace(kind: &str) -> &str {
    if kind == "panel" { "judge" } else { kind }
}

/// An id's namespace and the id (a scenario's as `SUITE/ID`).
pub type Key = (String, String);

/// The ids one file defines and uses, and its includes: made once per text of the file, so
/// that the project's index after an edit is the edited file's made again and the others'
/// kept.
#[derive(Default, Debug)]
pub struct FileIndex {
    defs: BTreeMap<Key, Vec<Occurrence>>,
    refs: BTreeMap<Key, Vec<Occurrence>>,
    /// `include "PATH"`s: the file each names (canonical) and where it is written.
    includes: Vec<(PathBuf, Occurrence)>,
    /// Uses of an id whose place in the text cannot be told (`vars.NAME` in a string with
    /// escapes), by the id: rename refuses rather than leave them behind.
    unplaced: BTreeMap<Key, Vec<Occurrence>>,
    /// The ids of the `panel`s it defines (in the judges' namespace with the judges): a
    /// panel's `judges` lists judges only.
    panels: std::collections::BTreeSet<String>,
    /// The file's suite name: its `suite "NAME"`, or its file stem.
    suite: String,
}

/// Every id the project defines and every place it is used, by namespace (`agent`,
/// `judge` for judges and panels, `scenario`…) and id. Scenario ids are per suite: their
/// key is `SUITE/ID`, as `needs` across suites writes it. The files' own indexes, in the
/// project's file order: an id's occurrences come file by file.
#[derive(Default, Debug)]
pub struct Index {
    files: Vec<(PathBuf, Rc<FileIndex>)>,
    /// Where each file is in `files`.
    positions: HashMap<PathBuf, usize>,
}

impl Index {
    /// The index of a project whose files have these indexes, in this order.
    pub fn new(files: Vec<(PathBuf, Rc<FileIndex>)>) -> Self {
        let positions = files
            .iter()
            .enumerate()
            .map(|(i, (path, _))| (path.clone(), i))
            .collect();
        Index { files, positions }
    }

    /// `file`'s own index.
    pub fn part(&self, file: &Path) -> Option<&Rc<FileIndex>> {
        let at = *self.positions.get(file)?;
        self.files.get(at).map(|(_, index)| index)
    }

    fn file(&self, file: &Path) -> Option<&FileIndex> {
        self.part(file).map(|index| &**index)
    }

    /// Where `key` is defined, file by file.
    pub fn defs<'a>(&'a self, key: &'a Key) -> impl Iterator<Item = &'a Occurrence> + 'a {
        self.files
            .iter()
            .flat_map(move |(_, f)| f.defs.get(key).into_iter().flatten())
    }

    /// Where `key` is used, file by file.
    pub fn refs<'a>(&'a self, key: &'a Key) -> impl Iterator<Item = &'a Occurrence> + 'a {
        self.files
            .iter()
            .flat_map(move |(_, f)| f.refs.get(key).into_iter().flatten())
    }

    /// Uses of `key` whose place in the text cannot be told.
    pub fn unplaced<'a>(&'a self, key: &'a Key) -> impl Iterator<Item = &'a Occurrence> + 'a {
        self.files
            .iter()
            .flat_map(move |(_, f)| f.unplaced.get(key).into_iter().flatten())
    }

    pub fn defined(&self, key: &Key) -> bool {
        self.files.iter().any(|(_, f)| f.defs.contains_key(key))
    }

    /// Every `include "PATH"`: the file it names (canonical) and where it is written.
    pub fn includes(&self) -> impl Iterator<Item = &(PathBuf, Occurrence)> {
        self.files.iter().flat_map(|(_, f)| f.includes.iter())
    }

    /// The suite `file` belongs to.
    pub fn suite_of(&self, file: &Path) -> &str {
        self.file(file).map_or("", |f| f.suite.as_str())
    }

    /// An id of `kind` as written in `file`: a scenario's without its suite when it is
    /// `file`'s own.
    pub fn written_in<'a>(&self, file: &Path, kind: &str, id: &'a str) -> &'a str {
        match id.split_once('/') {
            Some((suite, scenario)) if kind == "scenario" && suite == self.suite_of(file) => {
                scenario
            }
            _ => id,
        }
    }

    /// The kind and id of the definition or reference whose text holds `offset` in `file`.
    pub fn at(&self, file: &Path, offset: usize) -> Option<Key> {
        let index = self.file(file)?;
        index
            .defs
            .iter()
            .chain(index.refs.iter())
            .find(|(_, occurrences)| {
                occurrences
                    .iter()
                    .any(|o| o.content.start <= offset && offset <= o.content.end)
            })
            .map(|(key, _)| key.clone())
    }

    /// The ids of one kind, with the first place each is defined.
    /// Whether `id` is a panel's (not a judge's) in some file.
    pub fn is_panel(&self, id: &str) -> bool {
        self.files.iter().any(|(_, f)| f.panels.contains(id))
    }

    pub fn ids(&self, kind: &str) -> Vec<(&str, &Occurrence)> {
        let mut first: BTreeMap<&str, &Occurrence> = BTreeMap::new();
        for (_, f) in &self.files {
            for ((k, id), o) in &f.defs {
                if k == kind
                    && let Some(o) = o.first()
                {
                    first.entry(id.as_str()).or_insert(o);
                }
            }
        }
        first.into_iter().collect()
    }
}

impl FileIndex {
    /// The ids `nodes` (the forgiving tree of the file at `path`) define and use.
    pub fn of(path: &Path, nodes: &[Node], protocols: &[&'static ProtocolSpec]) -> Self {
        let mut index = FileIndex::default();
        let file: Rc<Path> = Rc::from(path);
        let file = &file;
        let suite = nodes
            .iter()
            .find(|n| !n.commented && n.name == "suite")
            .and_then(|n| n.arg(0))
            .map(|a| a.text.clone())
            .unwrap_or_else(|| {
                file.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        for node in nodes.iter().filter(|n| !n.commented) {
            let Some(spec) = lang::top(&node.name) else {
                continue;
            };
            if spec.name == "include"
                && let Some(arg) = node.arg(0)
            {
                let dir = file.parent().unwrap_or(Path::new("/"));
                index.includes.push((
                    trellis_dsl::canonical(&dir.join(&arg.text)),
                    Occurrence {
                        file: file.clone(),
                        content: arg.content.clone(),
                        node: node.span.clone(),
                        bare: arg.content == arg.span,
                    },
                ));
            }
            if let Some(id) = node.arg(0).filter(|_| DECLARATIONS.contains(&spec.name)) {
                if spec.name == "panel" {
                    index.panels.insert(id.text.clone());
                }
                let key = if spec.name == "scenario" {
                    format!("{suite}/{}", id.text)
                } else {
                    id.text.clone()
                };
                index
                    .defs
                    .entry((namespace(spec.name).to_string(), key))
                    .or_default()
                    .push(Occurrence {
                        file: file.clone(),
                        content: id.content.clone(),
                        node: node.span.clone(),
                        bare: id.content == id.span,
                    });
            }
            index.refs_in(file, &suite, node, spec, protocols, 0);
            if spec.name == "scenario"
                && let Some(id) = node.arg(0)
            {
                index.captures_in(file, &format!("{suite}/{}/", id.text), node, 0);
            }
        }
        index.suite = suite;
        index
    }

    /// A scenario's captures: each `capture "NAME"` defines `NAME` for the scenario (key
    /// `SUITE/SCENARIO/NAME` in the `capture` namespace), and each `vars.NAME` in its
    /// strings uses it. A string with escapes in it is passed over: its text's offsets are
    /// not the file's.
    fn captures_in(&mut self, file: &Rc<Path>, prefix: &str, node: &Node, depth: usize) {
        for child in node.children().filter(|c| !c.commented) {
            if child.name == "capture"
                && let Some(name) = child.arg(0)
            {
                self.defs
                    .entry((CAPTURE.to_owned(), format!("{prefix}{}", name.text)))
                    .or_default()
                    .push(Occurrence {
                        file: file.clone(),
                        content: name.content.clone(),
                        node: child.span.clone(),
                        bare: name.content == name.span,
                    });
            }
            let strings = child
                .entries
                .iter()
                .filter(|e| !e.commented)
                .filter_map(|e| e.value.as_ref())
                .filter(|v| v.is_string);
            for value in strings {
                if value.text.len() != value.content.len() {
                    for (_, name) in vars_used(&value.text) {
                        self.unplaced
                            .entry((CAPTURE.to_owned(), format!("{prefix}{name}")))
                            .or_default()
                            .push(Occurrence {
                                file: file.clone(),
                                content: value.content.clone(),
                                node: child.span.clone(),
                                bare: false,
                            });
                    }
                    continue;
                }
                for (at, name) in vars_used(&value.text) {
                    let start = value.content.start + at;
                    // Inside a string: a new name is written as it is, never quoted.
                    self.refs
                        .entry((CAPTURE.to_owned(), format!("{prefix}{name}")))
                        .or_default()
                        .push(Occurrence {
                            file: file.clone(),
                            content: start..start + name.len(),
                            node: child.span.clone(),
                            bare: false,
                        });
                }
            }
            if depth < 64 {
                self.captures_in(file, prefix, child, depth + 1);
            }
        }
    }

    fn refs_in(
        &mut self,
        file: &Rc<Path>,
        suite: &str,
        node: &Node,
        spec: &'static NodeSpec,
        protocols: &[&'static ProtocolSpec],
        depth: usize,
    ) {
        for entry in node.entries.iter().filter(|e| !e.commented) {
            let Some(value) = &entry.value else { continue };
            if let Some(ValueType::Ref(kind)) = value_type(node, spec, value, protocols) {
                // `needs "suite/scenario"`: the scenario part names the scenario, of that
                // suite; `needs "scenario"`: of this one.
                let (id, content) = match trellis_dsl::graph::split_reference(&value.text) {
                    Some((other, id))
                        if kind == "scenario" && value.content.len() == value.text.len() =>
                    {
                        (
                            format!("{other}/{id}"),
                            value.content.end - id.len()..value.content.end,
                        )
                    }
                    _ if kind == "scenario" => {
                        (format!("{suite}/{}", value.text), value.content.clone())
                    }
                    _ => (value.text.clone(), value.content.clone()),
                };
                self.refs
                    .entry((namespace(kind).to_string(), id))
                    .or_default()
                    .push(Occurrence {
                        file: file.clone(),
                        content,
                        node: node.span.clone(),
                        bare: value.content == value.span,
                    });
            }
        }
        if depth > 64 {
            return;
        }
        let children = child_specs(node, spec, protocols);
        for child in node.children() {
            if let Some(child_spec) = children.iter().find(|s| s.name == child.name) {
                self.refs_in(file, suite, child, child_spec, protocols, depth + 1);
            }
        }
    }
}

/// Where the cursor is, as completion needs it.
#[derive(Debug)]
pub enum Place<'a> {
    /// Where a node's name goes (possibly half typed: `prefix`), in the block of `parent`
    /// (`None`: the top level).
    NodeName {
        parent: Option<&'a Node>,
        chain: Vec<&'a Node>,
    },
    /// In a node's line, where a property or argument goes.
    Entry {
        node: &'a Node,
        chain: Vec<&'a Node>,
    },
    /// In a value.
    Value {
        node: &'a Node,
        chain: Vec<&'a Node>,
        value: &'a Value,
    },
}

/// What `offset` in the text holding `nodes` is.
pub fn place<'a>(nodes: &'a [Node], text: &str, offset: usize) -> Place<'a> {
    let chain = syntax::chain(nodes, offset);
    let Some(&innermost) = chain.last() else {
        return Place::NodeName {
            parent: None,
            chain,
        };
    };
    let in_block = innermost
        .block
        .as_ref()
        .is_some_and(|b| b.inside.start <= offset && offset <= b.inside.end);
    if in_block {
        return Place::NodeName {
            parent: Some(innermost),
            chain,
        };
    }
    if offset <= innermost.name_span.end {
        let mut parent_chain = chain.clone();
        parent_chain.pop();
        return Place::NodeName {
            parent: parent_chain.last().copied(),
            chain: parent_chain,
        };
    }
    // A newline between the node's line and the cursor: a new node of the same block.
    let line_break = text
        .get(innermost.head.end.min(offset)..offset)
        .is_some_and(|between| between.contains(['\n', '\r']));
    if offset > innermost.head.end && line_break {
        let mut parent_chain = chain.clone();
        parent_chain.pop();
        return Place::NodeName {
            parent: parent_chain.last().copied(),
            chain: parent_chain,
        };
    }
    for entry in &innermost.entries {
        // Inside the quotes, or anywhere after an opening quote that is not closed yet.
        let inside = |v: &Value| {
            let closed = v.is_string && v.content.end < v.span.end;
            v.span.start < offset && (offset < v.span.end || (!closed && offset == v.span.end))
        };
        if let Some(value) = entry.value.as_ref().filter(|v| inside(v))
            && (value.is_string || entry.key.is_some())
        {
            return Place::Value {
                node: innermost,
                chain,
                value,
            };
        }
    }
    Place::Entry {
        node: innermost,
        chain,
    }
}

/// The node's usage and one-line help, with its properties, for a hover.
pub fn describe(
    spec: &'static NodeSpec,
    node: Option<&Node>,
    protocols: &[&'static ProtocolSpec],
) -> String {
    let mut out = format!("```kdl\n{}\n```\n{}", spec.usage(), spec.help);
    if let Some(only) = spec.protocols {
        out.push_str(&format!("\n\nOnly for `{}` agents.", only.join("`, `")));
    }
    let props: Vec<String> = spec
        .props
        .iter()
        .map(|p| {
            let name = if p.name == lang::ANY_KEY {
                "KEY".to_string()
            } else {
                format!("`{}`", p.name)
            };
            let required = if p.required { " (required)" } else { "" };
            format!("- {name}={}{required}: {}", p.ty.describe(), p.help)
        })
        .collect();
    if !props.is_empty() {
        out.push_str("\n\nProperties:\n");
        out.push_str(&props.join("\n"));
    }
    let children: Vec<&NodeSpec> = match node {
        Some(n) => child_specs(n, spec, protocols),
        None => spec.child_specs().to_vec(),
    };
    if !children.is_empty() {
        let names: Vec<String> = children.iter().map(|c| format!("`{}`", c.name)).collect();
        out.push_str(&format!("\n\nIn its block: {}", names.join(", ")));
    } else if matches!(spec.children, Children::Data) {
        out.push_str("\n\nIts block holds free-form data.");
    }
    out
}
