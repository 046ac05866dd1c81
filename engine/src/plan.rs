//! Planning: from the validated suite model to what will run.
//!
//! A plan selects scenarios (status, `--filter`, `--tag`, plus whatever they `need`),
//! resolves their agents, compiles their templates, and turns each scenario's trajectory
//! DAG into an *execution tree*: the prefix tree of its trajectories, where a node is a
//! segment reached along one path. Each tree node runs once per repetition; its children
//! continue from copies of its conversation. Units of work are scenario × agent ×
//! repetition; they are enumerated lazily so a `repeat 100000` costs no memory up front.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use globset::{Glob, GlobMatcher};
use trellis_dsl::graph::{self, NeedsGraph, SegmentKind, TrajectoryGraph};
use trellis_dsl::{
    CaptureSource, Criterion, Endpoint, Project, Protocol, Scenario, Status, StepKind,
};

use crate::render::{CompiledTemplate, RenderError, ScenarioScope, Templates};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PlanError {
    #[error("invalid --filter pattern `{pattern}`")]
    #[diagnostic(
        code(trellis::plan::filter),
        help("use a glob such as `book-*` or `booking/*`")
    )]
    Filter {
        pattern: String,
        #[source]
        error: globset::Error,
    },
    #[error("scenario `{scenario}`: {error}")]
    #[diagnostic(code(trellis::plan::template))]
    Template {
        scenario: String,
        #[source]
        error: RenderError,
    },
    #[error("scenario `{scenario}` names no agent and the project defines {count}")]
    #[diagnostic(code(trellis::plan::agent), help("add `agent \"ID\"` to the scenario"))]
    NoAgent { scenario: String, count: usize },
    #[error("scenario `{scenario}` uses agent `{agent}`, which is not defined")]
    #[diagnostic(code(trellis::plan::agent))]
    UnknownAgent { scenario: String, agent: String },
}

/// Which scenarios to run.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Globs over the scenario id or `suite/scenario`; empty = all.
    pub filters: Vec<String>,
    /// Scenario or suite tags; empty = all.
    pub tags: Vec<String>,
    /// Also run `draft` and `archived` scenarios.
    pub include_inactive: bool,
}

/// A step as the executor runs it.
#[derive(Clone, Debug)]
pub enum PlannedStep {
    /// `first-turn "agent"`: the agent speaks first, before any user step.
    Opening,
    User(CompiledTemplate),
    /// Fixie `call FUNC "TEMPLATE"`.
    Call {
        function: String,
        input: CompiledTemplate,
    },
    Expect(Vec<Criterion>),
    Capture {
        name: String,
        source: CaptureSource,
    },
    /// `hitl` on a protocol that never pauses for a human: nothing to answer.
    Hitl,
}

/// A node of the execution tree.
#[derive(Clone, Debug)]
pub struct ExecNode {
    /// `start`, `accepts`, `accepts/then`: the path of segment labels.
    pub id: Arc<str>,
    pub parent: Option<usize>,
    pub children: Vec<usize>,
    pub steps: Vec<PlannedStep>,
    /// Trajectories (indices into [`PlannedScenario::trajectories`]) passing through here.
    pub trajectories: Vec<usize>,
    /// Set on leaves: the trajectory that ends here.
    pub ends: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct PlannedTrajectory {
    pub name: String,
    /// Execution node ids root first.
    pub nodes: Vec<Arc<str>>,
    /// Why this trajectory cannot run yet (`simulate`, `call` steps).
    pub unsupported: Option<String>,
}

#[derive(Clone, Debug)]
pub struct PlannedScenario {
    pub suite: Arc<str>,
    pub scenario: Arc<Scenario>,
    pub tags: Vec<String>,
    pub agents: Vec<usize>,
    pub nodes: Vec<ExecNode>,
    pub trajectories: Vec<PlannedTrajectory>,
    /// Scenarios (indices into [`Plan::scenarios`]) that must finish first.
    pub needs: Vec<usize>,
    pub scope: ScenarioScope,
    pub repeat: u32,
}

impl PlannedScenario {
    pub fn root(&self) -> usize {
        0
    }
}

#[derive(Clone, Debug)]
pub struct PlannedAgent {
    pub id: Arc<str>,
    pub protocol: Protocol,
    pub endpoint: Endpoint,
    pub headers: Vec<(String, CompiledTemplate)>,
    pub timeout: Duration,
    pub retries: u32,
    pub concurrency: Option<usize>,
    pub max_response_size: u64,
    /// `retry-after-send`: also retry timeouts and broken connections.
    pub retry_after_send: bool,
    /// Connexity `history`: what each request carries of the earlier turns.
    pub history: crate::protocol::connexity::HistoryMode,
    /// `stream`: AgentScope asks for server-sent events (default) or one JSON body.
    pub stream: bool,
    /// Why this agent's scenarios cannot run yet (protocol not implemented).
    pub unsupported: Option<String>,
}

#[derive(Debug)]
pub struct Plan {
    pub scenarios: Vec<PlannedScenario>,
    pub agents: Vec<PlannedAgent>,
    pub templates: Templates,
    pub suites: Vec<String>,
}

impl Plan {
    pub fn build(project: &Project, selection: &Selection) -> Result<Plan, PlanError> {
        let matchers = selection
            .filters
            .iter()
            .map(|p| {
                Glob::new(p)
                    .map(|g| g.compile_matcher())
                    .map_err(|error| PlanError::Filter {
                        pattern: p.clone(),
                        error,
                    })
            })
            .collect::<Result<Vec<GlobMatcher>, _>>()?;

        // Select, then pull in everything selected scenarios need.
        let keys: Vec<(usize, usize)> = project
            .suites
            .iter()
            .enumerate()
            .flat_map(|(si, s)| (0..s.scenarios.len()).map(move |ci| (si, ci)))
            .collect();
        let needs = NeedsGraph::build(project);
        let mut selected: BTreeSet<(usize, usize)> = keys
            .iter()
            .copied()
            .filter(|&(si, ci)| {
                let suite = &project.suites[si];
                let sc = &suite.scenarios[ci];
                let active = selection.include_inactive || sc.status == Status::Active;
                let full = format!("{}/{}", suite.name, sc.id.value);
                let by_filter = matchers.is_empty()
                    || matchers
                        .iter()
                        .any(|m| m.is_match(&sc.id.value) || m.is_match(&full));
                let by_tag = selection.tags.is_empty()
                    || selection
                        .tags
                        .iter()
                        .any(|t| sc.tags.contains(t) || suite.tags.contains(t));
                active && by_filter && by_tag
            })
            .collect();
        let mut stack: Vec<(usize, usize)> = selected.iter().copied().collect();
        while let Some(key) = stack.pop() {
            if let Some(&node) = needs.index.get(&key) {
                for dep in needs
                    .graph
                    .neighbors_directed(node, petgraph::Direction::Incoming)
                {
                    let dep_key = needs.graph[dep];
                    if selected.insert(dep_key) {
                        stack.push(dep_key);
                    }
                }
            }
        }

        let mut templates = Templates::new();
        let mut agents: Vec<PlannedAgent> = Vec::new();
        let mut agent_index: HashMap<String, usize> = HashMap::new();
        let mut scenarios = Vec::new();
        let mut scenario_index: HashMap<(usize, usize), usize> = HashMap::new();

        for &(si, ci) in &selected {
            let suite = &project.suites[si];
            let sc = &suite.scenarios[ci];
            let agent_ids: Vec<String> = if sc.agents.is_empty() {
                match project.agents.as_slice() {
                    [only] => vec![only.id.value.clone()],
                    all => {
                        return Err(PlanError::NoAgent {
                            scenario: sc.id.value.clone(),
                            count: all.len(),
                        });
                    }
                }
            } else {
                sc.agents.iter().map(|a| a.value.clone()).collect()
            };
            let mut indices: Vec<usize> = Vec::new();
            for id in agent_ids {
                if let Some(&i) = agent_index.get(&id) {
                    // Naming an agent twice must not run (and record) its units twice.
                    if !indices.contains(&i) {
                        indices.push(i);
                    }
                    continue;
                }
                let agent = project.agent(&id).ok_or_else(|| PlanError::UnknownAgent {
                    scenario: sc.id.value.clone(),
                    agent: id.clone(),
                })?;
                let headers = agent
                    .headers
                    .iter()
                    .map(|(name, t)| Ok((name.clone(), templates.compile(t)?)))
                    .collect::<Result<Vec<_>, RenderError>>()
                    .map_err(|error| PlanError::Template {
                        scenario: sc.id.value.clone(),
                        error,
                    })?;
                let unsupported = match agent.protocol {
                    Protocol::Connexity | Protocol::AgentScope | Protocol::Fixie => None,
                    other => Some(format!(
                        "the `{}` protocol is parsed and validated, but this version of trellis \
                         cannot run it yet",
                        other.as_str()
                    )),
                };
                agent_index.insert(id.clone(), agents.len());
                indices.push(agents.len());
                agents.push(PlannedAgent {
                    id: Arc::from(id.as_str()),
                    protocol: agent.protocol,
                    endpoint: agent.endpoint.clone(),
                    headers,
                    timeout: agent.timeout.unwrap_or(trellis_dsl::DEFAULT_CALL_TIMEOUT),
                    retries: agent.retries,
                    concurrency: agent.concurrency,
                    max_response_size: agent.max_response_size,
                    retry_after_send: false,
                    history: Default::default(),
                    stream: agent.stream,
                    unsupported,
                });
            }

            let persona = match &sc.persona {
                Some(trellis_dsl::PersonaRef::Named(id)) => project.persona(&id.value),
                Some(trellis_dsl::PersonaRef::Inline(p)) => Some(p),
                None => None,
            };
            let (nodes, trajectories) =
                execution_tree(sc, &mut templates).map_err(|error| PlanError::Template {
                    scenario: sc.id.value.clone(),
                    error,
                })?;
            let mut tags = suite.tags.clone();
            tags.extend(sc.tags.iter().cloned());
            scenario_index.insert((si, ci), scenarios.len());
            scenarios.push(PlannedScenario {
                suite: Arc::from(suite.name.as_str()),
                scenario: Arc::new(sc.clone()),
                tags,
                agents: indices,
                nodes,
                trajectories,
                needs: Vec::new(),
                scope: ScenarioScope::new(sc, persona),
                repeat: sc.repeat.max(1),
            });
        }

        for (&(si, ci), &i) in &scenario_index {
            let sc = &project.suites[si].scenarios[ci];
            scenarios[i].needs = sc
                .needs
                .iter()
                .filter_map(|n| graph::resolve_need(project, si, &n.value))
                .filter_map(|key| scenario_index.get(&key).copied())
                .collect();
        }

        Ok(Plan {
            scenarios,
            agents,
            templates,
            suites: project.suites.iter().map(|s| s.name.clone()).collect(),
        })
    }

    /// How many trajectories the plan runs (or records as skipped).
    pub fn trajectory_count(&self) -> u64 {
        self.scenarios
            .iter()
            .map(|s| s.trajectories.len() as u64 * s.agents.len() as u64 * u64::from(s.repeat))
            .sum()
    }
}

fn execution_tree(
    scenario: &Scenario,
    templates: &mut Templates,
) -> Result<(Vec<ExecNode>, Vec<PlannedTrajectory>), RenderError> {
    let tg = TrajectoryGraph::build(scenario);
    let mut nodes: Vec<ExecNode> = Vec::new();
    // (parent exec node, segment) -> exec node
    let mut index: HashMap<(Option<usize>, petgraph::graph::NodeIndex), usize> = HashMap::new();
    let mut compiled: HashMap<petgraph::graph::NodeIndex, (Vec<PlannedStep>, Option<String>)> =
        HashMap::new();
    let mut trajectories = Vec::new();

    for (ti, trajectory) in tg.trajectories.iter().enumerate() {
        let mut parent: Option<usize> = None;
        let mut unsupported = None;
        let labels: Vec<&str> = trajectory
            .segments
            .iter()
            .map(|&s| tg.segment(s).label.as_str())
            .collect();
        let ids = graph::node_ids(labels);
        for (&segment, id) in trajectory.segments.iter().zip(&ids) {
            if let Entry::Vacant(slot) = compiled.entry(segment) {
                slot.insert(compile_steps(tg.segment(segment), templates)?);
            }
            if let Some((_, Some(reason))) = compiled.get(&segment) {
                unsupported.get_or_insert_with(|| reason.clone());
            }
            let node = match index.get(&(parent, segment)) {
                Some(&n) => n,
                None => {
                    let n = nodes.len();
                    nodes.push(ExecNode {
                        id: Arc::from(id.as_str()),
                        parent,
                        children: Vec::new(),
                        steps: compiled
                            .get(&segment)
                            .map(|(s, _)| s.clone())
                            .unwrap_or_default(),
                        trajectories: Vec::new(),
                        ends: None,
                    });
                    if let Some(p) = parent {
                        nodes[p].children.push(n);
                    }
                    index.insert((parent, segment), n);
                    n
                }
            };
            nodes[node].trajectories.push(ti);
            parent = Some(node);
        }
        if let Some(leaf) = parent {
            nodes[leaf].ends = Some(ti);
        }
        trajectories.push(PlannedTrajectory {
            name: trajectory.name.clone(),
            nodes: ids.into_iter().map(|s| Arc::from(s.as_str())).collect(),
            unsupported,
        });
    }
    debug_assert!(tg.segment(tg.root).kind == SegmentKind::Root);
    Ok((nodes, trajectories))
}

fn compile_steps(
    segment: &graph::Segment,
    templates: &mut Templates,
) -> Result<(Vec<PlannedStep>, Option<String>), RenderError> {
    let mut steps = Vec::new();
    let mut unsupported = None;
    for step in &segment.steps {
        match &step.kind {
            StepKind::User(t) => steps.push(PlannedStep::User(templates.compile(t)?)),
            StepKind::Expect(c) => steps.push(PlannedStep::Expect(c.clone())),
            StepKind::Capture { name, source } => steps.push(PlannedStep::Capture {
                name: name.clone(),
                source: source.clone(),
            }),
            StepKind::Hitl { .. } => steps.push(PlannedStep::Hitl),
            StepKind::Simulate { .. } => {
                unsupported.get_or_insert_with(|| {
                    "`simulate` needs the LLM user simulator, which this version of trellis \
                     does not have yet"
                        .to_string()
                });
            }
            StepKind::Call { function, input } => steps.push(PlannedStep::Call {
                function: function.clone(),
                input: templates.compile(input)?,
            }),
            // Segments never hold forks: the graph turned them into edges.
            StepKind::Fork(_) => {}
        }
    }
    Ok((steps, unsupported))
}
