//! The LLM client: every call to a language model, the engine's own (the simulated user,
//! judges, Fixie's LLM) and those of the `openai`/`anthropic` agents under test.
//!
//! A [`ProviderClient`] is one `provider` node as configured for a run: OpenAI-compatible chat
//! completions (the hosted API, llama.cpp, vLLM, Ollama) or Anthropic Messages, over the run's
//! shared [`HttpTransport`](crate::transport::http::HttpTransport). Its calls are rate limited
//! (per-provider concurrency, requests and tokens per minute), a 429 is waited out (its
//! `Retry-After` honoured) and never counts as a failure, and every call is recorded with its
//! token usage and cost ([`LlmCall`]). A model under test is called through
//! [`chat::ChatClient`], which borrows a provider (its endpoint, key, limits and prices) when
//! the agent names one; both send through one call loop (`send.rs`).
//!
//! The API key comes from an environment variable and never leaves the request headers: it is
//! sent as a sensitive header value and cut out of every error message ([`provider`]).
//!
//! The wire formats are [`openai`] and [`anthropic`], one codec per API for every caller,
//! picked in [`codec`]; tool calls streamed in fragments are merged by [`fragments`] (also
//! for `protocol="http"` streams); a server's slots are [`slots`]; the on-disk response
//! cache is [`cache`]; prompts, rubrics and answer parsing of LLM judges are [`judge`];
//! [`runtime`] holds a run's providers, judges and cache, judges one criterion into its
//! record and writes the simulated user's turns ([`simulator`]); whether that user stayed in
//! character is [`fidelity`]; what a run spends per role, and its budget, is [`meter`]; attack search's prompts are
//! [`attack`].

pub mod anthropic;
pub mod attack;
pub mod cache;
pub mod chat;
pub mod codec;
pub mod fidelity;
pub mod fragments;
pub mod judge;
pub mod meter;
pub mod openai;
pub mod provider;
pub mod rejudge;
pub mod runtime;
mod send;
pub mod simulator;
pub mod slots;

use serde::{Deserialize, Serialize};

pub use cache::{CacheMode, LlmCache};
pub use provider::{ProviderClient, ProviderSetupError};
pub use runtime::{LlmRuntime, LlmSetup};

use crate::record::FaultCategory;
pub use crate::record::{CacheUse, LlmCall, LlmUsage};

/// Who said a message of an LLM conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One message sent to the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LlmMessage {
    pub role: Role,
    pub content: String,
}

impl LlmMessage {
    pub fn system(content: impl Into<String>) -> Self {
        LlmMessage {
            role: Role::System,
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        LlmMessage {
            role: Role::User,
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        LlmMessage {
            role: Role::Assistant,
            content: content.into(),
        }
    }
}

/// What to ask the model. Unset parameters fall back to the provider's (`model`,
/// `temperature`, `max-tokens`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    pub messages: Vec<LlmMessage>,
    pub model: Option<String>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// The cap sent when neither the call nor the provider sets `max_tokens`: what the
    /// call's purpose needs ([`SIMULATOR_MAX_TOKENS`], [`JUDGE_MAX_TOKENS`]). Without any, a
    /// local server may generate until its context is full (minutes on a CPU) when a small
    /// model never stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_default: Option<u32>,
    /// The temperature sent when neither the call nor the provider sets one: 0 for judges,
    /// whose verdicts should not depend on the draw (a server's own default is often 0.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_default: Option<f64>,
    /// Ask for a JSON object matching this schema where the provider supports structured
    /// output (OpenAI-compatible `response_format`); the caller still parses strictly.
    pub json_schema: Option<serde_json::Value>,
    /// Which attempt at a trajectory this call belongs to (`simulator retries-invalid`): a
    /// retry must be a fresh draw, not the cached answer of the attempt that broke
    /// character; for a judge, which judgment of the same transcript (`trellis variance`).
    /// Part of the cache key when not 0 (so entries of first attempts stay valid); never
    /// sent.
    #[serde(default, skip_serializing_if = "is_first")]
    pub attempt: u32,
}

fn is_first(attempt: &u32) -> bool {
    *attempt == 0
}

/// Output cap of a simulated user's message (a few sentences; the end marker included).
pub const SIMULATOR_MAX_TOKENS: u32 = 512;
/// Output cap of a judge's answer: Connexity's rubric writes eight scored metrics with
/// justifications and failure codes, plus a verdict per expected outcome.
/// About 600 tokens in practice; the cap stays within a 120 s timeout at 20 tokens a second.
pub const JUDGE_MAX_TOKENS: u32 = 1536;
/// Output cap of the attacker's answer: a few candidate user messages as JSON.
pub const ATTACK_MAX_TOKENS: u32 = 768;
/// Output cap of the fidelity judge's answer: two JSON fields, one sentence.
pub const FIDELITY_MAX_TOKENS: u32 = 256;
/// Output cap of one answer of a model playing an agent's LLM (Fixie's few-shot lines).
pub const AGENT_MAX_TOKENS: u32 = 1024;

/// What the model answered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub text: String,
    /// The model as the server reported it.
    pub model: Option<String>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// `stop`, `length`, `end_turn`, `max_tokens`, …
    pub finish_reason: Option<String>,
    /// [`crate::transport::Usage::priced_prompt_tokens`] of the answer.
    #[serde(skip)]
    pub priced_input_tokens: Option<f64>,
}

impl Completion {
    /// The prompt's tokens as the provider bills them, in input tokens.
    pub fn priced_input(&self) -> Option<f64> {
        self.priced_input_tokens
            .or(self.input_tokens.map(|t| t as f64))
    }
}

/// Why an LLM call produced no usable answer. Messages never contain the API key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// Transport failure, timeout or HTTP error status, after the retries.
    #[error("provider `{provider}`: {category}: {message}", category = category.as_str())]
    Http {
        provider: String,
        category: FaultCategory,
        message: String,
    },
    /// 429 answers kept coming past the time the call may wait.
    #[error(
        "provider `{provider}`: still rate limited (HTTP 429) after waiting {waited_s:.1}s; \
         lower `concurrency`/`requests-per-minute` on the provider or retry later"
    )]
    RateLimited { provider: String, waited_s: f64 },
    /// The body is not JSON at all (`invalid_json`, as for an agent).
    #[error("provider `{provider}`: {detail}")]
    NotJson { provider: String, detail: String },
    /// The body is JSON, but not the provider's response shape.
    #[error("provider `{provider}`: malformed response: {detail}")]
    Malformed { provider: String, detail: String },
    /// The provider answered with an error object in a 2xx body.
    #[error("provider `{provider}` reported an error: {detail}")]
    Provider { provider: String, detail: String },
    /// Neither the request nor the provider names a model.
    #[error("provider `{provider}` has no model: set `model=…` on the provider (or the judge)")]
    NoModel { provider: String },
    /// `--llm-cache-mode replay-only` and the call is not in the cache.
    #[error(
        "LLM cache miss in replay-only mode: {call} (key {key}); run once with \
         `--llm-cache-mode read-write` to record it"
    )]
    CacheMiss { call: String, key: String },
    /// The cache directory could not be read or written.
    #[error("LLM cache: {0}")]
    Cache(String),
    /// `--max-llm-calls` left no room for the call: it was not sent, and the run is stopping.
    #[error("{0}")]
    Budget(String),
}

impl LlmError {
    /// What the call failed with, as recorded for a judge that gave no verdict
    /// (`JudgeVerdict::error_category`): a transport's fault category, or one of the LLM
    /// client's own.
    pub fn category(&self) -> &'static str {
        match self {
            LlmError::Http { category, .. } => category.as_str(),
            LlmError::RateLimited { .. } => "rate_limited",
            LlmError::NotJson { .. } => "invalid_json",
            LlmError::Malformed { .. } => "protocol",
            LlmError::Provider { .. } => "provider_error",
            LlmError::NoModel { .. } => "setup",
            LlmError::CacheMiss { .. } => "cache_miss",
            LlmError::Cache(_) => "cache",
            LlmError::Budget(_) => "budget",
        }
    }
}

/// What [`ProviderClient::complete`] ended with: the answer or the error, and the call's
/// record either way.
#[derive(Clone, Debug)]
pub struct LlmOutcome {
    pub result: Result<Completion, LlmError>,
    pub call: LlmCall,
}
