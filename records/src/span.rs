//! Spans an agent reported over OpenTelemetry (OTLP) for its turns, as Trellis keeps them:
//! on the turn they belong to (`TurnRecord::spans`), or, for spans that arrived after their
//! turn was recorded, in a [`SpanBatch`] journal entry written at the end of the run.

use serde::{Deserialize, Serialize};

/// One span, flattened from OTLP: ids as lowercase hex, times in Unix nanoseconds,
/// attributes as a JSON object (OTLP's typed values as plain JSON values).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SpanRecord {
    pub trace_id: String,
    pub span_id: String,
    /// `None` for a root span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    pub name: String,
    /// `internal`, `server`, `client`, `producer`, `consumer` or `unspecified`.
    pub kind: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// `unset`, `ok` or `error`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// The resource's `service.name`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The span's attributes, `{"gen_ai.tool.name": "refund", …}`.
    #[serde(default)]
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

impl SpanRecord {
    /// A string attribute (or any attribute, as text).
    pub fn attribute(&self, key: &str) -> Option<String> {
        self.attributes.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    pub fn duration_ms(&self) -> f64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano) as f64 / 1e6
    }
}

/// Spans of one turn that arrived after the turn was recorded (batch exporters send late),
/// collected during the grace period at the end of the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SpanBatch {
    pub suite: String,
    pub scenario: String,
    pub agent: String,
    pub repetition: u32,
    pub node: String,
    pub turn_index: u32,
    pub spans: Vec<SpanRecord>,
}
