//! Shards: the i-th of N disjoint parts of a plan, so N machines (a Kubernetes Indexed
//! Job's pods, a CI matrix's jobs) run one suite together with no coordinator, and
//! `trellis merge` puts their runs back together.
//!
//! The unit of a split is a scenario with everything it shares: all its agents and
//! repetitions (each repetition walks the whole execution tree, so a shared prefix runs
//! once per repetition, as in an unsharded run), and the scenarios it is tied to by `needs`
//! (a scenario waits for, and is skipped after the failure of, the scenarios it needs,
//! which a shard can only see when it runs them). Units are dealt out longest first, each
//! to the shard with the least work so far (ties: the fewest units, then the lowest index):
//! the longest-processing-time rule, within 4/3 of the best split and cheap for any size.
//! The cost of a unit is its scenarios' measured cost from an earlier whole run when one is
//! given, else their trajectory runs. Costs are whole numbers (microseconds, counts) and
//! ties are broken by plan order, so every shard computes the same split from the same
//! suites, selection, shard count and costs, on any machine.
//!
//! Rate budgets are split too ([`divide_budgets`]): N shards each with a provider's whole
//! `requests-per-minute` would send N times what one API key allows.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::str::FromStr;

use crate::plan::Plan;
use crate::record::{SHARD_PLAN_VERSION, ShardBalance, ShardPlan, ShardedScenario};

/// The most shards a run is split into: far more machines than anyone runs one suite on,
/// and a bound on what a mistyped count (`--shard 1/30000000`) can make a shard do.
pub const MAX_SHARDS: u32 = 10_000;

/// One shard of N: `index` from 1 to `count`, as `--shard 2/3` writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    index: u32,
    count: u32,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ShardError {
    #[error("`{text}` is not a shard")]
    #[diagnostic(
        code(trellis::shard::syntax),
        help("write INDEX/COUNT with the index from 1: --shard 1/3, --shard 2/3, --shard 3/3")
    )]
    Syntax { text: String },
    #[error("there is no shard {index} of {count}")]
    #[diagnostic(
        code(trellis::shard::index),
        help("shards are numbered from 1 to the count: {count}/{count} is the last")
    )]
    Index { index: u32, count: u32 },
    #[error("a run cannot be split into {count} shards")]
    #[diagnostic(
        code(trellis::shard::count),
        help("split it into 1 to {max} shards", max = MAX_SHARDS)
    )]
    Count { count: u64 },
}

impl Shard {
    /// Shard `index` (from 1) of `count`.
    pub fn new(index: u32, count: u32) -> Result<Shard, ShardError> {
        if count == 0 || count > MAX_SHARDS {
            return Err(ShardError::Count {
                count: u64::from(count),
            });
        }
        if index == 0 || index > count {
            return Err(ShardError::Index { index, count });
        }
        Ok(Shard { index, count })
    }

    /// From 1 to [`Shard::count`].
    pub fn index(self) -> u32 {
        self.index
    }

    pub fn count(self) -> u32 {
        self.count
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    /// `I/N`, the index from 1.
    fn from_str(text: &str) -> Result<Shard, ShardError> {
        let syntax = || ShardError::Syntax {
            text: text.to_owned(),
        };
        let (index, count) = text.trim().split_once('/').ok_or_else(syntax)?;
        let count: u64 = count.trim().parse().map_err(|_| syntax())?;
        let count = u32::try_from(count).map_err(|_| ShardError::Count { count })?;
        let index: u32 = index.trim().parse().map_err(|_| syntax())?;
        Shard::new(index, count)
    }
}

/// Each scenario's measured cost in an earlier whole run: the agent turn latency summed
/// over its execution nodes, in microseconds.
#[derive(Clone, Debug, Default)]
pub struct MeasuredCosts {
    /// The run the costs were measured in.
    pub run_id: String,
    /// By (suite, scenario id).
    pub by_scenario: HashMap<(String, String), u64>,
}

/// Splits `plan` into `count` shards, balanced by `costs` when given (and when they cover
/// at least one planned scenario), else by trajectory runs. The result is what every
/// shard writes as `shard.json`; `index` is the shard that writes it.
pub fn split(plan: &Plan, count: u32, index: u32, costs: Option<&MeasuredCosts>) -> ShardPlan {
    let runs: Vec<u64> = plan
        .scenarios
        .iter()
        .map(|s| s.trajectories.len() as u64 * s.agents.len() as u64 * u64::from(s.repeat))
        .collect();
    let measured: Vec<Option<u64>> = match costs {
        Some(costs) => plan
            .scenarios
            .iter()
            .map(|s| {
                costs
                    .by_scenario
                    .get(&(s.suite.to_string(), s.scenario.id.value.clone()))
                    .copied()
            })
            .collect(),
        None => vec![None; plan.scenarios.len()],
    };
    let (balance, cost): (ShardBalance, Vec<u64>) = match costs {
        Some(costs) if measured.iter().any(Option::is_some) => {
            // A scenario the measured run did not have costs what a trajectory run cost
            // there on average, times its own trajectory runs.
            let (spent, ran) = measured
                .iter()
                .zip(&runs)
                .filter_map(|(m, r)| m.map(|m| (m, *r)))
                .fold((0u128, 0u128), |(spent, ran), (m, r)| {
                    (spent + u128::from(m), ran + u128::from(r))
                });
            let per_run = spent.checked_div(ran).unwrap_or(0);
            let cost = measured
                .iter()
                .zip(&runs)
                .map(|(m, r)| {
                    m.unwrap_or_else(|| u64::try_from(per_run * u128::from(*r)).unwrap_or(u64::MAX))
                })
                .collect();
            (
                ShardBalance::MeasuredCost {
                    run_id: costs.run_id.clone(),
                },
                cost,
            )
        }
        _ => (ShardBalance::Trajectories, runs),
    };

    let units = units(plan);
    let mut order: Vec<(u64, usize)> = units
        .iter()
        .enumerate()
        .map(|(u, members)| {
            let total = members
                .iter()
                .fold(0u64, |sum, &s| sum.saturating_add(cost[s]));
            (total, u)
        })
        .collect();
    // Longest first; units are numbered in plan order, which breaks ties.
    order.sort_by_key(|&(cost, unit)| (Reverse(cost), unit));
    // The least loaded shard on top: (work so far, units so far, index).
    let mut heap: BinaryHeap<Reverse<(u64, u64, u32)>> =
        (1..=count).map(|i| Reverse((0, 0, i))).collect();
    let mut shard_of = vec![0u32; plan.scenarios.len()];
    for (unit_cost, unit) in order {
        let Some(Reverse((load, taken, shard))) = heap.pop() else {
            break;
        };
        for &s in &units[unit] {
            shard_of[s] = shard;
        }
        heap.push(Reverse((load.saturating_add(unit_cost), taken + 1, shard)));
    }

    let mut hasher = blake3::Hasher::new();
    hasher.update(&count.to_le_bytes());
    let scenarios: Vec<ShardedScenario> = plan
        .scenarios
        .iter()
        .enumerate()
        .map(|(i, s)| {
            for part in [&*s.suite, s.scenario.id.value.as_str()] {
                hasher.update(&(part.len() as u64).to_le_bytes());
                hasher.update(part.as_bytes());
            }
            hasher.update(&shard_of[i].to_le_bytes());
            ShardedScenario {
                shard: shard_of[i],
                cost: cost[i],
                info: plan.scenario_info(s),
            }
        })
        .collect();
    ShardPlan {
        version: SHARD_PLAN_VERSION,
        index,
        count,
        balance,
        digest: hasher.finalize().to_hex().to_string(),
        scenarios,
    }
}

/// The plan's scenarios grouped by `needs` (each group connected through needs, in either
/// direction), groups in plan order of their first scenario, scenarios in plan order.
fn units(plan: &Plan) -> Vec<Vec<usize>> {
    // Union-find over scenario indices; the root of a set is its smallest index.
    let mut parent: Vec<usize> = (0..plan.scenarios.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (i, s) in plan.scenarios.iter().enumerate() {
        for &need in &s.needs {
            if need >= parent.len() {
                continue;
            }
            let (a, b) = (root(&mut parent, i), root(&mut parent, need));
            let (low, high) = (a.min(b), a.max(b));
            parent[high] = low;
        }
    }
    let mut unit_of_root: HashMap<usize, usize> = HashMap::new();
    let mut units: Vec<Vec<usize>> = Vec::new();
    for i in 0..plan.scenarios.len() {
        let r = root(&mut parent, i);
        let unit = *unit_of_root.entry(r).or_insert_with(|| {
            units.push(Vec::new());
            units.len() - 1
        });
        units[unit].push(i);
    }
    units
}

/// Keeps only the scenarios `split` gave to shard `index`, their `needs` renumbered (a
/// split never separates a scenario from those it needs).
pub fn keep(plan: &mut Plan, split: &ShardPlan, index: u32) {
    let keep: Vec<bool> = split.scenarios.iter().map(|s| s.shard == index).collect();
    let mut new_index = vec![None; plan.scenarios.len()];
    let mut next = 0;
    for (i, kept) in keep.iter().enumerate() {
        if *kept {
            new_index[i] = Some(next);
            next += 1;
        }
    }
    let scenarios = std::mem::take(&mut plan.scenarios);
    plan.scenarios = scenarios
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep.get(*i).copied().unwrap_or(false))
        .map(|(_, mut s)| {
            s.needs = s
                .needs
                .iter()
                .filter_map(|&n| new_index.get(n).copied().flatten())
                .collect();
            s
        })
        .collect();
}

/// One rate budget [`divide_budgets`] divided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divided {
    /// `provider "ID"` or `agent "ID"`.
    pub owner: String,
    /// The setting as written: `concurrency`, `requests-per-minute`, `tokens-per-minute`.
    pub setting: &'static str,
    /// As the suite says.
    pub whole: u64,
    /// What this shard keeps: the whole divided by the shard count, rounded down, at
    /// least 1.
    pub share: u64,
}

impl Divided {
    /// The shards together may go past the budget: it is smaller than the shard count, and
    /// every shard still needs 1.
    pub fn overrun(&self, count: u32) -> bool {
        self.share * u64::from(count) > self.whole
    }
}

/// Divides every provider's `concurrency`, `requests-per-minute` and `tokens-per-minute`
/// and every agent's `concurrency` by `count`, rounding down (never below 1), except where
/// the suite says `per-shard #true`; returns what it divided. With one shard nothing
/// changes.
pub fn divide_budgets(plan: &mut Plan, count: u32) -> Vec<Divided> {
    let mut divided = Vec::new();
    if count <= 1 {
        return divided;
    }
    let mut divide = |owner: String, setting: &'static str, whole: u64| -> u64 {
        let share = (whole / u64::from(count)).max(1);
        divided.push(Divided {
            owner,
            setting,
            whole,
            share,
        });
        share
    };
    for provider in plan.llm.providers.iter_mut().filter(|p| !p.per_shard) {
        let owner = format!("provider \"{}\"", provider.id.value);
        if let Some(c) = provider.concurrency {
            let share = divide(owner.clone(), "concurrency", c as u64);
            provider.concurrency = Some(usize::try_from(share).unwrap_or(c));
        }
        if let Some(rpm) = provider.requests_per_minute {
            let share = divide(owner.clone(), "requests-per-minute", u64::from(rpm));
            provider.requests_per_minute = Some(u32::try_from(share).unwrap_or(rpm));
        }
        if let Some(tpm) = provider.tokens_per_minute {
            let share = divide(owner, "tokens-per-minute", u64::from(tpm));
            provider.tokens_per_minute = Some(u32::try_from(share).unwrap_or(tpm));
        }
    }
    for agent in plan.agents.iter_mut().filter(|a| !a.per_shard) {
        if let Some(c) = agent.concurrency {
            let share = divide(format!("agent \"{}\"", agent.id), "concurrency", c as u64);
            agent.concurrency = Some(usize::try_from(share).unwrap_or(c));
        }
    }
    divided
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_written_index_slash_count_from_one() {
        let shard: Shard = "2/3".parse().unwrap();
        assert_eq!((shard.index(), shard.count()), (2, 3));
        assert_eq!(shard.to_string(), "2/3");
        assert!(matches!(
            "0/3".parse::<Shard>(),
            Err(ShardError::Index { index: 0, count: 3 })
        ));
        assert!(matches!(
            "4/3".parse::<Shard>(),
            Err(ShardError::Index { .. })
        ));
        assert!(matches!(
            "1/0".parse::<Shard>(),
            Err(ShardError::Count { .. })
        ));
        assert!(matches!(
            "1/99999999999".parse::<Shard>(),
            Err(ShardError::Count { .. })
        ));
        for bad in ["", "3", "a/b", "1/", "/3", "-1/3", "1/3/4"] {
            assert!(
                matches!(bad.parse::<Shard>(), Err(ShardError::Syntax { .. })),
                "{bad:?}"
            );
        }
    }
}
