//! Graphs derived from the suite model: each scenario's trajectory DAG and the `needs` DAG
//! between scenarios, with DOT and Mermaid renderings for `trellis graph`.
//!
//! A trajectory graph's nodes are *segments*: maximal runs of steps without a fork. A fork
//! group (consecutive `branch` nodes) adds an edge from the segment before it to the first
//! segment of every branch; the steps after the group form one segment that every branch's
//! last segment points to (the graph merges). A trajectory is one root-to-sink path.

use std::collections::HashMap;
use std::fmt::Write as _;

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::model::{Project, Scenario, Span, Step, StepKind};

/// Label of the segment holding a scenario's first steps.
pub const ROOT_LABEL: &str = "start";
/// Label of a segment that follows a fork group.
pub const MERGE_LABEL: &str = "then";
/// Trajectory name of a scenario that never forks.
pub const MAIN_TRAJECTORY: &str = "main";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    /// The scenario's first steps.
    Root,
    /// The steps of one `branch`.
    Branch,
    /// The steps after a fork group, run once per branch.
    Merge,
}

#[derive(Clone, Debug)]
pub struct Segment {
    pub kind: SegmentKind,
    /// `start`, the branch name, or `then` (after a fork group).
    pub label: String,
    /// Steps in order; never a `Fork`.
    pub steps: Vec<Step>,
    /// Where the segment begins in the source (the branch node, or the scenario).
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Trajectory {
    /// Branch names along the path joined with `/`, or [`MAIN_TRAJECTORY`].
    pub name: String,
    /// Segments from root to sink.
    pub segments: Vec<NodeIndex>,
}

#[derive(Clone, Debug)]
pub struct TrajectoryGraph {
    pub graph: DiGraph<Segment, ()>,
    pub root: NodeIndex,
    /// Every root-to-sink path, in source order of the branches.
    pub trajectories: Vec<Trajectory>,
}

impl TrajectoryGraph {
    pub fn build(scenario: &Scenario) -> Self {
        let (graph, root) = segments(scenario);
        let trajectories = enumerate(&graph, root);
        TrajectoryGraph {
            graph,
            root,
            trajectories,
        }
    }

    /// How many trajectories `scenario` has, counted on the segment graph without listing
    /// them: consecutive fork groups multiply, so the list can be far too large to build.
    /// Saturates at `u64::MAX`.
    pub fn count(scenario: &Scenario) -> u64 {
        // Counted over the steps as `add_block` would lay them out, without building the
        // segments: the graph holds a copy of every step, and validation counts every
        // scenario of the project on each load (an editor's, on each keystroke).
        let mut ended = 0u64;
        let exits = count_block(1, &scenario.steps, &mut ended);
        exits.iter().fold(ended, |n, &w| n.saturating_add(w))
    }

    pub fn segment(&self, index: NodeIndex) -> &Segment {
        &self.graph[index]
    }

    pub fn children(&self, index: NodeIndex) -> impl Iterator<Item = NodeIndex> + '_ {
        // petgraph lists outgoing edges newest first; reverse to keep source order.
        let mut out: Vec<NodeIndex> = self
            .graph
            .edges_directed(index, Direction::Outgoing)
            .map(|e| e.target())
            .collect();
        out.reverse();
        out.into_iter()
    }
}

/// The segment graph of a scenario and its root. Segments are added in topological order:
/// every edge points at a segment added after its source.
fn segments(scenario: &Scenario) -> (DiGraph<Segment, ()>, NodeIndex) {
    let mut graph = DiGraph::new();
    let root = graph.add_node(Segment {
        kind: SegmentKind::Root,
        label: ROOT_LABEL.to_string(),
        steps: Vec::new(),
        span: scenario.span,
    });
    add_block(&mut graph, root, &scenario.steps);
    (graph, root)
}

/// Appends `steps` starting in segment `current`; returns the segments the block ends in.
fn add_block(
    graph: &mut DiGraph<Segment, ()>,
    current: NodeIndex,
    steps: &[Step],
) -> Vec<NodeIndex> {
    let mut exits = vec![current];
    for step in steps {
        match &step.kind {
            StepKind::Fork(branches) => {
                let mut new_exits = Vec::new();
                for branch in branches {
                    let first = graph.add_node(Segment {
                        kind: SegmentKind::Branch,
                        label: branch.name.value.clone(),
                        steps: Vec::new(),
                        span: branch.name.span,
                    });
                    for &from in &exits {
                        graph.add_edge(from, first, ());
                    }
                    new_exits.extend(add_block(graph, first, &branch.steps));
                }
                exits = new_exits;
            }
            _ => {
                if exits.len() != 1 {
                    // The first step after a fork group opens the merge segment.
                    let merge = graph.add_node(Segment {
                        kind: SegmentKind::Merge,
                        label: MERGE_LABEL.to_string(),
                        steps: Vec::new(),
                        span: step.span,
                    });
                    for &from in &exits {
                        graph.add_edge(from, merge, ());
                    }
                    exits = vec![merge];
                }
                graph[exits[0]].steps.push(step.clone());
            }
        }
    }
    exits
}

/// [`add_block`], counted: given the `reaching` paths into the block's first segment, the
/// paths reaching each segment it ends in. Paths that end inside it (before a fork of no
/// branches, which leaves the segments before it without a successor) are added to `ended`.
/// A segment's count is at most the scenario's, so nothing saturates unless that does.
fn count_block(reaching: u64, steps: &[Step], ended: &mut u64) -> Vec<u64> {
    let sum = |exits: &[u64]| exits.iter().fold(0u64, |n, &w| n.saturating_add(w));
    let mut exits = vec![reaching];
    for step in steps {
        match &step.kind {
            StepKind::Fork(branches) => {
                let into = sum(&exits);
                if branches.is_empty() {
                    *ended = ended.saturating_add(into);
                }
                let mut new_exits = Vec::new();
                for branch in branches {
                    new_exits.extend(count_block(into, &branch.steps, ended));
                }
                exits = new_exits;
            }
            _ => {
                if exits.len() != 1 {
                    exits = vec![sum(&exits)];
                }
            }
        }
    }
    exits
}

fn enumerate(graph: &DiGraph<Segment, ()>, root: NodeIndex) -> Vec<Trajectory> {
    let mut out = Vec::new();
    let mut path = vec![root];
    walk(graph, root, &mut path, &mut out);
    out
}

fn walk(
    graph: &DiGraph<Segment, ()>,
    at: NodeIndex,
    path: &mut Vec<NodeIndex>,
    out: &mut Vec<Trajectory>,
) {
    let mut next: Vec<NodeIndex> = graph
        .edges_directed(at, Direction::Outgoing)
        .map(|e| e.target())
        .collect();
    next.reverse();
    if next.is_empty() {
        out.push(Trajectory {
            name: trajectory_name(graph, path),
            segments: path.clone(),
        });
        return;
    }
    for n in next {
        path.push(n);
        walk(graph, n, path, out);
        path.pop();
    }
}

fn trajectory_name(graph: &DiGraph<Segment, ()>, path: &[NodeIndex]) -> String {
    let names: Vec<&str> = path
        .iter()
        .filter(|&&i| graph[i].kind == SegmentKind::Branch)
        .map(|&i| graph[i].label.as_str())
        .collect();
    if names.is_empty() {
        MAIN_TRAJECTORY.to_string()
    } else {
        names.join("/")
    }
}

/// Node ids of the execution tree: the path of segment labels, root written `start`.
/// `["start", "accepts", "then"]` becomes `start`, `accepts`, `accepts/then`.
pub fn node_ids<'a>(labels: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut ids = Vec::new();
    let mut prefix = String::new();
    for (i, label) in labels.into_iter().enumerate() {
        if i == 0 {
            ids.push(label.to_string());
            continue;
        }
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(label);
        ids.push(prefix.clone());
    }
    ids
}

/// The `needs` DAG: an edge `a -> b` means b needs a (a runs first).
/// Node weights are `(suite index, scenario index)`.
pub struct NeedsGraph {
    pub graph: DiGraph<(usize, usize), ()>,
    pub index: HashMap<(usize, usize), NodeIndex>,
}

impl NeedsGraph {
    /// Builds the graph; unresolvable `needs` are skipped (validation reports them).
    pub fn build(project: &Project) -> Self {
        let mut graph = DiGraph::new();
        let mut index = HashMap::new();
        for (si, suite) in project.suites.iter().enumerate() {
            for (ci, _) in suite.scenarios.iter().enumerate() {
                index.insert((si, ci), graph.add_node((si, ci)));
            }
        }
        let mut resolver = None;
        for (si, suite) in project.suites.iter().enumerate() {
            for (ci, scenario) in suite.scenarios.iter().enumerate() {
                for need in &scenario.needs {
                    let resolver = resolver.get_or_insert_with(|| NeedResolver::of(project));
                    if let Ok(target) = resolver.resolve(si, &need.value)
                        && let (Some(&from), Some(&to)) = (index.get(&target), index.get(&(si, ci)))
                    {
                        graph.add_edge(from, to, ());
                    }
                }
            }
        }
        NeedsGraph { graph, index }
    }
}

/// Why a `needs` reference names no scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeedError {
    /// `SUITE/ID` where no loaded suite is called `SUITE`.
    UnknownSuite { suite: String },
    /// The suite (index into [`Project::suites`]) has no scenario `id`.
    UnknownScenario { suite: usize, id: String },
}

/// Splits a reference `SUITE/ID` at its last `/` before an instance's trailing `[…]`: a
/// scenario id never holds `/` (the parser rejects it), but a suite name may (`sub/booking`,
/// even `x[1`) and so may a matrix value in an instance's id (`s[model=openai/gpt-4o]`).
/// `None` for a bare `ID`.
pub fn split_reference(reference: &str) -> Option<(&str, &str)> {
    let head = instance_base(reference).unwrap_or(reference);
    let at = head.rfind('/')?;
    Some((&reference[..at], &reference[at + 1..]))
}

/// `reference` without the trailing `[…]` of an instance's id (`refund[A17,model=a/b]` is
/// `refund`); `None` when it has none.
pub fn instance_base(reference: &str) -> Option<&str> {
    if !reference.ends_with(']') {
        return None;
    }
    // The `[` that opens the trailing `[…]`.
    let mut depth = 0usize;
    for (i, c) in reference.char_indices().rev() {
        match c {
            ']' => depth += 1,
            '[' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(&reference[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Resolves the `needs` references of one project: `ID` is a scenario of the suite the
/// reference is written in, `SUITE/ID` a scenario of suite `SUITE` ([`split_reference`]).
/// Validation, the needs graph and the planner all resolve through here, so a reference
/// cannot mean one scenario when the suite is checked and another when it runs.
///
/// The suites' names and scenarios' ids are looked up in maps made once: looked up by a
/// scan of the suite for each reference, 20,000 scenarios that each need the last one took
/// two seconds to check. A name or id written twice (an error validation reports) resolves
/// to the first, as a scan did.
pub struct NeedResolver<'p> {
    suites: HashMap<&'p str, usize>,
    /// For each suite, by [`Project::suites`]' order: its scenarios by id.
    scenarios: Vec<HashMap<&'p str, usize>>,
}

impl<'p> NeedResolver<'p> {
    pub fn of(project: &'p Project) -> Self {
        let mut suites = HashMap::with_capacity(project.suites.len());
        for (si, suite) in project.suites.iter().enumerate() {
            suites.entry(suite.name.as_str()).or_insert(si);
        }
        let scenarios = project
            .suites
            .iter()
            .map(|suite| {
                let mut ids = HashMap::with_capacity(suite.scenarios.len());
                for (ci, sc) in suite.scenarios.iter().enumerate() {
                    ids.entry(sc.id.value.as_str()).or_insert(ci);
                }
                ids
            })
            .collect();
        NeedResolver { suites, scenarios }
    }

    /// The scenario (suite index, scenario index) that `reference`, written in suite
    /// `from_suite`, names.
    pub fn resolve(&self, from_suite: usize, reference: &str) -> Result<(usize, usize), NeedError> {
        let (suite, id) = match split_reference(reference) {
            Some((suite, id)) => {
                let si = *self
                    .suites
                    .get(suite)
                    .ok_or_else(|| NeedError::UnknownSuite {
                        suite: suite.to_string(),
                    })?;
                (si, id)
            }
            None => (from_suite, reference),
        };
        self.scenarios
            .get(suite)
            .and_then(|ids| ids.get(id))
            .map(|&ci| (suite, ci))
            .ok_or_else(|| NeedError::UnknownScenario {
                suite,
                id: id.to_string(),
            })
    }
}

/// Which output `trellis graph` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphFormat {
    Dot,
    Mermaid,
}

/// Renders the trajectory graphs of `scenarios` (`(suite name, scenario)`) as one document.
pub fn render_trajectories<'a>(
    scenarios: impl IntoIterator<Item = (&'a str, &'a Scenario)>,
    format: GraphFormat,
) -> String {
    let mut out = String::new();
    match format {
        GraphFormat::Dot => out.push_str(
            "digraph trajectories {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];\n",
        ),
        GraphFormat::Mermaid => out.push_str("flowchart TD\n"),
    }
    for (n, (suite, scenario)) in scenarios.into_iter().enumerate() {
        let tg = TrajectoryGraph::build(scenario);
        let title = format!("{suite}/{}", scenario.id.value);
        let id = |i: NodeIndex| format!("s{n}_{}", i.index());
        match format {
            GraphFormat::Dot => {
                let _ = writeln!(
                    out,
                    "  subgraph cluster_{n} {{\n    label={};",
                    dot_quote(&title)
                );
                for i in tg.graph.node_indices() {
                    let _ = writeln!(
                        out,
                        "    {} [label={}];",
                        id(i),
                        dot_quote(&segment_caption(&tg.graph[i]))
                    );
                }
                for e in tg.graph.edge_references() {
                    let _ = writeln!(out, "    {} -> {};", id(e.source()), id(e.target()));
                }
                out.push_str("  }\n");
            }
            GraphFormat::Mermaid => {
                let _ = writeln!(out, "  subgraph sc{n}[{}]", mermaid_quote(&title));
                for i in tg.graph.node_indices() {
                    let _ = writeln!(
                        out,
                        "    {}[{}]",
                        id(i),
                        mermaid_quote(&segment_caption(&tg.graph[i]))
                    );
                }
                for e in tg.graph.edge_references() {
                    let _ = writeln!(out, "    {} --> {}", id(e.source()), id(e.target()));
                }
                out.push_str("  end\n");
            }
        }
    }
    if format == GraphFormat::Dot {
        out.push_str("}\n");
    }
    out
}

/// The `needs` graph of a whole project, as DOT or Mermaid ([`render_needs_of`]).
pub fn render_needs(project: &Project, format: GraphFormat) -> String {
    let needs = NeedsGraph::build(project);
    let name = |(si, ci): (usize, usize)| {
        format!(
            "{}/{}",
            project.suites[si].name, project.suites[si].scenarios[ci].id.value
        )
    };
    let names: Vec<String> = needs
        .graph
        .node_indices()
        .map(|i| name(needs.graph[i]))
        .collect();
    let edges: Vec<(usize, usize)> = needs
        .graph
        .edge_references()
        .map(|e| (e.source().index(), e.target().index()))
        .collect();
    render_needs_of(&names, &edges, format)
}

/// A `needs` graph as DOT or Mermaid: scenario `names` (`suite/scenario`), and `edges` from
/// each scenario (its index in `names`) to one that needs it.
pub fn render_needs_of(names: &[String], edges: &[(usize, usize)], format: GraphFormat) -> String {
    let mut out = String::new();
    match format {
        GraphFormat::Dot => {
            out.push_str(
                "digraph needs {\n  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];\n",
            );
            for (i, name) in names.iter().enumerate() {
                let _ = writeln!(out, "  n{i} [label={}];", dot_quote(name));
            }
            for (from, to) in edges {
                let _ = writeln!(out, "  n{from} -> n{to};");
            }
            out.push_str("}\n");
        }
        GraphFormat::Mermaid => {
            out.push_str("flowchart LR\n");
            for (i, name) in names.iter().enumerate() {
                let _ = writeln!(out, "  n{i}[{}]", mermaid_quote(name));
            }
            for (from, to) in edges {
                let _ = writeln!(out, "  n{from} --> n{to}");
            }
        }
    }
    out
}

fn segment_caption(segment: &Segment) -> String {
    let mut caption = segment.label.clone();
    for step in &segment.steps {
        let line = match &step.kind {
            StepKind::User(t) => format!("user: {}", t.source),
            StepKind::Simulate { turns: Some(n), .. } => format!("simulate {n} turns"),
            StepKind::Simulate { turns: None, .. } => "simulate until done".to_string(),
            StepKind::Call { function, .. } => format!("call {function}"),
            StepKind::Expect(c) => format!(
                "expect {}",
                c.iter()
                    .map(|c| c.text.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            StepKind::Capture { name, .. } => format!("capture {name}"),
            StepKind::Hitl { approve, .. } => {
                format!("hitl {}", if *approve { "approve" } else { "reject" })
            }
            StepKind::Attack(a) => format!(
                "attack: {} (width {}, keep {}, depth {})",
                a.goal, a.width, a.keep, a.depth
            ),
            StepKind::Fork(_) => continue,
        };
        caption.push('\n');
        caption.push_str(&truncate(&line, 60));
    }
    caption
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

fn dot_quote(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    format!("\"{escaped}\"")
}

fn mermaid_quote(s: &str) -> String {
    // Mermaid labels: double quotes delimit, `#quot;` escapes a quote, `<br/>` breaks lines.
    let escaped = s
        .replace('"', "#quot;")
        .replace('<', "#lt;")
        .replace('>', "#gt;")
        .replace('\n', "<br/>");
    format!("\"{escaped}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_their_suite_before_an_instances_values() {
        assert_eq!(split_reference("refund"), None);
        assert_eq!(split_reference("sub/booking/s"), Some(("sub/booking", "s")));
        // A matrix value holding `/` in the trailing `[…]`.
        assert_eq!(
            split_reference("suite/m[model=openai/gpt-4o]"),
            Some(("suite", "m[model=openai/gpt-4o]"))
        );
        assert_eq!(split_reference("m[model=openai/gpt-4o]"), None);
        // A suite named with an unmatched `[` (its file `x[1.kdl`).
        assert_eq!(split_reference("x[1/s"), Some(("x[1", "s")));
        // `trellis freeze`'s SCENARIO/TRAJECTORY.
        assert_eq!(
            split_reference("m[model=a/b]/main"),
            Some(("m[model=a/b]", "main"))
        );
    }

    /// The one protocol these tests' agents speak (the engine's registry is not a dependency
    /// of this crate's unit tests).
    const CONNEXITY: crate::lang::ProtocolSpec = crate::lang::ProtocolSpec {
        name: "connexity",
        help: "test",
        endpoints: &[crate::lang::EndpointKind::Url],
        settings: &[],
        capabilities: crate::lang::Capabilities {
            streams: false,
            forks: true,
            measures_ttft: false,
            engine_runs_tools: false,
            session_bound: false,
            speaks_first: true,
            model_api: false,
            function_calls: false,
            pauses: false,
            agent_branches: false,
            provider_plays_llm: false,
            carries_tool_mocks: true,
        },
        builtins: &[],

        check: None,
    };

    fn project(text: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("suite.kdl");
        std::fs::write(&path, text).unwrap();
        match crate::load(&[&path], &[&CONNEXITY]) {
            Ok(p) => p,
            Err(d) => panic!("{}", d.render_plain()),
        }
    }

    const NESTED: &str = r#"
agent "a" protocol="connexity" url="http://127.0.0.1:1/agent/respond"
scenario "s" {
    user "one"
    branch "x" { user "x" }
    branch "y" {
        user "y"
        branch "y1" { user "y1" }
        branch "y2" { user "y2" }
        user "after y"
    }
    user "tail"
    branch "p" { user "p" }
    branch "q" { user "q" }
}
"#;

    #[test]
    fn forks_merges_and_nested_branches() {
        let p = project(NESTED);
        let tg = TrajectoryGraph::build(&p.suites[0].scenarios[0]);
        let names: Vec<&str> = tg.trajectories.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["x/p", "x/q", "y/y1/p", "y/y1/q", "y/y2/p", "y/y2/q"]
        );
        // start, x, y, y1, y2, then(after y), then(tail), p, q
        assert_eq!(tg.graph.node_count(), 9);
        assert!(!petgraph::algo::is_cyclic_directed(&tg.graph));
        let merges = tg
            .graph
            .node_indices()
            .filter(|&i| tg.graph[i].kind == SegmentKind::Merge)
            .count();
        assert_eq!(merges, 2);
        // The tail segment is reached from x and from the merge after y's fork.
        let tail = tg
            .graph
            .node_indices()
            .find(|&i| {
                tg.graph[i]
                    .steps
                    .iter()
                    .any(|s| matches!(&s.kind, StepKind::User(t) if t.source == "tail"))
            })
            .unwrap();
        assert_eq!(
            tg.graph.edges_directed(tail, Direction::Incoming).count(),
            2
        );
        let labels: Vec<&str> = tg.trajectories[2]
            .segments
            .iter()
            .map(|&s| tg.graph[s].label.as_str())
            .collect();
        assert_eq!(labels, ["start", "y", "y1", "then", "then", "p"]);
        assert_eq!(
            node_ids(labels),
            [
                "start",
                "y",
                "y/y1",
                "y/y1/then",
                "y/y1/then/then",
                "y/y1/then/then/p"
            ]
        );
    }

    #[test]
    fn counting_matches_enumeration_and_does_not_enumerate() {
        let p = project(NESTED);
        let sc = &p.suites[0].scenarios[0];
        assert_eq!(TrajectoryGraph::count(sc), 6);
        let mut text = String::from(
            "agent \"a\" protocol=\"connexity\" url=\"http://127.0.0.1:1/agent/respond\"\nscenario \"s\" {\n",
        );
        for i in 0..70 {
            text.push_str(&format!(
                "user \"u{i}\"\nbranch \"x\" {{ user \"x\" }}\nbranch \"y\" {{ user \"y\" }}\n"
            ));
        }
        text.push('}');
        // 2^70 trajectories: counted (saturating), never listed. Validation rejects it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("suite.kdl");
        std::fs::write(&path, text).unwrap();
        let err = crate::load(&[&path], &[&CONNEXITY]).unwrap_err();
        assert!(
            err.render_plain().contains("trajectories"),
            "{}",
            err.render_plain()
        );
    }

    /// The count without the graph against the trajectories the graph lists, for nested
    /// branch groups of every shape up to a size (a fixed pseudo-random walk of them).
    #[test]
    fn counting_without_the_graph_is_the_graphs_count() {
        fn next(seed: &mut u64, n: u64) -> u64 {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) % n
        }
        fn block(seed: &mut u64, depth: usize, out: &mut String) {
            for i in 0..next(seed, 4) {
                if depth < 3 && next(seed, 3) == 0 {
                    for b in 0..1 + next(seed, 3) {
                        out.push_str(&format!("branch \"b{depth}{i}{b}\" {{\n"));
                        block(seed, depth + 1, out);
                        out.push_str("}\n");
                    }
                } else {
                    out.push_str(&format!("user \"u{depth}{i}\"\n"));
                }
            }
        }
        let mut seed = 7u64;
        let mut text = String::from(
            "agent \"a\" protocol=\"connexity\" url=\"http://127.0.0.1:1/agent/respond\"\n",
        );
        for n in 0..200 {
            text.push_str(&format!("scenario \"s{n}\" {{\nuser \"hi\"\n"));
            block(&mut seed, 0, &mut text);
            text.push_str("}\n");
        }
        let p = project(&text);
        let mut shapes = std::collections::BTreeSet::new();
        for (_, sc) in p.scenarios() {
            let listed = TrajectoryGraph::build(sc).trajectories.len() as u64;
            assert_eq!(TrajectoryGraph::count(sc), listed, "{}", sc.id.value);
            shapes.insert(listed);
        }
        assert!(shapes.len() > 5, "too few shapes: {shapes:?}");
    }

    #[test]
    fn a_scenario_without_branches_is_one_main_trajectory() {
        let p = project(
            r#"agent "a" protocol="connexity" url="http://127.0.0.1:1/agent/respond"
scenario "s" { user "hi"; user "bye" }"#,
        );
        let tg = TrajectoryGraph::build(&p.suites[0].scenarios[0]);
        assert_eq!(tg.trajectories.len(), 1);
        assert_eq!(tg.trajectories[0].name, MAIN_TRAJECTORY);
        assert_eq!(tg.graph[tg.root].steps.len(), 2);
    }

    #[test]
    fn dot_and_mermaid_render_every_segment_and_edge() {
        let p = project(NESTED);
        let scenarios = p.scenarios().map(|(s, sc)| (s.name.as_str(), sc));
        let dot = render_trajectories(scenarios, GraphFormat::Dot);
        assert!(dot.starts_with("digraph trajectories {"));
        assert_eq!(dot.matches(" -> ").count(), 10);
        assert!(dot.contains("label=\"suite/s\""));
        let scenarios = p.scenarios().map(|(s, sc)| (s.name.as_str(), sc));
        let mermaid = render_trajectories(scenarios, GraphFormat::Mermaid);
        assert!(mermaid.starts_with("flowchart TD"));
        assert_eq!(mermaid.matches(" --> ").count(), 10);
        assert!(mermaid.contains("user: after y"));
    }

    #[test]
    fn needs_edges_point_from_dependency_to_dependent() {
        let p = project(
            r#"agent "a" protocol="connexity" url="http://127.0.0.1:1/agent/respond"
scenario "login" { user "hi" }
scenario "checkout" { needs "login"; user "buy" }"#,
        );
        let needs = NeedsGraph::build(&p);
        assert_eq!(needs.graph.edge_count(), 1);
        let e = needs.graph.edge_references().next().unwrap();
        assert_eq!(needs.graph[e.source()], (0, 0));
        assert_eq!(needs.graph[e.target()], (0, 1));
        let mermaid = render_needs(&p, GraphFormat::Mermaid);
        assert!(mermaid.contains("suite/login"));
    }
}
