//! The server loop: open buffers, the project each belongs to, and which handler answers
//! each request (`features.rs`; diagnostics in `diagnostics.rs`).
//!
//! A project is the directory of suites a buffer would be loaded with (see
//! [`project_dir`]); its diagnostics come from the loader itself
//! ([`trellis_dsl::load_cached`], open buffers winning over the files on disk) plus the
//! warnings `trellis check` adds, so the editor shows exactly what `check` prints. Edits that
//! arrive together are read before the project is checked again, so typing fast costs one
//! check, not one per keystroke.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{self as notif, Notification as _};
use lsp_types::request::{self as req, Request as _};
use lsp_types::*;
use trellis_dsl::lang::ProtocolSpec;
use trellis_dsl::{Diagnostic as DslDiagnostic, Project};

use crate::analysis::{FileIndex, Index};
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

/// The byte order mark an editor on Windows may start a file with.
pub(crate) const BOM: &str = "\u{feff}";

pub(crate) struct Buffer {
    pub(crate) text: Arc<str>,
    /// The editor's version of the text, sent back with its diagnostics.
    pub(crate) version: i32,
}

/// One file's text, its forgiving tree and its line index.
pub(crate) struct FileView {
    pub(crate) text: Arc<str>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) lines: LineIndex,
}

/// Whether two texts are the same: the same buffer, or equal.
fn same_text(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
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

/// A position in a document, with the project around it ([`Server::project_at`]).
pub(crate) struct ProjectAt {
    pub(crate) views: Rc<HashMap<PathBuf, Rc<FileView>>>,
    pub(crate) index: Rc<Index>,
    /// The document, as the index names it.
    pub(crate) file: PathBuf,
    pub(crate) offset: usize,
}

/// The views and index of a project's files, and the texts they were made from.
struct ProjectViews {
    project: PathBuf,
    texts: Vec<(PathBuf, Arc<str>)>,
    views: Rc<HashMap<PathBuf, Rc<FileView>>>,
    index: Rc<Index>,
}

impl ProjectViews {
    /// Whether these views were made from `texts` of `project`'s files.
    fn made_from(&self, project: &Path, texts: &[(PathBuf, Arc<str>)]) -> bool {
        self.project == project
            && self.texts.len() == texts.len()
            && self
                .texts
                .iter()
                .zip(texts)
                .all(|((a, at), (b, bt))| a == b && same_text(at, bt))
    }
}

pub struct Server {
    pub(crate) config: Config,
    roots: Vec<PathBuf>,
    pub(crate) buffers: HashMap<PathBuf, Buffer>,
    /// Projects whose diagnostics are stale.
    dirty: BTreeSet<PathBuf>,
    /// The files each project's last check published diagnostics for (to clear them).
    published: HashMap<PathBuf, HashSet<PathBuf>>,
    /// What was last sent for each file, and for which version of its buffer: a check that
    /// finds the same for a file the edit did not touch sends nothing for it.
    sent: HashMap<PathBuf, (Option<i32>, Vec<lsp_types::Diagnostic>)>,
    /// The last project whose files a request read ([`Server::project_index`]): hovers,
    /// definitions and references between two edits parse nothing again. Each read every
    /// file of the project, parsed it and indexed it: 100 ms a hover in a 1.5 MB suite.
    project_views: RefCell<Option<ProjectViews>>,
    /// Per project, its files as the last check loaded them: a keystroke parses and decodes
    /// again only the files that changed (`trellis_dsl::load_cached`).
    pub(crate) load_caches: HashMap<PathBuf, trellis_dsl::LoadCache>,
}

/// How a session with a client ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown`, then `exit` (or the client closed its end after `shutdown`).
    Exited,
    /// `exit` without `shutdown` first: the protocol asks for exit code 1.
    ExitedWithoutShutdown,
    /// The client closed its end without either.
    Closed,
}

impl Server {
    pub fn new(config: Config, roots: Vec<PathBuf>) -> Self {
        Server {
            config,
            roots,
            buffers: HashMap::new(),
            dirty: BTreeSet::new(),
            published: HashMap::new(),
            sent: HashMap::new(),
            project_views: RefCell::new(None),
            load_caches: HashMap::new(),
        }
    }

    /// Serves until the client says `exit`, or closes its end.
    pub fn run(&mut self, connection: &Connection) -> Result<Ended, crate::Error> {
        while let Ok(message) = connection.receiver.recv() {
            if let Some(ended) = self.handle(connection, message)? {
                return Ok(ended);
            }
            // Everything already sent is read before checking again.
            while let Ok(message) = connection.receiver.try_recv() {
                if let Some(ended) = self.handle(connection, message)? {
                    return Ok(ended);
                }
            }
            self.publish(connection)?;
        }
        Ok(Ended::Closed)
    }

    /// Handles one message; how the server ended, when it should stop.
    fn handle(
        &mut self,
        connection: &Connection,
        message: Message,
    ) -> Result<Option<Ended>, crate::Error> {
        match message {
            Message::Request(request) => {
                if request.method == req::Shutdown::METHOD {
                    shut_down(connection, request.id)?;
                    return Ok(Some(Ended::Exited));
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
            // The protocol's exit code for an exit the client did not shut down first is 1.
            Message::Notification(n) if n.method == notif::Exit::METHOD => {
                return Ok(Some(Ended::ExitedWithoutShutdown));
            }
            Message::Notification(n) => self.notification(n),
            Message::Response(_) => {}
        }
        Ok(None)
    }

    fn notification(&mut self, n: Notification) {
        match n.method.as_str() {
            notif::DidOpenTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<DidOpenTextDocumentParams>(n.params)
                    && let Some(path) = to_path(&p.text_document.uri)
                {
                    self.set_buffer(path, p.text_document.text, p.text_document.version);
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
                    self.set_buffer(path, text, p.text_document.version);
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

    fn set_buffer(&mut self, path: PathBuf, text: String, version: i32) {
        let key = trellis_dsl::canonical(&path);
        self.dirty.insert(self.project_of(&key));
        // Projects that include the file from outside its directory are stale too.
        let including: Vec<PathBuf> = self
            .published
            .iter()
            .filter(|(_, files)| files.contains(&key))
            .map(|(project, _)| project.clone())
            .collect();
        self.dirty.extend(including);
        self.buffers.insert(
            key,
            Buffer {
                text: Arc::from(text),
                version,
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
                self.sent.remove(gone);
                crate::diagnostics::send_diagnostics(connection, gone, Vec::new(), None)?;
            }
            for (file, diags) in by_file {
                let version = self.buffers.get(&file).map(|b| b.version);
                let last = (version, diags);
                if self.sent.get(&file) == Some(&last) {
                    continue;
                }
                crate::diagnostics::send_diagnostics(connection, &file, last.1.clone(), version)?;
                self.sent.insert(file, last);
            }
        }
        Ok(())
    }

    pub(crate) fn overlay(&self) -> HashMap<PathBuf, Arc<str>> {
        self.buffers
            .iter()
            .map(|(path, b)| (path.clone(), b.text.clone()))
            .collect()
    }

    pub(crate) fn project_files(&self, project: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = walkdir::WalkDir::new(project)
            .follow_links(true)
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
        // A file linked into the project and also in it is one file.
        files.dedup();
        files
    }

    /// The view of a file: its buffer when open, else what is on disk; the last project's
    /// when it was made from the same text.
    pub(crate) fn view(&self, path: &Path) -> Option<Rc<FileView>> {
        let key = trellis_dsl::canonical(path);
        let text = self.text(&key)?;
        if let Some(last) = self.project_views.borrow().as_ref()
            && let Some(view) = last.views.get(&key)
            && same_text(&view.text, &text)
        {
            return Some(view.clone());
        }
        Some(Rc::new(FileView::new(text)))
    }

    /// The text of the file at canonical path `key`: its buffer when open, else what is on
    /// disk.
    fn text(&self, key: &Path) -> Option<Arc<str>> {
        match self.buffers.get(key) {
            Some(b) => Some(b.text.clone()),
            // A file the editor has not opened, as editors show it once opened: without the
            // byte order mark, which they do not count as a column (nor does the loader).
            None => {
                let text = std::fs::read_to_string(key).ok()?;
                Some(Arc::from(text.strip_prefix(BOM).unwrap_or(&text)))
            }
        }
    }

    /// The views of every file of `path`'s project and the index of their ids: those of the
    /// last request when no file of the project changed since (its buffers, and what is on
    /// disk, read again to know); otherwise a new index over the last views of the files
    /// that did not change and new views of those that did.
    pub(crate) fn project_index(
        &self,
        path: &Path,
    ) -> (Rc<HashMap<PathBuf, Rc<FileView>>>, Rc<Index>) {
        let project = self.project_of(&trellis_dsl::canonical(path));
        let texts: Vec<(PathBuf, Arc<str>)> = self
            .project_files(&project)
            .into_iter()
            .filter_map(|file| self.text(&file).map(|text| (file, text)))
            .collect();
        if let Some(last) = self.project_views.borrow().as_ref()
            && last.made_from(&project, &texts)
        {
            return (last.views.clone(), last.index.clone());
        }
        // The files whose text did not change keep their views and their indexes: after a
        // keystroke only the edited file is parsed and indexed again.
        let last = self.project_views.borrow_mut().take();
        let mut views = HashMap::new();
        let mut files = Vec::new();
        for (file, text) in &texts {
            let kept = last.as_ref().and_then(|last| {
                let view = last.views.get(file)?;
                let part = last.index.part(file)?;
                same_text(&view.text, text).then(|| (view.clone(), part.clone()))
            });
            let (view, part) = kept.unwrap_or_else(|| {
                let view = Rc::new(FileView::new(text.clone()));
                let part = Rc::new(FileIndex::of(file, &view.nodes, &self.config.protocols));
                (view, part)
            });
            files.push((file.clone(), part));
            views.insert(file.clone(), view);
        }
        drop(last);
        let (views, index) = (Rc::new(views), Rc::new(Index::new(files)));
        *self.project_views.borrow_mut() = Some(ProjectViews {
            project,
            texts,
            views: views.clone(),
            index: index.clone(),
        });
        (views, index)
    }

    /// The project of the document at `path`, and the byte offset of `position` in it;
    /// `None` when the document cannot be read.
    pub(crate) fn project_at(&self, path: &Path, position: Position) -> Option<ProjectAt> {
        let (views, index) = self.project_index(path);
        let file = trellis_dsl::canonical(path);
        let view = views.get(&file)?;
        let offset = view.lines.offset(&view.text, position);
        Some(ProjectAt {
            views,
            index,
            file,
            offset,
        })
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
            // Not `Response::new_ok`, which serialises its result into a `Value` again: a
            // second copy of every answer (the outline of 20,000 scenarios took twice as long).
            Ok(value) => Response {
                id,
                response_result: Ok(value),
            },
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

pub(crate) fn to_uri(path: &Path) -> Option<Url> {
    Url::from_file_path(path).ok()
}

pub fn error_response(id: RequestId, message: String) -> Response {
    Response::new_err(id, ErrorCode::InternalError as i32, message)
}
