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
//! noise) is clamped at 0 and named in `clamped`.
//!
//! Each estimate gets a 95% interval from a two-stage bootstrap ([`BOOTSTRAP`]): each
//! condition's groups are resampled with replacement, then each drawn group's outcomes,
//! and the estimates are computed again, [`RESAMPLES`] times, with a fixed seed so the same
//! samples always give the same interval; the interval is the resamples' 2.5th and 97.5th
//! percentiles. Resampling the outcomes too keeps a scenario of one trajectory from getting
//! an interval of zero width. See docs/simulator.md for the limits.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ReportError;
use crate::stats::{CONFIDENCE, Interval};

/// The file in a run directory.
pub const VARIANCE_FILE: &str = "variance.json";

/// Where a stopped `trellis variance` writes its partial result when the run already holds a
/// complete one in [`VARIANCE_FILE`], which it keeps.
pub const PARTIAL_VARIANCE_FILE: &str = "variance.partial.json";
pub const VARIANCE_SCHEMA_VERSION: u32 = 1;

/// Resamples of the bootstrap behind every interval.
pub const RESAMPLES: u32 = 2000;
/// The bootstrap's seed: fixed, so an interval is a function of the samples alone.
pub const SEED: u64 = 0x7472_656c_6c69_7321;
/// How the intervals are made, as `variance.json` says it.
pub const BOOTSTRAP: &str =
    "two-stage bootstrap (groups, then outcomes within each group), percentile";

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
    /// How the estimates' intervals were made. Absent from files written before intervals
    /// existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intervals: Option<IntervalMethod>,
    /// What the figures do not say, as the console warned it: a condition whose outcomes
    /// were errors (a judge failing every call reads as perfectly stable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `variance.json`'s `intervals`: the method behind every `judge_interval`,
/// `agent_interval` and `user_interval`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IntervalMethod {
    pub method: String,
    pub confidence: f64,
    pub resamples: u32,
    pub seed: u64,
}

impl Default for IntervalMethod {
    fn default() -> Self {
        Self {
            method: BOOTSTRAP.to_owned(),
            confidence: CONFIDENCE,
            resamples: RESAMPLES,
            seed: SEED,
        }
    }
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
    /// The estimates' intervals (see [`IntervalMethod`]); null when the estimate is, or
    /// (judge) when it is 0 by construction is `[0, 0]`.
    #[serde(default)]
    pub judge_interval: Option<Interval>,
    #[serde(default)]
    pub agent_interval: Option<Interval>,
    #[serde(default)]
    pub user_interval: Option<Interval>,
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
    /// Judge-condition outcomes that were errors (a judge that failed or gave no usable
    /// answer), among `judge`'s, where they count as not passing.
    pub judge_errors: u64,
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

/// The three sources' estimates from the three conditions' variances, and the sources
/// whose difference was clamped at 0.
struct Estimates {
    judge: Option<f64>,
    agent: Option<f64>,
    user: Option<f64>,
    clamped: Vec<String>,
}

fn estimates(
    judge: Option<f64>,
    agent: Option<f64>,
    free: Option<f64>,
    simulated: bool,
    judged: bool,
) -> Estimates {
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
    let judge_v = if judged { judge } else { Some(0.0) };
    let agent_v = difference("agent", agent, judge_v);
    let user_v = if simulated {
        difference("user", free, agent)
    } else {
        None
    };
    Estimates {
        judge: judge_v,
        agent: agent_v,
        user: user_v,
        clamped,
    }
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
    let Estimates {
        judge: judge_v,
        agent: agent_v,
        user: user_v,
        clamped,
    } = estimates(
        judge_condition.variance,
        agent_condition.variance,
        free_condition.variance,
        simulated,
        judged,
    );
    let [judge_interval, agent_interval, user_interval] =
        bootstrap(judge, agent, free, simulated, judged);
    let mut shares = BTreeMap::new();
    let parts: Vec<(&str, f64)> = [("judge", judge_v), ("agent", agent_v), ("user", user_v)]
        .into_iter()
        .filter_map(|(n, v)| v.map(|v| (n, v)))
        .collect();
    let sum: f64 = parts.iter().map(|(_, v)| v).sum();
    // A source is named only when every estimate that applies is known: a partial result
    // (a condition stopped before it measured anything) has no "largest" and no "none".
    let unknown = judge_v.is_none() || agent_v.is_none() || (simulated && user_v.is_none());
    let source = if parts.is_empty() || unknown {
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
        // An estimate without a value has no interval either.
        judge_interval: judge_interval.filter(|_| judge_v.is_some()),
        agent_interval: agent_interval.filter(|_| agent_v.is_some()),
        user_interval: user_interval.filter(|_| user_v.is_some()),
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

/// Outcome counts of a condition's measured groups: (passed, outcomes) per group.
fn tallies(groups: &[Vec<bool>]) -> Vec<(u32, u32)> {
    groups
        .iter()
        .filter(|g| g.len() >= 2)
        .map(|g| (g.iter().filter(|&&p| p).count() as u32, g.len() as u32))
        .collect()
}

/// One bootstrap draw of a condition's variance: its groups drawn with replacement, then
/// each drawn group's outcomes drawn with replacement from it (a binomial draw of its pass
/// rate). `None` without a measured group.
fn resampled(groups: &[(u32, u32)], rng: &mut fastrand::Rng) -> Option<f64> {
    if groups.is_empty() {
        return None;
    }
    let mut sum = 0.0;
    for _ in 0..groups.len() {
        let (passed, n) = groups[rng.usize(..groups.len())];
        let passed = (0..n).filter(|_| rng.u32(..n) < passed).count() as f64;
        let n = f64::from(n);
        sum += passed * (n - passed) / (n * (n - 1.0));
    }
    Some(sum / groups.len() as f64)
}

/// The judge, agent and user estimates' intervals ([`BOOTSTRAP`]); each `None` when no
/// resample gave the estimate a value.
fn bootstrap(
    judge: &[Vec<bool>],
    agent: &[Vec<bool>],
    free: &[Vec<bool>],
    simulated: bool,
    judged: bool,
) -> [Option<Interval>; 3] {
    let (judge, agent, free) = (tallies(judge), tallies(agent), tallies(free));
    // One generator per decomposition, seeded alike: a scenario's interval does not depend
    // on which scenarios came before it.
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut draws: [Vec<f64>; 3] = Default::default();
    for _ in 0..RESAMPLES {
        let e = estimates(
            resampled(&judge, &mut rng),
            resampled(&agent, &mut rng),
            resampled(&free, &mut rng),
            simulated,
            judged,
        );
        for (i, v) in [e.judge, e.agent, e.user].into_iter().enumerate() {
            if let Some(v) = v {
                draws[i].push(v);
            }
        }
    }
    draws.map(|mut d| percentile_interval(&mut d))
}

/// The central [`CONFIDENCE`] interval of `draws` (percentiles, nearest rank).
fn percentile_interval(draws: &mut [f64]) -> Option<Interval> {
    if draws.is_empty() {
        return None;
    }
    draws.sort_unstable_by(f64::total_cmp);
    let tail = (1.0 - CONFIDENCE) / 2.0;
    let at = |q: f64| {
        let i = ((q * draws.len() as f64).ceil() as usize).clamp(1, draws.len()) - 1;
        draws[i]
    };
    Some(Interval {
        low: at(tail),
        high: at(1.0 - tail),
    })
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
    fn intervals_are_reproducible_and_hold_the_estimate() {
        let mut samples = Samples::default();
        samples.judge.insert(key("main", 0), vec![true; 5]);
        for (t, outcomes) in [
            ("a", vec![true, false, true, false, true]),
            ("b", vec![true, true, false, true, false]),
        ] {
            samples.agent.insert(key(t, 0), outcomes.clone());
            samples.free.insert(key(t, 0), outcomes);
        }
        samples.judged.insert(("s".into(), "sc".into(), "a".into()));
        let (_, first) = decompose(&samples);
        let (_, again) = decompose(&samples);
        assert_eq!(first.agent_interval, again.agent_interval);
        let agent = first.agent.unwrap();
        let i = first.agent_interval.unwrap();
        // 3 of 5 is the largest variance 5 outcomes can show: the estimate is the top.
        assert!(
            i.low <= agent && agent <= i.high + 1e-9 && i.low < i.high,
            "{i:?} {agent}"
        );
        // A judge that never varied: every resample says 0.
        assert_eq!(
            first.judge_interval.map(|i| (i.low, i.high)),
            Some((0.0, 0.0))
        );
        // No simulated turns: no user estimate, no interval.
        assert_eq!(first.user_interval, None);
    }

    #[test]
    fn a_partial_result_names_no_source() {
        let mut samples = Samples::default();
        samples.judge.insert(key("main", 0), vec![true; 4]);
        samples.judged.insert(("s".into(), "sc".into(), "a".into()));
        let (_, overall) = decompose(&samples);
        assert_eq!(overall.judge, Some(0.0));
        assert_eq!(overall.agent, None);
        assert_eq!(
            overall.source, None,
            "not `none`: the agent was not measured"
        );
    }

    #[test]
    fn one_group_still_gets_a_real_interval() {
        let mut samples = Samples::default();
        samples
            .agent
            .insert(key("main", 0), vec![true, false, true, false, true, false]);
        let (_, overall) = decompose(&samples);
        let i = overall.agent_interval.unwrap();
        assert!(i.low < i.high, "{i:?}");
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
