//! Running totals and the choice of trajectories the HTML report renders in full.

use std::collections::{BTreeMap, HashMap};

use trellis_records::{CriterionStatus, NodeRecord, TrajectoryRecord, TrajectoryStatus};

use crate::ReportOptions;
use crate::by_names::ByNames;
use crate::stats::Name;

/// Trajectory counts by status: the report's tally and the console's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub errors: u64,
    pub skipped: u64,
    /// The simulated user broke character: neither passed nor failed.
    pub invalid: u64,
}

impl Counts {
    /// Counts one trajectory of `status`.
    pub fn add(&mut self, status: TrajectoryStatus) {
        let slot = match status {
            TrajectoryStatus::Passed => &mut self.passed,
            TrajectoryStatus::Failed => &mut self.failed,
            TrajectoryStatus::Error => &mut self.errors,
            TrajectoryStatus::Skipped => &mut self.skipped,
            TrajectoryStatus::Invalid => &mut self.invalid,
        };
        *slot = slot.saturating_add(1);
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Counts) {
        self.passed = self.passed.saturating_add(other.passed);
        self.failed = self.failed.saturating_add(other.failed);
        self.errors = self.errors.saturating_add(other.errors);
        self.skipped = self.skipped.saturating_add(other.skipped);
        self.invalid = self.invalid.saturating_add(other.invalid);
    }

    /// Nothing failed, errored, was skipped or invalid.
    pub fn all_passed(&self) -> bool {
        self.failed + self.errors + self.skipped + self.invalid == 0
    }

    pub(crate) fn total(&self) -> u64 {
        self.passed + self.failed + self.errors + self.skipped + self.invalid
    }

    /// Passed over the trajectories that ran (skipped and invalid ones are left out: an
    /// invalid one says nothing about the agent); `None` when none ran.
    pub(crate) fn pass_rate(&self) -> Option<f64> {
        let ran = self.passed + self.failed + self.errors;
        (ran > 0).then(|| self.passed as f64 / ran as f64)
    }
}

/// Aggregates over the whole journal, bounded by the number of suites, scenarios and agents.
///
/// The ordered maps are made once, by [`Tally::settle`], from counts kept per (suite,
/// scenario, agent) while trajectories are added ([`ByNames`]). Entries of four ordered maps
/// keyed by copies of the names were about 4,700 instructions a trajectory with 20,000
/// scenarios (string comparisons down each tree, seven copies), and 1,500 with one.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) total: Counts,
    pub(crate) by_suite: BTreeMap<Name, Counts>,
    pub(crate) by_scenario: BTreeMap<(Name, Name), Counts>,
    pub(crate) by_agent: BTreeMap<Name, Counts>,
    /// Per (suite, scenario, agent): the report's agents-side-by-side grids.
    pub(crate) by_scenario_agent: BTreeMap<(Name, Name, Name), Counts>,
    /// Counts by (suite, scenario, agent), until [`Tally::settle`].
    recorded: ByNames<Counts>,
    /// Agent turns actually taken (a shared prefix counts once per repetition).
    pub(crate) turns: u64,
    /// Checks that did not run (status `skipped`), over every trajectory.
    pub(crate) checks_skipped: u64,
    /// Trajectories with at least one check that did not run.
    pub(crate) trajectories_with_skipped_checks: u64,
}

impl Tally {
    pub(crate) fn add_node(&mut self, node: &NodeRecord) {
        self.turns = self.turns.saturating_add(node.turns.len() as u64);
    }

    pub(crate) fn add_trajectory(&mut self, t: &TrajectoryRecord) {
        self.total.add(t.status);
        let skipped = t.checks_with(CriterionStatus::Skipped) as u64;
        // An invalid trajectory's checks were left out on purpose: it says nothing of the
        // agent (as the console counts them).
        if skipped > 0 && t.status != TrajectoryStatus::Invalid {
            self.checks_skipped = self.checks_skipped.saturating_add(skipped);
            self.trajectories_with_skipped_checks += 1;
        }
        self.recorded
            .update([&t.suite, &t.scenario, &t.agent], |counts| {
                counts.add(t.status)
            });
    }

    /// Adds the counts recorded since the last call to the ordered maps the report reads.
    pub(crate) fn settle(&mut self) {
        let rows = self.recorded.drain_sorted();
        let mut scenarios: Vec<((Name, Name), Counts)> = Vec::new();
        for ((suite, scenario, agent), counts) in &rows {
            add_to(&mut self.by_suite, suite, counts);
            add_to(&mut self.by_agent, agent, counts);
            match scenarios.last_mut() {
                Some((key, sum)) if key.0 == *suite && key.1 == *scenario => sum.merge(counts),
                _ => scenarios.push(((suite.clone(), scenario.clone()), *counts)),
            }
        }
        extend(&mut self.by_scenario, scenarios);
        extend(&mut self.by_scenario_agent, rows);
    }
}

fn add_to(map: &mut BTreeMap<Name, Counts>, name: &Name, counts: &Counts) {
    match map.get_mut(&**name) {
        Some(sum) => sum.merge(counts),
        None => {
            map.insert(Name::clone(name), *counts);
        }
    }
}

/// Adds `rows`, in order and each key once, to `map`: built from them at once when it is
/// empty (a tree filled in order, with no search down it for each row).
fn extend<K: Ord>(map: &mut BTreeMap<K, Counts>, rows: Vec<(K, Counts)>) {
    if map.is_empty() {
        *map = rows.into_iter().collect();
        return;
    }
    for (key, counts) in rows {
        map.entry(key).or_default().merge(&counts);
    }
}

/// Order in the HTML report: what needs attention first.
pub(crate) fn status_rank(status: TrajectoryStatus) -> u8 {
    match status {
        TrajectoryStatus::Error => 0,
        TrajectoryStatus::Failed => 1,
        TrajectoryStatus::Invalid => 2,
        TrajectoryStatus::Skipped => 3,
        TrajectoryStatus::Passed => 4,
    }
}

/// Picks, in journal order, the trajectories whose transcripts the HTML shows.
pub(crate) struct Selection {
    failing: Vec<TrajectoryRecord>,
    passing: Vec<TrajectoryRecord>,
    max_failing: usize,
    max_passing: usize,
    max_passing_per_trajectory: usize,
    /// Passed transcripts kept per trajectory and agent (suite, scenario, trajectory and
    /// agent, joined by NUL): bounded by the suites, not by repetitions.
    passing_per_trajectory: HashMap<String, usize>,
    omitted_failing: u64,
    omitted_passing: u64,
    /// Trajectories offered so far: the journal's trajectory entries, counted in order.
    offered: u64,
    /// How many of the journal's trajectory entries it takes to reach the last one kept.
    through: u64,
}

/// The rendered trajectories, failures first, and what was left out.
pub(crate) struct Rendered {
    pub(crate) trajectories: Vec<TrajectoryRecord>,
    pub(crate) omitted_failing: u64,
    pub(crate) omitted_passing: u64,
    /// Every rendered trajectory is among the journal's first `through` trajectory
    /// entries: the transcripts' nodes come before that entry, and a reader of the journal
    /// that has found them all can stop there.
    pub(crate) through: u64,
}

impl Selection {
    pub(crate) fn new(options: &ReportOptions) -> Self {
        Selection {
            failing: Vec::new(),
            passing: Vec::new(),
            max_failing: options.max_failing_transcripts,
            max_passing: options.max_passing_transcripts,
            max_passing_per_trajectory: options.max_passing_transcripts_per_trajectory,
            passing_per_trajectory: HashMap::new(),
            omitted_failing: 0,
            omitted_passing: 0,
            offered: 0,
            through: 0,
        }
    }

    pub(crate) fn offer(&mut self, trajectory: &TrajectoryRecord) {
        self.offered = self.offered.saturating_add(1);
        if trajectory.status == TrajectoryStatus::Passed && self.passing.len() < self.max_passing {
            let key = [
                trajectory.suite.as_str(),
                &trajectory.scenario,
                &trajectory.trajectory,
                &trajectory.agent,
            ]
            .join("\0");
            let kept = self.passing_per_trajectory.entry(key).or_default();
            if *kept >= self.max_passing_per_trajectory {
                self.omitted_passing = self.omitted_passing.saturating_add(1);
                return;
            }
            *kept += 1;
        }
        let (kept, max, omitted) = if trajectory.status == TrajectoryStatus::Passed {
            (
                &mut self.passing,
                self.max_passing,
                &mut self.omitted_passing,
            )
        } else {
            (
                &mut self.failing,
                self.max_failing,
                &mut self.omitted_failing,
            )
        };
        if kept.len() < max {
            kept.push(trajectory.clone());
            self.through = self.offered;
            return;
        }
        *omitted = omitted.saturating_add(1);
        // A full page of skipped trajectories must not hide a failure that comes later:
        // a failed or errored one takes the place of the last skipped one.
        if trajectory.status != TrajectoryStatus::Skipped
            && let Some(skipped) = kept
                .iter()
                .rposition(|t| t.status == TrajectoryStatus::Skipped)
        {
            kept.remove(skipped);
            kept.push(trajectory.clone());
            self.through = self.offered;
        }
    }

    pub(crate) fn into_ordered(self) -> Rendered {
        let mut trajectories = self.failing;
        // Stable: journal order within one status.
        trajectories.sort_by_key(|t| status_rank(t.status));
        trajectories.extend(self.passing);
        Rendered {
            trajectories,
            omitted_failing: self.omitted_failing,
            omitted_passing: self.omitted_passing,
            through: self.through,
        }
    }
}

#[cfg(test)]
mod selection_tests {
    use trellis_records::{TrajectoryRecord, TrajectoryStatus};

    use super::Selection;
    use crate::ReportOptions;

    fn record(status: TrajectoryStatus, name: &str) -> TrajectoryRecord {
        TrajectoryRecord {
            suite: "s".into(),
            scenario: "c".into(),
            trajectory: name.into(),
            agent: "a".into(),
            protocol: "connexity".into(),
            repetition: 0,
            nodes: vec![],
            status,
            turns: 0,
            duration_ms: 0.0,
            fault: None,
            skip_reason: None,
            criteria: vec![],
            tags: vec![],
            agent_branches: Vec::new(),
            awaiting_human: None,
            sandbox_state: None,
            captures: Default::default(),
            llm: None,
            attack: None,
        }
    }

    #[test]
    fn failures_displace_skipped_trajectories_when_the_page_is_full() {
        let options = ReportOptions {
            max_failing_transcripts: 2,
            ..ReportOptions::default()
        };
        let mut selection = Selection::new(&options);
        selection.offer(&record(TrajectoryStatus::Skipped, "s1"));
        selection.offer(&record(TrajectoryStatus::Skipped, "s2"));
        selection.offer(&record(TrajectoryStatus::Failed, "f1"));
        selection.offer(&record(TrajectoryStatus::Skipped, "s3"));
        let rendered = selection.into_ordered();
        let names: Vec<&str> = rendered
            .trajectories
            .iter()
            .map(|t| t.trajectory.as_str())
            .collect();
        assert_eq!(names, ["f1", "s1"]);
        assert_eq!(rendered.omitted_failing, 2);
    }

    #[test]
    fn a_much_repeated_trajectory_leaves_room_for_the_passes_after_it() {
        let options = ReportOptions {
            max_passing_transcripts: 4,
            max_passing_transcripts_per_trajectory: 2,
            ..ReportOptions::default()
        };
        let mut selection = Selection::new(&options);
        for repetition in 0..5 {
            let mut passed = record(TrajectoryStatus::Passed, "repeated");
            passed.repetition = repetition;
            selection.offer(&passed);
        }
        let mut other_agent = record(TrajectoryStatus::Passed, "repeated");
        other_agent.agent = "b".into();
        selection.offer(&other_agent);
        selection.offer(&record(TrajectoryStatus::Passed, "later"));
        selection.offer(&record(TrajectoryStatus::Passed, "last"));
        // Failures are not capped per trajectory.
        for _ in 0..3 {
            selection.offer(&record(TrajectoryStatus::Failed, "repeated"));
        }
        let rendered = selection.into_ordered();
        let kept: Vec<(&str, &str, u32)> = rendered
            .trajectories
            .iter()
            .map(|t| (t.trajectory.as_str(), t.agent.as_str(), t.repetition))
            .collect();
        assert_eq!(
            kept,
            [
                ("repeated", "a", 0),
                ("repeated", "a", 0),
                ("repeated", "a", 0),
                ("repeated", "a", 0),
                ("repeated", "a", 1),
                ("repeated", "b", 0),
                ("later", "a", 0),
            ]
        );
        // Three repetitions over the per-trajectory cap, and `last` over the page's.
        assert_eq!(rendered.omitted_passing, 4);
        assert_eq!(rendered.omitted_failing, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settled, the maps the report reads hold each (suite, scenario, agent)'s own counts,
    /// even for names that would join alike with a separator, and a second settle adds to
    /// them.
    #[test]
    fn settled_maps_count_each_names_own_trajectories() {
        let mut tally = Tally::default();
        let record = |suite: &str, scenario: &str, agent: &str, status: TrajectoryStatus| {
            serde_json::from_value::<TrajectoryRecord>(serde_json::json!({
                "suite": suite, "scenario": scenario, "trajectory": "main", "agent": agent,
                "protocol": "connexity", "repetition": 0, "nodes": ["start"],
                "status": status.as_str(), "turns": 1, "duration_ms": 1.0, "criteria": [],
                "tags": [],
            }))
            .unwrap()
        };
        for (suite, scenario, agent, status) in [
            ("s", "a\0b", "x", TrajectoryStatus::Passed),
            ("s", "a", "\0bx", TrajectoryStatus::Failed),
            ("sa", "", "bx", TrajectoryStatus::Passed),
            ("s", "a\0b", "x", TrajectoryStatus::Error),
            ("s", "é", "", TrajectoryStatus::Skipped),
        ] {
            tally.add_trajectory(&record(suite, scenario, agent, status));
        }
        tally.settle();
        let key = |a: &str, b: &str, c: &str| (Name::from(a), Name::from(b), Name::from(c));
        assert_eq!(tally.by_scenario_agent.len(), 4);
        let both = tally.by_scenario_agent[&key("s", "a\0b", "x")];
        assert_eq!((both.passed, both.errors, both.total()), (1, 1, 2));
        assert_eq!(tally.by_scenario_agent[&key("s", "a", "\0bx")].failed, 1);
        assert_eq!(tally.by_scenario_agent[&key("sa", "", "bx")].passed, 1);
        assert_eq!(tally.by_scenario_agent[&key("s", "é", "")].skipped, 1);
        assert_eq!(tally.by_suite["s"].total(), 4);
        assert_eq!(tally.by_suite["sa"].total(), 1);
        assert_eq!(tally.by_agent["x"].total(), 2);
        assert_eq!(
            tally.by_scenario[&(Name::from("s"), Name::from("a\0b"))].total(),
            2
        );
        assert_eq!(tally.by_scenario.len(), 4);
        assert_eq!(tally.total.total(), 5);
        // Settling again adds what came since to what is there.
        tally.add_trajectory(&record("s", "a\0b", "x", TrajectoryStatus::Passed));
        tally.settle();
        assert_eq!(tally.by_scenario_agent[&key("s", "a\0b", "x")].passed, 2);
        assert_eq!(tally.by_suite["s"].total(), 5);
    }
}
