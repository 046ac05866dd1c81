//! One turn of a conversation as recorded: its messages, tool calls, every exchange on the
//! wire with its attempts, timings, tokens and the fault that ended it.

use serde::{Deserialize, Serialize};

use crate::chat::ChatMessage;
use crate::fault::Fault;
use crate::llm::LlmCall;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Zero-based agent call index within the trajectory.
    pub turn_index: u32,
    /// What started the turn: `user`, `opening` (the agent spoke first), `call` (a Fixie
    /// function), `human` (an answer to a pause).
    #[serde(default = "user_kind")]
    pub kind: String,
    /// The function called, for `call` turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// A replay of a shared prefix in a fresh session (session-bound protocols at a fork):
    /// the branch's own conversation, not a new test of the prefix. Its criteria were
    /// judged once, on the original turn; keep its latency apart.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay: bool,
    /// Answered from an earlier run's records by `trellis watch` (the conversation up to
    /// here was unchanged): the agent was not called for it. Never in a `trellis run`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
    pub user_message: String,
    /// The assistant's final text of the turn.
    pub reply: Option<String>,
    /// Every message the agent returned this turn (assistant, tool, final assistant).
    pub messages: Vec<ChatMessage>,
    /// Structured data the agent answered with (an A2A task with its data parts and
    /// artifacts): what `reply json-path=…` and `capture json-path=…` read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// What the agent said of the turn besides its answer, as it sent it (a Connexity
    /// answer's `metadata`: its trace URL, prompt version, …); read by no check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    pub tool_calls: Vec<ToolCallRecord>,
    /// Milliseconds since the run started.
    pub started_ms: f64,
    pub latency_ms: f64,
    /// Milliseconds since the run started when the turn ended: after its retries, its
    /// rate-limit waits and its waits for a provider's slot, so `started_ms..ended_ms` is its
    /// wall time where `latency_ms` is only its answers' (a turn `reused` from the records
    /// took none: it ends as it starts). `None` in journals written before
    /// it was recorded: [`TurnRecord::end_ms`] then counts its latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<f64>,
    /// Time to first streamed token; only for streaming protocols.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    /// Usage reported only in part: some of the turn's requests reported none while others
    /// did, or a request reported prompt tokens without completion ones (or the reverse),
    /// as a stream cut after its start does. The counts are what
    /// those reported, a floor of what the turn spent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tokens_partial: bool,
    /// The turn's tokens at the prices of the provider a model under test is reached
    /// through (`provider=` with `input-price`/`output-price`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Attempts made over every exchange (1 for one clean request).
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// Every request of the turn with its attempts (several for action loops, retries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exchanges: Vec<ExchangeRecord>,
    /// A `simulate` turn: the LLM calls that wrote its user message (retries included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulator: Vec<LlmCall>,
    /// `trellis run --replay-users`: whether this simulated user message was replayed from
    /// the recorded run or written fresh once the agent diverged from it. `None` for
    /// scripted turns and in runs that replay nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_source: Option<UserSource>,
    /// LLM calls made on the agent's behalf to answer the turn (a Fixie agent's few-shot
    /// loop: one per round), summed into the trajectory's `llm_*` usage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub llm: Vec<LlmCall>,
    /// The W3C trace id the turn's requests carried in `traceparent` (32 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<std::sync::Arc<str>>,
    /// The turn's span id, the parent the agent's spans name (16 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// The agent's own OpenTelemetry spans for this turn (agents with `spans #true`), in
    /// start order; spans that came later are in the journal's `spans` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<crate::span::SpanRecord>,
}

/// Lets code that takes turns as `AsRef<TurnRecord>` (a trajectory's shared `Arc`s in the
/// engine) take plain records too.
impl AsRef<TurnRecord> for TurnRecord {
    fn as_ref(&self) -> &TurnRecord {
        self
    }
}

/// Where a simulated user message of a `--replay-users` run came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserSource {
    /// The recorded run's message at this turn, replayed: the conversation so far matched
    /// the recording.
    Recorded,
    /// Written by the simulator now: the agent diverged from the recording earlier on this
    /// path (or the recording had no simulated turn here).
    Fresh,
}

impl UserSource {
    pub fn as_str(self) -> &'static str {
        match self {
            UserSource::Recorded => "recorded",
            UserSource::Fresh => "fresh",
        }
    }
}

fn user_kind() -> String {
    "user".to_owned()
}

impl TurnRecord {
    /// When the turn ended, in ms since the run started (see [`TurnRecord::ended_ms`]).
    pub fn end_ms(&self) -> f64 {
        self.ended_ms
            .unwrap_or(self.started_ms + self.latency_ms)
            .max(self.started_ms)
    }
}

/// One request of a turn.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ExchangeRecord {
    /// `POST /agent/respond`, `POST /process`, …
    pub label: String,
    /// Wall time of the attempt that counted.
    pub latency_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Every attempt's latency and fault, in order; the last one is the one that counted.
    pub attempts: Vec<AttemptRecord>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AttemptRecord {
    pub latency_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCallRecord {
    pub call_id: String,
    pub name: String,
    /// JSON text, as the agent sent it.
    pub arguments: String,
    /// The tool message content answering this call, when the agent returned one.
    pub result: Option<String>,
}
