//! The server loop: open buffers, the project each belongs to, and one handler per request.
//!
//! A project is the directory of suites a buffer would be loaded with (see
//! [`project_dir`]); its diagnostics come from the loader itself
//! ([`trellis_dsl::load_with_overlay`], open buffers winning over the files on disk) plus the
//! warnings `trellis check` adds, so the editor shows exactly what `check` prints. Edits that
//! arrive together are read before the project is checked again, so typing fast costs one
//! check, not one per keystroke.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{self as notif, Notification as _};
use lsp_types::request::{self as req, Request as _};
use lsp_types::*;
use trellis_dsl::lang::{self, ProtocolSpec, ValueType};
use trellis_dsl::{Diagnostic as DslDiagnostic, Project};

use crate::analysis::{self, Index, Place};
use crate::syntax::{self, Node};
use crate::text::LineIndex;

/// The warnings `trellis check` adds to a project that loads (what cannot run yet, unset
/// environment variables); the engine computes them, and this crate does not depend on it.
pub type Warnings = Box<dyn Fn(&Project) -> Vec<DslDiagnostic>>;

/// What the server needs from the rest of Trellis.
pub struct Config {
    pub protocols: Vec<&'static ProtocolSpec>,
    pub warnings: Warnings,
}

struct Buffer {
    text: Arc<str>,
}

/// One file's text, its forgiving tree and its line index.
struct FileView {
    text: Arc<str>,
    nodes: Vec<Node>,
    lines: LineIndex,
}

impl FileView {
    fn new(text: Arc<str>) -> Self {
        FileView {
            nodes: syntax::parse(&text),
            lines: LineIndex::new(&text),
            text,
        }
    }
}

pub struct Server {
    config: Config,
    roots: Vec<PathBuf>,
    buffers: HashMap<PathBuf, Buffer>,
    /// Projects whose diagnostics are stale.
    dirty: BTreeSet<PathBuf>,
    /// The files each project's last check published diagnostics for (to clear them).
    published: HashMap<PathBuf, HashSet<PathBuf>>,
}

impl Server {
    pub fn new(config: Config, roots: Vec<PathBuf>) -> Self {
        Server {
            config,
            roots,
            buffers: HashMap::new(),
            dirty: BTreeSet::new(),
            published: HashMap::new(),
        }
    }

    /// Serves until the client says `exit`.
    pub fn run(&mut self, connection: &Connection) -> Result<(), crate::Error> {
        while let Ok(message) = connection.receiver.recv() {
            if self.handle(connection, message)? {
                return Ok(());
            }
            // Everything already sent is read before checking again.
            while let Ok(message) = connection.receiver.try_recv() {
                if self.handle(connection, message)? {
                    return Ok(());
                }
            }
            self.publish(connection)?;
        }
        Ok(())
    }

    /// Handles one message; `true` when the server should stop.
    fn handle(&mut self, connection: &Connection, message: Message) -> Result<bool, crate::Error> {
        match message {
            Message::Request(request) => {
                if request.method == req::Shutdown::METHOD {
                    shut_down(connection, request.id)?;
                    return Ok(true);
                }
                let id = request.id.clone();
                let method = request.method.clone();
                // A bug in one answer must not take the editor's diagnostics down with it.
                let response = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.request(request)
                }))
                .unwrap_or_else(|_| {
                    error_response(id, format!("trellis lsp failed to answer `{method}`"))
                });
                connection.sender.send(Message::Response(response))?;
            }
            Message::Notification(n) => self.notification(n),
            Message::Response(_) => {}
        }
        Ok(false)
    }

    fn notification(&mut self, n: Notification) {
        match n.method.as_str() {
            notif::DidOpenTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<DidOpenTextDocumentParams>(n.params)
                    && let Some(path) = to_path(&p.text_document.uri)
                {
                    self.set_buffer(path, p.text_document.text);
                }
            }
            notif::DidChangeTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<DidChangeTextDocumentParams>(n.params)
                    && let Some(path) = to_path(&p.text_document.uri)
                {
                    let mut text = self
                        .buffers
                        .get(&path)
                        .map(|b| b.text.to_string())
                        .unwrap_or_default();
                    for change in p.content_changes {
                        match change.range {
                            None => text = change.text,
                            Some(range) => {
                                let lines = LineIndex::new(&text);
                                let start = lines.offset(&text, range.start);
                                let end = lines.offset(&text, range.end).max(start);
                                text.replace_range(start..end, &change.text);
                            }
                        }
                    }
                    self.set_buffer(path, text);
                }
            }
            notif::DidSaveTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<DidSaveTextDocumentParams>(n.params)
                    && let Some(path) = to_path(&p.text_document.uri)
                {
                    self.dirty.insert(self.project_of(&path));
                }
            }
            notif::DidCloseTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<DidCloseTextDocumentParams>(n.params)
                    && let Some(path) = to_path(&p.text_document.uri)
                {
                    let key = trellis_dsl::canonical(&path);
                    self.buffers.remove(&key);
                    // What is on disk counts again.
                    self.dirty.insert(self.project_of(&key));
                }
            }
            notif::DidChangeWatchedFiles::METHOD => {
                let projects: Vec<PathBuf> = self.published.keys().cloned().collect();
                self.dirty.extend(projects);
            }
            _ => {}
        }
    }

    fn set_buffer(&mut self, path: PathBuf, text: String) {
        let key = trellis_dsl::canonical(&path);
        self.dirty.insert(self.project_of(&key));
        self.buffers.insert(
            key,
            Buffer {
                text: Arc::from(text),
            },
        );
    }

    fn project_of(&self, file: &Path) -> PathBuf {
        project_dir(file, &self.roots)
    }

    /// Checks every project with changes and publishes its diagnostics.
    fn publish(&mut self, connection: &Connection) -> Result<(), crate::Error> {
        let dirty = std::mem::take(&mut self.dirty);
        for project in dirty {
            let by_file = self.check(&project);
            let files: HashSet<PathBuf> = by_file.keys().cloned().collect();
            let before = self
                .published
                .insert(project.clone(), files)
                .unwrap_or_default();
            for gone in before.iter().filter(|f| !by_file.contains_key(*f)) {
                send_diagnostics(connection, gone, Vec::new())?;
            }
            for (file, diags) in by_file {
                send_diagnostics(connection, &file, diags)?;
            }
        }
        Ok(())
    }

    fn overlay(&self) -> HashMap<PathBuf, Arc<str>> {
        self.buffers
            .iter()
            .map(|(path, b)| (path.clone(), b.text.clone()))
            .collect()
    }

    /// Everything `trellis check DIR` reports for the project, by file (every `.kdl` file of
    /// the project is listed, most with no diagnostics, so fixed problems are cleared).
    pub fn check(&self, project: &Path) -> HashMap<PathBuf, Vec<lsp_types::Diagnostic>> {
        let mut out: HashMap<PathBuf, Vec<lsp_types::Diagnostic>> = HashMap::new();
        for file in self.project_files(project) {
            out.entry(file).or_default();
        }
        let loaded =
            trellis_dsl::load_with_overlay(&[project], &self.config.protocols, self.overlay());
        let (files, diags): (Vec<(PathBuf, Arc<str>)>, Vec<DslDiagnostic>) = match loaded {
            Ok(project) => {
                let mut warnings = (self.config.warnings)(&project);
                warnings.sort_by_key(|d| (d.file, d.offset()));
                let files = project
                    .files
                    .iter()
                    .map(|f| (trellis_dsl::canonical(&f.path), f.text.clone()))
                    .collect();
                (files, warnings)
            }
            Err(diags) => {
                let files = diags
                    .files()
                    .iter()
                    .map(|f| (trellis_dsl::canonical(&f.path), f.text.clone()))
                    .collect();
                (files, diags.iter().cloned().collect())
            }
        };
        let indexes: Vec<LineIndex> = files.iter().map(|(_, t)| LineIndex::new(t)).collect();
        for d in &diags {
            let (file, diagnostic) = match d.file.and_then(|f| files.get(f).map(|x| (f, x))) {
                Some((id, (path, text))) => (
                    path.clone(),
                    to_lsp(d, text, &indexes[id], &files, &indexes),
                ),
                // Nothing to point at (an unreadable path, an empty directory): shown at the
                // top of every open buffer of the project.
                None => {
                    for path in self.buffers.keys().filter(|p| p.starts_with(project)) {
                        out.entry(path.clone())
                            .or_default()
                            .push(lsp_types::Diagnostic {
                                range: Range::default(),
                                severity: Some(severity(d)),
                                code: Some(NumberOrString::String(d.code_str().to_string())),
                                source: Some("trellis".into()),
                                message: message(d),
                                ..Default::default()
                            });
                    }
                    continue;
                }
            };
            out.entry(file).or_default().push(diagnostic);
        }
        out
    }

    fn project_files(&self, project: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = walkdir::WalkDir::new(project)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_file() && e.path().extension().is_some_and(|x| x == "kdl"))
            .map(|e| trellis_dsl::canonical(e.path()))
            .collect();
        for path in self.buffers.keys() {
            if path.starts_with(project) && !files.contains(path) {
                files.push(path.clone());
            }
        }
        files.sort();
        files
    }

    /// The text of a file: its buffer when open, else what is on disk.
    fn view(&self, path: &Path) -> Option<FileView> {
        let key = trellis_dsl::canonical(path);
        let text: Arc<str> = match self.buffers.get(&key) {
            Some(b) => b.text.clone(),
            None => Arc::from(std::fs::read_to_string(&key).ok()?),
        };
        Some(FileView::new(text))
    }

    /// The views of every file of `path`'s project and the index of their ids.
    fn project_index(&self, path: &Path) -> (HashMap<PathBuf, FileView>, Index) {
        let project = self.project_of(&trellis_dsl::canonical(path));
        let mut views = HashMap::new();
        let mut index = Index::default();
        for file in self.project_files(&project) {
            if let Some(view) = self.view(&file) {
                index.add_file(&file, &view.nodes, &self.config.protocols);
                views.insert(file, view);
            }
        }
        (views, index)
    }

    fn request(&self, request: Request) -> Response {
        let id = request.id.clone();
        let result = match request.method.as_str() {
            req::Completion::METHOD => self.with_params(request, |s, p| s.completion(p)),
            req::HoverRequest::METHOD => self.with_params(request, |s, p| s.hover(p)),
            req::GotoDefinition::METHOD => self.with_params(request, |s, p| s.definition(p)),
            req::References::METHOD => self.with_params(request, |s, p| s.references(p)),
            req::Rename::METHOD => self.with_params(request, |s, p| s.rename(p)),
            req::PrepareRenameRequest::METHOD => {
                self.with_params(request, |s, p| s.prepare_rename(p))
            }
            req::DocumentSymbolRequest::METHOD => self.with_params(request, |s, p| s.symbols(p)),
            req::Formatting::METHOD => self.with_params(request, |s, p| s.format(p)),
            _ => {
                return Response::new_err(
                    id,
                    ErrorCode::MethodNotFound as i32,
                    format!("`{}` is not supported", request.method),
                );
            }
        };
        match result {
            Ok(value) => Response::new_ok(id, value),
            Err(message) => Response::new_err(id, ErrorCode::InvalidParams as i32, message),
        }
    }

    fn with_params<P: serde::de::DeserializeOwned, R: serde::Serialize>(
        &self,
        request: Request,
        f: impl FnOnce(&Self, P) -> Result<R, String>,
    ) -> Result<serde_json::Value, String> {
        let params: P = serde_json::from_value(request.params)
            .map_err(|e| format!("invalid parameters for `{}`: {e}", request.method))?;
        let result = f(self, params)?;
        serde_json::to_value(result).map_err(|e| e.to_string())
    }

    fn completion(&self, p: CompletionParams) -> Result<Option<CompletionResponse>, String> {
        let pos = p.text_document_position;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        let protocols = &self.config.protocols;
        let mut items = Vec::new();
        match analysis::place(&view.nodes, &view.text, offset) {
            Place::NodeName { parent, chain } => {
                let specs: Vec<&'static lang::NodeSpec> = match parent {
                    None => lang::top_level().to_vec(),
                    Some(parent) => {
                        let chain_specs = analysis::specs_of(&chain, protocols);
                        if chain_specs.len() < chain.len() {
                            Vec::new()
                        } else {
                            match chain_specs.last() {
                                Some(spec) => analysis::child_specs(parent, spec, protocols),
                                None => Vec::new(),
                            }
                        }
                    }
                };
                for spec in specs {
                    items.push(CompletionItem {
                        label: spec.name.to_string(),
                        kind: Some(CompletionItemKind::KEYWORD),
                        detail: Some(spec.usage()),
                        documentation: Some(Documentation::String(spec.help.to_string())),
                        ..Default::default()
                    });
                }
            }
            Place::Entry { node, chain } => {
                let specs = analysis::specs_of(&chain, protocols);
                if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                    let written: HashSet<&str> = node
                        .entries
                        .iter()
                        .filter_map(|e| e.key.as_ref().map(|(k, _)| k.as_str()))
                        .collect();
                    // `expect ` with nothing after it yet: the inline criteria.
                    let at_first = node
                        .arg(0)
                        .is_none_or(|a| a.span.start <= offset && offset <= a.span.end);
                    if spec.name == "expect" && at_first {
                        for criterion in spec.child_specs() {
                            items.push(CompletionItem {
                                label: criterion.name.to_string(),
                                kind: Some(CompletionItemKind::KEYWORD),
                                detail: Some(criterion.usage()),
                                documentation: Some(Documentation::String(
                                    criterion.help.to_string(),
                                )),
                                ..Default::default()
                            });
                        }
                    }
                    for (name, help, ty) in analysis::property_names(node, spec, protocols) {
                        if written.contains(name) {
                            continue;
                        }
                        items.push(CompletionItem {
                            label: format!("{name}="),
                            kind: Some(CompletionItemKind::PROPERTY),
                            detail: Some(ty.describe()),
                            documentation: Some(Documentation::String(help.to_string())),
                            insert_text: Some(format!("{name}=")),
                            ..Default::default()
                        });
                    }
                }
            }
            Place::Value { node, chain, value } => {
                let before = &view.text[value.content.start.min(offset)..offset];
                if let Some(open) = before.rfind("{{")
                    && !before[open..].contains("}}")
                {
                    items = template_items(&chain, &before[open + 2..], offset);
                } else {
                    let specs = analysis::specs_of(&chain, protocols);
                    if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                        let ty = analysis::value_type(node, spec, value, protocols);
                        let (_, index) = self.project_index(&path);
                        items = value_items(&chain, value, spec.name, ty, &index, protocols, &path);
                    }
                }
            }
        }
        Ok(Some(CompletionResponse::Array(items)))
    }

    fn hover(&self, p: HoverParams) -> Result<Option<Hover>, String> {
        let pos = p.text_document_position_params;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        let protocols = &self.config.protocols;
        let chain = syntax::chain(&view.nodes, offset);
        let Some(&node) = chain.last() else {
            return Ok(None);
        };
        let specs = analysis::specs_of(&chain, protocols);
        let markdown = |value: String, span: std::ops::Range<usize>| Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value,
            }),
            range: Some(view.lines.range(&view.text, span)),
        };
        if node.name_span.start <= offset && offset <= node.name_span.end {
            if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                return Ok(Some(markdown(
                    analysis::describe(spec, Some(node), protocols),
                    node.name_span.clone(),
                )));
            }
            return Ok(None);
        }
        for entry in &node.entries {
            if let Some((key, span)) = &entry.key
                && span.start <= offset
                && offset <= span.end
                && let (Some(spec), true) = (specs.last(), specs.len() == chain.len())
            {
                let found = analysis::property_names(node, spec, protocols)
                    .into_iter()
                    .find(|(name, _, _)| name == key);
                if let Some((name, help, ty)) = found {
                    return Ok(Some(markdown(
                        format!("`{name}=`: {}\n\n{help}", ty.describe()),
                        span.clone(),
                    )));
                }
            }
            let Some(value) = &entry.value else { continue };
            if !(value.span.start <= offset && offset <= value.span.end) {
                continue;
            }
            // The criterion of an inline `expect reply …`.
            if let (Some(spec), true) = (specs.last(), specs.len() == chain.len())
                && spec.name == "expect"
                && node.arg(0).is_some_and(|a| a.span == value.span)
                && let Some(criterion) = spec.child(&value.text)
            {
                return Ok(Some(markdown(
                    analysis::describe(criterion, None, protocols),
                    value.span.clone(),
                )));
            }
            // A template variable.
            let inner = &view.text[value.content.clone()];
            let at = offset.saturating_sub(value.content.start);
            if let Some(var) = template_var_at(inner, at) {
                let text = template_origin(&chain, &var);
                return Ok(Some(markdown(text, value.span.clone())));
            }
            let (views, index) = self.project_index(&path);
            if let Some((kind, id)) = index.at(&trellis_dsl::canonical(&path), offset) {
                let Some(def) = index
                    .defs
                    .get(&(kind.clone(), id.clone()))
                    .and_then(|d| d.first())
                else {
                    return Ok(Some(markdown(
                        format!("{kind} `{id}`: not defined in this project"),
                        value.span.clone(),
                    )));
                };
                let head = views
                    .get(&def.file)
                    .map(|v| {
                        let text = &v.text[def.node.clone()];
                        text.lines().next().unwrap_or_default().to_string()
                    })
                    .unwrap_or_default();
                let place = views
                    .get(&def.file)
                    .map(|v| v.lines.position(&v.text, def.node.start))
                    .map(|p| format!("{}:{}", def.file.display(), p.line + 1))
                    .unwrap_or_default();
                return Ok(Some(markdown(
                    format!("```kdl\n{head}\n```\n{kind} `{id}`, defined at {place}"),
                    value.span.clone(),
                )));
            }
        }
        Ok(None)
    }

    fn definition(
        &self,
        p: GotoDefinitionParams,
    ) -> Result<Option<GotoDefinitionResponse>, String> {
        let pos = p.text_document_position_params;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let (views, index) = self.project_index(&path);
        let file = trellis_dsl::canonical(&path);
        let Some(view) = views.get(&file) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        // `include "PATH"`: the file.
        let chain = syntax::chain(&view.nodes, offset);
        if let Some(node) = chain
            .first()
            .filter(|n| n.name == "include" && chain.len() == 1)
            && let Some(arg) = node.arg(0)
            && arg.span.start <= offset
            && offset <= arg.span.end
        {
            let target = file.parent().unwrap_or(Path::new("/")).join(&arg.text);
            return Ok(to_uri(&target)
                .map(|uri| GotoDefinitionResponse::Scalar(Location::new(uri, Range::default()))));
        }
        let Some(key) = index.at(&file, offset) else {
            return Ok(None);
        };
        let locations: Vec<Location> = index
            .defs
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|o| location(&views, &o.file, o.content.clone()))
            .collect();
        Ok(Some(GotoDefinitionResponse::Array(locations)))
    }

    fn references(&self, p: ReferenceParams) -> Result<Option<Vec<Location>>, String> {
        let pos = p.text_document_position;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let (views, index) = self.project_index(&path);
        let file = trellis_dsl::canonical(&path);
        let Some(view) = views.get(&file) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        // On an `include`: every include of the same file.
        let included = index
            .includes
            .iter()
            .find(|(_, o)| o.file == file && o.content.start <= offset && offset <= o.content.end);
        if let Some((target, _)) = included {
            return Ok(Some(
                index
                    .includes
                    .iter()
                    .filter(|(t, _)| t == target)
                    .filter_map(|(_, o)| location(&views, &o.file, o.content.clone()))
                    .collect(),
            ));
        }
        let Some(key) = index.at(&file, offset) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        if p.context.include_declaration {
            out.extend(index.defs.get(&key).into_iter().flatten().cloned());
        }
        out.extend(index.refs.get(&key).into_iter().flatten().cloned());
        Ok(Some(
            out.iter()
                .filter_map(|o| location(&views, &o.file, o.content.clone()))
                .collect(),
        ))
    }

    fn prepare_rename(
        &self,
        p: TextDocumentPositionParams,
    ) -> Result<Option<PrepareRenameResponse>, String> {
        let Some(path) = to_path(&p.text_document.uri) else {
            return Ok(None);
        };
        let (views, index) = self.project_index(&path);
        let file = trellis_dsl::canonical(&path);
        let Some(view) = views.get(&file) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, p.position);
        let Some(key) = index.at(&file, offset) else {
            return Err("only the id of an agent, persona, tool, provider, judge, panel, simulator or scenario can be renamed".into());
        };
        let occurrence = index
            .defs
            .get(&key)
            .into_iter()
            .chain(index.refs.get(&key))
            .flatten()
            .find(|o| o.file == file && o.content.start <= offset && offset <= o.content.end);
        Ok(occurrence
            .map(|o| PrepareRenameResponse::Range(view.lines.range(&view.text, o.content.clone()))))
    }

    fn rename(&self, p: RenameParams) -> Result<Option<WorkspaceEdit>, String> {
        let pos = p.text_document_position;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        if p.new_name.is_empty() || p.new_name.contains(['"', '\\', '\n', '/']) {
            return Err(format!(
                "`{}` cannot be an id: ids are written in quotes and hold no `\"`, `\\`, `/` or newline",
                p.new_name
            ));
        }
        let (views, index) = self.project_index(&path);
        let file = trellis_dsl::canonical(&path);
        let Some(view) = views.get(&file) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        let Some(key) = index.at(&file, offset) else {
            return Ok(None);
        };
        if index
            .defs
            .contains_key(&(key.0.clone(), p.new_name.clone()))
        {
            return Err(format!(
                "the project already has a {} `{}`",
                key.0, p.new_name
            ));
        }
        let mut changes: HashMap<Url, Vec<TextEdit>> = HashMap::new();
        for o in index
            .defs
            .get(&key)
            .into_iter()
            .chain(index.refs.get(&key))
            .flatten()
        {
            if let Some(loc) = location(&views, &o.file, o.content.clone()) {
                changes
                    .entry(loc.uri)
                    .or_default()
                    .push(TextEdit::new(loc.range, p.new_name.clone()));
            }
        }
        Ok(Some(WorkspaceEdit {
            changes: Some(changes),
            ..Default::default()
        }))
    }

    /// `trellis fmt` of the buffer: one edit replacing the whole text, none when it is
    /// already formatted or does not parse (its diagnostics say why).
    fn format(&self, p: DocumentFormattingParams) -> Result<Option<Vec<TextEdit>>, String> {
        let Some(path) = to_path(&p.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let file = trellis_dsl::SourceFile {
            name: path.display().to_string(),
            path,
            text: view.text.clone(),
        };
        match trellis_dsl::format::format_source(&file) {
            Ok((text, _)) if text != *view.text => {
                let end = view.lines.position(&view.text, view.text.len());
                Ok(Some(vec![TextEdit::new(
                    Range::new(Position::new(0, 0), end),
                    text,
                )]))
            }
            Ok(_) | Err(trellis_dsl::format::FormatError::Invalid(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn symbols(&self, p: DocumentSymbolParams) -> Result<Option<DocumentSymbolResponse>, String> {
        let Some(path) = to_path(&p.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let symbols = view
            .nodes
            .iter()
            .filter(|n| !n.commented && lang::top(&n.name).is_some())
            .filter_map(|n| symbol(n, &view, 0))
            .collect();
        Ok(Some(DocumentSymbolResponse::Nested(symbols)))
    }
}

#[allow(deprecated)] // `DocumentSymbol::deprecated` must still be written.
fn symbol(node: &Node, view: &FileView, depth: usize) -> Option<DocumentSymbol> {
    let kind = match node.name.as_str() {
        "suite" => SymbolKind::MODULE,
        "scenario" => SymbolKind::CLASS,
        "branch" => SymbolKind::METHOD,
        "agent" => SymbolKind::INTERFACE,
        "tool" => SymbolKind::FUNCTION,
        "persona" | "provider" | "judge" | "panel" | "simulator" => SymbolKind::OBJECT,
        "include" => SymbolKind::FILE,
        _ => return None,
    };
    let name = node
        .arg(0)
        .map(|a| a.text.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| node.name.clone());
    let children: Vec<DocumentSymbol> = if depth < 64 {
        node.children()
            .filter(|c| matches!(c.name.as_str(), "branch" | "tool"))
            .filter_map(|c| symbol(c, view, depth + 1))
            .collect()
    } else {
        Vec::new()
    };
    Some(DocumentSymbol {
        name,
        detail: Some(node.name.clone()),
        kind,
        tags: None,
        deprecated: None,
        range: view.lines.range(&view.text, node.span.clone()),
        selection_range: view.lines.range(
            &view.text,
            node.arg(0)
                .map_or(node.name_span.clone(), |a| a.span.clone()),
        ),
        children: (!children.is_empty()).then_some(children),
    })
}

/// Completions for a value of type `ty` (ids, enumerated words, protocols, builtins, files).
fn value_items(
    chain: &[&Node],
    value: &crate::syntax::Value,
    node_name: &str,
    ty: Option<ValueType>,
    index: &Index,
    protocols: &[&'static ProtocolSpec],
    file: &Path,
) -> Vec<CompletionItem> {
    let word = |label: &str, detail: &str, kind: CompletionItemKind| CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail: Some(detail.to_string()),
        ..Default::default()
    };
    let mut items = Vec::new();
    let Some(node) = chain.last() else {
        return items;
    };
    match ty {
        Some(ValueType::Ref(kind)) => {
            let kinds: &[&str] = if kind == "judge" {
                &["judge", "panel"]
            } else {
                &[kind]
            };
            for k in kinds {
                for (id, _) in index.ids(k) {
                    items.push(word(id, k, CompletionItemKind::REFERENCE));
                }
            }
        }
        Some(ValueType::OneOf(words)) => {
            for w in words {
                items.push(word(w, "", CompletionItemKind::ENUM_MEMBER));
            }
        }
        Some(ValueType::Boolean) => {
            for w in ["#true", "#false"] {
                items.push(word(w, "", CompletionItemKind::KEYWORD));
            }
        }
        _ => {}
    }
    // Values the table types as plain strings but the loader knows: the setting's name is
    // its property's key, or the node's own name for a setting written as a child node.
    let setting = node
        .entries
        .iter()
        .find(|e| e.value.as_ref().is_some_and(|v| v.span == value.span))
        .and_then(|e| e.key.as_ref().map(|(k, _)| k.as_str()))
        .unwrap_or(node_name);
    // An agent declaration (a scenario's `agent "ID"` names one instead).
    if let Some(agent) = chain.first().filter(|n| n.name == "agent") {
        if setting == "protocol" {
            for p in protocols {
                items.push(CompletionItem {
                    label: p.name.to_string(),
                    kind: Some(CompletionItemKind::ENUM_MEMBER),
                    detail: Some("protocol".into()),
                    documentation: Some(Documentation::String(p.help.to_string())),
                    ..Default::default()
                });
            }
        }
        if setting == "builtin"
            && let Some(p) = analysis::protocol_of(agent, protocols)
        {
            for b in p.builtins {
                items.push(word(b, "builtin agent", CompletionItemKind::VALUE));
            }
        }
    }
    if node_name == "include" {
        let dir = file.parent().unwrap_or(Path::new("/"));
        for entry in walkdir::WalkDir::new(dir)
            .max_depth(4)
            .into_iter()
            .filter_map(Result::ok)
        {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "kdl")
                && trellis_dsl::canonical(p) != trellis_dsl::canonical(file)
                && let Ok(rel) = p.strip_prefix(dir)
            {
                items.push(word(
                    &rel.to_string_lossy(),
                    "file",
                    CompletionItemKind::FILE,
                ));
            }
        }
    }
    items.dedup_by(|a, b| a.label == b.label);
    items
}

/// Template variables in scope at a string of the scenario `chain` is in: `typed` is what
/// the template holds so far after its `{{`.
fn template_items(chain: &[&Node], typed: &str, _offset: usize) -> Vec<CompletionItem> {
    let typed = typed.trim_start();
    let scenario = chain.iter().find(|n| n.name == "scenario");
    let mut roots: Vec<(String, Vec<String>, &str)> = vec![
        ("env".into(), Vec::new(), "environment variables"),
        (
            "scenario".into(),
            ["id", "name", "description", "difficulty", "tags", "status"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            "the scenario",
        ),
    ];
    if let Some(s) = scenario {
        let keys = s
            .children()
            .filter(|c| c.name == "user-context")
            .flat_map(|c| c.children().map(|k| k.name.clone()))
            .collect();
        roots.push(("user_context".into(), keys, "the scenario's `user-context`"));
        let mut vars = Vec::new();
        captures(s, &mut vars, 0);
        roots.push(("vars".into(), vars, "values captured by `capture`"));
        if s.setting("persona").is_some() {
            roots.push((
                "persona".into(),
                ["id", "type", "description", "instructions"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                "the scenario's persona",
            ));
        }
    }
    let mut items = Vec::new();
    if let Some((root, _)) = typed.rsplit_once('.').filter(|(r, _)| !r.contains(' ')) {
        if let Some((_, names, _)) = roots.iter().find(|(r, _, _)| r == root.trim()) {
            for n in names {
                items.push(CompletionItem {
                    label: n.clone(),
                    kind: Some(CompletionItemKind::FIELD),
                    detail: Some(format!("{root}.{n}")),
                    ..Default::default()
                });
            }
        }
        return items;
    }
    for (root, _, help) in roots {
        items.push(CompletionItem {
            label: root,
            kind: Some(CompletionItemKind::VARIABLE),
            detail: Some(help.to_string()),
            ..Default::default()
        });
    }
    items
}

fn captures(node: &Node, out: &mut Vec<String>, depth: usize) {
    for c in node.children() {
        if c.name == "capture"
            && let Some(name) = c.arg(0)
        {
            out.push(name.text.clone());
        }
        if depth < 64 && c.name == "branch" {
            captures(c, out, depth + 1);
        }
    }
}

/// The dotted variable (`user_context.order_id`) of a template around byte `at` of `text`.
fn template_var_at(text: &str, at: usize) -> Option<String> {
    let at = at.min(text.len());
    let open = text[..at].rfind("{{")?;
    if text[open..at].contains("}}") {
        return None;
    }
    let is_var = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    let start = text[..at]
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_var(*c))
        .last()
        .map_or(at, |(i, _)| i);
    let end = text[at..]
        .char_indices()
        .find(|(_, c)| !is_var(*c))
        .map_or(text.len(), |(i, _)| at + i);
    let var = text[start..end].trim_matches('.');
    (!var.is_empty()).then(|| var.to_string())
}

/// Where a template variable's value comes from, for a hover.
fn template_origin(chain: &[&Node], var: &str) -> String {
    let (root, rest) = var.split_once('.').unwrap_or((var, ""));
    match root {
        "user_context" => format!(
            "`{var}`: the scenario's `user-context`{}",
            if rest.is_empty() {
                String::new()
            } else {
                format!(" key `{rest}`")
            }
        ),
        "vars" => {
            let scenario = chain.iter().find(|n| n.name == "scenario");
            let mut names = Vec::new();
            if let Some(s) = scenario {
                captures(s, &mut names, 0);
            }
            if names.iter().any(|n| n == rest) {
                format!("`{var}`: captured by `capture \"{rest}\"` earlier in the conversation")
            } else {
                format!(
                    "`{var}`: a value captured by `capture`; no `capture \"{rest}\"` in this scenario"
                )
            }
        }
        "env" => {
            format!("`{var}`: the environment variable `{rest}` of the process running Trellis")
        }
        "scenario" => format!("`{var}`: the scenario's `{rest}`"),
        "persona" => format!("`{var}`: the scenario's persona's `{rest}`"),
        _ => format!("`{var}`"),
    }
}

fn location(
    views: &HashMap<PathBuf, FileView>,
    file: &Path,
    span: std::ops::Range<usize>,
) -> Option<Location> {
    let view = views.get(file)?;
    Some(Location::new(
        to_uri(file)?,
        view.lines.range(&view.text, span),
    ))
}

fn send_diagnostics(
    connection: &Connection,
    file: &Path,
    diagnostics: Vec<lsp_types::Diagnostic>,
) -> Result<(), crate::Error> {
    let Some(uri) = to_uri(file) else {
        return Ok(());
    };
    let params = PublishDiagnosticsParams::new(uri, diagnostics, None);
    connection
        .sender
        .send(Message::Notification(Notification::new(
            notif::PublishDiagnostics::METHOD.to_string(),
            params,
        )))?;
    Ok(())
}

fn severity(d: &DslDiagnostic) -> DiagnosticSeverity {
    if d.kind == trellis_dsl::diagnostics::Kind::Note {
        DiagnosticSeverity::INFORMATION
    } else if d.is_warning() {
        DiagnosticSeverity::WARNING
    } else {
        DiagnosticSeverity::ERROR
    }
}

/// The message as `trellis check` prints it, with its help line.
fn message(d: &DslDiagnostic) -> String {
    match d.help_text() {
        Some(help) => format!("{}\nhelp: {help}", d.message),
        None => d.message.clone(),
    }
}

fn to_lsp(
    d: &DslDiagnostic,
    text: &str,
    lines: &LineIndex,
    files: &[(PathBuf, Arc<str>)],
    indexes: &[LineIndex],
) -> lsp_types::Diagnostic {
    let labels = d.labels();
    let range = labels
        .first()
        .map(|l| lines.range(text, l.offset()..l.offset() + l.len()))
        .unwrap_or_default();
    let mut message = message(d);
    if let Some(label) = labels.first().and_then(|l| l.label()) {
        message = format!("{message}\n({label})");
    }
    let mut related = Vec::new();
    if let Some((path, _)) = d.file.and_then(|f| files.get(f)) {
        for l in labels.iter().skip(1) {
            if let Some(uri) = to_uri(path) {
                related.push(DiagnosticRelatedInformation {
                    location: Location::new(
                        uri,
                        lines.range(text, l.offset()..l.offset() + l.len()),
                    ),
                    message: l.label().unwrap_or_default().to_string(),
                });
            }
        }
    }
    for r in d.related_diagnostics() {
        let Some(id) = r.file else { continue };
        let (Some((path, rtext)), Some(rlines)) = (files.get(id), indexes.get(id)) else {
            continue;
        };
        if let (Some(l), Some(uri)) = (r.labels().first(), to_uri(path)) {
            related.push(DiagnosticRelatedInformation {
                location: Location::new(uri, rlines.range(rtext, l.offset()..l.offset() + l.len())),
                message: r.message.clone(),
            });
        }
    }
    lsp_types::Diagnostic {
        range,
        severity: Some(severity(d)),
        code: Some(NumberOrString::String(d.code_str().to_string())),
        source: Some("trellis".into()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        ..Default::default()
    }
}

/// The directory of suites a file is loaded with: going up from the file's directory while
/// the parent still holds `.kdl` files and stays inside a workspace root (as `trellis run
/// suites/` loads `suites/shared/agents.kdl` with the rest).
pub fn project_dir(file: &Path, roots: &[PathBuf]) -> PathBuf {
    let Some(mut dir) = file.parent().map(Path::to_path_buf) else {
        return PathBuf::from("/");
    };
    let inside_root = |d: &Path| roots.iter().any(|r| d.starts_with(r));
    while let Some(parent) = dir.parent() {
        if !inside_root(parent) || !has_kdl(parent) {
            break;
        }
        dir = parent.to_path_buf();
    }
    dir
}

fn has_kdl(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|e| e.path().extension().is_some_and(|x| x == "kdl"))
    })
}

/// Answers `shutdown`, then waits for `exit`: a second `shutdown` is answered again (some
/// editors send one when the server is stopped and another when they quit), anything else
/// is refused as the protocol says, and a client that goes away instead of sending `exit`
/// is a clean stop too.
fn shut_down(connection: &Connection, id: RequestId) -> Result<(), crate::Error> {
    connection.sender.send(Message::Response(Response::new_ok(
        id,
        serde_json::Value::Null,
    )))?;
    while let Ok(message) = connection.receiver.recv() {
        match message {
            Message::Notification(n) if n.method == notif::Exit::METHOD => break,
            Message::Request(r) if r.method == req::Shutdown::METHOD => {
                connection.sender.send(Message::Response(Response::new_ok(
                    r.id,
                    serde_json::Value::Null,
                )))?;
            }
            Message::Request(r) => {
                connection.sender.send(Message::Response(Response::new_err(
                    r.id,
                    ErrorCode::InvalidRequest as i32,
                    "the server is shutting down".into(),
                )))?;
            }
            Message::Notification(_) | Message::Response(_) => {}
        }
    }
    Ok(())
}

pub fn to_path(uri: &Url) -> Option<PathBuf> {
    uri.to_file_path().ok()
}

fn to_uri(path: &Path) -> Option<Url> {
    Url::from_file_path(path).ok()
}

pub fn error_response(id: RequestId, message: String) -> Response {
    Response::new_err(id, ErrorCode::InternalError as i32, message)
}
