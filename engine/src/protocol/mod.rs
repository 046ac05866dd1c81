//! Agent protocols: the one layer every kind of agent plugs into.
//!
//! A protocol is one module behind one trait. [`AgentProtocol`] is an agent as configured
//! for a run (its endpoint, headers, limits, a shared transport); it opens [`Session`]s,
//! one per conversation. A session takes [`TurnInput`]s (a user message, a direct function
//! call, a human's answer, or nothing when the agent speaks first) and returns the [`Turn`]:
//! every exchange on the wire it took (each with its own attempts, latency, time to first
//! token and tokens), the messages, tool calls paired with their results, the final reply,
//! and the fault that ended it, if any.
//!
//! Forking is the protocol's call: a session that resends the whole history on every call
//! (Connexity, OpenAI, MultiAgentEval) copies itself at a fork ([`Session::fork`]), so a
//! shared prefix is called once per repetition; a session bound to server state (AgentScope
//! `session_id`) cannot be copied, and the executor replays the prefix in a fresh session
//! for each branch. Adding a protocol is one module (its `SPEC`, settings and
//! [`registry::ProtocolModule`]) and one line in [`registry::PROTOCOLS`]; it touches neither
//! the loader, the planner, the executor nor the reports.
//!
//! Transports are written once and shared with the engine's LLM client, in
//! [`crate::transport`] (HTTP with bounded bodies, fault mapping and the retry rule; SSE;
//! JSON lines). Protocols never panic on what an agent sends.

pub mod a2a;
pub mod agentscope;
pub mod anthropic;
pub mod connexity;
pub mod fixie;
pub mod jsonhttp;
pub mod multiagent;
pub mod openai;
pub mod pairing;
pub mod registry;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::header::HeaderMap;

pub use crate::record::{ChatMessage, ToolCall, ToolCallFunction};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::transport::http::{CallLimits, HttpTransport, RetryPolicy};
pub use crate::transport::{Attempt, Exchange, Usage};
use trellis_dsl::{Endpoint, Protocol};

/// Everything a protocol needs to build its client for one agent of a run.
pub struct AgentSetup<'a> {
    /// The agent's id, for messages.
    pub id: &'a str,
    pub protocol: Protocol,
    /// The agent's endpoint as written (`url`, `base-url`, `builtin`, `command`, `socket`).
    pub endpoint: &'a Endpoint,
    /// The protocol's own settings, as its module's `plan` made them ([`registry::settings`]).
    pub settings: &'a dyn registry::PlannedSettings,
    /// `provider=` as written: the provider named for the agent's model or LLM.
    pub provider_name: Option<&'a str>,
    /// The endpoint: `url`, `base-url`, or the URL a builtin agent is served at.
    pub url: &'a str,
    /// The agent's `header` nodes, rendered.
    pub headers: Vec<(String, String)>,
    pub limits: CallLimits,
    pub retry: RetryPolicy,
    /// The run's HTTP connection pool.
    pub transport: HttpTransport,
    /// A builtin agent served as a process or on a socket instead of over HTTP.
    pub line: Option<LineTarget>,
    /// An `openai` agent's `system-prompt`, rendered.
    pub system_prompt: Option<String>,
    /// `provider=`: the client of the provider the agent's model is reached through
    /// (`openai`/`anthropic`) or that plays its LLM (`fixie`).
    pub provider: Option<Arc<crate::llm::ProviderClient>>,
    /// A model agent's `base-url` server's slots (llama.cpp), shared with the providers.
    pub server_slots: Option<Arc<crate::llm::slots::ServerSlots>>,
}

/// Builds the client of one agent through its protocol's module ([`registry`], the one
/// place that maps a `protocol=` to a module).
pub fn build(setup: AgentSetup<'_>) -> Result<Arc<dyn AgentProtocol>, Fault> {
    let setup_fault = |e: &dyn std::fmt::Display| {
        Fault::new(FaultCategory::Setup, format!("agent `{}`: {e}", setup.id))
    };
    let module = registry::module(setup.protocol).ok_or_else(|| {
        setup_fault(&format!(
            "no module speaks protocol `{}`",
            setup.protocol.as_str()
        ))
    })?;
    module.build(&setup).map_err(|e| setup_fault(&e))
}

/// Where a builtin agent served over the line transport is reached.
#[derive(Clone, Debug)]
pub enum LineTarget {
    /// `sh -c` this command (the trellis executable serving the agent on stdio).
    Command(String),
    /// `tcp:HOST:PORT` or `unix:/PATH`.
    Socket(String),
}

/// An agent as configured for a run: opens conversations with it.
///
/// Built once per agent per run by [`crate::execute`] from the plan; shared by every
/// trajectory (so it holds only immutable configuration and cheap-to-clone handles).
pub trait AgentProtocol: Send + Sync {
    /// Work done once per run before the first conversation (Fixie's handshake). What it
    /// returns is recorded with the run (`agent` journal entry); a fault here becomes a
    /// `setup` fault on every trajectory of the agent.
    fn prepare(&self) -> BoxFuture<'_, Result<Option<serde_json::Value>, Fault>> {
        Box::pin(async { Ok(None) })
    }

    /// A new conversation. No I/O: session-bound protocols create the server-side session
    /// on their first turn.
    fn open(&self, conversation: &Conversation<'_>) -> Box<dyn Session>;

    /// Ends what the client keeps running between conversations (a long-lived agent
    /// process with its whole process tree, a kept-open socket). Called once, at the end of
    /// the run; dropping the client must also end them, without waiting.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// One conversation with an agent.
pub trait Session: Send + Sync {
    /// Takes one turn. Never fails: a problem is the [`Turn::fault`].
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn>;

    /// A copy that continues independently from the same point, for a fork; `None` when the
    /// conversation lives on the agent's side and cannot be copied (the executor then
    /// replays the prefix in a fresh session).
    fn fork(&self) -> Option<Box<dyn Session>>;

    /// The trajectory's tool sandbox, for protocols whose tools the engine answers
    /// (MultiAgentEval): its final state and policy violations feed criteria.
    fn sandbox(&self) -> Option<&crate::sandbox::Sandbox> {
        None
    }

    /// What the agent asked a human (a MultiAgentEval `hitl_pause`) when it is waiting for
    /// one: the next turn must be a [`TurnInput::Human`].
    fn paused(&self) -> Option<&str> {
        None
    }

    /// The trajectory's template variables (`user_context`, `scenario`, `persona`, `env`,
    /// `vars` so far) before each turn, for protocols whose request is a template (`http`).
    /// Built only by a session that asks for it.
    fn set_template_scope(&mut self, scope: &dyn Fn() -> minijinja::Value) {
        let _ = scope;
    }

    /// Rebuilds this fresh session from turns taken earlier (each input with the agent's
    /// answer), so the conversation continues as if they had been taken here, without
    /// calling the agent (`trellis watch` reusing a recorded prefix). `false` when the
    /// protocol cannot (the conversation lives on the agent's side); nothing changed then.
    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        let _ = history;
        false
    }
}

/// Who a new conversation is for, so protocols can name sessions and fill metadata.
#[derive(Clone, Copy, Debug)]
pub struct Conversation<'a> {
    pub run_id: &'a str,
    pub suite: &'a str,
    /// The scenario id (Connexity `metadata.test_case_id`).
    pub scenario: &'a str,
    pub repetition: u32,
    /// The execution node the conversation starts at (`start`, `accepts`, …).
    pub node: &'a str,
    /// The scenario's tools, for protocols whose tool calls the engine answers.
    pub sandbox: Option<&'a Arc<crate::sandbox::SandboxSpec>>,
    /// The run's LLM providers, for protocols whose platform side is an LLM the engine
    /// plays (Fixie's few-shot loop answering `user` steps).
    pub llm: Option<&'a Arc<crate::llm::LlmRuntime>>,
}

/// What the engine asks of the agent in one turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnInput<'a> {
    /// A user message (scripted or simulated).
    User(&'a str),
    /// `first-turn "agent"`: the agent speaks first; no user message is sent.
    Opening,
    /// Fixie `call FUNC "TEXT"`: one agent function called directly.
    Call { function: &'a str, input: &'a str },
    /// A human's answer to an agent that paused for one (`hitl`).
    Human {
        approve: bool,
        message: Option<&'a str>,
    },
    /// Continuation `index` (0-based) of the `count` the agent asked for in a branch
    /// action ([`Turn::branch`]); `option` is the alternative it follows.
    Branch {
        index: usize,
        count: usize,
        option: &'a str,
    },
}

impl TurnInput<'_> {
    /// The `kind` recorded on the turn.
    pub fn kind(&self) -> &'static str {
        match self {
            TurnInput::User(_) => "user",
            TurnInput::Opening => "opening",
            TurnInput::Call { .. } => "call",
            TurnInput::Human { .. } => "human",
            TurnInput::Branch { .. } => "branch",
        }
    }

    /// The text sent, as recorded in `user_message`.
    pub fn text(&self) -> &str {
        match self {
            TurnInput::User(text) | TurnInput::Call { input: text, .. } => text,
            TurnInput::Opening => "",
            TurnInput::Human { message, .. } => message.unwrap_or(""),
            TurnInput::Branch { option, .. } => option,
        }
    }
}

/// Context of one turn, sent as protocol metadata where the protocol has a place for it.
#[derive(Clone, Debug)]
pub struct CallContext<'a> {
    /// The scenario id (Connexity `metadata.test_case_id`).
    pub test_case_id: &'a str,
    /// Zero-based index of this turn in the trajectory.
    pub turn_index: u32,
    /// The turn must be over by then (the trajectory's `timeout`), whatever retries remain.
    pub deadline: Option<tokio::time::Instant>,
    /// The agent's `header` values that read the turn's variables, rendered for this turn;
    /// every request to the agent sends them over its other headers ([`CallContext::headers`]).
    pub turn_headers: Option<&'a HeaderMap>,
    /// A model agent's `system-prompt` rendered for this turn, when it reads the turn's
    /// variables (`user_context`, `persona`, `scenario`, …); sent in place of the one
    /// rendered once per run.
    pub system_prompt: Option<&'a str>,
    /// The run's LLM meter, for a model API under test (`model_api`): each of the turn's
    /// requests (a tool round is one more) is a model call the engine sends, admitted under
    /// `--max-llm-calls` before it is sent and counted once answered. `None` for other
    /// agents, whose own model use Trellis cannot bound.
    pub llm_meter: Option<&'a crate::llm::meter::LlmMeter>,
}

impl CallContext<'_> {
    /// `agent_headers` (the agent's headers as built once per run) with this turn's own
    /// `header` values over them; borrowed when the agent has none that change per turn.
    pub fn headers<'h>(&self, agent_headers: &'h HeaderMap) -> std::borrow::Cow<'h, HeaderMap> {
        crate::transport::http::headers_over(agent_headers, self.turn_headers)
    }
}

/// What one turn produced.
#[derive(Clone, Debug, Default)]
pub struct Turn {
    /// Every exchange on the wire, in order (a single request for Connexity; one per loop
    /// step for action-loop protocols).
    pub exchanges: Vec<Exchange>,
    /// Every message of the turn, in order.
    pub messages: Vec<ChatMessage>,
    /// The final assistant text.
    pub reply: Option<String>,
    /// Tool calls of the turn with their results.
    pub tool_calls: Vec<ToolCallRecord>,
    pub model: Option<String>,
    pub provider: Option<String>,
    /// The fault that ended the turn. Whatever was received before it is kept above.
    pub fault: Option<Fault>,
    /// The agent asked for the conversation to fork here (a MultiAgentEval `branch`
    /// action): the executor explores each alternative in a copy of the session, through a
    /// [`TurnInput::Branch`] turn.
    pub branch: Option<BranchRequest>,
    /// Answered from an earlier run's records (`trellis watch`): the agent was not called.
    pub reused: bool,
    /// For a turn kept to be reused (`trellis watch`): where the ids its requests carried
    /// and its agent's spans (once they have arrived after the answer) are put, so that the
    /// turn answered again from the records has them too. `None` for every other turn.
    pub spans_for_reuse: Option<SpansForReuse>,
    /// LLM calls the engine made to produce this turn on the agent's behalf (the model
    /// playing Fixie's LLM), with their usage and cache use.
    pub llm: Vec<crate::llm::LlmCall>,
    /// Structured data the agent answered with besides text (an A2A task with its data
    /// parts and artifacts), read by `reply json-path=…` and `capture … json-path=…`.
    pub data: Option<serde_json::Value>,
    /// What the agent said of the turn besides its answer, as it sent it (a Connexity
    /// answer's `metadata`: trace URLs, prompt versions), for whoever reads the records.
    pub metadata: Option<serde_json::Value>,
    /// The run's LLM budget refused the turn's next request (`--max-llm-calls`): the run is
    /// stopping, and the turn, cut short by Trellis and not by the agent, is not recorded.
    pub unsent: bool,
}

/// What a turn kept for reuse ([`Turn::spans_for_reuse`]) holds besides its answer: set
/// once each, by the run that called the agent.
pub type SpansForReuse = std::sync::Arc<KeptTelemetry>;

/// The telemetry of a turn kept for reuse.
#[derive(Debug, Default)]
pub struct KeptTelemetry {
    /// The trace and span ids its requests carried in `traceparent` (hex): the turn answered
    /// again from the records keeps them, so it still joins the spans the agent sent.
    pub ids: std::sync::OnceLock<(std::sync::Arc<str>, String)>,
    /// The agent's spans of it.
    pub spans: std::sync::OnceLock<Vec<crate::record::SpanRecord>>,
    /// How long the agent took for it, its retries and waits out of rate limits included:
    /// what the trajectory's duration counts for it when it is answered again.
    pub took: std::sync::OnceLock<std::time::Duration>,
}

/// An agent's request to fork the conversation, with the alternatives it listed (none: one
/// continuation, described by the reason).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BranchRequest {
    pub reason: Option<String>,
    pub options: Vec<String>,
}

impl BranchRequest {
    /// The alternatives to explore, in order: the listed ones, or the one the reason
    /// describes.
    pub fn alternatives(&self) -> Vec<String> {
        if self.options.is_empty() {
            vec![self.reason.clone().unwrap_or_default()]
        } else {
            self.options.clone()
        }
    }
}

impl Turn {
    /// A turn that failed before anything was exchanged.
    pub fn failed(fault: Fault) -> Self {
        Turn {
            fault: Some(fault),
            ..Default::default()
        }
    }

    /// Time the exchanges waited for a provider's limits or a server's slot.
    pub fn queued(&self) -> Duration {
        self.exchanges.iter().map(|e| e.queued).sum()
    }

    /// Tokens summed over the exchanges that reported usage. A count past
    /// [`MOST_TOKENS`] is not a count (an agent's `2^64 - 1`, or a negative number read as
    /// one): left out, as unreported, rather than stored for every sum over the tables to
    /// wrap around.
    pub fn usage(&self) -> Option<Usage> {
        let mut total: Option<Usage> = None;
        for usage in self.exchanges.iter().filter_map(|e| e.usage).map(plausible) {
            let t = total.get_or_insert_with(Usage::default);
            t.prompt_tokens = add(t.prompt_tokens, usage.prompt_tokens);
            t.completion_tokens = add(t.completion_tokens, usage.completion_tokens);
            t.cost = match (t.cost, usage.cost) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            t.total_tokens = add(
                t.total_tokens,
                usage
                    .total_tokens
                    .or(match (usage.prompt_tokens, usage.completion_tokens) {
                        (Some(p), Some(c)) => Some(p.saturating_add(c)),
                        _ => None,
                    }),
            );
        }
        total
    }

    /// Whether [`Turn::usage`]'s counts are a floor of what the turn spent: some of its
    /// requests reported tokens and another reported none, or a request's count is known
    /// only in part (prompt tokens without completion ones or the reverse, and no total).
    /// Judged on the counts [`Turn::usage`] keeps: one it leaves out as implausible is
    /// unknown, so a `tokens max=N` check is not passed on what is left.
    pub fn tokens_partial(&self) -> bool {
        let mut known = false;
        let mut unknown = false;
        for exchange in &self.exchanges {
            let usage = exchange.usage.map(plausible).unwrap_or_default();
            let (prompt, completion) = (usage.prompt_tokens, usage.completion_tokens);
            if usage.total_tokens.is_some() || (prompt.is_some() && completion.is_some()) {
                known = true;
            } else if prompt.is_some() || completion.is_some() {
                // Half a count: the sums hold it, and miss the other half.
                known = true;
                unknown = true;
            } else {
                unknown = true;
            }
        }
        known && unknown
    }
}

/// `usage` without the counts past [`MOST_TOKENS`], which are unknown rather than counts.
fn plausible(usage: Usage) -> Usage {
    let plausible = |n: Option<u64>| n.filter(|&n| n <= MOST_TOKENS);
    Usage {
        prompt_tokens: plausible(usage.prompt_tokens),
        completion_tokens: plausible(usage.completion_tokens),
        total_tokens: plausible(usage.total_tokens),
        ..usage
    }
}

/// The most tokens one exchange can plausibly report: a trillion, a thousand times the
/// largest context windows.
pub const MOST_TOKENS: u64 = 1_000_000_000_000;

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_count_past_any_plausible_one_is_left_out() {
        let exchange = |prompt, completion| Exchange {
            usage: Some(Usage {
                prompt_tokens: Some(prompt),
                completion_tokens: Some(completion),
                total_tokens: None,
                cost: None,
                priced_prompt_tokens: None,
            }),
            ..Default::default()
        };
        let turn = Turn {
            exchanges: vec![exchange(u64::MAX, 3), exchange(20, 2)],
            ..Default::default()
        };
        let usage = turn.usage().unwrap();
        assert_eq!(usage.prompt_tokens, Some(20));
        assert_eq!(usage.completion_tokens, Some(5));
        // The first exchange's total is unknown (its prompt count was not one): the total
        // is the second's, and a floor of what the turn spent.
        assert_eq!(usage.total_tokens, Some(22));
        assert!(turn.tokens_partial());
    }

    #[test]
    fn counts_left_out_as_implausible_leave_the_turn_partial() {
        let exchange = |prompt, completion, total| Exchange {
            usage: Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: total,
                cost: None,
                priced_prompt_tokens: None,
            }),
            ..Default::default()
        };
        let turn = |exchanges| Turn {
            exchanges,
            ..Default::default()
        };
        // An agent's `2^64 - 1` prompt and total beside a real completion count: 5 is what
        // is left, a floor, not the turn's usage.
        let lying = turn(vec![exchange(Some(u64::MAX), Some(5), Some(u64::MAX))]);
        assert_eq!(lying.usage().unwrap().total_tokens, None);
        assert_eq!(lying.usage().unwrap().completion_tokens, Some(5));
        assert!(lying.tokens_partial());
        // Whole counts are not partial; nor is a turn that reported nothing at all.
        assert!(!turn(vec![exchange(Some(3), Some(5), None)]).tokens_partial());
        assert!(!turn(vec![exchange(None, None, Some(8))]).tokens_partial());
        assert!(!turn(vec![Exchange::default()]).tokens_partial());
        // Every count implausible beside a request with whole ones: the sum misses one.
        let half = turn(vec![
            exchange(Some(u64::MAX), Some(u64::MAX), None),
            exchange(Some(3), Some(5), None),
        ]);
        assert!(half.tokens_partial());
        // A request that reported none beside one that did, as before.
        assert!(turn(vec![exchange(Some(3), Some(5), None), Exchange::default()]).tokens_partial());
        // Half a count, as before.
        assert!(turn(vec![exchange(Some(3), None, None)]).tokens_partial());
    }
}
