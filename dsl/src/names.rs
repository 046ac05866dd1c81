//! Rules for names that end up on the wire, shared by validation (`trellis check`) and
//! the protocols that send them, so a name `check` accepts is one the engine can send.

/// A function name that cannot be called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FunctionNameError {
    #[error("the function name is empty")]
    Empty,
    #[error("`{0}` is not a function name (it would name a directory of the agent's URL)")]
    Dots(String),
    #[error(
        "function name `{name}` contains {what}; a Fixie function name is one URL path segment \
         made of letters, digits, `_`, `-` and `.`"
    )]
    Character { name: String, what: String },
}

/// Checks that `name` is one harmless path segment: letters and digits (any script), `_`,
/// `-` and `.`, and not `.` or `..`. The Fixie SDK itself only accepts `\w+`; the rest is
/// allowed for agents written in other languages.
pub fn validate_function_name(name: &str) -> Result<(), FunctionNameError> {
    if name.is_empty() {
        return Err(FunctionNameError::Empty);
    }
    if name == "." || name == ".." {
        return Err(FunctionNameError::Dots(name.to_owned()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        let what = match c {
            '/' | '\\' => format!("a path separator `{c}`"),
            c if c.is_whitespace() => "whitespace".to_owned(),
            c if c.is_control() => format!("a control character (U+{:04X})", u32::from(c)),
            c => format!("`{c}`"),
        };
        return Err(FunctionNameError::Character {
            name: name.to_owned(),
            what,
        });
    }
    Ok(())
}

/// `text` in Unicode NFC, the form ids are compared in: `café` typed precomposed on one
/// keyboard and with a combining accent on another (macOS terminals and file names give the
/// latter) is one id. Borrowed when it already is.
pub fn nfc(text: &str) -> std::borrow::Cow<'_, str> {
    use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};
    match is_nfc_quick(text.chars()) {
        IsNormalized::Yes => std::borrow::Cow::Borrowed(text),
        _ => std::borrow::Cow::Owned(text.nfc().collect()),
    }
}
