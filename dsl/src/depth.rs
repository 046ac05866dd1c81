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
//! - in the same scan, cuts the text into its top-level nodes, and parses them one at a time:
//!   the parsed document keeps about 75 bytes per byte of text (formatting, spans), so a
//!   whole 5 MB suite parsed at once took over 600 MB, while one node at a time is bounded by
//!   the largest node; each node's spans are moved to its place in the file, so diagnostics
//!   and model spans are the same as from a whole-file parse;
//! - refuses files larger than [`MAX_FILE_SIZE`] and top-level nodes larger than
//!   [`MAX_NODE_SIZE`];
//! - runs the parser on a thread of its own whose stack (reserved address space, touched only
//!   as deep as the parser really goes) is sized for the worst case of error recovery on
//!   the largest piece it parses; or, for a text of one batch, on the calling thread
//!   ([`parse_small`]), which a directory's parse-ahead threads are started with a stack for.
//!
//! The limits are far beyond what a suite needs (see `docs/language.md`, "Limits").

use std::ops::Range;
use std::sync::mpsc;

use kdl::{KdlDocument, KdlError, KdlIdentifier};

/// Deepest nesting of `{ … }` child blocks a suite file may have.
pub const MAX_BLOCK_DEPTH: usize = 128;

/// Most pieces (`*`, `/`, runs of other characters, nested comments) one `/* … */` comment
/// may have.
pub const MAX_COMMENT_PIECES: usize = 2_000;

/// Largest suite file parsed. Files are parsed one top-level node at a time, so this only
/// bounds the text held in memory (and the time taken), not the parser's needs.
pub const MAX_FILE_SIZE: usize = 64 * 1024 * 1024;

/// Largest piece parsed at once: one top-level node, or a whole file whose syntax errors
/// are reported from a whole-file parse (see [`parse_each`]). The parser's stack is sized
/// per byte of it.
pub const MAX_NODE_SIZE: usize = 1024 * 1024;

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
    #[error("file larger than {} MiB", MAX_FILE_SIZE / 1024 / 1024)]
    Large,
    /// The top-level node starting at `offset` is larger than `MAX_NODE_SIZE`.
    #[error("top-level node larger than {} KiB", MAX_NODE_SIZE / 1024)]
    Node { offset: usize },
    /// No thread with a stack big enough for this file could be started.
    #[error("no memory for the parser's stack")]
    NoStack,
    /// The `/-` at `offset` follows another `/-` with only whitespace or comments between.
    #[error("`/-` right after another `/-`")]
    Slashdash { offset: usize },
    /// The multi-line string opening at `offset` cannot be closed as KDL requires: its
    /// closing quotes never come, are not alone on their line, or a line of its text lacks
    /// their indentation.
    #[error("multi-line string not closed")]
    Unclosed { offset: usize },
}

impl TooDeep {
    /// Byte offset of the `{` or `/*` that goes over the limit.
    pub fn offset(self) -> usize {
        match self {
            TooDeep::Blocks { offset }
            | TooDeep::Comment { offset }
            | TooDeep::Node { offset }
            | TooDeep::Slashdash { offset }
            | TooDeep::Unclosed { offset } => offset,
            TooDeep::Large | TooDeep::NoStack => 0,
        }
    }
}

/// How [`parse_each`] parsed a file.
#[derive(Debug)]
pub enum Parsed {
    /// Every top-level node parsed; each was handed over in its own document.
    Nodes,
    /// Some node did not parse: this is the result of parsing the file as a whole (so syntax
    /// errors are reported exactly as the parser reports them in context), or, for a file
    /// larger than [`MAX_NODE_SIZE`], the syntax errors of every node, at their places in
    /// the file. What was handed over is every node that parsed on its own: to be discarded
    /// when the whole parsed after all, and to be checked alongside the syntax errors when it
    /// did not (so one syntax error does not hide the other nodes' mistakes).
    Whole(Result<KdlDocument, KdlError>),
}

/// Parses `text` as a KDL v2 document one top-level node at a time, handing each node's
/// document (spans relative to the whole `text`) to `each`, unless [`check`] or a size limit
/// refuses it.
///
/// Only a few batches' documents are alive at a time (see [`Handover`]), so memory stays
/// bounded by the largest node, not by the file.
pub fn parse_each(text: &str, mut each: impl FnMut(KdlDocument)) -> Result<Parsed, TooDeep> {
    let nodes = pieces(text)?;
    let largest = nodes.iter().map(|r| r.len()).max().unwrap_or(0);
    // A rendezvous: the parser holds at most one finished hand-over while the decoder takes
    // the one before, so two batches' trees are alive at once. With a slot in the channel
    // an optimised parser ran a third ahead (loading a 381 KB suite peaked at 14.9 MB
    // instead of 11.3; `dsl/tests/load_memory.rs`), for no faster load.
    let (tx, rx) = mpsc::sync_channel::<Vec<KdlDocument>>(0);
    let failed = on_parser_stack(
        largest,
        move || {
            let mut handover = Handover::new(tx);
            let failed = parse_pieces(text, nodes, |doc| handover.add(doc));
            handover.flush();
            failed
        },
        || rx.into_iter().flatten().for_each(&mut each),
    )?;
    finish(text, failed, |text| {
        on_parser_stack(text.len(), || KdlDocument::parse_v2(text), || {})
    })
}

/// The parser's documents on their way to the decoder's thread, sent together once they hold
/// [`MIN_HANDOVER`] bytes of text. A batch of nodes that parses is that large and goes at
/// once; a file with a syntax error is parsed node by node after it (`send_each_node`), and
/// one hand-over per node woke the decoder's thread for each: a 20,000-scenario file with one
/// typo took 0.59 s to load instead of 0.14 s, 20,698 context switches against 34.
struct Handover {
    tx: mpsc::SyncSender<Vec<KdlDocument>>,
    docs: Vec<KdlDocument>,
    bytes: usize,
}

/// Text the documents of one [`Handover`] hold before they are sent: a quarter of a batch,
/// so the documents alive at once stay within about two batches' parse trees.
const MIN_HANDOVER: usize = BATCH_SIZE / 4;

impl Handover {
    fn new(tx: mpsc::SyncSender<Vec<KdlDocument>>) -> Self {
        Handover {
            tx,
            docs: Vec::new(),
            bytes: 0,
        }
    }

    /// Adds `doc`, sending what is held once it is enough; whether the decoder still takes
    /// documents.
    fn add(&mut self, doc: KdlDocument) -> bool {
        self.bytes += doc.span().len();
        self.docs.push(doc);
        if self.bytes < MIN_HANDOVER {
            return true;
        }
        self.flush()
    }

    /// Sends what is held; whether the decoder still takes documents.
    fn flush(&mut self) -> bool {
        self.bytes = 0;
        if self.docs.is_empty() {
            return true;
        }
        self.tx.send(std::mem::take(&mut self.docs)).is_ok()
    }
}

/// Largest text [`parse_small`] takes: one batch.
pub const SMALL_TEXT: usize = BATCH_SIZE;

/// Stack (reserved bytes) of a thread that calls [`parse_small`].
pub const SMALL_STACK: usize = STACK_BASE + SMALL_TEXT * STACK_PER_BYTE;

/// A text of at most [`SMALL_TEXT`] bytes parsed as [`parse_each`] parses it, on the calling
/// thread, whose stack must be [`SMALL_STACK`]: the documents `parse_each` would hand over,
/// in order, and what it would return. `None` for a larger text. This is how a directory's
/// files are parsed ahead of their decoding (see `parse/include.rs`), without a thread per
/// file.
pub fn parse_small(text: &str) -> Option<Result<(Vec<KdlDocument>, Parsed), TooDeep>> {
    if text.len() > SMALL_TEXT {
        return None;
    }
    let nodes = match pieces(text) {
        Ok(nodes) => nodes,
        Err(refused) => return Some(Err(refused)),
    };
    let mut docs = Vec::new();
    let failed = parse_pieces(text, nodes, |doc| {
        docs.push(doc);
        true
    });
    Some(finish(text, failed, |text| Ok(KdlDocument::parse_v2(text))).map(|parsed| (docs, parsed)))
}

/// `text` checked against the limits and cut into the pieces parsed one at a time.
fn pieces(text: &str) -> Result<Vec<Range<usize>>, TooDeep> {
    let nodes = scan(text)?;
    if text.len() > MAX_FILE_SIZE {
        return Err(TooDeep::Large);
    }
    if let Some(big) = nodes.iter().find(|r| r.len() > MAX_NODE_SIZE) {
        return Err(TooDeep::Node { offset: big.start });
    }
    Ok(batches(nodes))
}

/// Parses each piece of `text` and hands the document of every one that parses to `send`
/// (which says whether to go on). `None` when every piece parsed; `Some(None)` when a small
/// file is to be parsed again as a whole; `Some(Some(errors))`: every piece's syntax errors,
/// for a large file.
fn parse_pieces(
    text: &str,
    nodes: Vec<Range<usize>>,
    mut send: impl FnMut(KdlDocument) -> bool,
) -> Option<Option<KdlError>> {
    let mut failed: Option<KdlError> = None;
    let mut reparse = false;
    for range in nodes {
        let at = range.start;
        // A node larger than a batch: piece by piece, so that its whole parse tree
        // (about 75 bytes per byte of text) is never alive at once.
        if range.len() > BATCH_SIZE
            && let Some(doc) = parse_split(text, range.clone())
        {
            if !send(doc) {
                break;
            }
            continue;
        }
        let broken = reparse || failed.is_some();
        let mut err = match KdlDocument::parse_v2(&text[range.clone()]) {
            // Until a piece fails, the cut into nodes is sound: the batch goes whole.
            Ok(mut doc) if !broken => {
                shift(&mut doc, at);
                if !send(doc) {
                    break;
                }
                continue;
            }
            // Once one failed, the cut may be off (a missing `{` makes a block's children
            // look top-level): node by node, as `send_each_node` keeps them.
            Ok(_) => {
                if !send_each_node(text, range, &mut send) {
                    break;
                }
                continue;
            }
            Err(err) => {
                if !send_each_node(text, range, &mut send) {
                    break;
                }
                err
            }
        };
        // A small file is parsed again as a whole below; a large one gets every node's
        // errors.
        if text.len() <= MAX_NODE_SIZE {
            reparse = true;
            continue;
        }
        for d in &mut err.diagnostics {
            d.span = moved(d.span, at);
        }
        match &mut failed {
            Some(first) => first.diagnostics.append(&mut err.diagnostics),
            None => failed = Some(err),
        }
    }
    if reparse {
        return Some(None);
    }
    failed.map(Some)
}

/// The nodes of a batch of a file that does not parse, each that parses on its own and
/// starts a line handed to `send`; whether to go on. An indented one is left out: it is
/// most likely a child of a block whose `{` or `}` is what broke the file, and decoded at
/// the top level it would be reported as a mistake of its own.
fn send_each_node(
    text: &str,
    batch: Range<usize>,
    send: &mut impl FnMut(KdlDocument) -> bool,
) -> bool {
    send_each_node_within(text, batch, send, 0)
}

/// How many open blocks [`send_each_node`] looks past, one inside the other.
const MAX_RECOVERIES: usize = 16;

fn send_each_node_within(
    text: &str,
    batch: Range<usize>,
    send: &mut impl FnMut(KdlDocument) -> bool,
    depth: usize,
) -> bool {
    let Ok(nodes) = scan(&text[batch.clone()]) else {
        return true;
    };
    // Where the line holding the current node starts. The nodes come in order, so the text
    // is searched for line breaks once, forward: searching back from each node read a line
    // of many nodes (`a; b; c; …`) once per node.
    let mut line_start = text[..batch.start].rfind(['\n', '\r']).map_or(0, |i| i + 1);
    let mut searched = batch.start;
    for node in nodes {
        let range = node.start + batch.start..node.end + batch.start;
        if let Some(i) = text[searched..range.start].rfind(['\n', '\r']) {
            line_start = searched + i + 1;
        }
        searched = searched.max(range.start);
        // A piece starts where the last one ended: after a line break, its first line's
        // indentation is its own.
        let written = text[line_start..range.end]
            .trim_start_matches(['\n', '\r', '\u{feff}'])
            .trim_start_matches(|c: char| c.is_whitespace() && c != '\n' && c != '\r');
        let first_line_start = range.end - written.len();
        let indented = text[..first_line_start]
            .chars()
            .next_back()
            .is_some_and(|c| c != '\n' && c != '\r' && c != '\u{feff}');
        if indented {
            continue;
        }
        match KdlDocument::parse_v2(&text[range.clone()]) {
            Ok(mut doc) => {
                shift(&mut doc, range.start);
                if !send(doc) {
                    return false;
                }
            }
            Err(err) if depth < MAX_RECOVERIES => {
                let lines = block_lines(text, range.clone());
                // Where the parser first stumbled, in the file.
                let stumbled = err
                    .diagnostics
                    .iter()
                    .map(|d| range.start + d.span.offset())
                    .min();
                // The node as far as it parses, cut before the child where it stops: the
                // mistakes above the one being typed are still shown.
                if let Some(doc) = lines
                    .as_ref()
                    .and_then(|l| parse_prefix(text, &range, l, stumbled))
                    && !send(doc)
                {
                    return false;
                }
                // A block left open (a missing `}`) takes the rest of the file into this
                // node: the nodes in it written at a line's start, as top-level nodes are,
                // are checked on their own.
                if let Some(next) = lines.and_then(|l| l.swallowed)
                    && !send_each_node_within(text, next..range.end, send, depth + 1)
                {
                    return false;
                }
            }
            Err(_) => {}
        }
    }
    true
}

/// The lines of a failing node's block, read as the parser reads them (strings and
/// comments skipped).
struct BlockLines {
    /// Where each line at the block's own level starts: where one of its children may.
    starts: Vec<usize>,
    /// In a node whose block is never closed, where the first of those lines starts with a
    /// top-level node of the language (`scenario`, `agent`, …) at its first column: the
    /// node the open block swallowed (neither commented-out code nor a multi-line string's
    /// text is taken for one).
    swallowed: Option<usize>,
}

/// [`BlockLines`] of the node in `range`; `None` when its text cannot be followed (an
/// unclosed string).
fn block_lines(text: &str, range: Range<usize>) -> Option<BlockLines> {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut starts = Vec::new();
    let mut swallowed = None;
    // After a `\` the node goes on on the next line: no child starts there.
    let mut continued = false;
    let mut i = range.start;
    while i < range.end {
        match b[i] {
            b'{' => {
                depth += 1;
                i += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'\\' => {
                continued = true;
                i += 1;
            }
            // One line break, `\r\n` included.
            b'\r' if b.get(i + 1) == Some(&b'\n') => i += 1,
            b'\n' | b'\r' => {
                i += 1;
                if std::mem::take(&mut continued) {
                    continue;
                }
                if depth == 1 && i < range.end {
                    starts.push(i);
                    if swallowed.is_none() {
                        let word = text[i..range.end]
                            .split(|c: char| c.is_whitespace() || c == '{' || c == ';')
                            .next()
                            .unwrap_or_default();
                        if crate::lang::top_level()
                            .iter()
                            .any(|spec| spec.name == word)
                        {
                            swallowed = Some(i);
                        }
                    }
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => i = skip_line(b, i + 2),
            b'/' if b.get(i + 1) == Some(&b'*') => i = comment_end(b, i).0,
            b'"' => i = skip_quoted(b, i).ok()?,
            b'#' if matches!(b.get(i + 1), Some(b'"' | b'#')) => i = skip_raw(b, i).ok()?,
            _ => i += 1,
        }
    }
    // Only a block left open swallowed what follows it.
    if depth == 0 {
        swallowed = None;
    }
    Some(BlockLines { starts, swallowed })
}

/// Largest part of a node [`parse_prefix`] parses again.
const MAX_PREFIX_NODE: usize = 64 * 1024;

/// Cuts [`parse_prefix`] tries: the last line before where the parser stumbled, and a few
/// before it (a child may span lines).
const MAX_PREFIX_TRIES: usize = 3;

/// Settings of a scenario that apply wherever they are written (the turn it starts with,
/// the captures and contexts templates read, its rows and values): a cut before one of
/// them would check what is above it without it, and report mistakes that are not there.
const REACHING_BACK: [&str; 9] = [
    "first-turn",
    "initial-message",
    "history",
    "capture",
    "user-context",
    "matrix",
    "persona",
    "simulator",
    "row-id",
];

/// The failing node in `range`, closed before the line where the parser first stumbled
/// (`stumbled`), as far as that parses: `None` when no cut parses, when a setting that
/// applies to the whole node comes after the cut, or when the part to parse is large.
fn parse_prefix(
    text: &str,
    range: &Range<usize>,
    lines: &BlockLines,
    stumbled: Option<usize>,
) -> Option<KdlDocument> {
    let end = lines
        .swallowed
        .unwrap_or(range.end)
        .min(stumbled.unwrap_or(range.end));
    if end - range.start > MAX_PREFIX_NODE {
        return None;
    }
    let word_at = |at: usize| {
        text[at..range.end]
            .trim_start()
            .split(|c: char| c.is_whitespace() || c == '{' || c == ';' || c == '=')
            .next()
            .unwrap_or_default()
    };
    let cuts: Vec<usize> = lines
        .starts
        .iter()
        .copied()
        .filter(|&at| at <= end)
        .collect();
    for &cut in cuts.iter().rev().take(MAX_PREFIX_TRIES) {
        let later = lines
            .starts
            .iter()
            .filter(|&&at| at >= cut && lines.swallowed.is_none_or(|s| at < s));
        if later
            .clone()
            .any(|&at| REACHING_BACK.contains(&word_at(at)))
        {
            return None;
        }
        let candidate = format!("{}}}", &text[range.start..cut]);
        if let Ok(mut doc) = KdlDocument::parse_v2(&candidate) {
            // A slashdashed node parses to none: nothing to check.
            if doc.nodes().len() != 1 {
                return None;
            }
            shift(&mut doc, range.start);
            return Some(doc);
        }
    }
    None
}

/// Where the comment opening at `start` (on `/*`) ends, and whether it is closed: comments
/// nest, so `/* a /* b */` at the end of the text is not. For text [`scan`] accepted, whose
/// comments are within [`MAX_COMMENT_PIECES`].
pub(crate) fn comment_end(b: &[u8], start: usize) -> (usize, bool) {
    comment_extent(b, start).unwrap_or((b.len(), false))
}

/// Where the first `/*` that is never closed opens, if one is: strings, raw strings and
/// `//` comments are skipped as the parser reads them.
pub(crate) fn unclosed_comment(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => i = skip_line(b, i + 2),
            b'/' if b.get(i + 1) == Some(&b'*') => match comment_end(b, i) {
                (_, false) => return Some(i),
                (end, true) => i = end,
            },
            // An unclosed string is the parser's error to report, not a comment's.
            b'"' => i = skip_quoted(b, i).ok()?,
            b'#' if matches!(b.get(i + 1), Some(b'"' | b'#')) => i = skip_raw(b, i).ok()?,
            _ => i += 1,
        }
    }
    None
}

/// What [`parse_pieces`] found, as [`Parsed`]; `whole` parses a small file again as a whole.
fn finish(
    text: &str,
    failed: Option<Option<KdlError>>,
    whole: impl FnOnce(&str) -> Result<Result<KdlDocument, KdlError>, TooDeep>,
) -> Result<Parsed, TooDeep> {
    match failed {
        None => Ok(Parsed::Nodes),
        Some(Some(errors)) => Ok(Parsed::Whole(Err(errors))),
        Some(None) => Ok(Parsed::Whole(whole(text)?)),
    }
}

/// Most bytes of consecutive top-level nodes parsed as one document: their parse tree stays
/// a few MiB (about 75 bytes per byte of text), and there are few enough documents that
/// handing them from the parser's thread to the decoder costs nothing next to parsing (one
/// hand-over per node made a 31,000-scenario file a third slower to load).
const BATCH_SIZE: usize = 64 * 1024;

/// Consecutive node ranges joined into ranges of at most [`BATCH_SIZE`] bytes (a larger node
/// stays alone).
fn batches(nodes: Vec<Range<usize>>) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for range in nodes {
        match out.last_mut() {
            Some(last) if last.end == range.start && range.end - last.start <= BATCH_SIZE => {
                last.end = range.end;
            }
            _ => out.push(range),
        }
    }
    out
}

/// One node larger than [`BATCH_SIZE`] (`range`, in `text`), parsed as its header with an
/// empty block and its children in batches, each batch's tree copied to exact capacity
/// (a fresh parse tree holds about four times what a copy of it does) before the next one is
/// parsed; a child larger than a batch is split the same way. Spans are the whole file's,
/// as a parse of the node would give them. `None` when the node is not one block-carrying
/// node this can cut safely (a slashdashed block, text after the block, several nodes) or
/// when a piece does not parse: the caller parses it whole, and reports its errors.
fn parse_split(text: &str, range: Range<usize>) -> Option<KdlDocument> {
    let (open, close) = block_of(text.as_bytes(), range.clone())?;
    // The node without what its block holds: what follows the block (the terminator, a
    // comment) stays, so the node's span ends where a parse of the whole node ends it.
    let header = format!(
        "{}{}",
        text.get(range.start..=open)?,
        text.get(close..range.end)?
    );
    let mut doc = KdlDocument::parse_v2(&header).ok()?;
    if doc.nodes().len() != 1 {
        return None;
    }
    shift(&mut doc, range.start);
    let inner = open + 1..close;
    let pieces = scan(text.get(inner.clone())?).ok()?;
    let pieces = batches(
        pieces
            .into_iter()
            .map(|r| r.start + inner.start..r.end + inner.start)
            .collect(),
    );
    let mut children = KdlDocument::new();
    for piece in pieces {
        let split_part = (piece.len() > BATCH_SIZE)
            .then(|| parse_split(text, piece.clone()))
            .flatten();
        let mut part = match split_part {
            // Already built of compact pieces.
            Some(part) => part,
            None => {
                let mut fresh = KdlDocument::parse_v2(text.get(piece.clone())?).ok()?;
                shift(&mut fresh, piece.start);
                // A copy holds a quarter of what the fresh tree does.
                fresh.clone()
            }
        };
        children.nodes_mut().append(part.nodes_mut());
    }
    children.nodes_mut().shrink_to_fit();
    // The block's span as the parser gives it: from its first node's start to its last
    // node's end.
    let first = children.nodes().first()?.span().offset();
    let last = children.nodes().last()?.span();
    children.set_span(miette::SourceSpan::new(
        first.into(),
        last.offset() + last.len() - first,
    ));
    let node = doc.nodes_mut().first_mut()?;
    node.set_span(miette::SourceSpan::new(
        node.span().offset().into(),
        node.span().len() + (close - open - 1),
    ));
    node.set_children(children);
    doc.set_span(miette::SourceSpan::new(range.start.into(), range.len()));
    Some(doc)
}

/// The `{` and the matching `}` of the one block of the one node in `range`: `None` unless
/// exactly one block opens at the node's level, nothing but whitespace stands between a
/// slashdash and it, and only whitespace, `;` and comments follow it.
fn block_of(b: &[u8], range: Range<usize>) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    let mut open = None;
    let mut close = None;
    let mut i = range.start;
    while i < range.end {
        match b[i] {
            b'{' => {
                if depth == 0 {
                    if open.is_some() {
                        return None;
                    }
                    // A slashdashed block (`node /- { … } { … }`) is a comment.
                    let before = b.get(range.start..i)?;
                    let trimmed = before.trim_ascii_end();
                    if trimmed.ends_with(b"/-") {
                        return None;
                    }
                    open = Some(i);
                }
                depth += 1;
                i += 1;
            }
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    close = Some(i);
                }
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => i = skip_line(b, i + 2),
            b'/' if b.get(i + 1) == Some(&b'*') => i = skip_comment(b, i).ok()?,
            b'"' => i = skip_quoted(b, i).ok()?,
            b'#' => i = skip_raw(b, i).ok()?,
            c => {
                // After the block: only whitespace and `;` (comments are skipped above).
                if close.is_some() && depth == 0 && !(c.is_ascii_whitespace() || c == b';') {
                    return None;
                }
                i += 1;
            }
        }
    }
    match (open, close, depth) {
        (Some(open), Some(close), 0) if open < close => Some((open, close)),
        _ => None,
    }
}

/// Runs `parse` on a thread whose stack is sized for parsing `len` bytes, and `meanwhile`
/// on this one.
fn on_parser_stack<T: Send>(
    len: usize,
    parse: impl FnOnce() -> T + Send,
    meanwhile: impl FnOnce(),
) -> Result<T, TooDeep> {
    let stack = STACK_BASE + len * STACK_PER_BYTE;
    std::thread::scope(|scope| {
        let parser = std::thread::Builder::new()
            .name("kdl-parse".into())
            .stack_size(stack)
            .spawn_scoped(scope, parse)
            .map_err(|_| TooDeep::NoStack)?;
        meanwhile();
        parser
            .join()
            // The parser panicking is a bug of the crate; report it as a refusal rather
            // than taking the whole load down.
            .map_err(|_| TooDeep::NoStack)
    })
}

fn moved(span: miette::SourceSpan, by: usize) -> miette::SourceSpan {
    miette::SourceSpan::new((span.offset() + by).into(), span.len())
}

fn shift_id(id: &mut KdlIdentifier, by: usize) {
    id.set_span(moved(id.span(), by));
}

/// Moves every span in `doc` by `by` bytes. Recursion is bounded by [`MAX_BLOCK_DEPTH`].
fn shift(doc: &mut KdlDocument, by: usize) {
    doc.set_span(moved(doc.span(), by));
    for node in doc.nodes_mut() {
        node.set_span(moved(node.span(), by));
        shift_id(node.name_mut(), by);
        if let Some(ty) = node.ty_mut() {
            shift_id(ty, by);
        }
        for entry in node.entries_mut() {
            entry.set_span(moved(entry.span(), by));
            if let Some(name) = entry.name_mut() {
                shift_id(name, by);
            }
            if let Some(ty) = entry.ty_mut() {
                shift_id(ty, by);
            }
        }
        if let Some(children) = node.children_mut() {
            shift(children, by);
        }
    }
}

/// Checks that parsing `text` stays within [`MAX_BLOCK_DEPTH`] and [`MAX_COMMENT_PIECES`].
///
/// Text that is not valid KDL passes or fails alike; the parser reports its syntax errors.
pub fn check(text: &str) -> Result<(), TooDeep> {
    scan(text).map(drop)
}

/// Checks `text` as [`check`] does and cuts it into the byte ranges of its top-level nodes,
/// which cover the whole text, in order.
///
/// A node ends after a newline or `;` outside blocks, strings and comments, unless a line
/// continuation `\` or a slashdash `/-` (which comments out the next node, across newlines)
/// carries it on. Where that is not certain (a lone `\r` or a Unicode newline, a slashdash
/// followed by non-ASCII text) the text is not cut: a range may hold several nodes, never
/// part of one. Invalid text is cut the same way; the parser reports its errors.
pub fn scan(text: &str) -> Result<Vec<Range<usize>>, TooDeep> {
    let b = text.as_bytes();
    let mut nodes = Vec::new();
    let mut start = 0;
    let mut depth = 0usize;
    // A `\` continues the node on the next line.
    let mut continued = false;
    // A `/-` has been seen, and not yet what it comments out.
    let mut slashdash = false;
    // The same at any depth, for `/-` right after `/-`: never valid KDL, and the parser's
    // error recovery rescans the rest of the node for each one, so a line of a few thousand
    // of them took minutes (`('/- /- x ') * 800`: 27 s).
    let mut pending_slashdash = false;
    let mut i = 0;
    while i < b.len() {
        if pending_slashdash
            && !(b[i].is_ascii_whitespace()
                || b[i] == b'\\'
                || (b[i] == b'/' && matches!(b.get(i + 1), Some(b'/' | b'*' | b'-'))))
        {
            pending_slashdash = false;
        }
        match b[i] {
            b'{' => {
                depth += 1;
                if depth > MAX_BLOCK_DEPTH {
                    return Err(TooDeep::Blocks { offset: i });
                }
                slashdash = false;
                i += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'\n' | b';' if depth == 0 => {
                i += 1;
                if b[i - 1] == b'\n' && (continued || slashdash) {
                    continued = false;
                } else if !slashdash {
                    nodes.push(start..i);
                    start = i;
                    continued = false;
                }
            }
            b'\\' => {
                if depth == 0 {
                    continued = true;
                }
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = skip_line(b, i + 2);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = skip_comment(b, i)?;
            }
            b'/' if b.get(i + 1) == Some(&b'-') => {
                if pending_slashdash {
                    return Err(TooDeep::Slashdash { offset: i });
                }
                pending_slashdash = true;
                if depth == 0 {
                    slashdash = true;
                }
                i += 2;
            }
            b'"' => {
                slashdash = false;
                i = skip_quoted(b, i)?;
            }
            b'#' => {
                slashdash = false;
                i = skip_raw(b, i)?;
            }
            c => {
                if !c.is_ascii_whitespace() && c.is_ascii() {
                    slashdash = false;
                }
                i += 1;
            }
        }
    }
    if start < b.len() {
        nodes.push(start..b.len());
    }
    Ok(nodes)
}

pub(crate) fn skip_line(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
        i += 1;
    }
    i
}

/// Skips the comment opening at `start` (on `/*`), counting its pieces as the parser does;
/// an unclosed comment is counted to the end of the text (the parser recurses through it
/// before it reports the missing `*/`).
pub(crate) fn skip_comment(b: &[u8], start: usize) -> Result<usize, TooDeep> {
    comment_extent(b, start).map(|(end, _)| end)
}

/// [`skip_comment`], also saying whether the comment was closed.
fn comment_extent(b: &[u8], start: usize) -> Result<(usize, bool), TooDeep> {
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
                    return Ok((i, true));
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
    Ok((i, false))
}

/// Whether `c` ends a line for KDL (its other newlines are not ASCII).
fn is_newline(c: u8) -> bool {
    matches!(c, b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Whether the closing quotes at `at` may stand alone on their line, as a multi-line string's
/// must: only spaces and tabs before them since the line's start. Anything not plain ASCII
/// (a Unicode space or newline, a `\` escaping whitespace) is given the benefit of the doubt;
/// the parser decides.
fn alone_on_line(b: &[u8], at: usize) -> bool {
    b[..at]
        .iter()
        .rev()
        .find(|&&c| c != b' ' && c != b'\t')
        .is_none_or(|&c| is_newline(c) || c == b'\\' || !c.is_ascii())
}

/// Whether the closing quotes at `at` end a multi-line string whose text starts at `from`
/// as the parser requires: alone on their line (see [`alone_on_line`]), and every line of the
/// text starting with the closing line's indentation or holding only spaces. A line whose
/// first other character is not plain ASCII, or text holding a Unicode newline or (when
/// `escapes`, in a quoted string) a `\` (which may escape a newline), is given the benefit of
/// the doubt.
fn closes_multi_line(b: &[u8], from: usize, at: usize, escapes: bool) -> bool {
    if !alone_on_line(b, at) {
        return false;
    }
    let blank = |c: &u8| *c == b' ' || *c == b'\t';
    let indent = b[..at].iter().rev().take_while(|c| blank(c)).count();
    let to = at - indent;
    let text = &b[from..to];
    let unicode_newline = text
        .windows(3)
        .any(|w| w[..2] == [0xc2, 0x85] || w == [0xe2, 0x80, 0xa8] || w == [0xe2, 0x80, 0xa9]);
    if to == 0 || !is_newline(b[to - 1]) || unicode_newline || escapes && text.contains(&b'\\') {
        return true;
    }
    let prefix = &b[to..at];
    text.split(|&c| is_newline(c)).all(|line| {
        line.starts_with(prefix)
            || line
                .iter()
                .find(|c| !blank(c))
                .is_none_or(|&c| !c.is_ascii() || c == b'\\')
    })
}

/// Skips a `"…"` or `"""…"""` string starting at `start`; escapes never end one.
///
/// A multi-line string the parser cannot close is refused ([`TooDeep::Unclosed`]): the
/// parser scans from its opening to the end of the text for the closing line, and after
/// failing resumes inside it, trying every `#"""` there again to the same end, so a few
/// thousand of them after an unclosed one took minutes. A one-line string ends at a newline,
/// as the parser's error recovery has it: that error costs it nothing.
pub(crate) fn skip_quoted(b: &[u8], start: usize) -> Result<usize, TooDeep> {
    let unclosed = Err(TooDeep::Unclosed { offset: start });
    if b[start..].starts_with(b"\"\"\"") {
        // Without a newline right after `"""` the parser stops at once; only a multi-line
        // string is checked.
        let multi_line = b.get(start + 3).is_some_and(|&c| is_newline(c));
        let mut i = start + 3;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' if b[i..].starts_with(b"\"\"\"") => {
                    if multi_line && !closes_multi_line(b, start + 3, i, true) {
                        return unclosed;
                    }
                    return Ok(i + 3);
                }
                _ => i += 1,
            }
        }
        return if multi_line { unclosed } else { Ok(i) };
    }
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            // `\` and whitespace, newlines included: all of it is skipped.
            b'\\'
                if b.get(i + 1)
                    .is_some_and(|&c| c == b' ' || c == b'\t' || is_newline(c)) =>
            {
                i += 1;
                while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || is_newline(b[i])) {
                    i += 1;
                }
            }
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            c if is_newline(c) => return Ok(i),
            _ => i += 1,
        }
    }
    Ok(i)
}

/// Skips a raw string `#"…"#` or `#"""…"""#` (any number of `#`s) starting at `start`, or
/// just the `#`s of a keyword such as `#true`. A multi-line raw string the parser cannot
/// close is refused and a one-line one ends at a newline, as in [`skip_quoted`].
pub(crate) fn skip_raw(b: &[u8], start: usize) -> Result<usize, TooDeep> {
    let mut i = start;
    while i < b.len() && b[i] == b'#' {
        i += 1;
    }
    let hashes = i - start;
    if b.get(i) != Some(&b'"') {
        return Ok(i);
    }
    // As the parser: `"""` opens a multi-line string only when a newline follows.
    let multi_line = b[i..].starts_with(b"\"\"\"") && b.get(i + 3).is_some_and(|&c| is_newline(c));
    let quotes = if multi_line { 3 } else { 1 };
    i += quotes;
    while i < b.len() {
        let closes = b[i..].len() >= quotes + hashes
            && b[i..i + quotes].iter().all(|&c| c == b'"')
            && b[i + quotes..i + quotes + hashes]
                .iter()
                .all(|&c| c == b'#');
        if closes {
            if multi_line && !closes_multi_line(b, start + hashes + 3, i, false) {
                break;
            }
            return Ok(i + quotes + hashes);
        }
        if !multi_line && is_newline(b[i]) {
            return Ok(i);
        }
        i += 1;
    }
    if multi_line {
        Err(TooDeep::Unclosed { offset: start })
    } else {
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_files_nodes_reach_the_decoder_in_order_and_in_few_handovers() {
        let mut text = String::from("broken 1 = 2\n");
        for i in 0..5_000 {
            text.push_str(&format!("node{i} {{\n    child {i}\n}}\n"));
        }
        let (tx, rx) = mpsc::sync_channel(5_001);
        let mut handover = Handover::new(tx);
        let failed = parse_pieces(&text, pieces(&text).unwrap(), |doc| handover.add(doc));
        assert!(handover.flush());
        drop(handover);
        assert!(failed.is_some(), "the broken node is reported");
        let groups: Vec<Vec<KdlDocument>> = rx.into_iter().collect();
        let names: Vec<String> = groups
            .iter()
            .flatten()
            .flat_map(|doc| doc.nodes().iter().map(|n| n.name().value().to_owned()))
            .collect();
        let expected: Vec<String> = (0..5_000).map(|i| format!("node{i}")).collect();
        assert_eq!(names, expected);
        // One hand-over per node woke the decoder's thread 5,000 times.
        assert!(
            groups.len() <= text.len() / MIN_HANDOVER + 1,
            "{} hand-overs",
            groups.len()
        );
        assert!(groups.iter().all(|g| !g.is_empty()));
    }

    #[test]
    fn refuses_a_slashdash_right_after_a_slashdash() {
        assert_eq!(check("/- a\n/-b {}\nc /- d /-{ }"), Ok(()));
        assert_eq!(check("a /-\"/- /-\" #\"/- /-\"# // /- /-\nb"), Ok(()));
        assert_eq!(check("a /- /- b"), Err(TooDeep::Slashdash { offset: 5 }));
        assert_eq!(
            check("a {\n  /- /* c */ \\\n /- b\n}"),
            Err(TooDeep::Slashdash { offset: 20 })
        );
        assert_eq!(check("/-\n/-\nb"), Err(TooDeep::Slashdash { offset: 3 }));
    }

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
    fn refuses_strings_the_parser_cannot_close() {
        for ok in [
            "a \"b\" #\"c\"# ##\"d\"#e\"## #true",
            "a \"\"\"\n  b\n  \"\"\"",
            "a #\"\"\"\n  \"\"\" b\n  \"\"\"#",
            "a \"b \\\n   c\" \"\\\"\"",
            // `"""` with no newline after is a one-line raw string starting with `""`.
            "a #\"\"\"b\"# #\"\"\"c\"\"\"#",
            // Lines of spaces only, or none at all, need no indentation.
            "a #\"\"\"\n    b\n\n  \n\r\n    c\n    \"\"\"#",
            "a \"\"\"\n\"\"\"",
            // An escaped newline does not start a line.
            "a \"\"\"\n  b \\\nc\n  \"\"\"",
            // Not plain ASCII before the closing quotes: the parser decides.
            "a \"\"\"\n\u{3000}\"\"\"",
            // One-line strings end at a newline or the end, closed or not (the parser
            // reports them at no cost).
            "a \"b",
            "a \"b\nc",
            "a #\"b\nc",
            "a b=##\"c\"#",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok:?}");
        }
        for (text, offset) in [
            ("a \"\"\"\n b", 2),
            ("a \"\"\"\n b \"\"\"", 2),
            ("a {\n  b #\"\"\"\n c\n x\"\"\"#\n}", 8),
            ("a \"\"\"\n  b\n c\n  \"\"\"", 2),
            ("a ##\"\"\"\n\tb\n  \"\"\"##", 2),
        ] {
            assert_eq!(check(text), Err(TooDeep::Unclosed { offset }), "{text:?}");
        }
        // The parser tried each of these to the end of the text: minutes for a few thousand.
        let openers = format!(
            "scenario \"s\" {{\n  user {}}}\n",
            "#\"\"\"\n".repeat(5_000)
        );
        assert_eq!(check(&openers), Err(TooDeep::Unclosed { offset: 22 }));
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

    /// Every span of `doc`'s nodes, depth first.
    fn spans(doc: &KdlDocument, out: &mut Vec<(usize, usize)>) {
        for node in doc.nodes() {
            for span in [node.span(), node.name().span()]
                .into_iter()
                .chain(node.entries().iter().map(|e| e.span()))
                .chain(
                    node.entries()
                        .iter()
                        .filter_map(|e| e.name())
                        .map(|n| n.span()),
                )
            {
                out.push((span.offset(), span.len()));
            }
            if let Some(children) = node.children() {
                spans(children, out);
            }
        }
    }

    #[test]
    fn cuts_at_node_ends_only() {
        let text = concat!(
            "a 1; b 2\n",
            "/-\n  c {\n  x\n}\n",
            "d \\ // continued\n  3\n",
            "e \"\"\"\n;\n\"\"\"\n",
            "f #\"\"\"\n;\n\"\"\"#\n",
            "g /* \n; */ 4\n",
            "h \"\\\n;\"\n",
            "i",
        );
        let cut: Vec<&str> = scan(text).unwrap().into_iter().map(|r| &text[r]).collect();
        assert_eq!(
            cut,
            [
                "a 1;",
                " b 2\n",
                "/-\n  c {\n  x\n}\n",
                "d \\ // continued\n  3\n",
                "e \"\"\"\n;\n\"\"\"\n",
                "f #\"\"\"\n;\n\"\"\"#\n",
                "g /* \n; */ 4\n",
                "h \"\\\n;\"\n",
                "i",
            ]
        );
        assert!(matches!(parse_each(text, |_| {}), Ok(Parsed::Nodes)));
    }

    #[test]
    fn a_large_document_is_parsed_node_by_node_with_whole_file_spans() {
        let mut text = String::from("/- kdl-version 2\nsuite \"s\" { tags \"a\" }\n");
        for i in 0..2_000 {
            text.push_str(&format!(
                "scenario \"s-{i}\" k=#\"{{\"# {{\n    /* ;\n */ user \"hi\" ; expect {{ reply contains=\"x\" }}\n}}\n"
            ));
        }
        let whole = KdlDocument::parse_v2(&text).unwrap();
        let mut expected = Vec::new();
        spans(&whole, &mut expected);

        let mut got = Vec::new();
        let mut docs = 0;
        let mut nodes = 0;
        let parsed = parse_each(&text, |doc| {
            // Nothing larger than a batch of whole nodes is ever parsed at once.
            let first = doc.nodes().first().map_or(0, |n| n.span().offset());
            let end = doc
                .nodes()
                .last()
                .map_or(0, |n| n.span().offset() + n.span().len());
            assert!(
                end - first <= BATCH_SIZE,
                "a document of {} bytes",
                end - first
            );
            docs += 1;
            nodes += doc.nodes().len();
            spans(&doc, &mut got);
        })
        .unwrap();
        assert!(matches!(parsed, Parsed::Nodes));
        assert!(docs > 1, "{} bytes in {docs} document", text.len());
        // The suite and 2,000 scenarios (the slashdashed node is a comment).
        assert_eq!(nodes, 2_001);
        assert_eq!(got, expected);
    }

    /// A suite whose one scenario is far larger than a batch: branches nested `depth` deep,
    /// `leaves` branches beside each, with the syntax a cut could trip on.
    fn one_big_node(depth: usize, leaves: usize) -> String {
        let mut text = String::from(
            "agent \"a\" protocol=\"connexity\"\n/- scenario \"gone\" { x }\nscenario \"s\" k=#\"{\"# {\n    user \"hi\" // {\n",
        );
        for d in 0..depth {
            for i in 0..leaves {
                text.push_str(&format!(
                    "    branch \"l{d}-{i}\" {{ /* }} */ user \"level {d} {{ leaf {i}\"; expect reply contains=#\"}}\"#; }}\n"
                ));
            }
            text.push_str(&format!(
                "    branch \"deeper{d}\" {{\n    user \"deeper {d}\"\n"
            ));
        }
        for _ in 0..depth {
            text.push_str("}\n");
        }
        text.push_str("} ; // after\nscenario \"t\" { user \"x\" }\n");
        text
    }

    #[test]
    fn a_node_larger_than_a_batch_is_parsed_in_pieces_with_the_spans_of_a_whole_parse() {
        // The whole parse this compares with recurses per block: a parser's stack.
        let test = std::thread::Builder::new()
            .stack_size(STACK_BASE + 256 * 1024 * STACK_PER_BYTE)
            .spawn(pieces_have_the_spans_of_a_whole_parse)
            .unwrap();
        if let Err(panic) = test.join() {
            std::panic::resume_unwind(panic);
        }
    }

    fn pieces_have_the_spans_of_a_whole_parse() {
        for (depth, leaves) in [(3, 800), (100, 40), (1, 3_000)] {
            let text = one_big_node(depth, leaves);
            assert!(text.len() > 2 * BATCH_SIZE, "{} bytes", text.len());
            let whole = KdlDocument::parse_v2(&text).unwrap();
            let mut expected = Vec::new();
            spans(&whole, &mut expected);
            let mut blocks = Vec::new();
            fn block_spans(doc: &KdlDocument, out: &mut Vec<(usize, usize)>) {
                for node in doc.nodes() {
                    if let Some(c) = node.children() {
                        out.push((c.span().offset(), c.span().len()));
                        block_spans(c, out);
                    }
                }
            }
            block_spans(&whole, &mut blocks);

            let big = text.find("scenario \"s\"").unwrap();
            let range = scan(&text)
                .unwrap()
                .into_iter()
                .find(|r| r.contains(&big))
                .unwrap();
            assert!(parse_split(&text, range).is_some(), "the node is cut");

            let mut got = Vec::new();
            let mut got_blocks = Vec::new();
            let parsed = parse_each(&text, |doc| {
                spans(&doc, &mut got);
                block_spans(&doc, &mut got_blocks);
            })
            .unwrap();
            assert!(matches!(parsed, Parsed::Nodes));
            for (what, got, expected) in
                [("spans", &got, &expected), ("blocks", &got_blocks, &blocks)]
            {
                let first = got.iter().zip(expected.iter()).position(|(g, e)| g != e);
                assert!(
                    first.is_none() && got.len() == expected.len(),
                    "{what}, depth {depth}, {leaves} leaves: {} vs {} items, first difference at \
                     {first:?}: {:?} vs {:?}",
                    got.len(),
                    expected.len(),
                    first.map(|i| &got[i.saturating_sub(2)..(i + 3).min(got.len())]),
                    first.map(|i| &expected[i.saturating_sub(2)..(i + 3).min(expected.len())]),
                );
            }
        }
    }

    /// Mutated big nodes: cutting never panics, and whenever the text parses as a whole
    /// the pieces have its spans (or the cut gave up and the whole node was parsed).
    #[test]
    fn mutated_big_nodes_are_cut_only_where_a_whole_parse_agrees() {
        use proptest::prelude::*;
        const PIECES: &[&str] = &[
            "{", "}", "\"", "#", "#\"", "\"#", "/-", ";", "\n", "/*", "*/", "//", "\\", " ", "x",
            "\"\"\"", "(t)",
        ];
        let base = one_big_node(3, 300);
        assert!(base.len() > BATCH_SIZE);
        let config = crate::fuzz_config(16);
        let edits = prop::collection::vec((0..base.len(), 0..PIECES.len()), 1..4);
        let test = std::thread::Builder::new()
            .stack_size(STACK_BASE + 256 * 1024 * STACK_PER_BYTE)
            .spawn(move || {
                proptest!(config, |(edits in edits)| {
                    let mut text = base.clone();
                    for (at, piece) in edits {
                        let mut at = at.min(text.len());
                        while !text.is_char_boundary(at) {
                            at -= 1;
                        }
                        text.insert_str(at, PIECES[piece]);
                    }
                    let mut got = Vec::new();
                    let parsed = parse_each(&text, |doc| spans(&doc, &mut got));
                    if let (Ok(whole), Ok(Parsed::Nodes)) = (KdlDocument::parse_v2(&text), parsed) {
                        let mut expected = Vec::new();
                        spans(&whole, &mut expected);
                        prop_assert_eq!(got, expected);
                    }
                });
            })
            .unwrap();
        if let Err(panic) = test.join() {
            std::panic::resume_unwind(panic);
        }
    }

    #[test]
    fn a_big_node_that_cannot_be_cut_safely_is_parsed_whole() {
        let inner = "    user \"hi\"\n".repeat(BATCH_SIZE / 10);
        for text in [
            // A slashdashed block before the real one.
            format!("scenario \"s\" /- {{ x }} {{\n{inner}}}\n"),
            // Text after the block.
            format!("scenario \"s\" {{\n{inner}}} trailing\n"),
        ] {
            let big = scan(&text)
                .unwrap()
                .into_iter()
                .max_by_key(|r| r.len())
                .unwrap();
            assert!(parse_split(&text, big).is_none());
            let mut got = Vec::new();
            let whole = KdlDocument::parse_v2(&text).ok();
            let parsed = parse_each(&text, |doc| spans(&doc, &mut got)).unwrap();
            if let Some(whole) = whole {
                let mut expected = Vec::new();
                spans(&whole, &mut expected);
                assert_eq!(got, expected);
            } else {
                assert!(matches!(parsed, Parsed::Whole(Err(_))));
            }
        }
    }

    #[test]
    fn syntax_errors_of_a_large_file_are_placed_in_the_file() {
        let filler = "n 1\n".repeat(MAX_NODE_SIZE / 4 + 1);
        let text = format!("{filler}bad {{\nok 1\n");
        match parse_each(&text, |_| {}) {
            Ok(Parsed::Whole(Err(err))) => {
                assert!(!err.diagnostics.is_empty());
                assert!(
                    err.diagnostics
                        .iter()
                        .all(|d| d.span.offset() >= filler.len())
                );
            }
            other => panic!("{other:?}"),
        }
        let big = "a \"b\" ".repeat(MAX_NODE_SIZE / 6 + 1);
        assert_eq!(
            parse_each(&format!("x\n{big}\n"), |_| {}).map(drop),
            Err(TooDeep::Node { offset: 2 })
        );
    }
}
