//! The journal's entries: what a run started with, each agent's setup, each execution
//! node's turns, each trajectory, and the run's totals.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::trajectory::TrajectoryRecord;
use crate::turn::TurnRecord;

/// One line of the journal: `{"run_started":{…}}`, `{"node":{…}}`, `{"trajectory":{…}}`,
/// `{"run_finished":{…}}`. Externally tagged on purpose: an internally tagged enum makes
/// serde buffer every entry before decoding it, which doubled the cost of reading a journal.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalEntry {
    /// Shared: the report's writer keeps it to the run's end, and with a dataset's 20,000
    /// instances it is megabytes.
    RunStarted(Arc<RunInfo>),
    /// What an agent's one-time setup learned (Fixie's handshake); at most one per agent,
    /// before its first node.
    Agent(AgentRecord),
    Node(NodeRecord),
    /// Boxed: a trajectory record is much larger than the other entries.
    Trajectory(Box<TrajectoryRecord>),
    /// An agent's spans that arrived after their turn was recorded (OpenTelemetry batch
    /// exporters), written at the end of the run.
    Spans(Box<crate::span::SpanBatch>),
    RunFinished(RunSummary),
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
    /// `--strict`: a skipped check or trajectory failed its trajectory. A resumed run keeps
    /// the setting its finished trajectories were decided with.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict: bool,
    /// `trellis run --resume`: when each later attempt of the run started (RFC 3339, UTC),
    /// in order; `started_at` is the first attempt's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resumed_at: Vec<String>,
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
    /// Per trajectory (in the order of `trajectories`), what its plan means: the
    /// fingerprint of its last execution node (conversation and checks halves, each chained
    /// from the scenario's setup through every node above), as `CONV:CHECKS` hex. A resumed
    /// run refuses to keep a finished trajectory whose fingerprint changed. Absent from
    /// journals written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fingerprints: Vec<String>,
    pub repeat: u32,
    /// An instance of a `for-each` / `matrix` scenario: its row and values. Absent for
    /// other scenarios and from journals written before datasets existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceInfo>,
    /// The scenario's `history` as the run sent it (OpenAI-style messages): `trellis
    /// rejudge` shows the judge this one, whatever the file or row says now. Absent without
    /// a history and from journals written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<std::sync::Arc<Vec<serde_json::Value>>>,
}

/// What one instance of a `for-each` / `matrix` scenario ran with, so results join back to
/// the dataset's rows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InstanceInfo {
    /// The scenario's id as written (`refund` for `refund[A17]`).
    pub of: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_id: Option<String>,
    /// The row's fields, typed. Shared with the plan's instance: a dataset's rows are most
    /// of the run's start record, and copied for it they were 17 MB of a 20,000-row run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// The matrix values, `{NAME: VALUE}`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub vars: serde_json::Map<String, serde_json::Value>,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Shared with the trajectory's path in the engine: recording a turn does not copy its
    /// messages.
    pub turns: Vec<Arc<TurnRecord>>,
}

/// Which node entry of the journal a trajectory went through: `(suite, scenario, agent,
/// repetition, node)`, how readers of a journal join a trajectory's `nodes` to the node
/// entries ([`NodeRecord::key`], [`crate::TrajectoryRecord::node_key`]).
pub type NodeKey = (String, String, String, u32, String);

impl NodeRecord {
    pub fn key(&self) -> NodeKey {
        (
            self.suite.clone(),
            self.scenario.clone(),
            self.agent.clone(),
            self.repetition,
            self.node.clone(),
        )
    }
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
    /// Trajectories whose simulated user broke character (`invalid`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub invalid: u64,
    pub turns: u64,
    /// The run's LLM calls per role (`agent`, `simulator`, `judge`, `attacker`), each
    /// counted once where it was made (a shared prefix's once).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub llm_roles: std::collections::BTreeMap<String, crate::llm::LlmUsage>,
    /// Why the run stopped before its end on its own (`--max-llm-calls`, `--max-llm-cost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// The run was stopped (a signal, a budget, a newer save in watch) before all of its
    /// work was done: trajectories it had not finished are not in its records. Counting
    /// trajectories cannot tell this: an agent that forks (MultiAgentEval's `branch`) adds
    /// trajectories the plan does not count, so a stopped run can record more than it
    /// planned. Journals from before this field read as not interrupted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Connections to a loopback agent whose accept queue was full, made again after the
    /// agent's kernel dropped their first attempt, by the address they went to (`host:port`).
    /// The wait is in those turns' latencies; lowering `--jobs` or raising the agent's
    /// listen backlog removes it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub connections_redone: std::collections::BTreeMap<String, u64>,
    /// Requests a long-lived agent process (`process="long-lived"`) ended on without
    /// answering, each sent again to the process started in its place, by the agent's
    /// command. Those turns have the new process's answer and no fault: this is where the
    /// deaths show.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub requests_resent: std::collections::BTreeMap<String, u64>,
    /// Agent calls still unanswered when the stop's grace period ran out (or a second
    /// signal came): dropped with their trajectories, which are not in the records. What
    /// a person who stopped a run because an agent hung needs to know: which one, where.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abandoned: Vec<AbandonedCall>,
}

/// An agent call a stop dropped unanswered ([`RunSummary::abandoned`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AbandonedCall {
    pub suite: String,
    pub scenario: String,
    pub agent: String,
    pub repetition: u32,
    /// The node of the scenario's tree it was on (`start`, a branch's path: `left`).
    #[serde(default)]
    pub node: String,
    /// The turn it would have been (the trajectory's turns before it were answered).
    pub turn_index: u32,
    /// What was sent: the user message (its first 200 characters), or the step's kind.
    pub input: String,
    /// How long it had been waiting for the agent when it was dropped.
    pub waited_ms: f64,
}

impl AbandonedCall {
    /// One line, as the console, `show` and the report say it: `s/twin · left [a #0]
    /// turn 1 ("hi"), waiting 6.5s` (the node named past the shared start, the message's
    /// first 60 characters on one line).
    pub fn describe(&self) -> String {
        let node = match self.node.as_str() {
            "" | "start" => String::new(),
            node => format!(" · {node}"),
        };
        let mut input = self.input.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some((cut, _)) = input.char_indices().nth(60) {
            input.truncate(cut);
            input.push('…');
        }
        format!(
            "{}/{}{node} [{} #{}] turn {} ({input:?}), waiting {:.1}s",
            self.suite,
            self.scenario,
            self.agent,
            self.repetition,
            self.turn_index,
            self.waited_ms / 1000.0
        )
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
