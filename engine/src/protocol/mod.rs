//! Agent protocols: how one agent turn goes over the wire.
//!
//! Each protocol module turns "this conversation so far" into requests and the agent's
//! answer into an [`AgentTurn`], or a categorised [`Fault`]. Transport concerns shared by
//! the HTTP protocols (bounded body reads, retries with backoff, fault mapping) live in
//! [`http`]. Protocols never panic on what an agent sends.

pub mod connexity;
pub mod http;

use serde::{Deserialize, Serialize};

use crate::record::{Fault, ToolCallRecord};

/// An OpenAI-style chat message, the shape Connexity, MultiAgentEval and OpenAI share.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn user(content: impl Into<String>) -> Self {
        ChatMessage {
            role: "user".into(),
            content: Some(content.into()),
            ..Default::default()
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        ChatMessage {
            role: "assistant".into(),
            content: Some(content.into()),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: ToolCallFunction,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCallFunction {
    pub name: String,
    /// A JSON *string* on the wire.
    pub arguments: String,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

/// What the agent produced in one turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentTurn {
    /// Every message of the turn, in order.
    pub messages: Vec<ChatMessage>,
    /// The final assistant text (the last assistant message with content).
    pub reply: Option<String>,
    /// Tool calls of the turn with their results paired by call id.
    pub tool_calls: Vec<ToolCallRecord>,
    pub usage: Option<Usage>,
    pub model: Option<String>,
    pub provider: Option<String>,
    /// Time to first streamed token, for streaming protocols.
    pub ttft: Option<std::time::Duration>,
}

/// Context of one call, sent as protocol metadata where the protocol has a place for it.
#[derive(Clone, Debug)]
pub struct CallContext<'a> {
    /// The scenario id (Connexity `metadata.test_case_id`).
    pub test_case_id: &'a str,
    /// Zero-based index of the new user message in the conversation
    /// (Connexity `metadata.turn_index`).
    pub turn_index: u32,
    /// The call must be over by then (the trajectory's `timeout`), whatever retries remain.
    pub deadline: Option<tokio::time::Instant>,
}

/// The result of one logical call, after retries.
#[derive(Clone, Debug)]
pub struct CallOutcome {
    pub result: Result<AgentTurn, Fault>,
    /// 1 + retries used.
    pub attempts: u32,
    /// Wall time of the last attempt (what the agent took to answer).
    pub latency: std::time::Duration,
}
