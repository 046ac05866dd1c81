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
        let mut graph = DiGraph::new();
        let root = graph.add_node(Segment {
            kind: SegmentKind::Root,
            label: ROOT_LABEL.to_string(),
            steps: Vec::new(),
            span: scenario.span,
        });
        add_block(&mut graph, root, &scenario.steps);
        let trajectories = enumerate(&graph, root);
        TrajectoryGraph {
            graph,
            root,
            trajectories,
        }
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

/// Appends `steps` starting in segment `current`; returns the segments the block ends in.
fn add_block(graph: &mut DiGraph<Segment, ()>, current: NodeIndex, steps: &[Step]) -> Vec<NodeIndex> {
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
        for (si, suite) in project.suites.iter().enumerate() {
            for (ci, scenario) in suite.scenarios.iter().enumerate() {
                for need in &scenario.needs {
                    if let Some(target) = resolve_need(project, si, &need.value)
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

/// Resolves a `needs` reference from suite `from_suite`: a scenario id of the same suite, or
/// `suite/scenario`.
pub fn resolve_need(project: &Project, from_suite: usize, reference: &str) -> Option<(usize, usize)> {
    let find = |si: usize, id: &str| {
        project
            .suites
            .get(si)?
            .scenarios
            .iter()
            .position(|s| s.id.value == id)
            .map(|ci| (si, ci))
    };
    if let Some(found) = find(from_suite, reference) {
        return Some(found);
    }
    let (suite, id) = reference.split_once('/')?;
    let si = project.suites.iter().position(|s| s.name == suite)?;
    find(si, id)
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
        GraphFormat::Dot => out.push_str("digraph trajectories {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];\n"),
        GraphFormat::Mermaid => out.push_str("flowchart TD\n"),
    }
    for (n, (suite, scenario)) in scenarios.into_iter().enumerate() {
        let tg = TrajectoryGraph::build(scenario);
        let title = format!("{suite}/{}", scenario.id.value);
        let id = |i: NodeIndex| format!("s{n}_{}", i.index());
        match format {
            GraphFormat::Dot => {
                let _ = writeln!(out, "  subgraph cluster_{n} {{\n    label={};", dot_quote(&title));
                for i in tg.graph.node_indices() {
                    let _ = writeln!(out, "    {} [label={}];", id(i), dot_quote(&segment_caption(&tg.graph[i])));
                }
                for e in tg.graph.edge_references() {
                    let _ = writeln!(out, "    {} -> {};", id(e.source()), id(e.target()));
                }
                out.push_str("  }\n");
            }
            GraphFormat::Mermaid => {
                let _ = writeln!(out, "  subgraph {}[{}]", format!("sc{n}"), mermaid_quote(&title));
                for i in tg.graph.node_indices() {
                    let _ = writeln!(out, "    {}[{}]", id(i), mermaid_quote(&segment_caption(&tg.graph[i])));
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

/// Renders the scenario `needs` DAG.
pub fn render_needs(project: &Project, format: GraphFormat) -> String {
    let needs = NeedsGraph::build(project);
    let name = |(si, ci): (usize, usize)| {
        format!("{}/{}", project.suites[si].name, project.suites[si].scenarios[ci].id.value)
    };
    let mut out = String::new();
    match format {
        GraphFormat::Dot => {
            out.push_str("digraph needs {\n  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];\n");
            for i in needs.graph.node_indices() {
                let _ = writeln!(out, "  n{} [label={}];", i.index(), dot_quote(&name(needs.graph[i])));
            }
            for e in needs.graph.edge_references() {
                let _ = writeln!(out, "  n{} -> n{};", e.source().index(), e.target().index());
            }
            out.push_str("}\n");
        }
        GraphFormat::Mermaid => {
            out.push_str("flowchart LR\n");
            for i in needs.graph.node_indices() {
                let _ = writeln!(out, "  n{}[{}]", i.index(), mermaid_quote(&name(needs.graph[i])));
            }
            for e in needs.graph.edge_references() {
                let _ = writeln!(out, "  n{} --> n{}", e.source().index(), e.target().index());
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
            StepKind::Simulate { turns: Some(n) } => format!("simulate {n} turns"),
            StepKind::Simulate { turns: None } => "simulate until done".to_string(),
            StepKind::Call { function, .. } => format!("call {function}"),
            StepKind::Expect(c) => format!(
                "expect {}",
                c.iter().map(|c| c.text.as_str()).collect::<Vec<_>>().join("; ")
            ),
            StepKind::Capture { name, .. } => format!("capture {name}"),
            StepKind::Hitl { approve, .. } => {
                format!("hitl {}", if *approve { "approve" } else { "reject" })
            }
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
    let escaped = s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
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
