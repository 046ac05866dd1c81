//! Finding and reading suite files: directories walked for `*.kdl`, `include`s followed
//! relative to the including file (each file loaded once, cycles reported), and each file
//! parsed through `depth::parse_each` and handed to the decoder node by node.

use super::*;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::{Condvar, Mutex};

/// KDL syntax errors reported per file; more are counted in one last diagnostic.
pub(super) const MAX_SYNTAX_ERRORS: usize = 20;

/// Reads files and decodes them as they are parsed, one top-level node at a time (see
/// `depth::parse_each`), so no whole-file parse tree is ever kept.
#[derive(Default)]
pub(super) struct Loader {
    pub(super) files: Vec<SourceFile>,
    /// What each file that parsed declares, in file order.
    pub(super) decoded: Vec<FileItems>,
    /// The decoder's diagnostics and findings, kept apart from the loader's so they come in
    /// the same order as when all files were decoded after loading.
    pub(super) decode_diags: Vec<Diagnostic>,
    pub(super) info: LoadInfo,
    pub(super) by_canonical: HashMap<PathBuf, FileId>,
    /// Files being loaded (outermost first), to detect include cycles.
    pub(super) stack: Vec<(PathBuf, FileId)>,
    pub(super) diags: Vec<Diagnostic>,
    pub(super) broken: bool,
    /// Texts that win over the files on disk, by canonical path (an editor's unsaved
    /// buffers); a path here exists even when no file does yet.
    pub(super) overlay: HashMap<PathBuf, Arc<str>>,
    /// The last load's files, when the caller keeps them (`load_cached`).
    pub(super) cache: Option<CacheRun>,
    /// Files with no nodes ([`crate::model::Project::empty_files`]).
    pub(super) empty_files: Vec<FileId>,
}

impl Loader {
    pub(super) fn load_root(&mut self, path: &Path) {
        let name = display_name(path);
        if self.overlay.contains_key(&canonical(path)) {
            self.load_file(path, name);
            return;
        }
        let (mut found, mut problems) = suite_files(path);
        // A directory not created yet, holding an editor's unsaved buffers, is read as theirs.
        let unsaved_dir = !path.exists() && {
            let dir = canonical(path);
            self.overlay.keys().any(|b| b.starts_with(&dir))
        };
        if path.is_dir() || unsaved_dir {
            // Unsaved buffers of new files under the directory belong to it too.
            let dir = canonical(path);
            for buffer in self.overlay.keys() {
                if buffer.starts_with(&dir)
                    && buffer.extension().is_some_and(|e| e == "kdl")
                    && !found.iter().any(|p| canonical(p) == *buffer)
                {
                    found.push(buffer.clone());
                }
            }
            found.sort();
            if !found.is_empty() {
                problems
                    .retain(|d| d.kind != Kind::NoSuite && !(unsaved_dir && d.kind == Kind::Io));
            }
        }
        self.diags.extend(problems);
        if found.len() < 2 {
            for p in found {
                let name = display_name(&p);
                self.load_file(&p, name);
            }
            return;
        }
        // The directory's files are read and parsed ahead, on other threads, while this one
        // decodes them in order: parsing is most of loading, and a thread per file (as
        // `depth::parse_each` starts) costs more than parsing a small file.
        let overlay = self.overlay.clone();
        let known = self.cache.as_ref().map(CacheRun::texts).unwrap_or_default();
        let queue = AheadQueue::new(found.len());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..PARSE_AHEAD_THREADS)
                .filter_map(|_| {
                    let (tx, queue, found) = (tx.clone(), &queue, &found);
                    let (overlay, known) = (&overlay, &known);
                    std::thread::Builder::new()
                        .name("kdl-parse".into())
                        .stack_size(depth::SMALL_STACK)
                        .spawn_scoped(scope, move || {
                            while let Some(i) = queue.take() {
                                let read = std::panic::catch_unwind(|| {
                                    read_ahead(&found[i], overlay, known)
                                });
                                // Every file taken is answered, `None` when its read
                                // panicked, so the loader never waits on one for good.
                                if tx.send((i, read.ok().flatten())).is_err() {
                                    break;
                                }
                            }
                        })
                        .ok()
                })
                .collect();
            // Only the threads' senders are left: once they are all gone, nothing more
            // comes, and a file not read ahead is read and parsed here.
            drop(tx);
            // Closed however this loop ends (a panic included): the threads then stop
            // instead of waiting, and the scope can join them.
            let _close = CloseOnDrop(&queue);
            let mut arrived = HashMap::new();
            for (i, p) in found.iter().enumerate() {
                let read = loop {
                    if let Some(read) = arrived.remove(&i) {
                        break read;
                    }
                    match rx.recv() {
                        Ok((j, read)) => {
                            arrived.insert(j, read);
                        }
                        Err(_) => break None,
                    }
                };
                queue.consumed(i + 1);
                self.load_read(p, display_name(p), read);
            }
            drop(_close);
            drop(rx);
            for thread in threads {
                // A parser that panicked left its files to be parsed here, where the panic
                // is reported as a refusal; it does not end the load.
                let _ = thread.join();
            }
        });
    }

    pub(super) fn load_file(&mut self, path: &Path, name: String) {
        self.load_read(path, name, None);
    }

    /// A file that is not UTF-8: said where its first such byte is, on the file's text as
    /// far as it can be shown, and not parsed.
    fn not_utf8(&mut self, path: &Path, canonical: PathBuf, name: String) {
        use std::io::Read as _;
        let bytes = match fs::File::open(path).and_then(|file| {
            let mut bytes = Vec::new();
            file.take(MAX_SUITE_BYTES).read_to_end(&mut bytes)?;
            Ok(bytes)
        }) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.diags.push(Diagnostic::new(
                    Kind::Io,
                    format!("cannot read `{name}`: {e}"),
                ));
                return;
            }
        };
        let (at, len) = match std::str::from_utf8(&bytes) {
            Ok(_) => (0, 0),
            Err(e) => (e.valid_up_to(), e.error_len().unwrap_or(1)),
        };
        let shown: String = bytes[at..(at + len).min(bytes.len())]
            .iter()
            .map(|b| format!("\\x{b:02x}"))
            .collect();
        // The valid prefix is the same text in the lossy copy: the span points into it.
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let id = self.files.len();
        self.files.push(SourceFile::new(
            path.to_path_buf(),
            name.clone(),
            Arc::from(text.as_str()),
        ));
        self.by_canonical.insert(canonical, id);
        self.broken = true;
        let d = Diagnostic::at(
            Kind::Io,
            format!("cannot read `{name}`: it is not UTF-8 text (byte {shown})"),
            id,
            &self.files[id],
            SourceSpan::new(at.into(), 1),
            "not UTF-8",
        )
        .with_help(
            "suite files are UTF-8; re-save the file as UTF-8 (a Latin-1 `é` is the byte \\xe9)",
        );
        self.diags.push(d);
    }

    /// Loads `path`, with its text and parse when a thread read them ahead.
    fn load_read(&mut self, path: &Path, name: String, ahead: Option<ReadAhead>) {
        let canonical = canonical(path);
        if self.by_canonical.contains_key(&canonical) {
            return;
        }
        let (read, parsed_ahead) = match ahead {
            Some(ReadAhead { text, parsed }) => (Ok(text), parsed),
            None => (
                match self.overlay.get(&canonical) {
                    Some(text) => Ok(text.to_string()),
                    None => read_suite_text(path),
                },
                None,
            ),
        };
        let text = match read {
            Ok(t) => without_bom(t),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                self.not_utf8(path, canonical, name);
                return;
            }
            Err(e) => {
                self.diags.push(Diagnostic::new(
                    Kind::Io,
                    format!("cannot read `{name}`: {e}"),
                ));
                return;
            }
        };
        let id = self.files.len();
        let kept = self
            .cache
            .as_mut()
            .and_then(|c| c.take(&canonical, path, &name, id, &text));
        let decoded = match kept {
            Some((file, decoded)) => {
                self.files.push(file);
                self.by_canonical.insert(canonical.clone(), id);
                decoded
            }
            None => {
                self.files.push(SourceFile::new(
                    path.to_path_buf(),
                    name,
                    Arc::from(text.as_str()),
                ));
                self.by_canonical.insert(canonical.clone(), id);
                drop(text);
                let Some((decoded, parsed)) = self.decode(id, parsed_ahead) else {
                    return;
                };
                if parsed && let Some(cache) = &mut self.cache {
                    cache.keep(
                        canonical.clone(),
                        self.files[id].clone(),
                        id,
                        decoded.clone(),
                    );
                }
                decoded
            }
        };

        // An empty file (or one of comments only): a file just created in an editor, or
        // the wrong file. A warning on that file, not an error of the project: a new empty
        // file stopped every rerun of `trellis watch`, and the LSP put its error on another
        // file. Alone, it leaves no scenario, which is an error of its own.
        if decoded.nodes == 0 {
            self.empty_files.push(id);
        }
        let Decoded {
            items,
            includes,
            diags,
            info,
            nodes: _,
        } = decoded;
        self.decode_diags.extend(diags);
        self.info.absorb(info);
        // Decoded before what it includes, as the files are numbered.
        self.decoded.push(items);
        self.stack.push((canonical, id));
        for node in &includes {
            self.include(id, node);
        }
        self.stack.pop();
    }

    /// Parses and decodes file `id`, with its parse when a thread made it ahead; `None` when
    /// the file is refused (reported). The flag says whether it parsed: a file with a syntax
    /// error is decoded as far as it parsed, and its syntax errors are reported here.
    fn decode(
        &mut self,
        id: FileId,
        parsed_ahead: Option<Result<(Vec<KdlDocument>, depth::Parsed), depth::TooDeep>>,
    ) -> Option<(Decoded, bool)> {
        // Through `depth::parse_each`: the parser recurses per block, comment piece and
        // syntax error, and a file beyond what it can take would abort the process instead
        // of getting a diagnostic; and a whole file's parse tree takes about 75 times its
        // size. Each node is decoded as soon as it is parsed. When a file does not parse, the
        // nodes that parsed on their own stay decoded, so their mistakes are reported with
        // its syntax errors (what the broken part may define is declared, which keeps
        // references to it from being reported: `unparsed_definitions`); when it parses only
        // as a whole, what they decoded is dropped and the whole is decoded instead.
        let fresh = || Decoded {
            items: FileItems {
                file: id,
                ..FileItems::default()
            },
            includes: Vec::new(),
            diags: Vec::new(),
            info: LoadInfo {
                protocols: self.info.protocols.clone(),
                ..LoadInfo::default()
            },
            nodes: 0,
        };
        let mut out = fresh();
        let files = &self.files;
        let mut each = |doc: KdlDocument| {
            out.nodes += doc.nodes().len();
            let mut decoder = Decoder::new(files, id, &mut out.diags, &mut out.info);
            decoder.nodes(&doc, &mut out.items, &mut out.includes);
            decoder.finish(&mut out.diags, &mut out.info);
        };
        let parsed = match parsed_ahead {
            Some(Ok((docs, parsed))) => {
                docs.into_iter().for_each(&mut each);
                Ok(parsed)
            }
            Some(Err(refused)) => Err(refused),
            None => depth::parse_each(&files[id].text, &mut each),
        };
        match parsed {
            Ok(depth::Parsed::Nodes) => Some((out, true)),
            // The parser accepted the whole although some node alone did not parse.
            Ok(depth::Parsed::Whole(Ok(doc))) => {
                let mut out = fresh();
                out.nodes = doc.nodes().len();
                let mut decoder = Decoder::new(&self.files, id, &mut out.diags, &mut out.info);
                decoder.nodes(&doc, &mut out.items, &mut out.includes);
                decoder.finish(&mut out.diags, &mut out.info);
                Some((out, true))
            }
            Ok(depth::Parsed::Whole(Err(err))) => {
                self.unparsed_definitions(id);
                self.diags
                    .extend(syntax_diagnostics(err, id, &self.files[id]));
                // Keep what parsed: its own mistakes are reported too.
                out.nodes = out.nodes.max(1);
                Some((out, false))
            }
            Err(refused) => {
                self.broken = true;
                let diag = refused_diagnostic(refused, id, &self.files[id]);
                self.diags.push(diag);
                None
            }
        }
    }

    /// What a file with a syntax error may define without it having decoded: each node
    /// that starts like a definition (`agent "ID"`, `tool "ID"`, `scenario "ID"`…, at the
    /// start of a line or after `;`, `{` or `}`, a type annotation or a comment allowed; a
    /// scenario's own `agent "ID"` reads alike, and is declared too, which only keeps quiet
    /// a report that might have been right) declares its id, so references to it are not
    /// reported undefined while references to anything else still are. Where that reading
    /// cannot be trusted, every definition is unknown, as for a missing include: an
    /// `include` anywhere in the file, or a definition whose id cannot be read whole (the
    /// error cut it, `agent "demo protocol="…`; a property or an unclosed comment where
    /// the id goes; a name run into punctuation, `agent("demo")`).
    fn unparsed_definitions(&mut self, id: FileId) {
        self.info.unparsed = true;
        let text = self.files[id].text.clone();
        // A node named `include` (not the word in a message): what it brings is unknown.
        if text.split(['\n', '\r', ';', '{', '}']).any(|segment| {
            let node = segment.trim_start();
            !node.starts_with("/-")
                && !node.starts_with("//")
                // Past a comment not closed on its line there is only comment.
                && past_comments_and_annotation(node).is_some_and(|node| {
                    node.strip_prefix("include").is_some_and(|rest| {
                        rest.is_empty() || rest.starts_with([' ', '\t', '"', '('])
                    }) || node.starts_with("\"include\"")
                })
        }) {
            self.broken = true;
            return;
        }
        for line in text.split(['\n', '\r']) {
            for (n, segment) in line.split([';', '{', '}']).enumerate() {
                // Where a top-level node is written: a definition there whose id cannot be
                // read leaves the file's definitions unknown. Elsewhere (a scenario's own
                // `agent`, an inline `persona type=…`) it defines nothing.
                let top_level = n == 0 && !line.starts_with(char::is_whitespace);
                match definition(segment) {
                    Definition::None => {}
                    Definition::Unreadable if top_level => {
                        self.broken = true;
                        return;
                    }
                    Definition::Unreadable => {}
                    Definition::Of(Some(kind), name) => self.info.declare(kind, name),
                    Definition::Of(None, name) => {
                        self.info.unparsed_scenarios.insert(name.to_owned());
                    }
                }
            }
        }
    }

    pub(super) fn include(&mut self, from: FileId, node: &KdlNode) {
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
        // A device or a pipe may be read (`/dev/stdin`); only what is not there is missing.
        let exists = target.exists() && !target.is_dir();
        if !exists && !self.overlay.contains_key(&canonical(&target)) {
            let diag = if target.is_dir() {
                Diagnostic::at(
                    Kind::MissingInclude,
                    format!("included path `{rel}` is a directory"),
                    from,
                    file,
                    arg.span(),
                    "a directory, not a file",
                )
                .with_help(format!(
                    "`include` takes one .kdl file; name a file in `{target_name}`, or pass \
                     the directory to the command (`trellis run DIR` loads every .kdl file in it)"
                ))
            } else {
                Diagnostic::at(
                    Kind::MissingInclude,
                    format!("included file `{rel}` not found"),
                    from,
                    file,
                    arg.span(),
                    "no such file",
                )
                .with_help({
                    // A near miss in the directory it looked in (`agnets.kdl`).
                    let near = target
                        .parent()
                        .zip(target.file_name().and_then(|n| n.to_str()))
                        .and_then(|(dir, wanted)| {
                            // Loadable files only, not the one that failed nor the one
                            // including it; a bounded look in a large directory.
                            let including = Path::new(&file.name).file_name();
                            let names: Vec<String> = std::fs::read_dir(dir)
                                .ok()?
                                .take(1000)
                                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                                .filter(|n| {
                                    n.ends_with(".kdl")
                                        && n != wanted
                                        && Some(std::ffi::OsStr::new(n)) != including
                                        && dir.join(n).is_file()
                                })
                                .collect();
                            crate::diagnostics::did_you_mean(
                                wanted,
                                names.iter().map(String::as_str),
                            )
                            .map(str::to_owned)
                        });
                    // Said, or the author fixes the path and meets a second wave of errors.
                    let unchecked = "; until it is found, no file's references to agents, \
                                     personas, scenarios and the other ids are checked (it \
                                     may define them)";
                    match near {
                        Some(name) => format!(
                            "did you mean `{}`? Include paths are relative to the including \
                             file{unchecked}",
                            Path::new(rel).with_file_name(name).display()
                        ),
                        None => format!(
                            "looked for `{target_name}`; include paths are relative to the \
                             including file{unchecked}"
                        ),
                    }
                })
            };
            self.diags.push(diag);
            // Its definitions are unknown, like those of an unparsable file.
            self.broken = true;
            return;
        }
        // A scenario file `trellis import` converts, included as if it were a suite: parsed
        // as KDL it was a wall of syntax errors.
        if Path::new(rel)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "json" | "yaml" | "yml"))
        {
            self.diags.push(
                Diagnostic::at(
                    Kind::NoSuite,
                    format!("included file `{rel}` is not a suite file: suites are written in KDL (`.kdl`)"),
                    from,
                    file,
                    arg.span(),
                    "not KDL",
                )
                .with_help(format!(
                    "a MultiAgentEval scenario file or Connexity test cases become a suite with \
                     `trellis import multiagent {target_name}` or `trellis import connexity \
                     {target_name}`; include the suite it writes"
                )),
            );
            self.broken = true;
            return;
        }
        let canonical = canonical(&target);
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

/// Threads that read and parse a directory's files ahead of their decoding.
const PARSE_AHEAD_THREADS: usize = 2;

/// How many files the threads may have taken past the last one decoded: enough to keep
/// both busy, few enough that a directory of thousands of files is never held parsed.
const PARSE_AHEAD_WINDOW: usize = 2 * PARSE_AHEAD_THREADS;

/// The files of a directory handed out to the parsing threads one at a time, in file
/// order. Handed out as they free up rather than dealt in turns: dealt, one thread drew
/// `suites/`'s two largest files and parsed two thirds of the text while the other waited.
struct AheadQueue {
    state: Mutex<AheadState>,
    changed: Condvar,
}

struct AheadState {
    /// The next file to hand out.
    next: usize,
    /// How many files the loader has decoded.
    consumed: usize,
    files: usize,
    closed: bool,
}

impl AheadQueue {
    fn new(files: usize) -> Self {
        AheadQueue {
            state: Mutex::new(AheadState {
                next: 0,
                consumed: 0,
                files,
                closed: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// The next file to read and parse, once it is within the window; `None` when every
    /// file was handed out or the loader is done.
    fn take(&self) -> Option<usize> {
        let mut state = self.state.lock().ok()?;
        loop {
            if state.closed || state.next >= state.files {
                return None;
            }
            if state.next < state.consumed + PARSE_AHEAD_WINDOW {
                state.next += 1;
                return Some(state.next - 1);
            }
            state = self.changed.wait(state).ok()?;
        }
    }

    /// The loader has decoded `count` files.
    fn consumed(&self, count: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.consumed = count;
        }
        self.changed.notify_all();
    }

    /// Nothing more is to be handed out.
    fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.closed = true;
        }
        self.changed.notify_all();
    }
}

/// Closes the queue when dropped.
struct CloseOnDrop<'a>(&'a AheadQueue);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A small file's text read ahead, and its parse (`depth::parse_small`); a parse that
/// panicked is left to the loader.
struct ReadAhead {
    text: String,
    parsed: Option<Result<(Vec<KdlDocument>, depth::Parsed), depth::TooDeep>>,
}

/// `None` when the file cannot be read (the loader reads it again and reports why) or is
/// larger than what is parsed ahead: the loader reads and parses a large file itself, node
/// by node, so that no more than one large text is held at a time.
fn read_ahead(
    path: &Path,
    overlay: &HashMap<PathBuf, Arc<str>>,
    known: &HashMap<PathBuf, Arc<str>>,
) -> Option<ReadAhead> {
    let canonical = (!overlay.is_empty() || !known.is_empty()).then(|| canonical(path));
    let buffer = canonical.as_ref().and_then(|c| overlay.get(c));
    let text = match buffer {
        Some(text) if text.len() <= depth::SMALL_TEXT => text.to_string(),
        Some(_) => return None,
        None if fs::metadata(path).ok()?.len() > depth::SMALL_TEXT as u64 => return None,
        None => read_suite_text(path).ok()?,
    };
    let text = without_bom(text);
    // The last load's decoding of this text is kept: the loader takes that instead.
    if canonical
        .and_then(|c| known.get(&c))
        .is_some_and(|k| **k == *text)
    {
        return Some(ReadAhead { text, parsed: None });
    }
    let parsed =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| depth::parse_small(&text)))
            .ok()
            .flatten();
    Some(ReadAhead { text, parsed })
}

/// The most a suite file may hold. A 10 MB suite checks in under half a second; a path that
/// never ends (`/dev/zero`, a FIFO fed forever) would otherwise be read until memory ran out.
pub(crate) const MAX_SUITE_BYTES: u64 = 64 << 20;

/// A suite file's text, as `fs::read_to_string` reads it, up to [`MAX_SUITE_BYTES`]: larger
/// is an error saying so. Devices and pipes (`/dev/stdin`) are read as files are.
pub(crate) fn read_suite_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let file = fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_SUITE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SUITE_BYTES {
        return Err(std::io::Error::other(format!(
            "it is larger than {} MiB, more than a suite file holds",
            MAX_SUITE_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A suite file's text without the byte order mark an editor on Windows may start it with:
/// editors do not count it as a column, so neither do the diagnostics.
fn without_bom(text: String) -> String {
    match text.strip_prefix(crate::dataset::BOM) {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// The path as the user wrote it, with `/` separators.
pub(crate) fn display_name(path: &Path) -> String {
    let s = path.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").map(str::to_string).unwrap_or(s)
}

/// Removes `.` and resolvable `..` components without touching the file system.
pub(crate) fn normalize(path: &Path) -> PathBuf {
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
pub(super) fn strip_common_dir(names: &[String]) -> Vec<String> {
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

/// The path with symlinks and `..` resolved; for a file that does not exist (yet), its
/// directory's canonical path joined with its name. The key of [`super::load_with_overlay`]'s
/// texts.
pub fn canonical(path: &Path) -> PathBuf {
    if let Ok(c) = fs::canonicalize(path) {
        return c;
    }
    let path = normalize(path);
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => match fs::canonicalize(dir) {
            Ok(dir) => dir.join(name),
            Err(_) => path,
        },
        _ => path,
    }
}

/// The suite files a path given on the command line stands for: the file itself, or every
/// `*.kdl` below a directory, symbolic links followed (sorted by name, as `run` and `check`
/// load them), with the
/// problems met on the way (a path that cannot be read, a directory without suite files).
pub fn suite_files(path: &Path) -> (Vec<PathBuf>, Vec<Diagnostic>) {
    let name = display_name(path);
    let mut found = Vec::new();
    let mut problems = Vec::new();
    match fs::metadata(path) {
        Err(e) => problems.push(
            Diagnostic::new(Kind::Io, format!("cannot read `{name}`: {e}")).with_help(
                if e.kind() == std::io::ErrorKind::NotFound {
                    // Most often the default `suites` of a directory not set up yet.
                    "give a `.kdl` suite file or a directory of them; `trellis init` writes \
                     an example project (`suites/`) to start from"
                } else {
                    "give a `.kdl` suite file or a directory of them"
                },
            ),
        ),
        Ok(meta) if meta.is_dir() => {
            // Linked files and directories are suite files like the others (a team's shared
            // suites linked in): skipping them would run less than was written, silently. A
            // file reached twice (by its link and by its place) is loaded once.
            let mut seen = std::collections::HashSet::new();
            // Hidden files and directories below it are not suites: an editor's local
            // history (`.history/`, with a copy of every file saved) or a backup would load
            // each suite twice, as duplicate ids.
            for entry in walkdir::WalkDir::new(path)
                .follow_links(true)
                .sort_by_file_name()
                .into_iter()
                .filter_entry(|e| {
                    e.depth() == 0 || !e.file_name().as_encoded_bytes().starts_with(b".")
                })
            {
                match entry {
                    Ok(entry) => {
                        let p = entry.path();
                        if entry.file_type().is_file()
                            && p.extension().is_some_and(|e| e == "kdl")
                            && !editor_lock(p)
                            && seen.insert(canonical(p))
                        {
                            found.push(p.to_path_buf());
                        }
                    }
                    Err(e) if e.path().is_some_and(editor_lock) => {}
                    Err(e) => problems.push(Diagnostic::new(
                        Kind::Io,
                        format!("cannot read directory `{name}`: {e}"),
                    )),
                }
            }
            if found.is_empty() {
                problems.push(
                    Diagnostic::new(Kind::NoSuite, format!("no .kdl files under `{name}`"))
                        .with_help(
                            "suite files end in `.kdl`; give a directory holding some, or the \
                             suite file itself",
                        ),
                );
            }
        }
        // A JSON or YAML file named as a suite is most often one of the scenario files
        // `trellis import` converts: parsed as KDL, it was a wall of syntax errors.
        Ok(_)
            if path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                matches!(e.to_ascii_lowercase().as_str(), "json" | "yaml" | "yml")
            }) =>
        {
            problems.push(
                Diagnostic::new(
                    Kind::NoSuite,
                    format!("`{name}` is not a suite file: suites are written in KDL (`.kdl`)"),
                )
                .with_help(format!(
                    "a MultiAgentEval scenario file or Connexity test cases become a suite with \
                     `trellis import multiagent {name}` or `trellis import connexity {name}`"
                )),
            );
        }
        Ok(_) => found.push(path.to_path_buf()),
    }
    (found, problems)
}

/// Whether `path` is an editor's lock on a file being edited, not a suite file: Emacs keeps
/// `.#NAME.kdl` (a symbolic link to nowhere) beside every buffer with unsaved changes, and
/// following it failed the whole directory while the user typed.
pub fn editor_lock(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(".#"))
}

/// The diagnostic of a file `depth` refuses to hand to the parser.
pub(crate) fn refused_diagnostic(
    refused: depth::TooDeep,
    id: FileId,
    file: &SourceFile,
) -> Diagnostic {
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
        depth::TooDeep::Slashdash { .. } => (
            "second `/-`",
            "a `/-` comments out the node, argument, property or block right after \
             it; remove one of the two"
                .to_string(),
        ),
        depth::TooDeep::Unclosed { .. } => (
            "this string",
            "a multi-line string starts with `\"\"\"` and a newline and ends with \
             `\"\"\"` alone on its last line, after spaces only (raw: `#\"\"\"` … \
             `\"\"\"#`); every line of it starts with those same spaces"
                .to_string(),
        ),
        depth::TooDeep::Node { .. } => (
            "this node",
            format!(
                "a top-level node takes at most {} KiB; split it into several",
                depth::MAX_NODE_SIZE / 1024
            ),
        ),
    };
    let span = SourceSpan::new(refused.offset().into(), usize::from(!file.text.is_empty()));
    Diagnostic::at(
        Kind::TooDeep,
        format!("cannot parse `{}`: {refused}", file.name),
        id,
        file,
        span,
        label,
    )
    .with_help(help)
}

/// Where the quoted string that starts at `start` in `text` closes (the index of its closing
/// `"`), reading `\\` escapes; `None` when the line ends first.
fn closing_quote(text: &str, start: usize) -> Option<usize> {
    let mut chars = text.get(start..)?.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '"' => return Some(start + i),
            '\n' => return None,
            _ => {}
        }
    }
    None
}

/// When the error at `start` is a quoted string closed early by a quote meant to be inside it
/// (text follows the closing quote directly, and the line holds another `"` after it): the
/// error's offset and the byte range of its line.
fn stray_quote(file: &SourceFile, start: usize) -> Option<(usize, Range<usize>)> {
    let text = &*file.text;
    if !text.get(start..)?.starts_with('"') || text[..start].ends_with('#') {
        return None;
    }
    let close = closing_quote(text, start)?;
    // The line from the file's line starts: the parser reports an error per piece of a
    // garbled line, and searching from each to its line's ends read a long line once per
    // error.
    let (_, line) = file.line_at(start);
    let line_end = file.line_at(close).1.end;
    let after = text.get(close + 1..line_end)?;
    let next = after.chars().next()?;
    let ends_value = next.is_whitespace() || matches!(next, ';' | '}' | '/' | ')');
    (!ends_value && after.contains('"')).then_some((start, line.start..line_end))
}

/// The diagnostics of a file that is not valid KDL: the parser's errors (the first
/// [`MAX_SYNTAX_ERRORS`], then how many more), each with a hint.
pub(crate) fn syntax_diagnostics(
    err: kdl::KdlError,
    id: FileId,
    file: &SourceFile,
) -> Vec<Diagnostic> {
    let text = &*file.text;
    let mut diags = Vec::new();
    // A `"` inside a quoted string (`"{{ x | default("y") }}"`) ends it early, and the
    // parser then reports every piece of the rest of the line and every `}` after it: one
    // error, named at the inner quote, stands for them.
    let stray: Vec<(usize, Range<usize>)> = err
        .diagnostics
        .iter()
        .filter_map(|d| stray_quote(file, d.span.offset()))
        .collect();
    // Looked up once per error: a file of thousands of such lines has thousands of strays
    // and more errors, and a scan of every stray per error took minutes.
    let stray_starts: HashSet<usize> = stray.iter().map(|(s, _)| *s).collect();
    let mut stray_lines: Vec<Range<usize>> = stray.iter().map(|(_, l)| l.clone()).collect();
    stray_lines.sort_by_key(|l| (l.start, l.end));
    let on_a_stray_line = |at: usize| {
        // Lines do not overlap: only the last one starting at or before `at` can hold it.
        let after = stray_lines.partition_point(|l| l.start <= at);
        after > 0 && stray_lines.get(after - 1).is_some_and(|l| l.contains(&at))
    };
    let errors: Vec<_> = err
        .diagnostics
        .into_iter()
        .filter(|d| {
            let at = d.span.offset();
            let cascade = d.message.as_deref().is_some_and(|m| {
                m.to_lowercase().contains("closing '}'") || m.contains("end of document")
            });
            // A block "not closed" before the quote is one the rest of the line was
            // read into, so brace errors anywhere go with it.
            let at_a_stray = stray_starts.contains(&at);
            stray.is_empty() || at_a_stray || (!cascade && !on_a_stray_line(at))
        })
        .collect();
    // A quoted string with an escape KDL does not know (`"\d+ rooms"`, a regex): the parser,
    // lost inside it, reports the rest of the string as more errors (`+ rooms`: "Expected
    // identifier string") and, having lost the nesting, blocks never closed and `}`s closing
    // nothing. One mistake: the string's error stands for those inside it, and brace errors
    // are kept only where the text's own braces say so.
    let mut bad_escapes: Vec<Range<usize>> = errors
        .iter()
        .filter_map(|d| {
            let at = d.span.offset();
            let snippet = text.get(at..at + d.span.len())?;
            (snippet.starts_with('"') && snippet.contains('\\'))
                .then(|| closing_quote(text, at).map(|close| at + 1..close + 1))
                .flatten()
        })
        .collect();
    // Strings do not overlap: sorted, only the last one starting at or before an offset can
    // hold it (a garbled file has thousands of errors and of strings).
    bad_escapes.sort_by_key(|r| r.start);
    bad_escapes.dedup();
    let in_a_bad_escape = |at: usize| {
        let after = bad_escapes.partition_point(|r| r.start <= at);
        after > 0 && bad_escapes.get(after - 1).is_some_and(|r| r.contains(&at))
    };
    let errors: Vec<_> = if bad_escapes.is_empty() {
        errors
    } else {
        let (unclosed, stray) = unmatched_braces(text);
        errors
            .into_iter()
            .filter(|d| {
                let at = d.span.offset();
                if in_a_bad_escape(at) {
                    return false;
                }
                let message = d.message.as_deref().unwrap_or_default();
                if message.starts_with("No closing '}'")
                    || message.starts_with("Closing '}' was not found")
                {
                    return unclosed.contains(&at);
                }
                if message.contains("end of document") {
                    return stray.contains(&at)
                        || !text.get(at..).is_some_and(|rest| rest.starts_with('}'));
                }
                true
            })
            .collect()
    };
    // `branch "x" { … } branch "y" { … }` on one line: KDL ends a node at a new line or
    // `;`, so the parser takes the second node for text after the document's end, then
    // reports the block around it never closed and that block's `}` closing nothing. One
    // mistake, said where it is: the node after the `}`.
    let after_brace: Vec<usize> = errors
        .iter()
        .filter(|d| {
            d.message
                .as_deref()
                .is_some_and(|m| m.contains("end of document"))
                && node_after_brace(text, d.span.offset())
        })
        .map(|d| d.span.offset())
        .collect();
    // The parser stops at such a node: every block open there is 'not closed' and every
    // `}` after it 'closes no block'. Which of them really are is what the text's own braces
    // say; those are kept (every error at once), the others dropped.
    let (really_unclosed, really_stray) = if after_brace.is_empty() {
        (HashSet::new(), HashSet::new())
    } else {
        let (unclosed, stray) = unmatched_braces(text);
        (HashSet::from_iter(unclosed), HashSet::from_iter(stray))
    };
    // Set against each error below, which may be one of thousands on a line.
    let first_after_brace = after_brace.iter().min().copied();
    let last_after_brace = after_brace.iter().max().copied();
    let errors: Vec<_> = errors
        .into_iter()
        .filter(|d| {
            let at = d.span.offset();
            let message = d.message.as_deref().unwrap_or_default();
            let unclosed_around = message.starts_with("No closing '}'")
                || message.starts_with("Closing '}' was not found");
            let closing_after = message.contains("end of document")
                && text.get(at..).is_some_and(|rest| rest.starts_with('}'));
            // Before some node after a `}` is before the last; after one, after the first.
            let cascade = (unclosed_around && last_after_brace.is_some_and(|p| at < p))
                || (closing_after && first_after_brace.is_some_and(|p| at > p));
            !cascade
                || (unclosed_around && really_unclosed.contains(&at))
                || (closing_after && really_stray.contains(&at))
        })
        .collect();
    // An unclosed block is reported twice by the parser ("No closing '}' for child
    // block", then "Closing '}' was not found after nodes"): one mistake, one error.
    let unclosed_block = errors.iter().any(|d| {
        d.message
            .as_deref()
            .is_some_and(|m| m.starts_with("No closing '}'"))
    });
    let errors: Vec<_> = errors
        .into_iter()
        .filter(|d| {
            !(unclosed_block
                && d.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("Closing '}' was not found")))
        })
        .collect();
    let mut said_stray = HashSet::new();
    let mut said_unclosed_comment = false;
    let unclosed = crate::depth::unclosed_comment(text);
    let found = errors.len();
    // The parser's error recovery can report one error per byte of a garbled
    // line, and each is shown with that line: past the first few they bury the
    // cause and make the report quadratic in the file's size.
    for d in errors.into_iter().take(MAX_SYNTAX_ERRORS) {
        if let Some(&(start, _)) = stray.iter().find(|(start, _)| *start == d.span.offset()) {
            // Said once, however many of the parser's errors start at that string.
            if !said_stray.insert(start) {
                continue;
            }
            let inner = closing_quote(text, start).unwrap_or(start);
            diags.push(
                Diagnostic::at(
                    Kind::Syntax,
                    "a `\"` inside a quoted string ends it",
                    id,
                    file,
                    SourceSpan::from(inner..inner + 1),
                    "this quote ends the string",
                )
                .with_help(
                    "write a quote inside a string as `\\\"`; in a template, use single quotes \
                     (`default('none')`); or write the whole value as a raw string: \
                     #\"… \"quoted\" …\"#",
                ),
            );
            continue;
        }
        if after_brace.contains(&d.span.offset()) {
            diags.push(
                Diagnostic::at(
                    Kind::Syntax,
                    "a node after a block's `}` on the same line needs a `;` before it",
                    id,
                    file,
                    d.span,
                    "this node follows `}` on its line",
                )
                .with_help(
                    "a KDL node ends at a new line or `;`: put `;` after the `}`, or start \
                     the next node on a line of its own",
                ),
            );
            continue;
        }
        let message = d.message.unwrap_or_else(|| "invalid KDL".to_string());
        // A `/*` never closed swallows the rest of the file: the parser reports the whole
        // file (or the value before it on its line); point at the comment instead.
        if let Some(open) = unclosed {
            let line_of = |at: usize| text.get(..at).map_or(0, |t| t.matches('\n').count());
            if message.contains("multi-line comment") || line_of(open) == line_of(d.span.offset()) {
                if std::mem::replace(&mut said_unclosed_comment, true) {
                    continue;
                }
                diags.push(
                    Diagnostic::at(
                        Kind::Syntax,
                        "a `/*` comment is never closed",
                        id,
                        file,
                        miette::SourceSpan::new(open.into(), 2),
                        "opened here",
                    )
                    .with_help(
                        "close it with `*/`; KDL comments nest, so each `/*` inside it needs \
                         its own `*/` too",
                    ),
                );
                continue;
            }
        }
        let label = match d.label.as_deref() {
            // The parser's own words for what it expected, as a person reads them.
            Some("not quoted string")
                if message == "Unexpected newline in single-line quoted string" =>
            {
                "this string is not closed on its line".to_string()
            }
            Some("not EOF") => "unexpected here".to_string(),
            Some("not property value") => "a value must follow `=`".to_string(),
            Some(other) => other.to_string(),
            None => "here".to_string(),
        };
        let snippet = text
            .get(d.span.offset()..d.span.offset() + d.span.len())
            .unwrap_or("");
        // KDL v1 wrote keywords bare and raw strings as r"…": in v2 these read as
        // identifiers, and the parser says only that one was expected.
        let rest = text.get(d.span.offset()..).unwrap_or("");
        let word: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        let v1_raw = rest.starts_with("r\"") || rest.starts_with("r#");
        let help = if snippet.starts_with('"') && snippet.contains('\\') {
            "a backslash starts an escape in a quoted KDL string (`\\d` is not one); write regexes as raw strings: #\"\\d+\"#".to_string()
        } else if matches!(word.as_str(), "true" | "false" | "null" | "inf" | "nan") {
            format!(
                "suite files are KDL v2, where `{word}` is written `#{word}` (KDL v1 wrote it \
                 bare)"
            )
        } else if v1_raw {
            "suite files are KDL v2, where a raw string is written #\"…\"# (KDL v1 wrote \
             r\"…\"): matches=#\"\\d+\"#"
                .to_string()
        } else if rest.starts_with('#') && rest[1..].starts_with(char::is_whitespace) {
            // `# a comment`, as in shell, YAML or TOML.
            "comments in KDL are `// …` to the end of the line or `/* … */`; `/-` before a \
             node comments the whole node out (`#` starts a keyword such as `#true`, or a raw \
             string)"
                .to_string()
        } else if let Some(raw) = rest.strip_prefix('#')
            && raw.trim_start_matches('#').starts_with('"')
            && !rest.lines().next().unwrap_or("").contains("\"#")
        {
            "this raw string is not closed: one opened with #\" ends with \"# (as many `#` \
             as it opened with): matches=#\"\\d+\"#"
                .to_string()
        } else if snippet.starts_with('}')
            || (message.contains("end of document") && rest.starts_with('}'))
        {
            "this `}` closes no block: remove it, or add the `{` it was meant to close".to_string()
        } else if message == "Unexpected newline in single-line quoted string" {
            "end the string with `\"` on its line; a string of several lines is written \
             between `\"\"\"` lines"
                .to_string()
        } else if message.to_lowercase().contains("closing '}'") {
            "a `{` opened a block that is never closed: add `}` after the block's last node"
                .to_string()
        } else {
            d.help
                .unwrap_or_else(|| "suite files are KDL v2 documents (https://kdl.dev)".into())
        };
        let unclosed_block_here = message.starts_with("No closing '}'");
        // Name the escape itself: "Expected quoted string" says nothing of a backslash.
        let (message, label, help) = match unknown_escape(snippet) {
            Some(escape) => {
                // The string as a raw string, when it reads as one: what to write instead.
                let raw = closing_quote(text, d.span.offset())
                    .and_then(|close| text.get(d.span.offset() + 1..close))
                    .filter(|body| !body.contains("\"#"))
                    .map_or_else(|| "#\"\\d+\"#".to_owned(), |body| format!("#\"{body}\"#"));
                (
                    format!("unknown escape `{escape}` in a quoted string"),
                    format!("`{escape}` here"),
                    format!(
                        "a backslash starts an escape in a quoted KDL string, and `{escape}` is \
                         not one; write a regex as a raw string, where a backslash is itself: \
                         {raw}"
                    ),
                )
            }
            None => (message, label, help),
        };
        let mut diag = Diagnostic::at(Kind::Syntax, message, id, file, d.span, label);
        // The parser names the outermost block left open, by count; the block missing its
        // `}` is often one inside it, whose `}` by count sits at another block's indentation.
        if unclosed_block_here && let Some((open, close)) = misindented_block(text, d.span.offset())
        {
            let line = text.get(..close).map_or(0, |t| t.matches('\n').count()) + 1;
            diag = diag.with_label(
                SourceSpan::from(open..open + 1),
                format!(
                    "perhaps this one: the `}}` that closes it by count (line {line}) is \
                     indented as another block's"
                ),
            );
        }
        diags.push(diag.with_help(help));
    }
    if found > MAX_SYNTAX_ERRORS {
        diags.push(
            Diagnostic::new(
                Kind::Syntax,
                format!(
                    "`{}`: {} more KDL syntax errors not shown",
                    file.name,
                    found - MAX_SYNTAX_ERRORS
                ),
            )
            .with_help("fix the first ones: the rest often follow from them"),
        );
    }
    diags
}

/// Inside the block opened at `outer`, the first block whose `{` and the `}` that closes it
/// (by count) start lines of different indentation, as offsets: in a file indented as
/// written, where the `}` that was left out belongs.
fn misindented_block(text: &str, outer: usize) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let indent = |at: usize| {
        let start = text
            .get(..at)
            .map_or(0, |t| t.rfind('\n').map_or(0, |n| n + 1));
        let line = text.get(start..at).unwrap_or("");
        let blanks = line.len() - line.trim_start().len();
        // A `}` after other text on its line says nothing of its block's indentation.
        (line.trim_start().is_empty() || bytes.get(at) == Some(&b'{')).then_some(blanks)
    };
    let mut open = Vec::new();
    let mut found = None;
    scan_braces(text, outer, |brace, at| {
        if brace == b'{' {
            open.push(at);
            return true;
        }
        let Some(o) = open.pop() else {
            // Past the block's end.
            return false;
        };
        if o != outer
            && let (Some(a), Some(c)) = (indent(o), indent(at))
            && a != c
        {
            found = Some((o, at));
            return false;
        }
        true
    });
    found
}

/// The first escape in a quoted string that KDL v2 does not define (`\d` in `"\d+"`): its
/// escapes are `\n \r \t \\ \" \b \f \s \u{…}` and a backslash before whitespace.
fn unknown_escape(quoted: &str) -> Option<String> {
    let body = quoted.strip_prefix('"')?;
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => match chars.next() {
                Some('n' | 'r' | 't' | '\\' | '"' | 'b' | 'f' | 's' | 'u') => {}
                Some(w) if w.is_whitespace() => {}
                Some(other) => return Some(format!("\\{other}")),
                None => return None,
            },
            _ => {}
        }
    }
    None
}

/// The text's braces, strings and comments skipped: the offsets of `{` never closed, and of
/// `}` that close no block. Rough where the parser is exact, but it goes on where the parser
/// stopped. Strings and comments are skipped as the nesting check reads them
/// (`crate::depth`); one the parser cannot close takes the rest of the text.
fn unmatched_braces(text: &str) -> (Vec<usize>, Vec<usize>) {
    let (mut open, mut stray) = (Vec::new(), Vec::new());
    scan_braces(text, 0, |brace, at| {
        if brace == b'{' {
            open.push(at);
        } else {
            stray.extend(open.pop().is_none().then_some(at));
        }
        true
    });
    (open, stray)
}

/// Calls `on` with each `{` and `}` of `text` from `from` on and its offset, strings and
/// comments skipped as the nesting check reads them (`crate::depth`), until it says `false`.
fn scan_braces(text: &str, from: usize, mut on: impl FnMut(u8, usize) -> bool) {
    let bytes = text.as_bytes();
    let mut i = from;
    while let Some(&b) = bytes.get(i) {
        let next = match b {
            b'{' | b'}' => {
                if !on(b, i) {
                    return;
                }
                Ok(i + 1)
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => Ok(crate::depth::skip_line(bytes, i)),
            b'/' if bytes.get(i + 1) == Some(&b'*') => crate::depth::skip_comment(bytes, i),
            b'"' => crate::depth::skip_quoted(bytes, i),
            b'#' => crate::depth::skip_raw(bytes, i),
            _ => Ok(i + 1),
        };
        i = next.unwrap_or(bytes.len()).max(i + 1);
    }
}

/// Whether a node starts at `at` on a line whose text before it ends with a block's `}`
/// (`… } branch "y" {`).
fn node_after_brace(text: &str, at: usize) -> bool {
    let Some((before, rest)) = text.get(..at).zip(text.get(at..)) else {
        return false;
    };
    // Only the blanks right before `at` are read, not its whole line: the parser reports
    // an error for each node of a line of thousands.
    let kept = before.trim_end_matches(|c: char| c.is_whitespace() && c != '\n');
    kept.ends_with('}')
        && kept.len() < before.len()
        && rest.starts_with(|c: char| c.is_alphanumeric() || c == '"' || c == '_' || c == '(')
}

/// What one node's text, as far as it goes, says it defines.
enum Definition<'t> {
    /// Not a definition (another node, a comment, a string's words).
    None,
    /// A definition (`Some` kind; `None` for a scenario) and its id.
    Of(Option<crate::validate::RefKind>, &'t str),
    /// A definition whose id cannot be read whole: the syntax error may have cut or
    /// swallowed it (a string never closed, or closed inside the id; one that swallowed a
    /// property, `"demo protocol="`; an escape), or something else stands where it goes (a
    /// property, an unclosed comment, punctuation run into the name, `agent("demo")`).
    Unreadable,
}

/// Reads `segment` (a line, or the part of one after `;`, `{` or `}`) as the start of a
/// node: `/-` and line comments define nothing; `/* … */` comments and a `(type)`
/// annotation before the name or the id are passed over; the name may be quoted.
fn definition(segment: &str) -> Definition<'_> {
    use crate::validate::RefKind;
    let node = segment.trim_start();
    if node.starts_with("/-") || node.starts_with("//") {
        return Definition::None;
    }
    // A comment not closed on its line: the rest of it is comment.
    let Some(node) = past_comments_and_annotation(node) else {
        return Definition::None;
    };
    let (keyword, rest) = match node.strip_prefix('"') {
        Some(quoted) => match quoted.split_once('"') {
            Some(split) => split,
            None => return Definition::None,
        },
        None => node.split_at(
            node.find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
                .unwrap_or(node.len()),
        ),
    };
    let kind = match keyword {
        "agent" => Some(RefKind::Agent),
        "persona" => Some(RefKind::Persona),
        "tool" => Some(RefKind::Tool),
        "provider" => Some(RefKind::Provider),
        "judge" | "panel" => Some(RefKind::Judge),
        "dataset" => Some(RefKind::Dataset),
        "scenario" => None,
        _ => return Definition::None,
    };
    match first_id(rest) {
        Some(id) => Definition::Of(kind, id),
        None => Definition::Unreadable,
    }
}

/// `text` past leading `/* … */` comments and one `(type)` annotation, trimmed; `None` when
/// a comment is not closed there.
fn past_comments_and_annotation(mut text: &str) -> Option<&str> {
    loop {
        text = text.trim_start();
        match text.strip_prefix("/*") {
            Some(comment) => text = comment.split_once("*/")?.1,
            None => break,
        }
    }
    if let Some(annotated) = text.strip_prefix('(')
        && let Some((_, after)) = annotated.split_once(')')
    {
        text = after;
    }
    Some(text.trim_start())
}

/// The id after a definition's name: a quoted string (raw `#"…"#` too) or a bare word,
/// ending where the node's next entry or its block begins; `None` when it cannot be read
/// whole.
fn first_id(rest: &str) -> Option<&str> {
    // The name ends at whitespace, a quote or an annotation: `agent# "x"` is not one.
    if !(rest.is_empty()
        || rest.starts_with(|c: char| c.is_whitespace() || matches!(c, '"' | '(' | '/')))
    {
        return None;
    }
    let rest = past_comments_and_annotation(rest)?;
    let ends_value = |after: &str| {
        after.is_empty()
            || after.starts_with(|c: char| c.is_whitespace() || matches!(c, ';' | '{' | '}'))
            || after.starts_with("//")
            || after.starts_with("/*")
    };
    let hashes = rest.bytes().take_while(|&b| b == b'#').count();
    if let Some(quoted) = rest[hashes..].strip_prefix('"') {
        let close = format!("\"{}", "#".repeat(hashes));
        return quoted.split_once(&close).and_then(|(id, after)| {
            (!id.is_empty() && !id.ends_with('=') && !id.contains('\\') && ends_value(after))
                .then_some(id)
        });
    }
    let word_end = rest
        .find(|c: char| c.is_whitespace() || matches!(c, '{' | '}' | ';'))
        .unwrap_or(rest.len());
    let word = &rest[..word_end];
    (!word.is_empty() && !word.contains(['=', '"', '\\', '(', ')', '#', '/'])).then_some(word)
}
