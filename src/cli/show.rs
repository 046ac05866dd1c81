//! `trellis show`: a recorded run's transcripts on the terminal, for a failure read in a CI
//! log or over SSH, where `report.html` is not at hand.
//!
//! Read from the run's journal in one pass: the node entries of the selected scenarios are
//! kept until the trajectories that went through them arrive (a trajectory is recorded after
//! its nodes), and each selected trajectory is printed as its record comes: every turn's
//! message, tool calls, answer, time and fault, then its checks. By default only the
//! trajectories that did not pass are shown, the first [`DEFAULT_LIMIT`] of them; `--all`
//! shows every trajectory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use clap_complete::ArgValueCandidates;
use trellis_engine::journal::{self, JournalReader};
use trellis_engine::plan::ScenarioFilter;
use trellis_engine::record::{
    CriterionStatus, JournalEntry, TrajectoryRecord, TrajectoryStatus, TurnRecord,
};

use super::console::{errln, outln};
use super::{EXIT_INVALID, EXIT_OK, complete, history};

/// Trajectories shown without `--limit`.
const DEFAULT_LIMIT: usize = 10;

/// The longest text of a message, an answer or a tool's arguments or result shown whole.
const TEXT_SHOWN: usize = 2_000;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The run: directory, id (or a unique prefix) or name among the runs in --dir; default:
    /// the most recent run.
    #[arg(add = ArgValueCandidates::new(complete::runs))]
    run: Option<String>,
    #[command(flatten)]
    runs: history::RunsDir,
    /// Only scenarios matching this glob (scenario id or `suite/scenario`); repeatable.
    #[arg(long, value_name = "GLOB")]
    filter: Vec<String>,
    /// Every trajectory, passed ones too, with no limit unless --limit is given (default:
    /// those that failed, errored, were skipped or invalid, the first 10).
    #[arg(long)]
    all: bool,
    /// Show at most this many trajectories [default: 10, none with --all].
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
}

/// A node entry's key: suite, scenario, agent, repetition, node id.
type NodeKey = (String, String, String, u32, String);

pub fn show(args: ShowArgs) -> u8 {
    // As `run --filter` selects.
    let filter = match ScenarioFilter::new(&args.filter) {
        Ok(filter) => filter,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    let dir = match &args.run {
        Some(what) => match history::resolve(&args.runs.dir, what) {
            Ok(entry) => entry.dir,
            Err(code) => return code,
        },
        None => match latest(&args.runs.dir) {
            Some(dir) => dir,
            None => {
                errln!(
                    "error: no run in {} (name one: `trellis show RUN`)",
                    args.runs.dir.display()
                );
                return EXIT_INVALID;
            }
        },
    };
    let Some(path) = journal::find(&dir) else {
        errln!(
            "error: {} holds no journal (journal.jsonl.zst): not a run directory, or a run \
             killed before it started",
            dir.display()
        );
        return EXIT_INVALID;
    };
    let mut journal = match JournalReader::open(&path) {
        Ok(journal) => journal,
        Err(e) => {
            errln!("error: cannot read {}: {e}", path.display());
            return EXIT_INVALID;
        }
    };
    let selected = |suite: &str, scenario: &str| {
        // An instance's id is its scenario's, then `[…]`.
        let base = scenario
            .split_once('[')
            .filter(|_| scenario.ends_with(']'))
            .map(|(base, _)| base);
        filter.selects(suite, scenario, base)
    };
    // `--all` asks for every trajectory: a limit it kept would cut what it promises.
    let limit = args
        .limit
        .unwrap_or(if args.all { usize::MAX } else { DEFAULT_LIMIT });
    let mut nodes: HashMap<NodeKey, Vec<Arc<TurnRecord>>> = HashMap::new();
    let (mut shown, mut more) = (0usize, 0usize);
    // What the run planned, and how it ended: a run stopped early is said to be, or "no
    // trajectories that did not pass" read as all passed.
    let mut planned: Option<u64> = None;
    let mut ended: Option<(bool, Option<String>, u64)> = None;
    let mut abandoned = Vec::new();
    loop {
        let entry = match journal.next_entry() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(e) => {
                errln!(
                    "warning: {}: {e}; what was read before is shown",
                    path.display()
                );
                break;
            }
        };
        match entry {
            JournalEntry::RunStarted(info) => {
                planned.get_or_insert(info.planned_trajectories);
            }
            JournalEntry::RunFinished(end) => {
                ended = Some((end.interrupted, end.stopped_by.clone(), end.trajectories));
                abandoned = end.abandoned;
            }
            // Past the limit only trajectories are counted: their turns are not kept.
            JournalEntry::Node(n) if shown < limit && selected(&n.suite, &n.scenario) => {
                nodes
                    .entry((n.suite, n.scenario, n.agent, n.repetition, n.node))
                    .or_default()
                    .extend(n.turns);
            }
            JournalEntry::Trajectory(t) if selected(&t.suite, &t.scenario) => {
                if !args.all && t.status == TrajectoryStatus::Passed {
                    continue;
                }
                if shown == limit {
                    more += 1;
                    continue;
                }
                shown += 1;
                print_trajectory(&t, &nodes);
            }
            _ => {}
        }
    }
    let what = if args.all {
        "trajectories"
    } else {
        "trajectories that did not pass"
    };
    match ended {
        Some((true, stopped_by, recorded)) => outln!(
            "the run stopped before its end ({}): {recorded}{} trajectories recorded",
            stopped_by
                .as_deref()
                .unwrap_or("a signal, or a newer save in watch"),
            planned
                .map(|p| format!(" of {p} planned"))
                .unwrap_or_default()
        ),
        None if planned.is_some() => outln!(
            "the run has no end in its journal (killed, or still running): what it recorded \
             is shown; `trellis run SUITES --resume {}` finishes it",
            super::console::shell_word(&dir)
        ),
        _ => {}
    }
    if !abandoned.is_empty() {
        super::console::print_abandoned(&abandoned);
    }
    match (shown, more) {
        (0, 0) => outln!("no {what} in {}", dir.display()),
        (_, 0) => {}
        (_, more) => {
            outln!("… and {more} more {what} (--limit N shows more; --filter GLOB picks scenarios)")
        }
    }
    EXIT_OK
}

/// The most recent run directory in `runs_dir`, finished or not (a damaged run beside it
/// is passed over).
fn latest(runs_dir: &Path) -> Option<PathBuf> {
    trellis_reports::history::list_readable_runs(runs_dir)
        .ok()?
        .0
        .into_iter()
        .next_back()
        .map(|r| r.dir)
}

fn print_trajectory(t: &TrajectoryRecord, nodes: &HashMap<NodeKey, Vec<Arc<TurnRecord>>>) {
    let status = match t.status {
        TrajectoryStatus::Passed => "PASSED",
        TrajectoryStatus::Failed => "FAILED",
        TrajectoryStatus::Error => "ERROR",
        TrajectoryStatus::Skipped => "SKIPPED",
        TrajectoryStatus::Invalid => "INVALID",
    };
    outln!(
        "{status} {}/{} · {} [{} #{}]  {:.0} ms",
        t.suite,
        t.scenario,
        t.trajectory,
        t.agent,
        t.repetition,
        t.duration_ms
    );
    let key = |node: &String| {
        (
            t.suite.clone(),
            t.scenario.clone(),
            t.agent.clone(),
            t.repetition,
            node.clone(),
        )
    };
    // A branch of a session-bound agent (AgentScope) replays the prefix in a session of its
    // own: the conversation this trajectory had starts with those replayed turns, and the
    // prefix's original turns, taken in another branch's session, are not shown twice.
    let own_session = t
        .nodes
        .iter()
        .rposition(|node| {
            nodes
                .get(&key(node))
                .is_some_and(|turns| turns.iter().any(|turn| turn.replay))
        })
        .unwrap_or(0);
    if own_session > 0 {
        outln!("  (a session of its own: the shared prefix replayed, then its own turns)");
    }
    for node in &t.nodes[own_session..] {
        for turn in nodes.get(&key(node)).into_iter().flatten() {
            print_turn(turn);
        }
    }
    if let Some(fault) = &t.fault {
        outln!(
            "  fault ({}): {}",
            fault.category.as_str(),
            shown(&fault.message)
        );
    }
    if let Some(reason) = &t.skip_reason {
        outln!("  skipped: {}", shown(reason));
    }
    for c in &t.criteria {
        let mark = match c.status {
            CriterionStatus::Passed => "✓",
            CriterionStatus::Failed => "✗",
            CriterionStatus::Error => "!",
            CriterionStatus::Skipped => "-",
        };
        let on = c
            .turn_index
            .map(|i| format!("turn {i}: "))
            .unwrap_or_default();
        let detail = c
            .detail
            .as_deref()
            .map(|d| format!(": {}", shown(d)))
            .unwrap_or_default();
        outln!("  {mark} {on}{}{detail}", c.criterion);
    }
    outln!("");
}

fn print_turn(turn: &TurnRecord) {
    let reused = if turn.reused {
        ", recorded earlier"
    } else {
        ""
    };
    let replay = if turn.replay { ", replayed prefix" } else { "" };
    // A simulated user's message is the simulator's, not the suite's.
    let kind = match turn.user_source {
        _ if turn.kind != "user" => turn.kind.as_str(),
        Some(trellis_engine::record::UserSource::Recorded) => "simulated user, replayed",
        Some(trellis_engine::record::UserSource::Fresh) => "simulated user",
        None if !turn.simulator.is_empty() => "simulated user",
        None => "user",
    };
    outln!(
        "  turn {} ({kind}, {:.0} ms{reused}{replay})",
        turn.turn_index,
        turn.latency_ms
    );
    if !turn.user_message.is_empty() {
        outln!("    user: {}", shown(&turn.user_message));
    }
    for call in &turn.tool_calls {
        let result = call
            .result
            .as_deref()
            .map(|r| format!(" → {}", shown(r)))
            .unwrap_or_default();
        outln!("    tool {}({}){result}", call.name, shown(&call.arguments));
    }
    // A stream cut short keeps what the agent had sent (a fault says why it stopped):
    // shown as such, not as no answer.
    // Every message of it: one completed before the cut is part of what was sent.
    let partial = || {
        let texts: Vec<&str> = turn
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .filter_map(|m| m.content.as_deref().filter(|t| !t.trim().is_empty()))
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    };
    match (&turn.reply, partial()) {
        (Some(reply), _) => outln!("    agent: {}", shown(reply)),
        (None, Some(text)) => outln!("    agent (cut short, what it had sent): {}", shown(&text)),
        (None, None) => outln!("    agent: (no answer)"),
    }
    if let Some(fault) = &turn.fault {
        outln!(
            "    fault ({}): {}",
            fault.category.as_str(),
            shown(&fault.message)
        );
    }
}

/// `text` on one line (newlines shown as `⏎`), made safe to print as any agent's text is
/// ([`super::console::untrusted`]), at most [`TEXT_SHOWN`] characters of it.
fn shown(text: &str) -> String {
    let cut = text.char_indices().nth(TEXT_SHOWN).map(|(at, _)| at);
    let head = &text[..cut.unwrap_or(text.len())];
    let mut out = super::console::untrusted(&head.replace('\n', "⏎ ")).into_owned();
    if cut.is_some() {
        out.push_str("… (cut; the whole is in turns.parquet)");
    }
    out
}
