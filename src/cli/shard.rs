//! `trellis run --shard I/N`: which shard this process runs (from the flag, or from the
//! variables a known runner sets), what the whole plan's split is (`shard.json`), and the
//! plan cut down to this shard with its rate budgets divided.
//!
//! Runners number their jobs differently; each is read as it documents itself:
//! Kubernetes Indexed Jobs set `JOB_COMPLETION_INDEX` (from 0) but not the count, which
//! comes from `--shards N` or `TRELLIS_SHARDS`; GitLab's `parallel` sets `CI_NODE_INDEX`
//! (from 1) and `CI_NODE_TOTAL`; Buildkite's `parallelism` sets `BUILDKITE_PARALLEL_JOB`
//! (from 0) and `BUILDKITE_PARALLEL_JOB_COUNT`. GitHub Actions sets nothing: a matrix
//! passes `--shard ${{ matrix.shard }}/N`.

use std::path::Path;

use trellis_engine::plan::Plan;
use trellis_engine::record::{ShardBalance, ShardPlan};
use trellis_engine::shard::{self, Divided, MeasuredCosts, Shard, ShardError};
use trellis_reports::history;

use super::console::{self, errln};

/// The variables a runner sets, read in this order.
pub const KUBERNETES_INDEX: &str = "JOB_COMPLETION_INDEX";
pub const SHARDS_VAR: &str = "TRELLIS_SHARDS";
/// Not read: the name a user reaches for (`TRELLIS_SHARD=2/4`) beside [`SHARDS_VAR`]. Set,
/// each job would run the whole plan without a word, so it is refused.
pub const SHARD_VAR_MISTAKE: &str = "TRELLIS_SHARD";
pub const GITLAB_INDEX: &str = "CI_NODE_INDEX";
pub const GITLAB_TOTAL: &str = "CI_NODE_TOTAL";
pub const BUILDKITE_INDEX: &str = "BUILDKITE_PARALLEL_JOB";
pub const BUILDKITE_COUNT: &str = "BUILDKITE_PARALLEL_JOB_COUNT";
/// GitLab's job name: `test 2/3` for a `parallel: 3` job, `test: [a, b]` for a
/// `parallel: matrix` one, which GitLab gives [`GITLAB_INDEX`] and [`GITLAB_TOTAL`] too.
pub const GITLAB_JOB_NAME: &str = "CI_JOB_NAME";

/// Why the shard a run should take cannot be known.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ShardEnvError {
    #[error("{name}={value} is not a shard index")]
    #[diagnostic(
        code(trellis::shard::env_index),
        help(
            "{runner} numbers its jobs from {base}; the variable is set by the runner, not by hand"
        )
    )]
    Index {
        name: &'static str,
        value: String,
        runner: &'static str,
        base: u32,
    },
    #[error("{name}={value} is not a shard count")]
    #[diagnostic(
        code(trellis::shard::env_count),
        help("the number of shards: a whole number from 1")
    )]
    Count { name: String, value: String },
    #[error("{KUBERNETES_INDEX} is set, but not how many shards there are")]
    #[diagnostic(
        code(trellis::shard::no_count),
        help(
            "a Kubernetes Indexed Job sets only the index: set {SHARDS_VAR} (or pass --shards N) to the Job's `completions`; to run the whole plan in such a pod, unset {KUBERNETES_INDEX}"
        )
    )]
    NoCount,
    #[error("{index_name} is set, but {count_name} is not")]
    #[diagnostic(
        code(trellis::shard::half_set),
        help("{runner} sets both; pass the shard yourself with --shard I/N")
    )]
    HalfSet {
        index_name: &'static str,
        count_name: &'static str,
        runner: &'static str,
    },
    #[error("--shards {flag} disagrees with {name}={value}")]
    #[diagnostic(
        code(trellis::shard::count_mismatch),
        help("leave out --shards: {runner} says how many shards there are")
    )]
    CountMismatch {
        flag: u32,
        name: &'static str,
        value: u32,
        runner: &'static str,
    },
    #[error("--shards {count} needs the index of this shard")]
    #[diagnostic(
        code(trellis::shard::no_index),
        help(
            "pass --shard I/{count} instead, or run where the runner sets the index ({KUBERNETES_INDEX} in a Kubernetes Indexed Job)"
        )
    )]
    NoIndex { count: u32 },
    #[error("{SHARDS_VAR}={value} is set, but not which shard this is")]
    #[diagnostic(
        code(trellis::shard::no_index_var),
        help(
            "{SHARDS_VAR} goes with {KUBERNETES_INDEX}, which a Kubernetes Indexed Job sets in each pod; elsewhere pass --shard I/N, or unset {SHARDS_VAR} to run the whole plan"
        )
    )]
    NoIndexVar { value: String },
    #[error("{SHARD_VAR_MISTAKE}={value} is set, but Trellis reads no such variable")]
    #[diagnostic(
        code(trellis::shard::unknown_var),
        help(
            "pass the shard on the command line: --shard I/N (e.g. --shard \"${SHARD_VAR_MISTAKE}\"); {SHARDS_VAR} is only the count, for a Kubernetes Indexed Job; unset {SHARD_VAR_MISTAKE} to run the whole plan"
        )
    )]
    UnknownVar { value: String },
    #[error("{text} from {source_name}")]
    #[diagnostic(code(trellis::shard::env))]
    Shard {
        text: String,
        source_name: String,
        #[source]
        #[diagnostic_source]
        error: ShardError,
    },
}

/// The shard this run takes, and where it came from, for the console.
#[derive(Clone, Debug)]
pub struct Chosen {
    pub shard: Shard,
    /// `--shard`, or the variables read and the runner they belong to.
    pub from: String,
}

/// The shard from `--shard`, else `--shards` with a runner's index, else a runner's
/// variables (`env` reads one); `None` runs the whole plan, as `--shard 1/1` says whatever
/// the runner's variables are.
pub fn choose(
    flag: Option<Shard>,
    shards: Option<u32>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Chosen>, ShardEnvError> {
    if let Some(shard) = flag {
        return Ok((shard.count() > 1).then(|| Chosen {
            shard,
            from: "--shard".to_owned(),
        }));
    }
    // A variable set to nothing (`CI_NODE_INDEX=` in a job template) is not set: it
    // failed the run as a bad index.
    let read = |name: &str| {
        env(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let index_of = |name: &'static str, value: &str, runner: &'static str, base: u32| {
        value
            .parse::<u32>()
            .ok()
            .filter(|i| *i >= base)
            .map(|i| i - base + 1)
            .ok_or_else(|| ShardEnvError::Index {
                name,
                value: value.to_owned(),
                runner,
                base,
            })
    };
    let count_of = |name: &str, value: &str| {
        value
            .parse::<u32>()
            .ok()
            .filter(|c| *c >= 1)
            .ok_or_else(|| ShardEnvError::Count {
                name: name.to_owned(),
                value: value.to_owned(),
            })
    };
    let make = |index: u32, count: u32, from: String| {
        Shard::new(index, count)
            .map(|shard| {
                Some(Chosen {
                    shard,
                    from: from.clone(),
                })
            })
            .map_err(|error| ShardEnvError::Shard {
                text: format!("shard {index} of {count}"),
                source_name: from,
                error,
            })
    };

    if let Some(value) = read(KUBERNETES_INDEX) {
        let runner = "a Kubernetes Indexed Job";
        let index = index_of(KUBERNETES_INDEX, &value, runner, 0)?;
        let (count, count_from) = match (shards, read(SHARDS_VAR)) {
            (Some(count), _) => (count, format!("--shards {count}")),
            (None, Some(text)) => (count_of(SHARDS_VAR, &text)?, format!("{SHARDS_VAR}={text}")),
            (None, None) => return Err(ShardEnvError::NoCount),
        };
        return make(
            index,
            count,
            format!("{KUBERNETES_INDEX}={value} and {count_from} ({runner})"),
        );
    }
    let pairs: [(&'static str, &'static str, &'static str, u32); 2] = [
        (GITLAB_INDEX, GITLAB_TOTAL, "GitLab `parallel`", 1),
        (
            BUILDKITE_INDEX,
            BUILDKITE_COUNT,
            "Buildkite `parallelism`",
            0,
        ),
    ];
    for (index_name, count_name, runner, base) in pairs {
        if index_name == GITLAB_INDEX && gitlab_matrix_job(env).is_some() {
            continue;
        }
        let Some(value) = read(index_name) else {
            // A count of more than one without its index would run the whole plan in each
            // of those jobs. GitLab sets `CI_NODE_TOTAL=1` on a job that is not parallel.
            if let Some(total) = read(count_name)
                && count_of(count_name, &total)? > 1
            {
                return Err(ShardEnvError::HalfSet {
                    index_name: count_name,
                    count_name: index_name,
                    runner,
                });
            }
            continue;
        };
        let Some(total) = read(count_name) else {
            return Err(ShardEnvError::HalfSet {
                index_name,
                count_name,
                runner,
            });
        };
        let index = index_of(index_name, &value, runner, base)?;
        let count = count_of(count_name, &total)?;
        if let Some(flag) = shards.filter(|f| *f != count) {
            return Err(ShardEnvError::CountMismatch {
                flag,
                name: count_name,
                value: count,
                runner,
            });
        }
        return make(
            index,
            count,
            format!("{index_name}={value} and {count_name}={total} ({runner})"),
        );
    }
    match (shards, read(SHARDS_VAR)) {
        (Some(count), _) => Err(ShardEnvError::NoIndex { count }),
        // Set for a Kubernetes Indexed Job, whose index is missing: each pod running the
        // whole plan would run it N times.
        (None, Some(value)) => Err(ShardEnvError::NoIndexVar { value }),
        (None, None) => match read(SHARD_VAR_MISTAKE) {
            Some(value) => Err(ShardEnvError::UnknownVar { value }),
            None => Ok(None),
        },
    }
}

/// The job's name when GitLab's node variables belong to a `parallel: matrix` job
/// (`test: [openai, gpt-4o]`): one job per combination of the matrix's values, each meant to
/// run the whole plan with its own values, not a shard of it. Read as sharding, each
/// job ran a part of the plan (and exited 0). Its `parallel: N` jobs are named `test 2/3`.
pub fn gitlab_matrix_job(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    // Set to nothing is not set, as `choose` reads it.
    env(GITLAB_INDEX).filter(|v| !v.trim().is_empty())?;
    let name = env(GITLAB_JOB_NAME)?;
    let (_, values) = name.trim_end().rsplit_once(": [")?;
    values.ends_with(']').then_some(name)
}

/// The costs a split is balanced by: `--shard-costs RUN` (`none`: trajectory runs), else
/// the latest finished whole run of the same suites in `runs_dir`. `Err` is said and the
/// run exits 2 (a named run that cannot be read).
pub fn costs(
    runs_dir: &Path,
    named: Option<&str>,
    plan: &Plan,
) -> Result<Option<MeasuredCosts>, String> {
    let measured =
        |run_id: String, costs: std::collections::BTreeMap<(String, String), u64>| MeasuredCosts {
            run_id,
            by_scenario: costs.into_iter().collect(),
        };
    match named {
        Some("none") => Ok(None),
        Some(what) => {
            // The resolver's own help names `--baseline`: said here for this flag.
            let run = history::resolve_run(runs_dir, what).map_err(|e| {
                format!(
                    "error: --shard-costs {what}: {e}\n  help: runs are looked for in `{}`, \
                     next to --out; a run elsewhere is named by its directory \
                     (--shard-costs runs/RUN_ID)",
                    runs_dir.display()
                )
            })?;
            let costs = history::scenario_costs(&run.dir)
                .map_err(|e| format!("{:?}", miette::Report::new(e)))?;
            // A run of other suites measures none of these scenarios: the split would
            // silently fall back to counts while the user asked for costs.
            let covered = plan
                .scenarios
                .iter()
                .filter(|s| costs.contains_key(&(s.suite.to_string(), s.scenario.id.value.clone())))
                .count();
            if covered == 0 {
                errln!(
                    "warning: --shard-costs {what}: run {} measured none of the {} planned \
                     scenarios (a run of other suites?); balancing by trajectory count",
                    run.run_id,
                    plan.scenarios.len()
                );
                return Ok(None);
            }
            Ok(Some(measured(run.run_id, costs)))
        }
        None => match history::latest_costs(runs_dir, &plan.suites) {
            Ok(Some((run, costs))) => Ok(Some(measured(run.run_id, costs))),
            // Shards written into a directory of their own (`--out shards/1`) find no whole
            // run there, every time: said, with the way to name one.
            Ok(None) => {
                errln!(
                    "note: no finished whole run of these suites in `{}` (next to --out) to \
                     balance the shards by measured cost; --shard-costs RUN names one (a \
                     directory, id or name)",
                    runs_dir.display()
                );
                Ok(None)
            }
            // A history that cannot be read balances by trajectory runs: every shard reads
            // the same directory, so they still agree.
            Err(e) => {
                errln!(
                    "warning: cannot read the runs in {} to balance the shards ({e}); \
                     balancing by trajectory count",
                    runs_dir.display()
                );
                Ok(None)
            }
        },
    }
}

/// The split a shard directory recorded when it started (`shard.json`), for `run --resume`:
/// a resumed shard keeps the split it started with, since computing it again could balance
/// by a run that finished since and split differently from the other shards. `None`: the
/// directory holds no split (a whole run, or no run). `Err` is said and the run exits 2.
pub fn recorded(dir: &Path) -> Result<Option<ShardPlan>, String> {
    let path = dir.join(trellis_engine::record::SHARD_PLAN_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let split: ShardPlan = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a shard plan ({e}); the shard cannot be resumed as the shard it was: \
             run it again with `trellis run --shard I/N --out {} --replace`",
            path.display(),
            dir.display()
        )
    })?;
    if split.version != trellis_engine::record::SHARD_PLAN_VERSION {
        return Err(format!(
            "{} is version {}, and this trellis reads version {}: run the shard again with \
             `--replace`",
            path.display(),
            split.version,
            trellis_engine::record::SHARD_PLAN_VERSION
        ));
    }
    Ok(Some(split))
}

/// Whether a recorded `split` still fits `plan`: the same scenarios in the same order, so
/// [`trellis_engine::shard::keep`] cuts out the same shard. `Err` names the first
/// difference.
pub fn fits(plan: &Plan, split: &ShardPlan) -> Result<(), String> {
    let planned: Vec<(String, &str)> = plan
        .scenarios
        .iter()
        .map(|s| (s.suite.to_string(), s.scenario.id.value.as_str()))
        .collect();
    let recorded: Vec<(String, &str)> = split
        .scenarios
        .iter()
        .map(|s| (s.info.suite.clone(), s.info.scenario.as_str()))
        .collect();
    if planned == recorded {
        return Ok(());
    }
    let difference = planned
        .iter()
        .zip(&recorded)
        .find(|(p, r)| p != r)
        .map_or_else(
            || {
                format!(
                    "the suites now plan {} and the split had {}",
                    console::count(planned.len() as u64, "scenario", "scenarios"),
                    recorded.len()
                )
            },
            |((ps, pi), (rs, ri))| {
                format!("the split has {rs}/{ri} where the suites now plan {ps}/{pi}")
            },
        );
    Err(difference)
}

/// Cuts `plan` down to `chosen`'s shard of `split`, divides its rate budgets, and says so
/// on stderr (stdout may carry `--message-format json`).
pub fn apply(plan: &mut Plan, split: &ShardPlan, chosen: &Chosen) {
    let whole_scenarios = plan.scenarios.len();
    let whole_runs = plan.trajectory_count();
    let shard = chosen.shard;
    shard::keep(plan, split, shard.index());
    let divided = shard::divide_budgets(plan, shard.count());
    let balance = match &split.balance {
        ShardBalance::Trajectories => "balanced by trajectory count".to_owned(),
        ShardBalance::MeasuredCost { run_id } => {
            format!("balanced by the measured cost of run {run_id} (summed agent turn latency)")
        }
    };
    errln!(
        "shard {shard}, from {}: {} of {}, {} of {}; {balance}",
        chosen.from,
        plan.scenarios.len(),
        console::count(whole_scenarios as u64, "scenario", "scenarios"),
        plan.trajectory_count(),
        console::count(whole_runs, "trajectory run", "trajectory runs"),
    );
    if plan.scenarios.is_empty() {
        errln!(
            "shard {shard} has nothing to run: the plan splits into fewer parts than {} \
             shards (a scenario, with the scenarios it `needs`, is never split); it still \
             records an empty run for `trellis merge`",
            shard.count()
        );
    }
    if !divided.is_empty() {
        errln!(
            "rate budgets divided by {} (write `per-shard #true` on a provider or agent to \
             keep its limits whole in every shard): {}",
            shard.count(),
            divided
                .iter()
                .map(|d| format!("{} {} {} -> {}", d.owner, d.setting, d.whole, d.share))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for d in divided.iter().filter(|d| d.overrun(shard.count())) {
        errln!("warning: {}", overrun(d, shard.count()));
    }
}

fn overrun(d: &Divided, count: u32) -> String {
    format!(
        "{} {} {} is less than one per shard: each of the {count} shards keeps 1, so together \
         they may use {}",
        d.owner,
        d.setting,
        d.whole,
        u64::from(count) * d.share
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn pick(flag: Option<&str>, shards: Option<u32>, vars: &[(&str, &str)]) -> Option<(u32, u32)> {
        let flag = flag.map(|f| f.parse().unwrap());
        choose(flag, shards, &env(vars))
            .unwrap()
            .map(|c| (c.shard.index(), c.shard.count()))
    }

    #[test]
    fn each_runner_numbers_its_jobs_its_own_way() {
        assert_eq!(pick(None, None, &[]), None);
        // Set to nothing is not set.
        assert_eq!(
            pick(None, None, &[(GITLAB_INDEX, ""), (GITLAB_TOTAL, " ")]),
            None
        );
        assert_eq!(
            pick(Some("2/3"), None, &[(GITLAB_INDEX, "1")]),
            Some((2, 3))
        );
        assert_eq!(
            pick(None, None, &[(KUBERNETES_INDEX, "0"), (SHARDS_VAR, "3")]),
            Some((1, 3))
        );
        assert_eq!(
            pick(None, Some(4), &[(KUBERNETES_INDEX, "3")]),
            Some((4, 4))
        );
        assert_eq!(
            pick(None, None, &[(GITLAB_INDEX, "3"), (GITLAB_TOTAL, "3")]),
            Some((3, 3))
        );
        assert_eq!(
            pick(
                None,
                None,
                &[(BUILDKITE_INDEX, "0"), (BUILDKITE_COUNT, "2")]
            ),
            Some((1, 2))
        );
    }

    /// `--shard 1/1` is the whole plan, whatever the runner says; so is a GitLab
    /// `parallel: matrix` job, whose node variables number the matrix's jobs.
    #[test]
    fn the_whole_plan_is_asked_for_or_a_matrix_job() {
        let gitlab = [(GITLAB_INDEX, "2"), (GITLAB_TOTAL, "3")];
        assert_eq!(pick(Some("1/1"), None, &gitlab), None);
        let named = |name| {
            let mut vars = gitlab.to_vec();
            vars.push((GITLAB_JOB_NAME, name));
            pick(None, None, &vars)
        };
        assert_eq!(named("eval: [openai, gpt-4o]"), None);
        assert_eq!(named("eval 2/3"), Some((2, 3)));
        assert_eq!(named("eval"), Some((2, 3)));
        assert_eq!(
            gitlab_matrix_job(&env(&[(GITLAB_INDEX, "1"), (GITLAB_JOB_NAME, "eval: [a]")]))
                .as_deref(),
            Some("eval: [a]")
        );
        assert_eq!(
            gitlab_matrix_job(&env(&[(GITLAB_JOB_NAME, "eval: [a]")])),
            None
        );
        assert_eq!(
            gitlab_matrix_job(&env(&[(GITLAB_INDEX, " "), (GITLAB_JOB_NAME, "eval: [a]")])),
            None
        );
    }

    #[test]
    fn half_set_or_out_of_range_variables_are_errors() {
        let err = |shards, vars: &[(&str, &str)]| choose(None, shards, &env(vars)).unwrap_err();
        assert!(matches!(
            err(None, &[(KUBERNETES_INDEX, "0")]),
            ShardEnvError::NoCount
        ));
        // A count without its index: every job would run the whole plan. One (GitLab's
        // value for a job that is not parallel) is no sharding.
        for (count, runner) in [(GITLAB_TOTAL, "GitLab"), (BUILDKITE_COUNT, "Buildkite")] {
            let e = err(None, &[(count, "3")]);
            assert!(
                matches!(e, ShardEnvError::HalfSet { .. }),
                "{runner}: {e:?}"
            );
            assert!(e.to_string().starts_with(&format!("{count} is set")), "{e}");
            assert_eq!(pick(None, None, &[(count, "1")]), None);
        }
        assert!(matches!(
            err(None, &[(KUBERNETES_INDEX, "3"), (SHARDS_VAR, "3")]),
            ShardEnvError::Shard { .. }
        ));
        assert!(matches!(
            err(None, &[(KUBERNETES_INDEX, "x"), (SHARDS_VAR, "3")]),
            ShardEnvError::Index { .. }
        ));
        assert!(matches!(
            err(None, &[(KUBERNETES_INDEX, "0"), (SHARDS_VAR, "0")]),
            ShardEnvError::Count { .. }
        ));
        assert!(matches!(
            err(None, &[(GITLAB_INDEX, "0"), (GITLAB_TOTAL, "3")]),
            ShardEnvError::Index { .. }
        ));
        assert!(matches!(
            err(None, &[(GITLAB_INDEX, "1")]),
            ShardEnvError::HalfSet { .. }
        ));
        // The variable a user guesses: each job would run the whole plan.
        assert!(matches!(
            err(None, &[(SHARD_VAR_MISTAKE, "2/4")]),
            ShardEnvError::UnknownVar { .. }
        ));
        assert_eq!(
            pick(Some("2/4"), None, &[(SHARD_VAR_MISTAKE, "2/4")]),
            Some((2, 4))
        );
        assert!(matches!(
            err(Some(2), &[(GITLAB_INDEX, "1"), (GITLAB_TOTAL, "3")]),
            ShardEnvError::CountMismatch { .. }
        ));
        assert!(matches!(
            err(Some(3), &[]),
            ShardEnvError::NoIndex { count: 3 }
        ));
        assert!(matches!(
            err(None, &[(SHARDS_VAR, "3")]),
            ShardEnvError::NoIndexVar { .. }
        ));
    }
}
