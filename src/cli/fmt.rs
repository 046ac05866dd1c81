//! `trellis fmt [PATHS] [--check]`: lays suite files out canonically
//! (`trellis_dsl::format`), the files `run` and `check` would load: every `*.kdl` below a
//! directory, and what the files include. Each changed file is written atomically (a
//! temporary file renamed over it, keeping its permissions and owner; in place when it has
//! other hard links or its owner cannot be kept); nothing is written unless every file
//! parses. `--check` writes nothing and says which files would change, with a short
//! diff, for CI.

use std::collections::{HashSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use similar::DiffTag;
use similar::algorithms::{Capture, Replace, myers};
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
        vec![PathBuf::from(super::DEFAULT_SUITES)]
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
    console::out_text(&short_diff(old, new, console::stdout_colour()));
}

/// [`print_diff`]'s text.
fn short_diff(old: &str, new: &str, colour: bool) -> String {
    let old: Vec<&str> = old.split_inclusive('\n').collect();
    let new: Vec<&str> = new.split_inclusive('\n').collect();
    // Myers on lines, called directly with one hook: similar's `TextDiff` picks its
    // algorithm at run time, so it compiled every algorithm for every hook (a sixth of this
    // crate's code before optimization, for one diff).
    let mut capture = Replace::new(Capture::new());
    // A pathological file must not hold CI up: past the deadline the diff is coarser.
    let deadline = Instant::now().checked_add(Duration::from_secs(1));
    let Ok(()) = myers::diff_deadline(
        &mut capture,
        &old,
        0..old.len(),
        &new,
        0..new.len(),
        deadline,
    );
    let mut text = String::new();
    let paint = |sign: char, text: &str| {
        let text = text.trim_end_matches(['\n', '\r']);
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
    for hunk in capture.into_inner().into_grouped_ops(1) {
        let (Some(first), Some(last)) = (hunk.first(), hunk.last()) else {
            continue;
        };
        if shown < DIFF_LINES {
            let _ = writeln!(
                text,
                "@@ -{} +{} @@",
                HunkRange(first.old_range().start, last.old_range().end),
                HunkRange(first.new_range().start, last.new_range().end)
            );
        }
        for op in &hunk {
            let (tag, old_range, new_range) = op.as_tag_tuple();
            let (deleted, inserted, kept) = match tag {
                DiffTag::Equal => (0..0, 0..0, old_range),
                DiffTag::Delete => (old_range, 0..0, 0..0),
                DiffTag::Insert => (0..0, new_range, 0..0),
                DiffTag::Replace => (old_range, new_range, 0..0),
            };
            let lines = old[kept]
                .iter()
                .map(|l| (' ', l))
                .chain(old[deleted].iter().map(|l| ('-', l)))
                .chain(new[inserted].iter().map(|l| ('+', l)));
            for (sign, line) in lines {
                if shown < DIFF_LINES {
                    text.push_str(&paint(sign, line));
                    text.push('\n');
                    shown += 1;
                } else if sign != ' ' {
                    hidden += 1;
                }
            }
        }
    }
    if hidden > 0 {
        let _ = writeln!(
            text,
            "… {}",
            console::count(hidden as u64, "more changed line", "more changed lines")
        );
    }
    text
}

/// A hunk's line range in a unified diff header: `start,length` from 1, the start alone for
/// one line, and the line before for an empty range (as `diff -u` and similar's own writer).
struct HunkRange(usize, usize);

impl std::fmt::Display for HunkRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.1.saturating_sub(self.0);
        match len {
            1 => write!(f, "{}", self.0 + 1),
            0 => write!(f, "{},0", self.0),
            _ => write!(f, "{},{len}", self.0 + 1),
        }
    }
}

/// Replaces `path`'s content by `text` through a temporary file in the same directory
/// renamed over it, so a reader (or a crash) never sees half a file. Symbolic links are
/// followed (the link stays a link), the file's permissions and owner are kept, and a file
/// that changed since it was read (`was`) is left alone.
///
/// A file with other hard links, or whose owner cannot be given to the new file (another
/// user's file, formatted by one allowed to write it), is written in place instead: a
/// rename would leave the other links with the old text, or hand the file to whoever ran
/// `fmt` (`docker run … trellis fmt` on a mounted repository runs as root).
fn write_atomically(path: &Path, was: &str, text: &str) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let target = fs::canonicalize(path)?;
    if fs::read_to_string(&target)? != was {
        return Err(io::Error::other(
            "it changed while it was being formatted; run `trellis fmt` again",
        ));
    }
    let dir = target.parent().unwrap_or_else(|| Path::new("."));
    let meta = fs::metadata(&target)?;
    if meta.nlink() > 1 {
        return write_in_place(&target, text);
    }
    let mut temp = tempfile::Builder::new()
        .prefix(".trellis-fmt-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    let made = temp.as_file().metadata()?;
    if (made.uid(), made.gid()) != (meta.uid(), meta.gid())
        && std::os::unix::fs::chown(temp.path(), Some(meta.uid()), Some(meta.gid())).is_err()
    {
        drop(temp);
        return write_in_place(&target, text);
    }
    temp.write_all(text.as_bytes())?;
    temp.as_file().sync_all()?;
    fs::set_permissions(temp.path(), meta.permissions())?;
    temp.persist(&target).map_err(|e| e.error)?;
    Ok(())
}

/// Rewrites `target` in the same inode: its links, owner and permissions stay as they are.
fn write_in_place(target: &Path, text: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(target)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::short_diff;

    /// The same hunks, headers and lines as `diff -U1` writes for these files.
    #[test]
    fn the_short_diff_is_a_unified_diff_with_one_line_of_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nB\nc\nd\ne\nf\ng\ni\nj\nk\n";
        assert_eq!(
            short_diff(old, new, false),
            "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n@@ -7,4 +7,4 @@\n g\n-h\n i\n j\n+k\n"
        );
        assert_eq!(short_diff("", "x\n", false), "@@ -0,0 +1 @@\n+x\n");
        assert_eq!(short_diff("x\n", "", false), "@@ -1 +0,0 @@\n-x\n");
        assert_eq!(short_diff("same\n", "same\n", false), "");
        // A missing final newline is a change of that line.
        assert_eq!(short_diff("x", "x\n", false), "@@ -1 +1 @@\n-x\n+x\n");
    }

    #[test]
    fn the_short_diff_stops_after_its_lines_and_counts_the_changes_it_left_out() {
        let old: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let new: String = (0..100).map(|i| format!("LINE {i}\n")).collect();
        let diff = short_diff(&old, &new, false);
        let lines: Vec<&str> = diff.lines().collect();
        assert_eq!(lines[0], "@@ -1,100 +1,100 @@");
        assert_eq!(lines.len(), 1 + super::DIFF_LINES + 1, "{diff}");
        assert!(
            lines[1..=super::DIFF_LINES]
                .iter()
                .all(|l| l.starts_with("-line"))
        );
        assert_eq!(
            lines[super::DIFF_LINES + 1],
            format!("… {} more changed lines", 200 - super::DIFF_LINES)
        );
    }
}
