//! Decoding `json-path="…"` values: the one place every JSON path of a suite is parsed
//! (`capture … json-path=`, `reply json-path=`, and the `http` agent's `reply`, `tool-calls`,
//! `session` and `stream` nodes).
//!
//! The `serde_json_path` parser backtracks through every alternative at each level of a
//! filter selector, so its time grows about fourfold per nested `[?…` (16 levels took
//! seconds, 20 would take minutes, whether the brackets are closed or not), and it recurses
//! per `(`, so 10,000 of them overflow the stack. A path is therefore refused before it is
//! parsed when it is longer than [`MAX_LEN`] bytes or nests `[`/`(` deeper than
//! [`MAX_DEPTH`] (see `docs/language.md`, "Limits"); real paths stay far below both.

use serde_json_path::JsonPath;

use super::*;

/// Longest JSON path accepted, in bytes.
pub const MAX_LEN: usize = 1024;

/// Deepest nesting of `[` and `(` (together) accepted in a JSON path.
pub const MAX_DEPTH: usize = 8;

/// Why a path is refused before it is parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OverLimit {
    Long,
    /// The `[` or `(` at this byte offset of the path opens level `MAX_DEPTH + 1`.
    Deep(usize),
}

/// Checks `path` against [`MAX_LEN`] and [`MAX_DEPTH`] in one pass, without recursion.
/// Brackets inside quoted names (`'…'` or `"…"`, with `\` escapes) do not count; a
/// closing bracket without an opening one is left for the parser to report.
fn over_limit(path: &str) -> Option<OverLimit> {
    if path.len() > MAX_LEN {
        return Some(OverLimit::Long);
    }
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    for (i, c) in path.bytes().enumerate() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == b'\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                b'\'' | b'"' => quote = Some(c),
                b'[' | b'(' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return Some(OverLimit::Deep(i));
                    }
                }
                b']' | b')' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    None
}

impl<'f> Decoder<'f> {
    /// The JSON path written as the string value `e`, with its source text; a diagnostic on
    /// the value when it is over a limit or not a valid path. `example` shows valid paths in
    /// the hint, as the place that takes the path uses them.
    pub(super) fn json_path_value(
        &mut self,
        e: &KdlEntry,
        example: &str,
    ) -> Option<(JsonPath, String)> {
        let source = self.string(e)?;
        if let Some(over) = over_limit(&source) {
            let (label, help) = match over {
                OverLimit::Long => (
                    format!("{} bytes, more than {MAX_LEN}", source.len()),
                    format!("a JSON path is at most {MAX_LEN} bytes long"),
                ),
                OverLimit::Deep(at) => (
                    format!("`[`/`(` nested more than {MAX_DEPTH} deep (byte {at} of the path)"),
                    format!(
                        "a JSON path nests `[` and `(` at most {MAX_DEPTH} deep; \
                         write a shallower path, e.g. {example}"
                    ),
                ),
            };
            let message = match over {
                OverLimit::Long => format!("JSON path longer than {MAX_LEN} bytes"),
                OverLimit::Deep(_) => format!("JSON path nested more than {MAX_DEPTH} deep"),
            };
            let d = self
                .diag(Kind::TooDeep, message, value_span(e), label)
                .with_help(help);
            self.report(d);
            return None;
        }
        match JsonPath::parse(&source) {
            Ok(path) => Some((path, source)),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidJsonPath,
                        format!("invalid JSON path `{source}`"),
                        value_span(e),
                        err.to_string(),
                    )
                    .with_help(format!("JSON paths follow RFC 9535, e.g. {example}"));
                self.report(d);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_brackets_and_parentheses_outside_quoted_names() {
        assert_eq!(over_limit("$.choices[0].message.content"), None);
        assert_eq!(over_limit("$[?(@.a == 1 && (@.b[0] || @.c))]"), None);
        let deep = "[?(".repeat(MAX_DEPTH / 2);
        assert_eq!(over_limit(&format!("${deep}")), None);
        assert_eq!(
            over_limit(&format!("${deep}(")),
            Some(OverLimit::Deep(1 + 3 * (MAX_DEPTH / 2)))
        );
        // Closed brackets give their level back.
        assert_eq!(over_limit(&"$[0]".repeat(200)), None);
        // Brackets in names, quoted either way, escaped quotes included, do not count.
        let names = format!("$['{b}\\'{b}'][\"{b}\\\"{b}\"]", b = "[(".repeat(MAX_DEPTH));
        assert_eq!(over_limit(&names), None);
        assert_eq!(over_limit(&format!("$.a{}", "]".repeat(50))), None);
        assert_eq!(
            over_limit(&format!("${}", ".a".repeat(MAX_LEN))),
            Some(OverLimit::Long)
        );
    }

    /// The path the fuzz run hung on: nested, unclosed filters. Each level multiplies the
    /// parser's time by about four, so without the limit this ran for minutes; the cases
    /// here stop at the limit, where parsing takes milliseconds.
    #[test]
    fn nested_filters_are_refused_past_the_limit() {
        let nested = |n: usize| format!("$[?@.kins[0].parts{}", "[?@.kins[0].parts".repeat(n));
        // `[0]` inside each level nests one more.
        assert!(over_limit(&nested(MAX_DEPTH - 2)).is_none());
        assert!(JsonPath::parse(&nested(MAX_DEPTH - 2)).is_err());
        for n in [MAX_DEPTH - 1, 10, 100, 1000, 10_000] {
            assert!(over_limit(&nested(n)).is_some(), "{n}");
        }
        let parens = format!("$[?{}@.a{}]", "(".repeat(10_000), ")".repeat(10_000));
        assert!(over_limit(&parens).is_some());
    }
}
