//! How protocols quote what an agent sent in a fault message: the JSON type that was found
//! where another was expected, the start of a body, and an `error` the agent reported.
//! Shared so every protocol words these the same way and none copies a whole (possibly
//! megabytes long) body to show its first line. Also the spellings a secret may be quoted in
//! ([`secret_spellings`]), for the redaction of agent secrets (`crate::secrets`) and of
//! provider keys (`crate::llm`), which sit on either side of this layer.

use serde_json::Value;

/// Characters of a body quoted in a fault message.
pub const PREVIEW_CHARS: usize = 200;

/// The JSON type of `value`, as a sentence reads it: `an array`, `a string`, `null`.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `text` cut to `max` characters, with `…` when it was longer.
pub fn cut(text: &str, max: usize) -> String {
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// The start of `body` (at most [`PREVIEW_CHARS`] characters, trimmed), with `…` when
/// there is more, on one line: a line break is written `\n` (`\r`), so a fault message
/// stays one line of the console, a log or a CI annotation. Decodes only the bytes it can
/// show: a UTF-8 character is at most four bytes, and a character cut at that edge is past
/// what is shown.
pub fn preview(body: &[u8]) -> String {
    let shown = body.get(..PREVIEW_CHARS * 4 + 4).unwrap_or(body);
    let text = String::from_utf8_lossy(shown);
    let text = text.trim();
    let mut chars = text.chars();
    let mut out = String::with_capacity(text.len().min(PREVIEW_CHARS * 4));
    for c in chars.by_ref().take(PREVIEW_CHARS) {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    if chars.next().is_some() || shown.len() < body.len() {
        out.push('…');
    }
    out
}

/// An `error` an agent reported, as a person reads it: `CODE: message`, either one alone,
/// the string sent, or the JSON itself when it has neither.
pub fn error_text(error: &Value) -> String {
    match error {
        Value::String(s) => s.clone(),
        Value::Object(map) => {
            let field = |key: &str| map.get(key).and_then(Value::as_str);
            match (field("code"), field("message")) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(one), None) | (None, Some(one)) => one.to_owned(),
                (None, None) => error.to_string(),
            }
        }
        other => other.to_string(),
    }
}

/// Values shorter than this are not treated as secrets: replacing every `1` or `abc` in the
/// records would garble them, and a value that short protects nothing.
pub const MIN_SECRET_LEN: usize = 4;

/// `secret` as an agent or a provider may echo it: as it is, and as it reads inside a JSON
/// string a server wrote (its quotes and backslashes escaped, a `/` written `\/` as PHP and
/// some gateways write it, a non-ASCII character as `\uXXXX`). An error body quoting the key
/// JSON-escaped gave it away whole.
pub fn secret_spellings(secret: &str) -> Vec<String> {
    let mut out = vec![secret.to_owned()];
    let mut add = |spelling: String| {
        if !out.contains(&spelling) {
            out.push(spelling);
        }
    };
    let json = serde_json::to_string(secret).unwrap_or_default();
    let escaped = json
        .strip_prefix('"')
        .and_then(|j| j.strip_suffix('"'))
        .unwrap_or(secret)
        .to_owned();
    let ascii: String = escaped
        .chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_string()
            } else {
                let mut units = [0u16; 2];
                c.encode_utf16(&mut units)
                    .iter()
                    .map(|u| format!("\\u{u:04x}"))
                    .collect()
            }
        })
        .collect();
    for spelling in [escaped, ascii] {
        add(spelling.replace('/', "\\/"));
        add(spelling);
    }
    // Percent-encoded, as a redirect's `Location`, an OAuth gateway's error or a proxy's log
    // quotes a token in a query string (a base64 key's `/`, `+` and `=` all change there),
    // in either case of hex digits.
    let encoded = percent_encoding::utf8_percent_encode(secret, URL_ENCODED).to_string();
    if encoded != secret {
        let mut lower = String::with_capacity(encoded.len());
        let mut hex_left = 0;
        for c in encoded.chars() {
            if c == '%' {
                hex_left = 2;
                lower.push(c);
            } else if hex_left > 0 {
                hex_left -= 1;
                lower.push(c.to_ascii_lowercase());
            } else {
                lower.push(c);
            }
        }
        add(lower);
        add(encoded);
    }
    out
}

/// `text` with every occurrence of `secret` written with any of its bytes percent-encoded
/// (in either case of hex digits) replaced by `with`; `None` when there is none. Encoders
/// differ in what they leave as it is (`encodeURIComponent` keeps `!*'()`, Python's `quote`
/// a `/`, a hand-written one only the `/` it knew to escape), so no list of spellings
/// covers them: a key echoed as `sk-SECRET%2Fabc+def` got through every one of them.
pub fn replace_percent_spelled(text: &str, secret: &str, with: &str) -> Option<String> {
    let (bytes, wanted) = (text.as_bytes(), secret.as_bytes());
    if wanted.is_empty() || !text.contains('%') {
        return None;
    }
    let hex = |b: u8| (b as char).to_digit(16);
    // The end of a spelling of `secret` that starts at `start`, if one does.
    let spelled_at = |start: usize| {
        let mut at = start;
        for &want in wanted {
            match bytes.get(at) {
                Some(&b) if b == want => at += 1,
                Some(b'%') => {
                    let high = bytes.get(at + 1).copied().and_then(hex)?;
                    let low = bytes.get(at + 2).copied().and_then(hex)?;
                    if high * 16 + low != u32::from(want) {
                        return None;
                    }
                    at += 3;
                }
                _ => return None,
            }
        }
        Some(at)
    };
    let mut out = String::new();
    let (mut copied, mut at) = (0, 0);
    while at < bytes.len() {
        if let Some(end) = spelled_at(at)
            && text.is_char_boundary(at)
            && text.is_char_boundary(end)
        {
            out.push_str(&text[copied..at]);
            out.push_str(with);
            copied = end;
            at = end;
        } else {
            at += 1;
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// What a URL's query carries as it is (RFC 3986's unreserved characters); every other
/// byte is percent-encoded.
const URL_ENCODED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_percent_encoded_in_part_or_whole_is_found() {
        let key = "sk-SECRET/abc+def123";
        for echoed in [
            "sk-SECRET%2Fabc+def123",
            "sk-SECRET%2fabc%2Bdef123",
            "sk-SECRET/abc%2bdef123",
            "%73k-SECRET%2F%61bc%2Bdef123",
        ] {
            let text = format!("bad key Bearer {echoed} (twice: {echoed})");
            assert_eq!(
                replace_percent_spelled(&text, key, "[redacted]").as_deref(),
                Some("bad key Bearer [redacted] (twice: [redacted])"),
                "{echoed}"
            );
        }
        assert_eq!(
            replace_percent_spelled("sk-SECRET%2Fabc+def12", key, "x"),
            None
        );
        assert_eq!(replace_percent_spelled("100% sure, 50%2", key, "x"), None);
        assert_eq!(
            replace_percent_spelled("é=%C3%A9 é", "é", "x").as_deref(),
            Some("x=x x")
        );
    }

    #[test]
    fn a_preview_is_one_line() {
        assert_eq!(
            preview(b"{\"a\": 1}\r\n{\"debug\": 2}\n"),
            "{\"a\": 1}\\r\\n{\"debug\": 2}"
        );
    }

    #[test]
    fn a_preview_is_short_whatever_the_body() {
        assert_eq!(preview(b"  short  "), "short");
        let long = "é".repeat(10_000);
        let shown = preview(long.as_bytes());
        assert_eq!(shown.chars().count(), PREVIEW_CHARS + 1);
        assert!(shown.ends_with('…'));
        // Invalid UTF-8 is shown, not refused.
        assert_eq!(preview(b"\xff ok"), "\u{fffd} ok");
    }

    #[test]
    fn errors_read_as_code_and_message() {
        let e = serde_json::json!({"code": "E", "message": "boom"});
        assert_eq!(error_text(&e), "E: boom");
        assert_eq!(error_text(&serde_json::json!({"message": "m"})), "m");
        assert_eq!(error_text(&serde_json::json!("plain")), "plain");
        assert_eq!(error_text(&serde_json::json!({"x": 1})), r#"{"x":1}"#);
    }
}
