//! Whole-project checks that need every file decoded: unique ids, references between
//! definitions, the scenario `needs` graph, and template variables.
//!
//! When a file could not be parsed, references that its definitions might have satisfied are
//! not reported (they would be noise next to the syntax error).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use miette::SourceSpan;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::diagnostics::{Diagnostic, Kind, did_you_mean};
use crate::graph::{NeedError, NeedResolver};
use crate::lang::ValueType;
use crate::model::*;
use crate::template::{self, Names, Scope};

/// The kinds of globally named definitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefKind {
    Agent,
    Persona,
    Tool,
    Provider,
    Judge,
    /// Named by `for-each=`; declared only by a misspelled `dataset` node (datasets are
    /// checked when they are read, `expand.rs`).
    Dataset,
}

impl RefKind {
    /// The kind a `ValueType::Ref` names (`"tool"`, `"provider"`, …).
    fn named(noun: &str) -> Option<RefKind> {
        [
            RefKind::Agent,
            RefKind::Persona,
            RefKind::Tool,
            RefKind::Provider,
            RefKind::Judge,
        ]
        .into_iter()
        .find(|k| k.noun() == noun)
    }

    fn noun(self) -> &'static str {
        match self {
            RefKind::Agent => "agent",
            RefKind::Persona => "persona",
            RefKind::Tool => "tool",
            RefKind::Provider => "provider",
            RefKind::Judge => "judge",
            RefKind::Dataset => "dataset",
        }
    }
}

/// What the loader knows beyond the model, so validation does not report consequences of
/// errors already reported.
#[derive(Clone, Debug, Default)]
pub struct LoadInfo {
    /// Some file's definitions are unknown: an include that could not be loaded, a file
    /// that is not text, or a syntax error in a file that includes others.
    pub broken: bool,
    /// Scenario ids written in files with a syntax error (their `scenario` nodes may not
    /// have decoded): a `needs` naming one is not reported undefined.
    pub unparsed_scenarios: HashSet<String>,
    /// Some file has a syntax error: how many agents the project has is not known (a
    /// scenario's `agent "ID"` reads like a definition), so a scenario naming none is not
    /// asked which.
    pub unparsed: bool,
    /// Definitions that were written but failed to decode.
    pub declared: HashSet<(RefKind, String)>,
    /// Per scenario (by its id span): captures that failed to decode, each with the offset
    /// in the scenario's file of its first `capture` node.
    pub failed_captures: HashMap<Span, HashMap<String, usize>>,
    /// Per [`Project::suites`] index: where `suite "NAME"` was written, if it was.
    pub suite_spans: Vec<Option<Span>>,
    /// The protocols agents may speak: the registry handed to [`crate::load`].
    pub protocols: Vec<&'static crate::lang::ProtocolSpec>,
    /// Scenario `simulator` blocks no `simulate` step takes: nothing runs them, but what is
    /// wrong in them is still an error now rather than once a step is added.
    pub unused_simulators: Vec<Simulator>,
    /// Branch `persona`s no `simulate` step of the branch plays: a name that is not a
    /// persona is still an error (a typo there would otherwise pass unseen).
    pub unused_personas: Vec<std::sync::Arc<PersonaRef>>,
    /// Where each of those (`simulator` or `persona`) was written: [`Project::unplayed`].
    pub unplayed: Vec<Spanned<&'static str>>,
    /// Per `dataset` id: the columns its file has, or `None` when it was not read (a format
    /// this process has no reader of): `row.*` is then not checked.
    pub dataset_columns: HashMap<String, Option<Vec<String>>>,
}

impl LoadInfo {
    pub fn declare(&mut self, kind: RefKind, id: &str) {
        self.declared.insert((kind, id.to_string()));
    }

    /// Adds what decoding one file found (each file is decoded into a `LoadInfo` of its
    /// own, so that the loader can keep it for the next load of an unchanged file).
    pub(crate) fn absorb(&mut self, file: LoadInfo) {
        // Destructured, so that a new field is not forgotten here.
        let LoadInfo {
            broken,
            unparsed_scenarios,
            unparsed,
            declared,
            failed_captures,
            suite_spans,
            protocols: _,
            unused_simulators,
            unused_personas,
            unplayed,
            dataset_columns,
        } = file;
        self.broken |= broken;
        self.unparsed_scenarios.extend(unparsed_scenarios);
        self.unparsed |= unparsed;
        self.declared.extend(declared);
        self.failed_captures.extend(failed_captures);
        self.suite_spans.extend(suite_spans);
        self.unused_simulators.extend(unused_simulators);
        self.unused_personas.extend(unused_personas);
        self.unplayed.extend(unplayed);
        self.dataset_columns.extend(dataset_columns);
    }
}

/// Validates a project built without loader information.
/// Trajectories one scenario may have. Planning lists every one, and each is at least one
/// row of results per repetition; past this the suite is almost certainly a mistake.
pub const MAX_TRAJECTORIES: u64 = 100_000;

/// Runs of one scenario (its trajectories times its `repeat`). Each is at least a row of
/// every table and a journal entry: `repeat 1000000000` would fill a disk, not measure.
pub const MAX_EXECUTIONS: u64 = 1_000_000;

/// A count as a diagnostic says it: `u64::MAX` is where a saturating product stopped.
pub(crate) fn count_label(count: u64) -> String {
    if count == u64::MAX {
        "more than 18 quintillion".to_owned()
    } else {
        count.to_string()
    }
}

pub fn validate(project: &Project) -> Vec<Diagnostic> {
    validate_loaded(project, &LoadInfo::default())
}

/// Validates a freshly loaded project.
pub fn validate_loaded(project: &Project, info: &LoadInfo) -> Vec<Diagnostic> {
    validate_reading_env(project, info).0
}

/// [`validate_loaded`], also returning every `env.NAME` the project's templates read.
pub(crate) fn validate_reading_env(
    project: &Project,
    info: &LoadInfo,
) -> (Vec<Diagnostic>, Vec<Spanned<String>>) {
    let mut v = Validator {
        project,
        info,
        diags: Vec::new(),
        checked_simulators: HashSet::new(),
        persona_checked: HashSet::new(),
        env_reads: Vec::new(),
        shared_template_problems: HashSet::new(),
    };
    v.duplicates();
    v.definitions();
    for (i, suite) in project.suites.iter().enumerate() {
        for scenario in &suite.scenarios {
            v.scenario(i, scenario);
        }
    }
    v.needs();
    (v.diags, v.env_reads)
}

/// Warns of a check written twice where it is evaluated once: in the `expect`s of one turn,
/// or among the trajectory's own checks (`criteria { }`, `expect-tool`). A run records both
/// with the same turn and text, so nothing tells their results apart (criteria.parquet's key
/// is the turn and the check's text) and a join on them doubles rows.
fn duplicate_checks(sc: &Scenario, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    fn warn<'s>(
        seen: &mut HashMap<&'s str, Span>,
        said: &mut HashSet<Span>,
        c: &'s Criterion,
        files: &[SourceFile],
        out: &mut Vec<Diagnostic>,
    ) {
        if let Some(first) = seen.get(c.text.as_str()) {
            // Steps after a branch group are walked once per branch: said once.
            if !said.insert(c.span) {
                return;
            }
            out.push(
                Diagnostic::at_span(
                    Kind::DuplicateCheck,
                    format!("`{}` is checked twice at the same place", c.text),
                    files,
                    c.span,
                    "written again here",
                )
                .with_related(Diagnostic::at_span(
                    Kind::Note,
                    "first written here".to_owned(),
                    files,
                    *first,
                    "first",
                ))
                .with_help(
                    "both results are recorded with the same turn and text, so nothing tells \
                     them apart; remove one",
                ),
            );
        } else {
            seen.insert(&c.text, c.span);
        }
    }
    /// Walks `steps` from `seen` (the checks written since the last turn) and returns the
    /// distinct states the walk can end in: one per way through its branch groups that
    /// leaves other checks pending. The steps after a branch group go on from each
    /// branch's end, walked once per distinct end (most branches end on a turn, all alike),
    /// so a scenario of many forks is not walked once per trajectory.
    fn along<'s>(
        steps: &'s [Step],
        mut seen: HashMap<&'s str, Span>,
        said: &mut HashSet<Span>,
        files: &[SourceFile],
        out: &mut Vec<Diagnostic>,
    ) -> Vec<HashMap<&'s str, Span>> {
        fn add<'s>(ends: &mut Vec<HashMap<&'s str, Span>>, end: HashMap<&'s str, Span>) {
            let same = |e: &HashMap<&str, Span>| {
                e.len() == end.len() && e.keys().all(|k| end.contains_key(k))
            };
            if !ends.iter().any(same) {
                ends.push(end);
            }
        }
        for (i, step) in steps.iter().enumerate() {
            match &step.kind {
                StepKind::Expect(criteria) => {
                    for c in criteria {
                        warn(&mut seen, said, c, files, out);
                    }
                }
                StepKind::Capture { .. } => {}
                // Each branch goes on from the same turn, and the steps after the branch
                // group from each branch's end.
                StepKind::Fork(branches) => {
                    let mut branch_ends = Vec::new();
                    for b in branches {
                        for end in along(&b.steps, seen.clone(), said, files, out) {
                            add(&mut branch_ends, end);
                        }
                    }
                    let rest = steps.get(i + 1..).unwrap_or_default();
                    let mut ends = Vec::new();
                    for start in branch_ends {
                        for end in along(rest, start, said, files, out) {
                            add(&mut ends, end);
                        }
                    }
                    return ends;
                }
                // A new turn.
                _ => seen.clear(),
            }
        }
        vec![seen]
    }
    let mut whole = HashMap::new();
    let mut said = HashSet::new();
    for c in sc.criteria.iter().chain(&sc.expect_tools) {
        warn(&mut whole, &mut said, c, files, out);
    }
    along(&sc.steps, HashMap::new(), &mut said, files, out);
}

/// Warns of two checks at one place (the `expect`s of one turn, or the trajectory's own
/// checks) that contradict each other: `tool X` (or `tools-in-order … X …`) beside `no-tool
/// X` or a bare `no-tool`, and `reply contains="s"` beside `not-contains="s"` (in one node
/// or two). Whatever the agent does, one of them fails, so the scenario can never pass.
fn contradictory_checks(sc: &Scenario, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    /// The tools `c` needs called.
    fn calls(c: &Criterion) -> Vec<&str> {
        match &c.kind {
            CriterionKind::Tool { name, count, .. } if count.is_none_or(|n| n > 0) => {
                vec![name.as_str()]
            }
            CriterionKind::ToolsInOrder(names) => names.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
    /// The reply texts `c` needs said (`true`) or never said (`false`); a template's text is
    /// known only at run time.
    fn texts(c: &Criterion) -> Vec<(&str, bool)> {
        let CriterionKind::Reply(checks) = &c.kind else {
            return Vec::new();
        };
        checks
            .iter()
            .filter_map(|check| match check {
                ReplyCheck::Contains(s) => Some((s.as_str(), true)),
                ReplyCheck::NotContains(s) => Some((s.as_str(), false)),
                _ => None,
            })
            .filter(|(s, _)| !s.contains("{{") && !s.contains("{%"))
            .collect()
    }
    /// Why `a` and `b` (the same criterion, or `a` written first) can never both pass.
    fn conflict(a: &Criterion, b: &Criterion) -> Option<String> {
        for (x, y) in [(a, b), (b, a)] {
            if let CriterionKind::NoTool { name } = &y.kind {
                let needed = calls(x);
                let hit = match name {
                    Some(name) => needed.iter().find(|n| **n == name.as_str()),
                    None => needed.first(),
                };
                if let Some(tool) = hit {
                    return Some(format!(
                        "`{}` needs a call to `{tool}` that `{}` forbids",
                        x.text, y.text
                    ));
                }
            }
        }
        let (ta, tb) = (texts(a), texts(b));
        for (s, says) in &ta {
            if tb.iter().any(|(t, other)| t == s && other != says) {
                return Some(format!(
                    "the reply must contain {s:?} and must not contain it"
                ));
            }
        }
        None
    }
    fn group(checks: &[&Criterion], files: &[SourceFile], out: &mut Vec<Diagnostic>) {
        for (i, later) in checks.iter().enumerate() {
            for earlier in &checks[..=i] {
                let same = std::ptr::eq(*earlier, *later);
                let Some(why) = conflict(earlier, later) else {
                    continue;
                };
                let mut d = Diagnostic::at_span(
                    Kind::NeverPasses,
                    format!("`{}` can never pass here: {why}", later.text),
                    files,
                    later.span,
                    "fails whatever the agent does",
                )
                .with_help(
                    "checks at one place (the `expect`s of a turn, or a trajectory's \
                     `criteria`) must all hold together: remove one, or check them on \
                     different turns",
                );
                if !same {
                    d = d.with_related(Diagnostic::at_span(
                        Kind::Note,
                        "contradicted by this check".to_owned(),
                        files,
                        earlier.span,
                        "written here",
                    ));
                }
                out.push(d);
                break;
            }
        }
    }
    fn walk(steps: &[Step], files: &[SourceFile], out: &mut Vec<Diagnostic>) {
        let mut turn: Vec<&Criterion> = Vec::new();
        for step in steps {
            match &step.kind {
                StepKind::Expect(list) => turn.extend(list),
                StepKind::Capture { .. } => {}
                StepKind::Fork(branches) => {
                    group(&turn, files, out);
                    turn.clear();
                    for b in branches {
                        walk(&b.steps, files, out);
                    }
                }
                _ => {
                    group(&turn, files, out);
                    turn.clear();
                }
            }
        }
        group(&turn, files, out);
    }
    let whole: Vec<&Criterion> = sc.criteria.iter().chain(&sc.expect_tools).collect();
    group(&whole, files, out);
    walk(&sc.steps, files, out);
}

/// A `turns max=N` check below the agent turns its path has already scripted when it is
/// checked (an `expect` after the steps before it; a trajectory's `criteria` after all of
/// its path's steps): it fails whatever the agent does. Only scripted turns (`user`, `call`,
/// an agent's opening turn) are counted: a simulation may end early.
fn turns_checks_never_passing(sc: &Scenario, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    fn max_of(c: &Criterion) -> Option<u64> {
        match c.kind {
            CriterionKind::Turns { max } => Some(u64::from(max)),
            _ => None,
        }
    }
    fn say(c: &Criterion, taken: u64, max: u64, whole: bool, files: &[SourceFile]) -> Diagnostic {
        let turns = if taken == 1 { "turn is" } else { "turns are" };
        Diagnostic::at_span(
            Kind::NeverPasses,
            match whole {
                false => format!(
                    "`turns max={max}` can never pass here: {taken} agent {turns} scripted \
                     before it is checked"
                ),
                true => format!(
                    "`turns max={max}` can never pass on the scenario's longest path: \
                     {taken} agent {turns} scripted on it"
                ),
            },
            files,
            c.span,
            "fails whatever the agent does",
        )
        .with_help(format!(
            "a `user`, a `call` and an agent's opening turn each take one: raise `max` to at \
             least {taken}, or check fewer turns"
        ))
    }
    /// Walks `steps` from `before`, the most turns any path has taken on reaching them,
    /// warning at each step-level check below it, and returns the most turns any path
    /// through them ends with. Linear in the steps: a scenario's paths can be too many to
    /// walk one by one (a fork of forks), and one path that fails it is enough.
    fn walk(
        steps: &[Step],
        mut before: u64,
        files: &[SourceFile],
        out: &mut Vec<Diagnostic>,
    ) -> u64 {
        for step in steps {
            match &step.kind {
                StepKind::User(_) | StepKind::Call { .. } => before += 1,
                StepKind::Expect(list) => {
                    for c in list {
                        if let Some(max) = max_of(c)
                            && before > max
                        {
                            out.push(say(c, before, max, false, files));
                        }
                    }
                }
                StepKind::Fork(branches) => {
                    before = branches
                        .iter()
                        .map(|branch| walk(&branch.steps, before, files, out))
                        .max()
                        .unwrap_or(before);
                }
                _ => {}
            }
        }
        before
    }
    let opening = u64::from(sc.first_turn == FirstTurn::Agent);
    let most = walk(&sc.steps, opening, files, out);
    // A trajectory-level check fails on a path that scripts more; said with the most.
    for c in sc.criteria.iter() {
        if let Some(max) = max_of(c)
            && most > max
        {
            out.push(say(c, most, max, true, files));
        }
    }
}

/// A `max-turns` below the turns a path's steps take: with scripted steps past it, every
/// trajectory of that path fails at the limit whatever the agent does ("reached max-turns
/// with scripted steps left"), which is the suite's arithmetic, not the agent's behaviour;
/// with a `simulate turns=N` past it, the conversation is cut short at the limit and the
/// path passes on fewer turns than written. `simulate until-done` is not counted: how many
/// turns it takes is the simulator's to decide, up to the limit.
fn scripted_past_max_turns(sc: &Scenario, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    /// The most agent turns any path through `steps` takes, scripted and in all (with
    /// `simulate turns=N`), each the path that takes the most of it.
    fn most(steps: &[Step]) -> (u64, u64) {
        let (mut scripted, mut all) = (0u64, 0u64);
        for (i, step) in steps.iter().enumerate() {
            match &step.kind {
                StepKind::User(_) | StepKind::Call { .. } => {
                    scripted += 1;
                    all += 1;
                }
                StepKind::Simulate { turns: Some(n), .. } => all += u64::from(*n),
                StepKind::Fork(branches) => {
                    let widest = branches
                        .iter()
                        .map(|b| most(&b.steps))
                        .fold((0, 0), |(s, a), (bs, ba)| (s.max(bs), a.max(ba)));
                    let rest = most(steps.get(i + 1..).unwrap_or_default());
                    return (scripted + widest.0 + rest.0, all + widest.1 + rest.1);
                }
                _ => {}
            }
        }
        (scripted, all)
    }
    let Some(max) = sc.max_turns else {
        return;
    };
    let opening = u64::from(sc.first_turn == FirstTurn::Agent);
    let (scripted, all) = most(&sc.steps);
    let (scripted, all) = (scripted + opening, all + opening);
    let max = u64::from(max);
    if all <= max {
        return;
    }
    let diag = if scripted > max {
        Diagnostic::at_span(
            Kind::MaxTurns,
            format!(
                "scenario `{}` scripts {scripted} agent turns on its longest path, past its \
                 `max-turns {max}`: that path fails at the limit whatever the agent does",
                sc.id.value
            ),
            files,
            sc.id.span,
            "more scripted turns than max-turns",
        )
        .with_help(format!(
            "raise `max-turns` to at least {scripted}, or script fewer steps (a `user`, a \
             `call` and an agent's opening turn each take one)"
        ))
    } else {
        Diagnostic::at_span(
            Kind::MaxTurns,
            format!(
                "scenario `{}` asks for {all} agent turns on its longest path, its `simulate \
                 turns=…` included, past its `max-turns {max}`: the simulated conversation is \
                 cut at the limit, and the path passes on fewer turns than written",
                sc.id.value
            ),
            files,
            sc.id.span,
            "more turns than max-turns",
        )
        .with_help(format!(
            "raise `max-turns` to at least {all}, or simulate fewer turns"
        ))
    };
    out.push(diag);
}

/// A `branch` with no sibling (another step between it and the next `branch`, or none
/// after it): a fork of one, whose steps just run in sequence with what follows, where
/// alternatives were most likely meant (an `expect` written between two branches splits
/// them into two forks of one each).
fn lone_branches(steps: &[Step], files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    for step in steps {
        let StepKind::Fork(branches) = &step.kind else {
            continue;
        };
        if let [only] = branches.as_slice() {
            out.push(
                Diagnostic::at_span(
                    Kind::LoneBranch,
                    format!(
                        "`branch \"{}\"` has no sibling: a fork of one, whose steps run in \
                         sequence with the rest, not as an alternative",
                        only.name.value
                    ),
                    files,
                    only.name.span,
                    "a fork of one",
                )
                .with_help(
                    "branches are alternatives only when written one right after another; \
                     move the step between them (an `expect`, say) into each branch or after \
                     the group, or write the steps without `branch`",
                ),
            );
        }
        for branch in branches {
            lone_branches(&branch.steps, files, out);
        }
    }
}

/// A scenario, or a path through its branches, with no step that calls the agent (no
/// `user`, `call`, `simulate` or `attack`, the agent does not speak first and no `history`
/// may end with a user message): `run`
/// records its trajectories as skipped ("the agent was never called"), which `check`
/// said nothing of.
fn never_calls_the_agent(sc: &Scenario, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    // A `history` ending with a user message makes that message the first turn.
    if sc.first_turn == FirstTurn::Agent || sc.history.is_some() {
        return;
    }
    let Some(path) = silent_path(&[&sc.steps]) else {
        return;
    };
    let (on, span, label) = match path.last() {
        Some(last) => (
            format!(
                " on branch `{}`",
                path.iter()
                    .map(|b| b.value.as_str())
                    .collect::<Vec<_>>()
                    .join("/")
            ),
            last.span,
            "no agent turn on this path",
        ),
        None => (String::new(), sc.id.span, "no agent turn"),
    };
    out.push(
        Diagnostic::at_span(
            Kind::NotRunnable,
            format!(
                "scenario `{}` never calls the agent{on}: no `user`, `call`, `simulate` or \
                 `attack` step, so {} skipped",
                sc.instance.as_ref().map_or(&sc.id.value, |i| &i.base),
                if path.is_empty() {
                    "its trajectories are"
                } else {
                    "that trajectory is"
                }
            ),
            files,
            span,
            label,
        )
        .with_help(
            "add the message the agent answers (`user \"…\"`), or `first-turn \"agent\"` \
             when the agent speaks first",
        ),
    );
}

/// The branches to a trajectory none of whose steps (`parts`, in order) takes a turn;
/// `None` when every path takes one.
fn silent_path<'a>(parts: &[&'a [Step]]) -> Option<Vec<&'a Spanned<String>>> {
    for (p, part) in parts.iter().enumerate() {
        for (i, step) in part.iter().enumerate() {
            match &step.kind {
                StepKind::User(_)
                | StepKind::Simulate { .. }
                | StepKind::Call { .. }
                | StepKind::Attack(_) => return None,
                StepKind::Fork(branches) => {
                    // Each branch, then what follows the group on every one.
                    for branch in branches {
                        let mut rest: Vec<&'a [Step]> = vec![&branch.steps, &part[i + 1..]];
                        rest.extend(parts.iter().skip(p + 1).copied());
                        if let Some(mut path) = silent_path(&rest) {
                            path.insert(0, &branch.name);
                            return Some(path);
                        }
                    }
                    return None;
                }
                _ => {}
            }
        }
    }
    Some(Vec::new())
}

/// A `simulator` or branch `persona` that no `simulate` step under it plays.
fn unplayed(node: &Spanned<&'static str>, files: &[SourceFile]) -> Diagnostic {
    let (message, help) = match node.value {
        "persona" => (
            "this branch's `persona` is never played: no `simulate` step in the branch",
            "a branch's persona is who the simulated user is in that branch's `simulate` \
             steps; add one (`simulate turns=2`), or remove the persona (the judge and \
             `persona.*` keep the scenario's)",
        ),
        _ => (
            "this `simulator` is never used: no `simulate` step under it",
            "a scenario's or branch's `simulator` shapes the simulated user of the `simulate` \
             steps written inside it (a branch's not those after its fork group); add one \
             (`simulate turns=2`), or remove the block",
        ),
    };
    Diagnostic::at_span(
        Kind::Unplayed,
        message,
        files,
        node.span,
        "nothing plays it",
    )
    .with_help(help)
}

/// `needs` on a `draft` or `archived` scenario: it does not run without
/// `--include-inactive`, so the scenario that needs it is skipped every time.
/// `needs` are found through `resolver`, built once for the project: scanning the suites for
/// each need was quadratic in a project of thousands of chained scenarios.
fn needs_of_inactive(
    project: &Project,
    resolver: &crate::graph::NeedResolver<'_>,
    suite: usize,
    sc: &Scenario,
    out: &mut Vec<Diagnostic>,
) {
    if sc.status != Status::Active {
        return;
    }
    for need in &sc.needs {
        let Some(needed) = resolver
            .resolve(suite, &need.value)
            .ok()
            .and_then(|(si, ci)| project.suites.get(si)?.scenarios.get(ci))
        else {
            continue;
        };
        let status = match needed.status {
            Status::Active => continue,
            Status::Draft => "a draft",
            Status::Archived => "archived",
        };
        out.push(
            Diagnostic::at_span(
                Kind::NotRunnable,
                format!(
                    "scenario `{}` needs `{}`, which is {status} and does not run by default: \
                     `{}` is skipped unless the run is given --include-inactive",
                    sc.id.value, need.value, sc.id.value
                ),
                &project.files,
                need.span,
                "needs an inactive scenario",
            )
            .with_help(format!(
                "make `{}` active (`status \"active\"`, the default), or run with \
                 --include-inactive",
                need.value
            )),
        );
    }
}

/// One diagnostic of `kind` on each of `ids`, files with no nodes: a warning beside other
/// files (a file just created in an editor), an error when nothing else was loaded.
pub(crate) fn empty_files(project: &Project, ids: &[FileId], kind: Kind) -> Vec<Diagnostic> {
    ids.iter()
        .filter_map(|&id| {
            let file = project.files.get(id)?;
            Some(
                Diagnostic::at(
                    kind,
                    format!("`{}` holds no suite: it has no nodes", file.name),
                    id,
                    file,
                    miette::SourceSpan::from(0..0),
                    "nothing here",
                )
                .with_help("write `scenario` nodes (and `agent`s) in it, or remove it"),
            )
        })
        .collect()
}

/// What `trellis check` warns about in a valid project: scenarios that check nothing (their
/// trajectories are recorded as skipped, not passed), `env` variables a template reads
/// that `env` says are unset (rendering fails at run time; one warning per variable, at
/// its first use), a provider's API key unset or empty (the run refuses both), and the
/// rest of [`Kind`]'s warnings. `env` reads a variable as `trellis run` would.
pub fn warnings(project: &Project, env: impl Fn(&str) -> Option<String>) -> Vec<Diagnostic> {
    let files = &project.files;
    let mut out = project.column_warnings.clone();
    // Instances of one `for-each` / `matrix` scenario share its steps: one warning for all.
    let mut warned: HashSet<(Span, &str)> = HashSet::new();
    // Built only when some scenario has needs: a project of 100,000 dataset instances and
    // none would index them all for nothing.
    let resolver = project
        .scenarios()
        .any(|(_, sc)| !sc.needs.is_empty())
        .then(|| crate::graph::NeedResolver::of(project));
    let in_suites = project
        .suites
        .iter()
        .enumerate()
        .flat_map(|(si, s)| s.scenarios.iter().map(move |sc| (si, &**sc)));
    for (suite, sc) in in_suites {
        let first_instance = sc
            .instance
            .as_ref()
            .is_none_or(|i| warned.insert((sc.id.span, i.base.as_str())));
        if first_instance {
            duplicate_checks(sc, files, &mut out);
            scripted_past_max_turns(sc, files, &mut out);
            turns_checks_never_passing(sc, files, &mut out);
            contradictory_checks(sc, files, &mut out);
            lone_branches(&sc.steps, files, &mut out);
            never_calls_the_agent(sc, files, &mut out);
            if let Some(resolver) = &resolver {
                needs_of_inactive(project, resolver, suite, sc, &mut out);
            }
        }
        if first_instance && !checks_something(sc) {
            let shown = match &sc.instance {
                Some(i) => format!("{} (every instance)", i.base),
                None => sc.id.value.clone(),
            };
            out.push(
                Diagnostic::at_span(
                    Kind::NoChecks,
                    format!(
                        "scenario `{shown}` checks nothing: its trajectories will be skipped, \
                         not passed (an `error` where a turn faults)"
                    ),
                    files,
                    sc.id.span,
                    "no `expect`, `criteria`, `expect-tool` or `outcome`",
                )
                .with_help(
                    "add the checks it is meant to pass, or `expect no-error` if a run without \
                     a fault is what it tests",
                ),
            );
        }
    }
    out.extend(empty_files(project, &project.empty_files, Kind::EmptyFile));
    out.extend(project.unplayed.iter().map(|node| unplayed(node, files)));
    for (id, why) in &project.empty_expansions {
        out.push(
            Diagnostic::at_span(
                Kind::NotRunnable,
                format!("scenario `{}` has no instance to run: {why}", id.value),
                files,
                id.span,
                "runs once per row",
            )
            .with_help("check the dataset's file and its `filter`, `sample` and `limit`"),
        );
    }
    out.extend(tool_typos(project, &mut warned));
    out.extend(missing_paths(project));
    for p in &project.providers {
        let Some(var) = &p.api_key_env else {
            continue;
        };
        // An empty key is refused as a missing one (`engine/src/llm/provider.rs`): it is what
        // a CI secret a pull request from a fork cannot read expands to.
        let (state, empty) = match env(&var.value) {
            Some(value) if !value.is_empty() => continue,
            Some(_) => ("is empty", true),
            None => ("is not set", false),
        };
        out.push(
            Diagnostic::at_span(
                Kind::UnsetEnv,
                format!(
                    "environment variable `{}` (the API key of provider `{}`) {state}",
                    var.value, p.id.value
                ),
                files,
                var.span,
                "read when the run starts",
            )
            .with_help(format!(
                "export `{}` before `trellis run`{}: every call through `{}` fails without it \
                 (remove `api-key-env` for a local server that needs no key)",
                var.value,
                if empty {
                    " with a value (a CI secret a pull request from a fork cannot read is \
                     empty)"
                } else {
                    ""
                },
                p.id.value
            )),
        );
    }
    let mut uses: Vec<(&str, Span, usize)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for read in project.env_reads.iter().filter(|r| env(&r.value).is_none()) {
        match index.get(read.value.as_str()) {
            Some(&i) => uses[i].2 += 1,
            None => {
                index.insert(&read.value, uses.len());
                uses.push((&read.value, read.span, 0));
            }
        }
    }
    for (name, span, more) in uses {
        let label = match more {
            0 => "read here".to_string(),
            1 => "read here and in 1 more place".to_string(),
            n => format!("read here and in {n} more places"),
        };
        out.push(
            Diagnostic::at_span(
                Kind::UnsetEnv,
                format!("environment variable `{name}` is not set"),
                files,
                span,
                label,
            )
            .with_help(format!(
                "set `{name}` in the environment of `trellis run`: rendering this template \
                 without it fails at run time"
            )),
        );
    }
    out
}

/// Whether any step, branch or trajectory-level node of `sc` checks something.
fn checks_something(sc: &Scenario) -> bool {
    fn in_steps(steps: &[Step]) -> bool {
        steps.iter().any(|s| match &s.kind {
            StepKind::Expect(criteria) => !criteria.is_empty(),
            // Every path of an attack is checked against its goal.
            StepKind::Attack(_) => true,
            StepKind::Fork(branches) => branches.iter().any(|b| in_steps(&b.steps)),
            _ => false,
        })
    }
    !sc.criteria.is_empty()
        || !sc.expect_tools.is_empty()
        || !sc.outcomes.is_empty()
        || in_steps(&sc.steps)
}

struct Validator<'p> {
    project: &'p Project,
    info: &'p LoadInfo,
    diags: Vec<Diagnostic>,
    /// Simulator layers already checked (a scenario's is shared by all its `simulate` steps).
    checked_simulators: HashSet<Span>,
    /// Simulator layers looked at for `persona` reads where a step without a persona uses
    /// them ([`Validator::persona_reads`]).
    persona_checked: HashSet<Span>,
    /// Every `env.NAME` a template reads, for [`warnings`].
    env_reads: Vec<Spanned<String>>,
    /// Problems already reported in a template several scenarios share (an agent's `header`
    /// value or `system-prompt`, a persona's texts; file, offset, message): each scenario
    /// checks it again.
    shared_template_problems: HashSet<(FileId, usize, String)>,
}

impl<'p> Validator<'p> {
    fn files(&self) -> &'p [SourceFile] {
        &self.project.files
    }

    /// The checks a protocol's own settings get from their type in its spec: references to
    /// declarations resolve, templates parse and read only what is in scope where they are
    /// rendered (once per run, with the scenario's `user_context`, `persona` and `scenario`).
    fn protocol_settings(&mut self, agent: &Agent) {
        for setting in agent.settings.0.iter().filter(|s| !s.checked) {
            let Some(arg) = setting_value(agent, setting.name) else {
                continue;
            };
            let texts: Vec<(&str, Span)> = match &setting.value.value {
                serde_json::Value::String(text) => {
                    vec![(text.as_str(), setting.value.span)]
                }
                serde_json::Value::Array(values) => values
                    .iter()
                    .zip(&setting.items)
                    .filter_map(|(v, span)| Some((v.as_str()?, *span)))
                    .collect(),
                _ => Vec::new(),
            };
            for (text, span) in texts {
                match arg.ty {
                    ValueType::Ref(kind) => {
                        if let Some(kind) = RefKind::named(kind) {
                            let name = Spanned {
                                value: text.to_owned(),
                                span,
                            };
                            self.reference(kind, &name);
                        }
                    }
                    ValueType::Template | ValueType::TurnTemplate(_) => {
                        // An agent serves many scenarios, so what is scenario-specific
                        // (`user_context`, `vars`) is not checked against one of them.
                        let mut scope = Scope::env_only()
                            .with("user_context", Names::Any)
                            .with("persona", Names::Any)
                            .with("scenario", Names::Any);
                        if let ValueType::TurnTemplate(names) = arg.ty {
                            for name in names {
                                scope = scope.with(name, Names::Any);
                            }
                        }
                        let template = Template {
                            source: text.to_owned(),
                            span,
                        };
                        self.check_template(&template, &scope);
                    }
                    _ => {}
                }
            }
        }
    }

    fn check_template(&mut self, t: &Template, scope: &Scope) {
        let diags = template::check_reading_env(t, scope, self.files(), &mut self.env_reads);
        self.diags.extend(diags);
    }

    fn duplicate_ids<'a>(
        &mut self,
        ids: impl Iterator<Item = &'a Spanned<String>>,
        noun: &str,
        help: &str,
    ) {
        // Keyed by the NFC form: "café" typed on two keyboards (one precomposed `é`, one `e`
        // and a combining accent) looks the same everywhere, so it is one id.
        let mut first: HashMap<String, (&str, Span)> = HashMap::new();
        for id in ids {
            let key = crate::names::nfc(&id.value).into_owned();
            if let Some(&(spelling, prev)) = first.get(&key) {
                let (message, help) = if spelling == id.value {
                    (format!("duplicate {noun} `{}`", id.value), help.to_string())
                } else {
                    (
                        format!(
                            "duplicate {noun} `{}`: the same id as `{spelling}`, written with \
                             other Unicode code points",
                            id.value
                        ),
                        format!(
                            "one is written with precomposed characters (NFC), the other with \
                             combining marks (NFD); ids are compared in NFC. {help}"
                        ),
                    )
                };
                let d = Diagnostic::at_span(
                    Kind::DuplicateId,
                    message,
                    self.files(),
                    id.span,
                    "defined again here",
                )
                .with_other(self.files(), prev, "first defined here")
                .with_help(help);
                self.diags.push(d);
            } else {
                first.insert(key, (&id.value, id.span));
            }
        }
    }

    fn duplicates(&mut self) {
        let p = self.project;
        let global = "ids are global across all loaded files; rename one of them";
        self.duplicate_ids(p.agents.iter().map(|a| &a.id), "agent", global);
        self.duplicate_ids(p.personas.iter().map(|a| &a.id), "persona", global);
        self.duplicate_ids(p.tools.iter().map(|a| &a.name), "tool", global);
        self.duplicate_ids(p.providers.iter().map(|a| &a.id), "provider", global);
        self.duplicate_ids(
            p.judges
                .iter()
                .map(|a| &a.id)
                .chain(p.panels.iter().map(|a| &a.id)),
            "judge",
            global,
        );

        let suites: Vec<Spanned<String>> = p
            .suites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let span = self
                    .info
                    .suite_spans
                    .get(i)
                    .copied()
                    .flatten()
                    .unwrap_or(Span::new(s.file, SourceSpan::from(0..0)));
                Spanned::new(s.name.clone(), span)
            })
            .collect();
        self.duplicate_ids(
            suites.iter(),
            "suite",
            "suite names are unique across the files loaded together, and a file without \
             `suite \"NAME\"` is named after its file name (in whatever directory): give one \
             of them a name of its own, e.g. `suite \"billing-smoke\"` as its first node",
        );
        for suite in &p.suites {
            self.duplicate_ids(
                suite.scenarios.iter().map(|s| &s.id),
                "scenario",
                "scenario ids are unique within a suite file; rename one of them",
            );
        }
    }

    fn defined(&self, kind: RefKind, name: &str) -> bool {
        let p = self.project;
        let found = match kind {
            RefKind::Agent => p.agent(name).is_some(),
            RefKind::Persona => p.persona(name).is_some(),
            RefKind::Tool => p.tool(name).is_some(),
            RefKind::Provider => p.provider(name).is_some(),
            RefKind::Judge => p.judge(name).is_some() || p.panel(name).is_some(),
            RefKind::Dataset => p.datasets.iter().any(|d| d.id.value == name),
        };
        found || self.info.declared.contains(&(kind, name.to_string()))
    }

    /// The ids of `kind` a reference may name: those defined, and those declared by a node
    /// that has errors of its own (a typo naming such an agent still gets `did you mean`).
    fn names(&self, kind: RefKind) -> Vec<&'p str> {
        let mut names = self.defined_names(kind);
        let info: &'p LoadInfo = self.info;
        let mut broken: Vec<&'p str> = info
            .declared
            .iter()
            .filter(|(k, id)| *k == kind && !names.contains(&id.as_str()))
            .map(|(_, id)| id.as_str())
            .collect();
        // A set's order is not the suite's: sorted, so the help reads the same every time.
        broken.sort_unstable();
        names.extend(broken);
        // An id defined twice (an error of its own) is one name to choose from.
        let mut seen = HashSet::new();
        names.retain(|name| seen.insert(*name));
        names
    }

    fn defined_names(&self, kind: RefKind) -> Vec<&'p str> {
        let p = self.project;
        match kind {
            RefKind::Agent => p.agents.iter().map(|a| a.id.value.as_str()).collect(),
            RefKind::Persona => p.personas.iter().map(|a| a.id.value.as_str()).collect(),
            RefKind::Tool => p.tools.iter().map(|a| a.name.value.as_str()).collect(),
            RefKind::Provider => p.providers.iter().map(|a| a.id.value.as_str()).collect(),
            RefKind::Judge => p
                .judges
                .iter()
                .map(|a| a.id.value.as_str())
                .chain(p.panels.iter().map(|a| a.id.value.as_str()))
                .collect(),
            RefKind::Dataset => p.datasets.iter().map(|d| d.id.value.as_str()).collect(),
        }
    }

    fn reference(&mut self, kind: RefKind, name: &Spanned<String>) {
        if self.defined(kind, &name.value) || self.info.broken {
            return;
        }
        let noun = kind.noun();
        let help = reference_help(&name.value, &self.names(kind), noun);
        let d = Diagnostic::at_span(
            Kind::UndefinedReference,
            format!("undefined {noun} `{}`", name.value),
            self.files(),
            name.span,
            format!("no {noun} with this id"),
        )
        .with_help(help);
        self.diags.push(d);
    }

    fn definitions(&mut self) {
        let p = self.project;
        // An agent no scenario runs against never renders its templates: its `env` reads
        // are nothing `check` needs to warn about.
        let used: HashSet<&str> = p
            .scenarios()
            .flat_map(|(_, sc)| p.scenario_agents(sc))
            .map(|a| a.id.value.as_str())
            .collect();
        for agent in &p.agents {
            let env_reads_before = self.env_reads.len();
            self.protocol_settings(agent);
            if let Some(name) = &agent.provider {
                self.reference(RefKind::Provider, name);
                self.agent_provider(agent, name);
            }
            // A header reading the turn's variables is checked with each scenario that runs
            // against the agent (`Validator::turn_templates`); one reading only `env` here.
            let header_scope = Scope::env_only();
            for (_, value) in &agent.headers {
                if !template::reads_turn_scope(&value.source) {
                    self.check_template(value, &header_scope);
                }
            }
            // A URL is rendered once per run, with `env` only.
            if let Endpoint::Url(url) = &agent.endpoint
                && template::is_template(&url.source)
            {
                self.check_template(url, &header_scope);
            }
            if !used.contains(agent.id.value.as_str()) {
                self.env_reads.truncate(env_reads_before);
            }
        }
        if let Some(sim) = &p.simulator {
            self.simulator(sim, None);
        }
        for sim in &self.info.unused_simulators {
            self.simulator(sim, None);
        }
        for persona in &self.info.unused_personas {
            if let PersonaRef::Named(name) = &**persona {
                self.reference(RefKind::Persona, name);
            }
        }
        for judge in &p.judges {
            self.reference(RefKind::Provider, &judge.provider);
        }
        for panel in &p.panels {
            for member in &panel.judges {
                // A panel's members are judges: a panel among them (itself, or another)
                // has no judge of its own to ask.
                if p.judge(&member.value).is_none()
                    && let Some(named) = p.panel(&member.value)
                {
                    let d = Diagnostic::at_span(
                        Kind::InvalidValue,
                        format!(
                            "panel `{}` lists `{}`, which is a panel, not a judge",
                            panel.id.value, member.value
                        ),
                        self.files(),
                        member.span,
                        "a panel",
                    )
                    .with_other(self.files(), named.id.span, "defined as a panel here")
                    .with_help(
                        "a panel's `judges` are `judge` ids; list that panel's judges \
                         instead",
                    );
                    self.diags.push(d);
                    continue;
                }
                if self.defined(RefKind::Judge, &member.value) || self.info.broken {
                    continue;
                }
                // Offered among the judges only: a panel (this one included) cannot be a
                // member.
                let judges: Vec<&str> = p.judges.iter().map(|j| j.id.value.as_str()).collect();
                let d = Diagnostic::at_span(
                    Kind::UndefinedReference,
                    format!("undefined judge `{}`", member.value),
                    self.files(),
                    member.span,
                    "no judge with this id",
                )
                .with_help(reference_help(&member.value, &judges, "judge"));
                self.diags.push(d);
            }
        }
    }

    /// A model under test reached through a provider speaks that provider's API and needs a
    /// model from one of them.
    fn agent_provider(&mut self, agent: &crate::model::Agent, name: &Spanned<String>) {
        let Some(provider) = self.project.provider(&name.value) else {
            return;
        };
        // A model API is reached through the provider kind of the same name.
        if !agent.protocol.is_model() {
            return;
        }
        if provider.kind.as_str() != agent.protocol.as_str() {
            let d = Diagnostic::at_span(
                Kind::InvalidValue,
                format!(
                    "agent `{}` is `{}` but provider `{}` speaks the other API",
                    agent.id.value,
                    agent.protocol.as_str(),
                    name.value
                ),
                self.files(),
                name.span,
                "a provider of another kind",
            )
            .with_help(
                "an `openai` agent needs a provider with kind=\"openai\", an `anthropic` agent \
                 one with kind=\"anthropic\"",
            );
            self.diags.push(d);
        }
        if agent.model.is_none() && provider.model.is_none() {
            let d = Diagnostic::at_span(
                Kind::Missing,
                format!(
                    "agent `{}` needs a `model`: provider `{}` names none",
                    agent.id.value, name.value
                ),
                self.files(),
                agent.id.span,
                "no model",
            )
            .with_help("add model=\"…\" to the agent or to the provider");
            self.diags.push(d);
        }
    }

    fn scenario(&mut self, suite: usize, sc: &Scenario) {
        let trajectories = crate::graph::TrajectoryGraph::count(sc);
        if trajectories > MAX_TRAJECTORIES {
            let count = count_label(trajectories);
            let d = Diagnostic::at_span(
                Kind::OutOfRange,
                format!(
                    "scenario `{}` forks into {count} trajectories (at most {MAX_TRAJECTORIES})",
                    sc.id.value
                ),
                self.files(),
                sc.id.span,
                "too many trajectories",
            )
            .with_help(
                "consecutive fork groups multiply: 2 branches in each of 20 groups make a million \
                 trajectories; nest branches or split the scenario",
            );
            self.diags.push(d);
        } else if trajectories.saturating_mul(u64::from(sc.repeat)) > MAX_EXECUTIONS {
            let d = Diagnostic::at_span(
                Kind::OutOfRange,
                format!(
                    "scenario `{}` runs {} times: {} × `repeat {}` (at most {MAX_EXECUTIONS})",
                    sc.id.value,
                    trajectories.saturating_mul(u64::from(sc.repeat)),
                    if trajectories == 1 {
                        "1 trajectory".to_owned()
                    } else {
                        format!("{trajectories} trajectories")
                    },
                    sc.repeat
                ),
                self.files(),
                sc.id.span,
                "too many runs",
            )
            .with_help(
                "every run of a trajectory is a row of each results table and an entry of the \
                 journal; lower `repeat` (pass^k and Wilson intervals need tens, not millions)",
            );
            self.diags.push(d);
        }
        // `row-id` reads the row's columns only; a column no row has is one mistake, said
        // once with the columns' names (rendering it would fail on every row).
        if let (Some(t), Some(ds)) = (&sc.row_id, &sc.for_each) {
            let names = match self.info.dataset_columns.get(&ds.value) {
                Some(Some(columns)) => Names::Only(columns.iter().cloned().collect()),
                _ => Names::Any,
            };
            self.check_template(t, &Scope::env_only().with("row", names));
        }
        for agent in &sc.agents {
            self.reference(RefKind::Agent, agent);
        }
        // Ids, not nodes: an agent defined twice is one agent (and a `duplicate_id` error
        // of its own), not a reason to ask which agent.
        let agent_ids: HashSet<&str> = self
            .project
            .agents
            .iter()
            .map(|a| a.id.value.as_str())
            .collect();
        let declared_agents = self
            .info
            .declared
            .iter()
            .filter(|(k, id)| *k == RefKind::Agent && !agent_ids.contains(id.as_str()))
            .count();
        let agent_count = agent_ids.len() + declared_agents;
        // With a file that did not parse, a scenario may have lost its `agent` line to the
        // error, and a broken file's agent lines may be references, not definitions: only a
        // project with no agent at all is told so.
        let count_unknown = self.info.unparsed && agent_count > 0;
        if sc.agents.is_empty() && agent_count != 1 && !self.info.broken && !count_unknown {
            let help = if agent_count == 0 {
                "define an agent, e.g. agent \"demo\" protocol=\"connexity\" builtin=\"booking\""
                    .to_string()
            } else {
                format!(
                    "the project defines several agents ({}); add `agent \"ID\"` or `agents \"ID\"…`",
                    quoted(&self.names(RefKind::Agent))
                )
            };
            let d = Diagnostic::at_span(
                Kind::AmbiguousAgent,
                format!(
                    "scenario `{}` does not say which agent it runs against",
                    sc.id.value
                ),
                self.files(),
                sc.id.span,
                "which agent?",
            )
            .with_help(help);
            self.diags.push(d);
        }
        if let Some(PersonaRef::Named(name)) = &sc.persona {
            self.reference(RefKind::Persona, name);
        }
        self.calls_need_fixie(sc);
        self.scenario_tools_need_a_sandbox(sc);
        self.call_names(&sc.steps);
        self.first_turn_needs_a_speaking_agent(sc);
        self.attack_needs_a_copyable_conversation(sc);
        let failed: BTreeMap<String, usize> = self
            .info
            .failed_captures
            .get(&sc.id.span)
            .map(|s| s.iter().map(|(name, at)| (name.clone(), *at)).collect())
            .unwrap_or_default();
        let mut all_captures: BTreeSet<String> = failed.keys().cloned().collect();
        collect_captures(&sc.steps, &mut all_captures);
        let cx = StepCx {
            scenario: sc,
            all_captures: &all_captures,
            failed_captures: &failed,
        };
        if let Some(History {
            source: HistorySource::Template(t),
            ..
        }) = sc.history.as_deref()
        {
            self.template(&cx, t, &BTreeSet::new());
        }
        self.turn_templates(&cx);
        let mut at_end = self.steps(&cx, &sc.steps, BTreeSet::new());
        at_end.extend(failed.keys().cloned());
        // Trajectory criteria are checked after the last step: they see the captures made on
        // every path.
        for c in sc.criteria.iter().chain(&sc.expect_tools) {
            self.criterion(&cx, c, &at_end);
        }
        if let Some(persona) = &sc.persona {
            self.persona_templates(&cx, persona, &BTreeSet::new());
        }
        // Its `criteria-override` is rendered for the judge before the run, in the
        // scenario's scope without captures (engine/src/render.rs, `judge_texts_rendered`).
        if let Some(o) = &sc.criteria_override
            && template::is_template(&o.value)
        {
            let t = Template {
                source: o.value.clone(),
                span: o.span,
            };
            self.template(&cx, &t, &BTreeSet::new());
        }
        // The scenario's `outcome "…"` statements are judged at the end, with its captures.
        for outcome in &sc.outcomes {
            if let Outcome::Statement(statement) = &outcome.value
                && template::is_template(statement)
            {
                let t = Template {
                    source: statement.clone(),
                    span: outcome.span,
                };
                self.template(&cx, &t, &at_end);
            }
        }
        let _ = suite;
    }

    /// The templates of the scenario's agents that read the turn's variables (`header`
    /// values, a model agent's `system-prompt`), checked in the scenario's scope as it is
    /// before its first step (they go with every turn, the first included, so a capture is
    /// not yet there). A problem is reported once per template, naming the first scenario
    /// it was found with.
    fn turn_templates(&mut self, cx: &StepCx) {
        let p = self.project;
        for agent in p.scenario_agents(cx.scenario) {
            let system_prompt = agent.settings.spanned("system-prompt").and_then(|v| {
                Some(Template {
                    source: v.value.as_str()?.to_owned(),
                    span: v.span,
                })
            });
            let headers = agent
                .headers
                .iter()
                .map(|(name, value)| (format!("header `{name}`"), value));
            let prompt = system_prompt
                .as_ref()
                .map(|value| ("`system-prompt`".to_owned(), value));
            for (what, value) in headers.chain(prompt) {
                if !template::reads_turn_scope(&value.source) {
                    continue;
                }
                let whose = format!(
                    "{what} of agent `{}`, sent with every turn of scenario `{}`",
                    agent.id.value, cx.scenario.id.value
                );
                self.shared_template(cx, value, &BTreeSet::new(), &whose);
            }
        }
    }

    /// Checks `t`, a template several scenarios share (an agent's, a persona's), in `cx`'s
    /// scope: each problem is reported once, at the first scenario it was found with, which
    /// `whose` names (appended to the message).
    fn shared_template(
        &mut self,
        cx: &StepCx,
        t: &Template,
        captured: &BTreeSet<String>,
        whose: &str,
    ) {
        let before = self.diags.len();
        self.template(cx, t, captured);
        let found: Vec<Diagnostic> = self.diags.drain(before..).collect();
        for mut d in found {
            let key = (t.span.file, t.span.span.offset(), d.message.clone());
            if self.shared_template_problems.insert(key) {
                d.message = format!("{} ({whose})", d.message);
                self.diags.push(d);
            }
        }
    }

    /// A persona's `description` and `instructions` written as templates, in the scope of
    /// what plays it: the scenario's persona before any capture (it is filled in when the
    /// run is planned), a branch's with the captures made before its `simulate` step
    /// (`captured`). A persona several scenarios play is checked with each, a problem
    /// reported once, naming the first scenario it was found with.
    fn persona_templates(
        &mut self,
        cx: &StepCx,
        persona: &PersonaRef,
        captured: &BTreeSet<String>,
    ) {
        let p = self.project;
        let persona = match persona {
            PersonaRef::Named(id) => match p.personas.iter().find(|p| p.id.value == id.value) {
                Some(persona) => persona,
                None => return,
            },
            PersonaRef::Inline(persona) => &**persona,
        };
        let whose = format!(
            "persona `{}`, played in scenario `{}`",
            persona.id.value, cx.scenario.id.value
        );
        for t in &persona.templates {
            self.shared_template(cx, t, captured, &whose);
        }
    }

    /// Every `call` names a function the engine can send: one URL path segment.
    fn call_names(&mut self, steps: &[Step]) {
        for step in steps {
            match &step.kind {
                StepKind::Call { function, .. } => {
                    if let Err(e) = crate::names::validate_function_name(function) {
                        let d = Diagnostic::at_span(
                            Kind::InvalidValue,
                            format!("invalid function name: {e}"),
                            self.files(),
                            step.span,
                            "this call",
                        )
                        .with_help(
                            "write the function's name as the agent registers it, e.g. \
                             `call \"genrand\" \"0, 19\"`",
                        );
                        self.diags.push(d);
                    }
                }
                StepKind::Fork(branches) => {
                    for b in branches {
                        self.call_names(&b.steps);
                    }
                }
                _ => {}
            }
        }
    }

    /// An `attack` tries each proposal as a branch of the same conversation, copied: an
    /// agent whose conversation is server state (AgentScope, A2A, `http` with `session`)
    /// cannot be searched, and would fail each path at run time after its first LLM call.
    fn attack_needs_a_copyable_conversation(&mut self, sc: &Scenario) {
        let mut attack = None;
        crate::model::walk_steps(&sc.steps, &mut |step| {
            if attack.is_none() && matches!(step.kind, StepKind::Attack(_)) {
                attack = Some(step.span);
            }
        });
        let Some(at) = attack else {
            return;
        };
        let Some(bound) =
            self.project.scenario_agents(sc).into_iter().find(|a| {
                !a.protocol.capabilities().forks || a.settings.setting("session").is_some()
            })
        else {
            return;
        };
        let d = Diagnostic::at_span(
            Kind::InvalidValue,
            format!(
                "scenario `{}` searches with `attack`, but the conversation of agent `{}` ({}) \
                 cannot be copied",
                sc.id.value,
                bound.id.value,
                bound.protocol.as_str()
            ),
            self.files(),
            at,
            "each proposal is a branch of this conversation",
        )
        .with_other(
            self.files(),
            bound.id.span,
            "its conversation is server state",
        )
        .with_help(
            "run the attack against an agent that is sent the whole conversation each turn \
             (connexity, openai, anthropic, multiagent, `http` without `session`)",
        );
        self.diags.push(d);
    }

    /// `first-turn "agent"` needs a protocol on which the agent can speak unprompted:
    /// AgentScope answers only input messages and Fixie only function calls.
    fn first_turn_needs_a_speaking_agent(&mut self, sc: &Scenario) {
        if sc.first_turn != FirstTurn::Agent {
            return;
        }
        let agents = self.project.scenario_agents(sc);
        // A model asked to open with no system prompt gets an empty conversation, which
        // OpenAI-compatible servers refuse.
        if let Some(bare) = agents.iter().find(|a| {
            a.protocol.capabilities().model_api
                && a.protocol.capabilities().speaks_first
                && a.settings.setting("system-prompt").is_none()
        }) {
            let d = Diagnostic::at_span(
                Kind::InvalidValue,
                format!(
                    "scenario `{}` has `first-turn \"agent\"`, but agent `{}` ({}) has no \
                     `system-prompt`: the model would be sent an empty conversation",
                    sc.id.value,
                    bare.id.value,
                    bare.protocol.as_str()
                ),
                self.files(),
                sc.id.span,
                "the agent is asked to speak first here",
            )
            .with_other(self.files(), bare.id.span, "no `system-prompt`")
            .with_help(
                "give the agent a `system-prompt` that tells it to open the conversation, or \
                 start this scenario with a `user` step",
            );
            self.diags.push(d);
            return;
        }
        let Some(silent) = agents
            .into_iter()
            .find(|a| !a.protocol.capabilities().speaks_first)
        else {
            return;
        };
        let d = Diagnostic::at_span(
            Kind::InvalidValue,
            format!(
                "scenario `{}` has `first-turn \"agent\"`, but agent `{}` ({}) cannot speak \
                 first",
                sc.id.value,
                silent.id.value,
                silent.protocol.as_str()
            ),
            self.files(),
            sc.id.span,
            "the agent is asked to speak first here",
        )
        .with_other(self.files(), silent.id.span, "answers only what it is sent")
        .with_help(
            "`first-turn \"agent\"` works with `connexity` agents (called with an empty \
             history); start this scenario with a `user` step instead",
        );
        self.diags.push(d);
    }

    /// A `tool` written in a scenario is a sandbox tool of MultiAgentEval and `openai` agents
    /// (the engine answers their tool calls). On a
    /// scenario that runs only other agents it would do nothing, and is most likely a tool
    /// *check* written without its `expect`. One exception: on `connexity` agents a tool with
    /// answers (`mock`, `sequence`) is accepted, as Connexity test cases carry mock answers
    /// (`trellis import connexity` writes them) that only an engine-run agent uses.
    fn scenario_tools_need_a_sandbox(&mut self, sc: &Scenario) {
        let agents = self.project.scenario_agents(sc);
        let all_connexity = agents
            .iter()
            .all(|a| a.protocol.capabilities().carries_tool_mocks);
        let Some(tool) = sc
            .tools
            .iter()
            .find(|t| !(all_connexity && (t.sequence.is_some() || !t.mocks.is_empty())))
        else {
            return;
        };
        if agents.is_empty()
            || agents
                .iter()
                .any(|a| a.protocol.capabilities().engine_runs_tools)
        {
            return;
        }
        let d = Diagnostic::at_span(
            Kind::InvalidValue,
            format!(
                "scenario `{}` declares tool `{}`, but none of its agents speaks \
                 `multiagent`, `openai` or `anthropic`, whose tools the sandbox answers",
                sc.id.value, tool.name.value
            ),
            self.files(),
            tool.name.span,
            "a sandbox tool",
        )
        .with_help(format!(
            "to check that the agent called it, write `expect tool \"{}\"` after a step or \
             `tool \"{}\"` inside `criteria {{ … }}`",
            tool.name.value, tool.name.value
        ));
        self.diags.push(d);
    }

    /// `call` steps talk to a Fixie function; no other protocol has one to call.
    fn calls_need_fixie(&mut self, sc: &Scenario) {
        let Some(call) = first_call(&sc.steps) else {
            return;
        };
        let agents = self.project.scenario_agents(sc);
        let others: Vec<&Agent> = agents
            .into_iter()
            .filter(|a| !a.protocol.capabilities().function_calls)
            .collect();
        let Some(first) = others.first() else {
            return;
        };
        let list = others
            .iter()
            .map(|a| format!("`{}` ({})", a.id.value, a.protocol.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        let d = Diagnostic::at_span(
            Kind::InvalidValue,
            format!(
                "`call` steps need a `fixie` agent; scenario `{}` runs against {list}",
                sc.id.value
            ),
            self.files(),
            call,
            "a Fixie function call",
        )
        .with_other(self.files(), first.id.span, "not a `fixie` agent")
        .with_help(
            "`call FUNC \"INPUT\"` posts to a Fixie agent's function; use `user \"…\"` for other \
             protocols, or run this scenario only against `fixie` agents",
        );
        self.diags.push(d);
    }

    /// A criterion's references, and its templated values against the scope of a user
    /// message written at the same place (`captured`: the captures made on every path so far).
    fn criterion(&mut self, cx: &StepCx, c: &Criterion, captured: &BTreeSet<String>) {
        if let CriterionKind::Judge {
            judge: Some(judge), ..
        } = &c.kind
        {
            self.reference(RefKind::Judge, judge);
        }
        for t in &c.templates {
            self.template(cx, &t.template, captured);
        }
    }

    /// Checks a block of steps; `captured` holds the captures made on every path so far.
    /// Returns the captures made on every path through the block.
    fn steps(
        &mut self,
        cx: &StepCx,
        steps: &[Step],
        mut captured: BTreeSet<String>,
    ) -> BTreeSet<String> {
        for (i, step) in steps.iter().enumerate() {
            let in_file = step.span.file == cx.scenario.id.span.file;
            captured.extend(
                cx.failed_captures
                    .iter()
                    .filter(|(_, at)| !in_file || **at < step.span.span.offset())
                    .map(|(name, _)| name.clone()),
            );
            match &step.kind {
                StepKind::User(t) | StepKind::Call { input: t, .. } => {
                    self.template(cx, t, &captured)
                }
                StepKind::Attack(attack) => {
                    if let Some(name) = &attack.attacker {
                        self.reference(RefKind::Provider, name);
                    }
                    // Every path the search explores ends the scenario: nothing can follow.
                    if i + 1 != steps.len() {
                        let d = Diagnostic::at_span(
                            Kind::InvalidValue,
                            "`attack` must be the last step",
                            self.files(),
                            step.span,
                            "steps follow this attack",
                        )
                        .with_help(
                            "every path the attack explores is a trajectory of its own; move \
                             the checks into `criteria { … }` (they run on each path)",
                        );
                        self.diags.push(d);
                    }
                }
                StepKind::Hitl {
                    message: Some(t), ..
                } => self.template(cx, t, &captured),
                StepKind::Simulate {
                    simulator, persona, ..
                } if simulator.is_some() || persona.is_some() => {
                    if let Some(sim) = simulator {
                        let has_persona = cx.scenario.persona.is_some() || persona.is_some();
                        for layer in sim.layers() {
                            self.simulator(layer, Some((cx, &captured, has_persona)));
                        }
                    }
                    if let Some(PersonaRef::Named(name)) = persona.as_deref() {
                        self.reference(RefKind::Persona, name);
                    }
                    if let Some(persona) = persona.as_deref() {
                        self.persona_templates(cx, persona, &captured);
                    }
                }
                StepKind::Hitl { message: None, .. } | StepKind::Simulate { .. } => {}
                StepKind::Expect(criteria) => {
                    for c in criteria {
                        self.criterion(cx, c, &captured);
                    }
                }
                StepKind::Capture { name, .. } => {
                    captured.insert(name.clone());
                }
                StepKind::Fork(branches) => {
                    // Steps after a fork group run on every branch: one that attacks
                    // cannot be followed by them.
                    if i + 1 != steps.len()
                        && let Some(at) = branches.iter().find_map(|b| attack_at_end(&b.steps))
                    {
                        let d = Diagnostic::at_span(
                            Kind::InvalidValue,
                            "`attack` must be the last step",
                            self.files(),
                            at,
                            "steps follow the branches this attack is in",
                        )
                        .with_help(
                            "every path the attack explores is a trajectory of its own; an \
                             attacking branch ends the scenario, so nothing may follow its \
                             group of branches",
                        );
                        self.diags.push(d);
                    }
                    self.duplicate_ids(
                        branches.iter().map(|b| &b.name),
                        "branch",
                        "branch names are unique within one group of consecutive `branch` nodes",
                    );
                    let mut after: Option<BTreeSet<String>> = None;
                    for b in branches {
                        let end = self.steps(cx, &b.steps, captured.clone());
                        after = Some(match after {
                            None => end,
                            Some(prev) => prev.intersection(&end).cloned().collect(),
                        });
                    }
                    if let Some(after) = after {
                        captured = after;
                    }
                }
            }
        }
        captured
    }

    /// One simulator layer: its provider exists, its templates compile and use only the
    /// variables they are given (`trellis check` reports them once per layer).
    /// A simulator's provider and templates. Written in a scenario (`in_scenario`: the step
    /// that first uses it, and the values captured before it), its templates see that
    /// scenario's names; the project's is shared by every scenario, whose `user_context`,
    /// `vars` and `row` differ, so only the names every scenario has are checked there.
    fn simulator(
        &mut self,
        sim: &Simulator,
        in_scenario: Option<(&StepCx, &BTreeSet<String>, bool)>,
    ) {
        // Where the simulate step using it has no persona, `persona` is `none`: a field read
        // of it fails every simulated turn unless it is guarded. Looked at for each layer
        // once a step without a persona uses it (a branch with one may have used it first).
        if let Some((_, _, false)) = in_scenario
            && self.persona_checked.insert(sim.span)
        {
            self.persona_reads(sim);
        }
        if !self.checked_simulators.insert(sim.span) {
            return;
        }
        if let Some(provider) = &sim.provider {
            self.reference(RefKind::Provider, provider);
        }
        let instructions_scope = match in_scenario {
            // `persona` is `none` in a simulator's prompts when the scenario has none (the
            // builtin prompt guards it, `{% if persona is not none %}`), and which branch
            // has one is not followed here: its fields are checked, not its presence.
            Some((cx, captured, _)) => self
                .step_scope(cx, captured, true)
                .with("persona", template::names(template::PERSONA_FIELDS)),
            None => Scope::env_only()
                .with("user_context", Names::Any)
                .with("persona", template::names(template::PERSONA_FIELDS))
                .with("scenario", template::names(template::SCENARIO_FIELDS))
                .with("vars", Names::Any)
                .with("row", Names::Any),
        };
        let prompt_scope = instructions_scope
            .clone()
            .with("user_context_json", Names::Any)
            .with("description", Names::Any)
            .with("instructions", Names::Any)
            .with("end_marker", Names::Any)
            .with("retry", Names::Any);
        if let Some(instructions) = &sim.instructions {
            self.check_template(instructions, &instructions_scope);
        }
        for prompt in [&sim.system_prompt, &sim.opening_prompt, &sim.retry_prompt]
            .into_iter()
            .flatten()
        {
            self.check_template(prompt, &prompt_scope);
        }
    }

    /// A simulator layer's field reads of `persona` that no guard keeps from a `none`.
    fn persona_reads(&mut self, sim: &Simulator) {
        let templates = [
            &sim.instructions,
            &sim.system_prompt,
            &sim.opening_prompt,
            &sim.retry_prompt,
        ];
        for t in templates.into_iter().flatten() {
            if let Some(at) = template::unguarded_field_of_none(&t.source, "persona") {
                let span =
                    template::locate_at(t, at, "persona".len(), self.files()).unwrap_or(t.span);
                let d = Diagnostic::at_span(
                    Kind::UndefinedVariable,
                    "this scenario (or branch) has no persona: `persona` is none in its \
                     simulated user's prompts",
                    self.files(),
                    span,
                    "read of a persona's field",
                )
                .with_help(
                    "give it a `persona`, or guard the read: `{% if persona is not none \
                     %}…{% endif %}`",
                );
                self.diags.push(d);
            }
        }
    }

    fn template(&mut self, cx: &StepCx, t: &Template, captured: &BTreeSet<String>) {
        // Text without template syntax is sent as written and has nothing to check; its
        // scope (a few maps of names) would be built only to be dropped: for a suite of
        // literal user turns, most of what validating a scenario cost.
        if !template::is_template(&t.source) {
            return;
        }
        let scope = self.step_scope(cx, captured, cx.scenario.persona.is_some());
        self.check_template(t, &scope);
    }

    /// What a template of a step of `cx`'s scenario sees, `captured` being the values
    /// captured before it (and `has_persona`, whether the step has a persona).
    fn step_scope(&self, cx: &StepCx, captured: &BTreeSet<String>, has_persona: bool) -> Scope {
        let mut scope = Scope::scenario(cx.scenario, has_persona, captured);
        match &cx.scenario.for_each {
            Some(ds) => {
                let names = match self.info.dataset_columns.get(&ds.value) {
                    Some(Some(columns)) => Names::Only(columns.iter().cloned().collect()),
                    _ => Names::Any,
                };
                scope = scope.with("row", names);
            }
            None => {
                scope = scope.with_hint(
                    "row",
                    "this scenario reads no dataset; write `scenario \"ID\" for-each=\"DATASET\"` to use `row.*`, or, in a template other scenarios share, read it only behind `{% if row is defined %}` (`| default(…)` does not guard a field of an undefined `row`)",
                )
            }
        }
        for name in cx.all_captures.difference(captured) {
            scope = scope.with_hint(
                &format!("vars.{name}"),
                format!(
                    "`{name}` is captured in this scenario, but not before this step on every path to it"
                ),
            );
        }
        scope
    }

    fn needs(&mut self) {
        let p = self.project;
        let mut graph: DiGraph<(usize, usize), Span> = DiGraph::new();
        let mut index: HashMap<(usize, usize), NodeIndex> = HashMap::new();
        for (si, suite) in p.suites.iter().enumerate() {
            for (ci, _) in suite.scenarios.iter().enumerate() {
                index.insert((si, ci), graph.add_node((si, ci)));
            }
        }
        let mut resolver = None;
        for (si, suite) in p.suites.iter().enumerate() {
            for (ci, sc) in suite.scenarios.iter().enumerate() {
                for need in &sc.needs {
                    let resolver = resolver.get_or_insert_with(|| NeedResolver::of(p));
                    let Some(target) = self.resolve_need(resolver, (si, ci), need) else {
                        continue;
                    };
                    if let (Some(from), Some(to)) = (index.get(&(si, ci)), index.get(&target)) {
                        graph.add_edge(*from, *to, need.span);
                    }
                }
            }
        }
        for scc in petgraph::algo::tarjan_scc(&graph) {
            let Some(&start) = scc.iter().min() else {
                continue;
            };
            let cyclic = scc.len() > 1 || graph.find_edge(start, start).is_some();
            if !cyclic {
                continue;
            }
            let members: HashSet<NodeIndex> = scc.iter().copied().collect();
            let Some(path) = cycle_from(&graph, start, &members) else {
                continue;
            };
            let same_suite = path.iter().all(|n| graph[*n].0 == graph[start].0);
            let names: Vec<String> = path
                .iter()
                .filter_map(|n| {
                    let (si, ci) = graph[*n];
                    let suite = p.suites.get(si)?;
                    let sc = suite.scenarios.get(ci)?;
                    Some(if same_suite {
                        sc.id.value.clone()
                    } else {
                        format!("{}/{}", suite.name, sc.id.value)
                    })
                })
                .collect();
            let (Some(&a), Some(&b)) = (path.first(), path.get(1)) else {
                continue;
            };
            let Some(edge) = graph.find_edge(a, b) else {
                continue;
            };
            let d = Diagnostic::at_span(
                Kind::NeedsCycle,
                format!("`needs` cycle: {}", names.join(" -> ")),
                self.files(),
                graph[edge],
                "this dependency is part of the cycle",
            )
            .with_help("a scenario cannot wait for itself; remove one of these `needs`");
            self.diags.push(d);
        }
    }

    /// Resolves `needs "ID"` (same suite) or `needs "SUITE/ID"`; reports unknown ones.
    fn resolve_need(
        &mut self,
        resolver: &NeedResolver<'_>,
        (suite, own): (usize, usize),
        need: &Spanned<String>,
    ) -> Option<(usize, usize)> {
        let p = self.project;
        let target_suite = match resolver.resolve(suite, &need.value) {
            Ok(found) => return Some(found),
            Err(NeedError::UnknownSuite { .. }) => None,
            Err(NeedError::UnknownScenario { suite, .. }) => Some(suite),
        };
        let (cross, id) = match crate::graph::split_reference(&need.value) {
            Some((_, id)) => (true, id),
            None => (false, need.value.as_str()),
        };
        // One instance of a `for-each` or `matrix` scenario (`m[model=a]`): instances exist
        // once the suite is expanded, which says when there is no such one (expand.rs).
        if let (Some(si), Some(base)) = (target_suite, crate::graph::instance_base(id))
            && let Some(ci) = p.suites.get(si).and_then(|s| {
                s.scenarios.iter().position(|sc| {
                    sc.id.value == base && (sc.for_each.is_some() || !sc.matrix.is_empty())
                })
            })
        {
            return Some((si, ci));
        }
        // A file that did not parse may hold the scenario, in this suite or another; a
        // scenario of that id in another suite is still worth naming.
        let elsewhere_exists = !cross
            && p.suites
                .iter()
                .any(|s| s.scenarios.iter().any(|sc| sc.id.value == need.value));
        let unparsed = self.info.unparsed_scenarios.contains(
            crate::graph::split_reference(&need.value).map_or(need.value.as_str(), |(_, id)| id),
        );
        if (self.info.broken || unparsed) && !elsewhere_exists {
            return None;
        }
        let candidates: Vec<String> = match (target_suite, cross) {
            (Some(si), _) => p
                .suites
                .get(si)
                .map(|s| {
                    s.scenarios
                        .iter()
                        .enumerate()
                        // The scenario that needs is no "did you mean" of its own `needs`.
                        .filter(|&(ci, _)| (si, ci) != (suite, own))
                        .map(|(_, sc)| {
                            if cross {
                                format!("{}/{}", s.name, sc.id.value)
                            } else {
                                sc.id.value.clone()
                            }
                        })
                        .collect()
                })
                .unwrap_or_default(),
            (None, _) => p.suites.iter().map(|s| s.name.clone()).collect(),
        };
        let refs: Vec<&str> = candidates.iter().map(String::as_str).collect();
        let elsewhere = p
            .suites
            .iter()
            .find(|s| !cross && s.scenarios.iter().any(|sc| sc.id.value == need.value));
        // `x[…]` where `x` is a scenario of one instance: the scenario as written.
        let plain = target_suite
            .zip(crate::graph::instance_base(id))
            .filter(|&(si, base)| {
                p.suites
                    .get(si)
                    .is_some_and(|s| s.scenarios.iter().any(|sc| sc.id.value == base))
            });
        let help = match (
            target_suite,
            did_you_mean(&need.value, refs.iter().copied()),
        ) {
            _ if plain.is_some() => {
                let base = plain.map_or("", |(_, base)| base);
                let written = need.value.len() - id.len() + base.len();
                format!(
                    "`{base}` has no `for-each` or `matrix`, so no instances: write `needs \"{}\"`",
                    &need.value[..written]
                )
            }
            _ if elsewhere.is_some() => {
                let suite_name = elsewhere.map_or("", |s| s.name.as_str());
                format!(
                    "`{}` is a scenario of suite `{suite_name}`; write `needs \"{suite_name}/{}\"`",
                    need.value, need.value
                )
            }
            (_, Some(best)) => format!("did you mean `{best}`?"),
            (None, None) => format!(
                "no suite with that name; suites: {}; write `needs \"SUITE/SCENARIO\"`",
                quoted(&refs)
            ),
            (Some(si), None) if refs.is_empty() && (si == suite) => {
                "no other scenario in this suite (a scenario cannot need itself)".to_owned()
            }
            (Some(_), None) => reference_help(&need.value, &refs, "scenario"),
        };
        let d = Diagnostic::at_span(
            Kind::UndefinedReference,
            format!("undefined scenario `{}` in `needs`", need.value),
            self.files(),
            need.span,
            "no scenario with this id",
        )
        .with_help(help);
        self.diags.push(d);
        None
    }
}

struct StepCx<'a> {
    scenario: &'a Scenario,
    all_captures: &'a BTreeSet<String>,
    /// Captures that failed to decode, by the offset of their `capture` node in the
    /// scenario's file: taken as captured from there on (their own error is reported), so
    /// that a step before one still reads the name as not yet captured.
    failed_captures: &'a BTreeMap<String, usize>,
}

/// Where an `attack` that ends a block (or one of its last fork group's branches) is.
fn attack_at_end(steps: &[Step]) -> Option<Span> {
    let last = steps.last()?;
    match &last.kind {
        StepKind::Attack(_) => Some(last.span),
        StepKind::Fork(branches) => branches.iter().find_map(|b| attack_at_end(&b.steps)),
        _ => None,
    }
}

/// Where the first `call` step of a block is written, branches included.
fn first_call(steps: &[Step]) -> Option<Span> {
    steps.iter().find_map(|step| match &step.kind {
        StepKind::Call { .. } => Some(step.span),
        StepKind::Fork(branches) => branches.iter().find_map(|b| first_call(&b.steps)),
        _ => None,
    })
}

/// What the protocol's spec says the value of `agent`'s setting `name` is.
fn setting_value(agent: &Agent, name: &str) -> Option<&'static crate::lang::ArgSpec> {
    agent
        .protocol
        .spec()
        .settings
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.args.first())
}

/// Agent settings naming a path (`cwd`) that is not there. Resolved against the suite file
/// when decoded; every call would fail as a `setup` fault, so `check` says it first. A
/// warning, not an error: a directory a pipeline creates before the run is not a mistake.
fn missing_paths(project: &Project) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    // On another endpoint the setting is an error of its own (the protocol's rules).
    for agent in project
        .agents
        .iter()
        .filter(|a| matches!(a.endpoint, crate::Endpoint::Command(_)))
    {
        for setting in &agent.settings.0 {
            let is_path =
                setting_value(agent, setting.name).is_some_and(|a| a.ty == ValueType::Path);
            let Some(path) = setting.value.value.as_str().filter(|_| is_path) else {
                continue;
            };
            if std::path::Path::new(path).is_dir() {
                continue;
            }
            out.push(
                Diagnostic::at_span(
                    Kind::NotRunnable,
                    format!(
                        "agent `{}`'s `{}` is not a directory: {path}",
                        agent.id.value, setting.name
                    ),
                    &project.files,
                    setting.value.span,
                    "no such directory",
                )
                .with_help(
                    "paths are relative to the suite file; every call to this agent fails \
                     (`setup`) until it exists",
                ),
            );
        }
    }
    out
}

/// Tool checks naming a tool, or a parameter of one, that the suite does not declare but
/// that is a typo away from one it declares: `no-tool "aply_refund"` passes whatever the
/// agent does, and `expect tool "refund" amout=20` fails against a correct agent. An
/// undeclared name with nothing close is left alone (the agent's own tools are not the
/// suite's to declare). Once per check as written, for instances of one scenario.
fn tool_typos<'p>(project: &'p Project, warned: &mut HashSet<(Span, &'p str)>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let scenario_tools = project.scenarios().flat_map(|(_, sc)| &sc.tools);
    for tool in project.tools.iter().chain(scenario_tools) {
        // A scenario's instances share its tools' spans: one warning for all.
        if warned.insert((tool.span, "tool declaration")) {
            declaration_typos(tool, &project.files, &mut out);
            answers_not_json(tool, &project.files, &mut out);
        }
    }
    for (_, sc) in project.scenarios() {
        let declared: Vec<&Tool> = sc.tools.iter().chain(&project.tools).collect();
        let names: Vec<&str> = declared.iter().map(|t| t.name.value.as_str()).collect();
        let mut criteria: Vec<&Criterion> = sc.criteria.iter().chain(&sc.expect_tools).collect();
        collect_expects(&sc.steps, &mut criteria);
        for &c in &criteria {
            let (written, params): (
                Vec<&str>,
                Option<&serde_json::Map<String, serde_json::Value>>,
            ) = match &c.kind {
                CriterionKind::Tool { name, params, .. } => (vec![name.as_str()], Some(params)),
                CriterionKind::NoTool { name: Some(name) } => (vec![name.as_str()], None),
                CriterionKind::ToolsInOrder(list) => {
                    (list.iter().map(String::as_str).collect(), None)
                }
                _ => continue,
            };
            // Only tool checks are remembered: hashing every criterion of a large project
            // was most of this function.
            if !warned.insert((c.span, "tool")) {
                continue;
            }
            for name in &written {
                if names.contains(name) {
                    continue;
                }
                // A `no-tool` on a tool the suite does not declare (the agent's own) may
                // still be a near miss of one the same scenario checks was called; not when
                // the scenario checks that very name was called (then the near miss, if any,
                // is the other's typo).
                if matches!(c.kind, CriterionKind::NoTool { .. })
                    && typo_of(name, names.iter().copied()).is_none()
                    && !called_in(&criteria).any(|n| n == *name)
                    && let Some(best) = typo_of(name, called_in(&criteria).filter(|n| n != name))
                {
                    out.push(
                        Diagnostic::at_span(
                            Kind::UnknownTool,
                            format!(
                                "`{}` names a tool `{name}` the suite neither declares nor \
                                 checks was called",
                                c.text
                            ),
                            &project.files,
                            c.span,
                            "no such tool",
                        )
                        .with_help(format!(
                            "did you mean `{best}`, which this scenario checks with `tool`? A \
                             `no-tool` on a tool no call can have passes whatever the agent does"
                        )),
                    );
                    continue;
                }
                // A called tool the suite does not declare, a near miss of one the scenario's
                // checks name more often (`tools-in-order "qoute_price"` beside `tool
                // "quote_price"` and `no-tool "quote_price"`): the rarer spelling is the slip.
                let uses = |n: &str| named_in(&criteria).filter(|m| *m == n).count();
                if !matches!(c.kind, CriterionKind::NoTool { .. })
                    && typo_of(name, names.iter().copied()).is_none()
                    && let Some(best) = typo_of(
                        name,
                        named_in(&criteria).filter(|n| {
                            n != name && uses(n) > uses(name) && !singular_and_plural(n, name)
                        }),
                    )
                {
                    out.push(
                        Diagnostic::at_span(
                            Kind::UnknownTool,
                            format!(
                                "`{}` names a tool `{name}` the suite does not declare, and \
                                 this scenario's other checks spell `{best}`",
                                c.text
                            ),
                            &project.files,
                            c.span,
                            "no such tool",
                        )
                        .with_help(format!(
                            "did you mean `{best}`, as {} other checks of this scenario write it? A check \
                             on a tool no call can have fails (`tool`, `tools-in-order`) whatever \
                             the agent does",
                            uses(best)
                        )),
                    );
                    continue;
                }
                if let Some(best) = typo_of(name, names.iter().copied()) {
                    out.push(
                        Diagnostic::at_span(
                            Kind::UnknownTool,
                            format!(
                                "`{}` names a tool `{name}` the suite does not declare",
                                c.text
                            ),
                            &project.files,
                            c.span,
                            "no such tool",
                        )
                        .with_help(format!(
                            "did you mean `{best}`? A check on a tool no call can have passes \
                             (`no-tool`) or fails (`tool`) whatever the agent does"
                        )),
                    );
                }
            }
            let tool = written
                .first()
                .and_then(|n| declared.iter().find(|t| t.name.value == *n));
            let Some(params) = params else {
                continue;
            };
            let Some(tool) = tool.filter(|t| !t.params.is_empty()) else {
                // A tool the suite does not describe (the agent's own): any key is an
                // argument to match, so `cont=1` is matched, not counted. Only a near miss
                // of the check's own `count=` is worth a word.
                // `county="Kent"` is an argument; `cont=1` reads as a count.
                for key in params
                    .iter()
                    .filter(|(k, v)| *k != "count" && v.is_u64() && typo_of(k, ["count"]).is_some())
                    .map(|(k, _)| k)
                {
                    out.push(
                        Diagnostic::at_span(
                            Kind::UnknownTool,
                            format!(
                                "`{}` matches an argument `{key}` of the call; the number of \
                                 calls is `count=`",
                                c.text
                            ),
                            &project.files,
                            c.span,
                            "an argument, not the count",
                        )
                        .with_help(format!(
                            "did you mean `count=`? As written, only a call with an argument \
                             `{key}` passes"
                        )),
                    );
                }
                continue;
            };
            let known: Vec<&str> = tool.params.iter().map(|p| p.name.as_str()).collect();
            for key in params.keys().filter(|k| !known.contains(&k.as_str())) {
                let help = match typo_of(key, known.iter().copied()) {
                    Some(best) => format!("did you mean `{best}`?"),
                    // `count=N` is the check's own: how many calls.
                    None if typo_of(key, ["count"]).is_some() => {
                        "did you mean `count=` (how many calls the check wants)?".to_owned()
                    }
                    None => format!("`{}` takes: {}", tool.name.value, known.join(", ")),
                };
                out.push(
                    Diagnostic::at_span(
                        Kind::UnknownTool,
                        format!(
                            "`{}` checks a parameter `{key}` that tool `{}` does not declare",
                            c.text, tool.name.value
                        ),
                        &project.files,
                        c.span,
                        "no such parameter",
                    )
                    .with_help(help),
                );
            }
        }
    }
    out
}

/// A declared tool's mocks and policies that name a parameter it does not declare, or match
/// one with a value of another type than it declares: such a mock answers no call that
/// sends the declared arguments (the agent gets the tool's fallback), and such a policy
/// never applies, so the test is weaker than it reads. Tools that declare no parameters
/// are the agent's to describe: nothing to compare with.
/// A mock's `returns` or a sequence's `output` written as a string that starts like JSON
/// but does not parse: it is answered as that text, a slip (a trailing comma) most likely.
fn answers_not_json(tool: &Tool, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    let answers = tool
        .mocks
        .iter()
        .map(|m| (&m.returns, m.span, "`returns`"))
        .chain(tool.sequence.iter().flat_map(|s| {
            s.outputs
                .iter()
                .map(move |o| (&o.value, s.span, "an `output`"))
        }));
    for (answer, span, what) in answers {
        let serde_json::Value::String(text) = answer else {
            continue;
        };
        // Opened and closed as a JSON object or array: `[ERROR] no such order` is text.
        let trimmed = text.trim();
        let json_like = (trimmed.starts_with('{') && trimmed.ends_with('}'))
            || (trimmed.starts_with('[') && trimmed.ends_with(']'));
        if !json_like {
            continue;
        }
        let Err(e) = serde_json::from_str::<serde_json::Value>(trimmed) else {
            continue;
        };
        out.push(
            Diagnostic::at_span(
                Kind::NotJson,
                format!(
                    "{what} of tool `{}` starts like JSON but is not JSON ({e}): it is answered \
                     as text",
                    tool.name.value
                ),
                files,
                span,
                "answered as a string",
            )
            .with_help(
                "fix the JSON (a trailing comma, a missing quote), or, if the answer is meant \
                 as text, leave this as it is",
            ),
        );
    }
}

fn declaration_typos(tool: &Tool, files: &[SourceFile], out: &mut Vec<Diagnostic>) {
    if tool.params.is_empty() {
        return;
    }
    let known: Vec<&str> = tool.params.iter().map(|p| p.name.as_str()).collect();
    let unknown_help = |key: &str| match typo_of(key, known.iter().copied()) {
        Some(best) => format!("did you mean `{best}`?"),
        None => format!("`{}` takes: {}", tool.name.value, known.join(", ")),
    };
    for mock in &tool.mocks {
        for (key, value) in &mock.when {
            let Some(param) = tool.params.iter().find(|p| &p.name == key) else {
                out.push(
                    Diagnostic::at_span(
                        Kind::UnknownTool,
                        format!(
                            "a `mock` of tool `{}` matches an argument `{key}` the tool does \
                             not declare: it answers only calls that send `{key}`",
                            tool.name.value
                        ),
                        files,
                        mock.span,
                        "no such parameter",
                    )
                    .with_help(unknown_help(key)),
                );
                continue;
            };
            if let Some(written) = type_mismatch(&param.ty, value) {
                out.push(
                    Diagnostic::at_span(
                        Kind::UnknownTool,
                        format!(
                            "a `mock` of tool `{}` matches `{key}` with {written}, but `{key}` \
                             is declared `type=\"{}\"`: a call that sends one does not match",
                            tool.name.value, param.ty
                        ),
                        files,
                        mock.span,
                        "another type than declared",
                    )
                    .with_help(match value {
                        serde_json::Value::String(text)
                            if serde_json::from_str::<serde_json::Value>(text)
                                .is_ok_and(|v| type_mismatch(&param.ty, &v).is_none()) =>
                        {
                            format!("write the value unquoted: {key}={text}")
                        }
                        _ => format!(
                            "write the value as a {}, or declare `{key}` with its type",
                            param.ty
                        ),
                    }),
                );
            }
        }
    }
    for policy in &tool.policies {
        if known.contains(&policy.param.as_str()) {
            continue;
        }
        out.push(
            Diagnostic::at_span(
                Kind::UnknownTool,
                format!(
                    "a `policy` of tool `{}` is on `{}`, which the tool does not declare: it \
                     applies only to calls that send `{}`",
                    tool.name.value, policy.param, policy.param
                ),
                files,
                policy.span,
                "no such parameter",
            )
            .with_help(unknown_help(&policy.param)),
        );
    }
}

/// How `value` is written, when it is not of the declared JSON-schema `ty`.
fn type_mismatch(ty: &str, value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    // `null` matches any value, absent included (the sandbox's matching).
    let fits = value.is_null()
        || match ty {
            "string" => value.is_string(),
            "number" => value.is_number(),
            "integer" => value.is_i64() || value.is_u64(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            _ => true,
        };
    if fits {
        return None;
    }
    Some(match value {
        Value::String(text) => format!("the string \"{text}\""),
        Value::Number(n) => format!("the number {n}"),
        Value::Bool(b) => format!("#{b}"),
        Value::Null => "#null".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    })
}

/// The declared name `word` is a typo of, when it is one: a few edits away (Damerau–
/// Levenshtein, at most one per five characters, at least one). Stricter than
/// [`did_you_mean`]: a warning on a name that may be the agent's own tool (`get_weather`
/// beside a declared `get_order`) must be a near miss, not a likeness.
fn typo_of<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let most = (word.chars().count() / 5).max(1);
    // Names of one numbered family (`tool_1`, `tool_2`) differ by design, not by a slip.
    let letters = |s: &str| {
        s.chars()
            .filter(|c| !c.is_ascii_digit())
            .collect::<String>()
    };
    let numbered = |c: &str| {
        word.chars().any(|ch| ch.is_ascii_digit())
            && c.chars().any(|ch| ch.is_ascii_digit())
            && letters(word) == letters(c)
    };
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|&(d, c)| d > 0 && d <= most && !numbered(c))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// The criteria of every `expect` step, forks included.
/// The tools `criteria` check were called (`tool`, `tools-in-order`).
fn called_in<'c>(criteria: &[&'c Criterion]) -> impl Iterator<Item = &'c str> + Clone {
    criteria.iter().flat_map(|c| {
        let names: Vec<&'c str> = match &c.kind {
            CriterionKind::Tool { name, .. } => vec![name.as_str()],
            CriterionKind::ToolsInOrder(list) => list.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        names
    })
}

/// Whether two tool names are one name and its plural (`get_order`, `get_orders`): two
/// tools an agent often has both of, not a slip.
fn singular_and_plural(a: &str, b: &str) -> bool {
    let plural = |one: &str, many: &str| {
        many.strip_suffix('s').is_some_and(|stem| stem == one)
            || many.strip_suffix("es").is_some_and(|stem| stem == one)
    };
    plural(a, b) || plural(b, a)
}

/// Every tool name the checks write: those called, and those not (`no-tool`).
fn named_in<'c>(criteria: &[&'c Criterion]) -> impl Iterator<Item = &'c str> + Clone {
    criteria.iter().flat_map(|c| {
        let names: Vec<&'c str> = match &c.kind {
            CriterionKind::Tool { name, .. } | CriterionKind::NoTool { name: Some(name) } => {
                vec![name.as_str()]
            }
            CriterionKind::ToolsInOrder(list) => list.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        names
    })
}

fn collect_expects<'s>(steps: &'s [Step], out: &mut Vec<&'s Criterion>) {
    for step in steps {
        match &step.kind {
            StepKind::Expect(list) => out.extend(list),
            StepKind::Fork(branches) => {
                for b in branches {
                    collect_expects(&b.steps, out);
                }
            }
            _ => {}
        }
    }
}

fn collect_captures(steps: &[Step], out: &mut BTreeSet<String>) {
    for step in steps {
        match &step.kind {
            StepKind::Capture { name, .. } => {
                out.insert(name.clone());
            }
            StepKind::Fork(branches) => {
                for b in branches {
                    collect_captures(&b.steps, out);
                }
            }
            _ => {}
        }
    }
}

/// A shortest cycle through `start` inside one strongly connected component, as
/// `[start, …, start]`.
fn cycle_from(
    graph: &DiGraph<(usize, usize), Span>,
    start: NodeIndex,
    members: &HashSet<NodeIndex>,
) -> Option<Vec<NodeIndex>> {
    let mut parent: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    let mut queue = std::collections::VecDeque::new();
    // Breadth-first in edge insertion order keeps the reported cycle deterministic.
    let succ = |n: NodeIndex| {
        let mut v: Vec<NodeIndex> = graph.neighbors(n).collect();
        v.reverse();
        v
    };
    for next in succ(start) {
        if next == start {
            return Some(vec![start, start]);
        }
    }
    queue.push_back(start);
    while let Some(n) = queue.pop_front() {
        for next in succ(n) {
            if !members.contains(&next) {
                continue;
            }
            if next == start {
                // Walk back from `n` to `start`, then read the chain forwards.
                let mut chain = Vec::new();
                let mut cur = n;
                while cur != start {
                    chain.push(cur);
                    cur = *parent.get(&cur)?;
                }
                chain.reverse();
                let mut path = vec![start];
                path.extend(chain);
                path.push(start);
                return Some(path);
            }
            if next != start && !parent.contains_key(&next) {
                parent.insert(next, n);
                queue.push_back(next);
            }
        }
    }
    None
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn reference_help(name: &str, defined: &[&str], noun: &str) -> String {
    if let Some(best) = did_you_mean(name, defined.iter().copied()) {
        return format!("did you mean `{best}`?");
    }
    if defined.is_empty() {
        format!("no {noun} is defined in the loaded files")
    } else {
        // Once each: two suites may each define a scenario `smoke`.
        let mut names: Vec<&str> = Vec::with_capacity(defined.len());
        for name in defined {
            if !names.contains(name) {
                names.push(name);
            }
        }
        format!("defined {noun}s: {}", quoted(&names))
    }
}
