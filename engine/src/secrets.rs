//! Secrets an agent might echo back, kept out of every record a run writes.
//!
//! An agent `header` that takes a value from `env` (`Authorization: Bearer {{ env.TOKEN }}`)
//! sends a secret, and agents echo what they get: a debug reply, a 500 page quoting the
//! request, a stack trace on stderr. Every file and the console are built from the event
//! stream (docs/architecture.md), so the executor passes each event through
//! [`Secrets::redact_event`] before sending it: one place, whatever field the text landed
//! in. Checks run on the agent's real answers before that; only what is written is
//! redacted. Provider API keys are among them (a model echoes one in an answer as an agent
//! does), and are also redacted where they are used, in error bodies and response-cache
//! entries (`crate::llm::ProviderClient::redact`).

use std::sync::Arc;

use serde_json::Value;

use crate::event::Event;
use crate::plan::Plan;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// The shortest part of a secret next to a cut that is redacted: a character or two there
/// match a secret's first or last ones by chance in ordinary text (`… status…` against a
/// secret starting with `s`), and so few characters give nothing of a secret away.
pub const MIN_CUT_PART_CHARS: usize = 3;

/// What a quote puts where it cut a text (`crate::transport::quote::preview`, the kept end
/// of an agent's stderr).
const CUT: char = '…';

/// Which edge of a secret a cut text may hold.
#[derive(Clone, Copy)]
enum Edge {
    /// The text ends with the start of a secret (then a `…`).
    Start,
    /// The text (after a `…`) starts with the end of a secret.
    End,
}

use crate::transport::quote::replace_percent_spelled;
pub use crate::transport::quote::{MIN_SECRET_LEN, secret_spellings as spellings};

/// The secret values of a run, longest first (so a secret that contains another is
/// replaced whole).
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    /// Every spelling of every secret, longest first.
    spellings: Arc<[String]>,
    /// The secrets as they are, for the spellings no list holds (percent-encoded in part).
    values: Arc<[String]>,
}

impl Secrets {
    /// The values of the environment variables the plan's agent headers read or its agents
    /// declare (`secret-env`), and the providers' API keys: a model echoes a key in a successful answer as readily as a
    /// server in an error body (a judge's justification, the reply of a model under test,
    /// a simulated user's message), and those answers are records like any other.
    pub fn of_plan(plan: &Plan) -> Self {
        let env = plan.templates.env();
        let headers = plan
            .agents
            .iter()
            .flat_map(|agent| agent.headers.iter().chain(&agent.turn_headers))
            .flat_map(|(_, template)| plan.templates.env_names(template));
        let declared = plan
            .agents
            .iter()
            .flat_map(|agent| agent.secret_env.iter().cloned());
        let keys = plan
            .llm
            .providers
            .iter()
            .filter_map(|p| p.api_key_env.as_ref().map(|var| var.value.clone()));
        let values = headers
            .chain(declared)
            .chain(keys)
            .filter_map(|name| env.get(&name).cloned());
        Self::new(values)
    }

    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|v| v.trim().chars().count() >= MIN_SECRET_LEN)
            .collect();
        let longest_first = |a: &String, b: &String| b.len().cmp(&a.len()).then_with(|| a.cmp(b));
        values.sort_by(longest_first);
        values.dedup();
        let mut all: Vec<String> = values.iter().flat_map(|v| spellings(v)).collect();
        all.sort_by(longest_first);
        all.dedup();
        Secrets {
            spellings: all.into(),
            values: values.into(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.spellings.is_empty()
    }

    /// `text` with every secret replaced by [`REDACTED`], and the part of a secret cut at a
    /// quote's edge too; `None` when it holds none.
    pub fn redact(&self, text: &str) -> Option<String> {
        let mut out: Option<String> = None;
        for secret in self.spellings.iter() {
            let current = out.as_deref().unwrap_or(text);
            if current.contains(secret.as_str()) {
                out = Some(current.replace(secret.as_str(), REDACTED));
            }
        }
        for secret in self.values.iter() {
            let current = out.as_deref().unwrap_or(text);
            if let Some(redacted) = replace_percent_spelled(current, secret, REDACTED) {
                out = Some(redacted);
            }
        }
        let current = out.as_deref().unwrap_or(text);
        if current.contains(CUT)
            && let Some(cut) = self.redact_cut_edges(current)
        {
            out = Some(cut);
        }
        out
    }

    /// Texts are quoted cut before they are redacted (a fault quotes the first 200
    /// characters of an error body, an agent's stderr keeps its last lines), so a secret
    /// can be cut in two there: the start of a secret just before a `…`, or its end just
    /// after one, is replaced too (the longest such part, of at least
    /// [`MIN_CUT_PART_CHARS`] characters).
    fn redact_cut_edges(&self, text: &str) -> Option<String> {
        let mut out = String::with_capacity(text.len());
        let mut changed = false;
        let mut pieces = text.split(CUT).peekable();
        let mut first = true;
        while let Some(piece) = pieces.next() {
            let mut piece = piece;
            let mut lead = "";
            if !first && let Some(len) = self.longest_edge(piece, Edge::End) {
                lead = REDACTED;
                piece = &piece[len..];
                changed = true;
            }
            let mut tail = "";
            if pieces.peek().is_some()
                && let Some(len) = self.longest_edge(piece, Edge::Start)
            {
                tail = REDACTED;
                piece = &piece[..piece.len() - len];
                changed = true;
            }
            if !first {
                out.push(CUT);
            }
            out.push_str(lead);
            out.push_str(piece);
            out.push_str(tail);
            first = false;
        }
        changed.then_some(out)
    }

    /// The length in bytes of the longest proper start of a secret that `text` ends with
    /// ([`Edge::Start`]), or proper end of a secret it starts with ([`Edge::End`]), of at
    /// least [`MIN_CUT_PART_CHARS`] characters.
    fn longest_edge(&self, text: &str, edge: Edge) -> Option<usize> {
        self.spellings
            .iter()
            .filter_map(|secret| {
                let chars = secret.chars().count();
                let bounds = secret.char_indices().map(|(i, _)| i);
                let bounds: Vec<usize> = match edge {
                    // Starts: cut after at least MIN characters.
                    Edge::Start => bounds.skip(MIN_CUT_PART_CHARS).collect(),
                    // Ends: cut so at least MIN characters remain.
                    Edge::End => bounds
                        .skip(1)
                        .take(chars.saturating_sub(MIN_CUT_PART_CHARS))
                        .collect(),
                };
                let bounds = bounds.into_iter();
                match edge {
                    Edge::Start => bounds.filter(|&i| text.ends_with(&secret[..i])).max(),
                    Edge::End => bounds
                        .map(|i| secret.len() - i)
                        .filter(|&len| text.starts_with(&secret[secret.len() - len..]))
                        .max(),
                }
            })
            .max()
    }

    /// `event` with every secret replaced in every string it holds.
    pub fn redact_event(&self, event: Event) -> Event {
        if self.is_empty() {
            return event;
        }
        // Events are journal entries, made to round-trip through JSON: redacting the JSON
        // form reaches every field, including ones added later.
        let Ok(mut value) = serde_json::to_value(&event) else {
            return event;
        };
        if !self.redact_value(&mut value) {
            return event;
        }
        serde_json::from_value(value).unwrap_or(event)
    }

    /// Redacts the strings (and object keys) in `value`; whether anything changed.
    fn redact_value(&self, value: &mut Value) -> bool {
        match value {
            Value::String(s) => match self.redact(s) {
                Some(redacted) => {
                    *s = redacted;
                    true
                }
                None => false,
            },
            Value::Array(items) => {
                // Every element, not only up to the first change.
                let mut changed = false;
                for item in items {
                    changed |= self.redact_value(item);
                }
                changed
            }
            Value::Object(map) => {
                let mut changed = false;
                let keys: Vec<String> = map.keys().cloned().collect();
                for key in keys {
                    if let Some(new_key) = self.redact(&key)
                        && let Some(v) = map.remove(&key)
                    {
                        map.insert(new_key, v);
                        changed = true;
                    }
                }
                for v in map.values_mut() {
                    changed |= self.redact_value(v);
                }
                changed
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that quotes the key inside a JSON string escapes it: `/` as `\/` (PHP,
    /// some gateways), a quote or backslash, a non-ASCII character as `\uXXXX`. Each
    /// spelling is redacted, not only the key as it was sent.
    #[test]
    fn a_secret_echoed_json_escaped_is_redacted_in_every_spelling() {
        let key = "wJalrXUtnFEMI/K7MDENG/b\"x\\yé";
        let secrets = Secrets::new([key.to_owned()]);
        for echoed in [
            key.to_owned(),
            "wJalrXUtnFEMI\\/K7MDENG\\/b\\\"x\\\\y\\u00e9".to_owned(),
            "wJalrXUtnFEMI/K7MDENG/b\\\"x\\\\yé".to_owned(),
            serde_json::to_string(key).unwrap(),
        ] {
            let body = format!("{{\"error\": \"Incorrect API key provided: {echoed}\"}}");
            let redacted = secrets.redact(&body).unwrap_or_else(|| panic!("{body}"));
            assert!(redacted.contains(REDACTED), "{redacted}");
            for piece in ["wJalrXUtnFEMI", "K7MDENG"] {
                assert!(!redacted.contains(piece), "{redacted}");
            }
        }
    }

    #[test]
    fn every_occurrence_is_replaced_and_short_values_are_not_secrets() {
        let secrets = Secrets::new(["tok-123".to_owned(), "tok-123-long".to_owned(), "ab".into()]);
        assert_eq!(
            secrets.redact("a tok-123-long and tok-123 ab").as_deref(),
            Some("a [redacted] and [redacted] ab")
        );
        assert_eq!(secrets.redact("nothing here"), None);
    }

    #[test]
    fn a_secret_cut_by_a_quote_shows_none_of_it() {
        let secrets = Secrets::new(["Bearer-tok-1234".to_owned()]);
        // A body quoted up to a cut inside the secret; the kept end of a log that starts
        // inside it; both at once.
        assert_eq!(
            secrets.redact("HTTP 500: sent Bearer-to…").as_deref(),
            Some("HTTP 500: sent [redacted]…")
        );
        assert_eq!(
            secrets.redact("…k-1234 in the log").as_deref(),
            Some("…[redacted] in the log")
        );
        assert_eq!(
            secrets
                .redact("a …1234 and Bearer-tok-1234 Bea…")
                .as_deref(),
            Some("a …[redacted] and [redacted] [redacted]…")
        );
        // A `…` with no part of a secret next to it changes nothing, nor does a part too
        // short to tell from chance.
        assert_eq!(secrets.redact("and so on…"), None);
        assert_eq!(secrets.redact("Be… …34"), None);
        assert_eq!(secrets.redact("…Bearer-x"), None);
    }
}
