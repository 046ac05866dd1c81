//! What the editor shows as problems: the loader's diagnostics (and `check`'s warnings) of a
//! project, turned into LSP diagnostics per file with their labels, hints and notes.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsp_server::{Connection, Message, Notification};
use lsp_types::notification::{self as notif, Notification as _};
use lsp_types::*;
use trellis_dsl::Diagnostic as DslDiagnostic;

use crate::server::{Server, to_uri};
use crate::text::LineIndex;

impl Server {
    /// Everything `trellis check DIR` reports for the project, by file (every `.kdl` file of
    /// the project is listed, most with no diagnostics, so fixed problems are cleared).
    pub fn check(&mut self, project: &Path) -> HashMap<PathBuf, Vec<lsp_types::Diagnostic>> {
        let mut out: HashMap<PathBuf, Vec<lsp_types::Diagnostic>> = HashMap::new();
        for file in self.project_files(project) {
            out.entry(file).or_default();
        }
        let overlay = self.overlay();
        let cache = self.load_caches.entry(project.to_path_buf()).or_default();
        let loaded = trellis_dsl::load_cached(&[project], &self.config.protocols, overlay, cache);
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
                // With `check`'s warnings of the files the errors leave whole, as `check`
                // prints them: every problem at once.
                let all = diags.iter().chain(diags.warnings()).cloned().collect();
                (files, all)
            }
        };
        // Every file the project loaded, an include outside its directory too: its entry
        // clears what an earlier check said there, and tells the server which projects an
        // edit of it makes stale.
        for (path, _) in &files {
            out.entry(path.clone()).or_default();
        }
        // Made for the files a diagnostic points into, when it first does: most files of a
        // large project have none, and indexing every one on every keystroke was a tenth
        // of a check.
        let indexes = Indexes {
            files: &files,
            made: files.iter().map(|_| OnceCell::new()).collect(),
        };
        // The loader reads a file without its byte order mark; an editor that keeps the mark
        // in the buffer it sent counts it as the first line's first column.
        let marked: Vec<bool> = files
            .iter()
            .map(|(path, _)| {
                self.buffers
                    .get(path)
                    .is_some_and(|b| b.text.starts_with(crate::server::BOM))
            })
            .collect();
        for d in &diags {
            let (file, diagnostic) = match d.file.and_then(|f| files.get(f)) {
                Some((path, _)) => (path.clone(), to_lsp(d, &files, &indexes, &marked)),
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
            // A problem that involves another file (an id declared there too) is shown there
            // as well: the file being edited may be either, and an editor shows a file's
            // own diagnostics only (the duplicate just typed went unmarked in its buffer).
            for r in d.related_diagnostics() {
                let Some(id) = r.file.filter(|&id| Some(id) != d.file) else {
                    continue;
                };
                let (Some((path, _)), Some((text, lines))) = (files.get(id), indexes.get(id))
                else {
                    continue;
                };
                let Some(label) = r.labels().first().cloned() else {
                    continue;
                };
                let mut mirrored = diagnostic.clone();
                mirrored.range = label_range(lines, text, &label, marked.get(id) == Some(&true));
                mirrored.message = format!("{}\n({})", message(d), r.message);
                mirrored.related_information = to_uri(&file).map(|uri| {
                    vec![DiagnosticRelatedInformation {
                        location: Location::new(uri, diagnostic.range),
                        message: d.message.clone(),
                    }]
                });
                out.entry(path.clone()).or_default().push(mirrored);
            }
            out.entry(file).or_default().push(diagnostic);
        }
        out
    }
}

pub(crate) fn send_diagnostics(
    connection: &Connection,
    file: &Path,
    diagnostics: Vec<lsp_types::Diagnostic>,
    version: Option<i32>,
) -> Result<(), crate::Error> {
    let Some(uri) = to_uri(file) else {
        return Ok(());
    };
    let params = PublishDiagnosticsParams::new(uri, diagnostics, version);
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

/// Where `label` lies in the editor's buffer of `text`: one column later on the first line
/// when the buffer starts with a byte order mark (`marked`) that the loader's text does not
/// have.
fn label_range(lines: &LineIndex, text: &str, label: &miette::LabeledSpan, marked: bool) -> Range {
    let mut range = lines.range(text, label.offset()..label.offset() + label.len());
    if marked {
        for position in [&mut range.start, &mut range.end] {
            if position.line == 0 {
                position.character += 1;
            }
        }
    }
    range
}

/// The line index of each file of a check, made when first asked for.
struct Indexes<'a> {
    files: &'a [(PathBuf, Arc<str>)],
    made: Vec<OnceCell<LineIndex>>,
}

impl Indexes<'_> {
    /// File `id`'s text and line index.
    fn get(&self, id: usize) -> Option<(&str, &LineIndex)> {
        let (_, text) = self.files.get(id)?;
        let lines = self.made.get(id)?.get_or_init(|| LineIndex::new(text));
        Some((text, lines))
    }
}

fn to_lsp(
    d: &DslDiagnostic,
    files: &[(PathBuf, Arc<str>)],
    indexes: &Indexes,
    marked: &[bool],
) -> lsp_types::Diagnostic {
    let labels = d.labels();
    let is_marked = |file: usize| marked.get(file) == Some(&true);
    let own_mark = d.file.is_some_and(is_marked);
    let own = d.file.and_then(|f| indexes.get(f));
    let range = labels
        .first()
        .zip(own)
        .map(|(l, (text, lines))| label_range(lines, text, l, own_mark))
        .unwrap_or_default();
    let mut message = message(d);
    if let Some(label) = labels.first().and_then(|l| l.label()) {
        message = format!("{message}\n({label})");
    }
    let mut related = Vec::new();
    if let (Some((path, _)), Some((text, lines))) = (d.file.and_then(|f| files.get(f)), own) {
        for l in labels.iter().skip(1) {
            if let Some(uri) = to_uri(path) {
                related.push(DiagnosticRelatedInformation {
                    location: Location::new(uri, label_range(lines, text, l, own_mark)),
                    message: l.label().unwrap_or_default().to_string(),
                });
            }
        }
    }
    for r in d.related_diagnostics() {
        let Some(id) = r.file else { continue };
        let (Some((path, _)), Some((rtext, rlines))) = (files.get(id), indexes.get(id)) else {
            continue;
        };
        if let (Some(l), Some(uri)) = (r.labels().first(), to_uri(path)) {
            related.push(DiagnosticRelatedInformation {
                location: Location::new(uri, label_range(rlines, rtext, l, is_marked(id))),
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
