//! `trellis run --resume DIR`: finishes a run that was cut short (`kill -9`, out of memory,
//! a lost pod) in its own directory, as the same run.
//!
//! The run's journal is read twice. The first pass keeps every trajectory it holds as
//! finished and checks each against the plan of the suites as they are now: the trajectory
//! must still be planned (its scenario selected, its agent and repetition in the plan) with
//! the same fingerprint (`ScenarioInfo::fingerprints`: what it sends and checks). Any
//! difference refuses the resume, naming the trajectories, since their results would no
//! longer be results of these suites. So does a plan that leaves out anything the run
//! planned (`run_started`'s scenarios, agents, trajectories and repetitions), finished or
//! not, since the run would end as finished without it; edits that leave finished
//! trajectories alone and drop nothing (another scenario's steps, a branch that did not
//! finish, more repetitions, a new scenario) resume. The second pass writes
//! the journal the resumed run appends to: a `run_started` for the plan as it is now (the
//! first attempt's run id and start, `resumed_at` extended), then the finished
//! trajectories and the nodes on their paths, as they were written; nodes of trajectories
//! that did not finish are dropped (they run again). It is written under a temporary name
//! and renamed over the old journal, so a resume killed while copying leaves the old one.
//!
//! The executor then runs what is left ([`trellis_engine::execute::resume`]), and the
//! results files are written from the whole journal, so every reader sees one finished
//! run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use trellis_engine::execute::{self, Finished, Forks};
use trellis_engine::journal::{self, JournalReader, JournalWriter};
use trellis_engine::plan::Plan;
use trellis_engine::record::{JournalEntry, RunInfo, RunSummary, TrajectoryRecord};

use super::console::Console;
use super::recorder::source;

/// Finished trajectories named in a refusal; the rest are counted.
const PROBLEMS_SHOWN: usize = 10;

/// What `--resume DIR` found.
pub(super) enum Prepared {
    /// The run reached its end: nothing to run.
    AlreadyFinished {
        run_id: String,
        summary: Box<RunSummary>,
    },
    /// The journal is empty: the run was killed before it recorded anything (its
    /// `run_started` is the first thing it flushes), so it starts over.
    Empty,
    /// The run goes on.
    Resume(Box<Resumed>),
}

/// A run ready to go on: its journal rewritten with what it keeps, open for appending.
pub(super) struct Resumed {
    pub run_id: String,
    /// When the run first started (its journal's `run_started`), and when each later
    /// attempt did, this one's last: what the resumed run's own start event says.
    pub started_at: String,
    pub resumed_at: Vec<String>,
    pub journal: JournalWriter,
    pub finished: std::sync::Arc<Finished>,
    /// Agents whose setup (`agent` entry) the journal keeps.
    pub agents: HashSet<String>,
    /// The console, with the finished trajectories counted in.
    pub console: Console,
}

/// Reads `dir`'s journal and, unless the run finished, checks it against `plan` and
/// rewrites it for the resumed run. `Err` is what to tell the user.
pub(super) fn prepare(
    dir: &Path,
    plan: &Plan,
    jobs: usize,
    strict: bool,
    mut console: Console,
) -> Result<Prepared, String> {
    if trellis_reports::history::is_watch_rerun(dir) {
        return Err(format!(
            "{} holds one rerun of `trellis watch`, which records only what reran; it \
             cannot be resumed",
            dir.display()
        ));
    }
    let Some(path) = journal::find(dir) else {
        return Err(format!(
            "{} holds no run to resume: it has no journal ({}); start a run there with \
             `trellis run --out {}`",
            dir.display(),
            journal::JOURNAL_FILE,
            dir.display()
        ));
    };
    let read_error = |e: journal::JournalError| format!("{e}: {}", source(&e));
    let mut reader = JournalReader::open(&path).map_err(read_error)?;
    let info = match reader.next_entry().map_err(read_error)? {
        Some(JournalEntry::RunStarted(info)) => std::sync::Arc::unwrap_or_clone(info),
        None if reader.skipped() == 0 => return Ok(Prepared::Empty),
        _ => {
            return Err(format!(
                "{} does not start with the run's `run_started` entry: the run was killed \
                 before it recorded anything, or this is not a trellis journal; start the \
                 run again with `trellis run --out {} --replace`",
                path.display(),
                dir.display()
            ));
        }
    };
    if let Some(original) = &info.rejudged_from {
        return Err(format!(
            "{} holds a rejudged copy of run {original}, which cannot be resumed; run \
             `trellis rejudge` again",
            dir.display()
        ));
    }

    // Refused for a finished run too: its verdicts were decided without (or with) the
    // --strict asked for now, and a gate that asks for it must not pass on them.
    if info.strict != strict {
        let flag = if info.strict { "with" } else { "without" };
        return Err(format!(
            "cannot resume run {}: it was recorded {flag} --strict, which decided its \
             finished trajectories; resume it {flag} --strict",
            info.run_id
        ));
    }

    // The planned trajectories that run again whole, whatever else of them was recorded:
    // one a stop left with a check unjudged (recorded `skipped`, without a verdict), and an
    // attack search (one piece of work: which of its paths the stop cut off is not in the
    // records). Read first, since their other records (an earlier retry, a path of the
    // same search) may come before them.
    let cut = runs_again_whole(&path).map_err(read_error)?;

    // First pass: what finished, and whether the plan still agrees with it.
    let mut checker = Checker::new(&info, plan);
    let mut finished = Finished::new();
    let mut nodes_kept: HashSet<u128> = HashSet::new();
    let mut agents = HashSet::new();
    let mut forks = Forks::new();
    let mut forked = Vec::new();
    while let Some(line) = reader.next_line().map_err(read_error)? {
        if journal::is_node_line(line) {
            continue;
        }
        match journal::parse_line(line) {
            Ok(JournalEntry::Trajectory(t)) => {
                checker.check(&t);
                if cut.contains(&execute::planned_key(&t)) {
                    continue;
                }
                // A forked trajectory is kept only once every continuation is known to
                // be in the journal (few are forked: they wait for the end of the pass).
                if forks.add(&t) {
                    forked.push(t);
                } else {
                    keep(&t, &mut finished, &mut nodes_kept, &mut console);
                }
            }
            Ok(JournalEntry::Agent(agent)) => {
                agents.insert(agent.agent);
            }
            // A run stopped by a signal ends its journal too, saying so (`interrupted`;
            // one from before that field recorded fewer trajectories than it planned, as
            // each planned one gets at least one record, skipped or not, in a run that
            // reaches its end): that one goes on.
            Ok(JournalEntry::RunFinished(summary))
                if !summary.interrupted && summary.trajectories >= info.planned_trajectories =>
            {
                return Ok(Prepared::AlreadyFinished {
                    run_id: info.run_id,
                    summary: Box::new(summary),
                });
            }
            // An attempt stopped by a signal or a budget: its LLM calls were made, and count
            // in the resumed run's.
            Ok(JournalEntry::RunFinished(summary)) => finished.set_llm_roles(summary.llm_roles),
            // Spans that arrived after the earlier attempt's work are not carried over
            // (docs/results.md, "Resuming a run: `trellis run --resume`").
            Ok(JournalEntry::Spans(_)) => {}
            // A second `run_started` (concatenated journals) and lines that do not parse
            // (a torn last line) are not the run's records.
            Ok(JournalEntry::RunStarted(_) | JournalEntry::Node(_)) | Err(_) => {}
        }
    }
    drop(reader);
    let mut incomplete = forks.incomplete();
    incomplete.extend(cut);
    for t in forked {
        if !incomplete.contains(&execute::planned_key(&t)) {
            keep(&t, &mut finished, &mut nodes_kept, &mut console);
        }
    }
    if !finished.is_empty() && info.scenarios.iter().all(|s| s.fingerprints.is_empty()) {
        return Err(format!(
            "cannot resume run {}: it was recorded by an earlier trellis, whose journal does \
             not say what each trajectory's plan was, so the {} it finished cannot be \
             checked against the suites; start the run again (`trellis run --out {} \
             --replace`)",
            info.run_id,
            super::console::count(finished.totals().trajectories, "trajectory", "trajectories"),
            dir.display()
        ));
    }
    checker.refusal(&info.run_id, dir)?;

    // Second pass: the journal the resumed run appends to.
    let mut started = execute::run_info(plan, &info.run_id, jobs, strict);
    let now = std::mem::replace(&mut started.started_at, info.started_at.clone());
    started.resumed_at = info.resumed_at.clone();
    started.resumed_at.push(now);
    let journal = rewrite(dir, &path, &started, nodes_kept, &incomplete, &mut finished)?;
    Ok(Prepared::Resume(Box::new(Resumed {
        run_id: info.run_id,
        started_at: started.started_at.clone(),
        resumed_at: started.resumed_at.clone(),
        journal,
        finished: std::sync::Arc::new(finished),
        agents,
        console,
    })))
}

/// The keys ([`execute::planned_key`]) of the planned trajectories of the journal at `path`
/// that run again whole: those with a record a stop left a check of unjudged, and attack
/// searches.
fn runs_again_whole(path: &Path) -> Result<HashSet<u128>, journal::JournalError> {
    let mut reader = JournalReader::open(path)?;
    let mut keys = HashSet::new();
    while let Some(line) = reader.next_line()? {
        // Parsed only when it can hold an attack or a check a stop left: most lines are
        // passed over without reading their JSON.
        let may_run_again = line.starts_with(br#"{"trajectory":"#)
            && std::str::from_utf8(line)
                .is_ok_and(|l| l.contains(r#""attack":"#) || l.contains("not checked: "));
        if !may_run_again {
            continue;
        }
        if let Ok(JournalEntry::Trajectory(t)) = journal::parse_line(line)
            && (t.attack.is_some() || t.criteria.iter().any(|c| c.cut_by_stop()))
        {
            keys.insert(execute::planned_key(&t));
        }
    }
    Ok(keys)
}

/// Keeps a finished trajectory record of the journal: counted, its nodes kept, shown.
fn keep(
    t: &TrajectoryRecord,
    finished: &mut Finished,
    nodes_kept: &mut HashSet<u128>,
    console: &mut Console,
) {
    finished.add(t);
    for node in &t.nodes {
        nodes_kept.insert(node_key(
            &t.suite,
            &t.scenario,
            &t.agent,
            t.repetition,
            node,
        ));
    }
    console.seed(t);
}

/// Writes the resumed run's journal: `started`, then the old journal's setup records,
/// finished trajectories and the nodes on their paths (`nodes_kept`), byte for byte. The
/// kept nodes' turns are counted into `finished`. The records of trajectories that run
/// again (`incomplete`: forks not wholly recorded, checks a stop left unjudged) are left
/// out.
fn rewrite(
    dir: &Path,
    old: &Path,
    started: &RunInfo,
    nodes_kept: HashSet<u128>,
    incomplete: &HashSet<u128>,
    finished: &mut Finished,
) -> Result<JournalWriter, String> {
    let write_error = |e: journal::JournalError| format!("{e}: {}", source(&e));
    let target = dir.join(journal::JOURNAL_FILE);
    // A leftover of a resume killed while copying is a partial file like any other
    // (`--replace` removes it).
    let mut partial = target.clone().into_os_string();
    partial.push(trellis_reports::PARTIAL_SUFFIX);
    let partial = PathBuf::from(partial);
    let mut writer = JournalWriter::create_at(&partial).map_err(write_error)?;
    writer
        .append(&JournalEntry::RunStarted(std::sync::Arc::new(
            started.clone(),
        )))
        .map_err(write_error)?;
    let mut reader = JournalReader::open(old).map_err(write_error)?;
    let mut nodes_kept = nodes_kept;
    let mut first = true;
    while let Some(line) = reader.next_line().map_err(write_error)? {
        if std::mem::take(&mut first) {
            // The old `run_started`, replaced by `started`.
            continue;
        }
        if journal::is_node_line(line) {
            let Ok(NodeKeys { node: keys }) = serde_json::from_slice::<NodeKeys>(line) else {
                continue;
            };
            let key = node_key(
                &keys.suite,
                &keys.scenario,
                &keys.agent,
                keys.repetition,
                &keys.node,
            );
            // Taken out once copied: a node is written once, and the set shrinks as it goes.
            if !nodes_kept.remove(&key) {
                continue;
            }
            if let Ok(JournalEntry::Node(node)) = journal::parse_line(line) {
                let ended = node.turns.iter().map(|t| t.end_ms()).fold(0.0, f64::max);
                finished.add_turns(node.turns.len() as u64, ended);
            }
            writer.append_line(line).map_err(write_error)?;
            continue;
        }
        let kept = line.starts_with(br#"{"trajectory":"#) || line.starts_with(br#"{"agent":"#);
        let runs_again = |t: &TrajectoryRecord| incomplete.contains(&execute::planned_key(t));
        match journal::parse_line(line) {
            Ok(JournalEntry::Trajectory(t)) if runs_again(&t) => {}
            Ok(_) if kept => writer.append_line(line).map_err(write_error)?,
            _ => {}
        }
    }
    drop(reader);
    writer.rename(&target).map_err(write_error)?;
    // A plain journal of an earlier version is replaced by the compressed one.
    if old != target
        && let Err(e) = std::fs::remove_file(old)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(format!(
            "cannot remove {} after rewriting it as {}: {e}",
            old.display(),
            target.display()
        ));
    }
    // Results files of the earlier attempt describe part of the run; they are written
    // again at the end. Leftover partial files go too.
    remove_derived(dir);
    Ok(writer)
}

/// Removes the results files derived from the journal (not the journal, not `run.json`,
/// not a shard's `shard.json`).
fn remove_derived(dir: &Path) {
    for name in trellis_reports::RESULT_FILES {
        if name == journal::JOURNAL_FILE
            || name == journal::PLAIN_FILE
            || name == trellis_reports::history::RUN_META_FILE
            || name == trellis_engine::record::SHARD_PLAN_FILE
        {
            continue;
        }
        let path = dir.join(name);
        let mut partial = path.clone().into_os_string();
        partial.push(trellis_reports::PARTIAL_SUFFIX);
        for path in [path, PathBuf::from(partial)] {
            // A file left behind is rewritten at the end anyway.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The keys of a node line, read without its turns.
#[derive(Deserialize)]
struct NodeKeys {
    node: Keys,
}

#[derive(Deserialize)]
struct Keys {
    suite: String,
    scenario: String,
    agent: String,
    repetition: u32,
    node: String,
}

fn node_key(suite: &str, scenario: &str, agent: &str, repetition: u32, node: &str) -> u128 {
    let mut hasher = blake3::Hasher::new();
    for part in [suite, scenario, agent, node] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.update(&repetition.to_le_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    u128::from_le_bytes(first)
}

/// Appends the first [`PROBLEMS_SHOWN`] of `items` to `text` as a list, counting the rest.
fn list(text: &mut String, items: impl ExactSizeIterator<Item = String>) {
    let total = items.len();
    for item in items.take(PROBLEMS_SHOWN) {
        text.push_str(&format!("\n  - {item}"));
    }
    if total > PROBLEMS_SHOWN {
        text.push_str(&format!("\n  … and {} more", total - PROBLEMS_SHOWN));
    }
}

/// Trajectory names of a dropped branch named in a refusal; the rest are counted.
const NAMES_SHOWN: usize = 5;

/// What of scenario `then`'s planned trajectories (per agent) the plan `now` of the same
/// scenario leaves out, said for a refusal: its repetitions past `now`'s `repeat`, and its
/// trajectories `now` does not have. `None` when `now` plans all of them (or more).
fn left_out(then: &trellis_engine::record::ScenarioInfo, now: &Planned) -> Option<String> {
    let mut parts = Vec::new();
    let gone: Vec<&str> = then
        .trajectories
        .iter()
        .map(String::as_str)
        .filter(|t| !now.trajectories.contains_key(t))
        .collect();
    if !gone.is_empty() {
        let mut names = gone
            .iter()
            .take(NAMES_SHOWN)
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ");
        if gone.len() > NAMES_SHOWN {
            names.push_str(&format!(" and {} more", gone.len() - NAMES_SHOWN));
        }
        parts.push(format!(
            "trajector{} {names} (no longer in the scenario)",
            if gone.len() == 1 { "y" } else { "ies" }
        ));
    }
    if now.repeat < then.repeat {
        let (first, last) = (now.repeat, then.repeat - 1);
        let reps = if first == last {
            format!("repetition {first}")
        } else {
            format!("repetitions {first}–{last}")
        };
        parts.push(format!(
            "{reps} (`repeat` {} now, {} planned)",
            now.repeat, then.repeat
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The columns whose values differ between a dataset row as recorded and as it is now,
/// in the order of the row now (then any it lost), as `` `NAME` ``; at most a few, and how
/// many more.
fn changed_columns(
    then: &serde_json::Map<String, serde_json::Value>,
    now: &serde_json::Map<String, serde_json::Value>,
) -> Vec<String> {
    const SHOWN: usize = 5;
    let changed: Vec<&str> = now
        .iter()
        .filter(|(name, value)| then.get(name.as_str()) != Some(value))
        .map(|(name, _)| name.as_str())
        .chain(
            then.keys()
                .filter(|name| !now.contains_key(name.as_str()))
                .map(String::as_str),
        )
        .collect();
    let mut shown: Vec<String> = changed
        .iter()
        .take(SHOWN)
        .map(|name| format!("`{name}`"))
        .collect();
    if changed.len() > SHOWN {
        shown.push(format!("{} more", changed.len() - SHOWN));
    }
    shown
}

/// What a planned scenario looks like now.
struct Planned<'a> {
    agents: HashSet<&'a str>,
    repeat: u32,
    /// Trajectory name → its fingerprint now.
    trajectories: HashMap<&'a str, Option<&'a str>>,
    /// A dataset instance's row now.
    row: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// Checks finished trajectories against the plan, collecting why each cannot be kept.
struct Checker<'a> {
    /// (suite, scenario) → the plan now.
    planned: HashMap<(&'a str, &'a str), Planned<'a>>,
    /// (suite, scenario, trajectory) → its fingerprint when the run started.
    recorded: HashMap<(&'a str, &'a str, &'a str), &'a str>,
    /// (suite, scenario) → a dataset instance's row when the run started.
    recorded_rows: HashMap<(&'a str, &'a str), &'a serde_json::Map<String, serde_json::Value>>,
    /// `suite/scenario trajectory [agent]` → why it cannot be kept (one per trajectory,
    /// however many repetitions finished).
    problems: BTreeMap<String, String>,
    /// `suite/scenario [agent]` the run planned that this plan does not: resumed, the run
    /// would end "finished" without ever checking them (a narrower `--filter`, say).
    dropped: Vec<String>,
    /// `suite/scenario [agent]: what` of the trajectories of a scenario still planned that
    /// this plan does not run (a lower `repeat`, a branch removed or renamed), finished or
    /// not: the same "finished" without them.
    shrunk: Vec<String>,
}

impl<'a> Checker<'a> {
    fn new(info: &'a RunInfo, plan: &'a Plan) -> Self {
        let planned: HashMap<(&str, &str), Planned<'a>> = plan
            .scenarios
            .iter()
            .map(|s| {
                let agents = s
                    .agents
                    .iter()
                    .filter_map(|&a| plan.agents.get(a))
                    .map(|a| &*a.id)
                    .collect();
                let trajectories = s
                    .trajectories
                    .iter()
                    .map(|t| (t.name.as_str(), t.fingerprint.as_deref()))
                    .collect();
                (
                    (&*s.suite, s.scenario.id.value.as_str()),
                    Planned {
                        agents,
                        repeat: s.repeat,
                        trajectories,
                        row: s.scenario.instance.as_ref().and_then(|i| i.row.as_deref()),
                    },
                )
            })
            .collect();
        let recorded = info
            .scenarios
            .iter()
            .flat_map(|s| {
                s.trajectories
                    .iter()
                    .zip(&s.fingerprints)
                    .map(move |(t, f)| {
                        (
                            (s.suite.as_str(), s.scenario.as_str(), t.as_str()),
                            f.as_str(),
                        )
                    })
            })
            .collect();
        let recorded_rows = info
            .scenarios
            .iter()
            .filter_map(|s| {
                let row = s.instance.as_ref()?.row.as_deref()?;
                Some(((s.suite.as_str(), s.scenario.as_str()), row))
            })
            .collect();
        let mut dropped = Vec::new();
        let mut shrunk = Vec::new();
        for s in &info.scenarios {
            let now = planned.get(&(s.suite.as_str(), s.scenario.as_str()));
            let part = now.and_then(|p| left_out(s, p));
            for a in &s.agents {
                let what = format!("{}/{} [{a}]", s.suite, s.scenario);
                match now {
                    Some(p) if p.agents.contains(a.as_str()) => {
                        if let Some(part) = &part {
                            shrunk.push(format!("{what}: {part}"));
                        }
                    }
                    _ => dropped.push(what),
                }
            }
        }
        Checker {
            planned,
            recorded,
            recorded_rows,
            problems: BTreeMap::new(),
            dropped,
            shrunk,
        }
    }

    fn check(&mut self, t: &TrajectoryRecord) {
        let name = t.planned_name();
        let what = format!("{}/{} {} [{}]", t.suite, t.scenario, name, t.agent);
        if self.problems.contains_key(&what) {
            return;
        }
        let problem = match self.why_not_kept(t, name) {
            Some(problem) => problem,
            None => return,
        };
        self.problems.insert(what, problem);
    }

    fn why_not_kept(&self, t: &TrajectoryRecord, name: &str) -> Option<String> {
        let Some(planned) = self.planned.get(&(t.suite.as_str(), t.scenario.as_str())) else {
            return Some(
                "its scenario is not in this plan (removed, renamed, or not selected by \
                 these paths, --filter, --tag or status)"
                    .into(),
            );
        };
        if !planned.agents.contains(t.agent.as_str()) {
            return Some("its agent no longer runs this scenario".into());
        }
        if t.repetition >= planned.repeat {
            return Some(format!(
                "repetition {} finished, and the scenario now repeats {} time{}",
                t.repetition,
                planned.repeat,
                if planned.repeat == 1 { "" } else { "s" }
            ));
        }
        let Some(now) = planned.trajectories.get(name) else {
            return Some("the scenario no longer has this trajectory".into());
        };
        let Some(then) = self
            .recorded
            .get(&(t.suite.as_str(), t.scenario.as_str(), name))
        else {
            return Some(
                "the journal does not say what its plan was (written by an earlier trellis)".into(),
            );
        };
        let now = now.unwrap_or_default();
        if now == *then {
            return None;
        }
        let halves = |f: &'a str| f.split_once(':').unwrap_or((f, ""));
        let ((conv_then, _), (conv_now, _)) = (halves(then), halves(now));
        let row_then = self
            .recorded_rows
            .get(&(t.suite.as_str(), t.scenario.as_str()));
        let columns = match (row_then, planned.row) {
            (Some(then), Some(now)) => changed_columns(then, now),
            _ => Vec::new(),
        };
        Some(if !columns.is_empty() {
            // Every column is in the scope of every template (a judge's prompt too), so a
            // change to one no step names still changes what the instance is.
            format!(
                "its dataset row changed ({}); every column is in its templates' scope",
                columns.join(", ")
            )
        } else if conv_then != conv_now {
            "what it sends changed (its steps, the scenario's setup, an agent, persona, \
             tool or provider)"
                .into()
        } else {
            "what it checks changed (an `expect`, `criteria`, an outcome or a judge)".into()
        })
    }

    /// `Err` with the refusal when any finished trajectory cannot be kept.
    fn refusal(self, run_id: &str, dir: &Path) -> Result<(), String> {
        let mut text = format!("cannot resume run {run_id}: ");
        if !self.problems.is_empty() {
            let total = self.problems.len();
            text.push_str(&format!(
                "the suites changed the plan of {total} finished trajector{}, so the run \
                 would mix results of two versions of the suites:",
                if total == 1 { "y" } else { "ies" }
            ));
            list(
                &mut text,
                self.problems
                    .iter()
                    .map(|(what, why)| format!("{what}: {why}")),
            );
        } else if !self.dropped.is_empty() || !self.shrunk.is_empty() {
            if !self.dropped.is_empty() {
                let total = self.dropped.len();
                text.push_str(&format!(
                    "{total} scenario{} it planned {} not in this plan (removed, renamed, or \
                     not selected by these paths, --filter, --tag or status), so the run \
                     would end as finished without checking {}:",
                    if total == 1 { "" } else { "s" },
                    if total == 1 { "is" } else { "are" },
                    if total == 1 { "it" } else { "them" }
                ));
                list(&mut text, self.dropped.iter().cloned());
            }
            if !self.shrunk.is_empty() {
                if !self.dropped.is_empty() {
                    text.push_str("\nand ");
                }
                text.push_str(
                    "this plan leaves out trajectories the run planned (a lower `repeat`, a \
                     branch removed or renamed), so the run would end as finished without \
                     running them:",
                );
                list(&mut text, self.shrunk.iter().cloned());
            }
        } else {
            return Ok(());
        }
        text.push_str(&format!(
            "\nhint: resume with the suites, paths and selection the run started with, or \
             start a new run (`trellis run --out {} --replace`, or another --out)",
            dir.display()
        ));
        Err(text)
    }
}
