//! The repository's own text: comments and docs cite only files of this repository, and
//! every `docs/*.md` they cite (with its `"Heading"` or `#anchor`) exists.
//!
//! The protocol specifications and the notes on what real agents send live outside the
//! repository; what Trellis relies on of them is written down in docs/wire.md, so a reader of
//! a comment can always follow its reference.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// Directories that hold no source of ours (at any depth), and the root's run outputs.
const SKIPPED_DIRS: [&str; 2] = ["target", ".git"];
const SKIPPED_ROOT_DIRS: [&str; 1] = ["runs"];

/// Every `*.rs` and `*.md` file of the repository, sorted.
fn text_files(root: &Path) -> Vec<PathBuf> {
    // A plain walk: two directory names to skip do not call for a crate.
    let mut pending = vec![root.to_path_buf()];
    let mut files = Vec::new();
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry
                .file_type()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if kind.is_dir() {
                let skipped = SKIPPED_DIRS.contains(&name.as_ref())
                    || (dir == root && SKIPPED_ROOT_DIRS.contains(&name.as_ref()));
                if !skipped {
                    pending.push(path);
                }
            } else if kind.is_file() && (name.ends_with(".rs") || name.ends_with(".md")) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The headings of a markdown file (outside code fences), as written and as the anchors
/// GitHub derives from them.
struct Headings {
    texts: HashSet<String>,
    anchors: HashSet<String>,
}

fn headings(markdown: &str) -> Headings {
    let mut texts = HashSet::new();
    let mut anchors = HashSet::new();
    let mut in_fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let text = line
            .trim_start_matches('#')
            .trim()
            .trim_end_matches('#')
            .trim();
        let plain = text.replace('`', "");
        // GitHub's slug: lower case, punctuation dropped, spaces as hyphens; a repeated
        // heading gets `-1`, `-2`, ….
        let slug: String = plain
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while anchors.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        anchors.insert(anchor);
        texts.insert(text.to_owned());
        texts.insert(plain);
    }
    Headings { texts, anchors }
}

#[test]
fn comments_and_docs_cite_only_this_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Spelled in pieces so that this file does not cite them itself.
    let outside = Regex::new(concat!(
        r"(^|[^A-Za-z0-9_.-])spec",
        r"s/|FIELD-",
        r"NOTES|multiagent-scenario-",
        r"files\.md"
    ))
    .unwrap();
    let citation = Regex::new(
        r#"(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_-]+\.md)(?:#([A-Za-z0-9_-]+)|,? +"([^"]+)")?"#,
    )
    .unwrap();

    // Markdown links to other markdown files of the repository, and to a heading of the
    // same file.
    let link = Regex::new(r"\]\(([^)\s#:]+\.md)?(?:#([^)\s]+))?\)").unwrap();

    let files = text_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("docs/architecture.md")),
        "the walk found no docs under {}",
        root.display()
    );
    let mut problems = Vec::new();
    let mut docs = Docs::default();
    for file in &files {
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!("{shown}: cannot be read as UTF-8 text: {e}"));
                continue;
            }
        };
        let markdown = shown.ends_with(".md");
        for (i, line) in text.lines().enumerate() {
            let at = format!("{shown}:{}", i + 1);
            if let Some(found) = outside.find(line) {
                problems.push(format!(
                    "{at}: cites `{}`, a file outside this repository (cite the section of \
                     docs/wire.md that holds the fact): {}",
                    found
                        .as_str()
                        .trim_start_matches(|c: char| !c.is_alphanumeric()),
                    line.trim()
                ));
            }
            for cited in citation.captures_iter(line) {
                let target = Target {
                    shown: &cited[1],
                    path: root.join(&cited[1]),
                    anchor: cited.get(2).map(|m| m.as_str()),
                    heading: cited.get(3).map(|m| m.as_str()),
                };
                docs.check(&at, &target, &mut problems);
            }
            if !markdown {
                continue;
            }
            for linked in link.captures_iter(line) {
                let (shown, path) = match linked.get(1) {
                    Some(doc) => (doc.as_str(), file.with_file_name(doc.as_str())),
                    None if linked.get(2).is_some() => ("this file", file.clone()),
                    None => continue,
                };
                let target = Target {
                    shown,
                    path,
                    anchor: linked.get(2).map(|m| m.as_str()),
                    heading: None,
                };
                docs.check(&at, &target, &mut problems);
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s) in the repository's text:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// A cited markdown file, and the heading or anchor cited in it.
struct Target<'a> {
    shown: &'a str,
    path: PathBuf,
    anchor: Option<&'a str>,
    heading: Option<&'a str>,
}

/// The headings of every markdown file cited so far (`None`: it does not exist).
#[derive(Default)]
struct Docs(HashMap<PathBuf, Option<Headings>>);

impl Docs {
    fn check(&mut self, at: &str, target: &Target<'_>, problems: &mut Vec<String>) {
        let doc = target.shown;
        let headings = self
            .0
            .entry(target.path.clone())
            .or_insert_with_key(|path| std::fs::read_to_string(path).ok().map(|md| headings(&md)))
            .as_ref();
        let Some(headings) = headings else {
            problems.push(format!("{at}: cites {doc}, which does not exist"));
            return;
        };
        if let Some(anchor) = target.anchor
            && !headings.anchors.contains(anchor)
        {
            problems.push(format!(
                "{at}: cites {doc}#{anchor}, which has no such heading"
            ));
        }
        if let Some(heading) = target.heading
            && !headings.texts.contains(heading)
        {
            problems.push(format!(
                "{at}: cites {doc} \"{heading}\", which has no such heading"
            ));
        }
    }
}
