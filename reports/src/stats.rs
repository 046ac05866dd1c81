//! Statistics of one run: rates with confidence intervals, pass@k and pass^k over
//! repetitions, flaky branches, where in the trajectory tree failures happen, and run
//! aggregates (pass rate, latency, tokens, cost, judge score).
//!
//! [`StatsBuilder`] takes journal entries as they come (the report writer feeds it during a
//! run, [`RunStats::from_run_dir`] replays a journal), keeping counts per scenario, branch,
//! node and criterion plus one latency per turn, never whole records. Everything it produces
//! is a plain serialisable struct, in a stable order (suite load order, then scenario,
//! branch, agent and repetition by name and number), for the console, `summary.json`,
//! `trellis compare` and the HTML report alike. The formulas are documented in
//! `docs/results.md`.

use std::collections::{HashMap, HashSet};

use roaring::RoaringBitmap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal};
use trellis_records::{
    CriterionStatus, JournalEntry, NodeRecord, RunInfo, RunSummary, TrajectoryRecord,
    TrajectoryStatus,
};

use crate::error::ReportError;
use crate::journal::JournalReader;

/// Confidence of every interval Trellis reports.
pub const CONFIDENCE: f64 = 0.95;

/// A two-sided confidence interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
}

/// A share (0–1) as a percentage for people: whole percents, except that a share that is
/// not exactly 0 or 1 never reads as `0` or `100` (2999 of 3000 is `99.97`, a Wilson bound
/// of 0.0013 is `0.1`): a rounded `100%–100%` interval reads as a certainty it is not. The
/// `%` is the caller's.
pub fn percent_label(share: f64) -> String {
    let percent = share * 100.0;
    if !(0.0..=100.0).contains(&percent) || percent == 0.0 || percent == 100.0 {
        return format!("{percent:.0}");
    }
    for decimals in 0..4 {
        let shown = format!("{percent:.decimals$}");
        let value: f64 = shown.parse().unwrap_or(percent);
        if value > 0.0 && value < 100.0 {
            return shown;
        }
    }
    format!("{percent:.4}")
}

impl Interval {
    /// The interval as percentages for people, `99.4–99.6` (the `%` is the caller's): both
    /// bounds with the decimals [`percent_label`] needs for either, and more (up to 4)
    /// until two different bounds read apart: whole percents wrote 9,950 of 10,000 as
    /// `99–100`, and 99,500 of 100,000 as `99–99`, an interval of no width.
    pub fn label(&self) -> String {
        let decimals_of = |share: f64| {
            percent_label(share)
                .split_once('.')
                .map_or(0, |(_, d)| d.len())
        };
        // Exactly 0 or 1 is `0` or `100`, as `percent_label` writes it.
        let at = |share: f64, decimals: usize| {
            if share <= 0.0 || share >= 1.0 {
                percent_label(share)
            } else {
                format!("{:.decimals$}", share * 100.0)
            }
        };
        let mut decimals = decimals_of(self.low).max(decimals_of(self.high));
        let (mut low, mut high) = (at(self.low, decimals), at(self.high, decimals));
        while low == high && self.low < self.high && decimals < 4 {
            decimals += 1;
            (low, high) = (at(self.low, decimals), at(self.high, decimals));
        }
        format!("{low}–{high}")
    }
}

/// The Wilson score interval for `successes` out of `samples` at `confidence` (0 < c < 1);
/// `None` without samples. Unlike the normal approximation it stays within [0, 1] and is
/// honest for small samples and rates near 0 or 1.
pub fn wilson_interval(successes: u64, samples: u64, confidence: f64) -> Option<Interval> {
    if samples == 0 || successes > samples || !(confidence > 0.0 && confidence < 1.0) {
        return None;
    }
    let z = Normal::standard().inverse_cdf(1.0 - (1.0 - confidence) / 2.0);
    let n = samples as f64;
    let p = successes as f64 / n;
    let z2 = z * z;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    // At p = 0 or 1 one bound is 0 or 1 exactly; computed, it can land a rounding error
    // short (0.9999999999999999 for 5 of 5), which reads as `100.0000%`.
    Some(Interval {
        low: if successes == 0 {
            0.0
        } else {
            (centre - half).max(0.0)
        },
        high: if successes == samples {
            1.0
        } else {
            (centre + half).min(1.0)
        },
    })
}

/// The unbiased estimator of pass@k from `n` samples with `c` successes: the probability
/// that at least one of `k` samples drawn without replacement passes,
/// `1 - C(n-c, k) / C(n, k)`. `None` when `k` is 0 or larger than `n`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    // C(n-c, k) / C(n, k) as a product, which neither overflows nor loses precision.
    let all_fail: f64 = ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product();
    Some(1.0 - all_fail)
}

/// The unbiased estimator of pass^k (every one of `k` samples passes) from `n` samples with
/// `c` successes: `C(c, k) / C(n, k)`. `None` when `k` is 0 or larger than `n`.
pub fn pass_hat_k(n: u64, c: u64, k: u64) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if c < k {
        return Some(0.0);
    }
    Some((0..k).map(|i| (c - i) as f64 / (n - i) as f64).product())
}

/// The `q` quantile (0 ≤ q ≤ 1) of `sorted` values by linear interpolation between the
/// closest ranks (numpy's and polars' default); `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let position = q.clamp(0.0, 1.0) * last as f64;
    let below = position.floor() as usize;
    let above = position.ceil() as usize;
    let low = *sorted.get(below)?;
    let high = *sorted.get(above)?;
    Some(low + (high - low) * (position - below as f64))
}

/// pass@k and pass^k for one k.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AtK {
    pub k: u64,
    pub pass_at_k: f64,
    pub pass_hat_k: f64,
}

/// Outcomes of repeated samples of one thing (a branch, or a whole scenario per repetition).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Repeats {
    /// Samples that ran (skipped ones left out): `n`.
    pub samples: u64,
    /// Samples that passed: `c`.
    pub passed: u64,
    /// Samples that were skipped.
    pub skipped: u64,
    /// `passed / samples`.
    pub pass_rate: Option<f64>,
    /// Wilson interval of the pass rate at [`CONFIDENCE`].
    pub interval: Option<Interval>,
    /// pass@k and pass^k for k = 1, 2, 3, 5, 10 and n, those not above n.
    pub at_k: Vec<AtK>,
    /// Both passed and failed across repetitions.
    pub flaky: bool,
}

impl Repeats {
    pub fn from_counts(samples: u64, passed: u64, skipped: u64) -> Self {
        let mut ks: Vec<u64> = [1, 2, 3, 5, 10, samples]
            .into_iter()
            .filter(|&k| k >= 1 && k <= samples)
            .collect();
        ks.dedup();
        Repeats {
            samples,
            passed,
            skipped,
            pass_rate: (samples > 0).then(|| passed as f64 / samples as f64),
            interval: wilson_interval(passed, samples, CONFIDENCE),
            at_k: ks
                .into_iter()
                .filter_map(|k| {
                    Some(AtK {
                        k,
                        pass_at_k: pass_at_k(samples, passed, k)?,
                        pass_hat_k: pass_hat_k(samples, passed, k)?,
                    })
                })
                .collect(),
            flaky: passed > 0 && passed < samples,
        }
    }
}

/// Latency of agent turns, in milliseconds. Replayed prefix turns are left out (they are
/// the same step taken again, see `turns.replay`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub turns: u64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

impl Latency {
    /// The figures of `values` (in the order the turns were recorded). Two selections
    /// rather than a sort: at the end of a run this is done for all of its turns and again
    /// for each scenario's, one after the tables, and sorting 20,000 turns twice was 2 ms of
    /// the run's end (docs/performance.md, "What was slow, and why it is not any more").
    pub fn of(mut values: Vec<f64>) -> Self {
        values.retain(|v| v.is_finite());
        let turns = values.len() as u64;
        // Summed before the selections reorder them: the same mean for the same turns.
        let mean_ms = (turns > 0).then(|| values.iter().sum::<f64>() / turns as f64);
        Latency {
            turns,
            p95_ms: quantile_of_unsorted(&mut values, 0.95),
            p50_ms: quantile_of_unsorted(&mut values, 0.5),
            max_ms: values.iter().copied().max_by(f64::total_cmp),
            mean_ms,
        }
    }
}

/// [`quantile`] of `values` in any order, which it reorders: the value at each of the two
/// closest ranks is selected (linear time) instead of sorting them all.
fn quantile_of_unsorted(values: &mut [f64], q: f64) -> Option<f64> {
    let last = values.len().checked_sub(1)?;
    let position = q.clamp(0.0, 1.0) * last as f64;
    let below = position.floor() as usize;
    let (_, &mut low, above) = values.select_nth_unstable_by(below, f64::total_cmp);
    let fraction = position - below as f64;
    if fraction == 0.0 {
        return Some(low);
    }
    // The next rank's value is the least of those after `below`.
    let high = above.iter().copied().min_by(f64::total_cmp)?;
    Some(low + (high - low) * fraction)
}

/// Trajectory counts by status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    pub trajectories: u64,
    pub passed: u64,
    pub failed: u64,
    pub errors: u64,
    pub skipped: u64,
    /// The simulated user broke character: left out of `ran` and the pass rate.
    #[serde(default)]
    pub invalid: u64,
}

impl StatusCounts {
    pub(crate) fn add(&mut self, status: TrajectoryStatus) {
        self.trajectories += 1;
        match status {
            TrajectoryStatus::Passed => self.passed += 1,
            TrajectoryStatus::Failed => self.failed += 1,
            TrajectoryStatus::Error => self.errors += 1,
            TrajectoryStatus::Skipped => self.skipped += 1,
            TrajectoryStatus::Invalid => self.invalid += 1,
        }
    }

    /// Trajectories that ran: passed, failed or errored.
    pub fn ran(&self) -> u64 {
        self.passed + self.failed + self.errors
    }

    /// Passed over the trajectories that ran; `None` when none ran.
    pub fn pass_rate(&self) -> Option<f64> {
        let ran = self.ran();
        (ran > 0).then(|| self.passed as f64 / ran as f64)
    }
}

/// The whole run, Connexity's aggregates included.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunAggregates {
    pub counts: StatusCounts,
    /// Trajectories the plan meant to run; more than `counts.trajectories` when the run
    /// was stopped.
    pub planned: u64,
    /// The run reached its end (`run_finished` in the journal).
    pub finished: bool,
    /// It reached its end having been stopped before all of its work was done
    /// (`run_finished.interrupted`).
    #[serde(default)]
    pub interrupted: bool,
    pub pass_rate: Option<f64>,
    pub pass_rate_interval: Option<Interval>,
    pub latency: Latency,
    /// Sum of the tokens agents reported; `None` when none reported any.
    pub total_tokens: Option<u64>,
    /// Cost of the engine's own LLM calls (judges, simulated users) from the providers'
    /// prices; `None` when none was priced.
    pub cost_usd: Option<f64>,
    /// Cost of the models under test reached through a priced provider (`provider=` on an
    /// `openai`/`anthropic` agent); `None` when none was priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_cost_usd: Option<f64>,
    /// Mean score of the LLM-judged checks, 0–100; `None` when nothing was judged.
    pub mean_score: Option<f64>,
    /// Wall time of the run.
    pub duration_ms: Option<f64>,
    /// LLM use per role (`agent`, `simulator`, `judge`, `attacker`), each call counted once
    /// where it was made; from the run's end (`run_finished.llm_roles`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub llm_roles: std::collections::BTreeMap<String, trellis_records::LlmUsage>,
    /// Connection attempts to loopback agents that their full accept queues dropped, by
    /// `host:port`; from the run's end (`run_finished.connections_redone`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub connections_redone: std::collections::BTreeMap<String, u64>,
    /// Requests a long-lived agent process ended on without answering, sent again to a new
    /// process, by the agent's command; from the run's end (`run_finished.requests_resent`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub requests_resent: std::collections::BTreeMap<String, u64>,
}

/// One branch (trajectory) of a scenario for one agent, over its repetitions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BranchStats {
    pub suite: Arc<str>,
    pub scenario: Arc<str>,
    pub trajectory: Arc<str>,
    pub agent: Arc<str>,
    pub repeats: Repeats,
    /// The status of each repetition, by repetition number, as runs of equal status:
    /// `(first, last, status)` for repetitions `first..=last` (a gap in the numbers starts a
    /// new run). A branch whose 50,000 repetitions all passed is one entry, where a pair per
    /// repetition made `summary.json` 3 MB; each repetition is a row of `trajectories.parquet`.
    /// Summaries written before hold `outcomes` pairs instead, which are not read.
    #[serde(default)]
    pub outcome_runs: Vec<(u32, u32, TrajectoryStatus)>,
    /// Mean of the repetitions' own durations (`trajectories.duration_ms`).
    pub mean_duration_ms: Option<f64>,
}

/// One scenario for one agent. A repetition of a scenario passes when every branch of it
/// that ran passed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioStats {
    pub suite: Arc<str>,
    pub scenario: Arc<str>,
    pub agent: Arc<str>,
    pub counts: StatusCounts,
    pub repeats: Repeats,
    pub latency: Latency,
    /// Why its trajectories were skipped (the first reason), when any was: such as `needs
    /// X, which did not pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    /// The fault that ended its first errored trajectory, as `category: message`, when any
    /// did: what a CI summary says of an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_fault: Option<String>,
}

/// The position, among the `nodes` nodes of failed or errored trajectory `t`'s path, of the
/// node where it first went wrong: that of its earliest failed check (`node_of_turn` places
/// a turn; a trajectory-level check belongs to the last node), or the last node reached
/// for a fault (a fault stops the walk where it happened), whichever comes first. The one
/// rule of summary.json's `nodes` and the report's tree (crate::html::outline).
pub(crate) fn failure_position(
    t: &TrajectoryRecord,
    nodes: usize,
    node_of_turn: impl Fn(u32) -> Option<usize>,
) -> Option<usize> {
    if !matches!(t.status, TrajectoryStatus::Failed | TrajectoryStatus::Error) {
        return None;
    }
    let last = nodes.checked_sub(1)?;
    let earliest_check = t
        .criteria
        .iter()
        .filter(|c| c.status == CriterionStatus::Failed)
        .map(|c| c.turn_index.and_then(&node_of_turn).unwrap_or(last))
        .min();
    let fault = t.fault.is_some().then_some(last);
    Some(
        [earliest_check, fault]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last),
    )
}

/// One node of a scenario's trajectory tree for one agent. Each trajectory that reached the
/// node is counted once: it either got through it (`passed`), failed at it (`failed_here`:
/// its first failing check, fault or stop is on this node) or had already failed at a node
/// above (`failed_above`), so a failure in a shared prefix shows at the prefix only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    pub suite: Arc<str>,
    pub scenario: Arc<str>,
    pub agent: Arc<str>,
    /// `start`, `accepts`, `accepts/then`.
    pub node: Arc<str>,
    pub parent: Option<String>,
    /// Trajectories (× repetitions) whose path reached this node.
    pub reached: u64,
    pub passed: u64,
    pub failed_here: u64,
    pub failed_above: u64,
    /// Times the node was executed (once per repetition however many branches share it).
    pub executions: u64,
    /// Executions in which some trajectory failed here.
    pub executions_failed_here: u64,
}

/// One check of one branch over its repetitions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CriterionStats {
    pub suite: Arc<str>,
    pub scenario: Arc<str>,
    pub trajectory: Arc<str>,
    pub agent: Arc<str>,
    pub turn_index: Option<u32>,
    pub criterion: Arc<str>,
    pub kind: String,
    pub passed: u64,
    pub failed: u64,
    /// Evaluations that could not decide (a judge that was down, answered garbage or had
    /// no key): never passed, counted against the pass rate, and not counted `failed`, as
    /// `criteria.parquet` says `error`. Absent from summaries written before it was split
    /// from `failed`.
    #[serde(default)]
    pub errors: u64,
    pub skipped: u64,
    /// The first failure's (or error's) detail, to say why.
    pub first_failure: Option<String>,
}

impl CriterionStats {
    /// Passed over the evaluations that ran (errors count as not passing).
    pub fn pass_rate(&self) -> Option<f64> {
        let ran = self.ran();
        (ran > 0).then(|| self.passed as f64 / ran as f64)
    }

    /// Evaluations that ran: passed, failed or ended in an error.
    pub fn ran(&self) -> u64 {
        self.passed + self.failed + self.errors
    }
}

/// Everything [`StatsBuilder`] computes for one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    pub run_id: String,
    pub started_at: String,
    pub suites: Vec<String>,
    /// Made with `--strict`: a check that did not run failed its trajectory. Runs before
    /// this was recorded here read as not strict.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict: bool,
    pub aggregates: RunAggregates,
    pub scenarios: Vec<ScenarioStats>,
    pub branches: Vec<BranchStats>,
    pub nodes: Vec<NodeStats>,
    pub criteria: Vec<CriterionStats>,
}

impl RunStats {
    /// Replays `dir/journal.jsonl`.
    pub fn from_run_dir(dir: &Path) -> Result<RunStats, ReportError> {
        let path = trellis_journal::path_in(dir);
        let mut journal = JournalReader::open(&path)?;
        // A journal that does not start with its run (damaged, or not a journal) is not a
        // run of nothing: compared as one, it read "0 of 0 planned trajectories".
        match journal.next_entry()? {
            Some(entry @ JournalEntry::RunStarted(_)) => {
                let mut builder = StatsBuilder::default();
                builder.push(&entry);
                while let Some(entry) = journal.next_entry()? {
                    builder.push(&entry);
                }
                Ok(builder.finish())
            }
            _ => Err(ReportError::MissingRunStarted { path }),
        }
    }

    /// One agent's share of the run in `dir` (its nodes and trajectories replayed alone, so
    /// the run's aggregates are that agent's), every name of the agent replaced by `label`:
    /// two agents of one run labelled alike pair up in [`crate::compare::compare`], scenario
    /// by scenario (a side-by-side run of `agents "a" "b"`). `None` when no trajectory of
    /// the run is the agent's.
    pub fn for_agent(
        dir: &Path,
        agent: &str,
        label: &str,
    ) -> Result<Option<RunStats>, ReportError> {
        let mut journal = JournalReader::open(&dir.join(crate::JOURNAL_FILE))?;
        let mut builder = StatsBuilder::default();
        let mut found = false;
        let mut recorded = 0u64;
        while let Some(entry) = journal.next_entry()? {
            match entry {
                JournalEntry::Node(mut node) => {
                    if node.agent == agent {
                        node.agent = label.to_owned();
                        builder.push(&JournalEntry::Node(node));
                    }
                }
                JournalEntry::Trajectory(mut t) => {
                    recorded += 1;
                    if t.agent == agent {
                        found = true;
                        t.agent = label.to_owned();
                        builder.push(&JournalEntry::Trajectory(t));
                    }
                }
                JournalEntry::Agent(_) => {}
                other => builder.push(&other),
            }
        }
        Ok(found.then(|| {
            let mut stats = builder.finish();
            // The plan counts every agent's trajectories. This agent's share is its own,
            // plus whatever the whole run did not record (which agent it was is not known):
            // a complete run's agent is complete, a stopped run's is not.
            let missing = stats.aggregates.planned.saturating_sub(recorded);
            stats.aggregates.planned = stats.aggregates.counts.trajectories + missing;
            stats
        }))
    }
}

/// Repetitions' statuses (sorted by repetition) as runs of consecutive repetitions with the
/// same status.
fn outcome_runs(outcomes: &[(u32, TrajectoryStatus)]) -> Vec<(u32, u32, TrajectoryStatus)> {
    let mut runs: Vec<(u32, u32, TrajectoryStatus)> = Vec::new();
    for &(repetition, status) in outcomes {
        match runs.last_mut() {
            Some((_, last, run_status))
                if *run_status == status && last.checked_add(1) == Some(repetition) =>
            {
                *last = repetition;
            }
            _ => runs.push((repetition, repetition, status)),
        }
    }
    runs
}

/// A suite, scenario, branch, agent, node or criterion name, interned: a run repeats the
/// same few names for every record, and keys of shared names cost no allocation.
pub type Name = Arc<str>;

/// Names interned: each distinct text allocated once, handed out as shared [`Name`]s.
/// foldhash: ten names are interned per trajectory, and hashing them with std's SipHash
/// was 2.4% of the reporter's instructions; names come from the suites, not an attacker.
#[derive(Debug, Default)]
pub(crate) struct Interner(HashSet<Name, foldhash::fast::RandomState>);

impl Interner {
    /// The name of `text`, if it was interned.
    pub(crate) fn find(&self, text: &str) -> Option<&Name> {
        self.0.get(text)
    }

    pub(crate) fn get(&mut self, text: &str) -> Name {
        if let Some(name) = self.0.get(text) {
            return Arc::clone(name);
        }
        let name: Name = text.into();
        self.0.insert(Arc::clone(&name));
        name
    }

    /// Each name's place among all of them in text order ([`NameRanks`]): the names are
    /// compared once here, in one sort, and never again by the lists ordered by them.
    pub(crate) fn ranks(&self) -> NameRanks {
        // Sorted by keys that compare byte-wise as the names do naturally (a sort of 100,000
        // names by `natural_cmp` itself took six times a byte-wise one), laid side by side in
        // one buffer, each name beside its range of it and its address.
        let mut keys: Vec<u8> = Vec::with_capacity(self.0.iter().map(|n| n.len() + 8).sum());
        let mut names: Vec<(std::ops::Range<usize>, &str, usize)> = self
            .0
            .iter()
            .map(|n| {
                let start = keys.len();
                natural_key(n, &mut keys);
                (start..keys.len(), &**n, address(n))
            })
            .collect();
        names.sort_unstable_by(|a, b| {
            keys[a.0.clone()]
                .cmp(&keys[b.0.clone()])
                .then_with(|| a.1.cmp(b.1))
        });
        NameRanks(
            names
                .into_iter()
                .enumerate()
                .map(|(rank, (_, _, at))| (at, u32::try_from(rank).unwrap_or(u32::MAX)))
                .collect(),
        )
    }
}

/// `a` against `b` as people order names: runs of digits by their value, so a matrix's
/// `add[a=2]` comes before `add[a=10]` and `t9` before `t10` (text order put every `1…`
/// first); the rest by its text. Names equal but for leading zeros (`a01`, `a1`) are
/// ordered by their text, so the order is total.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
    let zeros = |s: &[u8]| s.iter().take_while(|c| **c == b'0').count();
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    while let (Some(&cx), Some(&cy)) = (x.first(), y.first()) {
        if cx.is_ascii_digit() && cy.is_ascii_digit() {
            let (nx, ny) = (digits(x), digits(y));
            let (vx, vy) = (&x[zeros(&x[..nx])..nx], &y[zeros(&y[..ny])..ny]);
            let by_value = vx.len().cmp(&vy.len()).then_with(|| vx.cmp(vy));
            if by_value != Ordering::Equal {
                return by_value;
            }
            (x, y) = (&x[nx..], &y[ny..]);
        } else if cx != cy {
            // UTF-8's byte order is its characters' order.
            return cx.cmp(&cy);
        } else {
            (x, y) = (&x[1..], &y[1..]);
        }
    }
    x.len().cmp(&y.len()).then_with(|| a.cmp(b))
}

/// Appends to `key` the bytes of `name` that compare as [`natural_cmp`] compares names
/// (ties, names equal but for leading zeros, left to their text): each run of digits
/// becomes `0` (no other byte of a key is, so it meets another run or compares as any digit
/// would with the text beside it), its value's length in four bytes, then its digits
/// without leading zeros.
fn natural_key(name: &str, key: &mut Vec<u8>) {
    let mut rest = name.as_bytes();
    while !rest.is_empty() {
        let text = rest.iter().take_while(|c| !c.is_ascii_digit()).count();
        key.extend_from_slice(&rest[..text]);
        rest = &rest[text..];
        let run = rest.iter().take_while(|c| c.is_ascii_digit()).count();
        if run == 0 {
            break;
        }
        let zeros = rest[..run].iter().take_while(|c| **c == b'0').count();
        key.push(b'0');
        key.extend_from_slice(&u32::try_from(run - zeros).unwrap_or(u32::MAX).to_be_bytes());
        key.extend_from_slice(&rest[zeros..run]);
        rest = &rest[run..];
    }
}

/// Where an interned name's text is: the same for every copy of the name.
fn address(name: &Name) -> usize {
    Arc::as_ptr(name).cast::<u8>().addr()
}

/// An [`Interner`]'s names numbered in their texts' order. Rows keyed by names sort by
/// these numbers exactly as they would by the texts (the interner holds each text once),
/// with integers compared and no text read: the lists of a 100,000-scenario run, sorted
/// by their names, took most of the statistics' end (docs/performance.md,
/// "A dataset of 100,000 rows: its start and its end").
pub(crate) struct NameRanks(HashMap<usize, u32, foldhash::fast::FixedState>);

impl NameRanks {
    /// The rank of `name`, which the interner these ranks are from handed out.
    pub(crate) fn of(&self, name: &Name) -> u32 {
        let rank = self.0.get(&address(name)).copied();
        debug_assert!(rank.is_some(), "`{name}` is not a name of this interner");
        rank.unwrap_or(u32::MAX)
    }
}

/// Entries by their names, hashed rather than ordered: [`StatsBuilder::finish`] sorts every
/// list it writes. Ordered, each trajectory's five or six lookups compared its names with
/// those of a tree's worth of entries, each a pointer away: with 200 scenarios of 100
/// repetitions the recorder's thread spent 256 ms on 20,000 trajectories, 244 ms hashed
/// (`perf record`, four runs each). Hashed with a fixed seed; what is summed across
/// entries is summed by name.
///
/// The entries are kept in one list in the order they came and the hash table holds only
/// their places (an `IndexMap`): a table of the entries themselves (a check's is about 180
/// bytes) was mostly empty slots, twice over while it grew, and the statistics of a
/// 60,000-row dataset's run held 135 MB of which 70 MB were the checks' table growing.
type Accumulated<K, V> = indexmap::IndexMap<K, V, foldhash::fast::FixedState>;

type ScenarioKey = (Name, Name, Name);
type BranchKey = (Name, Name, Name, Name);
type NodeKey = (Name, Name, Name, Name);
type CriterionKey = (Name, Name, Name, Name, Option<u32>, Name);

// Everything kept per repetition is a set of repetition numbers in a compressed bitmap
// (a bit or less per repetition when they are dense, as a run's are), or a value per
// execution only where it differs from the first: a run of a million repetitions keeps a
// few hundred kilobytes here, not a map entry each.

/// A set of repetition numbers: one is held inline, more in a compressed bitmap, but those
/// below [`FEW`] as bits in place. Most scenarios run once (`repeat 1`, each instance of a
/// dataset): a bitmap's first value costs two allocations, and the five or six sets each
/// such scenario keeps were 13 MB of the statistics of a 20,000-row dataset's run. A
/// bitmap's value is three pointers away (its box, its containers, the container's values),
/// and with many scenarios each is rarely still in the cache: with 200 scenarios of 100
/// repetitions, inserting into them was a tenth of the recorder's thread (25 ms of 256).
#[derive(Default)]
enum Repetitions {
    #[default]
    None,
    One(u32),
    /// Every value below [`FEW`], as bits.
    Few([u64; 2]),
    Many(Box<RoaringBitmap>),
}

/// Repetition numbers below this are held as bits ([`Repetitions::Few`]).
const FEW: u32 = 128;

/// Whether `bits` holds `repetition` (below [`FEW`]).
fn has_bit(bits: &[u64; 2], repetition: u32) -> bool {
    bits[(repetition / 64) as usize] & (1 << (repetition % 64)) != 0
}

/// Adds `repetition` (below [`FEW`]) to `bits`.
fn set_bit(bits: &mut [u64; 2], repetition: u32) {
    bits[(repetition / 64) as usize] |= 1 << (repetition % 64);
}

/// The values `bits` holds, in ascending order.
fn bits_iter(bits: &[u64; 2]) -> impl Iterator<Item = u32> + '_ {
    (0..FEW).filter(move |&r| has_bit(bits, r))
}

impl Repetitions {
    fn insert(&mut self, repetition: u32) {
        match self {
            Repetitions::None => *self = Repetitions::One(repetition),
            Repetitions::One(one) if *one == repetition => {}
            Repetitions::One(one) if *one < FEW && repetition < FEW => {
                let mut bits = [0; 2];
                set_bit(&mut bits, *one);
                set_bit(&mut bits, repetition);
                *self = Repetitions::Few(bits);
            }
            Repetitions::One(one) => {
                let mut many = RoaringBitmap::new();
                many.insert(*one);
                many.insert(repetition);
                *self = Repetitions::Many(Box::new(many));
            }
            Repetitions::Few(bits) if repetition < FEW => set_bit(bits, repetition),
            Repetitions::Few(bits) => {
                let mut many = RoaringBitmap::new();
                for r in bits_iter(bits) {
                    many.insert(r);
                }
                many.insert(repetition);
                *self = Repetitions::Many(Box::new(many));
            }
            Repetitions::Many(many) => {
                many.insert(repetition);
            }
        }
    }

    fn contains(&self, repetition: u32) -> bool {
        match self {
            Repetitions::None => false,
            Repetitions::One(one) => *one == repetition,
            Repetitions::Few(bits) => repetition < FEW && has_bit(bits, repetition),
            Repetitions::Many(many) => many.contains(repetition),
        }
    }

    fn len(&self) -> u64 {
        match self {
            Repetitions::None => 0,
            Repetitions::One(_) => 1,
            Repetitions::Few(bits) => u64::from(bits[0].count_ones() + bits[1].count_ones()),
            Repetitions::Many(many) => many.len(),
        }
    }

    /// How many of these are not in `other`.
    fn difference_len(&self, other: &Repetitions) -> u64 {
        match (self, other) {
            (_, Repetitions::None) => self.len(),
            (Repetitions::None, _) => 0,
            (Repetitions::One(a), _) => u64::from(!other.contains(*a)),
            (Repetitions::Many(a), Repetitions::Many(b)) => a.difference_len(b),
            (Repetitions::Few(a), Repetitions::Few(b)) => {
                u64::from((a[0] & !b[0]).count_ones() + (a[1] & !b[1]).count_ones())
            }
            (Repetitions::Few(_) | Repetitions::Many(_), Repetitions::One(b)) => {
                self.len() - u64::from(self.contains(*b))
            }
            (Repetitions::Few(a), Repetitions::Many(_)) => {
                bits_iter(a).filter(|&r| !other.contains(r)).count() as u64
            }
            (Repetitions::Many(a), Repetitions::Few(b)) => {
                a.len() - bits_iter(b).filter(|&r| a.contains(r)).count() as u64
            }
        }
    }

    /// In ascending order.
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (one, few, many) = match self {
            Repetitions::None => (None, None, None),
            Repetitions::One(one) => (Some(*one), None, None),
            Repetitions::Few(bits) => (None, Some(bits_iter(bits)), None),
            Repetitions::Many(many) => (None, None, Some(many.iter())),
        };
        one.into_iter()
            .chain(few.into_iter().flatten())
            .chain(many.into_iter().flatten())
    }
}

#[derive(Default)]
struct BranchAcc {
    /// Repetitions by status: passed, failed, error, skipped, invalid.
    by_status: [Repetitions; 5],
    duration_ms: f64,
}

fn status_slot(status: TrajectoryStatus) -> usize {
    match status {
        TrajectoryStatus::Passed => 0,
        TrajectoryStatus::Failed => 1,
        TrajectoryStatus::Error => 2,
        TrajectoryStatus::Skipped => 3,
        TrajectoryStatus::Invalid => 4,
    }
}

const SLOT_STATUS: [TrajectoryStatus; 5] = [
    TrajectoryStatus::Passed,
    TrajectoryStatus::Failed,
    TrajectoryStatus::Error,
    TrajectoryStatus::Skipped,
    TrajectoryStatus::Invalid,
];

#[derive(Default)]
struct ScenarioAcc {
    counts: StatusCounts,
    /// Repetitions with a trajectory recorded.
    repetitions: Repetitions,
    /// Repetitions in which a branch ran (was neither skipped nor invalid).
    ran: Repetitions,
    /// Repetitions in which a branch that ran did not pass.
    not_passed: Repetitions,
    /// The (non-replayed) turns' latencies; the run's are all of these.
    latencies: Vec<f64>,
    /// Each with the trajectory it came from, `(repetition, trajectory)`: the least is kept,
    /// so the value does not depend on which trajectory finished first.
    skip_reason: Option<((u32, String), String)>,
    first_fault: Option<((u32, String), String)>,
}

/// `slot` holds `value` from `at` when it was empty or held a value from a later place.
fn keep_first<K: Ord>(slot: &mut Option<(K, String)>, at: K, value: impl FnOnce() -> String) {
    if slot.as_ref().is_none_or(|(held, _)| at < *held) {
        *slot = Some((at, value()));
    }
}

#[derive(Default)]
struct NodeAcc {
    parent: Option<String>,
    reached: u64,
    passed: u64,
    failed_here: u64,
    failed_above: u64,
    executions: Repetitions,
    executions_failed_here: Repetitions,
    /// The first and last (non-replayed) turn index each execution took: which node a
    /// checked turn belongs to.
    turns: TurnRanges,
}

/// The turn range of each execution of a node, kept as the first execution's range and the
/// executions whose range differs from it (scripted steps take the same turns every
/// repetition; `simulate` steps and agent forks may not).
#[derive(Default)]
struct TurnRanges {
    first: Option<(u32, u32)>,
    /// Executions that took turns of their own.
    with_turns: Repetitions,
    differing: HashMap<u32, (u32, u32)>,
}

impl TurnRanges {
    fn insert(&mut self, repetition: u32, range: (u32, u32)) {
        self.with_turns.insert(repetition);
        match self.first {
            None => self.first = Some(range),
            Some(first) if first == range => {
                self.differing.remove(&repetition);
            }
            Some(_) => {
                self.differing.insert(repetition, range);
            }
        }
    }

    fn get(&self, repetition: u32) -> Option<(u32, u32)> {
        if !self.with_turns.contains(repetition) {
            return None;
        }
        self.differing.get(&repetition).copied().or(self.first)
    }
}

struct CriterionAcc {
    kind: String,
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
    /// The detail of the failure (or error) of the lowest repetition, with it.
    first_failure: Option<(u32, String)>,
}

/// Accumulates [`RunStats`] from journal entries, in any order a run produces them (a
/// trajectory's nodes come before it).
#[derive(Default)]
pub struct StatsBuilder {
    info: Option<RunInfo>,
    summary: Option<RunSummary>,
    counts: StatusCounts,
    tokens: Option<u64>,
    scenarios: Accumulated<ScenarioKey, ScenarioAcc>,
    branches: Accumulated<BranchKey, BranchAcc>,
    nodes: Accumulated<NodeKey, NodeAcc>,
    criteria: Accumulated<CriterionKey, CriterionAcc>,
    names: Interner,
    /// Sum and count of the scores LLM judges gave (0–1).
    judge_scores: (f64, u64),
    /// The engine's own LLM cost (judges, simulated users), when a provider has prices.
    llm_cost: Option<f64>,
    /// The models under test's cost, when their provider has prices.
    agent_cost: Option<f64>,
}

impl StatsBuilder {
    pub fn push(&mut self, entry: &JournalEntry) {
        match entry {
            JournalEntry::RunStarted(info) => self.start(info),
            JournalEntry::Agent(_) | JournalEntry::Spans(_) => {}
            JournalEntry::Node(node) => self.add_node(node),
            JournalEntry::Trajectory(trajectory) => self.add_trajectory(trajectory),
            JournalEntry::RunFinished(summary) => self.summary = Some(summary.clone()),
        }
    }

    /// Takes the run's start: its id, suites and planned count. Its scenario list, the
    /// larger part of a dataset run's start (a row per instance), is not kept: nothing here
    /// reads it, and the report writer holds it already.
    pub fn start(&mut self, info: &RunInfo) {
        if self.info.is_none() {
            self.info = Some(RunInfo {
                run_id: info.run_id.clone(),
                started_at: info.started_at.clone(),
                trellis_version: info.trellis_version.clone(),
                suites: info.suites.clone(),
                jobs: info.jobs,
                planned_trajectories: info.planned_trajectories,
                scenarios: Vec::new(),
                rejudged_from: info.rejudged_from.clone(),
                strict: info.strict,
                resumed_at: info.resumed_at.clone(),
            });
            // Sized for the plan at once: grown by doubling, a map of 20,000 scenarios'
            // entries (a few hundred bytes each, kept in place) was copied fourteen times,
            // each copy holding the old table and the new one at once.
            let units: usize = info.scenarios.iter().map(|s| s.agents.len()).sum();
            let branches: usize = info
                .scenarios
                .iter()
                .map(|s| s.agents.len().saturating_mul(s.trajectories.len()))
                .sum();
            self.scenarios.reserve(units);
            self.branches.reserve(branches);
            // A node per trajectory at least (its leaf); shared ones are fewer.
            self.nodes.reserve(branches);
        }
    }

    fn name(&mut self, text: &str) -> Name {
        self.names.get(text)
    }

    pub fn add_node(&mut self, node: &NodeRecord) {
        let suite = self.name(&node.suite);
        let scenario_name = self.name(&node.scenario);
        let agent = self.name(&node.agent);
        let node_name = self.name(&node.node);
        let scenario = self
            .scenarios
            .entry((suite.clone(), scenario_name.clone(), agent.clone()))
            .or_default();
        let mut range: Option<(u32, u32)> = None;
        for turn in node.turns.iter().filter(|t| !t.replay) {
            scenario.latencies.push(turn.latency_ms);
            if let Some(tokens) = turn.total_tokens {
                self.tokens = Some(self.tokens.unwrap_or(0).saturating_add(tokens));
            }
            if let Some(cost) = turn.cost_usd {
                *self.agent_cost.get_or_insert(0.0) += cost;
            }
            range = Some(match range {
                None => (turn.turn_index, turn.turn_index),
                Some((low, high)) => (low.min(turn.turn_index), high.max(turn.turn_index)),
            });
        }
        let acc = self
            .nodes
            .entry((suite, scenario_name, agent, node_name))
            .or_default();
        if let Some(range) = range {
            acc.turns.insert(node.repetition, range);
        }
        acc.parent.clone_from(&node.parent);
        acc.executions.insert(node.repetition);
    }

    pub fn add_trajectory(&mut self, t: &TrajectoryRecord) {
        // The agent's judged checks only: a fidelity judge scores the simulated user, and an
        // attack judge how close the attacker came (higher is worse for the agent). A check
        // recorded skipped counted for nothing, though its judge may have answered; nor does
        // any check of an invalid trajectory (the simulated user broke character: it says
        // nothing of the agent, its checks before the break included, as pass rates leave
        // it out).
        let judged = if t.status == TrajectoryStatus::Invalid {
            &[][..]
        } else {
            &t.criteria[..]
        };
        for score in judged
            .iter()
            .filter(|c| c.kind != trellis_records::FIDELITY_KIND && c.kind != "attack")
            .filter(|c| matches!(c.status, CriterionStatus::Passed | CriterionStatus::Failed))
            .filter_map(|c| c.judge.as_ref().and_then(|j| j.score))
            .filter(|s| s.is_finite())
        {
            self.judge_scores.0 += score;
            self.judge_scores.1 += 1;
        }
        if let Some(cost) = t.llm.as_ref().and_then(|u| u.cost) {
            *self.llm_cost.get_or_insert(0.0) += cost;
        }
        let suite = self.name(&t.suite);
        let scenario_name = self.name(&t.scenario);
        let trajectory = self.name(&t.trajectory);
        let agent = self.name(&t.agent);
        self.counts.add(t.status);
        let scenario = self
            .scenarios
            .entry((suite.clone(), scenario_name.clone(), agent.clone()))
            .or_default();
        scenario.counts.add(t.status);
        let at = || (t.repetition, t.trajectory.clone());
        if let (TrajectoryStatus::Skipped, Some(reason)) = (t.status, &t.skip_reason) {
            keep_first(&mut scenario.skip_reason, at(), || reason.clone());
        }
        if let (TrajectoryStatus::Error, Some(f)) = (t.status, &t.fault) {
            keep_first(&mut scenario.first_fault, at(), || {
                format!("{}: {}", f.category.as_str(), f.message)
            });
        }
        scenario.repetitions.insert(t.repetition);
        if t.status.ran() {
            scenario.ran.insert(t.repetition);
            if t.status != TrajectoryStatus::Passed {
                scenario.not_passed.insert(t.repetition);
            }
        }
        let branch = self
            .branches
            .entry((
                suite.clone(),
                scenario_name.clone(),
                trajectory.clone(),
                agent.clone(),
            ))
            .or_default();
        branch.by_status[status_slot(t.status)].insert(t.repetition);
        if t.duration_ms.is_finite() {
            branch.duration_ms += t.duration_ms;
        }

        for c in &t.criteria {
            let criterion = self.name(&c.criterion);
            let acc = self
                .criteria
                .entry((
                    suite.clone(),
                    scenario_name.clone(),
                    trajectory.clone(),
                    agent.clone(),
                    c.turn_index,
                    criterion,
                ))
                .or_insert_with(|| CriterionAcc {
                    kind: c.kind.clone(),
                    passed: 0,
                    failed: 0,
                    errors: 0,
                    skipped: 0,
                    first_failure: None,
                });
            match c.status {
                CriterionStatus::Passed => acc.passed += 1,
                CriterionStatus::Skipped => acc.skipped += 1,
                // An evaluator that failed (a judge's garbage) never passes: counted apart
                // from the failures, its detail said when no failure came first.
                CriterionStatus::Failed | CriterionStatus::Error => {
                    if c.status == CriterionStatus::Failed {
                        acc.failed += 1;
                    } else {
                        acc.errors += 1;
                    }
                    if let Some(detail) = &c.detail {
                        keep_first(&mut acc.first_failure, t.repetition, || detail.clone());
                    }
                }
            }
        }

        // Skipped and invalid runs checked nothing: they neither got through a node nor
        // failed at one (they were counted as passing every node they reached), as the
        // report's tree leaves them out (`html::outline`).
        if !t.status.ran() {
            return;
        }
        let nodes: Vec<Name> = t.nodes.iter().map(|n| self.name(n)).collect();
        let failed_at = self.failure_position(t, (&suite, &scenario_name, &agent), &nodes);
        for (position, node) in nodes.into_iter().enumerate() {
            let acc = self
                .nodes
                .entry((suite.clone(), scenario_name.clone(), agent.clone(), node))
                .or_default();
            acc.reached += 1;
            match failed_at {
                Some(at) if position == at => {
                    acc.failed_here += 1;
                    acc.executions_failed_here.insert(t.repetition);
                }
                Some(at) if position > at => acc.failed_above += 1,
                _ => acc.passed += 1,
            }
        }
    }

    /// The position in `t.nodes` of the node where `t` first went wrong: the node of its
    /// earliest failed check (a trajectory-level check belongs to the last node), or the
    /// last node reached for a fault or a stop. `None` when it passed or never ran.
    fn failure_position(
        &self,
        t: &TrajectoryRecord,
        (suite, scenario, agent): (&Name, &Name, &Name),
        nodes: &[Name],
    ) -> Option<usize> {
        failure_position(t, nodes.len(), |turn| {
            nodes.iter().position(|node| {
                self.nodes
                    .get(&(suite.clone(), scenario.clone(), agent.clone(), node.clone()))
                    .and_then(|acc| acc.turns.get(t.repetition))
                    .is_some_and(|(low, high)| (low..=high).contains(&turn))
            })
        })
    }

    pub fn finish(self) -> RunStats {
        let ranks = self.names.ranks();
        // Rows come in the order of the run's suites as given, then by their names; a suite
        // the run did not list comes last.
        let mut suite_places: HashMap<u32, u32, foldhash::fast::FixedState> = HashMap::default();
        for (place, suite) in self
            .info
            .iter()
            .flat_map(|info| info.suites.iter())
            .enumerate()
        {
            if let Some(name) = self.names.find(suite) {
                let place = u32::try_from(place).unwrap_or(u32::MAX);
                suite_places.entry(ranks.of(name)).or_insert(place);
            }
        }
        // What every row's key starts with: its suite's place, then its suite's and its
        // scenario's names.
        let key_start = |suite: &Name, scenario: &Name| {
            let suite = ranks.of(suite);
            let place = suite_places.get(&suite).copied().unwrap_or(u32::MAX);
            (place, suite, ranks.of(scenario))
        };
        let aggregates = RunAggregates {
            counts: self.counts,
            planned: self.info.as_ref().map_or(0, |i| i.planned_trajectories),
            finished: self.summary.is_some(),
            interrupted: self.summary.as_ref().is_some_and(|s| s.interrupted),
            pass_rate: self.counts.pass_rate(),
            pass_rate_interval: wilson_interval(self.counts.passed, self.counts.ran(), CONFIDENCE),
            // Every turn is in one scenario's list: the run's are all of them, gathered
            // only now (into exactly their room: a million turns take 8 MB).
            latency: Latency::of({
                let total = self.scenarios.values().map(|s| s.latencies.len()).sum();
                let mut all = Vec::with_capacity(total);
                // By scenario name, not in the map's order: the mean is summed in this order,
                // and the same records give it to the last bit whatever the hashing.
                let mut by_name: Vec<_> = self
                    .scenarios
                    .iter()
                    .map(|((suite, scenario, agent), s)| {
                        ((ranks.of(suite), ranks.of(scenario), ranks.of(agent)), s)
                    })
                    .collect();
                by_name.sort_unstable_by_key(|a| a.0);
                for (_, s) in by_name {
                    all.extend_from_slice(&s.latencies);
                }
                all
            }),
            total_tokens: self.tokens,
            cost_usd: self.llm_cost,
            agent_cost_usd: self.agent_cost,
            mean_score: (self.judge_scores.1 > 0)
                .then(|| self.judge_scores.0 / self.judge_scores.1 as f64 * 100.0),
            duration_ms: self.summary.as_ref().map(|s| s.duration_ms),
            llm_roles: self
                .summary
                .as_ref()
                .map(|s| s.llm_roles.clone())
                .unwrap_or_default(),
            connections_redone: self
                .summary
                .as_ref()
                .map(|s| s.connections_redone.clone())
                .unwrap_or_default(),
            requests_resent: self
                .summary
                .as_ref()
                .map(|s| s.requests_resent.clone())
                .unwrap_or_default(),
        };

        // Most rows share their counts (a dataset's instances: one sample, passed): the
        // interval and pass@k of each count computed once, an inverse normal and a few
        // binomials that were 5% of a 20,000-scenario run's statistics.
        let mut repeats_of: HashMap<(u64, u64, u64), Repeats, foldhash::fast::FixedState> =
            HashMap::default();
        let mut repeats = |ran: u64, passed: u64, skipped: u64| {
            repeats_of
                .entry((ran, passed, skipped))
                .or_insert_with(|| Repeats::from_counts(ran, passed, skipped))
                .clone()
        };
        let mut keys = Vec::with_capacity(self.scenarios.len());
        let scenarios: Vec<ScenarioStats> = self
            .scenarios
            .into_iter()
            .map(|((suite, scenario, agent), acc)| {
                keys.push((key_start(&suite, &scenario), ranks.of(&agent)));
                let ran = acc.ran.len();
                let passed = acc.ran.difference_len(&acc.not_passed);
                let skipped = acc.repetitions.difference_len(&acc.ran);
                ScenarioStats {
                    suite,
                    scenario,
                    agent,
                    counts: acc.counts,
                    repeats: repeats(ran, passed, skipped),
                    latency: Latency::of(acc.latencies),
                    skip_reason: acc.skip_reason.map(|(_, reason)| reason),
                    first_fault: acc.first_fault.map(|(_, fault)| fault),
                }
            })
            .collect();
        let scenarios = in_key_order(scenarios, keys);

        let mut keys = Vec::with_capacity(self.branches.len());
        let branches: Vec<BranchStats> = self
            .branches
            .into_iter()
            .map(|((suite, scenario, trajectory, agent), acc)| {
                keys.push((
                    key_start(&suite, &scenario),
                    ranks.of(&trajectory),
                    ranks.of(&agent),
                ));
                let [passed, failed, errors, skipped, invalid] =
                    acc.by_status.each_ref().map(|r| r.len());
                let ran = passed + failed + errors;
                // An invalid trajectory says nothing about the agent: left out like a
                // skipped one.
                let skipped = skipped + invalid;
                let mut outcomes: Vec<(u32, TrajectoryStatus)> = acc
                    .by_status
                    .iter()
                    .zip(SLOT_STATUS)
                    .flat_map(|(reps, status)| reps.iter().map(move |r| (r, status)))
                    .collect();
                outcomes.sort_unstable_by_key(|&(repetition, status)| {
                    (repetition, status_slot(status))
                });
                BranchStats {
                    suite,
                    scenario,
                    trajectory,
                    agent,
                    repeats: repeats(ran, passed, skipped),
                    mean_duration_ms: (ran > 0).then(|| acc.duration_ms / ran as f64),
                    outcome_runs: outcome_runs(&outcomes),
                }
            })
            .collect();
        let branches = in_key_order(branches, keys);

        let mut keys = Vec::with_capacity(self.nodes.len());
        let nodes: Vec<NodeStats> = self
            .nodes
            .into_iter()
            .map(|((suite, scenario, agent, node), acc)| {
                keys.push((
                    key_start(&suite, &scenario),
                    ranks.of(&agent),
                    ranks.of(&node),
                ));
                NodeStats {
                    suite,
                    scenario,
                    agent,
                    node,
                    parent: acc.parent,
                    reached: acc.reached,
                    passed: acc.passed,
                    failed_here: acc.failed_here,
                    failed_above: acc.failed_above,
                    executions: acc.executions.len(),
                    executions_failed_here: acc.executions_failed_here.len(),
                }
            })
            .collect();
        // Parents before children: node ids are paths from the root, so by name is
        // depth-first.
        let nodes = in_key_order(nodes, keys);

        let mut keys = Vec::with_capacity(self.criteria.len());
        let criteria: Vec<CriterionStats> = self
            .criteria
            .into_iter()
            .map(
                |((suite, scenario, trajectory, agent, turn_index, criterion), acc)| {
                    // A trajectory's own criteria (no turn) after its turns'.
                    keys.push((
                        key_start(&suite, &scenario),
                        (ranks.of(&trajectory), ranks.of(&agent)),
                        turn_index.map_or(u64::MAX, u64::from),
                        ranks.of(&criterion),
                    ));
                    CriterionStats {
                        suite,
                        scenario,
                        trajectory,
                        agent,
                        turn_index,
                        criterion,
                        kind: acc.kind,
                        passed: acc.passed,
                        failed: acc.failed,
                        errors: acc.errors,
                        skipped: acc.skipped,
                        first_failure: acc.first_failure.map(|(_, detail)| detail),
                    }
                },
            )
            .collect();
        let criteria = in_key_order(criteria, keys);

        let info = self.info.unwrap_or_default();
        RunStats {
            run_id: info.run_id,
            started_at: info.started_at,
            suites: info.suites,
            strict: info.strict,
            aggregates,
            scenarios,
            branches,
            nodes,
            criteria,
        }
    }
}

/// `rows` in the order of their `keys`, one key per row and no two equal (the rows are the
/// maps' entries, keyed by [`NameRanks`]), so the order is the same however the maps
/// hashed them.
///
/// The keys are sorted with each row's index, not the rows: a row is a few hundred bytes,
/// and `sort_by` moved them at every step of its merges. A key is a few integers in one
/// list, compared without reading a row or a name: sorted by comparing the rows' names, the
/// four lists of 20,000 scenarios of one trajectory were 350 M instructions (more than the
/// run's walk of its 20,000 turns) when the rows moved, and most of the statistics' end of
/// 100,000 when only indices did. The rows are then put in that order where they are, by
/// swaps: gathered into a new list, they were held twice (the largest of the four lists was
/// 18 MB of the 128 MB a 20,000-scenario run's heap held at its end).
pub(crate) fn in_key_order<T, K: Ord>(mut rows: Vec<T>, keys: Vec<K>) -> Vec<T> {
    debug_assert_eq!(rows.len(), keys.len());
    let mut order: Vec<(K, usize)> = keys.into_iter().zip(0..).collect();
    order.sort_unstable();
    // Where each row goes; each swap puts one row in its place for good.
    let mut place = vec![0; order.len()];
    for (to, (_, from)) in order.into_iter().enumerate() {
        place[from] = to;
    }
    for at in 0..rows.len() {
        while place[at] != at {
            let to = place[at];
            rows.swap(at, to);
            place.swap(at, to);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_ordered_as_people_order_them() {
        let mut names = vec![
            "add[a=10]",
            "add[a=1]",
            "add[a=2]",
            "t10",
            "t9",
            "t09",
            "b",
            "a",
            "é",
            "z1x",
            "z1",
            "add[a=1,b=20]",
            "add[a=1,b=3]",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "a",
                "add[a=1,b=3]",
                "add[a=1,b=20]",
                "add[a=1]",
                "add[a=2]",
                "add[a=10]",
                "b",
                "t09",
                "t9",
                "t10",
                "z1",
                "z1x",
                "é"
            ]
        );
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-4
    }

    /// Rows put in their keys' order where they are come out as a sort of the rows by
    /// those keys puts them: every permutation's cycles, from none to many rows.
    #[test]
    fn rows_are_put_in_order_as_a_sort_orders_them() {
        let mut rng = fastrand::Rng::with_seed(7);
        for n in [0usize, 1, 2, 3, 10, 257, 1000] {
            let rows: Vec<(usize, String)> = (0..n)
                .map(|i| (rng.usize(0..4), format!("{:05}-{i}", rng.u32(0..500))))
                .collect();
            let mut expected = rows.clone();
            expected.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            let keys = rows.iter().map(|r| (r.0, r.1.clone())).collect();
            let ordered = in_key_order(rows, keys);
            assert_eq!(ordered, expected, "{n} rows");
        }
    }

    /// An interner's ranks order its names as their texts do (bytes, not letters: `A`
    /// before `a`, `e` before `é`, a prefix before what it starts), for every copy of a name.
    #[test]
    fn ranks_order_names_as_people_order_them() {
        let texts = [
            "b",
            "a\0b",
            "",
            "é",
            "e",
            "ask[10]",
            "ask[9]",
            "ask[1]",
            "A",
            "a",
            "ask[1]x",
            "a01",
            "a1",
            "a1b",
            "a01c",
            "x0",
            "x",
            "x00",
            "0",
            "/",
            ":",
            "a99999999999999999999",
            "a100000000000000000000",
        ];
        let mut names = Interner::default();
        let first: Vec<Name> = texts.iter().map(|t| names.get(t)).collect();
        let ranks = names.ranks();
        let mut by_rank = texts.to_vec();
        by_rank.sort_by_key(|t| ranks.of(&names.get(t)));
        let mut by_text = texts.to_vec();
        by_text.sort_unstable_by(|a, b| natural_cmp(a, b));
        assert_eq!(by_rank, by_text);
        let at = |t: &str| by_rank.iter().position(|x| *x == t);
        assert!(at("ask[9]") < at("ask[10]"), "{by_rank:?}");
        let distinct: std::collections::BTreeSet<u32> = first.iter().map(|n| ranks.of(n)).collect();
        assert_eq!(distinct.len(), texts.len());
    }

    /// The inline set answers as the bitmap it stands for, from none to many values.
    #[test]
    fn repetitions_answer_as_a_bitmap_does() {
        let mut rng = fastrand::Rng::with_seed(21);
        for round in 0..400 {
            let (mut a, mut b) = (Repetitions::default(), Repetitions::default());
            let (mut ra, mut rb) = (RoaringBitmap::new(), RoaringBitmap::new());
            // Few values most rounds, so every pairing of none, one, bits and a bitmap is
            // met: values below 128 are held as bits, one past it makes a bitmap.
            let span = match round % 4 {
                0 => 70_000,
                1 => 130,
                2 => 128,
                _ => 4,
            };
            let count = if round % 4 == 2 { 0..60 } else { 0..4 };
            for _ in 0..rng.usize(count.clone()) {
                let r = rng.u32(0..span);
                a.insert(r);
                ra.insert(r);
            }
            for _ in 0..rng.usize(count) {
                let r = rng.u32(0..span);
                b.insert(r);
                rb.insert(r);
            }
            assert_eq!(a.len(), ra.len());
            assert_eq!(a.iter().collect::<Vec<_>>(), ra.iter().collect::<Vec<_>>());
            assert_eq!(
                a.difference_len(&b),
                ra.difference_len(&rb),
                "round {round}"
            );
            assert_eq!(
                b.difference_len(&a),
                rb.difference_len(&ra),
                "round {round}"
            );
            for r in 0..span.min(200) {
                assert_eq!(a.contains(r), ra.contains(r));
            }
        }
    }

    #[test]
    fn shares_near_the_ends_never_read_as_the_ends() {
        assert_eq!(percent_label(1.0), "100");
        assert_eq!(percent_label(0.0), "0");
        assert_eq!(percent_label(0.67), "67");
        assert_eq!(percent_label(2999.0 / 3000.0), "99.97");
        let label = |successes, samples| {
            wilson_interval(successes, samples, CONFIDENCE)
                .unwrap()
                .label()
        };
        // Bounds that round to one whole percent read apart.
        assert_eq!(label(9_950, 10_000), "99.3–99.6");
        assert_eq!(label(5, 10), "24–76");
        assert_eq!(label(10, 10), "72–100");
        assert_eq!(label(99_500, 100_000), "99.45–99.54");
        assert_eq!(label(0, 10_000), "0–0.04");
        assert_eq!(percent_label(0.998_7), "99.9");
        assert_eq!(percent_label(0.001_3), "0.1");
        assert_eq!(percent_label(0.000_001), "0.0001");
    }

    #[test]
    fn wilson_matches_published_values() {
        // Newcombe (1998), table I: 81/263 → 0.2553–0.3662; 15/148 → 0.0624–0.1605.
        let i = wilson_interval(81, 263, 0.95).unwrap();
        assert!(close(i.low, 0.2553) && close(i.high, 0.3662), "{i:?}");
        let i = wilson_interval(15, 148, 0.95).unwrap();
        assert!(close(i.low, 0.0624) && close(i.high, 0.1605), "{i:?}");
        // Every one passing: the upper bound is 1 exactly, for any count.
        for n in 1..=40 {
            assert_eq!(wilson_interval(n, n, 0.95).unwrap().high, 1.0, "{n}");
            assert_eq!(wilson_interval(0, n, 0.95).unwrap().low, 0.0, "{n}");
        }
        // 0/10 and 10/10 stay within [0, 1].
        let i = wilson_interval(0, 10, 0.95).unwrap();
        assert!(close(i.low, 0.0) && close(i.high, 0.2775), "{i:?}");
        let i = wilson_interval(10, 10, 0.95).unwrap();
        assert!(close(i.low, 0.7225) && close(i.high, 1.0), "{i:?}");
        assert_eq!(wilson_interval(0, 0, 0.95), None);
        assert_eq!(wilson_interval(3, 2, 0.95), None);
    }

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        // 1 - C(n-c,k)/C(n,k): n=5, c=2, k=2 → 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!(close(pass_at_k(5, 2, 2).unwrap(), 0.7));
        // k=1 is the pass rate.
        assert!(close(pass_at_k(10, 3, 1).unwrap(), 0.3));
        // n=10, c=3, k=5 → 1 - C(7,5)/C(10,5) = 1 - 21/252.
        assert!(close(pass_at_k(10, 3, 5).unwrap(), 1.0 - 21.0 / 252.0));
        // Fewer failures than k: some sample of k always passes.
        assert_eq!(pass_at_k(5, 4, 2), Some(1.0));
        assert_eq!(pass_at_k(5, 0, 3), Some(0.0));
        assert_eq!(pass_at_k(3, 1, 4), None);
        assert_eq!(pass_at_k(3, 1, 0), None);
    }

    #[test]
    fn pass_hat_k_is_the_unbiased_estimator() {
        // C(c,k)/C(n,k): n=5, c=3, k=2 → 3/10.
        assert!(close(pass_hat_k(5, 3, 2).unwrap(), 0.3));
        // n=10, c=8, k=3 → C(8,3)/C(10,3) = 56/120.
        assert!(close(pass_hat_k(10, 8, 3).unwrap(), 56.0 / 120.0));
        assert_eq!(pass_hat_k(4, 4, 4), Some(1.0));
        assert_eq!(pass_hat_k(4, 1, 2), Some(0.0));
        assert_eq!(pass_hat_k(2, 1, 3), None);
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let values = [1.0, 2.0, 3.0, 4.0, 10.0];
        assert_eq!(quantile(&values, 0.5), Some(3.0));
        // numpy.percentile([1,2,3,4,10], 95) = 8.8
        assert!(close(quantile(&values, 0.95).unwrap(), 8.8));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[7.0], 0.95), Some(7.0));
    }

    #[test]
    fn quantiles_of_unsorted_values_are_those_of_the_sorted_values() {
        // Ties, one value, two values and a spread of sizes, each in a scrambled order.
        let mut cases: Vec<Vec<f64>> = vec![vec![7.0], vec![2.0, 1.0], vec![3.0, 3.0, 1.0, 3.0]];
        for n in [5_usize, 20, 21, 100, 1_001] {
            cases.push(
                (0..n)
                    .map(|i| ((i * 7_919) % 1_009) as f64 / 8.0 + (i % 3) as f64)
                    .collect(),
            );
        }
        for values in cases {
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for q in [0.0, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0] {
                let mut scrambled = values.clone();
                assert_eq!(
                    quantile_of_unsorted(&mut scrambled, q),
                    quantile(&sorted, q),
                    "q {q} of {} values",
                    values.len()
                );
            }
        }
        assert_eq!(quantile_of_unsorted(&mut [], 0.5), None);
        let latency = Latency::of(vec![4.0, f64::NAN, 1.0, 10.0, 2.0, 3.0]);
        assert_eq!(
            (
                latency.turns,
                latency.p50_ms,
                latency.max_ms,
                latency.mean_ms
            ),
            (5, Some(3.0), Some(10.0), Some(4.0))
        );
        assert!(close(latency.p95_ms.unwrap(), 8.8));
    }

    #[test]
    fn repetitions_of_equal_status_are_one_run() {
        use TrajectoryStatus::*;
        assert_eq!(outcome_runs(&[]), []);
        let all: Vec<_> = (0..50_000).map(|r| (r, Passed)).collect();
        assert_eq!(outcome_runs(&all), [(0, 49_999, Passed)]);
        let mixed = [
            (0, Passed),
            (1, Passed),
            (2, Failed),
            (3, Passed),
            (5, Passed),
            (6, Skipped),
        ];
        assert_eq!(
            outcome_runs(&mixed),
            [
                (0, 1, Passed),
                (2, 2, Failed),
                (3, 3, Passed),
                (5, 5, Passed),
                (6, 6, Skipped)
            ]
        );
    }

    #[test]
    fn repeats_flag_flaky_branches_and_list_k_up_to_n() {
        let r = Repeats::from_counts(4, 2, 1);
        assert!(r.flaky);
        assert_eq!(r.at_k.iter().map(|a| a.k).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(!Repeats::from_counts(3, 3, 0).flaky);
        assert!(!Repeats::from_counts(3, 0, 0).flaky);
        assert!(Repeats::from_counts(0, 0, 2).at_k.is_empty());
    }

    use trellis_records::{CriterionRecord, TurnRecord};

    fn node(rep: u32, id: &str, parent: Option<&str>, turns: &[u32]) -> JournalEntry {
        JournalEntry::Node(NodeRecord {
            suite: "s".into(),
            scenario: "c".into(),
            agent: "a".into(),
            repetition: rep,
            node: id.into(),
            parent: parent.map(str::to_owned),
            turns: turns
                .iter()
                .map(|&i| {
                    Arc::new(TurnRecord {
                        turn_index: i,
                        latency_ms: f64::from(i + 1) * 10.0,
                        ..TurnRecord::default()
                    })
                })
                .collect(),
        })
    }

    fn trajectory(rep: u32, name: &str, nodes: &[&str], failed_turn: Option<u32>) -> JournalEntry {
        JournalEntry::Trajectory(Box::new(TrajectoryRecord {
            llm: None,
            attack: None,
            suite: "s".into(),
            scenario: "c".into(),
            trajectory: name.into(),
            agent: "a".into(),
            protocol: "connexity".into(),
            repetition: rep,
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            status: if failed_turn.is_some() {
                TrajectoryStatus::Failed
            } else {
                TrajectoryStatus::Passed
            },
            turns: 2,
            duration_ms: 5.0,
            fault: None,
            skip_reason: None,
            criteria: vec![CriterionRecord {
                judge: None,
                turn_index: failed_turn.or(Some(1)),
                criterion: "reply contains=\"x\"".into(),
                kind: "reply".into(),
                status: if failed_turn.is_some() {
                    CriterionStatus::Failed
                } else {
                    CriterionStatus::Passed
                },
                detail: None,
            }],
            tags: vec![],
            agent_branches: vec![],
            awaiting_human: None,
            sandbox_state: None,
            captures: Default::default(),
        }))
    }

    #[test]
    fn mean_score_is_the_agents_judged_checks_only() {
        let judged = |kind: &str, score: f64| CriterionRecord {
            judge: Some(Box::new(trellis_records::JudgeVerdict {
                score: Some(score),
                ..Default::default()
            })),
            turn_index: None,
            criterion: kind.into(),
            kind: kind.into(),
            status: CriterionStatus::Passed,
            detail: None,
        };
        let mut entry = trajectory(0, "main", &["start"], None);
        if let JournalEntry::Trajectory(t) = &mut entry {
            t.criteria = vec![
                judged("judge", 0.9),
                judged("outcome", 0.5),
                // The simulated user's judgement and an attacker's progress are not the
                // agent's score.
                judged("fidelity", 0.0),
                judged("attack", 1.0),
                // A check of an invalid trajectory, recorded skipped though its judge
                // answered, counted for nothing.
                CriterionRecord {
                    status: CriterionStatus::Skipped,
                    ..judged("judge", 0.1)
                },
            ];
        }
        let mut b = StatsBuilder::default();
        b.push(&entry);
        // An invalid trajectory's checks, those its judge passed before the simulated user
        // broke character included, say nothing of the agent.
        let mut invalid = trajectory(1, "main", &["start"], None);
        if let JournalEntry::Trajectory(t) = &mut invalid {
            t.status = TrajectoryStatus::Invalid;
            t.criteria = vec![judged("judge", 0.0)];
        }
        b.push(&invalid);
        let score = b.finish().aggregates.mean_score.unwrap();
        assert!((score - 70.0).abs() < 1e-9, "{score}");
        // All of a run's trajectories invalid: no score at all, not the invalid ones'.
        let mut b = StatsBuilder::default();
        b.push(&invalid);
        assert_eq!(b.finish().aggregates.mean_score, None);
    }

    /// A check that could not decide (its judge down) is counted as an error, apart from
    /// the failures, as `criteria.parquet` says; it still counts against the pass rate.
    #[test]
    fn a_check_that_erred_is_counted_apart_from_the_failures() {
        let mut b = StatsBuilder::default();
        for (rep, status, detail) in [
            (0, CriterionStatus::Error, "judge unavailable: HTTP 500"),
            (1, CriterionStatus::Failed, "said no"),
            (2, CriterionStatus::Passed, ""),
        ] {
            let mut entry = trajectory(rep, "main", &["start"], None);
            if let JournalEntry::Trajectory(t) = &mut entry {
                t.criteria[0].status = status;
                t.criteria[0].detail = Some(detail.to_owned());
            }
            b.push(&entry);
        }
        let stats = b.finish();
        let c = &stats.criteria[0];
        assert_eq!((c.passed, c.failed, c.errors, c.skipped), (1, 1, 1, 0));
        assert_eq!(c.ran(), 3);
        assert_eq!(
            c.first_failure.as_deref(),
            Some("judge unavailable: HTTP 500")
        );
        assert!((c.pass_rate().unwrap() - 1.0 / 3.0).abs() < 1e-9);
        // A summary written before `errors` existed still reads.
        let mut old = serde_json::to_value(c).unwrap();
        old.as_object_mut().unwrap().remove("errors");
        let read: CriterionStats = serde_json::from_value(old).unwrap();
        assert_eq!(read.errors, 0);
    }

    /// What a scenario's first fault, skip reason and a check's first failure say does not
    /// depend on which trajectory finished first: the least `(repetition, trajectory)` wins.
    #[test]
    fn the_first_fault_is_the_same_whatever_order_trajectories_finish_in() {
        let ended = |rep: u32, name: &str, status: TrajectoryStatus, why: &str| {
            let mut entry = trajectory(rep, name, &["start"], Some(1));
            if let JournalEntry::Trajectory(t) = &mut entry {
                t.status = status;
                match status {
                    TrajectoryStatus::Skipped => t.skip_reason = Some(why.to_owned()),
                    _ => {
                        t.fault = Some(trellis_records::Fault::new(
                            trellis_records::FaultCategory::Transport,
                            why,
                        ))
                    }
                }
                t.criteria[0].detail = Some(format!("{why} detail"));
            }
            entry
        };
        let entries = [
            ended(0, "second", TrajectoryStatus::Error, "second broke"),
            ended(0, "first", TrajectoryStatus::Error, "first broke"),
            ended(1, "first", TrajectoryStatus::Skipped, "later skip"),
            ended(0, "third", TrajectoryStatus::Skipped, "third skipped"),
        ];
        let stats = |order: &[usize]| {
            let mut b = StatsBuilder::default();
            for &i in order {
                b.push(&entries[i]);
            }
            b.finish()
        };
        let forward = stats(&[0, 1, 2, 3]);
        assert_eq!(forward, stats(&[3, 2, 1, 0]));
        assert_eq!(forward, stats(&[2, 0, 3, 1]));
        let scenario = &forward.scenarios[0];
        assert_eq!(
            scenario.first_fault.as_deref(),
            Some("transport: first broke")
        );
        assert_eq!(scenario.skip_reason.as_deref(), Some("third skipped"));
    }

    #[test]
    fn a_failure_is_placed_by_the_turns_its_own_repetition_took() {
        // A simulated conversation takes a different number of turns each repetition: the
        // node of a failed turn is decided by that repetition's ranges.
        let mut b = StatsBuilder::default();
        b.push(&node(0, "start", None, &[0, 1]));
        b.push(&node(0, "then", Some("start"), &[2]));
        b.push(&trajectory(0, "main", &["start", "then"], Some(2)));
        b.push(&node(1, "start", None, &[0, 1, 2, 3]));
        b.push(&node(1, "then", Some("start"), &[4]));
        b.push(&trajectory(1, "main", &["start", "then"], Some(2)));
        b.push(&node(2, "start", None, &[0, 1]));
        b.push(&node(2, "then", Some("start"), &[2]));
        b.push(&trajectory(2, "main", &["start", "then"], Some(2)));
        let stats = b.finish();
        let node = |id: &str| stats.nodes.iter().find(|n| &*n.node == id).unwrap().clone();
        assert_eq!(
            node("start").failed_here,
            1,
            "repetition 1 failed in `start`"
        );
        assert_eq!(
            node("then").failed_here,
            2,
            "repetitions 0 and 2 failed in `then`"
        );
        assert_eq!(node("start").executions, 3);
        let main = &stats.branches[0];
        assert_eq!(main.outcome_runs, [(0, 2, TrajectoryStatus::Failed)]);
        assert_eq!((main.repeats.samples, main.repeats.passed), (3, 0));
    }

    /// A skipped or invalid run checked nothing: it neither passed a node nor failed at
    /// one (it was counted as having passed every node it reached, a 100% node of runs
    /// that checked nothing), as the report's tree leaves it out.
    #[test]
    fn skipped_and_invalid_runs_pass_no_node() {
        let mut b = StatsBuilder::default();
        b.push(&node(0, "start", None, &[0]));
        b.push(&trajectory(0, "main", &["start"], None));
        for (rep, status) in [
            (1, TrajectoryStatus::Skipped),
            (2, TrajectoryStatus::Invalid),
        ] {
            b.push(&node(rep, "start", None, &[0]));
            let JournalEntry::Trajectory(mut t) = trajectory(rep, "main", &["start"], None) else {
                unreachable!()
            };
            t.status = status;
            b.push(&JournalEntry::Trajectory(t));
        }
        let stats = b.finish();
        let start = stats.nodes.iter().find(|n| &*n.node == "start").unwrap();
        assert_eq!(
            (
                start.reached,
                start.passed,
                start.failed_here,
                start.failed_above
            ),
            (1, 1, 0, 0)
        );
    }

    #[test]
    fn a_failure_in_a_shared_prefix_is_counted_at_the_prefix() {
        let mut b = StatsBuilder::default();
        // Repetition 0: turn 0 (in the shared `start`) fails for both branches.
        b.push(&node(0, "start", None, &[0]));
        b.push(&node(0, "yes", Some("start"), &[1]));
        b.push(&node(0, "no", Some("start"), &[1]));
        b.push(&trajectory(0, "yes", &["start", "yes"], Some(0)));
        b.push(&trajectory(0, "no", &["start", "no"], Some(0)));
        // Repetition 1: only `yes` fails, on its own turn.
        b.push(&node(1, "start", None, &[0]));
        b.push(&node(1, "yes", Some("start"), &[1]));
        b.push(&node(1, "no", Some("start"), &[1]));
        b.push(&trajectory(1, "yes", &["start", "yes"], Some(1)));
        b.push(&trajectory(1, "no", &["start", "no"], None));
        let stats = b.finish();
        let node = |id: &str| stats.nodes.iter().find(|n| &*n.node == id).unwrap().clone();
        let start = node("start");
        assert_eq!(
            (
                start.reached,
                start.passed,
                start.failed_here,
                start.failed_above
            ),
            (4, 2, 2, 0)
        );
        assert_eq!((start.executions, start.executions_failed_here), (2, 1));
        let yes = node("yes");
        assert_eq!(
            (yes.reached, yes.passed, yes.failed_here, yes.failed_above),
            (2, 0, 1, 1)
        );
        assert_eq!(yes.parent.as_deref(), Some("start"));
        let no = node("no");
        assert_eq!(
            (no.reached, no.passed, no.failed_here, no.failed_above),
            (2, 1, 0, 1)
        );

        let branch = |name: &str| {
            stats
                .branches
                .iter()
                .find(|b| &*b.trajectory == name)
                .unwrap()
        };
        assert!(branch("no").repeats.flaky);
        assert_eq!(branch("yes").repeats.passed, 0);
        assert_eq!(stats.scenarios[0].repeats.samples, 2);
        assert_eq!(stats.scenarios[0].repeats.passed, 0);
        // Two `start` turns of 10 ms, four branch turns of 20 ms.
        assert_eq!(stats.aggregates.latency.turns, 6);
        assert!(close(
            stats.aggregates.latency.mean_ms.unwrap(),
            100.0 / 6.0
        ));
        assert_eq!(stats.aggregates.latency.p50_ms, Some(20.0));
        assert_eq!(stats.aggregates.counts.passed, 1);
        assert_eq!(stats.aggregates.cost_usd, None);
    }
}
