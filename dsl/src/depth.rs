//! Parsing suite text with the `kdl` crate without ever overflowing the stack.
//!
//! The `kdl` parser recurses: one level per `{` child block, one per piece of a `/* … */`
//! comment (every `*`, every `/` and every run of other characters, nested comments
//! included), and, while recovering from syntax errors, one per place where the top-level
//! node list stops (every stray `}`, `)` or `=`, for instance). A file nested 100,000 blocks
//! deep, or a block comment of 100,000 `*`s, or 100,000 stray `}`s overflows any thread's
//! stack and aborts the process, which no diagnostic can report. [`parse`] therefore
//!
//! - scans the text once, without recursion, skipping strings and line comments the way
//!   KDL v2 does, and refuses blocks nested deeper than [`MAX_BLOCK_DEPTH`] and comments of
//!   more than [`MAX_COMMENT_PIECES`] pieces (the decoder and the parsed document's `Drop`
//!   recurse per block too, so this protects them as well), with the offending offset;
//! - refuses files larger than [`MAX_FILE_SIZE`];
//! - runs the parser on a thread of its own whose stack (reserved address space, touched only
//!   as deep as the parser really goes) is sized for the worst case of error recovery on
//!   that many bytes.
//!
//! The limits are far beyond what a suite needs (see `docs/language.md`, "Limits").

use kdl::{KdlDocument, KdlError};

/// Deepest nesting of `{ … }` child blocks a suite file may have.
pub const MAX_BLOCK_DEPTH: usize = 128;

/// Most pieces (`*`, `/`, runs of other characters, nested comments) one `/* … */` comment
/// may have.
pub const MAX_COMMENT_PIECES: usize = 2_000;

/// Largest suite file parsed.
pub const MAX_FILE_SIZE: usize = 1024 * 1024;

/// Stack reserved per byte of text for the parser's error recovery (measured: about 3.3 KB
/// per stray `}` in a debug build; 1 KB was too little for some optimized builds' paths), plus
/// a fixed base. Only the pages the parser really reaches are ever touched.
const STACK_PER_BYTE: usize = 4096;
const STACK_BASE: usize = 16 * 1024 * 1024;

/// Why a file is refused before parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TooDeep {
    /// The `{` at `offset` opens block number `MAX_BLOCK_DEPTH + 1`.
    #[error("child blocks nested more than {MAX_BLOCK_DEPTH} deep")]
    Blocks { offset: usize },
    /// The `/*` at `offset` opens a comment of more than `MAX_COMMENT_PIECES` pieces.
    #[error("block comment with more than {MAX_COMMENT_PIECES} pieces")]
    Comment { offset: usize },
    /// The file is larger than `MAX_FILE_SIZE`.
    #[error("file larger than {} KiB", MAX_FILE_SIZE / 1024)]
    Large,
    /// No thread with a stack big enough for this file could be started.
    #[error("no memory for the parser's stack")]
    NoStack,
}

impl TooDeep {
    /// Byte offset of the `{` or `/*` that goes over the limit.
    pub fn offset(self) -> usize {
        match self {
            TooDeep::Blocks { offset } | TooDeep::Comment { offset } => offset,
            TooDeep::Large | TooDeep::NoStack => 0,
        }
    }
}

/// Parses `text` as a KDL v2 document, unless [`check`] or the size limit refuses it.
pub fn parse(text: &str) -> Result<Result<KdlDocument, KdlError>, TooDeep> {
    check(text)?;
    if text.len() > MAX_FILE_SIZE {
        return Err(TooDeep::Large);
    }
    let stack = STACK_BASE + text.len() * STACK_PER_BYTE;
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("kdl-parse".into())
            .stack_size(stack)
            .spawn_scoped(scope, || KdlDocument::parse_v2(text))
            .map_err(|_| TooDeep::NoStack)?
            .join()
            // The parser panicking is a bug of the crate; report it as a refusal rather
            // than taking the whole load down.
            .map_err(|_| TooDeep::NoStack)
    })
}

/// Checks that parsing `text` stays within [`MAX_BLOCK_DEPTH`] and [`MAX_COMMENT_PIECES`].
///
/// Text that is not valid KDL passes or fails alike; the parser reports its syntax errors.
pub fn check(text: &str) -> Result<(), TooDeep> {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                depth += 1;
                if depth > MAX_BLOCK_DEPTH {
                    return Err(TooDeep::Blocks { offset: i });
                }
                i += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = skip_line(b, i + 2);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = skip_comment(b, i)?;
            }
            b'"' => {
                i = skip_quoted(b, i);
            }
            b'#' => {
                i = skip_raw(b, i);
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn skip_line(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
        i += 1;
    }
    i
}

/// Skips the comment opening at `start` (on `/*`), counting its pieces as the parser does;
/// an unclosed comment is counted to the end of the text (the parser recurses through it
/// before it reports the missing `*/`).
fn skip_comment(b: &[u8], start: usize) -> Result<usize, TooDeep> {
    let mut open = 0usize;
    let mut pieces = 0usize;
    let mut i = start;
    while i < b.len() {
        match (b[i], b.get(i + 1)) {
            (b'/', Some(b'*')) => {
                open += 1;
                i += 2;
            }
            (b'*', Some(b'/')) => {
                open -= 1;
                i += 2;
                if open == 0 {
                    return Ok(i);
                }
            }
            (b'*' | b'/', _) => i += 1,
            _ => {
                while i < b.len() && b[i] != b'*' && b[i] != b'/' {
                    i += 1;
                }
            }
        }
        pieces += 1;
        if pieces > MAX_COMMENT_PIECES {
            return Err(TooDeep::Comment { offset: start });
        }
    }
    Ok(i)
}

/// Skips a `"…"` or `"""…"""` string starting at `start`; escapes never end one.
fn skip_quoted(b: &[u8], start: usize) -> usize {
    let multi = b[start..].starts_with(b"\"\"\"");
    let mut i = start + if multi { 3 } else { 1 };
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' if !multi => return i + 1,
            b'"' if b[i..].starts_with(b"\"\"\"") => return i + 3,
            _ => i += 1,
        }
    }
    i
}

/// Skips a raw string `#"…"#` or `#"""…"""#` (any number of `#`s) starting at `start`, or
/// just the `#`s of a keyword such as `#true`.
fn skip_raw(b: &[u8], start: usize) -> usize {
    let mut i = start;
    while i < b.len() && b[i] == b'#' {
        i += 1;
    }
    let hashes = i - start;
    if b.get(i) != Some(&b'"') {
        return i;
    }
    let quotes = if b[i..].starts_with(b"\"\"\"") { 3 } else { 1 };
    i += quotes;
    while i < b.len() {
        let closes = b[i..].len() >= quotes + hashes
            && b[i..i + quotes].iter().all(|&c| c == b'"')
            && b[i + quotes..i + quotes + hashes]
                .iter()
                .all(|&c| c == b'#');
        if closes {
            return i + quotes + hashes;
        }
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_blocks_outside_strings_and_comments() {
        let deep = "a {".repeat(MAX_BLOCK_DEPTH) + &"}".repeat(MAX_BLOCK_DEPTH);
        assert_eq!(check(&deep), Ok(()));
        let deeper = "a {".repeat(MAX_BLOCK_DEPTH + 1);
        assert_eq!(
            check(&deeper),
            Err(TooDeep::Blocks {
                offset: 3 * MAX_BLOCK_DEPTH + 2
            })
        );
        let braces = "{".repeat(1000);
        for text in [
            format!("a \"{braces}\""),
            format!("a \"\"\"\n{braces}\n\"\"\""),
            format!("a #\"{braces}\"#"),
            format!("a ##\"\"\"\n\"#{braces}\n\"\"\"##"),
            format!("a \"\\\"{braces}\""),
            format!("// {braces}\na"),
            format!("/* {braces} */ a"),
        ] {
            assert_eq!(check(&text), Ok(()), "{text}");
        }
    }

    #[test]
    fn counts_comment_pieces() {
        assert_eq!(check(&format!("/*{}*/", "*a".repeat(900))), Ok(()));
        let long = format!("x\n/*{}*/", "*a".repeat(MAX_COMMENT_PIECES));
        assert_eq!(check(&long), Err(TooDeep::Comment { offset: 2 }));
        let unclosed = format!("/*{}", "/ ".repeat(MAX_COMMENT_PIECES));
        assert_eq!(check(&unclosed), Err(TooDeep::Comment { offset: 0 }));
        let nested = "/*".repeat(MAX_COMMENT_PIECES + 1);
        assert_eq!(check(&nested), Err(TooDeep::Comment { offset: 0 }));
    }
}
