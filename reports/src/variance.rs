//! `variance.json` (`trellis variance`): how much of each scenario's outcome variance comes
//! from the agent, the simulated user and the judge, with the counts behind every figure.
//!
//! The outcome is a trajectory's pass indicator (passed 1; failed or error 0; invalid and
//! skipped trajectories say nothing about the agent and are left out). Three conditions
//! each hold some sources fixed and are measured as the mean, over groups that should
//! agree if the free sources were silent, of the groups' sample variance (n − 1):
//!
//! - **judge**: the recorded transcripts judged again *k* times (a group: one recorded
//!   trajectory's judgments) — only the judge varies;
//! - **agent**: the recorded simulated users replayed to the agent *k* times (a group: one
//!   trajectory's repetitions) — the agent and the judge vary;
//! - **free**: everything run again *k* times — agent, user and judge vary.
//!
//! Treating the sources as independent and their effects as additive, judge ≈ v(judge),
//! agent ≈ v(agent) − v(judge), user ≈ v(free) − v(agent); a negative difference (sampling
//! noise) is clamped at 0 and named in `clamped`. See docs/simulator.md for the limits.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ReportError;

/// The file in a run directory.
pub const VARIANCE_FILE: &str = "variance.json";
pub const VARIANCE_SCHEMA_VERSION: u32 = 1;

/// A group of outcomes that differ only by the sources a condition lets vary: suite,
/// scenario, agent, trajectory and (judge condition) the recorded repetition.
pub type GroupKey = (String, String, String, String, u32);

/// What `trellis variance` found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VarianceReport {
    pub schema_version: u32,
    /// The run whose variance this is.
    pub run_id: String,
    /// Repetitions of the agent and free conditions.
    pub repeats: u32,
    /// Judgments of each recorded transcript.
    pub judge_repeats: u32,
    /// Every planned condition ran to its end.
    pub complete: bool,
    /// Why not (a signal, an LLM budget), when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The run directories of the agent and free conditions (relative to this run's).
    pub runs: BTreeMap<String, String>,
    /// Per suite, scenario and agent.
    pub scenarios: Vec<ScenarioVariance>,
    /// All groups of every scenario pooled.
    pub overall: Decomposition,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScenarioVariance {
    pub suite: String,
    pub scenario: String,
    pub agent: String,
    pub decomposition: Decomposition,
}

/// The three measured conditions and the sources estimated from them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Decomposition {
    /// The recorded trajectories had simulated user turns (else nothing is attributed to
    /// the user: `user` is null).
    pub simulated: bool,
    /// The recorded trajectories had LLM-judged checks (else the judge cannot vary).
    pub judged: bool,
    pub judge_condition: Condition,
    pub agent_condition: Condition,
    pub free_condition: Condition,
    /// Estimated variance of the pass indicator due to each source; null when it cannot be
    /// estimated (a condition without a group of two outcomes, or no simulated turns for
    /// `user`).
    pub judge: Option<f64>,
    pub agent: Option<f64>,
    pub user: Option<f64>,
    /// The free condition's variance: all sources together.
    pub total: Option<f64>,
    /// Each source's part of the sum of the estimates (0–1), when that sum is positive.
    pub shares: BTreeMap<String, f64>,
    /// The source with the largest estimate, `none` when every estimate is 0.
    pub source: Option<String>,
    /// Sources whose difference came out negative and was set to 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamped: Vec<String>,
}

/// One condition's measurement.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Condition {
    /// Mean of the groups' sample variances; null without a group of two outcomes.
    pub variance: Option<f64>,
    /// Groups with at least two outcomes (those measured).
    pub groups: u64,
    /// Outcomes in those groups, and how many of them passed.
    pub outcomes: u64,
    pub passed: u64,
}

/// The outcomes of the three conditions, by group.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    pub judge: BTreeMap<GroupKey, Vec<bool>>,
    pub agent: BTreeMap<GroupKey, Vec<bool>>,
    pub free: BTreeMap<GroupKey, Vec<bool>>,
    /// (suite, scenario, agent) whose recorded trajectories had simulated turns.
    pub simulated: BTreeSet<(String, String, String)>,
    /// (suite, scenario, agent) whose recorded trajectories had LLM-judged checks.
    pub judged: BTreeSet<(String, String, String)>,
}

impl Samples {
    /// Every (suite, scenario, agent) with an outcome in any condition, in order.
    fn scenarios(&self) -> BTreeSet<(String, String, String)> {
        self.judge
            .keys()
            .chain(self.agent.keys())
            .chain(self.free.keys())
            .map(|(s, sc, a, _, _)| (s.clone(), sc.clone(), a.clone()))
            .collect()
    }
}

/// Per scenario and overall.
pub fn decompose(samples: &Samples) -> (Vec<ScenarioVariance>, Decomposition) {
    let scenarios = samples
        .scenarios()
        .into_iter()
        .map(|key| {
            let of = |(s, sc, a, _, _): &&GroupKey| (s, sc, a) == (&key.0, &key.1, &key.2);
            let pick = |m: &BTreeMap<GroupKey, Vec<bool>>| -> Vec<Vec<bool>> {
                m.iter()
                    .filter(|(k, _)| of(k))
                    .map(|(_, v)| v.clone())
                    .collect()
            };
            let decomposition = decomposition(
                &pick(&samples.judge),
                &pick(&samples.agent),
                &pick(&samples.free),
                samples.simulated.contains(&key),
                samples.judged.contains(&key),
            );
            ScenarioVariance {
                suite: key.0,
                scenario: key.1,
                agent: key.2,
                decomposition,
            }
        })
        .collect();
    let all = |m: &BTreeMap<GroupKey, Vec<bool>>| m.values().cloned().collect::<Vec<_>>();
    let overall = decomposition(
        &all(&samples.judge),
        &all(&samples.agent),
        &all(&samples.free),
        !samples.simulated.is_empty(),
        !samples.judged.is_empty(),
    );
    (scenarios, overall)
}

fn decomposition(
    judge: &[Vec<bool>],
    agent: &[Vec<bool>],
    free: &[Vec<bool>],
    simulated: bool,
    judged: bool,
) -> Decomposition {
    let judge_condition = condition(judge);
    let agent_condition = condition(agent);
    let free_condition = condition(free);
    let mut clamped = Vec::new();
    let mut difference = |name: &str, a: Option<f64>, b: Option<f64>| {
        let (a, b) = (a?, b?);
        let d = a - b;
        // Differences within rounding of 0 are 0, not a clamp worth saying.
        if d < -1e-12 {
            clamped.push(name.to_owned());
        }
        Some(d.max(0.0))
    };
    // Without a judged check the judge cannot move an outcome: its part is 0 by
    // construction, whether or not its condition was measured.
    let judge_v = if judged {
        judge_condition.variance
    } else {
        Some(0.0)
    };
    let agent_v = difference("agent", agent_condition.variance, judge_v);
    let user_v = if simulated {
        difference("user", free_condition.variance, agent_condition.variance)
    } else {
        None
    };
    let mut shares = BTreeMap::new();
    let parts: Vec<(&str, f64)> = [("judge", judge_v), ("agent", agent_v), ("user", user_v)]
        .into_iter()
        .filter_map(|(n, v)| v.map(|v| (n, v)))
        .collect();
    let sum: f64 = parts.iter().map(|(_, v)| v).sum();
    let source = if parts.is_empty() {
        None
    } else if sum <= 1e-12 {
        Some("none".to_owned())
    } else {
        for (name, v) in &parts {
            shares.insert((*name).to_owned(), v / sum);
        }
        parts
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(n, _)| (*n).to_owned())
    };
    Decomposition {
        simulated,
        judged,
        judge_condition,
        agent_condition,
        free_condition,
        judge: judge_v,
        agent: agent_v,
        user: user_v,
        total: free_condition_variance(free),
        shares,
        source,
        clamped,
    }
}

fn free_condition_variance(free: &[Vec<bool>]) -> Option<f64> {
    condition(free).variance
}

/// The mean of the groups' sample variances, over the groups of two outcomes or more.
fn condition(groups: &[Vec<bool>]) -> Condition {
    let mut out = Condition::default();
    let mut sum = 0.0;
    for group in groups.iter().filter(|g| g.len() >= 2) {
        let n = group.len() as f64;
        let passed = group.iter().filter(|&&p| p).count() as f64;
        let mean = passed / n;
        // Sample variance of 0/1 values: n·p·(1−p)/(n−1).
        sum += n * mean * (1.0 - mean) / (n - 1.0);
        out.groups += 1;
        out.outcomes += group.len() as u64;
        out.passed += passed as u64;
    }
    if out.groups > 0 {
        out.variance = Some(sum / out.groups as f64);
    }
    out
}

/// Reads `variance.json` from a run directory; `None` when there is none.
pub fn read(run_dir: &Path) -> Result<Option<VarianceReport>, ReportError> {
    let path = run_dir.join(VARIANCE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ReportError::Json {
                path: path.clone(),
                source: e,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReportError::io("read", &path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(t: &str, rep: u32) -> GroupKey {
        ("s".into(), "sc".into(), "a".into(), t.into(), rep)
    }

    #[test]
    fn an_agent_that_varies_is_the_source() {
        let mut samples = Samples::default();
        samples.judge.insert(key("main", 0), vec![true; 4]);
        samples
            .agent
            .insert(key("main", 0), vec![true, false, true, false]);
        samples
            .free
            .insert(key("main", 0), vec![true, false, false, true]);
        samples
            .simulated
            .insert(("s".into(), "sc".into(), "a".into()));
        samples.judged.insert(("s".into(), "sc".into(), "a".into()));
        let (rows, overall) = decompose(&samples);
        assert_eq!(rows.len(), 1);
        assert_eq!(overall.source.as_deref(), Some("agent"));
        assert_eq!(overall.judge, Some(0.0));
        assert_eq!(overall.user, Some(0.0));
        assert!((overall.agent.unwrap_or_default() - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn without_simulated_turns_nothing_goes_to_the_user() {
        let mut samples = Samples::default();
        samples.agent.insert(key("main", 0), vec![true, true]);
        samples.free.insert(key("main", 0), vec![true, false]);
        let (_, overall) = decompose(&samples);
        assert_eq!(overall.user, None);
        assert_eq!(overall.judge, Some(0.0));
    }
}

#[cfg(test)]
mod round_trip {
    #[test]
    fn a_written_report_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut samples = super::Samples::default();
        samples.agent.insert(
            ("s".into(), "sc".into(), "a".into(), "main".into(), 0),
            vec![true, false],
        );
        let (scenarios, overall) = super::decompose(&samples);
        let report = super::VarianceReport {
            scenarios,
            overall,
            ..Default::default()
        };
        crate::write_json(&dir.path().join(super::VARIANCE_FILE), &report).unwrap();
        let back = super::read(dir.path()).unwrap().unwrap();
        assert_eq!(back.scenarios.len(), 1);
    }
}
