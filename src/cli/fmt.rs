//! `trellis fmt [PATHS] [--check]`: lays suite files out canonically
//! (`trellis_dsl::format`), the files `run` and `check` would load: every `*.kdl` below a
//! directory, and what the files include. Each changed file is written atomically (a
//! temporary file renamed over it, keeping its permissions); nothing is written unless every
//! file parses. `--check` writes nothing and says which files would change, with a short
//! diff, for CI.

use std::collections::{HashSet, VecDeque};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use similar::{ChangeTag, TextDiff};
use trellis_dsl::diagnostics::Kind;
use trellis_dsl::format::{FormatError, Formatted, format_file, format_named};
use trellis_dsl::{Diagnostic, Diagnostics};

use super::console::{self, errln, outln};
use super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};

/// Lines of diff shown per file by `--check`.
const DIFF_LINES: usize = 20;

#[derive(Debug, Args)]
pub struct FmtArgs {
    /// Suite files or directories (every *.kdl below), with the files they include.
    /// Default: ./suites
    paths: Vec<PathBuf>,
    /// Write nothing: list the files that would change, each with a short diff, and exit 1
    /// if any would (0 when all are formatted).
    #[arg(long)]
    check: bool,
}

pub fn fmt(args: FmtArgs) -> u8 {
    let roots = if args.paths.is_empty() {
        vec![PathBuf::from("suites")]
    } else {
        args.paths
    };
    let mut problems: Vec<Diagnostic> = Vec::new();
    // Each file with the name diagnostics give it.
    let mut queue: VecDeque<(PathBuf, Option<String>)> = VecDeque::new();
    for root in &roots {
        let (files, found) = trellis_dsl::parse::suite_files(root);
        problems.extend(found);
        queue.extend(files.into_iter().map(|f| (f, None)));
    }
    let mut seen = HashSet::new();
    let mut total = 0usize;
    let mut changed: Vec<Formatted> = Vec::new();
    let mut refused = false;
    while let Some((path, name)) = queue.pop_front() {
        let canonical = fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if !seen.insert(canonical) {
            continue;
        }
        let formatted = match name {
            Some(name) => format_named(&path, name),
            None => format_file(&path),
        };
        match formatted {
            Ok(formatted) => {
                total += 1;
                // Right after the including file, as the loader reads them. An include that
                // does not exist is `check`'s to report.
                for (include, name) in formatted.includes.iter().rev() {
                    if include.is_file() {
                        queue.push_front((include.clone(), Some(name.clone())));
                    }
                }
                if formatted.changed() {
                    changed.push(formatted);
                }
            }
            Err(FormatError::Invalid(diagnostics)) => problems.extend(diagnostics),
            Err(e @ FormatError::Changed { .. }) => {
                errln!("{:?}", miette::Report::new(e));
                refused = true;
            }
        }
    }
    if !problems.is_empty() || refused {
        let unparsed = problems
            .iter()
            .any(|d| matches!(d.kind, Kind::Syntax | Kind::TooDeep));
        if !problems.is_empty() {
            errln!("{:?}", miette::Report::new(Diagnostics::new(problems)));
        }
        let why = if unparsed {
            ": every file must parse before any is formatted"
        } else {
            ""
        };
        if args.check {
            errln!("error: the files could not all be checked{why}");
        } else {
            errln!("error: nothing was written{why}");
        }
        return EXIT_INVALID;
    }
    if args.check {
        return check(&changed, total);
    }
    let mut written = 0usize;
    let mut failed = false;
    for file in &changed {
        match write_atomically(&file.source.path, &file.source.text, &file.text) {
            Ok(()) => {
                outln!("{}", file.source.name);
                written += 1;
            }
            Err(e) => {
                errln!("error: cannot write `{}`: {e}", file.source.name);
                failed = true;
            }
        }
    }
    if written == 0 && !failed {
        errln!(
            "{} already formatted",
            console::count(total as u64, "file", "files")
        );
    } else {
        errln!(
            "formatted {written} of {}",
            console::count(total as u64, "file", "files")
        );
    }
    if failed { EXIT_FAILED } else { EXIT_OK }
}

/// `--check`: each file that would change with the start of its diff; exit 1 if any.
fn check(changed: &[Formatted], total: usize) -> u8 {
    for file in changed {
        outln!(
            "{}",
            console::paint_fail(&format!("would reformat {}", file.source.name))
        );
        print_diff(&file.source.text, &file.text);
    }
    if changed.is_empty() {
        errln!(
            "{} already formatted",
            console::count(total as u64, "file", "files")
        );
        EXIT_OK
    } else {
        errln!(
            "{} of {} would be reformatted; run `trellis fmt` to format {}",
            changed.len(),
            console::count(total as u64, "file", "files"),
            if changed.len() == 1 { "it" } else { "them" }
        );
        EXIT_FAILED
    }
}

/// The first [`DIFF_LINES`] lines of a unified diff (one line of context), then how many
/// changed lines are not shown.
fn print_diff(old: &str, new: &str) {
    // A pathological file must not hold CI up: past the deadline the diff is coarser.
    let diff = TextDiff::configure()
        .timeout(Duration::from_secs(1))
        .diff_lines(old, new);
    let colour = console::stdout_colour();
    let paint = |sign: char, text: &str| {
        let hue = match sign {
            '-' => Some(anstyle::AnsiColor::Red),
            '+' => Some(anstyle::AnsiColor::Green),
            _ => None,
        };
        match hue {
            Some(c) if colour => {
                let style = anstyle::Style::new().fg_color(Some(c.into()));
                format!("{style}{sign}{text}{style:#}")
            }
            _ => format!("{sign}{text}"),
        }
    };
    let mut shown = 0usize;
    let mut hidden = 0usize;
    let mut unified = diff.unified_diff();
    unified.context_radius(1);
    for hunk in unified.iter_hunks() {
        if shown < DIFF_LINES {
            outln!("{}", hunk.header());
        }
        for change in hunk.iter_changes() {
            let sign = match change.tag() {
                ChangeTag::Delete => '-',
                ChangeTag::Insert => '+',
                ChangeTag::Equal => ' ',
            };
            if shown < DIFF_LINES {
                let text = change.value().trim_end_matches(['\n', '\r']);
                outln!("{}", paint(sign, text));
                shown += 1;
            } else if sign != ' ' {
                hidden += 1;
            }
        }
    }
    if hidden > 0 {
        outln!(
            "… {}",
            console::count(hidden as u64, "more changed line", "more changed lines")
        );
    }
}

/// Replaces `path`'s content by `text` through a temporary file in the same directory
/// renamed over it, so a reader (or a crash) never sees half a file. Symbolic links are
/// followed (the link stays a link), the file's permissions are kept, and a file that
/// changed since it was read (`was`) is left alone.
fn write_atomically(path: &Path, was: &str, text: &str) -> io::Result<()> {
    let target = fs::canonicalize(path)?;
    if fs::read_to_string(&target)? != was {
        return Err(io::Error::other(
            "it changed while it was being formatted; run `trellis fmt` again",
        ));
    }
    let dir = target.parent().unwrap_or_else(|| Path::new("."));
    let permissions = fs::metadata(&target)?.permissions();
    let mut temp = tempfile::Builder::new()
        .prefix(".trellis-fmt-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    temp.write_all(text.as_bytes())?;
    temp.as_file().sync_all()?;
    fs::set_permissions(temp.path(), permissions)?;
    temp.persist(&target).map_err(|e| e.error)?;
    Ok(())
}
