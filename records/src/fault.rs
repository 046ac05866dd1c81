//! Faults: why an agent call, a setup or an LLM call failed, as data on the record.

use serde::{Deserialize, Serialize};

/// Why an agent call failed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Fault {
    pub category: FaultCategory,
    pub message: String,
    /// Set only on the fault of an HTTP 429 answer, for the call's retry loop to wait it
    /// out (`with_retries` in engine/src/transport/http.rs); never recorded.
    #[serde(skip)]
    pub rate_limited: Option<RateLimited>,
    /// Set only on the fault of an HTTP 5xx answer with a `Retry-After` (a 503 of a
    /// server restarting says when it is back): a retry waits at least that long; never
    /// recorded.
    #[serde(skip)]
    pub back_after: Option<std::time::Duration>,
}

/// An HTTP 429 answer: the server did not take the request, and asks to be called again
/// later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimited {
    /// The wait its `Retry-After` asked for, when it sent a readable one.
    pub retry_after: Option<std::time::Duration>,
}

impl Fault {
    pub fn new(category: FaultCategory, message: impl Into<String>) -> Self {
        Fault {
            category,
            message: message.into(),
            rate_limited: None,
            back_after: None,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum FaultCategory {
    /// The call (or the trajectory's time budget) ran out.
    Timeout,
    /// Could not connect (refused, DNS, unreachable).
    Connect,
    /// The connection broke after connecting: reset, closed early, truncated body.
    Transport,
    #[serde(rename = "http_4xx")]
    Http4xx,
    #[serde(rename = "http_5xx")]
    Http5xx,
    /// The body is not JSON.
    InvalidJson,
    /// Valid JSON of the wrong shape, or a protocol rule broken.
    Protocol,
    /// The response exceeded the agent's `max-response-size`.
    TooLarge,
    /// A stream closed before the agent said it was done (no completed response).
    Incomplete,
    /// The agent reported that it failed: an error frame, a run that ended `failed`,
    /// `rejected` or `canceled`.
    AgentError,
    /// A template could not be rendered (for instance a capture that never matched).
    Template,
    /// The agent could not be started or configured (builtin, headers, env).
    Setup,
    /// Trellis itself failed (a bug); the message says how.
    Internal,
    /// The LLM user simulator could not write the next user message (its call failed, or
    /// it answered nothing usable after retries).
    Simulator,
}

impl FaultCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultCategory::Timeout => "timeout",
            FaultCategory::Connect => "connect",
            FaultCategory::Transport => "transport",
            FaultCategory::Http4xx => "http_4xx",
            FaultCategory::Http5xx => "http_5xx",
            FaultCategory::InvalidJson => "invalid_json",
            FaultCategory::Protocol => "protocol",
            FaultCategory::TooLarge => "too_large",
            FaultCategory::Incomplete => "incomplete",
            FaultCategory::AgentError => "agent_error",
            FaultCategory::Template => "template",
            FaultCategory::Setup => "setup",
            FaultCategory::Internal => "internal",
            FaultCategory::Simulator => "simulator",
        }
    }

    /// Transient faults worth another attempt. 4xx and malformed answers are not: the
    /// agent would answer the same way again.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            FaultCategory::Timeout
                | FaultCategory::Connect
                | FaultCategory::Transport
                | FaultCategory::Http5xx
        )
    }
}
