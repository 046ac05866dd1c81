//! Secrets an agent might echo back, kept out of every record a run writes.
//!
//! An agent `header` that takes a value from `env` (`Authorization: Bearer {{ env.TOKEN }}`)
//! sends a secret, and agents echo what they get: a debug reply, a 500 page quoting the
//! request, a stack trace on stderr. Every file and the console are built from the event
//! stream (docs/architecture.md), so the executor passes each event through
//! [`Secrets::redact_event`] before sending it: one place, whatever field the text landed
//! in. Checks run on the agent's real answers before that; only what is written is
//! redacted. Provider API keys are redacted where they are used
//! (`crate::llm::ProviderClient::redact`).

use std::sync::Arc;

use serde_json::Value;

use crate::event::Event;
use crate::plan::Plan;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Values shorter than this are not treated as secrets: replacing every `1` or `abc` in the
/// records would garble them, and a value that short protects nothing.
pub const MIN_SECRET_LEN: usize = 4;

/// The secret values of a run, longest first (so a secret that contains another is
/// replaced whole).
#[derive(Clone, Debug, Default)]
pub struct Secrets(Arc<[String]>);

impl Secrets {
    /// The values of the environment variables the plan's agent headers read.
    pub fn of_plan(plan: &Plan) -> Self {
        let env = plan.templates.env();
        let values = plan
            .agents
            .iter()
            .flat_map(|agent| agent.headers.iter())
            .flat_map(|(_, template)| plan.templates.env_names(template))
            .filter_map(|name| env.get(&name).cloned());
        Self::new(values)
    }

    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|v| v.trim().chars().count() >= MIN_SECRET_LEN)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Secrets(values.into())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every secret replaced by [`REDACTED`]; `None` when it holds none.
    pub fn redact(&self, text: &str) -> Option<String> {
        let mut out: Option<String> = None;
        for secret in self.0.iter() {
            let current = out.as_deref().unwrap_or(text);
            if current.contains(secret.as_str()) {
                out = Some(current.replace(secret.as_str(), REDACTED));
            }
        }
        out
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

    #[test]
    fn every_occurrence_is_replaced_and_short_values_are_not_secrets() {
        let secrets = Secrets::new(["tok-123".to_owned(), "tok-123-long".to_owned(), "ab".into()]);
        assert_eq!(
            secrets.redact("a tok-123-long and tok-123 ab").as_deref(),
            Some("a [redacted] and [redacted] ab")
        );
        assert_eq!(secrets.redact("nothing here"), None);
    }
}
