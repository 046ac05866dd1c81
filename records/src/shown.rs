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
    let maybe = |b: u8| b < 0x20 || b == 0x7f || b == 0xc2 || b == 0xe2;
    let hidden = |c: char| {
        (c.is_control() && !kept.contains(&c))
            || matches!(
                c,
                '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            )
    };
    if !text.bytes().any(maybe) || !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
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
}
