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
mod cache;
mod criteria;
mod decls;
mod include;
pub(crate) use include::read_suite_text;
mod json_path;
mod scenario;
mod steps;
mod tool;
mod values;
pub use values::url_problem;

use crate::lang::check::{self, Problem};
use crate::lang::{self, NodeSpec};

pub use cache::LoadCache;
use cache::{CacheRun, Decoded};
pub use include::canonical;
use include::*;
pub(crate) use include::{display_name, normalize, refused_diagnostic, syntax_diagnostics};
pub use include::{editor_lock, suite_files};
use scenario::*;
use values::*;
pub use values::{parse_duration, parse_size};

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
    load_with_overlay(paths, protocols, HashMap::new())
}

/// [`load`], reading the texts in `overlay` (keyed by [`canonical`] path) instead of the
/// files on disk: an editor's unsaved buffers, which win over what is saved. A buffer of a
/// file that does not exist yet is loaded too when it is named, included, or lies under a
/// directory that is loaded.
pub fn load_with_overlay<P: AsRef<Path>>(
    paths: &[P],
    protocols: &[&'static crate::lang::ProtocolSpec],
    overlay: HashMap<PathBuf, Arc<str>>,
) -> Result<Project, Diagnostics> {
    load_from(paths, protocols, overlay, None)
}

/// [`load_with_overlay`], taking the files that have not changed since the last load with
/// `cache` from it instead of parsing and decoding them again, and keeping this load's for
/// the next. The result is the same as without the cache: an editor or watch passes the
/// same cache on every load of one project.
pub fn load_cached<P: AsRef<Path>>(
    paths: &[P],
    protocols: &[&'static crate::lang::ProtocolSpec],
    overlay: HashMap<PathBuf, Arc<str>>,
    cache: &mut LoadCache,
) -> Result<Project, Diagnostics> {
    load_from(paths, protocols, overlay, Some(cache))
}

fn load_from<P: AsRef<Path>>(
    paths: &[P],
    protocols: &[&'static crate::lang::ProtocolSpec],
    overlay: HashMap<PathBuf, Arc<str>>,
    mut cache: Option<&mut LoadCache>,
) -> Result<Project, Diagnostics> {
    let mut loader = Loader {
        overlay,
        cache: cache.as_deref_mut().map(|c| CacheRun::start(c, protocols)),
        ..Loader::default()
    };
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
        cache: run,
        empty_files,
        ..
    } = loader;
    if let (Some(cache), Some(run)) = (cache, run) {
        run.finish(cache);
    }
    diags.extend(decode_diags);
    info.broken |= broken;

    // Nothing but files without nodes: the wrong file was given, an error (beside other
    // files, an empty one is a warning of `check`, see `validate::warnings`).
    let nothing_else = !empty_files.is_empty() && empty_files.len() == files.len();
    let mut project = assemble(files, decoded, &mut info, &mut diags);
    if nothing_else {
        diags.extend(validate::empty_files(&project, &empty_files, Kind::NoSuite));
    } else {
        project.empty_files = empty_files;
    }
    project.unplayed = std::mem::take(&mut info.unplayed);
    let mut column_warnings = Vec::new();
    let tables =
        crate::expand::read_datasets(&project, &mut info, &mut diags, &mut column_warnings);
    project.column_warnings = column_warnings;
    let (problems, env_reads) = validate::validate_reading_env(&project, &info);
    diags.extend(problems);
    project.env_reads = env_reads;
    // Validated as written (once per scenario, not per row), and expanded even when
    // something else is wrong, so that every problem is reported at once (a row or history
    // error used to show only once the rest was fixed). A dataset that could not be read has
    // no table: its scenarios expand to nothing and add no error of their own.
    crate::expand::expand(&mut project, &tables, &mut diags);
    drop(tables);

    if diags.is_empty() {
        Ok(project)
    } else {
        // Stable order: by file, then position; diagnostics without a file first.
        diags.sort_by_key(|d| (d.file.map_or(0, |f| f + 1), d.offset()));
        // What `check` would also warn about, said now rather than once the errors are
        // fixed; `env` as the process sees it, as `check` reads it.
        // Only those the errors cannot have caused: none in a file with an error (a check
        // refused there leaves its scenario "checking nothing"), and no undeclared tool (its
        // declaration may be what an error refused, in any file).
        let broken_files: HashSet<usize> = diags.iter().filter_map(|d| d.file).collect();
        let warnings = validate::warnings(&project, |name| std::env::var(name).ok())
            .into_iter()
            .filter(|w| w.file.is_none_or(|f| !broken_files.contains(&f)))
            .filter(|w| w.kind != Kind::UnknownTool)
            .collect();
        Err(Diagnostics::new(diags)
            .with_warnings(warnings)
            .with_files(project.files))
    }
}

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
#[derive(Clone, Default)]
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
    datasets: Vec<Dataset>,
    scenarios: Vec<Arc<Scenario>>,
}

struct Decoder<'f> {
    files: &'f [SourceFile],
    file: FileId,
    diags: Vec<Diagnostic>,
    /// Where this decoder's own diagnostics start in `diags`.
    first_diag: usize,
    info: LoadInfo,
}

/// Drops a "needs `NAME`" of a node that has, after its name and before anything ends it
/// (a line break, `;`, `{` or `}`), an unknown property answered with "did you mean
/// `NAME`?": one typo (`protcol=`) is one mistake, and the typo's diagnostic, pointing at
/// it, is the one that says what to do.
fn drop_missing_explained_by_typos(diags: &mut Vec<Diagnostic>, from: usize, text: &str) {
    let at = |d: &Diagnostic| d.labels().first().map(|l| l.offset());
    let typos: Vec<(usize, String)> = diags
        .get(from..)
        .unwrap_or_default()
        .iter()
        .filter(|d| d.kind == Kind::UnknownProperty)
        .filter_map(|d| {
            let meant = d
                .help_text()?
                .strip_prefix("did you mean `")?
                .split('`')
                .next()?
                .trim_end_matches('=')
                .to_owned();
            Some((at(d)?, meant))
        })
        .collect();
    if typos.is_empty() {
        return;
    }
    // The typo is a property of the node whose name the "needs" points at.
    let same_node = |name_at: usize, typo_at: usize| {
        typo_at > name_at
            && text
                .get(name_at..typo_at)
                .is_some_and(|between| !between.contains(['\n', '\r', ';', '{', '}']))
    };
    let mut index = 0;
    diags.retain(|d| {
        index += 1;
        if index <= from || d.kind != Kind::Missing {
            return true;
        }
        // "agent `demo` needs a `protocol`", "`latency` needs `max=…`".
        let Some(needed) = d
            .message
            .split_once(" needs ")
            .and_then(|(_, what)| what.split('`').nth(1))
            .map(|name| name.split('=').next().unwrap_or(name))
        else {
            return true;
        };
        let Some(name_at) = at(d) else {
            return true;
        };
        !typos
            .iter()
            .any(|(typo_at, meant)| meant == needed && same_node(name_at, *typo_at))
    });
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
            first_diag: diags.len(),
            diags: std::mem::take(diags),
            info: std::mem::take(info),
        }
    }

    fn finish(mut self, diags: &mut Vec<Diagnostic>, info: &mut LoadInfo) {
        let text = self.text();
        drop_missing_explained_by_typos(&mut self.diags, self.first_diag, text);
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
        let _ = self.check_props_of(v, spec);
    }

    /// Reports arguments past those `spec` takes.
    fn check_args_of(&mut self, v: &View, spec: &NodeSpec, usage: &str) {
        let node = self.node(v);
        let mut found = Vec::new();
        check::check_args(&node, spec, usage, &mut |p| found.push(p));
        found.into_iter().for_each(|p| self.problem(p));
    }

    /// Reports properties `spec` does not take, and properties given twice; whether there
    /// were any (what the node then lacks may be the misspelt one: not said again).
    fn check_props_of(&mut self, v: &View, spec: &NodeSpec) -> bool {
        let node = self.node(v);
        let mut found = Vec::new();
        check::check_props(&node, spec, &[], &mut |p| found.push(p));
        let any = !found.is_empty();
        found.into_iter().for_each(|p| self.problem(p));
        any
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
        self.check_args_several(v, max, usage, &|_| false);
    }

    /// [`Decoder::check_args`] of a node whose block has child nodes taking several values
    /// (`several` says which), offered when a property was given two.
    fn check_args_several(
        &mut self,
        v: &View,
        max: usize,
        usage: &str,
        several: &dyn Fn(&str) -> bool,
    ) {
        if let Some(extra) = v.args.get(max) {
            let entries: Vec<&KdlEntry> = v.args.iter().chain(&v.props).copied().collect();
            let p = check::unexpected_argument(v.name, max, extra.span(), usage, &entries, several);
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
                        match (min, cv.args.len()) {
                            (2, 1) => "a value after its name",
                            (2, _) => "a name and a value",
                            _ => "a value",
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

    /// A `rubric=` value. One word a typo away from a built-in rubric's name is an error:
    /// it would otherwise be sent to the judge as the rubric's own text (`connxity`).
    fn rubric(&mut self, e: &KdlEntry) -> Option<String> {
        let text = self.string(e)?;
        let word = text.trim();
        if word.contains(char::is_whitespace) || lang::decls::BUILT_IN_RUBRICS.contains(&word) {
            return Some(text);
        }
        // Stricter than a did-you-mean: a rubric of one word of its own (`politeness`) is
        // fine, so only a near miss (an edit per six letters, case and `-` aside) is one.
        let normal = word.to_lowercase().replace('-', "_");
        let most = (normal.chars().count() / 6).max(1);
        let Some(best) = lang::decls::BUILT_IN_RUBRICS
            .into_iter()
            .find(|name| strsim::osa_distance(&normal, name) <= most)
        else {
            return Some(text);
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("`{word}` is not a built-in rubric"),
                value_span(e),
                format!("did you mean `{best}`?"),
            )
            .with_help(format!(
                "one word names a built-in rubric ({}); a rubric of your own is its text, \
                 written as sentences",
                lang::decls::BUILT_IN_RUBRICS.join(", ")
            ));
        self.report(d);
        None
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
            let problem = if !is_header_name(&name) {
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
        project.datasets.extend(items.datasets);
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

/// An HTTP header name: an RFC 9110 token.
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
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
        assert_eq!(
            parse_duration("36500d"),
            Ok(Duration::from_secs(36_500 * 86_400))
        );
        assert_eq!(
            parse_duration("200000000000000d").unwrap_err(),
            "too large: at most 100 years"
        );
        assert!(parse_duration("2 fortnights ago").is_err());
        assert_eq!(
            parse_duration("2 minuts").unwrap_err(),
            "unknown unit `minuts`: did you mean `minutes` (`m`)? use `ms`, `s`, `m` or `h` \
             (also `us`, `ns`, `d`)"
        );
        assert_eq!(parse_duration("2 minutes"), Ok(Duration::from_secs(120)));
        assert_eq!(
            parse_duration("2S").unwrap_err(),
            "unknown unit `S`: did you mean `s`? use `ms`, `s`, `m` or `h` (also `us`, `ns`, \
             `d`)"
        );
        assert_eq!(
            parse_duration("2x").unwrap_err(),
            "unknown unit `x`: use `ms`, `s`, `m` or `h` (also `us`, `ns`, `d`)"
        );
        // Never a panic on a byte offset inside a character.
        assert!(parse_duration("2é").is_err() && parse_duration("é2s").is_err());
        assert_eq!(
            parse_duration("30").unwrap_err(),
            "a number needs a unit (`ms`, `s`, `m`, `h`)"
        );
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
        let files = vec![SourceFile::new(
            PathBuf::from("t.kdl"),
            "t.kdl".into(),
            Arc::from(src),
        )];
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
