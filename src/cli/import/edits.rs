//! What an import wrote, told apart from what a user wrote since: each suite an import
//! writes carries a digest of its own text, and importing again with `--replace` rewrites
//! only files whose text still matches it. A file edited by hand (a check added, an agent
//! pointed at a real endpoint) is kept and named instead, and suites an earlier import wrote
//! that this one did not (their source is gone, or failed to import) are named too.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::super::console::{count, errln};

/// How a suite file's digest line starts.
const DIGEST_LINE: &str = "// Import digest ";

/// How every suite an importer writes starts (see the importers' headers).
const IMPORTED_HEADER: &str = "// Imported by `trellis import ";

/// `text` with its digest line, at the end of its leading comment (the importer's header).
pub fn stamped(text: &str) -> String {
    let digest = digest(text);
    let line = format!(
        "{DIGEST_LINE}{digest}: `--replace` rewrites this file only while it is as imported.\n"
    );
    let header: usize = text
        .split_inclusive('\n')
        .take_while(|l| l.starts_with("//"))
        .map(str::len)
        .sum();
    let (head, rest) = text.split_at(header);
    format!("{head}{line}{rest}")
}

/// Why a file is kept rather than imported into again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Its text no longer matches its digest.
    Edited,
    /// It has no digest: written by hand, or imported by a trellis from before digests.
    NoDigest,
}

/// Whether the file at `path` may have been changed since an import wrote it, and why. A
/// file that cannot be read is not kept for that: writing it reports why.
pub fn edited_since_import(path: &Path) -> Option<Kept> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return None;
    };
    let text = text.replace("\r\n", "\n");
    let mut recorded = None;
    let mut rest = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.strip_prefix(DIGEST_LINE) {
            Some(after) if recorded.is_none() => {
                recorded = Some(after.split(':').next().unwrap_or_default().to_owned());
            }
            _ => rest.push_str(line),
        }
    }
    match recorded {
        None => Some(Kept::NoDigest),
        Some(recorded) if recorded != digest(&rest) => Some(Kept::Edited),
        Some(_) => None,
    }
}

/// The suites below `out` that `importer` wrote from a file below `source` (their header
/// says so) and that are not in `written`: left from an earlier import whose source is gone
/// or failed this time. Suites of another importer or another source are not this import's.
pub fn left_from_earlier(
    out: &Path,
    written: &HashSet<PathBuf>,
    importer: &str,
    source: &Path,
) -> Vec<PathBuf> {
    let mut found = Vec::new();
    kdl_files(out, &mut found);
    // The source's own files: `scenarios/…`, not `scenarios-old/…`.
    let source = source.display().to_string();
    let from = format!(
        "{IMPORTED_HEADER}{importer}` from {}{}",
        source.trim_end_matches(std::path::MAIN_SEPARATOR),
        std::path::MAIN_SEPARATOR
    );
    let mut left: Vec<PathBuf> = found
        .into_iter()
        .filter(|p| !written.contains(p))
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|text| text.starts_with(&from)))
        .collect();
    left.sort();
    left
}

/// The `.kdl` files below `dir` (a directory that cannot be read is left out).
fn kdl_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => kdl_files(&path, found),
            Ok(t) if t.is_file() && path.extension().is_some_and(|x| x == "kdl") => {
                found.push(path);
            }
            _ => {}
        }
    }
}

/// Names the suites [`left_from_earlier`] found, for the console.
pub fn report_left(out: &Path, left: &[PathBuf]) {
    if left.is_empty() {
        return;
    }
    let shown: Vec<String> = left
        .iter()
        .take(10)
        .map(|p| p.strip_prefix(out).unwrap_or(p).display().to_string())
        .collect();
    errln!(
        "note: {} in {} {} from an earlier import and {} not written now (the source is \
         gone, or could not be imported this time); {} still {} with the directory, so \
         delete {} if the source is gone: {}{}",
        count(left.len() as u64, "suite", "suites"),
        out.display(),
        if left.len() == 1 { "is" } else { "are" },
        if left.len() == 1 { "was" } else { "were" },
        if left.len() == 1 { "it" } else { "they" },
        if left.len() == 1 { "runs" } else { "run" },
        if left.len() == 1 { "it" } else { "them" },
        shown.join(", "),
        if left.len() > shown.len() {
            format!(" and {} more", left.len() - shown.len())
        } else {
            String::new()
        }
    );
}

/// `text` is an importer's (LF line ends) or a file's read back with its CRLFs made LF.
fn digest(text: &str) -> String {
    let hash = blake3::hash(text.as_bytes());
    hash.to_hex()[..16].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unedited_file_matches_its_digest_and_an_edited_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.kdl");
        let text =
            stamped("// Imported by `trellis import x` from a.json.\n\nscenario \"s\" {\n}\n");
        assert!(
            text.lines().nth(1).unwrap().starts_with(DIGEST_LINE),
            "{text}"
        );
        assert!(text.starts_with(IMPORTED_HEADER));
        std::fs::write(&path, &text).unwrap();
        assert_eq!(edited_since_import(&path), None);
        // Line endings converted by a checkout are not an edit.
        std::fs::write(&path, text.replace('\n', "\r\n")).unwrap();
        assert_eq!(edited_since_import(&path), None);
        std::fs::write(
            &path,
            text.replace("scenario \"s\" {\n", "scenario \"s\" {\n    // mine\n"),
        )
        .unwrap();
        assert_eq!(edited_since_import(&path), Some(Kept::Edited));
        // No digest: a file of the user's own, or from before digests.
        std::fs::write(&path, "scenario \"s\" {\n}\n").unwrap();
        assert_eq!(edited_since_import(&path), Some(Kept::NoDigest));
        // A missing file is not "edited".
        assert_eq!(edited_since_import(&dir.path().join("none.kdl")), None);
    }
}
