//! Transports, written once for every protocol and for the engine's own LLM client: what
//! moving bytes to and from an agent or a model server takes, whatever the payload means.
//!
//! [`http`] is one pooled client per run with bounded bodies, every failure mapped to a
//! fault category, and the retry rule (plain HTTP/1.1 to a directly reached agent goes over
//! `plain`, hyper's connection API without reqwest's layers); [`sse`] reads server-sent
//! events over that pool (time to first event, idle timeout, size bounds, a stream that ends
//! early); `encoding` undoes the gzip or deflate some servers apply unasked; [`line`] speaks newline-delimited JSON with a process or a socket; [`quote`] puts
//! what a peer sent into a fault message, bounded and readable; [`trace`] puts the turn's W3C
//! trace context on every HTTP request sent for it.
//!
//! This layer sits just above the records (`docs/architecture.md`, "Layers"): it knows
//! faults and attempts, never a protocol, a plan or an LLM, so both `protocol` and `llm`
//! build on it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::record::Fault;

pub mod connect;
pub(crate) mod encoding;
pub mod http;
pub mod line;
mod plain;
pub mod quote;
pub mod sse;
pub mod tls;
pub mod trace;

/// One attempt of an exchange.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub latency: Duration,
    /// Why this attempt failed; `None` for the attempt that succeeded.
    pub fault: Option<Fault>,
}

/// One logical request of a turn, after its retries.
#[derive(Clone, Debug, Default)]
pub struct Exchange {
    /// What was called, for people reading the records: `POST /agent/respond`. Shared:
    /// built once per agent, not per turn.
    pub label: Arc<str>,
    /// Every attempt, in order; the last one is the one that counted.
    pub attempts: Vec<Attempt>,
    /// Time to the first streamed event of the last attempt (streaming protocols only).
    pub ttft: Option<Duration>,
    pub usage: Option<Usage>,
    /// Time its attempts waited for a provider's limits or a model server's slot: not the
    /// agent's latency, and not spent from the trajectory's time budget.
    pub queued: Duration,
}

impl Exchange {
    /// What the agent took to answer: the wall time of the last attempt.
    pub fn latency(&self) -> Duration {
        self.attempts.last().map_or(Duration::ZERO, |a| a.latency)
    }
}

/// Token usage as the agent or model reports it.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
    /// At the prices of the provider a model under test is reached through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// What `prompt_tokens` cost in input tokens when some were billed at another rate
    /// (Anthropic's prompt cache: written at 1.25× or 2×, read at 0.1× the input price);
    /// `None` when every one is billed at the input price. Not recorded: `cost` is.
    #[serde(skip)]
    pub priced_prompt_tokens: Option<f64>,
}

impl Usage {
    /// The prompt's tokens as the provider bills them, in input tokens.
    pub fn priced_prompt(&self) -> Option<f64> {
        self.priced_prompt_tokens
            .or(self.prompt_tokens.map(|t| t as f64))
    }
}
