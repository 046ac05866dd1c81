//! `trellis fmt`: suite files laid out canonically, every word and comment kept as written.
//!
//! The layout is four spaces per block level, one space between a node's name, arguments and
//! properties, `key=value` without spaces, one node per line (a `;` between nodes becomes a
//! line break), at most one blank line in a row, none right after `{` or before `}` (but
//! one that ends a `\`-continued node is kept: it is what ends the node), and
//! a newline at the end. What is not layout is never touched: strings stay as written (raw
//! strings raw, multi-line strings byte for byte), numbers and keywords as written,
//! properties in their order, and every comment (`//`, `/* … */`, slashdashed `/-` nodes,
//! arguments and blocks) where it was. A few choices follow what the author wrote, so that
//! hand-made layout survives: a block written on one line stays on one line
//! (`user-context { zone "V5K" }`), a comment after code keeps its distance from the line's
//! indentation (so aligned comments stay aligned), a `\` line continuation stays, its next
//! line one level deeper, a word and the word or type written right against it stay
//! together (the parser reads `/-a #true"s"` as the slashdashed `a #true` and a node `"s"`),
//! and the file's line endings (LF or CRLF) are kept.
//!
//! Why not `kdl`'s own `KdlDocument::autoformat`: it drops comments that follow a `}` on
//! its line, moves a node's trailing `// comment` onto the next node, removes blank lines,
//! re-indents the inside of block comments and slashdashed nodes to nothing, and rewrites
//! raw strings, multi-line strings and numbers from their values unless each entry is marked
//! to keep its format (which then keeps its spacing as written too). So the formatter works
//! on the text's tokens instead (the scanning rules of [`crate::depth`], which already skips
//! strings and comments exactly as the parser does) and uses the parser twice: the file must
//! parse before anything is formatted (a syntax error gets the diagnostic `trellis check`
//! gives), and the formatted text must parse to the same nodes, with the same words,
//! comments and slashdashes in the same order, or it is refused ([`FormatError::Changed`]),
//! so a bug here can never change what a suite means.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kdl::{KdlDocument, KdlValue};

use crate::depth;
use crate::diagnostics::{Diagnostic, Diagnostics, Kind};
use crate::model::SourceFile;
use crate::parse::{display_name, normalize, refused_diagnostic, syntax_diagnostics};

/// Spaces per block level.
const INDENT: usize = 4;

/// Why a file was not formatted.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum FormatError {
    /// The file cannot be read or is not valid KDL: what `trellis check` reports for it.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Invalid(Diagnostics),
    /// The formatted text would not mean what the file means (a bug of the formatter).
    #[error("formatting `{name}` would change it beyond its layout ({what}); it was left as it is")]
    #[diagnostic(
        code(trellis::fmt_changed),
        help("this is a bug of `trellis fmt`: please report it with the file")
    )]
    Changed { name: String, what: String },
}

/// A suite file and its canonical layout.
#[derive(Debug)]
pub struct Formatted {
    /// The file as read.
    pub source: SourceFile,
    /// Its formatted text (equal to `source.text` when it is already formatted).
    pub text: String,
    /// The files its top-level `include` nodes name, resolved against its directory (those
    /// that do not exist included: `trellis check` reports them), each with the name
    /// diagnostics give it (`suites/shared/a.kdl`, not `suites/sub/../shared/a.kdl`).
    pub includes: Vec<(PathBuf, String)>,
}

impl Formatted {
    /// Whether formatting changes the file.
    pub fn changed(&self) -> bool {
        *self.source.text != *self.text
    }
}

/// Reads and formats the suite file at `path`. A file that cannot be read or does not parse
/// gets the diagnostics `trellis check` prints for it.
pub fn format_file(path: &Path) -> Result<Formatted, FormatError> {
    format_named(path, display_name(path))
}

/// [`format_file`], the file shown as `name` (an included file's name from
/// [`Formatted::includes`]).
pub fn format_named(path: &Path, name: String) -> Result<Formatted, FormatError> {
    let text = crate::parse::read_suite_text(path).map_err(|e| {
        FormatError::Invalid(Diagnostics::new(vec![Diagnostic::new(
            Kind::Io,
            format!("cannot read `{name}`: {e}"),
        )]))
    })?;
    let source = SourceFile::new(path.to_path_buf(), name, Arc::from(text));
    let (text, includes) = format_source(&source)?;
    // As the loader resolves and names them.
    let base = path.parent().unwrap_or_else(|| Path::new(""));
    let shown_base = Path::new(&source.name)
        .parent()
        .unwrap_or_else(|| Path::new(""));
    let includes = includes
        .into_iter()
        .map(|rel| {
            let name = display_name(&normalize(&shown_base.join(&rel)));
            (base.join(rel), name)
        })
        .collect();
    Ok(Formatted {
        source,
        text,
        includes,
    })
}

/// Formats a file's text; also returns the paths its top-level `include` nodes name, as
/// written.
pub fn format_source(file: &SourceFile) -> Result<(String, Vec<String>), FormatError> {
    let text = &*file.text;
    let before = parse(file)?;
    let formatted = layout(text);
    let changed = |what: String| FormatError::Changed {
        name: file.name.clone(),
        what,
    };
    // The guarantees, checked rather than trusted.
    let reparsed = SourceFile::new(
        file.path.clone(),
        file.name.clone(),
        Arc::from(formatted.as_str()),
    );
    let after =
        parse(&reparsed).map_err(|_| changed("the formatted text does not parse".to_string()))?;
    if let Some(at) = before
        .nodes
        .iter()
        .zip(&after.nodes)
        .position(|(a, b)| a != b)
    {
        return Err(changed(format!("top-level node {} differs", at + 1)));
    }
    if before.nodes.len() != after.nodes.len() {
        return Err(changed("the number of top-level nodes differs".to_string()));
    }
    let mut words = Lexer::new(text).filter_map(|t| significant(text, t));
    let mut new_words = Lexer::new(&formatted).filter_map(|t| significant(&formatted, t));
    loop {
        match (words.next(), new_words.next()) {
            (None, None) => break,
            (a, b) if a == b => {}
            (a, _) => {
                let shown = a.map_or_else(|| "the end".to_string(), |w| format!("`{w}`"));
                return Err(changed(format!("{shown} is not kept")));
            }
        }
    }
    Ok((formatted, before.includes))
}

/// What the parser makes of a file, kept to compare a file with its formatted text.
struct Parsed {
    /// Each top-level node without its formatting, printed.
    nodes: Vec<String>,
    /// The paths of its top-level `include` nodes.
    includes: Vec<String>,
}

impl Parsed {
    fn take(&mut self, mut doc: KdlDocument) {
        for node in doc.nodes_mut() {
            if node.name().value() == "include"
                && let Some(KdlValue::String(path)) = node
                    .entries()
                    .iter()
                    .find(|e| e.name().is_none())
                    .map(|e| e.value())
            {
                self.includes.push(path.clone());
            }
            node.clear_format_recursive();
            self.nodes.push(node.to_string());
        }
    }
}

/// Parses `file` as the loader does (through [`depth::parse_each`], so nothing overflows
/// the stack), with the loader's diagnostics for what does not parse.
fn parse(file: &SourceFile) -> Result<Parsed, FormatError> {
    let mut parsed = Parsed {
        nodes: Vec::new(),
        includes: Vec::new(),
    };
    let invalid = |diags: Vec<Diagnostic>| FormatError::Invalid(Diagnostics::new(diags));
    match depth::parse_each(&file.text, |doc| parsed.take(doc)) {
        Ok(depth::Parsed::Nodes) => {}
        Ok(depth::Parsed::Whole(Ok(doc))) => {
            // Some node did not parse alone, but the whole file did: what was taken from
            // the nodes is dropped, as the loader drops it.
            parsed.nodes.clear();
            parsed.includes.clear();
            parsed.take(doc);
        }
        Ok(depth::Parsed::Whole(Err(err))) => {
            return Err(invalid(syntax_diagnostics(err, 0, file)));
        }
        Err(refused) => return Err(invalid(vec![refused_diagnostic(refused, 0, file)])),
    }
    Ok(parsed)
}

/// A token as it must survive formatting: words and punctuation exactly, comments without
/// the whitespace around their lines, layout (whitespace, newlines, `;`) not at all.
fn significant(text: &str, token: Token) -> Option<Cow<'_, str>> {
    let piece = &text[token.start..token.end];
    match token.kind {
        Tok::Space | Tok::Newline | Tok::Semicolon => None,
        Tok::LineComment => Some(Cow::Borrowed(piece.trim_end())),
        Tok::BlockComment => Some(Cow::Owned(
            lines(piece).map(str::trim).collect::<Vec<_>>().join("\n"),
        )),
        _ => Some(Cow::Borrowed(piece)),
    }
}

/// The kinds of tokens of suite text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    /// A byte order mark at the start of the file.
    Bom,
    /// Spaces and tabs (and KDL's other Unicode spaces).
    Space,
    /// One newline (`\r\n` is one).
    Newline,
    /// `// …` up to the end of the line.
    LineComment,
    /// `/* … */`, nested ones included.
    BlockComment,
    /// `/-`: comments out the node, argument, property or block after it.
    Slashdash,
    /// `\`: the node goes on on the next line.
    Escline,
    Open,
    Close,
    Semicolon,
    OpenParen,
    CloseParen,
    Equals,
    /// A name, number, keyword or string of any kind.
    Word,
}

#[derive(Clone, Copy, Debug)]
struct Token {
    kind: Tok,
    start: usize,
    end: usize,
}

/// Cuts valid suite text into tokens. Strings and comments are skipped by the scanner the
/// loader checks files with ([`depth`]), so they end where the parser ends them.
#[derive(Clone)]
struct Lexer<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        Lexer { text, at: 0 }
    }
}

/// A KDL newline character (`\r\n` is one newline of two).
fn is_newline(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{85}' | '\u{0B}' | '\u{0C}' | '\u{2028}' | '\u{2029}'
    )
}

/// KDL's whitespace besides newlines.
fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
    )
}

/// Characters that end a bare word.
fn ends_word(c: char) -> bool {
    is_space(c) || is_newline(c) || "\\/(){};[]\"#=".contains(c) || c == '\u{FEFF}'
}

impl Iterator for Lexer<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        let start = self.at;
        let rest = &self.text[start..];
        let c = rest.chars().next()?;
        let bytes = self.text.as_bytes();
        let len = self.text.len();
        // After a bare word's first character, up to the next delimiter.
        let word_from = |from: usize| {
            self.text[from..]
                .char_indices()
                .find(|&(_, c)| ends_word(c))
                .map_or(len, |(i, _)| from + i)
        };
        let (kind, end) = match c {
            '\u{FEFF}' if start == 0 => (Tok::Bom, start + c.len_utf8()),
            '\r' if rest.starts_with("\r\n") => (Tok::Newline, start + 2),
            c if is_newline(c) => (Tok::Newline, start + c.len_utf8()),
            c if is_space(c) => {
                let end = rest
                    .char_indices()
                    .find(|&(_, c)| !is_space(c))
                    .map_or(len, |(i, _)| start + i);
                (Tok::Space, end)
            }
            '/' if rest.starts_with("//") => {
                let end = rest
                    .char_indices()
                    .find(|&(_, c)| is_newline(c))
                    .map_or(len, |(i, _)| start + i);
                (Tok::LineComment, end)
            }
            // The text parsed, so it is closed; an error would only mean the rest is one
            // comment, which the check after formatting would catch.
            '/' if rest.starts_with("/*") => (
                Tok::BlockComment,
                depth::skip_comment(bytes, start).unwrap_or(len),
            ),
            '/' if rest.starts_with("/-") => (Tok::Slashdash, start + 2),
            '\\' => (Tok::Escline, start + 1),
            '{' => (Tok::Open, start + 1),
            '}' => (Tok::Close, start + 1),
            ';' => (Tok::Semicolon, start + 1),
            '(' => (Tok::OpenParen, start + 1),
            ')' => (Tok::CloseParen, start + 1),
            '=' => (Tok::Equals, start + 1),
            '"' => (Tok::Word, depth::skip_quoted(bytes, start).unwrap_or(len)),
            '#' => {
                let hashes = rest.bytes().take_while(|&b| b == b'#').count();
                let end = depth::skip_raw(bytes, start).unwrap_or(len);
                if bytes.get(start + hashes) == Some(&b'"') {
                    (Tok::Word, end)
                } else {
                    // A keyword: `#true`, `#-inf`.
                    (Tok::Word, word_from(end))
                }
            }
            _ => (Tok::Word, word_from(start + c.len_utf8())),
        };
        // Never stand still (and never cut a character), whatever the text.
        let mut end = end.clamp(start + c.len_utf8(), len);
        while !self.text.is_char_boundary(end) {
            end += 1;
        }
        self.at = end;
        Some(Token { kind, start, end })
    }
}

/// The lines of a piece of text, split at any KDL newline (`\r\n` once).
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.char_indices().find(|&(_, c)| is_newline(c)) {
            Some((i, c)) => {
                let skip = if text[i..].starts_with("\r\n") {
                    2
                } else {
                    c.len_utf8()
                };
                rest = Some(&text[i + skip..]);
                Some(&text[..i])
            }
            None => {
                rest = None;
                Some(text)
            }
        }
    })
}

/// The line ending the file uses: that of its first line break (LF when it has none or its
/// first one is some other KDL newline).
fn line_ending(text: &str) -> &'static str {
    match text.find(['\n', '\r']) {
        Some(i) if text[i..].starts_with("\r\n") => "\r\n",
        Some(i) if text[i..].starts_with('\r') => "\r",
        _ => "\n",
    }
}

/// The column (in characters) of `at` in `text`, and the width of the indentation of its
/// line.
fn column(text: &str, at: usize) -> (usize, usize) {
    let line_start = text[..at]
        .char_indices()
        .rev()
        .find(|&(_, c)| is_newline(c))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let line = &text[line_start..at];
    let indent = line.chars().take_while(|&c| is_space(c)).count();
    (line.chars().count(), indent)
}

/// Lays out valid suite text (see the module documentation).
fn layout(text: &str) -> String {
    let mut printer = Printer {
        text,
        newline: line_ending(text),
        out: String::with_capacity(text.len() + text.len() / 8),
        depth: 0,
        newlines: 0,
        pending_break: false,
        pending_semicolon: false,
        prev: None,
        continued: false,
        inline_from: None,
        after_open: false,
        prev_end: 0,
    };
    let mut lexer = Lexer::new(text);
    while let Some(token) = lexer.next() {
        printer.token(token, &lexer);
    }
    if printer.prev.is_some() {
        printer.out.push_str(printer.newline);
    }
    printer.out
}

struct Printer<'a> {
    text: &'a str,
    newline: &'static str,
    out: String,
    /// Block level of the next line.
    depth: usize,
    /// Newlines in the text since the last token printed.
    newlines: usize,
    /// A `;` or `{` ends the line before the next token (a comment may still follow on it).
    pending_break: bool,
    /// A `;` in a block kept on one line, printed before the next token in it.
    pending_semicolon: bool,
    /// The last token printed.
    prev: Option<Tok>,
    /// The line printed last ends with `\`: the next one is indented one level more.
    continued: bool,
    /// The level of the outermost block kept on one line, while in it.
    inline_from: Option<usize>,
    /// Nothing but the `{` and comments on its line printed yet in this block: no blank
    /// line goes here.
    after_open: bool,
    /// Where the last token printed ends in the text.
    prev_end: usize,
}

impl Printer<'_> {
    fn token(&mut self, token: Token, rest: &Lexer<'_>) {
        let piece = &self.text[token.start..token.end];
        let kind = token.kind;
        match kind {
            Tok::Space => return,
            Tok::Bom => {
                self.out.push_str(piece);
                return;
            }
            Tok::Newline => {
                self.newlines += 1;
                return;
            }
            Tok::Semicolon => {
                if self.inline_from.is_some() {
                    self.pending_semicolon = true;
                } else {
                    self.pending_break = true;
                }
                return;
            }
            _ => {}
        }
        let comment = matches!(kind, Tok::LineComment | Tok::BlockComment);
        if kind == Tok::Close {
            self.depth = self.depth.saturating_sub(1);
        }
        let prev = self.prev;
        let line_break = match prev {
            // The start of the file.
            None => false,
            // A slashdash stays with what it comments out.
            Some(Tok::Slashdash) if !comment => false,
            // `{}`: an empty block.
            Some(Tok::Open) if kind == Tok::Close => false,
            Some(Tok::LineComment) => true,
            Some(_) if self.inline_from.is_some() => false,
            Some(_) if kind == Tok::Close => true,
            Some(_) => {
                self.newlines > 0 || (self.pending_break && !(comment && self.newlines == 0))
            }
        };
        if line_break {
            self.out.push_str(self.newline);
            // None before a `}`, unless a `\` came before it: that blank line is what ends
            // the continued node (without it the `}` would be read as the node's next line,
            // and formatting again would indent it).
            let blank =
                self.newlines >= 2 && !self.after_open && (kind != Tok::Close || self.continued);
            if blank {
                self.out.push_str(self.newline);
            }
            // A `\` continues the node onto the next line only: a line break after that
            // (a blank line) ended the node, and what follows is the next one.
            let level = self.depth + usize::from(self.continued && self.newlines <= 1);
            self.continued = false;
            self.out.extend(std::iter::repeat_n(' ', level * INDENT));
        } else if let Some(prev) = prev {
            if self.pending_semicolon && kind != Tok::Close {
                self.out.push(';');
            }
            if kind == Tok::LineComment {
                // A comment after code keeps its distance from the indentation, so
                // comments aligned in a column stay aligned.
                let (column, indent) = column(self.text, token.start);
                let (now, now_indent) = column_of_end(&self.out);
                let wanted = (column - indent).saturating_sub(now - now_indent);
                self.out.extend(std::iter::repeat_n(' ', wanted.max(1)));
            } else if spaced(prev, kind)
                // A word and a word or type written right after it stay together: the
                // parser reads `/-a #true"s" { … }` as `/-a #true` and a node `"s"` (and
                // `/-a #true(t)"s"` as `/-a #true` and a node `(t)"s"`), and a space would
                // make them one commented-out node.
                && !(prev == Tok::Word
                    && matches!(kind, Tok::Word | Tok::OpenParen)
                    && self.prev_end == token.start)
            {
                self.out.push(' ');
            }
        }
        self.pending_semicolon = false;
        match kind {
            Tok::LineComment => self.out.push_str(piece.trim_end()),
            Tok::BlockComment => self.block_comment(token),
            _ => self.out.push_str(piece),
        }
        match kind {
            Tok::Open => {
                if self.inline_from.is_none() && one_line_block(rest.clone()) {
                    self.inline_from = Some(self.depth);
                }
                self.depth += 1;
            }
            Tok::Close if self.inline_from == Some(self.depth) => self.inline_from = None,
            Tok::Escline => self.continued = true,
            _ => {}
        }
        // A comment on the line of a `;` or `{` leaves the line to end after it.
        if line_break || !comment {
            self.pending_break = kind == Tok::Open && self.inline_from.is_none();
        }
        self.after_open = kind == Tok::Open || (self.after_open && comment && !line_break);
        self.newlines = 0;
        self.prev = Some(kind);
        self.prev_end = token.end;
    }

    /// A `/* … */` comment; the lines after its first move as far as its first did, so
    /// its inside keeps its shape.
    fn block_comment(&mut self, token: Token) {
        let piece = &self.text[token.start..token.end];
        let (was, _) = column(self.text, token.start);
        let (now, _) = column_of_end(&self.out);
        for (i, line) in lines(piece).enumerate() {
            if i == 0 {
                self.out.push_str(line.trim_end());
                continue;
            }
            self.out.push_str(self.newline);
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if now >= was {
                self.out.extend(std::iter::repeat_n(' ', now - was));
                self.out.push_str(line);
            } else {
                let mut cut = was - now;
                let kept = line.trim_start_matches(|c: char| {
                    let strip = cut > 0 && is_space(c);
                    cut = cut.saturating_sub(1);
                    strip
                });
                self.out.push_str(kept);
            }
        }
    }
}

/// The column of the end of `out` and the indentation of its last line.
fn column_of_end(out: &str) -> (usize, usize) {
    column(out, out.len())
}

/// Whether a space goes between two tokens on one line.
fn spaced(prev: Tok, next: Tok) -> bool {
    let comment = matches!(next, Tok::LineComment | Tok::BlockComment);
    match (prev, next) {
        (Tok::Slashdash, _) => comment,
        (Tok::Open, Tok::Close) => false,
        (Tok::OpenParen | Tok::Equals | Tok::CloseParen, _) => false,
        (_, Tok::CloseParen | Tok::Equals) => false,
        _ => true,
    }
}

/// Whether the block whose `{` was just read closes on the same line (nothing but spaces,
/// block comments and tokens before its `}`): such a block stays on one line.
fn one_line_block(mut lexer: Lexer<'_>) -> bool {
    let mut open = 1usize;
    for token in lexer.by_ref() {
        match token.kind {
            Tok::Newline | Tok::LineComment | Tok::Escline => return false,
            Tok::Open => open += 1,
            Tok::Close => {
                open -= 1;
                if open == 0 {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(text: &str) -> String {
        let file = SourceFile::new(PathBuf::from("t.kdl"), "t.kdl".into(), Arc::from(text));
        match format_source(&file) {
            Ok((out, _)) => out,
            Err(e) => panic!("{e}: {text:?}"),
        }
    }

    #[test]
    fn indents_and_spaces() {
        assert_eq!(
            fmt(
                "scenario   \"a\"  x = 1 {\n  user \"hi\"; expect  reply contains=\"x\"\n        branch \"b\" {\nuser \"b\"\n}\n}"
            ),
            "scenario \"a\" x=1 {\n    user \"hi\"\n    expect reply contains=\"x\"\n    branch \"b\" {\n        user \"b\"\n    }\n}\n"
        );
    }

    #[test]
    fn keeps_values_as_written() {
        let text = "n 0x10 1_000 1.50 #true #-inf #\"raw\\d\"# \"q\\n\" (u8)7 (t)\"x\"\n";
        assert_eq!(fmt(text), text);
        let multi = "a {\n  text \"\"\"\n      keep\n        this\n      \"\"\"\n}\n";
        assert_eq!(
            fmt(multi),
            "a {\n    text \"\"\"\n      keep\n        this\n      \"\"\"\n}\n"
        );
    }

    #[test]
    fn keeps_comments() {
        let text = "// head\n\n/* block\n   comment */\na 1 /-2 x=3 /-y=4 { // after brace\n  /- b {\n      c\n  }\n  d /* mid */ 5\n}  // after block\n/-e\nf // end";
        assert_eq!(
            fmt(text),
            "// head\n\n/* block\n   comment */\na 1 /-2 x=3 /-y=4 { // after brace\n    /-b {\n        c\n    }\n    d /* mid */ 5\n}  // after block\n/-e\nf // end\n"
        );
    }

    #[test]
    fn keeps_one_line_blocks_and_blank_lines() {
        assert_eq!(
            fmt("a {  b 1;c 2;  }\n\n\n\nd {\n\n  e\n\n}\nf { }\ng { // c\n\n  // d\n\n  h\n}"),
            "a { b 1; c 2 }\n\nd {\n    e\n}\nf {}\ng { // c\n    // d\n\n    h\n}\n"
        );
    }

    #[test]
    fn keeps_aligned_comments_and_continuations() {
        let text = "a {\n    x 1        // one\n    yy 22      // two\n}\nagent \"a\" \\\n  url=\"u\" \\ // why\n   b=1\n";
        assert_eq!(
            fmt(text),
            "a {\n    x 1        // one\n    yy 22      // two\n}\nagent \"a\" \\\n    url=\"u\" \\ // why\n    b=1\n"
        );
    }

    #[test]
    fn a_blank_line_after_a_continuation_ends_the_node() {
        // The node ends at the line break after the continued line, so `b` is a node of
        // its own at the block's level, not a continuation.
        assert_eq!(
            fmt("s {\n    a 1 \\ // c\n    \n\n    b\n}\n"),
            "s {\n    a 1 \\ // c\n\n    b\n}\n"
        );
        assert_eq!(fmt("a \\\n\nb\n"), "a \\\n\nb\n");
        // Before a `}` too, so that formatting again changes nothing (a random case of
        // `tests/it/format.rs` found the `}` indented on the second pass).
        let once = fmt("s {\n    user \"hi\"\\\n\n}\n");
        assert_eq!(once, "s {\n    user \"hi\" \\\n\n}\n");
        assert_eq!(fmt(&once), once);
    }

    #[test]
    fn keeps_line_endings() {
        assert_eq!(fmt("a {\r\n  b\r\n}\r\n"), "a {\r\n    b\r\n}\r\n");
        assert_eq!(fmt("\u{feff}a\n"), "\u{feff}a\n");
        assert_eq!(fmt(""), "");
        assert_eq!(fmt("// only\n\n"), "// only\n");
    }

    #[test]
    fn formats_idempotently() {
        for text in [
            "a; b; c {d; e}\n",
            "/- a {\n b\n}\nc /-{ d } { e }\n",
            "a \\\n  b \\\n  c\n",
            "x /* a\n      b\n   */ y\n",
        ] {
            let once = fmt(text);
            assert_eq!(fmt(&once), once, "{text:?}");
        }
    }

    #[test]
    fn refuses_what_does_not_parse() {
        let file = SourceFile::new(PathBuf::from("t.kdl"), "t.kdl".into(), Arc::from("a {\n"));
        match format_source(&file) {
            Err(FormatError::Invalid(d)) => {
                assert!(d.iter().all(|d| d.kind == Kind::Syntax), "{d:?}")
            }
            other => panic!("{other:?}"),
        }
    }
}
