//! Problems found in suite files, as miette diagnostics.
//!
//! Loading never stops at the first problem: every file is parsed, decoded and validated, and
//! all problems come back together as one [`Diagnostics`] value whose `related()` list holds
//! each [`Diagnostic`], so a single miette report (or [`Diagnostics::render_plain`]) shows all
//! of them. Every diagnostic carries a stable [`Kind::code`] that tests and tools can match on.

use std::fmt;

use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, Severity, SourceSpan,
};

use crate::model::{FileId, SourceFile, Span};

/// What went wrong; each kind has a stable diagnostic code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A file or directory could not be read.
    Io,
    /// The file is not valid KDL v2.
    Syntax,
    /// A node that is not allowed where it is written.
    UnknownNode,
    /// A property the node does not accept.
    UnknownProperty,
    /// An argument the node does not accept.
    UnexpectedArgument,
    /// A value of the wrong KDL type.
    WrongType,
    /// A required argument, property or child is missing.
    Missing,
    /// The same setting is written twice.
    DuplicateSetting,
    /// Two definitions with the same id.
    DuplicateId,
    /// A reference to an agent, persona, tool, provider, judge or scenario that does not exist.
    UndefinedReference,
    /// A value outside the allowed set (`difficulty "easy"`).
    InvalidValue,
    /// A number outside its allowed range.
    OutOfRange,
    InvalidRegex,
    InvalidJsonPath,
    InvalidDuration,
    InvalidSize,
    /// An agent endpoint that is missing, doubled, or not supported by its protocol.
    InvalidEndpoint,
    /// A minijinja syntax error.
    TemplateSyntax,
    /// A template variable that is not in scope.
    UndefinedVariable,
    /// Scenarios whose `needs` form a cycle.
    NeedsCycle,
    /// `include` of a file that does not exist.
    MissingInclude,
    /// Files that include each other.
    IncludeCycle,
    /// A file beyond what the KDL parser can take safely: blocks nested too deep, a block
    /// comment of too many pieces, or too many bytes (`depth.rs`).
    TooDeep,
    /// `expect` or `capture` before the conversation has had any turn.
    NoTurnYet,
    /// A scenario that does not say which agent it runs against, when that is ambiguous.
    AmbiguousAgent,
    /// A secondary note attached to another diagnostic (e.g. "first defined here").
    Note,
    /// A warning of `trellis check`: something valid that this version cannot run yet, so its
    /// trajectories or checks will be recorded as skipped.
    NotRunnable,
    /// A warning of `trellis check`: a scenario that checks nothing, so its trajectories are
    /// recorded as skipped rather than passed.
    NoChecks,
    /// A warning of `trellis check`: a template reads `env.NAME` and `NAME` is not set in the
    /// environment `check` runs in, so rendering it would fail at run time.
    UnsetEnv,
    /// A warning of `trellis check`: a tool check names a tool, or a parameter, the suite
    /// does not declare but is a typo away from one it does (`no-tool "aply_refund"` would
    /// pass whatever the agent does).
    UnknownTool,
    /// A warning of `trellis check`: the same check written twice for the same turn (or
    /// twice for the whole trajectory), whose two results could not be told apart.
    DuplicateCheck,
    /// Nothing to load: a directory without `.kdl` files, or a file with no nodes at all.
    NoSuite,
    /// A warning of `trellis check`: a scenario scripts more agent turns on a path than its
    /// `max-turns`, so that path fails at the limit whatever the agent does.
    MaxTurns,
    /// A warning of `trellis check`: a `branch` with no sibling, a fork of one, whose steps
    /// run in sequence rather than as an alternative.
    LoneBranch,
    /// A warning of `trellis check`: a scenario's or branch's `simulator` or a branch's
    /// `persona` that no `simulate` step under it plays: written to shape a simulated user,
    /// it changes nothing.
    Unplayed,
    /// A warning of `trellis check`: a suite file with no nodes (empty, or comments only),
    /// such as one just created in an editor. Loading goes on without it; a project left
    /// with no scenario at all is an error of its own.
    EmptyFile,
    /// A warning of `trellis check`: a mock's `returns` (or a sequence's `output`) written
    /// as a string that reads like JSON (`{…}`, `[…]`) but is not JSON, so it is answered as
    /// that text (a trailing comma made the answer a string).
    NotJson,
    /// A warning of `trellis check`: a check that no agent can pass, by the suite's own
    /// arithmetic (`expect turns max=0` after a `user` step).
    NeverPasses,
    /// A warning of `trellis check`: a CSV column whose fields read as numbers in some rows
    /// and as text in others (`02134` beside `10001`), CSV being typed field by field.
    MixedColumn,
}

impl Kind {
    /// The stable diagnostic code, e.g. `trellis::duplicate_id`.
    pub fn code(self) -> &'static str {
        match self {
            Kind::Io => "trellis::io",
            Kind::Syntax => "trellis::kdl_syntax",
            Kind::UnknownNode => "trellis::unknown_node",
            Kind::UnknownProperty => "trellis::unknown_property",
            Kind::UnexpectedArgument => "trellis::unexpected_argument",
            Kind::WrongType => "trellis::wrong_type",
            Kind::Missing => "trellis::missing",
            Kind::DuplicateSetting => "trellis::duplicate_setting",
            Kind::DuplicateId => "trellis::duplicate_id",
            Kind::UndefinedReference => "trellis::undefined_reference",
            Kind::InvalidValue => "trellis::invalid_value",
            Kind::OutOfRange => "trellis::out_of_range",
            Kind::InvalidRegex => "trellis::invalid_regex",
            Kind::InvalidJsonPath => "trellis::invalid_json_path",
            Kind::InvalidDuration => "trellis::invalid_duration",
            Kind::InvalidSize => "trellis::invalid_size",
            Kind::InvalidEndpoint => "trellis::invalid_endpoint",
            Kind::TemplateSyntax => "trellis::template_syntax",
            Kind::UndefinedVariable => "trellis::undefined_variable",
            Kind::NeedsCycle => "trellis::needs_cycle",
            Kind::MissingInclude => "trellis::missing_include",
            Kind::IncludeCycle => "trellis::include_cycle",
            Kind::TooDeep => "trellis::too_deep",
            Kind::NoTurnYet => "trellis::no_turn_yet",
            Kind::AmbiguousAgent => "trellis::ambiguous_agent",
            Kind::Note => "trellis::note",
            Kind::NotRunnable => "trellis::not_runnable",
            Kind::NoChecks => "trellis::no_checks",
            Kind::UnsetEnv => "trellis::unset_env",
            Kind::UnknownTool => "trellis::unknown_tool",
            Kind::DuplicateCheck => "trellis::duplicate_check",
            Kind::NoSuite => "trellis::no_suite",
            Kind::MaxTurns => "trellis::max_turns",
            Kind::LoneBranch => "trellis::lone_branch",
            Kind::Unplayed => "trellis::unplayed",
            Kind::EmptyFile => "trellis::empty_file",
            Kind::NotJson => "trellis::not_json",
            Kind::NeverPasses => "trellis::never_passes",
            Kind::MixedColumn => "trellis::mixed_column",
        }
    }
}

/// Longest source line drawn under a diagnostic; a label on a longer line is given as
/// `file:line:column` in the message.
const MAX_SHOWN_LINE: usize = 4096;

/// One problem in the suite files, with its source, labels and help.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct Diagnostic {
    pub kind: Kind,
    pub message: String,
    /// The file the labels point into, if any.
    pub file: Option<FileId>,
    src: Option<NamedSource<crate::model::CharColumns>>,
    labels: Vec<LabeledSpan>,
    help: Option<String>,
    related: Vec<Diagnostic>,
    severity: Severity,
}

impl Diagnostic {
    /// A diagnostic without a source location (e.g. an unreadable path).
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Diagnostic {
            kind,
            message: message.into(),
            file: None,
            src: None,
            labels: Vec::new(),
            help: None,
            related: Vec::new(),
            severity: match kind {
                Kind::Note => Severity::Advice,
                Kind::NotRunnable
                | Kind::NoChecks
                | Kind::UnsetEnv
                | Kind::UnknownTool
                | Kind::DuplicateCheck
                | Kind::MaxTurns
                | Kind::LoneBranch
                | Kind::Unplayed
                | Kind::EmptyFile
                | Kind::NotJson
                | Kind::NeverPasses
                | Kind::MixedColumn => Severity::Warning,
                _ => Severity::Error,
            },
        }
    }

    /// A diagnostic pointing at `span` of `file` (index `file_id`) with a primary label.
    pub fn at(
        kind: Kind,
        message: impl Into<String>,
        file_id: FileId,
        file: &SourceFile,
        span: SourceSpan,
        label: impl Into<String>,
    ) -> Self {
        let mut d = Diagnostic::new(kind, message);
        d.file = Some(file_id);
        let label = label.into();
        let text = &*file.text;
        let mut start = span.offset().min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        // From the file's line starts: a file of one long line with thousands of mistakes
        // searched it from each one's offset to both of its ends.
        let (line, range) = file.line_at(start);
        if range.len() > MAX_SHOWN_LINE {
            // miette draws the whole line and panics on columns past 65,535 ("Formatting
            // argument out of range"); say where instead of drawing it.
            let line = line + 1;
            let column = file.chars_between(range.start, start) + 1;
            d.message = format!("{} ({}:{line}:{column}: {label})", d.message, file.name);
            return d;
        }
        d.src = Some(file.named_source());
        d.labels
            .push(LabeledSpan::new_primary_with_span(Some(label), span));
        d
    }

    /// Like [`Diagnostic::at`], resolving the file from a model [`Span`].
    pub fn at_span(
        kind: Kind,
        message: impl Into<String>,
        files: &[SourceFile],
        span: Span,
        label: impl Into<String>,
    ) -> Self {
        match files.get(span.file) {
            Some(file) => Diagnostic::at(kind, message, span.file, file, span.span, label),
            None => Diagnostic::new(kind, message),
        }
    }

    /// Adds the help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a secondary label in the same file.
    pub fn with_label(mut self, span: SourceSpan, label: impl Into<String>) -> Self {
        self.labels
            .push(LabeledSpan::new_with_span(Some(label.into()), span));
        self
    }

    /// Points at a second place: a label when it is in the same file, else a related note.
    pub fn with_other(
        mut self,
        files: &[SourceFile],
        other: Span,
        label: impl Into<String>,
    ) -> Self {
        let label = label.into();
        if self.file == Some(other.file) {
            self.with_label(other.span, label)
        } else {
            let note = Diagnostic::at_span(Kind::Note, label.clone(), files, other, label);
            self.related.push(note);
            self
        }
    }

    /// Attaches a related diagnostic, shown after this one.
    pub fn with_related(mut self, related: Diagnostic) -> Self {
        self.related.push(related);
        self
    }

    /// Whether this is a warning (the suite is valid) rather than an error.
    pub fn is_warning(&self) -> bool {
        self.severity == Severity::Warning
    }

    /// The labels, primary first, in the file [`Diagnostic::file`] names.
    pub fn labels(&self) -> &[LabeledSpan] {
        &self.labels
    }

    /// The diagnostics attached to this one (a "first defined here" note in another file).
    pub fn related_diagnostics(&self) -> &[Diagnostic] {
        &self.related
    }

    pub fn help_text(&self) -> Option<&str> {
        self.help.as_deref()
    }

    /// The byte offset of the primary label, for ordering.
    pub fn offset(&self) -> usize {
        self.labels.first().map_or(0, |l| l.offset())
    }

    /// The diagnostic code, e.g. `trellis::unknown_node`.
    pub fn code_str(&self) -> &'static str {
        self.kind.code()
    }
}

impl miette::Diagnostic for Diagnostic {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.kind.code()))
    }

    fn severity(&self) -> Option<Severity> {
        Some(self.severity)
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display + 'a>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.src.as_ref().map(|s| s as &dyn miette::SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() || self.src.is_none() {
            None
        } else {
            Some(Box::new(self.labels.iter().cloned()))
        }
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            None
        } else {
            Some(Box::new(
                self.related.iter().map(|d| d as &dyn miette::Diagnostic),
            ))
        }
    }
}

/// Every problem found while loading suite files.
#[derive(Clone, Debug, Default, thiserror::Error)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
    /// The files the diagnostics' [`Diagnostic::file`] ids index, when known.
    files: Vec<SourceFile>,
    /// What `trellis check` would warn about besides (an undeclared tool a check names, an
    /// unset variable): said with the errors, so that every problem is said at once.
    warnings: Vec<Diagnostic>,
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.items.len() {
            1 => write!(f, "1 error in suite files"),
            n => write!(f, "{n} errors in suite files"),
        }
    }
}

impl miette::Diagnostic for Diagnostics {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new("trellis::invalid_suite"))
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        Some(Box::new(
            self.items.iter().map(|d| d as &dyn miette::Diagnostic),
        ))
    }
}

impl Diagnostics {
    pub fn new(items: Vec<Diagnostic>) -> Self {
        Diagnostics {
            items,
            files: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The same diagnostics, with the warnings of the same files.
    pub fn with_warnings(mut self, warnings: Vec<Diagnostic>) -> Self {
        self.warnings = warnings;
        self
    }

    /// The warnings found besides the errors ([`Diagnostics::with_warnings`]).
    pub fn warnings(&self) -> &[Diagnostic] {
        &self.warnings
    }

    /// The same diagnostics, knowing the files their ids index.
    pub fn with_files(mut self, files: Vec<SourceFile>) -> Self {
        self.files = files;
        self
    }

    /// The files [`Diagnostic::file`] indexes (empty when the diagnostics were not made by
    /// the loader).
    pub fn files(&self) -> &[SourceFile] {
        &self.files
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.items.iter()
    }

    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.items.push(diagnostic);
    }

    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.items
    }

    /// Every diagnostic rendered without colours, 100 columns wide, separated by blank lines.
    pub fn render_plain(&self) -> String {
        let handler =
            GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor()).with_width(100);
        let mut out = String::new();
        for (i, d) in self.items.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            if handler.render_report(&mut out, d).is_err() {
                // Rendering into a String only fails if a Display impl fails; keep the message.
                out.push_str(&d.message);
                out.push('\n');
            }
        }
        out
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

/// The closest candidate to `word`, if it is close enough to be a plausible typo: the same
/// but for case and `_` against `-`; one letter added, dropped, changed or two swapped
/// (both names of two letters or more; where Jaro–Winkler is too coarse: `mxa`, `Tcp`, `ul`);
/// else Jaro–Winkler similarity of at least 0.8.
pub fn did_you_mean<'a, I>(word: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let normal = |s: &str| s.to_lowercase().replace('_', "-");
    let word = normal(word);
    candidates
        .into_iter()
        .map(|c| {
            let candidate = normal(c);
            let score = if candidate == word {
                3.0
            } else if word.chars().count().min(candidate.chars().count()) >= 2
                && strsim::osa_distance(&word, &candidate) <= 1
            {
                2.0 + strsim::jaro_winkler(&word, &candidate)
            } else {
                strsim::jaro_winkler(&word, &candidate)
            };
            (score, c)
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// A help line suggesting the closest candidate, else listing the candidates.
pub fn suggest<'a, I>(word: &str, candidates: I, what: &str) -> String
where
    I: IntoIterator<Item = &'a str>,
{
    let all: Vec<&str> = candidates.into_iter().collect();
    if let Some(best) = did_you_mean(word, all.iter().copied()) {
        return format!("did you mean `{best}`?");
    }
    if all.is_empty() {
        return format!("no {what} is defined");
    }
    let list: Vec<String> = all.iter().map(|c| format!("`{c}`")).collect();
    format!("expected one of {what}: {}", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names() {
        assert_eq!(
            did_you_mean("contians", ["contains", "matches", "equals"]),
            Some("contains")
        );
        assert_eq!(did_you_mean("zzz", ["contains"]), None);
        assert_eq!(did_you_mean("mxa", ["max"]), Some("max"));
        assert_eq!(did_you_mean("Tcp", ["tcp", "unix"]), Some("tcp"));
        assert_eq!(did_you_mean("ul", ["url", "cwd"]), Some("url"));
        assert_eq!(did_you_mean("A2a", ["a2a", "http"]), Some("a2a"));
        assert_eq!(did_you_mean("json_path", ["json-path"]), Some("json-path"));
        assert_eq!(did_you_mean("b", ["a"]), None);
        assert_eq!(
            suggest("zzz", ["a-b", "c-d"], "properties"),
            "expected one of properties: `a-b`, `c-d`"
        );
    }

    #[test]
    fn display_counts() {
        let d = Diagnostics::new(vec![Diagnostic::new(Kind::Io, "x")]);
        assert_eq!(d.to_string(), "1 error in suite files");
        let d = Diagnostics::new(vec![
            Diagnostic::new(Kind::Io, "x"),
            Diagnostic::new(Kind::Io, "y"),
        ]);
        assert_eq!(d.to_string(), "2 errors in suite files");
    }
}
