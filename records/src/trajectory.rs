//! Trajectories as recorded: one path through a scenario for one agent and repetition,
//! with its status and every check's record.

use serde::{Deserialize, Serialize};

use crate::fault::Fault;
use crate::llm::{JudgeVerdict, LlmUsage};

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum TrajectoryStatus {
    Passed,
    Failed,
    Error,
    Skipped,
    /// The simulated user broke character (a deterministic guard, a conversation cycle or
    /// the fidelity judge said so): the conversation says nothing about the agent. Never
    /// `failed`, left out of pass rates; why is the failed `fidelity` check in `criteria`.
    Invalid,
}

impl TrajectoryStatus {
    /// Whether the trajectory says something about the agent: passed, failed or error
    /// (skipped and invalid ones are left out of pass rates and repetition counts).
    pub fn ran(self) -> bool {
        matches!(
            self,
            TrajectoryStatus::Passed | TrajectoryStatus::Failed | TrajectoryStatus::Error
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TrajectoryStatus::Passed => "passed",
            TrajectoryStatus::Failed => "failed",
            TrajectoryStatus::Error => "error",
            TrajectoryStatus::Skipped => "skipped",
            TrajectoryStatus::Invalid => "invalid",
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// Why the trajectory did not run (status `skipped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    pub llm: Option<Box<LlmUsage>>,
    /// A path of an `attack` search: what the attacker sent and how far it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attack: Option<Box<AttackRecord>>,
}

/// One path an `attack` explored (its trajectory's name ends with `~aD-N` per attack turn).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AttackRecord {
    pub goal: String,
    /// Attack turns on this path.
    pub depth: u32,
    /// The judge's score of the last reply against the goal, 0–1; `None` (null) when the
    /// path has no usable score (its judge failed or answered off the scale, its agent
    /// faulted): an error is not a 0, which reads as "refused".
    #[serde(default)]
    pub score: Option<f64>,
    /// `succeeded` (the agent yielded), `pruned` (not among the best `keep` at its depth),
    /// `resisted` (reached `depth` without yielding) or `error` (the attacker or judge
    /// failed).
    pub outcome: String,
    /// The attacker's user messages on this path, in order.
    pub messages: Vec<String>,
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
    /// The name of the planned trajectory this record belongs to: its name without what the
    /// run added to it, from the end: the `~aD-K` segments of an `attack` search's path (one
    /// per attack turn, its record's `depth`), the `~LABEL` suffixes of the forks the agent
    /// asked for, and the `@retryN` of a simulated user's retry.
    pub fn planned_name(&self) -> &str {
        let mut name = self.trajectory.as_str();
        if let Some(attack) = &self.attack {
            for _ in 0..attack.depth {
                match name.rfind("~a") {
                    Some(at) if is_attack_segment(&name[at + 2..]) => name = &name[..at],
                    _ => break,
                }
            }
        }
        // The forks' `~LABEL`s, all of them or none.
        let mut forked = Some(name);
        for branch in self.agent_branches.iter().rev() {
            forked = forked
                .and_then(|n| n.strip_suffix(branch.label.as_str()))
                .and_then(|n| n.strip_suffix('~'));
        }
        name = forked.unwrap_or(name);
        match name.rfind("@retry") {
            Some(at) if is_number(&name[at + "@retry".len()..]) => &name[..at],
            _ => name,
        }
    }

    /// The key of the node entry for `node`, one of this trajectory's `nodes`.
    pub fn node_key(&self, node: &str) -> crate::NodeKey {
        (
            self.suite.clone(),
            self.scenario.clone(),
            self.agent.clone(),
            self.repetition,
            node.to_owned(),
        )
    }

    /// Why the trajectory is `invalid`: the detail of its failed `fidelity` check.
    pub fn invalid_reason(&self) -> Option<&str> {
        if self.status != TrajectoryStatus::Invalid {
            return None;
        }
        self.criteria
            .iter()
            .find(|c| c.kind == FIDELITY_KIND && c.status == CriterionStatus::Failed)
            .map(|c| {
                c.detail
                    .as_deref()
                    .unwrap_or("the simulated user broke character")
            })
    }

    /// How many of its checks ended with `status`.
    pub fn checks_with(&self, status: CriterionStatus) -> usize {
        self.criteria.iter().filter(|c| c.status == status).count()
    }
}

/// `CriterionRecord::kind` of the simulated user's fidelity check (guards, cycles, judge):
/// failed, it makes the trajectory `invalid`; it never makes a trajectory pass.
pub const FIDELITY_KIND: &str = "fidelity";

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
    /// Failed, or its evaluator failed (`error`): what a trajectory's failures list.
    pub fn is_failure(self) -> bool {
        matches!(self, CriterionStatus::Failed | CriterionStatus::Error)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CriterionStatus::Passed => "passed",
            CriterionStatus::Failed => "failed",
            CriterionStatus::Skipped => "skipped",
            CriterionStatus::Error => "error",
        }
    }
}

/// The detail of a check a stop (a signal, an LLM budget) left unjudged: its judge was
/// still answering, or not asked yet. The trajectory's conversation is kept, but it has no
/// verdict: it is `skipped` ([`CriterionRecord::cut_by_stop`]), and `trellis run --resume`
/// runs it again.
pub const CUT_BY_STOP: &str = "not checked: the run was stopped before the judge answered";

/// The detail of the checks a stop left unreached on a trajectory it cut mid-walk.
pub const CUT_MID_WALK: &str = "not checked: the run was stopped";

/// The detail of the checks a trajectory never reached because it stopped at `criterion`
/// (`max-turns`, a capture, `stop-on-failure`), read back by [`stopped_at`].
pub fn stopped_at_detail(criterion: &str) -> String {
    format!("not checked: the trajectory stopped at `{criterion}`")
}

/// The criterion a [`stopped_at_detail`] names.
pub fn stopped_at(detail: &str) -> Option<&str> {
    detail
        .strip_prefix("not checked: the trajectory stopped at `")?
        .strip_suffix('`')
}

/// How the detail of a check `--max-llm-calls` left unjudged begins (its judge call was
/// refused unsent); the meter's words follow (`calls 10 reached (10 calls sent)`).
pub const CUT_BY_BUDGET: &str = "not checked: not sent: --max-llm-";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CriterionRecord {
    /// The turn checked (`expect`); `None` for trajectory-level `criteria`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_index: Option<u32>,
    /// The criterion as written.
    pub criterion: String,
    pub kind: String,
    pub status: CriterionStatus,
    /// Why it failed or was skipped; what was observed when it passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// LLM-judged criteria (`judge`, `outcome`): the judge, score, threshold, justification,
    /// per-metric scores and the call's usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<Box<JudgeVerdict>>,
}

impl CriterionRecord {
    /// Whether a stop (a signal, an LLM budget) left this check unjudged or unreached
    /// ([`CUT_BY_STOP`], [`CUT_MID_WALK`], [`CUT_BY_BUDGET`]).
    pub fn cut_by_stop(&self) -> bool {
        self.status == CriterionStatus::Skipped
            && self.detail.as_deref().is_some_and(|d| {
                d == CUT_BY_STOP || d == CUT_MID_WALK || d.starts_with(CUT_BY_BUDGET)
            })
    }
}

/// `D-K` of an attack path's `~aD-K` segment.
fn is_attack_segment(s: &str) -> bool {
    s.split_once('-')
        .is_some_and(|(d, k)| is_number(d) && is_number(k))
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}
