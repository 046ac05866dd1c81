//! `trellis import`: suites written from what agents and other harnesses already have (a
//! Fixie agent's few-shots, MultiAgentEval scenario files, Connexity test cases), and the helpers both importers
//! share to write KDL that loads back exactly as the source said.

mod agents_file;
mod connexity;
mod conversations;
mod edits;
mod fixie;
mod multiagent;
mod scenario_file;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(subcommand)]
    source: ImportSource,
}

#[derive(Debug, Subcommand)]
enum ImportSource {
    /// Write a suite from a Fixie agent's few-shots: one scenario per few-shot, each
    /// `Ask Func[…]` / `Func[…] says` pair a `call` step that expects the result.
    ///
    /// Example: trellis import fixie http://127.0.0.1:8181 --out suites/my-agent.kdl
    Fixie(fixie::FixieImportArgs),
    /// Write suites from MultiAgentEval scenario files (all three generations): one suite
    /// per file, its workflow nodes or tasks as `user` steps, its tools, policies and
    /// initial state as the scenario's sandbox, its assertions as criteria.
    ///
    /// Example: trellis import multiagent scenarios/ --out suites/imported
    Multiagent(multiagent::MultiAgentImportArgs),
    /// Write suites from Connexity test cases (one case, an array, or `{"test_cases": […]}`;
    /// the schema document's shape and the reference implementation's): one suite per file,
    /// one scenario per case, played by the simulator and judged on its expected outcomes and
    /// tool calls; only active cases run by default.
    ///
    /// Example: trellis import connexity test-cases/ --out suites/connexity
    Connexity(connexity::ConnexityImportArgs),
    /// Write a suite whose scenarios start from recorded conversations: JSON Lines, one
    /// `{"messages": […], "id": …}` per line (OpenAI-style messages). The suite reads the
    /// file as a `dataset` and opens one scenario per line with its messages as `history`.
    ///
    /// Example: trellis import conversations exports/support.jsonl --out suites/support.kdl
    Conversations(conversations::ConversationsImportArgs),
}

pub fn import(args: ImportArgs) -> u8 {
    match args.source {
        ImportSource::Fixie(args) => fixie::import_fixie(&args),
        ImportSource::Multiagent(args) => multiagent::import_multiagent(&args),
        ImportSource::Connexity(args) => connexity::import_connexity(&args),
        ImportSource::Conversations(args) => conversations::import_conversations(&args),
    }
}

/// The shared agents file of a directory import, which every written suite `include`s.
pub const AGENTS_FILE: &str = "agents.kdl";

/// A JSON value's kind, with its article, for messages about what a file holds.
pub fn json_kind(value: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// [`write_text`], with the directories `path` is in created first.
pub fn write_file(path: &Path, text: &str, replace: bool) -> Result<(), String> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    write_text(path, text, replace).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `text` to `path`; without `replace` the file must not exist when it is created
/// (one that appeared since a caller's check is not clobbered either).
pub fn write_text(path: &Path, text: &str, replace: bool) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if replace {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    options
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
}

/// Unmapped parts of one file listed on the console, at most this many; the suite written
/// from it lists every one in its header.
const UNMAPPED_SHOWN: usize = 20;

/// Says on stderr what of `input` the suite written from it does not map: the first
/// [`UNMAPPED_SHOWN`] items, then how many more (a file of 10,000 test cases printed a line
/// for each).
pub fn report_unmapped(input: &Path, items: &[String]) {
    super::console::errln!(
        "{}: {} not mapped:",
        input.display(),
        super::console::count(items.len() as u64, "item", "items")
    );
    for item in items.iter().take(UNMAPPED_SHOWN) {
        super::console::errln!("  - {}", one_line(item));
    }
    if items.len() > UNMAPPED_SHOWN {
        super::console::errln!(
            "  … and {} more, listed in the header of the suite written from it",
            items.len() - UNMAPPED_SHOWN
        );
    }
}

/// `text` on one console line: line breaks and other control characters (a case's name
/// with a newline, an escape sequence) written as escapes, so a report line stays one line
/// and the terminal is not driven by a file's content.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

pub fn is_simple_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Appends `text` as `//` comments, one per line, at `indent`.
pub fn comment(out: &mut String, indent: &str, text: &str) {
    for line in text.split('\n') {
        let line = escape_disallowed(line);
        let line = line.trim_end();
        if line.is_empty() {
            let _ = writeln!(out, "{indent}//");
        } else {
            let _ = writeln!(out, "{indent}// {line}");
        }
    }
}

/// `text` as a quoted KDL string. The `kdl` crate writes the value (quotes, backslashes,
/// `\n`, `\t`, …); code points it would leave raw but KDL forbids or reads as a line break
/// (other control characters, U+2028, bidi controls) become `\u{…}` escapes.
pub fn kdl_string(text: &str) -> String {
    let written = kdl::KdlValue::String(text.to_owned()).to_string();
    // A plain identifier is written bare; suites quote every string.
    let quoted = if written.starts_with('"') {
        written
    } else {
        format!("\"{written}\"")
    };
    escape_disallowed(&quoted)
}

fn escape_disallowed(text: &str) -> String {
    if !text.chars().any(needs_escape) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Code points KDL v2 does not allow raw in a document, or reads as a newline.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}' | '\u{FEFF}'
        )
}

/// Why `bytes` is not UTF-8 text, as a person can act on it: a UTF-16 file (what Windows
/// calls "Unicode") by its byte order mark, else the first byte that is not UTF-8, where
/// it is (a Windows-1252 `’` is 0x92). `None` for UTF-8.
pub fn not_utf8(bytes: &[u8]) -> Option<String> {
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Some(
            "the file is UTF-16 (it starts with a UTF-16 byte order mark): save it as UTF-8"
                .to_owned(),
        );
    }
    let error = std::str::from_utf8(bytes).err()?;
    let at = error.valid_up_to();
    let before = bytes.get(..at).unwrap_or_default();
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(before.rsplit(|&b| b == b'\n').next().unwrap_or_default())
        .chars()
        .count()
        + 1;
    let byte = bytes.get(at).copied().unwrap_or_default();
    Some(format!(
        "the file is not UTF-8: byte 0x{byte:02X} at line {line}, column {column} (a file \
         saved as Windows-1252 or Latin-1?): save it as UTF-8"
    ))
}

/// A file's bytes without the byte order mark editors on Windows save JSON with, which JSON
/// parsers refuse.
pub fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes
        .strip_prefix(trellis_dsl::dataset::BOM.as_bytes())
        .unwrap_or(bytes)
}

/// `text` as a template that renders to exactly `text`: every `{` that would open a
/// minijinja tag (`{{`, `{%`, `{#`) is written as `{{ "{" }}`.
pub fn literal_template(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '{' && matches!(chars.peek(), Some('{' | '%' | '#')) {
            out.push_str("{{ \"{\" }}");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_through_kdl() {
        for text in [
            "plain",
            "two words",
            "quote \" and backslash \\ and slash /",
            "line\nbreak\r\ttab",
            "bell \u{7} del \u{7f} nel \u{85} ls \u{2028} bidi \u{202e} bom \u{feff}",
            "#raw",
            "true",
            "",
        ] {
            let doc = format!("node {}", kdl_string(text));
            let parsed: kdl::KdlDocument = doc.parse().unwrap_or_else(|e| panic!("{doc}: {e}"));
            let value = parsed
                .get_arg("node")
                .and_then(|v| v.as_string())
                .map(str::to_owned);
            assert_eq!(value.as_deref(), Some(text), "{doc}");
        }
    }

    #[test]
    fn console_lines_stay_one_line() {
        assert_eq!(one_line("Refund — été"), "Refund — été");
        assert_eq!(one_line("line\ntask\u{1b}[31m"), "line\\ntask\\u{1b}[31m");
    }

    #[test]
    fn templates_are_escaped_only_where_needed() {
        assert_eq!(literal_template("0, 19"), "0, 19");
        assert_eq!(literal_template("{a}"), "{a}");
        assert_eq!(
            literal_template("{{x}} {%y%} {#z#}"),
            "{{ \"{\" }}{x}} {{ \"{\" }}%y%} {{ \"{\" }}#z#}"
        );
    }
}
