//! `trellis rejudge`: re-scores a recorded run's LLM-judged checks with the current judges,
//! without calling any agent.
//!
//! Each trajectory's transcript is rebuilt from the journal (its nodes' turns in path order;
//! a node holding replayed turns replaces the prefix before it, as in the run). Every
//! `judge`/`outcome` check that the run reached is judged again against the scenario as the
//! suite now defines it (found by its text; a check the suite no longer has is kept as it
//! was; one the run did not record is named, not judged), with the `history` the run sent
//! (recorded in `run_started`): a check on a shared prefix's turn once for every branch
//! through it, as the run judged it. The trajectory's
//! status follows from its checks by the run's own rule. The
//! result is a new journal: the original's agent and node entries, the updated
//! trajectories, and a `run_started` naming the original run (`rejudged_from`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use trellis_dsl::{Criterion, CriterionKind, Outcome, Project, Scenario, StepKind, walk_steps};

use crate::record::shown::quoted;

use super::runtime::{JudgeTask, LlmRuntime};
use crate::record::{
    JournalEntry, NodeKey, NodeRecord, RunInfo, RunSummary, TrajectoryRecord, TrajectoryStatus,
    TurnRecord,
};

/// Trajectories re-judged at once.
const CONCURRENT_TRAJECTORIES: usize = 16;

/// What a rejudge changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RejudgeCounts {
    /// Checks judged again.
    pub rejudged: u64,
    /// Of those, the ones whose status changed.
    pub changed: u64,
    /// Checks of the recording the current suite no longer has (kept as recorded).
    pub not_in_suite: u64,
    /// Judged checks the current suites give a recorded scenario that none of its recorded
    /// trajectories holds (added since the run): not judged, since where a check stands
    /// among the turns is the run's to decide. `suite/scenario: criterion`, sorted.
    pub not_recorded: Vec<String>,
}

/// Why a journal cannot be rejudged.
#[derive(Debug, thiserror::Error)]
pub enum RejudgeError {
    #[error("the journal has no `run_started` entry: it is not a run journal")]
    NotARun,
}

/// Re-judges `entries` (a run's journal, in order) with `runtime`'s judges and the
/// scenarios of `project`; returns the new journal and what changed. `status_of` is the
/// run's rule from checks (and a fault) to a trajectory's status.
pub async fn rejudge(
    project: &Project,
    entries: Vec<JournalEntry>,
    runtime: &LlmRuntime,
    new_run_id: &str,
    started_at: String,
    status_of: impl Fn(bool, &[crate::record::CriterionRecord]) -> TrajectoryStatus,
) -> Result<(Vec<JournalEntry>, RejudgeCounts), RejudgeError> {
    rejudge_draw(
        project, entries, runtime, new_run_id, started_at, 0, status_of,
    )
    .await
}

/// [`rejudge`] as judgment number `draw` of the same transcripts (`trellis variance`):
/// the draw is part of every judge call's cache key when not 0, so each draw is a fresh
/// judgment even with the response cache on.
pub async fn rejudge_draw(
    project: &Project,
    entries: Vec<JournalEntry>,
    runtime: &LlmRuntime,
    new_run_id: &str,
    started_at: String,
    draw: u32,
    status_of: impl Fn(bool, &[crate::record::CriterionRecord]) -> TrajectoryStatus,
) -> Result<(Vec<JournalEntry>, RejudgeCounts), RejudgeError> {
    let started = std::time::Instant::now();
    let mut info: Option<RunInfo> = None;
    let mut nodes: HashMap<NodeKey, Arc<NodeRecord>> = HashMap::new();
    let mut out: Vec<JournalEntry> = Vec::new();
    let mut trajectories: Vec<TrajectoryRecord> = Vec::new();
    let mut original_end: Option<RunSummary> = None;
    for entry in entries {
        match entry {
            JournalEntry::RunStarted(i) => info = Some(Arc::unwrap_or_clone(i)),
            JournalEntry::Agent(a) => out.push(JournalEntry::Agent(a)),
            // Late spans change no verdict: carried into the re-scored run as they were.
            JournalEntry::Spans(s) => out.push(JournalEntry::Spans(s)),
            JournalEntry::Node(n) => {
                nodes.insert(n.key(), Arc::new(n));
            }
            JournalEntry::Trajectory(t) => trajectories.push(*t),
            JournalEntry::RunFinished(s) => original_end = Some(s),
        }
    }
    let original = info.ok_or(RejudgeError::NotARun)?;
    // The histories the run sent: the judge reads the transcript as it happened, whatever
    // the history's file or row says now.
    let histories: Histories = original
        .scenarios
        .iter()
        .filter_map(|s| {
            let history = s.history.clone()?;
            Some(((s.suite.clone(), s.scenario.clone()), history))
        })
        .collect();
    let new_info = RunInfo {
        run_id: new_run_id.to_owned(),
        started_at,
        trellis_version: env!("CARGO_PKG_VERSION").to_string(),
        rejudged_from: Some(original.run_id.clone()),
        resumed_at: Vec::new(),
        ..original
    };

    let judging = Judging {
        project,
        runtime,
        nodes: &nodes,
        histories: &histories,
        shared: SharedJudgments::default(),
        draw,
    };
    let results: Vec<(TrajectoryRecord, RejudgeCounts)> =
        futures::stream::iter(trajectories.into_iter().map(|t| {
            let (judging, status_of) = (&judging, &status_of);
            async move { rejudge_one(judging, t, status_of).await }
        }))
        .buffered(CONCURRENT_TRAJECTORIES)
        .collect()
        .await;

    let mut entries = vec![JournalEntry::RunStarted(Arc::new(new_info.clone()))];
    entries.append(&mut out);
    // Nodes before trajectories, in a stable order, as a run writes them.
    let mut node_list: Vec<Arc<NodeRecord>> = nodes.into_values().collect();
    node_list.sort_by(|a, b| {
        (&a.suite, &a.scenario, &a.agent, a.repetition, &a.node).cmp(&(
            &b.suite,
            &b.scenario,
            &b.agent,
            b.repetition,
            &b.node,
        ))
    });
    entries.extend(
        node_list
            .into_iter()
            .map(|n| JournalEntry::Node(Arc::unwrap_or_clone(n))),
    );
    let mut counts = RejudgeCounts::default();
    // The agent turns are the original's (a shared prefix's turns once, as the run counted
    // them); the LLM calls by role are this re-scoring's own, its judges'.
    let turns = match &original_end {
        Some(end) => end.turns,
        None => node_list_turns(&entries),
    };
    let mut summary = RunSummary {
        run_id: new_info.run_id.clone(),
        finished_at: crate::journal::rfc3339(std::time::SystemTime::now()),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        turns,
        llm_roles: runtime.meter().by_role(),
        // Re-scoring covers what the original recorded, no more: an original that was
        // stopped, or never reached its end, leaves the re-scored run short of its plan,
        // unless what the stop cut off was only judging, now done (below).
        interrupted: original_end.as_ref().is_none_or(|s| s.interrupted),
        ..RunSummary::default()
    };
    // A stop that left only checks unjudged (every planned trajectory recorded, none more:
    // an agent that forks makes the count say nothing) is made good by judging them: the
    // re-scored run covers its plan when none is left cut short.
    // A budget's stop may have refused a simulated user's call too: that trajectory's fault
    // says so, and its conversation stays cut.
    let only_judging_cut = original_end
        .as_ref()
        .is_some_and(|s| s.interrupted && s.trajectories == new_info.planned_trajectories)
        && results.iter().all(|(t, _)| {
            !t.criteria.iter().any(|c| c.cut_by_stop())
                && !t
                    .fault
                    .as_ref()
                    .is_some_and(|f| f.message.contains("not sent: --max-llm-"))
        });
    if only_judging_cut {
        summary.interrupted = false;
    }
    // A check is new to the run when no trajectory of its scenario recorded it (a check on
    // one branch is not among another branch's records).
    let mut unrecorded: HashMap<(&str, &str), BTreeSet<String>> = HashMap::new();
    for (t, c) in &results {
        let unmatched: BTreeSet<String> = c.not_recorded.iter().cloned().collect();
        unrecorded
            .entry((&t.suite, &t.scenario))
            .and_modify(|kept| kept.retain(|text| unmatched.contains(text)))
            .or_insert(unmatched);
    }
    let mut not_recorded: Vec<String> = unrecorded
        .into_iter()
        .flat_map(|((suite, scenario), texts)| {
            texts
                .into_iter()
                .map(move |text| format!("{suite}/{scenario}: {text}"))
        })
        .collect();
    not_recorded.sort();
    counts.not_recorded = not_recorded;
    for (t, c) in results {
        counts.rejudged += c.rejudged;
        counts.changed += c.changed;
        counts.not_in_suite += c.not_in_suite;
        summary.trajectories += 1;
        match t.status {
            TrajectoryStatus::Passed => summary.passed += 1,
            TrajectoryStatus::Failed => summary.failed += 1,
            TrajectoryStatus::Error => summary.errors += 1,
            TrajectoryStatus::Skipped => summary.skipped += 1,
            TrajectoryStatus::Invalid => summary.invalid += 1,
        }
        entries.push(JournalEntry::Trajectory(Box::new(t)));
    }
    entries.push(JournalEntry::RunFinished(summary));
    Ok((entries, counts))
}

/// The agent turns the nodes among `entries` took, each once.
fn node_list_turns(entries: &[JournalEntry]) -> u64 {
    entries
        .iter()
        .map(|e| match e {
            JournalEntry::Node(n) => n.turns.len() as u64,
            _ => 0,
        })
        .sum()
}

/// The history each scenario of the run sent, by suite and scenario id.
type Histories = HashMap<(String, String), Arc<Vec<serde_json::Value>>>;

/// A check on a turn of a shared prefix is judged once, as the run judged it (at the fork
/// every branch continues with the prefix's checks already recorded), and every trajectory
/// through that turn records the one verdict: judged per trajectory, two draws of a judge
/// could pass and fail the same turn. Keyed by the node that holds the turn, the turn, and
/// the check as rendered; the first trajectory to reach it judges, the others wait for it.
#[derive(Default)]
struct SharedJudgments(std::sync::Mutex<HashMap<(NodeKey, u32, String), Arc<Judgment>>>);

/// One shared check's verdict, once judged.
type Judgment = tokio::sync::OnceCell<crate::record::CriterionRecord>;

impl SharedJudgments {
    fn cell(&self, key: (NodeKey, u32, String)) -> Arc<Judgment> {
        let mut cells = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(cells.entry(key).or_default())
    }
}

/// What every trajectory of one rejudge is judged with.
struct Judging<'a> {
    project: &'a Project,
    runtime: &'a LlmRuntime,
    /// The recorded run's nodes, by key.
    nodes: &'a HashMap<NodeKey, Arc<NodeRecord>>,
    histories: &'a Histories,
    shared: SharedJudgments,
    draw: u32,
}

async fn rejudge_one(
    judging: &Judging<'_>,
    mut t: TrajectoryRecord,
    status_of: &impl Fn(bool, &[crate::record::CriterionRecord]) -> TrajectoryStatus,
) -> (TrajectoryRecord, RejudgeCounts) {
    let &Judging {
        project,
        runtime,
        nodes,
        histories,
        ref shared,
        draw,
    } = judging;
    let mut counts = RejudgeCounts::default();
    let Some(scenario) = project
        .scenarios()
        .find(|(suite, sc)| suite.name == t.suite && sc.id.value == t.scenario)
        .map(|(_, sc)| sc)
    else {
        counts.not_in_suite += t
            .criteria
            .iter()
            .filter(|c| LlmRuntime::is_judged_kind_name(&c.kind))
            .count() as u64;
        // Nothing judged now: none of the directory's calls were this trajectory's.
        t.llm = None;
        return (t, counts);
    };
    let mut turns: Vec<Arc<TurnRecord>> = Vec::new();
    // The node each of `turns` is recorded on.
    let mut turn_nodes: Vec<NodeKey> = Vec::new();
    for node in &t.nodes {
        let key = t.node_key(node);
        if let Some(n) = nodes.get(&key) {
            if n.turns.iter().any(|turn| turn.replay) {
                turns.clear();
                turn_nodes.clear();
            }
            turns.extend(n.turns.iter().cloned());
            turn_nodes.extend(std::iter::repeat_n(key, n.turns.len()));
        }
    }
    // Statements written as templates are read by the judge rendered, as in the run: the
    // scenario's outcomes when the run was planned (so they are found by the text the run
    // recorded), the rest in the trajectory's scope with the captures it recorded.
    let env = crate::render::snapshot_env();
    let templates = crate::render::Templates::new(Arc::clone(&env));
    let persona = match &scenario.persona {
        Some(trellis_dsl::PersonaRef::Named(id)) => project
            .personas
            .iter()
            .find(|p| p.id.value == id.value)
            .map(|p| Arc::new(p.clone())),
        Some(trellis_dsl::PersonaRef::Inline(p)) => Some(Arc::new(trellis_dsl::Persona::clone(p))),
        None => None,
    };
    let mut scenario = scenario.clone();
    if let (Some(history), Some(sent)) = (
        &mut scenario.history,
        histories.get(&(t.suite.clone(), t.scenario.clone())),
    ) {
        history.messages = Some(Arc::clone(sent));
    }
    let scenario = Arc::new(scenario);
    let scope = crate::render::ScenarioScope::new(Arc::clone(&scenario), persona, &env);
    let scenario = &*crate::render::judge_texts_rendered(&scenario, &templates, &scope);
    let judged = judged_criteria(scenario);
    let mut criteria = std::mem::take(&mut t.criteria);
    let recorded: HashSet<&str> = criteria
        .iter()
        .filter(|c| LlmRuntime::is_judged_kind_name(&c.kind))
        .filter_map(|c| find(&judged, &c.criterion).map(|(text, _)| text))
        .collect();
    counts.not_recorded = judged
        .iter()
        .map(|(text, _)| text)
        .filter(|text| !recorded.contains(text.as_str()))
        .cloned()
        .collect();
    // The checks judged by this rejudge: their calls are this directory's own, the ones
    // its `llm_roles` count (the rest, and the simulated user's, were the original run's).
    let mut judged_now: Vec<crate::record::CriterionRecord> = Vec::new();
    // The simulated user's fidelity check is not judged again (its brief is not recorded):
    // one the budget refused stays cut, so its trajectory is not passed and the rejudged
    // run not complete. Runs before such a refusal was recorded as a cut said it as a
    // failed call, which read as "fidelity unknown" and let the trajectory pass.
    for c in criteria
        .iter_mut()
        .filter(|c| c.kind == crate::record::FIDELITY_KIND)
    {
        if let Some(reason) = c
            .detail
            .as_deref()
            .and_then(|d| d.strip_prefix("not judged: the judge call failed: "))
            .filter(|r| r.starts_with("not sent: --max-llm-"))
        {
            c.detail = Some(format!("not checked: {reason}"));
        }
    }
    for record in &mut criteria {
        // A check the trajectory never reached (it stopped at a fault) is not judged now
        // either; one whose judge a stop or the budget left unasked is: its turns are all
        // there.
        let unasked = record.detail.as_deref().is_some_and(|d| {
            d == crate::record::CUT_BY_STOP || d.starts_with(crate::record::CUT_BY_BUDGET)
        });
        if !LlmRuntime::is_judged_kind_name(&record.kind)
            || (!unasked
                && record
                    .detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with("not checked")))
        {
            continue;
        }
        let Some((text, kind)) = find(&judged, &record.criterion) else {
            counts.not_in_suite += 1;
            continue;
        };
        let upto = match record.turn_index {
            Some(i) => turns
                .iter()
                .position(|turn| turn.turn_index == i)
                .map_or(turns.len(), |p| p + 1),
            None => turns.len(),
        };
        let rendered = crate::render::statement_rendered(kind, |statement| {
            templates.render_source(statement, || scope.with_vars(&t.captures))
        });
        let kind = match rendered {
            Ok(kind) => kind,
            Err(e) => {
                counts.rejudged += 1;
                *record = crate::record::CriterionRecord {
                    status: crate::record::CriterionStatus::Error,
                    detail: Some(crate::render::unrendered_detail(&e)),
                    judge: None,
                    ..record.clone()
                };
                continue;
            }
        };
        let judge = || {
            runtime.judge(JudgeTask {
                criterion_text: text,
                kind: &kind,
                scenario,
                turns: turns.get(..upto).unwrap_or(&turns),
                turn_index: record.turn_index,
                repetition: t.repetition,
                draw,
                call_name: format!(
                    "rejudge of `{}` on {}/{} trajectory `{}` repetition {} (agent `{}`)",
                    record.criterion, t.suite, t.scenario, t.trajectory, t.repetition, t.agent
                ),
                expected_tools: crate::render::expected_tools_rendered(scenario, |text| {
                    templates
                        .render_source(text, || scope.with_vars(&t.captures))
                        .ok()
                }),
            })
        };
        // A check on a turn: judged once for every trajectory through the turn's node.
        let on_node = record
            .turn_index
            .zip(upto.checked_sub(1).and_then(|last| turn_nodes.get(last)));
        let fresh = match on_node {
            Some((turn, node)) => shared
                .cell((node.clone(), turn, format!("{text}\u{0}{kind:?}")))
                .get_or_init(judge)
                .await
                .clone(),
            None => judge().await,
        };
        counts.rejudged += 1;
        if fresh.status != record.status {
            counts.changed += 1;
        }
        judged_now.push(fresh.clone());
        *record = fresh;
    }
    t.status = if t.status == TrajectoryStatus::Skipped && t.skip_reason.is_some() && t.turns == 0 {
        TrajectoryStatus::Skipped
    } else {
        status_of(t.fault.is_some(), &criteria)
    };
    if t.status != TrajectoryStatus::Skipped {
        t.skip_reason = None;
    } else if t.skip_reason.is_none() && criteria.iter().any(|c| c.cut_by_stop()) {
        t.skip_reason = Some(
            "the run was stopped before all its checks were judged (`trellis run --resume` \
             runs it again)"
                .to_owned(),
        );
    }
    // A trajectory that stopped at a judged check (`stop-on-failure`) which no longer fails:
    // the steps after it were never sent, so nothing says how it would have gone.
    if let Some(at) = stopped_at_a_check_that_now_holds(&criteria) {
        t.status = TrajectoryStatus::Skipped;
        t.skip_reason = Some(format!(
            "it stopped at `{at}` (stop-on-failure), which no longer fails: the steps after \
             it were never sent; run it again"
        ));
    }
    t.llm = crate::record::LlmUsage::of(std::iter::empty(), &judged_now).map(Box::new);
    t.criteria = criteria;
    (t, counts)
}

/// The judged check a trajectory's unchecked criteria say it stopped at, when that check no
/// longer failed.
fn stopped_at_a_check_that_now_holds(
    criteria: &[crate::record::CriterionRecord],
) -> Option<String> {
    let at = criteria
        .iter()
        .find_map(|c| crate::record::stopped_at(c.detail.as_deref()?))?;
    criteria
        .iter()
        .find(|c| c.criterion == at && LlmRuntime::is_judged_kind_name(&c.kind))
        .filter(|c| c.status != crate::record::CriterionStatus::Failed)
        .map(|c| c.criterion.clone())
}

/// The current check a recorded one is: the same text, else the `judge` check with the same
/// statement (its threshold, judge or rubric may have changed since). Statements are also
/// matched as runs before this version recorded them (quoted by Rust's `{:?}`, which
/// escapes combining marks and joiners).
fn find<'a>(
    judged: &'a [(String, CriterionKind)],
    recorded: &str,
) -> Option<(&'a str, &'a CriterionKind)> {
    let as_statement = |head: String| recorded == head || recorded.starts_with(&format!("{head} "));
    judged
        .iter()
        .find(|(text, _)| text == recorded)
        .or_else(|| {
            judged.iter().find(|(_, kind)| match kind {
                CriterionKind::Judge { criterion, .. } => {
                    as_statement(format!("judge {}", quoted(criterion)))
                        || as_statement(format!("judge {criterion:?}"))
                }
                CriterionKind::Outcome(Outcome::Statement(s)) => {
                    recorded == format!("outcome {s:?}")
                }
                _ => false,
            })
        })
        .map(|(text, kind)| (text.as_str(), kind))
}

/// The scenario's LLM-judged checks with the text a run records for them.
fn judged_criteria(scenario: &Scenario) -> Vec<(String, CriterionKind)> {
    let mut out = Vec::new();
    let mut add = |c: &Criterion| {
        if LlmRuntime::is_judged(&c.kind) {
            out.push((c.text.clone(), c.kind.clone()));
        }
    };
    for c in scenario.criteria.iter() {
        add(c);
    }
    walk_steps(&scenario.steps, &mut |step| {
        if let StepKind::Expect(cs) = &step.kind {
            cs.iter().for_each(&mut add);
        }
    });
    for o in &scenario.outcomes {
        out.push((
            super::judge::outcome_text(&o.value),
            CriterionKind::Outcome(o.value.clone()),
        ));
    }
    out
}

impl LlmRuntime {
    /// Whether a recorded check's `kind` is LLM-judged.
    pub fn is_judged_kind_name(kind: &str) -> bool {
        matches!(kind, "judge" | "outcome")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_found_as_written_now_and_as_earlier_runs_recorded_it() {
        let statement = "नमस्ते 👨\u{200d}👩";
        let outcome = Outcome::Statement(statement.into());
        let judged = vec![(
            super::super::judge::outcome_text(&outcome),
            CriterionKind::Outcome(outcome),
        )];
        for recorded in [
            format!("outcome \"{statement}\""),
            format!("outcome {statement:?}"),
        ] {
            assert!(find(&judged, &recorded).is_some(), "{recorded}");
        }
        assert!(find(&judged, "outcome \"something else\"").is_none());
    }
}
