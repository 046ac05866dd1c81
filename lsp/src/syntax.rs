//! A forgiving reading of KDL for the editor: nodes, their entries and blocks with byte spans,
//! from text that may be half typed (an open string, a missing `}`, a property without its
//! value). The loader's parser refuses such text; completion and hover must still know where
//! the cursor is. Diagnostics come from the loader, never from here.

use std::ops::Range;

/// One node as written: `name ARG… key=VALUE… { children }`.
#[derive(Debug, Default)]
pub struct Node {
    pub name: String,
    pub name_span: Range<usize>,
    pub entries: Vec<Entry>,
    /// From the name to the end of its last entry, or to the line end when the line goes on.
    pub head: Range<usize>,
    pub block: Option<Block>,
    /// From the name to the block's `}` (or to the end of the text when it is not closed).
    pub span: Range<usize>,
    /// Commented out with `/-`: not part of the suite.
    pub commented: bool,
}

/// A `{ … }` block.
#[derive(Debug, Default)]
pub struct Block {
    /// After `{` up to `}` (or the end of the text).
    pub inside: Range<usize>,
    pub nodes: Vec<Node>,
}

/// An argument or a property.
#[derive(Debug)]
pub struct Entry {
    pub key: Option<(String, Range<usize>)>,
    pub value: Option<Value>,
    pub commented: bool,
}

/// A value as written.
#[derive(Debug, Clone)]
pub struct Value {
    /// A string's text (escapes resolved), or the token as written.
    pub text: String,
    /// The whole token, quotes included.
    pub span: Range<usize>,
    /// Between the quotes of a string (the token itself otherwise).
    pub content: Range<usize>,
    pub is_string: bool,
}

/// `plain` as it must be written in place of `value`'s text: escaped inside quotes; as it
/// is in a raw or multi-line string.
pub fn written_in(text: &str, value: &Value, plain: &str) -> String {
    let token = text.get(value.span.clone()).unwrap_or_default();
    if value.is_string && token.starts_with('"') && !token.starts_with("\"\"\"") {
        escape(plain)
    } else {
        plain.to_owned()
    }
}

/// `plain` as the inside of a quoted string: the escapes [`quoted`] resolves, put back.
pub fn escape(plain: &str) -> String {
    let mut out = String::with_capacity(plain.len());
    for c in plain.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

impl Node {
    /// The `n`th argument.
    pub fn arg(&self, n: usize) -> Option<&Value> {
        self.entries
            .iter()
            .filter(|e| e.key.is_none() && !e.commented)
            .filter_map(|e| e.value.as_ref())
            .nth(n)
    }

    /// A property's value, or the argument of a child node of that name (a setting written
    /// either way).
    pub fn setting(&self, name: &str) -> Option<&Value> {
        self.entries
            .iter()
            .filter(|e| !e.commented)
            .find(|e| e.key.as_ref().is_some_and(|(k, _)| k == name))
            .and_then(|e| e.value.as_ref())
            .or_else(|| {
                self.children()
                    .find(|c| c.name == name)
                    .and_then(|c| c.arg(0))
            })
    }

    /// The nodes of its block that are not commented out.
    pub fn children(&self) -> impl Iterator<Item = &Node> {
        self.block
            .iter()
            .flat_map(|b| b.nodes.iter())
            .filter(|n| !n.commented)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String, Range<usize>),
    Eq,
    Open,
    Close,
    End,
    Slashdash,
}

struct Token {
    tok: Tok,
    span: Range<usize>,
}

/// Reads `text` into its top-level nodes; never fails.
pub fn parse(text: &str) -> Vec<Node> {
    let (tokens, _) = tokenize(text);
    let mut parser = Parser {
        tokens,
        at: 0,
        len: text.len(),
    };
    parser.nodes(false, 0)
}

/// Nesting beyond this is read as flat text: the loader refuses it anyway (`depth.rs`).
const MAX_DEPTH: usize = 256;

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    len: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn nodes(&mut self, in_block: bool, depth: usize) -> Vec<Node> {
        let mut nodes = Vec::new();
        let mut commented = false;
        while let Some(token) = self.peek() {
            match &token.tok {
                Tok::End | Tok::Eq | Tok::Open => self.at += 1,
                Tok::Close => {
                    if in_block {
                        break;
                    }
                    self.at += 1;
                }
                Tok::Slashdash => {
                    commented = true;
                    self.at += 1;
                }
                Tok::Word(_) | Tok::Str(..) => {
                    let mut node = self.node(depth);
                    node.commented = std::mem::take(&mut commented);
                    nodes.push(node);
                }
            }
        }
        nodes
    }

    fn node(&mut self, depth: usize) -> Node {
        let Some(first) = self.tokens.get(self.at) else {
            return Node::default();
        };
        let (name, _) = value_of(first);
        let name_span = first.span.clone();
        self.at += 1;
        let mut node = Node {
            name,
            head: name_span.clone(),
            span: name_span.clone(),
            name_span,
            ..Node::default()
        };
        let mut commented = false;
        // The node's line runs to its terminator (a cursor after its last entry is still
        // on it), or to the end of the text.
        let mut line_end = self.len;
        while let Some(token) = self.tokens.get(self.at) {
            match &token.tok {
                Tok::End => {
                    line_end = token.span.start;
                    self.at += 1;
                    break;
                }
                Tok::Close => {
                    line_end = token.span.start;
                    break;
                }
                Tok::Slashdash => {
                    commented = true;
                    self.at += 1;
                }
                Tok::Eq => self.at += 1,
                Tok::Open => {
                    let start = token.span.end;
                    self.at += 1;
                    let nodes = if depth < MAX_DEPTH {
                        self.nodes(true, depth + 1)
                    } else {
                        Vec::new()
                    };
                    let end = match self.peek() {
                        Some(t) if t.tok == Tok::Close => {
                            let end = t.span.start;
                            self.at += 1;
                            end
                        }
                        _ => self.len,
                    };
                    node.span.end = (end + 1).min(self.len).max(end);
                    line_end = node.span.end;
                    let block = Block {
                        inside: start..end,
                        nodes,
                    };
                    if std::mem::take(&mut commented) {
                        continue;
                    }
                    node.block = Some(block);
                }
                Tok::Word(_) | Tok::Str(..) => {
                    let (text, content) = value_of(token);
                    let span = token.span.clone();
                    let is_string = matches!(token.tok, Tok::Str(..));
                    self.at += 1;
                    let is_eq = self.peek().is_some_and(|t| t.tok == Tok::Eq);
                    let entry = if is_eq {
                        self.at += 1;
                        let value = match self.peek() {
                            Some(t) if matches!(t.tok, Tok::Word(_) | Tok::Str(..)) => {
                                let (vtext, vcontent) = value_of(t);
                                let v = Value {
                                    text: vtext,
                                    span: t.span.clone(),
                                    is_string: matches!(t.tok, Tok::Str(..)),
                                    content: vcontent,
                                };
                                self.at += 1;
                                Some(v)
                            }
                            _ => None,
                        };
                        Entry {
                            key: Some((text, span.clone())),
                            value,
                            commented: std::mem::take(&mut commented),
                        }
                    } else {
                        Entry {
                            key: None,
                            value: Some(Value {
                                text,
                                span: span.clone(),
                                is_string,
                                content,
                            }),
                            commented: std::mem::take(&mut commented),
                        }
                    };
                    let end = entry
                        .value
                        .as_ref()
                        .map_or(span.end, |v| v.span.end)
                        .max(span.end);
                    node.head.end = node.head.end.max(end);
                    node.span.end = node.span.end.max(end);
                    node.entries.push(entry);
                }
            }
        }
        node.head.end = node.head.end.max(line_end);
        node.span.end = node.span.end.max(line_end);
        node
    }
}

fn value_of(token: &Token) -> (String, Range<usize>) {
    match &token.tok {
        Tok::Word(w) => (w.clone(), token.span.clone()),
        Tok::Str(s, content) => (s.clone(), content.clone()),
        _ => (String::new(), token.span.clone()),
    }
}

fn is_word_char(c: char) -> bool {
    !(c.is_whitespace()
        || matches!(
            c,
            '\\' | '/' | '(' | ')' | '{' | '}' | ';' | '[' | ']' | '"' | '=' | '\u{FEFF}'
        ))
}

/// Whether `offset` is inside a comment (`//` to the line's end, `/* … */`), where the editor
/// should offer nothing: the cursor right after a line comment's last character, or in a
/// block comment never closed, is still in it.
pub fn in_comment(text: &str, offset: usize) -> bool {
    let (_, comments) = tokenize(text);
    comments.iter().any(|c| {
        c.span.start < offset && (offset < c.span.end || c.open_ended && offset == c.span.end)
    })
}

/// A comment's extent, for [`in_comment`].
struct Comment {
    span: Range<usize>,
    /// A line comment, or a block comment the text does not close: the position at its end
    /// is still inside it.
    open_ended: bool,
}

/// Whether a line ends at `b[i]`: at `\n`, and at a lone `\r` (classic Mac line ends, which
/// KDL and the LSP specification count as line ends too); a CRLF ends at its `\n`.
fn ends_line(b: &[u8], i: usize) -> bool {
    match b.get(i) {
        Some(b'\n') => true,
        Some(b'\r') => b.get(i + 1) != Some(&b'\n'),
        _ => false,
    }
}

/// The tokens of `text`, and the comments between them.
fn tokenize(text: &str) -> (Vec<Token>, Vec<Comment>) {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut comments = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' | b'\r' | b';' | b'{' | b'}' | b'=' if c != b'\r' || ends_line(b, i) => {
                let tok = match c {
                    b'{' => Tok::Open,
                    b'}' => Tok::Close,
                    b'=' => Tok::Eq,
                    _ => Tok::End,
                };
                out.push(Token {
                    tok,
                    span: i..i + 1,
                });
                i += 1;
            }
            b'\\' => {
                // A line continuation: the newline after it does not end the node.
                i += 1;
                while i < b.len() && !ends_line(b, i) {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
                        let start = i;
                        while i < b.len() && !ends_line(b, i) {
                            i += 1;
                        }
                        comments.push(Comment {
                            span: start..i,
                            open_ended: true,
                        });
                        break;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let start = i;
                while i < b.len() && !ends_line(b, i) {
                    i += 1;
                }
                comments.push(Comment {
                    span: start..i,
                    open_ended: true,
                });
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start = i;
                let mut depth = 0usize;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                comments.push(Comment {
                    span: start..i.min(b.len()),
                    open_ended: depth > 0,
                });
            }
            b'/' if b.get(i + 1) == Some(&b'-') => {
                out.push(Token {
                    tok: Tok::Slashdash,
                    span: i..i + 2,
                });
                i += 2;
            }
            b'(' => {
                // A type annotation: not part of the language Trellis reads.
                while i < b.len() && b[i] != b')' && !ends_line(b, i) {
                    i += 1;
                }
                i += 1;
            }
            b'"' => {
                let (token, next) = quoted(text, i, 0);
                out.push(token);
                i = next;
            }
            b'#' => {
                let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + hashes) == Some(&b'"') {
                    let (token, next) = quoted(text, i, hashes);
                    out.push(token);
                    i = next;
                } else {
                    let end = word_end(text, i + 1);
                    out.push(Token {
                        tok: Tok::Word(text[i..end].to_string()),
                        span: i..end,
                    });
                    i = end;
                }
            }
            _ if c.is_ascii_whitespace() => i += 1,
            _ => {
                let end = word_end(text, i);
                if end == i {
                    // A character no token starts with: skip it (whole, not one byte).
                    i += text[i..].chars().next().map_or(1, char::len_utf8);
                    continue;
                }
                let word = &text[i..end];
                if word.chars().all(char::is_whitespace) {
                    i = end;
                    continue;
                }
                out.push(Token {
                    tok: Tok::Word(word.to_string()),
                    span: i..end,
                });
                i = end;
            }
        }
    }
    (out, comments)
}

fn word_end(text: &str, from: usize) -> usize {
    let mut end = from;
    for (off, c) in text[from..].char_indices() {
        if !is_word_char(c) {
            return from + off;
        }
        end = from + off + c.len_utf8();
    }
    end
}

/// A string starting at `start` with `hashes` `#`s before its quote (a raw string when > 0),
/// and where the text goes on after it. An unclosed string runs to the end of its line (a
/// multi-line one to the end of the text), as it is being typed.
fn quoted(text: &str, start: usize, hashes: usize) -> (Token, usize) {
    let b = text.as_bytes();
    let open = start + hashes;
    let multi = b[open..].starts_with(b"\"\"\"");
    let quote_len = if multi { 3 } else { 1 };
    let content_start = open + quote_len;
    let closing: String = format!(
        "{}{}",
        if multi { "\"\"\"" } else { "\"" },
        "#".repeat(hashes)
    );
    let mut i = content_start;
    let mut value = String::new();
    let raw = hashes > 0 || multi;
    loop {
        if i >= b.len() {
            let token = Token {
                tok: Tok::Str(value, content_start..b.len()),
                span: start..b.len(),
            };
            return (token, b.len());
        }
        if !multi && ends_line(b, i) {
            let token = Token {
                tok: Tok::Str(value, content_start..i),
                span: start..i,
            };
            return (token, i);
        }
        if text[i..].starts_with(&closing) {
            let end = i + closing.len();
            let token = Token {
                tok: Tok::Str(value, content_start..i),
                span: start..end,
            };
            return (token, end);
        }
        let Some(c) = text[i..].chars().next() else {
            break;
        };
        if c == '\\' && !raw {
            let next = text[i + 1..].chars().next();
            match next {
                Some('n') => value.push('\n'),
                Some('t') => value.push('\t'),
                Some('r') => value.push('\r'),
                Some('"') => value.push('"'),
                Some('\\') => value.push('\\'),
                Some(other) => {
                    value.push('\\');
                    value.push(other);
                }
                None => {}
            }
            i += 1 + next.map_or(0, char::len_utf8);
            continue;
        }
        value.push(c);
        i += c.len_utf8();
    }
    let token = Token {
        tok: Tok::Str(value, content_start..b.len()),
        span: start..b.len(),
    };
    (token, b.len())
}

/// The nodes from the top level down to the innermost one whose span holds `offset`.
pub fn chain(nodes: &[Node], offset: usize) -> Vec<&Node> {
    let mut out = Vec::new();
    let mut level = nodes;
    while let Some(node) = level
        .iter()
        .find(|n| !n.commented && n.name_span.start <= offset && offset <= n.span.end)
    {
        out.push(node);
        match &node.block {
            Some(b) if b.inside.start <= offset && offset <= b.inside.end => level = &b.nodes,
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_half_typed_text() {
        let text = "agent \"a\" protocol=\"connexity\"\nscenario \"s\" {\n    user \"hi\n    expect reply contains=\n    branch \"b\" {\n";
        let nodes = parse(text);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].setting("protocol").unwrap().text, "connexity");
        let s = &nodes[1];
        let names: Vec<&str> = s.children().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["user", "expect", "branch"]);
        let expect = s.children().nth(1).unwrap();
        assert!(expect.entries[1].value.is_none());
        let at = text.len();
        let c: Vec<&str> = chain(&nodes, at).iter().map(|n| n.name.as_str()).collect();
        assert_eq!(c, ["scenario", "branch"]);
    }

    #[test]
    fn knows_when_the_cursor_is_in_a_comment() {
        let text = "agent \"a\" // the agent\n/* one /* nested */ still */ scenario \"s\" {\n  user \"x\" \\ // cont\n  /* open";
        let at = |needle: &str| text.find(needle).unwrap();
        assert!(!in_comment(text, at("agent")));
        assert!(in_comment(text, at("the agent")));
        // Right after a line comment's last character, still in it; at the next line, not.
        assert!(in_comment(text, at("\n/*")));
        assert!(!in_comment(text, at("\n/*") + 1));
        assert!(in_comment(text, at("nested")));
        assert!(in_comment(text, at("still")));
        assert!(!in_comment(text, at(" scenario")));
        assert!(!in_comment(text, at("user")));
        assert!(in_comment(text, at("cont")));
        assert!(in_comment(text, at("open")));
        assert!(in_comment(text, text.len()));
    }

    #[test]
    fn classic_mac_line_ends_end_nodes_comments_and_strings() {
        let lf = "agent \"a\" protocol=\"connexity\" // the agent\nscenario \"s\" {\n    user \"hi\n    expect reply contains=\"x\"\n}\n";
        for text in [
            lf.to_string(),
            lf.replace('\n', "\r"),
            lf.replace('\n', "\r\n"),
        ] {
            let nodes = parse(&text);
            let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            assert_eq!(names, ["agent", "scenario"], "{text:?}");
            let children: Vec<&str> = nodes[1].children().map(|n| n.name.as_str()).collect();
            assert_eq!(children, ["user", "expect"], "{text:?}");
            let at = |needle: &str| text.find(needle).unwrap();
            assert!(in_comment(&text, at("the agent")), "{text:?}");
            assert!(!in_comment(&text, at("scenario")), "{text:?}");
        }
    }

    #[test]
    fn strings_comments_and_slashdash() {
        let text = "/- agent \"x\"\n// agent \"y\"\n/* a { */ tool #\"raw \"q\" \"# k=#true\n";
        let nodes = parse(text);
        assert!(nodes[0].commented);
        assert_eq!(nodes[1].name, "tool");
        assert_eq!(nodes[1].arg(0).unwrap().text, "raw \"q\" ");
        assert_eq!(nodes[1].setting("k").unwrap().text, "#true");
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::analysis;

    /// Pieces of suite text, cut anywhere: what an editor holds while a file is typed.
    fn pieces() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "scenario",
            "agent",
            "\"a\"",
            "\"",
            "#\"",
            "\"#",
            "\"\"\"",
            "{",
            "}",
            "=",
            ";",
            "\n",
            " ",
            "/-",
            "//",
            "/*",
            "*/",
            "(",
            ")",
            "\\",
            "{{",
            "}}",
            "user_context.",
            "é",
            "𝄞",
            "#true",
            "branch",
            "expect",
            "reply",
            "contains=",
            "\r\n",
            "\r",
        ]);
        prop::collection::vec(piece, 0..60).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("TRELLIS_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000)
        ))]

        #[test]
        fn reading_any_text_at_any_offset_never_panics(text in pieces(), at in 0usize..400) {
            let nodes = parse(&text);
            let mut offset = at.min(text.len());
            while !text.is_char_boundary(offset) {
                offset -= 1;
            }
            let _ = chain(&nodes, offset);
            let _ = analysis::place(&nodes, &text, offset);
        }
    }
}
