//! What the report's trajectory trees need from the whole journal, gathered as it streams:
//! per scenario, the execution nodes each trajectory went through, how its repetitions
//! ended (counts, and the few the report draws as chips), and per node how many runs
//! reached it and how many failed there.
//!
//! Memory is bounded by the plan's scenarios, trajectories and agents, never by the
//! repetitions or the turns: a run of a million repetitions keeps the same outline as one
//! of a hundred. Per-node counts are taken as runs arrive ([`node_outcomes`] reads them); a
//! fuller statistics module can replace them without touching the templates.

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::FixedState;

use trellis_records::{NodeRecord, RunInfo, TrajectoryRecord, TrajectoryStatus};

use crate::positions::{Positions, SCANNED};
use crate::stats::{Interner, Name};

/// Repetitions drawn as chips per trajectory and agent; past this, only those that did not
/// pass are drawn (this many at most) and the rest are counted.
pub(crate) const MAX_CHIPS: usize = 40;

/// How the repetitions of one trajectory on one agent ended: counts, and the repetitions
/// the report can draw (the lowest-numbered ones, and the lowest-numbered that did not
/// pass).
#[derive(Clone, Debug, Default)]
pub(crate) struct Repetitions {
    pub(crate) total: u64,
    pub(crate) passed: u64,
    /// Neither skipped nor invalid: said something about the agent.
    pub(crate) ran: u64,
    pub(crate) not_passed: u64,
    /// The first [`MAX_CHIPS`] + 1 repetitions by number: all of them when there are at
    /// most [`MAX_CHIPS`].
    pub(crate) first: BTreeMap<u32, TrajectoryStatus>,
    /// The first [`MAX_CHIPS`] repetitions by number that did not pass.
    pub(crate) first_not_passed: BTreeMap<u32, TrajectoryStatus>,
}

impl Repetitions {
    fn add(&mut self, repetition: u32, status: TrajectoryStatus) {
        self.total += 1;
        if status == TrajectoryStatus::Passed {
            self.passed += 1;
        } else {
            self.not_passed += 1;
            keep_lowest(&mut self.first_not_passed, repetition, status, MAX_CHIPS);
        }
        if status.ran() {
            self.ran += 1;
        }
        keep_lowest(&mut self.first, repetition, status, MAX_CHIPS + 1);
    }
}

/// Inserts into `kept`, then drops the highest-numbered entry beyond `cap`.
fn keep_lowest(
    kept: &mut BTreeMap<u32, TrajectoryStatus>,
    repetition: u32,
    status: TrajectoryStatus,
    cap: usize,
) {
    if kept.len() >= cap
        && kept
            .last_key_value()
            .is_some_and(|(&last, _)| repetition > last)
    {
        return;
    }
    kept.insert(repetition, status);
    if kept.len() > cap {
        kept.pop_last();
    }
}

// Agent and node names are interned (`stats::Interner`), shared by every scenario that has
// them: a dataset's 20,000 instances all go through a node `main` on agent `demo`, and a
// string of each per instance was a fifth of the outline's memory.

/// One scenario's trajectories as the journal recorded them.
#[derive(Debug, Default)]
pub(crate) struct ScenarioOutline {
    /// Each trajectory's nodes, root first, in the order trajectories were first seen.
    pub(crate) paths: Vec<(String, Vec<String>)>,
    /// Each trajectory's repetitions per agent, by position in `paths`, agents in the order
    /// they were first seen. (Beside `paths` rather than in a map by name: a scenario's
    /// trajectories are found by their position there already, and a map each was a
    /// third of a one-trajectory scenario's outline.)
    pub(crate) runs: Vec<Vec<(Name, Repetitions)>>,
    /// Per node: runs that reached it, failed or faulted there, and the turns it took.
    nodes: HashMap<Name, NodeOutline>,
    /// For trajectories that continue forks the agent asked for (`NAME~LABEL…`): the
    /// position of each alternative among those the agent listed, outermost first, so they
    /// are shown in the agent's order rather than finishing order.
    pub(crate) fork_positions: HashMap<String, Vec<u32>>,
    /// Each trajectory's position in `paths`, once there are more than [`SCANNED`]: a
    /// scenario may have 100,000, and finding each by a scan of `paths` took their square
    /// (most scenarios have a few, and no map).
    path_at: Option<Positions>,
}

impl ScenarioOutline {
    /// The repetitions of trajectory `name` per agent.
    pub(crate) fn runs_of(&self, name: &str) -> &[(Name, Repetitions)] {
        self.position(name)
            .and_then(|at| self.runs.get(at))
            .map_or(&[], Vec::as_slice)
    }

    /// Where trajectory `name` is in `paths`.
    fn position(&self, name: &str) -> Option<usize> {
        match &self.path_at {
            Some(at) => at.get(name),
            None => self.paths.iter().position(|(n, _)| n == name),
        }
    }

    /// Adds trajectory `name` with its `nodes` at the end of `paths`; returns its position.
    fn push_path(&mut self, name: &str, nodes: &[String]) -> usize {
        let at = self.paths.len();
        // Most scenarios have one trajectory: room for one, not the four a first push makes.
        push_sized(&mut self.paths, (name.to_owned(), nodes.to_vec()));
        push_sized(&mut self.runs, Vec::new());
        match &mut self.path_at {
            Some(positions) => positions.push(name),
            None if self.paths.len() > SCANNED => {
                self.path_at = Some(Positions::of(self.paths.iter().map(|(n, _)| n.as_str())));
            }
            None => {}
        }
        at
    }
}

/// Pushes `item`, making room for exactly one when `items` has none. A `Vec`'s first push
/// makes room for four; the outline keeps a few lists per scenario that usually hold one
/// (one trajectory, one agent, one node's turns), and with 20,000 scenarios the three
/// unused slots of each were 5.6 MB of the run's peak (docs/performance.md, "Many scenarios").
fn push_sized<T>(items: &mut Vec<T>, item: T) {
    if items.capacity() == 0 {
        items.reserve_exact(1);
    }
    items.push(item);
}

/// What the outline keeps of one node of a scenario.
#[derive(Debug, Default)]
struct NodeOutline {
    outcome: NodeOutcome,
    /// Turn indices the node took on each agent, from the first repetition recorded, so a
    /// failed `expect` can be placed at the node that took its turn.
    turns: Vec<(Name, (u32, u32))>,
}

/// Every scenario's outline, by suite, then scenario: found by the names a record holds,
/// with no key made for it. Keyed by `(suite, scenario)` pairs, every node and trajectory
/// recorded copied both names to look its scenario up.
#[derive(Debug, Default)]
pub(crate) struct Outline {
    scenarios: Scenarios,
    /// Agent and node names, interned.
    names: Interner,
}

type Scenarios =
    hashbrown::HashMap<String, hashbrown::HashMap<String, ScenarioOutline, FixedState>, FixedState>;

/// The outline of `scenario` of `suite` in `scenarios`, made empty if it is not there. The
/// names are copied only when they are new (hashbrown's `entry_ref`).
fn scenario_mut<'s>(
    scenarios: &'s mut Scenarios,
    suite: &str,
    scenario: &str,
) -> &'s mut ScenarioOutline {
    scenarios
        .entry_ref(suite)
        .or_default()
        .entry_ref(scenario)
        .or_default()
}

impl Outline {
    /// An outline with room for the planned scenarios of `info`: grown from empty, a
    /// suite's map of 20,000 scenarios was rehashed fifteen times while the run went on.
    pub(crate) fn for_plan(info: &RunInfo) -> Self {
        let mut planned: hashbrown::HashMap<&str, usize, FixedState> = Default::default();
        for s in &info.scenarios {
            *planned.entry(s.suite.as_str()).or_default() += 1;
        }
        let mut outline = Outline::default();
        for (suite, count) in planned {
            let mut scenarios = hashbrown::HashMap::default();
            scenarios.reserve(count);
            outline.scenarios.insert(suite.to_owned(), scenarios);
        }
        outline
    }

    /// The outline of `scenario` of `suite`, if anything of it was recorded.
    pub(crate) fn scenario(&self, suite: &str, scenario: &str) -> Option<&ScenarioOutline> {
        self.scenarios.get(suite)?.get(scenario)
    }

    /// Every `(suite, scenario)` with an outline, in no order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (&String, &String)> {
        self.scenarios
            .iter()
            .flat_map(|(suite, scenarios)| scenarios.keys().map(move |scenario| (suite, scenario)))
    }

    pub(crate) fn add_node(&mut self, node: &NodeRecord) {
        let outline = scenario_mut(&mut self.scenarios, &node.suite, &node.scenario);
        let entry = match outline.nodes.get_mut(node.node.as_str()) {
            Some(entry) => entry,
            None => outline.nodes.entry(self.names.get(&node.node)).or_default(),
        };
        if entry.turns.iter().any(|(agent, _)| **agent == *node.agent) {
            return;
        }
        // A replayed turn repeats a prefix turn's index: it belongs to the prefix.
        let own = node
            .turns
            .iter()
            .filter(|t| !t.replay)
            .map(|t| t.turn_index);
        if let (Some(first), Some(last)) = (own.clone().min(), own.max()) {
            let agent = self.names.get(&node.agent);
            push_sized(&mut entry.turns, (agent, (first, last)));
        }
    }

    pub(crate) fn add_trajectory(&mut self, t: &TrajectoryRecord) {
        let outline = scenario_mut(&mut self.scenarios, &t.suite, &t.scenario);
        let at = match outline.position(&t.trajectory) {
            Some(at) => {
                // A run that stopped early lists fewer nodes: keep the longest path seen.
                if let Some((_, nodes)) = outline.paths.get_mut(at)
                    && nodes.len() < t.nodes.len()
                {
                    nodes.clone_from(&t.nodes);
                }
                at
            }
            None => outline.push_path(&t.trajectory, &t.nodes),
        };
        if !t.agent_branches.is_empty() {
            outline
                .fork_positions
                .entry(t.trajectory.clone())
                .or_insert_with(|| t.agent_branches.iter().map(|b| b.index).collect());
        }
        let Some(runs) = outline.runs.get_mut(at) else {
            return;
        };
        match runs.iter_mut().find(|(agent, _)| **agent == *t.agent) {
            Some((_, reps)) => reps.add(t.repetition, t.status),
            None => {
                let mut reps = Repetitions::default();
                reps.add(t.repetition, t.status);
                push_sized(runs, (self.names.get(&t.agent), reps));
            }
        }
        // Skipped and invalid runs say nothing about where the agent went wrong.
        if !t.status.ran() {
            return;
        }
        // A run goes through every node of its path (a failed `expect` does not stop the
        // walk): it passed a node before the one where it first went wrong, went wrong
        // there, and ran the nodes after it with the failure already decided above them,
        // as summary.json's `nodes` count them (crate::stats).
        let failed_at =
            failure_node(outline, t).and_then(|at| t.nodes.iter().position(|n| *n == at));
        for (position, node) in t.nodes.iter().enumerate() {
            let entry = match outline.nodes.get_mut(node.as_str()) {
                Some(entry) => entry,
                None => outline.nodes.entry(self.names.get(node)).or_default(),
            };
            let outcome = &mut entry.outcome;
            outcome.reached += 1;
            match failed_at {
                Some(at) if position == at && t.status == TrajectoryStatus::Error => {
                    outcome.errors_here += 1;
                }
                Some(at) if position == at => outcome.failed_here += 1,
                Some(at) if position > at => outcome.failed_above += 1,
                _ => {}
            }
        }
    }
}

/// Where a failed or errored trajectory first went wrong, by the rule summary.json counts
/// nodes with ([`crate::stats::failure_position`]), turns placed by the first repetition
/// recorded.
pub(crate) fn failure_node(outline: &ScenarioOutline, t: &TrajectoryRecord) -> Option<String> {
    let at = crate::stats::failure_position(t, t.nodes.len(), |turn| {
        t.nodes.iter().position(|node| {
            outline
                .nodes
                .get(node.as_str())
                .and_then(|n| n.turns.iter().find(|(agent, _)| **agent == *t.agent))
                .is_some_and(|&(_, (first, last))| first <= turn && turn <= last)
        })
    })?;
    t.nodes.get(at).cloned()
}

/// Per node of a scenario's tree: how many runs went through it, how many of them first
/// failed or faulted there, and how many had already failed above it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeOutcome {
    pub(crate) reached: u64,
    pub(crate) failed_here: u64,
    pub(crate) errors_here: u64,
    pub(crate) failed_above: u64,
}

impl NodeOutcome {
    /// Runs that went through the node with nothing gone wrong by its end.
    pub(crate) fn passed(&self) -> u64 {
        self.reached
            .saturating_sub(self.failed_here)
            .saturating_sub(self.errors_here)
            .saturating_sub(self.failed_above)
    }
}

/// Counts per node: a failure in a shared prefix is counted there, and as failed above in
/// the branches below it, which those runs still ran.
pub(crate) fn node_outcomes(outline: &ScenarioOutline) -> HashMap<&str, NodeOutcome> {
    outline
        .nodes
        .iter()
        // A node only seen in a `node` record (its runs were skipped) has no outcome.
        .filter(|(_, n)| n.outcome.reached > 0)
        .map(|(name, n)| (&**name, n.outcome))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use trellis_records::{
        CriterionRecord, CriterionStatus, NodeRecord, TrajectoryRecord, TrajectoryStatus,
        TurnRecord,
    };

    use super::*;

    fn node(id: &str, turns: &[u32]) -> NodeRecord {
        NodeRecord {
            suite: "s".into(),
            scenario: "c".into(),
            agent: "a".into(),
            repetition: 0,
            node: id.into(),
            parent: None,
            turns: turns
                .iter()
                .map(|&i| {
                    Arc::new(TurnRecord {
                        turn_index: i,
                        ..TurnRecord::default()
                    })
                })
                .collect(),
        }
    }

    fn trajectory(name: &str, nodes: &[&str], failed_turn: Option<u32>) -> TrajectoryRecord {
        TrajectoryRecord {
            llm: None,
            attack: None,
            suite: "s".into(),
            scenario: "c".into(),
            trajectory: name.into(),
            agent: "a".into(),
            protocol: "connexity".into(),
            repetition: 0,
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            status: if failed_turn.is_some() {
                TrajectoryStatus::Failed
            } else {
                TrajectoryStatus::Passed
            },
            turns: 0,
            duration_ms: 0.0,
            fault: None,
            skip_reason: None,
            criteria: failed_turn
                .map(|turn| CriterionRecord {
                    judge: None,
                    turn_index: Some(turn),
                    criterion: "reply contains=\"x\"".into(),
                    kind: "reply".into(),
                    status: CriterionStatus::Failed,
                    detail: None,
                })
                .into_iter()
                .collect(),
            tags: vec![],
            captures: Default::default(),
            agent_branches: Vec::new(),
            awaiting_human: None,
            sandbox_state: None,
        }
    }

    #[test]
    fn a_failure_in_the_shared_prefix_is_counted_there_only() {
        let mut outline = Outline::default();
        outline.add_node(&node("start", &[0, 1]));
        // The expect on turn 1 failed: neither branch was reached.
        outline.add_trajectory(&trajectory("x", &["start"], Some(1)));
        outline.add_trajectory(&trajectory("y", &["start"], Some(1)));
        let scenario = outline.scenario("s", "c").unwrap();
        let counts = node_outcomes(scenario);
        assert_eq!(
            counts["start"],
            NodeOutcome {
                reached: 2,
                failed_here: 2,
                errors_here: 0,
                failed_above: 0
            }
        );
        assert_eq!(
            counts.len(),
            1,
            "no branch counts a failure it never reached"
        );
    }

    #[test]
    fn a_failure_in_a_branch_is_counted_at_the_branch() {
        let mut outline = Outline::default();
        outline.add_node(&node("start", &[0]));
        outline.add_node(&node("x", &[1]));
        outline.add_node(&node("y", &[1]));
        outline.add_node(&node("x/then", &[2]));
        outline.add_trajectory(&trajectory("x", &["start", "x", "x/then"], Some(1)));
        outline.add_trajectory(&trajectory("y", &["start", "y"], None));
        let scenario = outline.scenario("s", "c").unwrap();
        let counts = node_outcomes(scenario);
        assert_eq!(counts["start"].passed(), 2);
        assert_eq!(counts["x"].failed_here, 1);
        assert_eq!(counts["y"].passed(), 1);
        // The walk went on after the failed expect: the node after it ran, with the
        // trajectory already failed above it.
        assert_eq!(
            counts["x/then"],
            NodeOutcome {
                reached: 1,
                failed_here: 0,
                errors_here: 0,
                failed_above: 1
            }
        );
    }

    #[test]
    fn a_failed_prefix_check_comes_before_a_later_fault() {
        // Turn 0 (the shared start) failed its expect in both trajectories; one branch
        // then faulted. Both first went wrong at the start, as summary.json counts it.
        let mut outline = Outline::default();
        outline.add_node(&node("start", &[0]));
        outline.add_node(&node("x", &[1]));
        outline.add_node(&node("y", &[1]));
        let mut faulted = trajectory("x", &["start", "x"], Some(0));
        faulted.status = TrajectoryStatus::Error;
        faulted.fault = Some(trellis_records::Fault::new(
            trellis_records::FaultCategory::Http5xx,
            "HTTP 500",
        ));
        outline.add_trajectory(&faulted);
        outline.add_trajectory(&trajectory("y", &["start", "y"], Some(0)));
        let scenario = outline.scenario("s", "c").unwrap();
        let counts = node_outcomes(scenario);
        assert_eq!(counts["start"].passed(), 0);
        assert_eq!(counts["start"].failed_here + counts["start"].errors_here, 2);
        assert_eq!(counts["x"].failed_above, 1);
        assert_eq!(counts["x"].errors_here, 0);
        assert_eq!(counts["y"].failed_above, 1);
        assert_eq!(counts["y"].passed(), 0);
    }
}
