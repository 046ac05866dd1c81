//! The records of the engine's own LLM calls (simulated users, judges): each call's usage,
//! cost and cache use, their sums, and what a judged check records besides its status.

use serde::{Deserialize, Serialize};

use crate::trajectory::CriterionRecord;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheUse {
    /// No cache, or `--llm-cache-mode off`.
    #[default]
    Off,
    /// Answered from the cache: no request was sent.
    Hit,
    /// Not in the cache: the provider was called (and the answer stored).
    Miss,
}

/// The record of one logical LLM call (after its retries and rate-limit waits), kept with
/// whatever the call was for (a judged criterion, a simulated turn).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmCall {
    /// The `provider` id.
    pub provider: String,
    /// The model asked for.
    pub model: String,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// From the provider's `input-price`/`output-price` (per million tokens); `None` when no
    /// price is configured or no usage was reported. A cache hit costs nothing.
    pub cost: Option<f64>,
    /// Wall time of the whole call: queueing for the limits, attempts, waits.
    pub latency_ms: f64,
    /// HTTP attempts sent (0 for a cache hit, unless an ask before it was sent: the ask
    /// with the schema of a schema fallback).
    pub attempts: u32,
    /// HTTP 429 answers waited out.
    pub rate_limited: u32,
    /// Time spent waiting: for a concurrency slot, the request and token rate limits, and
    /// the `Retry-After` of 429 answers.
    pub waited_ms: f64,
    pub cache: CacheUse,
    /// Why the call failed, if it did.
    pub error: Option<String>,
    /// Ended by the run's LLM budget (`--max-llm-calls`, `--max-llm-cost`) refusing one of
    /// its requests, first or retry: unanswered; only the requests sent before it (its
    /// `attempts`) count.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

/// LLM calls summed: per trajectory (`trajectories.llm_*`) and per run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmUsage {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Summed over the calls that have a cost (a provider with prices).
    pub cost: Option<f64>,
    /// Calls answered from the cache.
    pub cache_hits: u64,
}

impl LlmUsage {
    /// Adds one call: `calls` counts the HTTP requests it sent (`attempts`: retries, the
    /// schema fallback's second ask and 429 re-sends each one more; none for a call the
    /// budget refused or that failed before sending), plus one for an answer from the cache,
    /// as the run's meter counts them. A call can be both: its ask with the schema sent and
    /// refused, its ask without it answered from the cache.
    pub fn add(&mut self, call: &LlmCall) {
        self.calls += u64::from(call.attempts) + u64::from(call.cache == CacheUse::Hit);
        self.input_tokens = self
            .input_tokens
            .saturating_add(call.input_tokens.unwrap_or(0));
        self.output_tokens = self
            .output_tokens
            .saturating_add(call.output_tokens.unwrap_or(0));
        if let Some(c) = call.cost {
            self.cost = Some(self.cost.unwrap_or(0.0) + c);
        }
        if call.cache == CacheUse::Hit {
            self.cache_hits += 1;
        }
    }

    /// Adds another total.
    pub fn merge(&mut self, other: &LlmUsage) {
        self.calls += other.calls;
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        if let Some(c) = other.cost {
            self.cost = Some(self.cost.unwrap_or(0.0) + c);
        }
        self.cache_hits += other.cache_hits;
    }

    /// The simulator calls of a trajectory's turns and the judge calls of its checks (a
    /// panel's members each count); `None` when there were none.
    pub fn of<'a>(
        simulator: impl IntoIterator<Item = &'a LlmCall>,
        criteria: &[CriterionRecord],
    ) -> Option<LlmUsage> {
        let mut usage = LlmUsage::default();
        for call in simulator {
            usage.add(call);
        }
        for verdict in criteria.iter().filter_map(|c| c.judge.as_deref()) {
            if verdict.members.is_empty() {
                if !verdict.call.provider.is_empty() {
                    usage.add(&verdict.call);
                }
            } else {
                for m in &verdict.members {
                    usage.add(&m.call);
                }
            }
        }
        (usage.calls > 0).then_some(usage)
    }
}

/// One Connexity metric as the judge scored it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricScore {
    pub metric: String,
    pub weight: f64,
    /// 0–5.
    pub score: f64,
    pub label: Option<String>,
    pub justification: Option<String>,
    pub failure_code: Option<String>,
}

/// What a judged criterion records besides its status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JudgeVerdict {
    /// The `judge` id (or `provider:ID` for the implicit judge of a lone provider).
    pub judge: String,
    pub rubric: String,
    /// 0–1; `None` when the judge gave no usable answer.
    pub score: Option<f64>,
    pub threshold: f64,
    pub label: Option<String>,
    pub justification: Option<String>,
    /// Connexity's per-metric scores.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricScore>,
    /// The LLM call (provider, model, tokens, cost, cache); for a panel, its members' calls
    /// summed (a cache hit only when every member's was).
    pub call: LlmCall,
    /// A panel's consensus rule (`mean`, `majority`, `minimum`, `unanimous`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consensus: Option<String>,
    /// A panel's agreement: the share of its judges whose own verdict matches the panel's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreement: Option<f64>,
    /// A panel's members' verdicts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<JudgeVerdict>,
    /// Why the judge gave no verdict: what its call failed with (`timeout`, `http_5xx`,
    /// `rate_limited`, …, the list in docs/results.md), or `unusable_answer` for an answer
    /// that does not parse; a panel's, its first failed member's. `None` when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_category: Option<String>,
}
