//! Resuming a run that was cut short (`trellis run --resume`): the trajectories its journal
//! already holds are kept as recorded and never sent to the agent again; the rest run.
//!
//! The caller (the CLI) reads the journal, checks that the plan of every finished
//! trajectory is unchanged, and hands the executor a [`Finished`]: which trajectories of
//! which unit are done, whether they passed (a scenario that others `need` is decided by
//! them too), the totals they add to the run's, and how long the earlier attempts ran.
//!
//! A unit whose every trajectory finished is not run at all (its agent is not even set
//! up). In a unit where some branches of a tree finished and others did not, the execution
//! nodes on a finished trajectory's path are already in the journal and are not run again;
//! an unfinished branch below them opens a fresh session and sends the shared prefix to the
//! agent again before its own steps, as a branch of a session-bound agent does at a fork
//! (the turns are recorded on the branch's node with `replay: true`, and the prefix's
//! `expect`s are checked on them). Sending the recorded prefix again was chosen over
//! answering it from the journal: the branch's conversation is then one the agent really
//! had in one session, whatever the protocol, and only the few units in flight when the run
//! was killed have partly finished trees.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::record::{TrajectoryRecord, TrajectoryStatus};

/// What the journal of a run cut short already holds. Keys are hashed (128 bits), so a
/// resumed run of a million trajectories holds tens of megabytes, not their names.
#[derive(Debug, Default)]
pub struct Finished {
    /// The key of (suite, scenario, agent, repetition, planned trajectory) with its lowest
    /// bit set when every record of it passed: 16 bytes a trajectory, where a map to a
    /// flag would take 32.
    trajectories: HashSet<u128>,
    totals: FinishedTotals,
    elapsed: Duration,
    /// The LLM calls by role of the earlier attempts that ended their journal (each
    /// `run_finished` holds those before it too): the resumed run's totals add to them.
    llm_roles: std::collections::BTreeMap<String, crate::llm::LlmUsage>,
}

/// The run totals the kept records contribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinishedTotals {
    pub trajectories: u64,
    pub passed: u64,
    pub failed: u64,
    pub errors: u64,
    pub skipped: u64,
    pub invalid: u64,
    /// Agent turns on the kept nodes.
    pub turns: u64,
}

impl Finished {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps a trajectory record of the journal. A trajectory the agent forked
    /// (`agent_branches`) has a record per continuation, all under its planned name; it
    /// passed when they all did.
    pub fn add(&mut self, record: &TrajectoryRecord) {
        let t = &mut self.totals;
        t.trajectories += 1;
        match record.status {
            TrajectoryStatus::Passed => t.passed += 1,
            TrajectoryStatus::Failed => t.failed += 1,
            TrajectoryStatus::Error => t.errors += 1,
            TrajectoryStatus::Skipped => t.skipped += 1,
            TrajectoryStatus::Invalid => t.invalid += 1,
        }
        let key = key(
            &record.suite,
            &record.scenario,
            &record.agent,
            record.repetition,
            record.planned_name(),
        );
        let passed = record.status == TrajectoryStatus::Passed;
        let had_passed = self.trajectories.contains(&(key | 1));
        let had_not = self.trajectories.contains(&key);
        match (had_passed, had_not) {
            (false, false) => {
                self.trajectories.insert(key | u128::from(passed));
            }
            // One more record of a forked trajectory: it passed only if they all did.
            (true, _) if !passed => {
                self.trajectories.remove(&(key | 1));
                self.trajectories.insert(key);
            }
            _ => {}
        }
    }

    /// Counts the agent turns of a kept node, and how far into the run its last turn
    /// ended (milliseconds since the run started).
    pub fn add_turns(&mut self, turns: u64, ended_ms: f64) {
        self.totals.turns += turns;
        if ended_ms.is_finite() && ended_ms > 0.0 {
            self.elapsed = self.elapsed.max(Duration::from_secs_f64(ended_ms / 1000.0));
        }
    }

    /// Whether trajectory `trajectory` (its planned name) of the unit finished, and if so
    /// whether it passed.
    pub fn status(
        &self,
        suite: &str,
        scenario: &str,
        agent: &str,
        repetition: u32,
        trajectory: &str,
    ) -> Option<bool> {
        if self.trajectories.is_empty() {
            return None;
        }
        let key = key(suite, scenario, agent, repetition, trajectory);
        if self.trajectories.contains(&(key | 1)) {
            Some(true)
        } else if self.trajectories.contains(&key) {
            Some(false)
        } else {
            None
        }
    }

    /// Planned trajectories kept (a forked one counts once).
    pub fn len(&self) -> usize {
        self.trajectories.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trajectories.is_empty()
    }

    pub fn totals(&self) -> FinishedTotals {
        self.totals
    }

    /// Keeps the LLM calls by role an earlier attempt's `run_finished` recorded; the last
    /// one read wins, as it counts the attempts before it.
    pub fn set_llm_roles(
        &mut self,
        roles: std::collections::BTreeMap<String, crate::llm::LlmUsage>,
    ) {
        self.llm_roles = roles;
    }

    /// The earlier attempts' LLM calls by role ([`Finished::set_llm_roles`]).
    pub fn llm_roles(&self) -> &std::collections::BTreeMap<String, crate::llm::LlmUsage> {
        &self.llm_roles
    }

    /// How long the earlier attempts ran, up to the end of the last turn they recorded: the
    /// resumed run's clock (turns' `started_ms`, the run's `duration_ms`) continues from
    /// there.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

/// The planned trajectories the agent forked (`agent_branches`), and whether the journal
/// holds every continuation of each. A run killed while a fork's continuations ran has
/// recorded some of them; counting such a trajectory finished would lose the others, so a
/// trajectory is finished only when every explored alternative, at every fork below it, is
/// in the journal. An incomplete one runs again whole, and its recorded continuations are
/// dropped from the journal, so each continuation is recorded once.
#[derive(Debug, Default)]
pub struct Forks {
    /// Per planned trajectory, the path of every continuation recorded: at each fork, the
    /// alternative taken (from 1) and how many alternatives that fork explored.
    paths: HashMap<u128, Vec<Vec<(u32, u32)>>>,
}

impl Forks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes a record of a forked trajectory; returns false (and notes nothing) for one the
    /// agent did not fork.
    pub fn add(&mut self, record: &TrajectoryRecord) -> bool {
        if record.agent_branches.is_empty() {
            return false;
        }
        let path = record
            .agent_branches
            .iter()
            .map(|b| {
                let unexplored = u32::try_from(b.unexplored.len()).unwrap_or(u32::MAX);
                (b.index, b.count.saturating_sub(unexplored).max(1))
            })
            .collect();
        self.paths
            .entry(planned_key(record))
            .or_default()
            .push(path);
        true
    }

    /// The keys ([`planned_key`]) of the forked trajectories some continuation of which is
    /// not in the journal.
    pub fn incomplete(&self) -> HashSet<u128> {
        self.paths
            .iter()
            .filter(|(_, paths)| {
                let paths: Vec<&[(u32, u32)]> = paths.iter().map(Vec::as_slice).collect();
                !complete(&paths)
            })
            .map(|(key, _)| *key)
            .collect()
    }
}

/// Whether the continuations below one point of a forked trajectory (their paths from that
/// point on) cover every alternative explored at every fork.
fn complete(paths: &[&[(u32, u32)]]) -> bool {
    let Some(first) = paths.first() else {
        return false;
    };
    // A continuation that ends here: no fork below this point.
    if paths.iter().any(|p| p.is_empty()) {
        return true;
    }
    let explored = first[0].1;
    (1..=explored).all(|index| {
        let below: Vec<&[(u32, u32)]> = paths
            .iter()
            .filter(|p| p[0].0 == index)
            .map(|p| &p[1..])
            .collect();
        complete(&below)
    })
}

/// The key of the planned trajectory a record belongs to (for [`Forks::incomplete`]).
pub fn planned_key(record: &TrajectoryRecord) -> u128 {
    key(
        &record.suite,
        &record.scenario,
        &record.agent,
        record.repetition,
        record.planned_name(),
    )
}

fn key(suite: &str, scenario: &str, agent: &str, repetition: u32, trajectory: &str) -> u128 {
    let mut hasher = blake3::Hasher::new();
    for part in [suite, scenario, agent, trajectory] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update(&repetition.to_le_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    // The lowest bit is the passed flag of [`Finished::trajectories`].
    u128::from_le_bytes(first) & !1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::AgentBranchRecord;

    fn record(name: &str, repetition: u32, status: TrajectoryStatus) -> TrajectoryRecord {
        TrajectoryRecord {
            suite: "s".into(),
            scenario: "c".into(),
            trajectory: name.into(),
            agent: "a".into(),
            protocol: "connexity".into(),
            repetition,
            nodes: vec!["start".into()],
            status,
            turns: 1,
            duration_ms: 1.0,
            fault: None,
            skip_reason: None,
            criteria: Vec::new(),
            tags: Vec::new(),
            agent_branches: Vec::new(),
            awaiting_human: None,
            sandbox_state: None,
            captures: Default::default(),
            llm: None,
            attack: None,
        }
    }

    #[test]
    fn what_a_run_adds_to_a_name_is_taken_off_for_the_planned_one() {
        let mut retried = record("main@retry2", 0, TrajectoryStatus::Passed);
        assert_eq!(retried.planned_name(), "main");
        retried.trajectory = "ask@retry".into();
        assert_eq!(retried.planned_name(), "ask@retry", "not a retry's suffix");

        let mut attacked = record("x/y~a1-3~a2-1", 0, TrajectoryStatus::Failed);
        attacked.attack = Some(Box::new(crate::record::AttackRecord {
            depth: 2,
            ..Default::default()
        }));
        assert_eq!(attacked.planned_name(), "x/y");
        // A branch name of its own with `~a` in it stays.
        attacked.trajectory = "try~again~a1-2".into();
        attacked.attack.as_mut().unwrap().depth = 1;
        assert_eq!(attacked.planned_name(), "try~again");
        assert_eq!(planned_key(&attacked), key("s", "c", "a", 0, "try~again"));
    }

    #[test]
    fn a_forked_trajectory_is_kept_under_its_planned_name_and_passes_when_all_did() {
        let mut finished = Finished::new();
        finished.add(&record("main", 0, TrajectoryStatus::Passed));
        let mut forked = record("left~refund~b2", 1, TrajectoryStatus::Passed);
        for label in ["refund", "b2"] {
            forked.agent_branches.push(AgentBranchRecord {
                label: label.into(),
                option: label.into(),
                reason: None,
                index: 1,
                count: 2,
                depth: 1,
                unexplored: Vec::new(),
                limited_by: None,
            });
        }
        finished.add(&forked);
        let mut other = forked.clone();
        other.trajectory = "left~refund~b3".into();
        other.agent_branches[1].label = "b3".into();
        other.status = TrajectoryStatus::Failed;
        finished.add(&other);
        assert_eq!(finished.status("s", "c", "a", 0, "main"), Some(true));
        assert_eq!(finished.status("s", "c", "a", 1, "left"), Some(false));
        assert_eq!(finished.status("s", "c", "a", 1, "main"), None);
        assert_eq!(finished.status("s", "c", "b", 0, "main"), None);
        assert_eq!(finished.len(), 2);
        let totals = finished.totals();
        assert_eq!(
            (totals.trajectories, totals.passed, totals.failed),
            (3, 2, 1)
        );
    }

    /// A record of trajectory `left` forked along `path`: (alternative, alternatives, of
    /// which unexplored) at each fork.
    fn forked(path: &[(u32, u32, usize)]) -> TrajectoryRecord {
        let mut r = record("left", 0, TrajectoryStatus::Passed);
        for (depth, &(index, count, unexplored)) in path.iter().enumerate() {
            r.agent_branches.push(AgentBranchRecord {
                label: format!("b{index}"),
                option: format!("b{index}"),
                reason: None,
                index,
                count,
                depth: u32::try_from(depth + 1).unwrap(),
                unexplored: vec!["other".to_owned(); unexplored],
                limited_by: None,
            });
            r.trajectory.push_str(&format!("~b{index}"));
        }
        r
    }

    #[test]
    fn a_fork_is_complete_only_when_every_explored_continuation_is_recorded() {
        let key = planned_key(&forked(&[(1, 3, 0)]));
        let incomplete = |paths: &[&[(u32, u32, usize)]]| {
            let mut forks = Forks::new();
            for p in paths {
                assert!(forks.add(&forked(p)));
            }
            forks.incomplete().contains(&key)
        };
        assert!(!Forks::new().add(&record("main", 0, TrajectoryStatus::Passed)));
        assert!(incomplete(&[&[(1, 3, 0)], &[(3, 3, 0)]]));
        assert!(!incomplete(&[&[(1, 3, 0)], &[(3, 3, 0)], &[(2, 3, 0)]]));
        // Breadth-limited: two of three explored.
        assert!(!incomplete(&[&[(1, 3, 1)], &[(2, 3, 1)]]));
        // A fork below the second alternative: one of its two continuations is missing.
        assert!(incomplete(&[&[(1, 2, 0)], &[(2, 2, 0), (1, 2, 0)]]));
        assert!(!incomplete(&[
            &[(1, 2, 0)],
            &[(2, 2, 0), (1, 2, 0)],
            &[(2, 2, 0), (2, 2, 0)]
        ]));
    }

    #[test]
    fn parts_of_a_key_do_not_run_into_each_other() {
        assert_ne!(key("ab", "c", "a", 0, "t"), key("a", "bc", "a", 0, "t"));
        assert_ne!(key("s", "c", "a", 1, "t"), key("s", "c", "a", 256, "t"));
    }
}
