//! Recorded text shown to a person: what an agent or an LLM wrote may hold characters that
//! act on the display instead of being read (NUL, terminal escape sequences, bidirectional
//! overrides). The console and the HTML report show them as `\u{..}` escapes, so no agent
//! can clear a terminal, fake a `PASS` line, or reverse the rest of a report's row.

use std::borrow::Cow;

/// `text` with its control characters (but newline, carriage return and tab) and its
/// bidirectional controls written as `\u{..}`; borrowed when it has none, which a scan of
/// its bytes finds without decoding (each such character starts with one of a few bytes).
pub fn visible_controls(text: &str) -> Cow<'_, str> {
    visible_controls_but(text, &['\n', '\r', '\t'])
}

/// [`visible_controls`] with `kept` (control characters among newline, carriage return and
/// tab) left as they are: a terminal line also shows its carriage returns.
pub fn visible_controls_but<'t>(text: &'t str, kept: &[char]) -> Cow<'t, str> {
    let maybe = |b: u8| b < 0x20 || b == 0x7f || b == 0xc2 || b == 0xd8 || b == 0xe2;
    let hidden = |c: char| hidden(c, kept);
    if !text.bytes().any(maybe) || !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes `c` as the escape `\u{..}` (lower-case hex), as Rust's `{:?}` does.
pub fn push_escaped(out: &mut String, c: char) {
    use std::fmt::Write as _;
    let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
}

/// A control character not in `kept`, or a bidirectional control.
fn hidden(c: char, kept: &[char]) -> bool {
    (c.is_control() && !kept.contains(&c)) || bidi_control(c)
}

/// A character that changes the direction of the text after it (marks, embeddings,
/// overrides, isolates). Each is encoded starting with the byte 0xE2, but the Arabic
/// letter mark (U+061C), which starts with 0xD8.
pub fn bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// `text` in double quotes, for a check's explanation (`expected the reply to contain
/// "…"`): quotes, backslashes, newlines, carriage returns and tabs written as `\"`, `\\`,
/// `\n`, `\r`, `\t`, and the characters [`visible_controls`] hides as `\u{..}`; every
/// other character as it is. Rust's `{:?}` would also escape combining marks and joiners
/// (`\u{94d}` in Devanagari, `\u{200d}` in an emoji family), which are ordinary text.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\0' => out.push_str("\\0"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if hidden(c, &[]) => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_overrides_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(
            visible_controls("café, שלום, 😀\nline\ttab"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            visible_controls("a\u{0}b\u{1b}[2J\u{202e}c\u{85}d\r"),
            "a\\u{0}b\\u{1b}[2J\\u{202e}c\\u{85}d\r"
        );
        assert_eq!(visible_controls_but("x\ry\n", &['\n']), "x\\u{d}y\n");
    }

    #[test]
    fn quoted_text_escapes_what_debug_does_but_keeps_marks_and_joiners() {
        let ascii = "say \"hi\"\\ \n\r\t\u{0}\u{1b}[2J\u{7f}";
        assert_eq!(quoted(ascii), format!("{ascii:?}"));
        assert_eq!(quoted("a\u{202e}b"), "\"a\\u{202e}b\"");
        assert_eq!(visible_controls("a\u{61c}b"), "a\\u{61c}b");
        let marks = "नमस्ते 👨\u{200d}👩\u{200d}👧 café Z\u{337}";
        assert_eq!(quoted(marks), format!("\"{marks}\""));
    }
}
