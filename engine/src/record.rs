//! Run records: what a run produced, one self-contained JSON line per finished unit.
//!
//! Records are the hand-off between the engine and everything that presents results.
//! The engine appends them to the run journal (`journal.jsonl` in the output directory) as
//! soon as each execution node or trajectory finishes, so memory stays bounded and a crash
//! keeps every finished trajectory; `trellis-reports` reads the journal back into tables.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::protocol::ChatMessage;

/// One line of the journal: `{"run_started":{…}}`, `{"node":{…}}`, `{"trajectory":{…}}`,
/// `{"run_finished":{…}}`. Externally tagged on purpose: an internally tagged enum makes
/// serde buffer every entry before decoding it, which doubled the cost of reading a journal.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalEntry {
    RunStarted(RunInfo),
    /// What an agent's one-time setup learned (Fixie's handshake); at most one per agent,
    /// before its first node.
    Agent(AgentRecord),
    Node(NodeRecord),
    /// Boxed: a trajectory record is much larger than the other entries.
    Trajectory(Box<TrajectoryRecord>),
    RunFinished(RunSummary),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub trellis_version: String,
    /// Suite names in load order.
    pub suites: Vec<String>,
    pub jobs: usize,
    /// Trajectories the plan will run or record as skipped.
    pub planned_trajectories: u64,
    /// Every planned scenario in plan order, with what a reader needs to know about it.
    /// Absent from journals written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios: Vec<ScenarioInfo>,
    /// `trellis rejudge`: the run whose transcripts this run re-scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejudged_from: Option<String>,
}

/// A planned scenario as a report presents it: who the user is, which paths the plan
/// walks, and how many times.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScenarioInfo {
    pub suite: String,
    /// The scenario id, as in `TrajectoryRecord::scenario`.
    pub scenario: String,
    /// The human title (`name "…"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The persona as templates see it: `{id, type, description, instructions}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<serde_json::Value>,
    /// `user-context { … }` as written.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub user_context: serde_json::Map<String, serde_json::Value>,
    /// Agent ids in plan order.
    pub agents: Vec<String>,
    /// Trajectory names in plan order (the order of the branches in the suite).
    pub trajectories: Vec<String>,
    pub repeat: u32,
}

impl ScenarioInfo {
    /// What `planned` tells a report about its scenario.
    pub fn of(planned: &crate::plan::PlannedScenario, plan: &crate::plan::Plan) -> Self {
        let sc = &planned.scenario;
        ScenarioInfo {
            suite: planned.suite.to_string(),
            scenario: sc.id.value.clone(),
            name: sc.name.clone(),
            description: sc.description.clone(),
            persona: planned.scope.persona(),
            user_context: sc.user_context.clone(),
            agents: planned
                .agents
                .iter()
                .filter_map(|&a| plan.agents.get(a))
                .map(|a| a.id.to_string())
                .collect(),
            trajectories: planned
                .trajectories
                .iter()
                .map(|t| t.name.clone())
                .collect(),
            repeat: planned.repeat,
        }
    }
}

/// What an agent's protocol learned when it was set up for the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentRecord {
    pub agent: String,
    pub protocol: String,
    /// Protocol-specific, as received (Fixie: `base_prompt`, `few_shots`).
    pub info: serde_json::Value,
}

/// The turns one execution node took: a segment of the trajectory graph, executed once per
/// repetition however many trajectories share it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeRecord {
    pub suite: String,
    pub scenario: String,
    pub agent: String,
    pub repetition: u32,
    /// Path of segment labels from the root: `start`, `accepts`, `accepts/then`.
    pub node: String,
    pub parent: Option<String>,
    /// Shared with the trajectory's path in the engine: recording a turn does not copy its
    /// messages.
    pub turns: Vec<Arc<TurnRecord>>,
}

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
    pub tool_calls: Vec<ToolCallRecord>,
    /// Milliseconds since the run started.
    pub started_ms: f64,
    pub latency_ms: f64,
    /// Time to first streamed token; only for streaming protocols.
    pub ttft_ms: Option<f64>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
    /// The turn's tokens at the prices of the provider a model under test is reached
    /// through (`provider=` with `input-price`/`output-price`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    pub model: Option<String>,
    pub provider: Option<String>,
    /// Attempts made over every exchange (1 for one clean request).
    pub attempts: u32,
    pub fault: Option<Fault>,
    /// Every request of the turn with its attempts (several for action loops, retries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exchanges: Vec<ExchangeRecord>,
    /// A `simulate` turn: the LLM calls that wrote its user message (retries included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulator: Vec<crate::llm::LlmCall>,
    /// LLM calls made on the agent's behalf to answer the turn (a Fixie agent's few-shot
    /// loop: one per round), summed into the trajectory's `llm_*` usage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub llm: Vec<crate::llm::LlmCall>,
}

fn user_kind() -> String {
    "user".to_owned()
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

/// Why an agent call failed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Fault {
    pub category: FaultCategory,
    pub message: String,
}

impl Fault {
    pub fn new(category: FaultCategory, message: impl Into<String>) -> Self {
        Fault {
            category,
            message: message.into(),
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

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum TrajectoryStatus {
    Passed,
    Failed,
    Error,
    Skipped,
}

impl TrajectoryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TrajectoryStatus::Passed => "passed",
            TrajectoryStatus::Failed => "failed",
            TrajectoryStatus::Error => "error",
            TrajectoryStatus::Skipped => "skipped",
        }
    }
}

/// One path through a scenario's trajectory graph, for one agent and repetition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub suite: String,
    pub scenario: String,
    /// Branch names along the path joined with `/`; `main` when the scenario never forks.
    pub trajectory: String,
    pub agent: String,
    pub protocol: String,
    pub repetition: u32,
    /// Execution nodes along the path, root first (join with `NodeRecord::node`).
    pub nodes: Vec<String>,
    pub status: TrajectoryStatus,
    /// Agent turns taken along the whole path.
    pub turns: u32,
    /// Time the trajectory's own steps took (its agent calls, retries included), not the
    /// time it waited for a `--jobs` or `concurrency` slot.
    pub duration_ms: f64,
    pub fault: Option<Fault>,
    /// Why the trajectory did not run (status `skipped`).
    pub skip_reason: Option<String>,
    /// Every check on this trajectory: the `expect`s of its turns and its `criteria`.
    pub criteria: Vec<CriterionRecord>,
    pub tags: Vec<String>,
    /// The forks the agent itself asked for along this path (MultiAgentEval `branch`
    /// actions), outermost first; the trajectory's name ends with their labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_branches: Vec<AgentBranchRecord>,
    /// The agent's question when the trajectory ended with the agent waiting for a human
    /// (a `hitl_pause` no `hitl` step answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_human: Option<String>,
    /// The tool sandbox's state document at the end (agents whose tools the engine
    /// answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_state: Option<serde_json::Value>,
    /// Values the trajectory's `capture` steps took, by name (its `vars`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub captures: std::collections::BTreeMap<String, String>,
    /// The engine's own LLM calls for this trajectory (simulated user turns on its path,
    /// its judged checks), summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Box<crate::llm::LlmUsage>>,
}

/// One continuation of a fork the agent asked for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AgentBranchRecord {
    /// `~LABEL` in trajectory and node names: a slug of the option.
    pub label: String,
    /// The alternative this continuation follows, as the agent wrote it.
    pub option: String,
    pub reason: Option<String>,
    /// 1-based position among the alternatives the agent listed.
    pub index: u32,
    /// How many alternatives the agent listed.
    pub count: u32,
    /// 1 for a branch action on the scenario's own path, 2 inside a continuation, …
    pub depth: u32,
    /// Alternatives of the same branch action that were not explored, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unexplored: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limited_by: Option<String>,
}

impl TrajectoryRecord {
    /// How many of its checks ended with `status`.
    pub fn checks_with(&self, status: CriterionStatus) -> usize {
        self.criteria.iter().filter(|c| c.status == status).count()
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum CriterionStatus {
    Passed,
    Failed,
    Skipped,
    /// The check could not be evaluated because its evaluator failed (an LLM judge whose
    /// call failed or whose answer was garbage). Never passed; the trajectory is `error`.
    Error,
}

impl CriterionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CriterionStatus::Passed => "passed",
            CriterionStatus::Failed => "failed",
            CriterionStatus::Skipped => "skipped",
            CriterionStatus::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CriterionRecord {
    /// The turn checked (`expect`); `None` for trajectory-level `criteria`.
    pub turn_index: Option<u32>,
    /// The criterion as written.
    pub criterion: String,
    pub kind: String,
    pub status: CriterionStatus,
    /// Why it failed or was skipped; what was observed when it passed.
    pub detail: Option<String>,
    /// LLM-judged criteria (`judge`, `outcome`): the judge, score, threshold, justification,
    /// per-metric scores and the call's usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<Box<crate::llm::judge::JudgeVerdict>>,
}

/// Totals written at the end of the journal.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: String,
    pub finished_at: String,
    pub duration_ms: f64,
    pub trajectories: u64,
    pub passed: u64,
    pub failed: u64,
    pub errors: u64,
    pub skipped: u64,
    pub turns: u64,
}
