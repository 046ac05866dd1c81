//! Two runs compared: what changed per run metric, scenario, branch and criterion, and
//! whether any change is a regression past the thresholds.
//!
//! A pass-rate drop counts when it exceeds its threshold and, when either side has more
//! than one sample (repetitions, or many trajectories at run level), when a one-sided
//! Fisher exact test finds it unlikely to be noise (p ≤ `alpha`). With one sample on each
//! side there is nothing to test: a pass that became a failure is a regression. Latency
//! counts when the mean turn latency grows by more than its percentage and by more than
//! `latency_noise_ms`, the median turn grows by as much, *and* a one-sided Mann–Whitney U
//! test on the two runs' per-turn latencies finds the head run's turns slower (p <
//! `alpha`): one slow turn moves the mean of an unchanged agent (an identical run then
//! "regressed"), never the ranks of all its turns. Runs whose per-turn latencies cannot be
//! read, or too few turns for the test ever to reach `alpha`, are judged on the thresholds
//! (and the earlier runs' spread below) alone. A machine that is busier during one run slows every turn of it, which the rank
//! test cannot tell from a slower agent; so when at least [`SPREAD_RUNS`] earlier whole runs
//! of the same suites are known ([`TurnLatencies::earlier_means`]), a latency regression
//! also needs the head run's mean to exceed the slowest of them by `latency_noise_ms`:
//! slower than the runs have been, not just slower than the base. When either run has more
//! than one agent, each agent's turns are judged alone by the same rule (a run's median is
//! mostly its busiest agent's), and every latency verdict says why ([`MetricChange::why`]).
//! So is each scenario's, against the rest of its run ([`judge_scenario_latency`]).
//! The mean judge
//! score counts when it drops by more than its points, unless either run's
//! `calibration.json` marks a judge below the agreement floor (`trellis calibrate`): then
//! the score is shown with verdict `ungated` and does not fail the comparison, unless
//! [`Thresholds::gate_untrusted_judges`] says to gate anyway. [`Comparison`] is plain data,
//! for the console, `--json` and the HTML compare page; `docs/results.md` documents it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use statrs::stats_tests::mannwhitneyu::{MannWhitneyUMethod, mannwhitneyu};
use statrs::stats_tests::{Alternative, fishers_exact};

use crate::calibration::UntrustedJudge;
use crate::stats::{RunStats, StatusCounts, natural_cmp};

/// When a change is a regression. Defaults are Connexity's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    /// Largest pass-rate drop tolerated, in percentage points (default 0).
    pub max_pass_rate_drop: f64,
    /// Largest mean judge score drop tolerated, in points of 0–100 (default 5).
    pub max_score_drop: f64,
    /// Largest mean latency increase tolerated, in percent (default 20).
    pub max_latency_increase_pct: f64,
    /// Latency increases smaller than this many milliseconds never count (default 25: 50
    /// back-to-back runs of the example suites against the in-process builtin agents, on a
    /// 2-core machine with other work, moved the mean and the median of identical runs by up
    /// to 15 ms; a real agent's turns take hundreds of milliseconds).
    pub latency_noise_ms: f64,
    /// Significance level of the test on pass rates with repeats (default 0.05); 1 makes
    /// every drop past the threshold count.
    pub alpha: f64,
    /// Gate on the mean judge score even when a run's calibration marks a judge below the
    /// agreement floor (default false: such a score is shown, not gated).
    #[serde(default)]
    pub gate_untrusted_judges: bool,
    /// Fail on a scenario, branch or check the base run checked that the head run no longer
    /// has (taken out of the suites, made `draft`, its text edited), and on a scenario or
    /// branch checked in fewer repetitions (a lower `repeat`) (default false: `removed` is
    /// shown, and counted in a note).
    #[serde(default)]
    pub gate_removed: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            max_pass_rate_drop: 0.0,
            max_score_drop: 5.0,
            max_latency_increase_pct: 20.0,
            latency_noise_ms: 25.0,
            alpha: 0.05,
            gate_untrusted_judges: false,
            gate_removed: false,
        }
    }
}

/// What a change amounts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Worse past the threshold (and significant, where tested): fails the comparison.
    Regressed,
    /// Worse past the threshold, but the test says it may be noise (pass rates: p > alpha;
    /// latency: p ≥ alpha).
    Noise,
    Unchanged,
    Improved,
    /// Only in the head run.
    Added,
    /// Only in the base run.
    Removed,
    /// Nothing to compare (no sample ran on one side, or the metric is not measured).
    NotComparable,
    /// Shown, never a regression: the latency percentiles and tokens (only the mean
    /// latency is gated), the mean judge score of a run whose calibration marks a judge
    /// below the agreement floor, and a `fidelity` check's pass rate (it rates the simulated
    /// user).
    Ungated,
    /// Ran in the base run, skipped in the head run (such as a scenario whose `needs`
    /// failed): a regression of the scenario; its branches and checks say so too.
    NotRun,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Regressed => "regressed",
            Verdict::Noise => "noise",
            Verdict::Unchanged => "unchanged",
            Verdict::Improved => "improved",
            Verdict::Added => "added",
            Verdict::Removed => "removed",
            Verdict::NotComparable => "not comparable",
            Verdict::Ungated => "not gated",
            Verdict::NotRun => "not run",
        }
    }
}

/// Successes out of samples on one side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub passed: u64,
    pub samples: u64,
}

impl Tally {
    pub fn rate(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.passed as f64 / self.samples as f64)
    }
}

/// A pass rate in both runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateChange {
    pub base: Option<Tally>,
    pub head: Option<Tally>,
    /// Head minus base, in percentage points.
    pub delta_points: Option<f64>,
    /// One-sided Fisher exact test, when either side has more than one sample.
    pub p_value: Option<f64>,
    pub verdict: Verdict,
}

/// A run-level metric in both runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricChange {
    /// `pass_rate`, `latency_mean_ms`, `latency_p50_ms`, `latency_p95_ms`, `mean_score`,
    /// `total_tokens`.
    pub metric: String,
    /// The agent whose turns it measures (`latency_mean_ms` of each agent, when the runs
    /// have more than one); `None` for the whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub base: Option<f64>,
    pub head: Option<f64>,
    pub delta: Option<f64>,
    /// The threshold that applies, in the metric's terms; `None` for metrics shown only.
    pub threshold: Option<f64>,
    pub p_value: Option<f64>,
    pub verdict: Verdict,
    /// What decided the verdict where the figures alone do not say: for the mean latency,
    /// the change of the mean and the median turn, the rank test, and which part of the rule
    /// did not hold when it is `noise`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioChange {
    pub suite: String,
    pub scenario: String,
    pub agent: String,
    /// Repetitions of the whole scenario that passed (every branch passed).
    pub rate: RateChange,
    pub base_latency_mean_ms: Option<f64>,
    pub head_latency_mean_ms: Option<f64>,
    /// The verdict on its mean turn latency, when both runs' turns of it are known
    /// ([`judge_scenario_latency`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyJudgement>,
    /// Why the head run skipped it, when the verdict is `not_run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_run: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BranchChange {
    pub suite: String,
    pub scenario: String,
    pub trajectory: String,
    pub agent: String,
    pub rate: RateChange,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CriterionChange {
    pub suite: String,
    pub scenario: String,
    pub trajectory: String,
    pub agent: String,
    pub turn_index: Option<u32>,
    pub criterion: String,
    pub rate: RateChange,
    /// Why it failed in the head run, when it did.
    pub head_failure: Option<String>,
}

/// Which run a side of the comparison is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRef {
    pub run_id: String,
    pub name: Option<String>,
    pub dir: String,
    pub started_at: String,
    pub finished: bool,
    /// It reached its end having been stopped before its work was done (a signal, a
    /// budget), or recorded fewer trajectories than it planned: `finished` and still short
    /// of its plan.
    #[serde(default)]
    pub stopped: bool,
}

/// Everything that changed between two runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub base: RunRef,
    pub head: RunRef,
    pub thresholds: Thresholds,
    pub metrics: Vec<MetricChange>,
    pub scenarios: Vec<ScenarioChange>,
    pub branches: Vec<BranchChange>,
    pub criteria: Vec<CriterionChange>,
    /// One sentence per regression, in the order above.
    pub regressions: Vec<String>,
    /// Some change regressed: `trellis compare` exits 1.
    pub regressed: bool,
    /// Judges either run's `calibration.json` marks below the agreement floor.
    #[serde(default)]
    pub untrusted_judges: Vec<UntrustedJudge>,
    /// Why the mean judge score does not gate, when it does not because of them.
    #[serde(default)]
    pub score_gate_refused: Option<String>,
    /// The runs decided their trajectories by different rules (one with `--strict`, one
    /// without), said so that a pass-rate change is not read as the agent's alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_differ: Option<String>,
    /// How many scenarios, branches and checks the base run checked that the head run does
    /// not have, or checks in fewer repetitions, when they do not fail the comparison
    /// (without [`Thresholds::gate_removed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_out: Option<String>,
}

/// Every agent turn's latency (ms) in each run (`history::turn_latencies`): what the
/// latency test ranks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnLatencies {
    pub base: Vec<f64>,
    pub head: Vec<f64>,
    /// The mean turn latency of earlier whole runs of the same suites (the base among
    /// them), the most recent [`SPREAD_WINDOW`] at most: how much identical runs vary here.
    pub earlier_means: Vec<f64>,
    /// The runs those means are of, in the same order, when known (`trellis runs`' names
    /// for them): the one that sets the spread is named.
    pub earlier_runs: Vec<String>,
    /// The same of each agent both runs have, when either run has more than one (their
    /// own `agents` empty). A run's mean and median are mostly its busiest agent's: one
    /// agent ten times slower that answers a minority of the turns moved the median by a
    /// few milliseconds and passed the run's gate.
    pub agents: BTreeMap<String, TurnLatencies>,
    /// The same of each scenario both runs have, by (suite, scenario id, agent) (their own
    /// `agents`, `scenarios` and `earlier_means` empty): one scenario three times slower
    /// among many moves neither the run's median nor its agent's.
    pub scenarios: BTreeMap<(String, String, String), TurnLatencies>,
}

/// Earlier runs of the same suites needed before their spread is taken as the noise.
pub const SPREAD_RUNS: usize = 3;

/// Earlier runs whose spread is looked at, most recent first.
pub const SPREAD_WINDOW: usize = 20;

/// Why a run's results do not cover its plan, when they do not, as a predicate of "the head
/// run": it never reached its end (killed), or was stopped before its work was done (a
/// signal or a budget; said by the run itself, since an agent that forks makes a stopped
/// run's count exceed its plan), or recorded fewer trajectories than it planned. Such a
/// head run fails the comparison, and the scenarios it did not reach are `not run`, not
/// `removed`: a gate must not pass on what was never checked.
pub fn incomplete(run: &RunStats) -> Option<String> {
    let a = &run.aggregates;
    if !a.finished {
        Some(format!(
            "never reached its end ({} of {} planned trajectories recorded; `trellis run \
             --resume` finishes it)",
            a.counts.trajectories, a.planned
        ))
    } else if a.counts.trajectories < a.planned {
        Some(format!(
            "was stopped after {} of {} planned trajectories",
            a.counts.trajectories, a.planned
        ))
    } else if a.interrupted {
        Some(format!(
            "was stopped before its work was done ({} trajectories recorded, {} planned, \
             some cut short; `trellis run --resume` finishes it)",
            a.counts.trajectories, a.planned
        ))
    } else {
        None
    }
}

/// Why a run can hold nothing to account, when it cannot: it recorded no trajectory, or
/// brought none to a verdict because they ended in an error (an agent that was down, say):
/// none passed or failed. A comparison in which either run checked nothing fails: a head
/// run that checked nothing certifies nothing, whatever its pass rate's test says of a
/// small sample, and a base run that checked nothing holds the head to nothing (`trellis
/// runs pin` refuses such a run for the same reason, crate::history). So does one whose
/// trajectories are all `invalid` (a simulated user that broke character: the agent was not
/// checked), and one whose trajectories were all skipped (a suite without checks, or with
/// checks that could not run): its latencies alone say nothing of whether the agent works,
/// and a comparison of two such runs passed every time.
pub fn checked_nothing(run: &RunStats) -> Option<String> {
    let c = &run.aggregates.counts;
    if c.passed + c.failed > 0 {
        return None;
    }
    match (c.trajectories, c.errors, c.invalid) {
        (0, ..) => Some("checked nothing: it recorded no trajectory".to_owned()),
        (n, 0, 0) => Some(format!(
            "checked nothing: all {n} of its trajectories were skipped, their checks not run \
             (scenarios without checks, or checks that could not run)"
        )),
        (n, e, 0) if e == n => Some(format!(
            "checked nothing: all {n} of its trajectories ended in an error (an agent down, or \
             the checks' judge or cache failing?)"
        )),
        (n, 0, i) if i == n => Some(format!(
            "checked nothing: all {n} of its trajectories are invalid (the simulated user \
             broke character, so nothing of the agent was checked)"
        )),
        (n, e, i) => Some(format!(
            "checked nothing: none of its {n} trajectories passed or failed ({e} ended in an \
             error, {i} invalid, the rest skipped)"
        )),
    }
}

/// Names compared field by field in [`natural_cmp`]'s order.
fn natural_order<const N: usize>(a: [&str; N], b: [&str; N]) -> std::cmp::Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| natural_cmp(x, y))
        .find(|o| o.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

/// The one regression line for what a stopped base never reached and fails in the head
/// (`failing`, named `one`/`many`), if any.
fn unreached_and_failing(failing: &[String], one: &str, many: &str) -> Option<String> {
    let first = failing.first()?;
    let (what, fail) = match failing.len() {
        1 => (format!("1 {one}"), "fails"),
        n => (format!("{n} {many}"), "fail"),
    };
    Some(format!(
        "{what} that the base run never reached (it stopped before its end) {fail} in the head \
         run (the first: {first}): compared with nothing"
    ))
}

/// Compares `head` against `base`; `latencies`, when both runs' are known, tests a latency
/// increase (see the module documentation).
pub fn compare(
    base: &RunStats,
    base_ref: RunRef,
    head: &RunStats,
    head_ref: RunRef,
    thresholds: Thresholds,
    untrusted_judges: Vec<UntrustedJudge>,
    latencies: Option<&TurnLatencies>,
) -> Comparison {
    let mut regressions = Vec::new();
    let score_gate_refused = (!untrusted_judges.is_empty() && !thresholds.gate_untrusted_judges)
        .then(|| {
            let judges: Vec<String> = untrusted_judges
                .iter()
                .map(|u| format!("`{}` in run {}", u.judge, u.run_id))
                .collect();
            format!(
                "the mean judge score does not gate: calibration marks {} below the agreement \
                 floor (--gate-untrusted-judges gates anyway)",
                judges.join(", ")
            )
        });
    let metrics = run_metrics(
        base,
        head,
        &thresholds,
        score_gate_refused.is_some(),
        latencies,
    );
    for m in &metrics {
        if m.verdict == Verdict::Regressed {
            let whose = match &m.agent {
                Some(agent) => format!("agent {agent}"),
                None => "run".to_owned(),
            };
            let why = m
                .why
                .as_ref()
                .map(|w| format!(" ({w})"))
                .unwrap_or_default();
            regressions.push(format!(
                "{whose} {}: {} → {}{why}",
                m.metric,
                show(m.base),
                show(m.head)
            ));
        }
    }

    let head_incomplete = incomplete(head).map(|why| format!("the head run {why}"));
    if let Some(why) = &head_incomplete {
        regressions.push(why.clone());
    }
    if let Some(why) = checked_nothing(head) {
        regressions.push(format!("the head run {why}"));
    }
    // A base that did not cover its plan holds the head run to part of it: what it never
    // reached is `added` in the head and gated only as new (`trellis runs pin` refuses such
    // a run for the same reason).
    if let Some(why) = incomplete(base) {
        regressions.push(format!(
            "the base run {why}: it holds the head run to only part of its plan; finish it, \
             or compare with a run that covered its plan"
        ));
    }
    if let Some(why) = checked_nothing(base) {
        regressions.push(format!(
            "the base run {why}: it holds the head run to nothing; compare with a run that \
             checked something"
        ));
    }
    let scenario_latency = ScenarioLatencyRule::new(base, head, latencies, thresholds);
    let mut scenarios: Vec<ScenarioChange> = pair(
        base.scenarios
            .iter()
            .map(|s| ((s.suite.clone(), s.scenario.clone(), s.agent.clone()), s)),
        head.scenarios
            .iter()
            .map(|s| ((s.suite.clone(), s.scenario.clone(), s.agent.clone()), s)),
    )
    .into_iter()
    .map(|((suite, scenario, agent), (b, h))| {
        let mut rate = judge_rate(
            b.map(|s| tally(s.repeats.passed, s.repeats.samples)),
            h.map(|s| tally(s.repeats.passed, s.repeats.samples)),
            &thresholds,
        );
        // Checked in the base, in the head but with nothing checked (skipped, or every
        // trajectory invalid): lost, not "not comparable".
        let not_run = match (b, h) {
            (Some(b), Some(h)) if b.repeats.samples > 0 && h.repeats.samples == 0 => {
                rate.verdict = Verdict::NotRun;
                Some(unchecked_reason(h, head_incomplete.as_deref()))
            }
            // Missing from a head run that did not cover its plan: it may still be in the
            // suites, and it was not run, so it cannot count as removed.
            (Some(b), h) if b.repeats.samples > 0 && h.is_none_or(|h| h.repeats.samples == 0) => {
                if head_incomplete.is_some() {
                    rate.verdict = Verdict::NotRun;
                }
                head_incomplete.clone()
            }
            _ => None,
        };
        ScenarioChange {
            rate,
            base_latency_mean_ms: b.and_then(|s| s.latency.mean_ms),
            head_latency_mean_ms: h.and_then(|s| s.latency.mean_ms),
            latency: scenario_latency.judge(&suite, &scenario, &agent),
            not_run,
            suite: String::from(&*suite),
            scenario: String::from(&*scenario),
            agent: String::from(&*agent),
        }
    })
    .collect();
    // As the run's own tables order them: a matrix's `add[a=2]` before `add[a=10]`.
    scenarios.sort_by(|a, b| {
        natural_order(
            [&a.suite, &a.scenario, &a.agent],
            [&b.suite, &b.scenario, &b.agent],
        )
    });
    // Runs of unrelated suites share nothing to compare: every base scenario "removed",
    // every head one "added", and the gate passed having compared nothing. (A head run of
    // the same suites that selected only new scenarios, or whose agent was renamed, shares
    // its suites: its new scenarios are gated as new ones.)
    let base_suites: std::collections::BTreeSet<&str> =
        base.scenarios.iter().map(|s| &*s.suite).collect();
    if !base_suites.is_empty()
        && !head.scenarios.is_empty()
        && !head
            .scenarios
            .iter()
            .any(|s| base_suites.contains(&*s.suite))
    {
        regressions.push(
            "the runs share no suite: nothing of the base run was compared (a suite's name is \
             its file's: runs of other suites, or of a renamed file)"
                .to_owned(),
        );
    }
    // The scenarios the head run skipped: their branches and checks were not run either,
    // not removed from the suite.
    let not_run: std::collections::BTreeSet<(&str, &str, &str)> = scenarios
        .iter()
        .filter(|s| s.rate.verdict == Verdict::NotRun)
        .map(|s| (s.suite.as_str(), s.scenario.as_str(), s.agent.as_str()))
        .collect();
    let skipped_in_head = |suite: &str, scenario: &str, agent: &str, rate: &mut RateChange| {
        if not_run.contains(&(suite, scenario, agent))
            && matches!(rate.verdict, Verdict::Removed | Verdict::NotComparable)
        {
            rate.verdict = Verdict::NotRun;
        }
    };
    // A failure the base run did not have fails the build, as any other: a scenario new in
    // the head run (or renamed) that does not pass is one.
    let added: std::collections::BTreeSet<(&str, &str, &str)> = scenarios
        .iter()
        .filter(|s| s.rate.verdict == Verdict::Added)
        .map(|s| (s.suite.as_str(), s.scenario.as_str(), s.agent.as_str()))
        .collect();
    // The head run's own, for what its regression lines say of how it ended.
    let head_scenarios: std::collections::HashMap<
        (&str, &str, &str),
        &crate::stats::ScenarioStats,
    > = head
        .scenarios
        .iter()
        .map(|s| ((&*s.suite, &*s.scenario, &*s.agent), s))
        .collect();
    let head_branches: std::collections::HashMap<
        (&str, &str, &str, &str),
        &crate::stats::BranchStats,
    > = head
        .branches
        .iter()
        .map(|b| ((&*b.suite, &*b.scenario, &*b.trajectory, &*b.agent), b))
        .collect();
    // Behind a base that stopped before its end, what it never reached reads as new: one
    // line says so, instead of one per scenario (thousands for a dataset) that each read
    // as a scenario added to the suites.
    let base_stopped = incomplete(base).is_some();
    let mut unreached_failing: Vec<String> = Vec::new();
    for s in &scenarios {
        if let (Verdict::Added, Some(h)) = (s.rate.verdict, s.rate.head)
            && h.passed < h.samples
        {
            if base_stopped {
                unreached_failing.push(format!("{}/{} [{}]", s.suite, s.scenario, s.agent));
            } else {
                regressions.push(format!(
                    "scenario {}/{} [{}]: new in the head run, and failing: {}/{} passed",
                    s.suite, s.scenario, s.agent, h.passed, h.samples
                ));
            }
        }
        if let Some(why) = &s.not_run {
            regressions.push(format!(
                "scenario {}/{} [{}]: not run ({why})",
                s.suite, s.scenario, s.agent
            ));
        }
        if let Some(latency) = s
            .latency
            .as_ref()
            .filter(|l| l.verdict == Verdict::Regressed)
        {
            regressions.push(format!(
                "scenario {}/{} [{}] latency_mean_ms: {} → {}{}",
                s.suite,
                s.scenario,
                s.agent,
                show(s.base_latency_mean_ms),
                show(s.head_latency_mean_ms),
                latency
                    .why
                    .as_ref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            ));
        }
        if s.rate.verdict == Verdict::Regressed {
            let head_scenario =
                head_scenarios.get(&(s.suite.as_str(), s.scenario.as_str(), s.agent.as_str()));
            // An error's fault is the news (`invalid_json: …`): the counts alone say only
            // that something went wrong.
            let fault = head_scenario
                .and_then(|h| h.first_fault.as_deref())
                .map(|f| format!("; the first fault: {}", clipped(f, 160)))
                .unwrap_or_default();
            regressions.push(format!(
                "scenario {}/{} [{}]: {}{}{fault}",
                s.suite,
                s.scenario,
                s.agent,
                describe(&s.rate),
                head_scenario
                    .map(|h| in_the_head(&h.counts))
                    .unwrap_or_default()
            ));
        }
    }
    regressions.extend(unreached_and_failing(
        &unreached_failing,
        "scenario",
        "scenarios",
    ));

    let mut branches: Vec<BranchChange> = pair(
        base.branches.iter().map(|b| {
            (
                (
                    b.suite.clone(),
                    b.scenario.clone(),
                    b.trajectory.clone(),
                    b.agent.clone(),
                ),
                b,
            )
        }),
        head.branches.iter().map(|b| {
            (
                (
                    b.suite.clone(),
                    b.scenario.clone(),
                    b.trajectory.clone(),
                    b.agent.clone(),
                ),
                b,
            )
        }),
    )
    .into_iter()
    .map(|((suite, scenario, trajectory, agent), (b, h))| {
        let mut rate = judge_rate(
            b.map(|b| tally(b.repeats.passed, b.repeats.samples)),
            h.map(|b| tally(b.repeats.passed, b.repeats.samples)),
            &thresholds,
        );
        skipped_in_head(&suite, &scenario, &agent, &mut rate);
        unchecked_in_head(&mut rate);
        not_reached_by_a_stopped_head(&mut rate, head_incomplete.is_some());
        BranchChange {
            rate,
            suite: String::from(&*suite),
            scenario: String::from(&*scenario),
            trajectory: String::from(&*trajectory),
            agent: String::from(&*agent),
        }
    })
    .collect();
    branches.sort_by(|a, b| {
        natural_order(
            [&a.suite, &a.scenario, &a.trajectory, &a.agent],
            [&b.suite, &b.scenario, &b.trajectory, &b.agent],
        )
    });
    let mut unreached_failing_branches: Vec<String> = Vec::new();
    for b in &branches {
        // A branch the base run did not check (new in a scenario both ran, or skipped in the
        // base) that fails now. Names the agent or an attack chose (`NAME~…`) differ from
        // run to run: their failures are the scenario's and its checks'.
        let unchecked_before = matches!(b.rate.verdict, Verdict::Added | Verdict::NotComparable)
            && b.rate.base.is_none_or(|t| t.samples == 0);
        if unchecked_before
            && !b.trajectory.contains('~')
            && !added.contains(&(b.suite.as_str(), b.scenario.as_str(), b.agent.as_str()))
            && let Some(h) = b.rate.head
            && h.passed < h.samples
        {
            if base_stopped && b.rate.base.is_none() {
                unreached_failing_branches.push(format!(
                    "{}/{} {} [{}]",
                    b.suite, b.scenario, b.trajectory, b.agent
                ));
            } else {
                regressions.push(format!(
                    "branch {}/{} {} [{}]: not checked in the base run, and failing: {}/{} \
                     passed",
                    b.suite, b.scenario, b.trajectory, b.agent, h.passed, h.samples
                ));
            }
        }
        if b.rate.verdict == Verdict::NotRun
            && !not_run.contains(&(b.suite.as_str(), b.scenario.as_str(), b.agent.as_str()))
        {
            regressions.push(format!(
                "branch {}/{} {} [{}]: not run (checked in {} of the base run's repetitions, \
                 in none of the head run's)",
                b.suite,
                b.scenario,
                b.trajectory,
                b.agent,
                b.rate.base.map_or(0, |t| t.samples)
            ));
        }
        if b.rate.verdict == Verdict::Regressed {
            let head_counts = head_branches
                .get(&(
                    b.suite.as_str(),
                    b.scenario.as_str(),
                    b.trajectory.as_str(),
                    b.agent.as_str(),
                ))
                .map(|h| {
                    let mut counts = StatusCounts::default();
                    for &(first, last, status) in &h.outcome_runs {
                        for _ in first..=last {
                            counts.add(status);
                        }
                    }
                    counts
                });
            regressions.push(format!(
                "branch {}/{} {} [{}]: {}{}",
                b.suite,
                b.scenario,
                b.trajectory,
                b.agent,
                describe(&b.rate),
                head_counts.as_ref().map(in_the_head).unwrap_or_default()
            ));
        }
    }
    regressions.extend(unreached_and_failing(
        &unreached_failing_branches,
        "branch",
        "branches",
    ));

    let mut criteria: Vec<CriterionChange> = unreached_on_their_turns(pair(
        base.criteria.iter().map(|c| (criterion_key(c), c)),
        head.criteria.iter().map(|c| (criterion_key(c), c)),
    ))
    .into_iter()
    .map(
        |((suite, scenario, trajectory, agent, turn_index, criterion), (b, h))| CriterionChange {
            rate: {
                let mut rate = judge_rate(
                    b.map(|c| tally(c.passed, c.ran())),
                    h.map(|c| tally(c.passed, c.ran())),
                    &thresholds,
                );
                skipped_in_head(&suite, &scenario, &agent, &mut rate);
                not_reached_by_a_stopped_head(&mut rate, head_incomplete.is_some());
                // A fidelity check rates the simulated user, not the agent: one its judge
                // could not answer says nothing of the agent (docs/simulator.md).
                let of_the_agent = h.is_none_or(|c| c.kind != trellis_records::FIDELITY_KIND);
                if of_the_agent {
                    unchecked_in_head(&mut rate);
                } else if matches!(rate.verdict, Verdict::Regressed | Verdict::Noise) {
                    // Nor does it regress when the simulated user broke character more
                    // often: those trajectories are invalid, left out of every rate. Worse
                    // by a little is shown the same way: `noise` is a gate's word.
                    rate.verdict = Verdict::Ungated;
                }
                rate
            },
            head_failure: h.and_then(|c| c.first_failure.clone()),
            suite: String::from(&*suite),
            scenario: String::from(&*scenario),
            trajectory: String::from(&*trajectory),
            agent: String::from(&*agent),
            turn_index,
            criterion: String::from(&*criterion),
        },
    )
    .collect();
    criteria.sort_by(|a, b| {
        natural_order(
            [&a.suite, &a.scenario, &a.trajectory, &a.agent],
            [&b.suite, &b.scenario, &b.trajectory, &b.agent],
        )
        .then_with(|| a.turn_index.cmp(&b.turn_index))
        .then_with(|| natural_cmp(&a.criterion, &b.criterion))
    });
    // A branch that regressed or was not run says so for its checks (a fault in the head run
    // leaves the checks after it unreached).
    let branches_reported: std::collections::BTreeSet<(&str, &str, &str, &str)> = branches
        .iter()
        .filter(|b| matches!(b.rate.verdict, Verdict::NotRun | Verdict::Regressed))
        .map(|b| {
            (
                b.suite.as_str(),
                b.scenario.as_str(),
                b.trajectory.as_str(),
                b.agent.as_str(),
            )
        })
        .collect();
    for c in &criteria {
        let at = || {
            c.turn_index
                .map(|i| format!(" (turn {i})"))
                .unwrap_or_default()
        };
        if c.rate.verdict == Verdict::NotRun
            && !branches_reported.contains(&(
                c.suite.as_str(),
                c.scenario.as_str(),
                c.trajectory.as_str(),
                c.agent.as_str(),
            ))
            && !not_run.contains(&(c.suite.as_str(), c.scenario.as_str(), c.agent.as_str()))
        {
            regressions.push(format!(
                "check {}/{} {} [{}]{} `{}`: not checked in the head run (checked in {} of \
                 the base run's trajectories)",
                c.suite,
                c.scenario,
                c.trajectory,
                c.agent,
                at(),
                c.criterion,
                c.rate.base.map_or(0, |t| t.samples)
            ));
        }
        if c.rate.verdict == Verdict::Regressed {
            // Why it failed, so that a line reads as the agent's failure or the judge's.
            let why = c
                .head_failure
                .as_deref()
                .map(|f| format!(": {}", clipped(f, 160)))
                .unwrap_or_default();
            regressions.push(format!(
                "check {}/{} {} [{}]{} `{}`: {}{why}",
                c.suite,
                c.scenario,
                c.trajectory,
                c.agent,
                at(),
                c.criterion,
                describe(&c.rate)
            ));
        }
    }

    let (mut fewer, removed, removed_kinds) = taken_out(&scenarios, &branches, &criteria);
    // A stopped head run checked fewer repetitions because it was stopped, which fails the
    // comparison already: they are not repetitions taken out of the suite.
    if head_incomplete.is_some() {
        fewer.clear();
    }
    if thresholds.gate_removed {
        regressions.extend(fewer.iter().chain(&removed).cloned());
    }
    let taken_out = (!thresholds.gate_removed && fewer.len() + removed.len() > 0).then(|| {
        let mut parts = Vec::new();
        if !removed.is_empty() {
            let kinds: Vec<String> = [
                ("scenario", "scenarios"),
                ("branch", "branches"),
                ("check", "checks"),
            ]
            .iter()
            .zip(removed_kinds)
            .filter(|(_, n)| *n > 0)
            .map(|((one, many), n)| format!("{n} {}", if n == 1 { one } else { many }))
            .collect();
            let kinds = match kinds.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            // Named, the first few: where only this sentence is shown (an annotation, a
            // JUnit case's output), "2 scenarios" alone sent the reader to look for them.
            const NAMED: usize = 3;
            let named: Vec<&str> = removed
                .iter()
                .take(NAMED)
                .map(|r| r.split(": checked").next().unwrap_or(r))
                .collect();
            let more = match removed.len().saturating_sub(NAMED) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            parts.push(format!(
                "{kinds} that the base run checked {} not in the head run (verdict `removed`: {}{more})",
                if removed.len() == 1 { "is" } else { "are" },
                named.join(", ")
            ));
        }
        if !fewer.is_empty() {
            parts.push(format!(
                "{} checked in fewer repetitions",
                if fewer.len() == 1 {
                    "1 scenario or branch is".to_owned()
                } else {
                    format!("{} scenarios or branches are", fewer.len())
                }
            ));
        }
        format!(
            "{}: they do not fail the comparison unless --gate-removed is given",
            parts.join(", and ")
        )
    });
    let strictness = |strict: bool| {
        if strict {
            "with --strict"
        } else {
            "without --strict"
        }
    };
    let rules_differ = (base.strict != head.strict).then(|| {
        format!(
            "the base run was made {} and the head run {}: a check that did not run fails its \
             trajectory only in the run made with it, so their pass rates differ by rule as well \
             as by result",
            strictness(base.strict),
            strictness(head.strict)
        )
    });
    Comparison {
        taken_out,
        rules_differ,
        base: base_ref,
        head: head_ref,
        thresholds,
        metrics,
        regressed: !regressions.is_empty(),
        scenarios,
        branches,
        criteria,
        regressions,
        untrusted_judges,
        score_gate_refused,
    }
}

/// What the head run no longer checks that the base run did, one sentence each: scenarios
/// and branches checked in fewer repetitions, then scenarios, branches and checks removed.
/// A branch or check of a removed scenario is the scenario's line; a check of a removed
/// branch the branch's.
fn taken_out(
    scenarios: &[ScenarioChange],
    branches: &[BranchChange],
    criteria: &[CriterionChange],
) -> (Vec<String>, Vec<String>, [usize; 3]) {
    let was_checked = |rate: &RateChange| rate.base.is_some_and(|t| t.samples > 0);
    let fewer_line = |what: String, rate: &RateChange| match (rate.base, rate.head) {
        (Some(b), Some(h)) if h.samples > 0 && h.samples < b.samples => Some(format!(
            "{what}: checked in {} repetitions in the base run, {} in the head run",
            b.samples, h.samples
        )),
        _ => None,
    };
    let mut fewer = Vec::new();
    let mut removed = Vec::new();
    // How many of `removed` are scenarios, branches and checks.
    let mut kinds = [0; 3];
    let removed_scenarios: std::collections::BTreeSet<(&str, &str, &str)> = scenarios
        .iter()
        .filter(|s| s.rate.verdict == Verdict::Removed)
        .map(|s| (s.suite.as_str(), s.scenario.as_str(), s.agent.as_str()))
        .collect();
    for s in scenarios {
        let what = format!("scenario {}/{} [{}]", s.suite, s.scenario, s.agent);
        if s.rate.verdict == Verdict::Removed && was_checked(&s.rate) {
            kinds[0] += 1;
            removed.push(format!(
                "{what}: checked in the base run, not in the head run"
            ));
        } else if let Some(line) = fewer_line(what, &s.rate) {
            fewer.push(line);
        }
    }
    let mut removed_branches = std::collections::BTreeSet::new();
    for b in branches {
        let scenario = (b.suite.as_str(), b.scenario.as_str(), b.agent.as_str());
        // Names an agent or an attack chose (`NAME~…`) differ from run to run.
        if removed_scenarios.contains(&scenario) || b.trajectory.contains('~') {
            continue;
        }
        let what = format!(
            "branch {}/{} {} [{}]",
            b.suite, b.scenario, b.trajectory, b.agent
        );
        if b.rate.verdict == Verdict::Removed && was_checked(&b.rate) {
            removed_branches.insert((scenario, b.trajectory.as_str()));
            kinds[1] += 1;
            removed.push(format!(
                "{what}: checked in the base run, not in the head run"
            ));
        } else if let Some(line) = fewer_line(what, &b.rate) {
            fewer.push(line);
        }
    }
    for c in criteria {
        let scenario = (c.suite.as_str(), c.scenario.as_str(), c.agent.as_str());
        if c.rate.verdict != Verdict::Removed
            || !was_checked(&c.rate)
            || c.trajectory.contains('~')
            || removed_scenarios.contains(&scenario)
            || removed_branches.contains(&(scenario, c.trajectory.as_str()))
        {
            continue;
        }
        let at = c
            .turn_index
            .map(|i| format!(" (turn {i})"))
            .unwrap_or_default();
        kinds[2] += 1;
        removed.push(format!(
            "check {}/{} {} [{}]{at} `{}`: checked in the base run, not in the head run (taken \
             out, or its text edited)",
            c.suite, c.scenario, c.trajectory, c.agent, c.criterion
        ));
    }
    (fewer, removed, kinds)
}

/// Why a scenario the head run has checked nothing of, in the head run's words.
/// A scenario the head run recorded a node of but no trajectory was cut short by the run's
/// end (`head_incomplete`, said as such), not skipped.
fn unchecked_reason(h: &crate::stats::ScenarioStats, head_incomplete: Option<&str>) -> String {
    if let Some(why) = &h.skip_reason {
        why.clone()
    } else if h.counts.invalid > 0 {
        format!(
            "{} of its trajectories invalid: the simulated user broke character, so the agent \
             was not checked",
            h.counts.invalid
        )
    } else if let Some(why) = head_incomplete {
        why.to_owned()
    } else {
        "skipped".to_owned()
    }
}

/// A branch or check the base run checked and a head run that stopped before its end
/// (`head_stopped`) does not have was not reached, not removed from the suites.
fn not_reached_by_a_stopped_head(rate: &mut RateChange, head_stopped: bool) {
    if head_stopped
        && rate.head.is_none()
        && rate.base.is_some_and(|t| t.samples > 0)
        && rate.verdict == Verdict::Removed
    {
        rate.verdict = Verdict::NotRun;
    }
}

/// A branch or check that the base run checked and the head run has but checked none of
/// (skipped: a judge with no provider, a trajectory whose user broke character) is not run:
/// a gate must not pass on what it no longer checks. One missing from the head run is
/// `removed` (the suite no longer has it), as before.
fn unchecked_in_head(rate: &mut RateChange) {
    if rate.verdict == Verdict::NotComparable
        && rate.base.is_some_and(|t| t.samples > 0)
        && rate.head.is_some_and(|t| t.samples == 0)
    {
        rate.verdict = Verdict::NotRun;
    }
}

type CriterionKey = (
    Arc<str>,
    Arc<str>,
    Arc<str>,
    Arc<str>,
    Option<u32>,
    Arc<str>,
);

fn criterion_key(c: &crate::stats::CriterionStats) -> CriterionKey {
    (
        c.suite.clone(),
        c.scenario.clone(),
        c.trajectory.clone(),
        c.agent.clone(),
        c.turn_index,
        c.criterion.clone(),
    )
}

/// A check a trajectory never reached (a fault stopped it first) behind a step whose number
/// of turns only its run knows (`simulate`) is recorded without a turn: one that the other
/// run checked on its turns is that same check, not one
/// "removed" beside another "added". Each such turnless entry that never ran is given as the
/// other side of the same check's entries on turns (same branch, agent and text) that only
/// the other run has, and is then not listed on its own.
fn unreached_on_their_turns(
    mut entries: Vec<(CriterionKey, Sides<'_, crate::stats::CriterionStats>)>,
) -> Vec<(CriterionKey, Sides<'_, crate::stats::CriterionStats>)> {
    let same_check = |a: &CriterionKey, b: &CriterionKey| {
        a.0 == b.0 && a.1 == b.1 && a.2 == b.2 && a.3 == b.3 && a.5 == b.5
    };
    let never_ran = |c: &crate::stats::CriterionStats| c.ran() == 0;
    let mut adopted = vec![false; entries.len()];
    for i in 0..entries.len() {
        let (key, (base, head)) = &entries[i];
        if key.4.is_some() {
            continue;
        }
        // Which side holds the turnless entry that never ran, alone.
        let (unreached, in_head) = match (base, head) {
            (None, Some(h)) if never_ran(h) => (*h, true),
            (Some(b), None) if never_ran(b) => (*b, false),
            _ => continue,
        };
        let key = key.clone();
        let mut taken = false;
        for (other_key, (b, h)) in entries.iter_mut() {
            let only_other = if in_head {
                b.is_some() && h.is_none()
            } else {
                h.is_some() && b.is_none()
            };
            if other_key.4.is_some() && only_other && same_check(other_key, &key) {
                if in_head {
                    *h = Some(unreached);
                } else {
                    *b = Some(unreached);
                }
                taken = true;
            }
        }
        adopted[i] = taken;
    }
    entries
        .into_iter()
        .zip(adopted)
        .filter_map(|(entry, adopted)| (!adopted).then_some(entry))
        .collect()
}

fn tally(passed: u64, samples: u64) -> Tally {
    Tally { passed, samples }
}

/// What the base and the head run have under one key.
type Sides<'a, V> = (Option<&'a V>, Option<&'a V>);

/// Both sides by key, in key order, keeping what only one side has.
fn pair<'a, K: Ord, V>(
    base: impl Iterator<Item = (K, &'a V)>,
    head: impl Iterator<Item = (K, &'a V)>,
) -> Vec<(K, Sides<'a, V>)>
where
    V: 'a,
{
    let mut both: BTreeMap<K, Sides<'a, V>> = BTreeMap::new();
    for (key, value) in base {
        both.entry(key).or_default().0 = Some(value);
    }
    for (key, value) in head {
        both.entry(key).or_default().1 = Some(value);
    }
    both.into_iter().collect()
}

/// The verdict on a pass rate: see the module documentation.
pub fn judge_rate(base: Option<Tally>, head: Option<Tally>, t: &Thresholds) -> RateChange {
    judge_rate_sampled(base, head, (base, head), t)
}

/// [`judge_rate`] of the rates `base` and `head`, whose chance test is taken on `samples`
/// instead: the independent samples those rates come from, when the rates count samples
/// that are not (a run's trajectories, whose branches share their prefix's turns).
fn judge_rate_sampled(
    base: Option<Tally>,
    head: Option<Tally>,
    samples: (Option<Tally>, Option<Tally>),
    t: &Thresholds,
) -> RateChange {
    let (b, h) = match (base, head) {
        (Some(b), Some(h)) => (b, h),
        (None, _) => {
            return RateChange {
                base,
                head,
                delta_points: None,
                p_value: None,
                verdict: Verdict::Added,
            };
        }
        (_, None) => {
            return RateChange {
                base,
                head,
                delta_points: None,
                p_value: None,
                verdict: Verdict::Removed,
            };
        }
    };
    let (Some(base_rate), Some(head_rate)) = (b.rate(), h.rate()) else {
        return RateChange {
            base,
            head,
            delta_points: None,
            p_value: None,
            verdict: Verdict::NotComparable,
        };
    };
    let delta = (head_rate - base_rate) * 100.0;
    let (tb, th) = (samples.0.unwrap_or(b), samples.1.unwrap_or(h));
    let repeated = tb.samples > 1 || th.samples > 1;
    let table = [
        tb.passed,
        tb.samples - tb.passed.min(tb.samples),
        th.passed,
        th.samples - th.passed.min(th.samples),
    ];
    // Odds ratio above 1 when the base passes more often: that is a drop.
    let test = |alternative| {
        repeated
            .then(|| fishers_exact(&table, alternative).ok())
            .flatten()
    };
    const EPSILON: f64 = 1e-9;
    let (verdict, p_value) = if -delta > t.max_pass_rate_drop + EPSILON {
        // p ≤ alpha, within rounding: 3/3 passes falling to 0/3 has an exact p of 1/20,
        // which the test computes as 0.04999…96 or 0.05000…01 depending on its sums; at
        // alpha 0.05 that collapse is a regression, decided by the rule and not by the last
        // bit of a float.
        let p = test(Alternative::Greater);
        // A collapse from always passing to never always regresses: it is the strongest
        // evidence the samples can give (Fisher's p is then 1/C(n+m, n), the smallest these
        // sizes allow), and when that is still above alpha (2 against 2 at 0.05: 1/6), a
        // gate that called it noise would be weaker with repetitions than with one run.
        let collapsed = b.passed >= b.samples && h.passed == 0;
        match p {
            Some(p) if collapsed => (Verdict::Regressed, Some(p)),
            Some(p) if p > t.alpha * (1.0 + EPSILON) => (Verdict::Noise, Some(p)),
            _ => (Verdict::Regressed, p),
        }
    } else if delta > EPSILON {
        // By the same rule as a drop: a rise the test cannot tell from chance (2/5 → 3/5,
        // p 0.5) is noise, not a green "improved" a reader takes for real.
        let p = test(Alternative::Less);
        let rose_fully = b.passed == 0 && h.passed >= h.samples;
        match p {
            Some(p) if !rose_fully && p > t.alpha * (1.0 + EPSILON) => (Verdict::Noise, Some(p)),
            _ => (Verdict::Improved, p),
        }
    } else {
        (Verdict::Unchanged, None)
    };
    RateChange {
        base,
        head,
        delta_points: Some(delta),
        p_value,
        verdict,
    }
}

fn run_metrics(
    base: &RunStats,
    head: &RunStats,
    t: &Thresholds,
    score_ungated: bool,
    latencies: Option<&TurnLatencies>,
) -> Vec<MetricChange> {
    let ran = |c: &StatusCounts| tally(c.passed, c.ran());
    // Tested on each scenario's repetitions, each once, as each scenario's rate is: a run's
    // trajectories are not independent samples (a fork's branches share the turns before
    // it, and one wrong answer there fails them all), and counted as such an unchanged flaky
    // agent failed the gate about twice as often as `alpha` allows.
    let repetitions = |run: &RunStats| {
        run.scenarios.iter().fold(tally(0, 0), |sum, s| {
            tally(
                sum.passed + s.repeats.passed,
                sum.samples + s.repeats.samples,
            )
        })
    };
    let rate = judge_rate_sampled(
        Some(ran(&base.aggregates.counts)),
        Some(ran(&head.aggregates.counts)),
        (Some(repetitions(base)), Some(repetitions(head))),
        t,
    );
    // A run that stopped before its end holds whichever trajectories finished first: its
    // pass rate is not the plan's (the scenarios' rows judge what both ran).
    let stopped = [("base", base), ("head", head)]
        .into_iter()
        .find(|(_, run)| incomplete(run).is_some())
        .map(|(which, _)| which);
    let mut metrics = vec![MetricChange {
        metric: "pass_rate".to_owned(),
        base: base.aggregates.pass_rate,
        head: head.aggregates.pass_rate,
        delta: rate.delta_points.map(|d| d / 100.0),
        threshold: Some(t.max_pass_rate_drop / 100.0),
        p_value: rate.p_value,
        verdict: if stopped.is_some() {
            Verdict::NotComparable
        } else {
            rate.verdict
        },
        agent: None,
        why: stopped.map(|which| {
            format!(
                "the {which} run stopped before its end: its pass rate is that of the \
                 trajectories that happened to finish, not its plan's"
            )
        }),
    }];

    let mean_latency = |agent: Option<&String>,
                        b: &crate::stats::Latency,
                        h: &crate::stats::Latency,
                        samples: Option<&TurnLatencies>| {
        let mut judged = judge_latency(b, h, samples, t);
        // An agent's row with too few turns for the rank test (its `p_value` is none): one
        // busy moment of an unchanged agent of two turns (41 → 67 ms, two identical runs of
        // the example suites) failed the gate. Beside the run's row, which judges every
        // turn, it regresses only at twice the base's, as a scenario must.
        if agent.is_some()
            && judged.verdict == Verdict::Regressed
            && judged.p_value.is_none()
            && let (Some(base_mean), Some(head_mean)) = (b.mean_ms, h.mean_ms)
            && head_mean < base_mean * SCENARIO_MIN_SLOWDOWN
        {
            judged.verdict = Verdict::Noise;
            judged.why = Some(format!(
                "{}; but {:.2}× the base's is not the {SCENARIO_MIN_SLOWDOWN}× an agent's row \
                 with too few turns to test needs (the run's row judges every turn; a higher \
                 `repeat` tests it)",
                judged.why.as_deref().unwrap_or("past the thresholds"),
                head_mean / base_mean.max(f64::MIN_POSITIVE)
            ));
        }
        MetricChange {
            agent: agent.cloned(),
            p_value: judged.p_value,
            why: judged.why,
            ..metric(
                "latency_mean_ms",
                b.mean_ms,
                h.mean_ms,
                Some(t.max_latency_increase_pct),
                judged.verdict,
            )
        }
    };
    let (b, h) = (&base.aggregates.latency, &head.aggregates.latency);
    metrics.push(mean_latency(None, b, h, latencies));
    // Each agent's turns judged alone, by the same rule, right after the run's.
    for (agent, samples) in latencies.map(|l| &l.agents).into_iter().flatten() {
        let (b, h) = (
            crate::stats::Latency::of(samples.base.clone()),
            crate::stats::Latency::of(samples.head.clone()),
        );
        metrics.push(mean_latency(Some(agent), &b, &h, Some(samples)));
    }
    for (name, b, h) in [
        ("latency_p50_ms", b.p50_ms, h.p50_ms),
        ("latency_p95_ms", b.p95_ms, h.p95_ms),
        ("latency_max_ms", b.max_ms, h.max_ms),
    ] {
        // Shown beside the gated mean; "unchanged" at +128% would read as a verdict.
        let verdict = if b.is_some() && h.is_some() {
            Verdict::Ungated
        } else {
            Verdict::NotComparable
        };
        metrics.push(metric(name, b, h, None, verdict));
    }

    let (b, h) = (base.aggregates.mean_score, head.aggregates.mean_score);
    let score_verdict = match (b, h) {
        (Some(_), Some(_)) if score_ungated => Verdict::Ungated,
        (Some(b), Some(h)) if b - h > t.max_score_drop => Verdict::Regressed,
        // As a drop: a rise within the threshold is no change worth a verdict.
        (Some(b), Some(h)) if h - b > t.max_score_drop => Verdict::Improved,
        (Some(_), Some(_)) => Verdict::Unchanged,
        _ => Verdict::NotComparable,
    };
    metrics.push(metric(
        "mean_score",
        b,
        h,
        Some(t.max_score_drop),
        score_verdict,
    ));
    let tokens = |s: &RunStats| s.aggregates.total_tokens.map(|n| n as f64);
    let (b, h) = (tokens(base), tokens(head));
    let verdict = if b.is_some() && h.is_some() {
        Verdict::Ungated
    } else {
        Verdict::NotComparable
    };
    metrics.push(metric("total_tokens", b, h, None, verdict));
    metrics
}

/// The verdict on a mean turn latency, the p-value of the rank test when it ran, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencyJudgement {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The verdict on the mean turn latency: see the module documentation.
pub fn judge_latency(
    base: &crate::stats::Latency,
    head: &crate::stats::Latency,
    latencies: Option<&TurnLatencies>,
    t: &Thresholds,
) -> LatencyJudgement {
    let judged = |verdict, p_value, why: Option<String>| LatencyJudgement {
        verdict,
        p_value,
        why,
    };
    let (Some(base_mean), Some(head_mean)) = (base.mean_ms, head.mean_ms) else {
        return judged(Verdict::NotComparable, None, None);
    };
    // How far a change must go: past the percentage of `from` and the noise floor.
    let bar = |from: f64| (from * t.max_latency_increase_pct / 100.0).max(t.latency_noise_ms);
    let past = |from: f64, change: f64| change > bar(from);
    let mean_change = head_mean - base_mean;
    let percent = |from: f64, change: f64| {
        if from.abs() > f64::EPSILON {
            format!(" ({:+.0}%)", change / from * 100.0)
        } else {
            String::new()
        }
    };
    let mean_said = format!(
        "mean {:+.0} ms{}",
        mean_change,
        percent(base_mean, mean_change)
    );
    // A rise past the percentage that the noise floor holds back: said, since the
    // percentage alone reads as a regression called `unchanged`.
    let under_floor = (mean_change > base_mean * t.max_latency_increase_pct / 100.0
        && mean_change <= t.latency_noise_ms)
        .then(|| {
            format!(
                "{mean_said}: past {}%, but not past the {:.0} ms noise floor \
                 (--latency-noise-ms)",
                t.max_latency_increase_pct, t.latency_noise_ms
            )
        });
    // Too few turns for the test ever to reach alpha (its smallest p-value is one over the
    // number of ways to rank them): the thresholds decide alone, as for one pass against
    // one failure.
    let samples = latencies.filter(|l| {
        let (n, m) = (l.base.len() as u64, l.head.len() as u64);
        n > 0 && m > 0 && 1.0 / statrs::function::factorial::binomial(n + m, n) < t.alpha
    });
    let Some(samples) = samples else {
        let untested = "too few turns to test, judged on the thresholds alone";
        // The earlier runs' spread holds as when the turns are tested: a machine busier
        // during the head run slows its one turn as it would many.
        let spread = latencies.and_then(|l| Some((l, within_spread(head_mean, l, t)?)));
        return if past(base_mean, mean_change)
            && let Some((l, (slowest, run))) = spread
        {
            let run = run.map(|r| format!(", run {r}")).unwrap_or_default();
            judged(
                Verdict::Noise,
                None,
                Some(format!(
                    "{mean_said}; too few turns to test, and no slower than the slowest of {} \
                     earlier runs ({slowest:.0} ms{run}) by more than {:.0} ms (a busier \
                     machine looks the same)",
                    l.earlier_means.len(),
                    t.latency_noise_ms
                )),
            )
        } else if past(base_mean, mean_change) {
            judged(
                Verdict::Regressed,
                None,
                Some(format!("{mean_said}; {untested}")),
            )
        } else if past(base_mean, -mean_change) {
            judged(Verdict::Improved, None, None)
        } else {
            judged(Verdict::Unchanged, None, under_floor)
        };
    };
    let median_change = match (base.p50_ms, head.p50_ms) {
        (Some(b), Some(h)) => Some((b, h - b)),
        _ => None,
    };
    if past(base_mean, mean_change) {
        let typical_slower = median_change.is_some_and(|(b, d)| past(b, d));
        // Head's turns slower than base's.
        let p = rank_test_greater(&samples.head, &samples.base);
        let spread = within_spread(head_mean, samples, t);
        // What held, then what did not: the noise verdict names the part of the rule that
        // failed ("noise" alone read as if the agent were as fast).
        let mut held = vec![mean_said];
        let mut failed = Vec::new();
        if let Some((b, d)) = median_change {
            if typical_slower {
                held.push(format!("median turn {d:+.0} ms"));
            } else {
                failed.push(format!(
                    "the median turn moved {d:+.0} ms, not past {:.0} ms (some turns slower, \
                     not the typical one)",
                    bar(b)
                ));
            }
        }
        match p {
            Some(p) if p < t.alpha => held.push(format!("rank test {}", p_said(p))),
            Some(p) => failed.push(format!(
                "the rank test cannot tell the turns apart ({}, not below {})",
                p_said(p),
                t.alpha
            )),
            None => failed.push("the rank test could not be computed".to_owned()),
        }
        if let Some((slowest, run)) = spread {
            let run = run.map(|r| format!(", run {r}")).unwrap_or_default();
            failed.push(format!(
                "no slower than the slowest of {} earlier runs ({slowest:.0} ms{run}) by more \
                 than {:.0} ms (a busier machine looks the same)",
                samples.earlier_means.len(),
                t.latency_noise_ms
            ));
        }
        let why = if failed.is_empty() {
            held.join(", ")
        } else {
            format!("{}; but {}", held.join(", "), failed.join("; "))
        };
        let verdict = if failed.is_empty() {
            Verdict::Regressed
        } else {
            Verdict::Noise
        };
        judged(verdict, p, Some(why))
    } else if past(base_mean, -mean_change) {
        let typical_faster = median_change.is_some_and(|(b, d)| past(b, -d));
        let p = rank_test_greater(&samples.base, &samples.head);
        match p {
            Some(p) if p < t.alpha && typical_faster => judged(Verdict::Improved, Some(p), None),
            _ => judged(Verdict::Unchanged, p, None),
        }
    } else {
        judged(Verdict::Unchanged, None, under_floor)
    }
}

/// What each scenario's turn latencies are judged by: the run's slowdown that every
/// scenario shares, and how many scenarios are tested.
struct ScenarioLatencyRule<'a> {
    latencies: Option<&'a TurnLatencies>,
    /// By agent: how much slower the head run's median turn of that agent is than the
    /// base's (at least 1).
    slowdown: BTreeMap<&'a str, f64>,
    /// Scenarios with turns in both runs: the tests made at once.
    tests: usize,
    thresholds: Thresholds,
}

impl<'a> ScenarioLatencyRule<'a> {
    fn new(
        base: &RunStats,
        head: &RunStats,
        latencies: Option<&'a TurnLatencies>,
        thresholds: Thresholds,
    ) -> Self {
        let ratio = |b: Option<f64>, h: Option<f64>| match (b, h) {
            (Some(b), Some(h)) if b > 0.0 && h.is_finite() => (h / b).max(1.0),
            _ => 1.0,
        };
        let run = ratio(
            base.aggregates.latency.p50_ms,
            head.aggregates.latency.p50_ms,
        );
        // Each agent's once (not per scenario: its turns are sorted to find the median).
        let mut slowdown = BTreeMap::new();
        for l in latencies.into_iter() {
            for s in l.scenarios.keys() {
                let agent = s.2.as_str();
                slowdown.entry(agent).or_insert_with(|| {
                    l.agents.get(agent).map_or(run, |a| {
                        ratio(
                            crate::stats::Latency::of(a.base.clone()).p50_ms,
                            crate::stats::Latency::of(a.head.clone()).p50_ms,
                        )
                    })
                });
            }
        }
        let tests = latencies.map_or(0, |l| {
            l.scenarios
                .values()
                .filter(|s| !s.base.is_empty() && !s.head.is_empty())
                .count()
        });
        ScenarioLatencyRule {
            latencies,
            slowdown,
            tests,
            thresholds,
        }
    }

    fn judge(&self, suite: &str, scenario: &str, agent: &str) -> Option<LatencyJudgement> {
        let key = (suite.to_owned(), scenario.to_owned(), agent.to_owned());
        let samples = self.latencies?.scenarios.get(&key)?;
        if samples.base.is_empty() || samples.head.is_empty() {
            return None;
        }
        let slowdown = self.slowdown.get(agent).copied().unwrap_or(1.0);
        Some(judge_scenario_latency(
            samples,
            slowdown,
            self.tests,
            &self.thresholds,
        ))
    }
}

/// The verdict on one scenario's mean turn latency: the run's rule ([`judge_latency`]) on
/// the scenario's turns, with two changes for judging many scenarios at once. The base's
/// turns are first scaled by `slowdown`, how much slower the head run's median turn of the
/// same agent is (a busier machine slows every scenario, which the run's own verdict
/// judges): a scenario regresses by being slower than the rest of its run became. And the
/// rank test must pass at `alpha / tests` (Bonferroni), so that a hundred unchanged
/// scenarios are not a hundred chances of a false alarm. A scenario with too few turns for
/// the test to reach that is not gated (`ungated`, saying so when its mean rose past the
/// thresholds): one slow turn of a one-turn scenario is no regression.
pub fn judge_scenario_latency(
    samples: &TurnLatencies,
    slowdown: f64,
    tests: usize,
    t: &Thresholds,
) -> LatencyJudgement {
    let scaled = TurnLatencies {
        base: samples.base.iter().map(|ms| ms * slowdown).collect(),
        head: samples.head.clone(),
        earlier_means: samples.earlier_means.clone(),
        earlier_runs: samples.earlier_runs.clone(),
        ..TurnLatencies::default()
    };
    let corrected = Thresholds {
        alpha: t.alpha / tests.max(1) as f64,
        ..*t
    };
    let (b, h) = (
        crate::stats::Latency::of(scaled.base.clone()),
        crate::stats::Latency::of(scaled.head.clone()),
    );
    let (n, m) = (scaled.base.len() as u64, scaled.head.len() as u64);
    let testable = 1.0 / statrs::function::factorial::binomial(n + m, n) < corrected.alpha;
    // The figures that follow are against the scaled base: said first, so that `+79 ms`
    // beside `61 → 180 ms` reads right.
    let against = if slowdown > 1.0 {
        format!(
            "against the base's turns taken {slowdown:.2}× as slow (as the run's median turn \
             of the agent became): "
        )
    } else {
        String::new()
    };
    if !testable {
        let rose = match (b.mean_ms, h.mean_ms) {
            (Some(b), Some(h)) => {
                let bar = (b * t.max_latency_increase_pct / 100.0).max(t.latency_noise_ms);
                (h - b > bar).then(|| format!("mean {:+.0} ms", h - b))
            }
            _ => None,
        };
        return LatencyJudgement {
            verdict: Verdict::Ungated,
            p_value: None,
            why: rose.map(|rose| {
                format!(
                    "{against}{rose}; too few turns ({n} and {m}) for the rank test to reach {} \
                     ({} over {} scenarios): a higher `repeat` gates it",
                    p_said_bare(corrected.alpha),
                    t.alpha,
                    tests.max(1)
                )
            }),
        };
    }
    let mut judged = judge_latency(&b, &h, Some(&scaled), &corrected);
    if judged.verdict == Verdict::Regressed {
        let ratio = |b: Option<f64>, h: Option<f64>| match (b, h) {
            (Some(b), Some(h)) if b > 0.0 => h / b,
            _ => f64::INFINITY,
        };
        let times = ratio(b.mean_ms, h.mean_ms).min(ratio(b.p50_ms, h.p50_ms));
        judged.why = judged.why.map(|why| {
            if times < SCENARIO_MIN_SLOWDOWN {
                format!(
                    "{why}; but its turns are {times:.2}× the base's, not {SCENARIO_MIN_SLOWDOWN}× \
                     (a scenario's turns move with the load on the agent from run to run: a \
                     smaller rise is the run's and the agent's rows to judge)"
                )
            } else if tests > 1 {
                format!(
                    "{why}, below {} ({} over {tests} scenarios tested), {times:.1}× the base's",
                    p_said_bare(corrected.alpha),
                    t.alpha
                )
            } else {
                format!("{why}, {times:.1}× the base's")
            }
        });
        if times < SCENARIO_MIN_SLOWDOWN {
            judged.verdict = Verdict::Noise;
        }
    }
    judged.why = judged.why.map(|why| format!("{against}{why}"));
    judged
}

/// How many times the base's a scenario's turns must take (its mean and its median, beyond
/// the run's own slowdown) for its latency to regress. Within one run a scenario's turns are
/// not independent samples: its repetitions run at once and share the load on the agent, so
/// a threaded agent answering in 55 ms alone and 95 ms under load moved an unchanged
/// scenario by 1.7× between runs, past every test on the turns (4 false alarms in 11
/// unchanged runs at `repeat 10`). Smaller slowdowns are the run's and each agent's to
/// judge, with the earlier runs' spread.
pub const SCENARIO_MIN_SLOWDOWN: f64 = 2.0;

/// A significance level as the p-values beside it read.
fn p_said_bare(alpha: f64) -> String {
    if alpha < 0.001 {
        format!("{alpha:.1e}")
    } else {
        format!("{alpha:.3}")
    }
}

/// `p = 0.018`, or `p < 0.001`.
pub(crate) fn p_said(p: f64) -> String {
    if p < 0.001 {
        "p < 0.001".to_owned()
    } else {
        format!("p = {p:.3}")
    }
}

/// Samples up to this product of their sizes get the exact p-value (every way of ranking
/// them, counted); larger ones, and any with ties, the normal approximation.
const EXACT_RANKINGS: usize = 2_500;

/// The one-sided Mann–Whitney U test's p-value that `x`'s values tend to be greater than
/// `y`'s: the chance of a U at least as large as the observed one when both come from one
/// distribution.
///
/// Why not statrs' exact method: statrs 0.19.1 returns the complement, `P(U < u)`, whenever
/// `x` is not the larger sample (`calc_mwu_exact_pvalue`, `k == n1`), so 4 slower turns
/// against 4 faster ones got p = 69/70 instead of 1/70 and a latency regression of a small
/// run was called noise. Its normal approximation is right and is used past
/// [`EXACT_RANKINGS`].
fn rank_test_greater(x: &[f64], y: &[f64]) -> Option<f64> {
    let (n1, n2) = (x.len(), y.len());
    let (u1, asymptotic) = mannwhitneyu(
        x,
        y,
        MannWhitneyUMethod::AsymptoticInclContinuityCorrection,
        Alternative::Greater,
    )
    .ok()?;
    let mut all: Vec<f64> = x.iter().chain(y).copied().collect();
    all.sort_by(f64::total_cmp);
    let ties = all.windows(2).any(|w| w[0] == w[1]);
    if ties || n1 * n2 > EXACT_RANKINGS {
        return Some(asymptotic);
    }
    // Without ties U is a whole number.
    let u = u1.round() as usize;
    let counts = u_counts(n1, n2);
    let total: f64 = counts.iter().sum();
    let at_least: f64 = counts.iter().skip(u).sum();
    Some(at_least / total)
}

/// How many of the rankings of `m` values among `m + n` give U = 0, 1, …, m·n (the number
/// of (x, y) pairs with x ranked above y): `c(m, n, u) = c(m − 1, n, u − n) + c(m, n − 1,
/// u)`, as floating-point counts (exact up to 2^53, which the sizes it is used for stay
/// under).
fn u_counts(m: usize, n: usize) -> Vec<f64> {
    // row[j] holds c(i, j, ·) for the current i.
    let mut row: Vec<Vec<f64>> = (0..=n).map(|_| vec![1.0]).collect();
    for i in 1..=m {
        let mut next: Vec<Vec<f64>> = Vec::with_capacity(n + 1);
        next.push(vec![1.0]);
        for j in 1..=n {
            let mut c = vec![0.0; i * j + 1];
            // The largest value is an x (every y below it): U of the rest, plus j.
            for (u, v) in row[j].iter().enumerate() {
                c[u + j] += v;
            }
            // The largest value is a y: U of the rest.
            for (u, v) in next[j - 1].iter().enumerate() {
                c[u] += v;
            }
            next.push(c);
        }
        row = next;
    }
    row.swap_remove(n)
}

/// The slowest earlier run's mean, and which run it is when known, when the head run's
/// mean is no slower than it by more than the noise floor and enough earlier runs of the
/// same suites are known to say.
fn within_spread<'a>(
    head_mean: f64,
    latencies: &'a TurnLatencies,
    t: &Thresholds,
) -> Option<(f64, Option<&'a str>)> {
    if latencies.earlier_means.len() < SPREAD_RUNS {
        return None;
    }
    let (at, slowest) = latencies.earlier_means.iter().copied().enumerate().fold(
        (0, f64::NEG_INFINITY),
        |(at, max), (i, m)| {
            if m > max { (i, m) } else { (at, max) }
        },
    );
    let run = latencies.earlier_runs.get(at).map(String::as_str);
    (head_mean <= slowest + t.latency_noise_ms).then_some((slowest, run))
}

fn metric(
    name: &'static str,
    base: Option<f64>,
    head: Option<f64>,
    threshold: Option<f64>,
    verdict: Verdict,
) -> MetricChange {
    MetricChange {
        metric: name.to_owned(),
        agent: None,
        base,
        head,
        delta: base.zip(head).map(|(b, h)| h - b),
        threshold,
        p_value: None,
        verdict,
        why: None,
    }
}

fn show(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// ` (in the head run: 2 failed, 1 error)`: how the head run's samples that did not pass
/// ended, so a regression line says whether the agent failed its checks or a turn or judge
/// failed (`error`).
fn in_the_head(c: &StatusCounts) -> String {
    let parts: Vec<String> = [
        (c.failed, "failed", "failed"),
        (c.errors, "error", "errors"),
        (c.skipped, "skipped", "skipped"),
        (c.invalid, "invalid", "invalid"),
    ]
    .into_iter()
    .filter(|(n, ..)| *n > 0)
    .map(|(n, one, many)| format!("{n} {}", if n == 1 { one } else { many }))
    .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" (in the head run: {})", parts.join(", "))
    }
}

/// `text` cut to about `max` characters, on a character boundary, with `…` when cut.
fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// `2/3 → 0/3 passed (p = 0.20)`.
pub fn describe(rate: &RateChange) -> String {
    let side = |t: Option<Tally>| {
        t.map_or_else(|| "-".to_owned(), |t| format!("{}/{}", t.passed, t.samples))
    };
    let p = rate
        .p_value
        .map(|p| format!(" (p = {p:.3})"))
        .unwrap_or_default();
    format!("{} → {} passed{p}", side(rate.base), side(rate.head))
}

fn page_tally(t: Option<Tally>) -> Option<crate::CompareTally> {
    t.map(|t| crate::CompareTally {
        passed: t.passed,
        samples: t.samples,
    })
}

fn page_rate(rate: &RateChange) -> crate::CompareRate {
    crate::CompareRate {
        base: page_tally(rate.base),
        head: page_tally(rate.head),
        delta_points: rate.delta_points,
        p_value: rate.p_value,
        verdict: rate.verdict.as_str().to_owned(),
    }
}

fn page_run(run: &RunRef) -> crate::CompareRun {
    crate::CompareRun {
        run_id: run.run_id.clone(),
        name: run.name.clone(),
        started_at: run.started_at.clone(),
        finished: run.finished,
    }
}

impl From<&Comparison> for crate::ComparePage {
    /// The compare page ([`crate::write_compare`]) of a comparison, rows in the same order.
    fn from(c: &Comparison) -> Self {
        let row = |suite: &str, scenario: &str, trajectory: &str, agent: &str| crate::CompareRow {
            suite: suite.to_owned(),
            scenario: scenario.to_owned(),
            trajectory: trajectory.to_owned(),
            agent: agent.to_owned(),
            ..crate::CompareRow::default()
        };
        crate::ComparePage {
            base: page_run(&c.base),
            head: page_run(&c.head),
            metrics: c
                .metrics
                .iter()
                .map(|m| crate::CompareMetric {
                    metric: m.metric.clone(),
                    agent: m.agent.clone(),
                    why: m.why.clone(),
                    base: m.base,
                    head: m.head,
                    delta: m.delta,
                    threshold: m.threshold,
                    p_value: m.p_value,
                    verdict: m.verdict.as_str().to_owned(),
                })
                .collect(),
            scenarios: c
                .scenarios
                .iter()
                .map(|s| crate::CompareRow {
                    rate: page_rate(&s.rate),
                    ..row(&s.suite, &s.scenario, "", &s.agent)
                })
                .collect(),
            branches: c
                .branches
                .iter()
                .map(|b| crate::CompareRow {
                    rate: page_rate(&b.rate),
                    ..row(&b.suite, &b.scenario, &b.trajectory, &b.agent)
                })
                .collect(),
            criteria: c
                .criteria
                .iter()
                .map(|k| crate::CompareRow {
                    turn_index: k.turn_index,
                    criterion: k.criterion.clone(),
                    rate: page_rate(&k.rate),
                    head_failure: k.head_failure.clone(),
                    ..row(&k.suite, &k.scenario, &k.trajectory, &k.agent)
                })
                .collect(),
            regressions: c.regressions.clone(),
            regressed: c.regressed,
            notes: c
                .rules_differ
                .iter()
                .chain(&c.score_gate_refused)
                .chain(&c.taken_out)
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_test_takes_the_tail_it_is_asked_for() {
        let fast = [10.0, 11.0, 12.0, 13.0];
        let slow = [310.0, 311.0, 312.0, 313.0];
        // Every slow turn above every fast one: 1 of the C(8, 4) = 70 rankings.
        let p = rank_test_greater(&slow, &fast).unwrap();
        assert!((p - 1.0 / 70.0).abs() < 1e-12, "{p}");
        let p = rank_test_greater(&fast, &slow).unwrap();
        assert!((p - 1.0).abs() < 1e-12, "{p}");
        // Unequal sizes, either way round.
        let p = rank_test_greater(&slow[..3], &fast).unwrap();
        assert!((p - 1.0 / 35.0).abs() < 1e-12, "{p}");
        let p = rank_test_greater(&slow, &fast[..2]).unwrap();
        assert!((p - 1.0 / 15.0).abs() < 1e-12, "{p}");
        // U = 4 of 2 × 3, as counted by hand: rankings with U ≥ 4 are 4 of 10.
        let p = rank_test_greater(&[2.0, 5.0], &[1.0, 3.0, 4.0]).unwrap();
        assert!((p - 0.4).abs() < 1e-12, "{p}");
        let p = rank_test_greater(&[1.0, 4.0, 5.0], &[2.0, 3.0]).unwrap();
        assert!((p - 0.4).abs() < 1e-12, "{p}");
        // The counts are the binomial coefficient in all.
        let counts = u_counts(8, 8);
        assert_eq!(counts.iter().sum::<f64>(), 12_870.0);
        assert_eq!(counts.len(), 65);
        // The normal approximation, past the exact sizes, takes the same tail.
        let many_fast: Vec<f64> = (0..60).map(|i| 10.0 + f64::from(i) * 0.01).collect();
        let many_slow: Vec<f64> = (0..60).map(|i| 300.0 + f64::from(i) * 0.01).collect();
        assert!(rank_test_greater(&many_slow, &many_fast).unwrap() < 1e-6);
        assert!(rank_test_greater(&many_fast, &many_slow).unwrap() > 0.99);
    }

    #[test]
    fn four_turns_each_way_slower_in_every_one_regress() {
        let (verdict, p) = judge(&[28.0, 27.0, 29.0, 28.5], &[325.0, 326.0, 324.0, 327.0]);
        assert_eq!(verdict, Verdict::Regressed);
        assert!(p.unwrap() < 0.05, "{p:?}");
        assert_eq!(
            judge(&[325.0, 326.0, 324.0, 327.0], &[28.0, 27.0, 29.0, 28.5]).0,
            Verdict::Improved
        );
    }

    #[test]
    fn a_run_of_only_invalid_errored_or_skipped_trajectories_checked_nothing() {
        let run = |passed, errors, skipped, invalid| {
            let mut run = RunStats::default();
            run.aggregates.counts = crate::stats::StatusCounts {
                trajectories: passed + errors + skipped + invalid,
                passed,
                errors,
                skipped,
                invalid,
                ..Default::default()
            };
            run
        };
        let why = checked_nothing(&run(0, 0, 0, 3)).unwrap();
        assert!(
            why.contains("all 3 of its trajectories are invalid"),
            "{why}"
        );
        assert!(checked_nothing(&run(0, 2, 0, 0)).is_some());
        assert!(checked_nothing(&run(0, 1, 1, 1)).is_some());
        // Skipped only: nothing checked either; anything decided: compared.
        assert!(
            checked_nothing(&run(0, 0, 4, 0))
                .is_some_and(|why| why.contains("all 4 of its trajectories were skipped"))
        );
        assert!(checked_nothing(&run(1, 0, 0, 3)).is_none());
    }

    /// A scenario whose head trajectories are all invalid (its simulated user broke
    /// character) beside one that passed: not run, and a regression, where it was "not
    /// comparable" and left out of the console's list.
    #[test]
    fn a_scenario_the_head_run_checked_nothing_of_is_not_run() {
        let scenario = |name: &str, passed, samples, invalid| crate::stats::ScenarioStats {
            suite: "s".into(),
            scenario: name.into(),
            agent: "a".into(),
            counts: crate::stats::StatusCounts {
                trajectories: samples + invalid,
                passed,
                failed: samples - passed,
                invalid,
                ..Default::default()
            },
            repeats: crate::stats::Repeats::from_counts(samples, passed, 0),
            latency: Default::default(),
            skip_reason: None,
            first_fault: None,
        };
        let run = |scenarios: Vec<crate::stats::ScenarioStats>| {
            let mut run = RunStats::default();
            run.aggregates.finished = true;
            for s in &scenarios {
                run.aggregates.counts.trajectories += s.counts.trajectories;
                run.aggregates.counts.passed += s.counts.passed;
                run.aggregates.counts.invalid += s.counts.invalid;
            }
            run.aggregates.planned = run.aggregates.counts.trajectories;
            run.scenarios = scenarios;
            run
        };
        let base = run(vec![scenario("kept", 1, 1, 0), scenario("simmed", 3, 3, 0)]);
        let head = run(vec![scenario("kept", 1, 1, 0), scenario("simmed", 0, 0, 3)]);
        let c = compare(
            &base,
            RunRef::default(),
            &head,
            RunRef::default(),
            Thresholds::default(),
            Vec::new(),
            None,
        );
        assert!(c.regressed, "{:?}", c.regressions);
        let simmed = c.scenarios.iter().find(|s| s.scenario == "simmed").unwrap();
        assert_eq!(simmed.rate.verdict, Verdict::NotRun);
        assert!(
            c.regressions
                .iter()
                .any(|r| r.contains("s/simmed [a]: not run (3 of its trajectories invalid")),
            "{:?}",
            c.regressions
        );

        // A head run killed while a scenario's first node was recorded but none of its
        // trajectories: not run because the run never reached its end, not "skipped".
        let mut killed = run(vec![scenario("kept", 1, 1, 0), scenario("simmed", 0, 0, 0)]);
        killed.aggregates.finished = false;
        killed.aggregates.planned = 4;
        let c = compare(
            &base,
            RunRef::default(),
            &killed,
            RunRef::default(),
            Thresholds::default(),
            Vec::new(),
            None,
        );
        let simmed = c.scenarios.iter().find(|s| s.scenario == "simmed").unwrap();
        assert_eq!(simmed.rate.verdict, Verdict::NotRun);
        let why = simmed.not_run.as_deref().unwrap_or_default();
        assert!(why.contains("never reached its end"), "{why}");
    }

    /// A check the head run did not evaluate is `not run`, unless it rates the simulated
    /// user (`fidelity`), whose unusable judge answer says nothing of the agent.
    #[test]
    fn an_unevaluated_check_is_not_run_unless_it_is_the_users_fidelity() {
        let criterion = |kind: &str, passed, skipped| crate::stats::CriterionStats {
            suite: "s".into(),
            scenario: "c".into(),
            trajectory: "main".into(),
            agent: "a".into(),
            turn_index: Some(1),
            criterion: kind.into(),
            kind: kind.into(),
            passed,
            failed: 0,
            errors: 0,
            skipped,
            first_failure: None,
        };
        let run = |passed, skipped| {
            let mut run = RunStats::default();
            run.aggregates.finished = true;
            run.criteria = vec![
                criterion("fidelity", passed, skipped),
                criterion("reply", passed, skipped),
            ];
            run
        };
        let c = compare(
            &run(1, 0),
            RunRef::default(),
            &run(0, 1),
            RunRef::default(),
            Thresholds::default(),
            Vec::new(),
            None,
        );
        let verdict = |kind: &str| {
            c.criteria
                .iter()
                .find(|k| k.criterion == kind)
                .map(|k| k.rate.verdict)
        };
        assert_eq!(verdict("reply"), Some(Verdict::NotRun));
        assert_eq!(verdict("fidelity"), Some(Verdict::NotComparable));
    }

    /// A simulated user that broke character more often in the head run is shown, not a
    /// regression of the agent: its trajectories are invalid, left out of every rate.
    #[test]
    fn a_fidelity_check_that_fails_more_is_shown_not_gated() {
        let run = |passed, failed| {
            let mut run = RunStats::default();
            run.aggregates.finished = true;
            run.criteria = vec![crate::stats::CriterionStats {
                suite: "s".into(),
                scenario: "c".into(),
                trajectory: "main".into(),
                agent: "a".into(),
                turn_index: None,
                criterion: "simulator fidelity".into(),
                kind: trellis_records::FIDELITY_KIND.into(),
                passed,
                failed,
                errors: 0,
                skipped: 0,
                first_failure: None,
            }];
            run
        };
        let c = compare(
            &run(20, 0),
            RunRef::default(),
            &run(0, 20),
            RunRef::default(),
            Thresholds::default(),
            Vec::new(),
            None,
        );
        assert_eq!(c.criteria[0].rate.verdict, Verdict::Ungated);
        assert!(
            !c.regressions.iter().any(|r| r.contains("fidelity")),
            "{:?}",
            c.regressions
        );
        // Worse by too little to tell from chance: shown as ungated too, not as `noise`.
        let c = compare(
            &run(6, 0),
            RunRef::default(),
            &run(2, 3),
            RunRef::default(),
            Thresholds::default(),
            Vec::new(),
            None,
        );
        assert_eq!(c.criteria[0].rate.verdict, Verdict::Ungated);
    }

    /// A run's pass rate is tested on its scenarios' repetitions, each once: an unchanged
    /// flaky agent whose fork's prefix fails sometimes fails both branches at once, and the
    /// trajectories counted as 18 independent samples called 14/18 → 8/18 a regression
    /// (p 0.043) where the scenario's own rows said noise.
    #[test]
    fn the_runs_pass_rate_is_tested_on_repetitions_not_on_shared_branches() {
        let run = |book_reps: u64, quote_reps: u64| {
            let mut run = RunStats::default();
            run.aggregates.finished = true;
            let scenario = |name: &str, branches: u64, passed: u64| {
                let counts = crate::stats::StatusCounts {
                    trajectories: 6 * branches,
                    passed: passed * branches,
                    failed: (6 - passed) * branches,
                    ..Default::default()
                };
                crate::stats::ScenarioStats {
                    suite: "s".into(),
                    scenario: name.into(),
                    agent: "a".into(),
                    counts,
                    repeats: crate::stats::Repeats::from_counts(6, passed, 0),
                    latency: Default::default(),
                    skip_reason: None,
                    first_fault: None,
                }
            };
            run.scenarios = vec![
                scenario("book", 2, book_reps),
                scenario("quote", 1, quote_reps),
            ];
            for s in &run.scenarios {
                run.aggregates.counts.trajectories += s.counts.trajectories;
                run.aggregates.counts.passed += s.counts.passed;
                run.aggregates.counts.failed += s.counts.failed;
            }
            run.aggregates.planned = run.aggregates.counts.trajectories;
            run
        };
        // 14/18 → 8/18 trajectories: 4/6 → 1/6 of book (two branches each), 6/6 → 6/6 of
        // quote. As repetitions, 10/12 → 7/12: within chance.
        let metrics = run_metrics(&run(4, 6), &run(1, 6), &Thresholds::default(), false, None);
        let rate = metrics
            .iter()
            .find(|m| m.metric == "pass_rate")
            .expect("pass rate");
        assert_eq!(rate.verdict, Verdict::Noise, "{rate:?}");
        assert!(rate.p_value.is_some_and(|p| p > 0.05), "{rate:?}");
        // What the rows show is still the trajectories' rate: 14/18 → 8/18.
        assert!(
            rate.delta.is_some_and(|d| (d + 6.0 / 18.0).abs() < 1e-9),
            "{rate:?}"
        );
        // A real drop is still one: every repetition failing.
        let metrics = run_metrics(&run(6, 6), &run(0, 0), &Thresholds::default(), false, None);
        let rate = metrics
            .iter()
            .find(|m| m.metric == "pass_rate")
            .expect("pass rate");
        assert_eq!(rate.verdict, Verdict::Regressed, "{rate:?}");
    }

    /// Runs of no suite in common compared nothing: that fails, where it passed. Another
    /// scenario of the same suite (a head run that selected only a new one) is gated as new.
    #[test]
    fn runs_that_share_no_suite_fail_the_comparison() {
        let run = |suite: &str, name: &str| {
            let mut run = RunStats::default();
            run.aggregates.finished = true;
            run.aggregates.planned = 1;
            run.aggregates.counts.trajectories = 1;
            run.aggregates.counts.passed = 1;
            run.scenarios = vec![crate::stats::ScenarioStats {
                suite: suite.into(),
                scenario: name.into(),
                agent: "a".into(),
                counts: run.aggregates.counts,
                repeats: crate::stats::Repeats::from_counts(1, 1, 0),
                latency: Default::default(),
                skip_reason: None,
                first_fault: None,
            }];
            run
        };
        let c = |base: &RunStats, head: &RunStats| {
            compare(
                base,
                RunRef::default(),
                head,
                RunRef::default(),
                Thresholds::default(),
                Vec::new(),
                None,
            )
        };
        let other = c(&run("s", "one"), &run("t", "one"));
        assert!(other.regressed);
        assert!(
            other.regressions[0].contains("the runs share no suite"),
            "{:?}",
            other.regressions
        );
        assert!(!c(&run("s", "one"), &run("s", "one")).regressed);
        assert!(!c(&run("s", "one"), &run("s", "new")).regressed);
    }

    fn t(passed: u64, samples: u64) -> Option<Tally> {
        Some(Tally { passed, samples })
    }

    #[test]
    fn a_single_pass_turning_into_a_failure_regresses() {
        let r = judge_rate(t(1, 1), t(0, 1), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Regressed);
        assert_eq!(r.p_value, None);
        assert_eq!(r.delta_points, Some(-100.0));
    }

    #[test]
    fn one_failure_in_five_repeats_is_noise_a_collapse_is_not() {
        let r = judge_rate(t(5, 5), t(4, 5), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Noise);
        // Fisher exact, one-sided, [[5,0],[4,1]]: p = 0.5 (scipy.stats.fisher_exact).
        assert!((r.p_value.unwrap() - 0.5).abs() < 1e-9);
        let r = judge_rate(t(10, 10), t(2, 10), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Regressed);
        // [[10,0],[2,8]] greater: C(12,10)·C(8,0)/C(20,10) = 66/184756.
        assert!((r.p_value.unwrap() - 66.0 / 184_756.0).abs() < 1e-9);
    }

    /// A rise is judged as a drop is: one the test cannot tell from chance is noise (it
    /// was a green "improved" at p 0.5); a single failure turned pass, a rise from never to
    /// always, and a significant one improve.
    #[test]
    fn a_rise_the_test_cannot_tell_from_chance_is_noise() {
        let r = judge_rate(t(2, 5), t(3, 5), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Noise, "{r:?}");
        assert!((r.p_value.unwrap() - 0.5).abs() < 1e-9, "{r:?}");
        assert_eq!(
            judge_rate(t(0, 1), t(1, 1), &Thresholds::default()).verdict,
            Verdict::Improved
        );
        assert_eq!(
            judge_rate(t(0, 2), t(2, 2), &Thresholds::default()).verdict,
            Verdict::Improved
        );
        let r = judge_rate(t(2, 10), t(10, 10), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Improved, "{r:?}");
        assert!(r.p_value.unwrap() < 0.05, "{r:?}");
    }

    #[test]
    fn a_p_value_of_exactly_alpha_regresses_whichever_way_it_rounds() {
        // 3/3 to 0/3: p = 1/20 exactly, alpha 0.05.
        let r = judge_rate(t(3, 3), t(0, 3), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Regressed, "{r:?}");
        assert!((r.p_value.unwrap() - 0.05).abs() < 1e-12);
        for alpha in [0.05 * (1.0 - 1e-15), 0.05 * (1.0 + 1e-15)] {
            let thresholds = Thresholds {
                alpha,
                ..Thresholds::default()
            };
            assert_eq!(
                judge_rate(t(3, 3), t(0, 3), &thresholds).verdict,
                Verdict::Regressed
            );
        }
        // 2/2 to 1/2: p = 1/2, noise (one flake).
        assert_eq!(
            judge_rate(t(2, 2), t(1, 2), &Thresholds::default()).verdict,
            Verdict::Noise
        );
    }

    /// 2 against 2 repetitions can never reach alpha 0.05 (the smallest p is 1/6): a
    /// collapse from always to never regresses all the same, as one pass turned into one
    /// failure does, so that repeating a scenario never makes the gate weaker than running
    /// it once.
    #[test]
    fn a_collapse_too_small_to_test_regresses() {
        let r = judge_rate(t(2, 2), t(0, 2), &Thresholds::default());
        assert_eq!(r.verdict, Verdict::Regressed, "{r:?}");
        assert!((r.p_value.unwrap() - 1.0 / 6.0).abs() < 1e-9);
        assert_eq!(
            judge_rate(t(1, 1), t(0, 1), &Thresholds::default()).verdict,
            Verdict::Regressed
        );
        assert_eq!(
            judge_rate(t(1, 1), t(0, 2), &Thresholds::default()).verdict,
            Verdict::Regressed
        );
        // A scenario that already failed half the time and now always does: noise.
        assert_eq!(
            judge_rate(t(1, 2), t(0, 2), &Thresholds::default()).verdict,
            Verdict::Noise
        );
        // At any alpha.
        let strict = Thresholds {
            alpha: 1e-9,
            ..Thresholds::default()
        };
        assert_eq!(
            judge_rate(t(3, 3), t(0, 3), &strict).verdict,
            Verdict::Regressed
        );
    }

    fn latency_of(values: &[f64]) -> crate::stats::Latency {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        crate::stats::Latency {
            turns: values.len() as u64,
            p50_ms: crate::stats::quantile(&sorted, 0.5),
            p95_ms: crate::stats::quantile(&sorted, 0.95),
            max_ms: sorted.last().copied(),
            mean_ms: Some(values.iter().sum::<f64>() / values.len() as f64),
        }
    }

    fn judge(base: &[f64], head: &[f64]) -> (Verdict, Option<f64>) {
        judge_with_history(base, head, &[])
    }

    fn judge_with_history(
        base: &[f64],
        head: &[f64],
        earlier_means: &[f64],
    ) -> (Verdict, Option<f64>) {
        let samples = TurnLatencies {
            base: base.to_vec(),
            head: head.to_vec(),
            earlier_means: earlier_means.to_vec(),
            ..TurnLatencies::default()
        };
        let judged = judge_latency(
            &latency_of(base),
            &latency_of(head),
            Some(&samples),
            &Thresholds::default(),
        );
        (judged.verdict, judged.p_value)
    }

    #[test]
    fn one_slow_turn_of_an_unchanged_agent_is_noise() {
        // 40 turns around 18 ms; the head run has one 1.2 s stall: the mean moves from
        // ~18 to ~48 ms, past 20% and the 25 ms floor, yet the turns are no slower.
        let base: Vec<f64> = (0..40).map(|i| 15.0 + f64::from(i % 7)).collect();
        let mut head = base.clone();
        head[3] = 1200.0;
        let (verdict, p) = judge(&base, &head);
        assert_eq!(verdict, Verdict::Noise);
        assert!(p.unwrap() > 0.05, "{p:?}");
        // Judged on the mean alone (no per-turn latencies), the same runs regressed.
        let mean_only = judge_latency(
            &latency_of(&base),
            &latency_of(&head),
            None,
            &Thresholds::default(),
        );
        assert_eq!(mean_only.verdict, Verdict::Regressed);
    }

    #[test]
    fn an_agent_twice_as_slow_regresses_and_twice_as_fast_improves() {
        let base: Vec<f64> = (0..20).map(|i| 50.0 + f64::from(i % 5)).collect();
        let head: Vec<f64> = base.iter().map(|ms| ms * 2.0).collect();
        let (verdict, p) = judge(&base, &head);
        assert_eq!(verdict, Verdict::Regressed);
        assert!(p.unwrap() < 0.001, "{p:?}");
        assert_eq!(judge(&head, &base).0, Verdict::Improved);
    }

    /// A busy machine slows every turn of a run: against a quiet base the rank test says
    /// "slower", as for a slower agent. Earlier runs of the same suites that were as slow
    /// show it is how runs vary here; a slowdown past all of them still regresses.
    #[test]
    fn a_run_no_slower_than_earlier_runs_have_been_is_noise() {
        let base: Vec<f64> = (0..40).map(|i| 15.0 + f64::from(i % 7)).collect();
        let busy: Vec<f64> = base.iter().map(|ms| ms * 3.0).collect();
        assert_eq!(judge(&base, &busy).0, Verdict::Regressed);
        // Three earlier runs, one of them on a machine as busy (mean ~54 ms).
        let (verdict, p) = judge_with_history(&base, &busy, &[18.0, 54.0, 19.0]);
        assert_eq!(verdict, Verdict::Noise);
        assert!(
            p.unwrap() < 0.001,
            "the rank test alone still says slower: {p:?}"
        );
        // Two earlier runs are too few to know the spread.
        assert_eq!(
            judge_with_history(&base, &busy, &[18.0, 54.0]).0,
            Verdict::Regressed
        );
        // Too few turns to test (one against three) is judged on the thresholds, and by the
        // earlier runs' spread as well: a one-turn agent as slow as earlier runs were is
        // noise, twice as slow as any of them regressed.
        let (one, three) = (&[31.5][..], &[15.0, 1.2, 1.2][..]);
        assert_eq!(judge(three, one).0, Verdict::Regressed);
        assert_eq!(
            judge_with_history(three, one, &[30.5, 33.9, 5.8]).0,
            Verdict::Noise
        );
        assert_eq!(
            judge_with_history(three, &[70.0], &[30.5, 33.9, 5.8]).0,
            Verdict::Regressed
        );
        // A 50 ms agent twice as slow, after runs that all took about 50 ms: regressed.
        let agent: Vec<f64> = (0..20).map(|i| 50.0 + f64::from(i % 5)).collect();
        let slower: Vec<f64> = agent.iter().map(|ms| ms * 2.0).collect();
        assert_eq!(
            judge_with_history(&agent, &slower, &[52.0, 51.0, 53.0, 52.5]).0,
            Verdict::Regressed
        );
    }

    #[test]
    fn thresholds_and_alpha_are_honoured() {
        let lenient = Thresholds {
            max_pass_rate_drop: 30.0,
            ..Thresholds::default()
        };
        assert_eq!(
            judge_rate(t(10, 10), t(8, 10), &lenient).verdict,
            Verdict::Unchanged
        );
        let untested = Thresholds {
            alpha: 1.0,
            ..Thresholds::default()
        };
        assert_eq!(
            judge_rate(t(5, 5), t(4, 5), &untested).verdict,
            Verdict::Regressed
        );
        assert_eq!(
            judge_rate(t(0, 1), t(1, 1), &untested).verdict,
            Verdict::Improved
        );
        assert_eq!(judge_rate(None, t(1, 1), &untested).verdict, Verdict::Added);
        assert_eq!(
            judge_rate(t(1, 1), None, &untested).verdict,
            Verdict::Removed
        );
        assert_eq!(
            judge_rate(t(0, 0), t(1, 1), &untested).verdict,
            Verdict::NotComparable
        );
    }

    /// Turns of a 50 ms agent with a spread of a few milliseconds, `n` of them, scaled.
    fn turns(n: usize, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|i| (50.0 + ((i * 7919) % 13) as f64) * scale)
            .collect()
    }

    fn scenario(base: Vec<f64>, head: Vec<f64>) -> TurnLatencies {
        TurnLatencies {
            base,
            head,
            ..TurnLatencies::default()
        }
    }

    #[test]
    fn one_scenario_three_times_slower_regresses_among_many() {
        let t = Thresholds::default();
        let judged = judge_scenario_latency(&scenario(turns(12, 1.0), turns(12, 3.0)), 1.0, 40, &t);
        assert_eq!(judged.verdict, Verdict::Regressed, "{judged:?}");
        let why = judged.why.unwrap();
        assert!(
            why.contains("below 0.001 (0.05 over 40 scenarios tested)"),
            "{why}"
        );
        // The same turns, unchanged: nothing to say.
        let judged = judge_scenario_latency(&scenario(turns(12, 1.0), turns(12, 1.0)), 1.0, 40, &t);
        assert_eq!(judged.verdict, Verdict::Unchanged, "{judged:?}");
    }

    /// A busier machine slows every scenario as it slows the run: a scenario as much slower
    /// as the run's median turn is not slower than the rest of the run.
    #[test]
    fn a_scenario_slowed_as_much_as_the_run_is_not_a_regression() {
        let t = Thresholds::default();
        let judged = judge_scenario_latency(&scenario(turns(12, 1.0), turns(12, 1.6)), 1.6, 8, &t);
        assert_ne!(judged.verdict, Verdict::Regressed, "{judged:?}");
        // Twice the run's slowdown is.
        let judged = judge_scenario_latency(&scenario(turns(12, 1.0), turns(12, 3.2)), 1.6, 8, &t);
        assert_eq!(judged.verdict, Verdict::Regressed, "{judged:?}");
        assert!(judged.why.unwrap().contains("1.60× as slow"));
    }

    /// One turn on each side cannot be told from chance: not gated, and it says why.
    #[test]
    fn a_scenario_with_too_few_turns_to_test_is_not_gated() {
        let t = Thresholds::default();
        let judged = judge_scenario_latency(&scenario(vec![50.0], vec![500.0]), 1.0, 3, &t);
        assert_eq!(judged.verdict, Verdict::Ungated, "{judged:?}");
        let why = judged.why.unwrap();
        assert!(why.contains("too few turns (1 and 1)"), "{why}");
        assert!(why.contains("a higher `repeat` gates it"), "{why}");
        // Enough turns alone, too few once 4 or more scenarios are tested at once (the
        // smallest p of 4 against 4 is 1/70, not below 0.05 ÷ 4); 200 here.
        let (b, h) = (turns(4, 1.0), turns(4, 3.0));
        let alone = judge_scenario_latency(&scenario(b.clone(), h.clone()), 1.0, 1, &t);
        assert_eq!(alone.verdict, Verdict::Regressed, "{alone:?}");
        let many = judge_scenario_latency(&scenario(b, h), 1.0, 200, &t);
        assert_eq!(many.verdict, Verdict::Ungated, "{many:?}");
    }

    /// +22% past the 20% threshold, +17 ms under the 25 ms floor: unchanged, and it says
    /// which held it back.
    #[test]
    fn a_rise_under_the_noise_floor_says_so() {
        let base = turns(12, 1.0);
        let head = turns(12, 1.22);
        let judged = judge_latency(
            &latency_of(&base),
            &latency_of(&head),
            Some(&scenario(base.clone(), head.clone())),
            &Thresholds::default(),
        );
        assert_eq!(judged.verdict, Verdict::Unchanged, "{judged:?}");
        let why = judged.why.unwrap();
        assert!(why.contains("not past the 25 ms noise floor"), "{why}");
    }

    /// A threaded agent answering a scenario's ten turns at once took 1.7× as long in one
    /// run as in another, unchanged: past the thresholds and the rank test, short of the
    /// scenario's bar (twice the base's), so `noise`, saying why; three times is a
    /// regression.
    #[test]
    fn a_scenario_under_more_load_is_noise_not_a_regression() {
        let t = Thresholds::default();
        let judged = judge_scenario_latency(&scenario(turns(10, 1.0), turns(10, 1.7)), 1.0, 4, &t);
        assert_eq!(judged.verdict, Verdict::Noise, "{judged:?}");
        let why = judged.why.unwrap();
        assert!(
            why.contains("its turns are 1.70× the base's, not 2×"),
            "{why}"
        );
        let judged = judge_scenario_latency(&scenario(turns(10, 1.0), turns(10, 3.0)), 1.0, 4, &t);
        assert_eq!(judged.verdict, Verdict::Regressed, "{judged:?}");
        assert!(judged.why.unwrap().ends_with("3.0× the base's"));
    }
}
