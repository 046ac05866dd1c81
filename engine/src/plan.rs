//! Planning: from the validated suite model to what will run.
//!
//! A plan selects scenarios (status, `--filter`, `--tag`, plus whatever they `need`),
//! resolves their agents, compiles their templates, and turns each scenario's trajectory
//! DAG into an *execution tree*: the prefix tree of its trajectories, where a node is a
//! segment reached along one path. Each tree node runs once per repetition; its children
//! continue from copies of its conversation. Units of work are scenario × agent ×
//! repetition; they are enumerated lazily so a `repeat 100000` costs no memory up front.
//!
//! What this version of trellis cannot run yet is decided here, in [`not_runnable`], for both
//! the planner (which records those trajectories and checks as skipped) and `trellis check`
//! (which warns about them through [`warnings`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::FixedState;
use globset::{Glob, GlobMatcher};
use trellis_dsl::graph::{self, NeedsGraph, SegmentKind, TrajectoryGraph};
use trellis_dsl::{
    Agent, CaptureSource, Criterion, CriterionKind, Diagnostic, Endpoint, Project, Protocol,
    Scenario, Span, Status, StepKind, ValueSlot, walk_steps,
};

use crate::protocol::registry::{self, PlannedSettings};
use crate::render::{
    CompiledTemplate, EnvSnapshot, RenderError, ScenarioScope, Templates, snapshot_env,
};

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

/// `--filter` patterns, as `run` and `show` select scenarios by them: a glob matched against
/// a scenario's id and `suite/id`. An instance (`refund[A17]`) is selected by its own id
/// (also written out literally: `m[model=meta/llama-3]` is rarely a valid glob, `a-3` being
/// no class range) and by its scenario's id. Patterns are taken in NFC, as ids are compared
/// (a filter typed in a macOS terminal arrives in NFD).
#[derive(Debug, Default)]
pub struct ScenarioFilter {
    patterns: Vec<String>,
    globs: Vec<GlobMatcher>,
}

impl ScenarioFilter {
    pub fn new(patterns: &[String]) -> Result<Self, PlanError> {
        let patterns: Vec<String> = patterns
            .iter()
            .map(|f| trellis_dsl::names::nfc(f).into_owned())
            .collect();
        let globs = patterns
            .iter()
            .filter_map(|p| match Glob::new(p) {
                Ok(g) => Some(Ok(g.compile_matcher())),
                Err(_) if p.contains('[') && p.ends_with(']') => None,
                Err(error) => Some(Err(PlanError::Filter {
                    pattern: p.clone(),
                    error,
                })),
            })
            .collect::<Result<Vec<GlobMatcher>, _>>()?;
        Ok(ScenarioFilter { patterns, globs })
    }

    /// No pattern: everything is selected.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether scenario `id` of `suite` (an instance of scenario `base`) is selected.
    pub fn selects(&self, suite: &str, id: &str, base: Option<&str>) -> bool {
        if self.is_empty() {
            return true;
        }
        let full = format!("{suite}/{id}");
        self.globs.iter().any(|m| {
            m.is_match(id)
                || m.is_match(&full)
                || base.is_some_and(|b| m.is_match(b) || m.is_match(format!("{suite}/{b}")))
        }) || self.patterns.iter().any(|f| *f == id || *f == full)
    }
}

/// A criterion with its templated values compiled; check it with
/// [`crate::criteria::check_planned`], which renders them first.
#[derive(Clone, Debug)]
pub struct PlannedCriterion {
    pub criterion: Criterion,
    /// One per [`Criterion::templates`]: the value's slot and its compiled template.
    pub templates: Vec<(ValueSlot, CompiledTemplate)>,
}

impl PlannedCriterion {
    fn compile(criterion: &Criterion, templates: &mut Templates) -> Result<Self, RenderError> {
        let compiled = criterion
            .templates
            .iter()
            .map(|t| Ok((t.slot.clone(), templates.compile(&t.template)?)))
            .collect::<Result<Vec<_>, RenderError>>()?;
        Ok(PlannedCriterion {
            criterion: criterion.clone(),
            templates: compiled,
        })
    }
}

/// A step as the executor runs it.
#[derive(Clone, Debug)]
pub enum PlannedStep {
    /// `first-turn "agent"`: the agent speaks first, before any user step.
    Opening,
    User(CompiledTemplate),
    /// `call FUNC "INPUT"` on a Fixie agent.
    Call {
        function: String,
        input: CompiledTemplate,
    },
    Expect(Vec<PlannedCriterion>),
    Capture {
        name: String,
        source: CaptureSource,
    },
    /// `simulate turns=N` / `simulate until-done` (`turns: None`): the LLM simulator writes
    /// the user side (planned only when the project has a simulator).
    Simulate {
        turns: Option<u32>,
        /// The scenario's or branch's `simulator`; `None`: the project's.
        simulator: Option<std::sync::Arc<trellis_dsl::Simulator>>,
        /// The branch's `persona`; `None`: the scenario's.
        persona: Option<std::sync::Arc<trellis_dsl::PersonaRef>>,
    },
    /// `hitl approve|reject message=…`: the answer to an agent waiting for a human. On a
    /// protocol that never pauses (anything but MultiAgentEval) there is nothing to answer.
    Hitl {
        approve: bool,
        message: Option<CompiledTemplate>,
    },
    /// `attack`: the beam search of adversarial user messages, the node's last step
    /// (`execute::attack`).
    Attack(std::sync::Arc<trellis_dsl::Attack>),
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
    /// Why this trajectory cannot run yet on any agent (`simulate` steps).
    pub unsupported: Option<String>,
    /// Why it cannot run yet on agents of one protocol (`user` steps on `fixie`).
    pub unsupported_by_protocol: Vec<(Protocol, String)>,
    /// What the trajectory's plan means, as recorded in the journal (`CONV:CHECKS`, see
    /// [`crate::fingerprint::stamp`]); `None` until stamped.
    pub fingerprint: Option<Arc<str>>,
}

impl PlannedTrajectory {
    /// Why this trajectory cannot run yet on an agent speaking `protocol`, if it cannot.
    /// (The agent itself may be unsupported too: see [`PlannedAgent::unsupported`].)
    pub fn unsupported_on(&self, protocol: Protocol) -> Option<&str> {
        self.unsupported.as_deref().or_else(|| {
            self.unsupported_by_protocol
                .iter()
                .find(|(p, _)| *p == protocol)
                .map(|(_, why)| why.as_str())
        })
    }

    /// Why this trajectory cannot run yet on `agent`, if it cannot: as
    /// [`unsupported_on`](Self::unsupported_on) its protocol, except that an agent whose
    /// own `provider` plays its LLM (Fixie) lacks no provider.
    pub fn unsupported_for(&self, agent: &PlannedAgent) -> Option<&str> {
        if agent.provider.is_some() && agent.protocol.capabilities().provider_plays_llm {
            return self.unsupported.as_deref();
        }
        self.unsupported_on(agent.protocol)
    }
}

#[derive(Clone, Debug)]
pub struct PlannedScenario {
    pub suite: Arc<str>,
    pub scenario: Arc<Scenario>,
    pub tags: Vec<String>,
    pub agents: Vec<usize>,
    /// Shared by the instances of one `for-each`/`matrix` scenario, which share their
    /// steps (`dsl/src/model.rs`): compiled once, for the first of them.
    pub nodes: Arc<Vec<ExecNode>>,
    pub trajectories: Vec<PlannedTrajectory>,
    /// Scenarios (indices into [`Plan::scenarios`]) that must finish first.
    pub needs: Vec<usize>,
    /// Scenarios it needs that do not run: `draft` or `archived` ones, which a selection
    /// does not pull in without `--include-inactive`. Each is `(id, its status)`; the
    /// scenario is skipped, saying so, as when a need did not pass.
    pub inactive_needs: Vec<(String, &'static str)>,
    /// Checked on the whole trajectory after its last step: `criteria { }`, then
    /// `expect-tool`, in source order. Shared by instances as `nodes` is.
    pub criteria: Arc<Vec<PlannedCriterion>>,
    pub scope: ScenarioScope,
    pub repeat: u32,
    /// The tools the engine answers for agents that leave tool calls to the harness
    /// (MultiAgentEval): the project's `tool`s, the scenario's `initial-state` and
    /// `undeclared-tools`. Shared by every trajectory; each gets its own sandbox from it.
    pub sandbox: Arc<crate::sandbox::SandboxSpec>,
    /// How far agent-initiated branches are explored.
    pub agent_branches: trellis_dsl::AgentBranches,
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
    /// `header` nodes reading only `env` (or nothing): rendered once per run.
    pub headers: Vec<(String, CompiledTemplate)>,
    /// `header` nodes reading the turn's variables (`user_context`, `persona`, `scenario`,
    /// `vars`, `row`): rendered for each turn, sent over the ones above.
    pub turn_headers: Vec<(String, CompiledTemplate)>,
    /// Whether the agent's `system-prompt` reads the turn's variables, as a turn header
    /// can: it is then rendered for each turn rather than once per run.
    pub system_prompt_per_turn: bool,
    pub timeout: Duration,
    pub retries: u32,
    pub concurrency: Option<usize>,
    pub max_response_size: u64,
    /// `retry-after-send`: also retry timeouts and broken connections.
    pub retry_after_send: bool,
    /// `per-shard #true`: `concurrency` is each shard's own, not divided among the shards
    /// of a sharded run ([`crate::shard::divide_budgets`]).
    pub per_shard: bool,
    /// `spans #true`: collect the agent's OpenTelemetry spans for its turns.
    pub spans: bool,
    /// The protocol's own settings, as its module planned them
    /// ([`crate::protocol::registry::ProtocolModule::plan`]); only that module reads them.
    pub settings: Arc<dyn PlannedSettings>,
    /// `provider=`: the provider a model under test is reached through (`openai`,
    /// `anthropic`), or that plays a Fixie agent's LLM.
    pub provider: Option<Arc<str>>,
    /// Why this agent's scenarios cannot run yet (protocol not implemented).
    pub unsupported: Option<String>,
    /// `secret-env`: the environment variables whose values are this agent's secrets.
    pub secret_env: Vec<String>,
}

/// An agent's call timeout: its own `timeout`, else, for a model reached through a provider,
/// the provider's (a model call takes seconds to minutes on a local CPU server), else
/// [`trellis_dsl::DEFAULT_CALL_TIMEOUT`].
fn agent_timeout(project: &Project, agent: &trellis_dsl::Agent) -> Duration {
    let via_provider = match &agent.endpoint {
        trellis_dsl::Endpoint::Provider(id) => project.provider(&id.value),
        _ => None,
    };
    agent.timeout.unwrap_or_else(|| match via_provider {
        Some(p) => p.call_timeout(),
        None => trellis_dsl::DEFAULT_CALL_TIMEOUT,
    })
}

#[derive(Debug)]
pub struct Plan {
    pub scenarios: Vec<PlannedScenario>,
    pub agents: Vec<PlannedAgent>,
    pub templates: Templates,
    pub suites: Vec<String>,
    /// The project's providers, judges, simulator and personas, for the run's LLM calls.
    pub llm: crate::llm::LlmSetup,
}

impl Plan {
    /// Plans with a snapshot of the process environment taken now, as `env` for templates.
    pub fn build(project: &Project, selection: &Selection) -> Result<Plan, PlanError> {
        Self::build_with_env(project, selection, snapshot_env())
    }

    /// Plans with `env` as what templates read as `env.NAME` (tests pass their own map
    /// instead of changing the process environment).
    pub fn build_with_env(
        project: &Project,
        selection: &Selection,
        env: Arc<EnvSnapshot>,
    ) -> Result<Plan, PlanError> {
        Self::build_counting(project, selection, env, None)
    }

    /// What [`Plan::not_runnable`] says of the plan [`Plan::build_with_env`] would build,
    /// without keeping it: each scenario is counted as soon as it is planned and dropped, so
    /// `trellis check` of a suite of tens of thousands of scenarios holds one scenario's plan
    /// at a time rather than the whole plan (which took as much memory as the loaded suite).
    pub fn count_not_runnable(
        project: &Project,
        selection: &Selection,
        env: Arc<EnvSnapshot>,
    ) -> Result<NotRunnableCounts, PlanError> {
        let mut counts = NotRunnableCounts::default();
        Self::build_counting(project, selection, env, Some(&mut counts))?;
        Ok(counts)
    }

    /// Builds the plan, or with `counts`, counts each scenario as it is planned and keeps
    /// none of them (the returned plan then has no scenarios).
    fn build_counting(
        project: &Project,
        selection: &Selection,
        env: Arc<EnvSnapshot>,
        mut counts: Option<&mut NotRunnableCounts>,
    ) -> Result<Plan, PlanError> {
        let filter = ScenarioFilter::new(&selection.filters)?;

        // In NFC once per suite: a suite is named after its file (macOS names files in NFD).
        let suite_names: Vec<_> = project
            .suites
            .iter()
            .map(|s| trellis_dsl::names::nfc(&s.name))
            .collect();
        // Select, then pull in everything selected scenarios need.
        let keys: Vec<(usize, usize)> = project
            .suites
            .iter()
            .enumerate()
            .flat_map(|(si, s)| (0..s.scenarios.len()).map(move |ci| (si, ci)))
            .collect();
        let mut selected: BTreeSet<(usize, usize)> = keys
            .iter()
            .copied()
            .filter(|&(si, ci)| {
                let suite = &project.suites[si];
                let sc = &suite.scenarios[ci];
                let active = selection.include_inactive || sc.status == Status::Active;
                let by_tag = selection.tags.is_empty()
                    || selection
                        .tags
                        .iter()
                        .any(|t| sc.tags.contains(t) || suite.tags.contains(t));
                // The ids are written out only when there are filters to match them: a run
                // of every scenario spent about 1,000 instructions on each for nothing.
                let by_filter = || {
                    let base = sc
                        .instance
                        .as_ref()
                        .map(|i| trellis_dsl::names::nfc(&i.base));
                    filter.selects(
                        &suite_names[si],
                        &trellis_dsl::names::nfc(&sc.id.value),
                        base.as_deref(),
                    )
                };
                active && by_tag && (filter.is_empty() || by_filter())
            })
            .collect();
        // What the selected scenarios need is selected too. Without any `needs` there is
        // nothing to add, and no graph of every scenario to build (20,000 of them: 12 M
        // instructions).
        if project.scenarios().any(|(_, sc)| !sc.needs.is_empty()) {
            let needs = NeedsGraph::build(project);
            let mut stack: Vec<(usize, usize)> = selected.iter().copied().collect();
            while let Some(key) = stack.pop() {
                let Some(&node) = needs.index.get(&key) else {
                    continue;
                };
                for dep in needs
                    .graph
                    .neighbors_directed(node, petgraph::Direction::Incoming)
                {
                    let dep_key = needs.graph[dep];
                    // A draft or archived need stays out, as it would unselected: the
                    // scenario that needs it is skipped, saying why.
                    let (dsi, dci) = dep_key;
                    let dep_active = selection.include_inactive
                        || project.suites[dsi].scenarios[dci].status == Status::Active;
                    if dep_active && selected.insert(dep_key) {
                        stack.push(dep_key);
                    }
                }
            }
        }

        let mut templates = Templates::new(env.clone());
        let project_tools = crate::sandbox::SandboxSpec::project_tools(project);
        let personas: HashMap<&str, Arc<trellis_dsl::Persona>> = project
            .personas
            .iter()
            .map(|p| (p.id.value.as_str(), Arc::new(p.clone())))
            .collect();
        // Scenarios without tools or state of their own share one sandbox.
        let plain_sandbox = Arc::new(crate::sandbox::SandboxSpec {
            shared_tools: Arc::clone(&project_tools),
            ..crate::sandbox::SandboxSpec::default()
        });
        let sandbox = |sc: &Scenario| {
            if sc.tools.is_empty()
                && sc.initial_state.is_empty()
                && sc.undeclared_tools == trellis_dsl::UndeclaredTools::Default
            {
                Arc::clone(&plain_sandbox)
            } else {
                Arc::new(crate::sandbox::SandboxSpec::for_scenario(
                    &project_tools,
                    sc,
                ))
            }
        };
        let llm = crate::llm::LlmSetup::from_project(project);
        let simulator = llm.has_simulator();
        let mut agents: Vec<PlannedAgent> = Vec::new();
        let mut agent_index: HashMap<String, usize> = HashMap::new();
        let mut scenarios = Vec::with_capacity(selected.len());
        let mut scenario_index: HashMap<(usize, usize), usize> = HashMap::new();
        // The execution trees compiled, by the address of the steps they were compiled
        // from (the project, borrowed for the whole build, keeps every such address
        // theirs), the agents' protocols and `first-turn`: a dataset's instances share
        // their steps, and compiling a tree per row took about 4 KB of every row planned.
        let mut trees: HashMap<SharedTreeKey, SharedTree, FixedState> = HashMap::default();
        // The same for trajectory checks, by the address of the `criteria` compiled.
        let mut checks: HashMap<usize, Arc<Vec<PlannedCriterion>>, FixedState> = HashMap::default();

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
                let mut headers = Vec::new();
                let mut turn_headers = Vec::new();
                for (name, t) in &agent.headers {
                    let compiled = templates.compile(t).map_err(|error| PlanError::Template {
                        scenario: sc.id.value.clone(),
                        error,
                    })?;
                    if trellis_dsl::template::reads_turn_scope(&t.source) {
                        turn_headers.push((name.clone(), compiled));
                    } else {
                        headers.push((name.clone(), compiled));
                    }
                }
                let system_prompt_per_turn = agent
                    .settings
                    .get("system-prompt")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(trellis_dsl::template::reads_turn_scope);
                let unsupported = not_runnable::agent(agent);
                let settings = match registry::module(agent.protocol) {
                    Some(module) => module.plan(project, agent, &mut templates),
                    None => Ok(Arc::new(NoModule) as Arc<dyn PlannedSettings>),
                }
                .map_err(|error| PlanError::Template {
                    scenario: sc.id.value.clone(),
                    error,
                })?;
                agent_index.insert(id.clone(), agents.len());
                indices.push(agents.len());
                agents.push(PlannedAgent {
                    id: Arc::from(id.as_str()),
                    protocol: agent.protocol,
                    endpoint: agent.endpoint.clone(),
                    headers,
                    turn_headers,
                    system_prompt_per_turn,
                    timeout: agent_timeout(project, agent),
                    retries: agent.retries,
                    concurrency: agent.concurrency,
                    max_response_size: agent.max_response_size,
                    retry_after_send: agent.retry_after_send,
                    per_shard: agent.per_shard,
                    spans: agent.spans,
                    settings,
                    provider: agent.provider.as_ref().map(|p| Arc::from(p.value.as_str())),
                    unsupported,
                    secret_env: agent.secret_env.iter().map(|n| n.value.clone()).collect(),
                });
            }

            // A named persona is shared by the scopes of the scenarios that play it.
            let persona = match &sc.persona {
                Some(trellis_dsl::PersonaRef::Named(id)) => {
                    personas.get(id.value.as_str()).cloned()
                }
                Some(trellis_dsl::PersonaRef::Inline(p)) => {
                    Some(Arc::new(trellis_dsl::Persona::clone(p)))
                }
                None => None,
            };
            let protocols: Vec<Protocol> = indices.iter().map(|&i| agents[i].protocol).collect();
            let template_error = |error| PlanError::Template {
                scenario: sc.id.value.clone(),
                error,
            };
            // Only steps another scenario shares (a dataset's instances) are worth keeping the
            // tree of: a scenario of its own is neither looked up nor kept.
            let tree_key = (Arc::strong_count(&sc.steps) > 1).then(|| {
                (
                    Arc::as_ptr(&sc.steps) as usize,
                    protocols.clone(),
                    sc.first_turn == trellis_dsl::FirstTurn::Agent,
                )
            });
            let (nodes, mut trajectories) = match tree_key.as_ref().and_then(|k| trees.get(k)) {
                Some((nodes, trajectories)) => (Arc::clone(nodes), trajectories.clone()),
                None => {
                    let (mut nodes, trajectories) =
                        execution_tree(sc, &protocols, simulator, &mut templates)
                            .map_err(template_error)?;
                    // `first-turn "agent"`: the agent speaks before the first scripted step.
                    if sc.first_turn == trellis_dsl::FirstTurn::Agent
                        && let Some(root) = nodes.first_mut()
                    {
                        root.steps.insert(0, PlannedStep::Opening);
                    }
                    let nodes = Arc::new(nodes);
                    if let Some(key) = tree_key {
                        trees.insert(key, (Arc::clone(&nodes), trajectories.clone()));
                    }
                    (nodes, trajectories)
                }
            };
            // Shared as the trees are, when `expect-tool` adds none of the instance's own.
            let checks_key = (sc.expect_tools.is_empty() && Arc::strong_count(&sc.criteria) > 1)
                .then(|| Arc::as_ptr(&sc.criteria) as usize);
            let criteria = match checks_key.and_then(|key| checks.get(&key)) {
                Some(compiled) => Arc::clone(compiled),
                None => {
                    let compiled = Arc::new(
                        sc.criteria
                            .iter()
                            .chain(&sc.expect_tools)
                            .map(|c| PlannedCriterion::compile(c, &mut templates))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(template_error)?,
                    );
                    if let Some(key) = checks_key {
                        checks.insert(key, Arc::clone(&compiled));
                    }
                    compiled
                }
            };
            let mut tags = suite.tags.clone();
            tags.extend(sc.tags.iter().cloned());
            let mut scope = ScenarioScope::new(Arc::clone(sc), persona.clone(), &env);
            // A persona written with templates is played as the scenario fills it in, before
            // any capture (`trellis check` refuses a read of one there): by the simulated
            // user, in the judges' prompts and as `persona.*`.
            // One that cannot be (an `env` variable not set, which `check` warns about)
            // leaves the scenario's trajectories skipped, saying why: played as written, the
            // simulator would read the braces.
            let mut filled_in = None;
            if let Some(p) = &persona {
                match crate::render::persona_rendered(p, |text| {
                    templates.render_source(text, || scope.with_vars(&BTreeMap::new()))
                }) {
                    Ok(rendered) if !Arc::ptr_eq(p, &rendered) => {
                        scope =
                            ScenarioScope::new(Arc::clone(sc), Some(Arc::clone(&rendered)), &env);
                        filled_in = Some(rendered);
                    }
                    Ok(_) => {}
                    Err(error) => {
                        let why = format!(
                            "its persona `{}` could not be filled in: {error}",
                            p.id.value
                        );
                        for t in &mut trajectories {
                            t.unsupported.get_or_insert_with(|| why.clone());
                        }
                    }
                }
            }
            let mut scenario = crate::render::judge_texts_rendered(sc, &templates, &scope);
            if let Some(rendered) = filled_in {
                Arc::make_mut(&mut scenario).persona = Some(trellis_dsl::PersonaRef::Inline(
                    Box::new(trellis_dsl::Persona::clone(&rendered)),
                ));
            }
            let planned = PlannedScenario {
                suite: Arc::from(suite.name.as_str()),
                scope,
                scenario,
                tags,
                agents: indices,
                nodes,
                trajectories,
                needs: Vec::new(),
                inactive_needs: Vec::new(),
                criteria,
                repeat: sc.repeat.max(1),
                sandbox: sandbox(sc),
                agent_branches: sc.agent_branches,
            };
            match counts.as_deref_mut() {
                Some(counts) => count_scenario(&planned, &agents, llm.has_judge(), counts),
                None => {
                    scenario_index.insert((si, ci), scenarios.len());
                    scenarios.push(planned);
                }
            }
        }

        let mut resolver = None;
        for (&(si, ci), &i) in &scenario_index {
            let sc = &project.suites[si].scenarios[ci];
            if sc.needs.is_empty() {
                continue;
            }
            let resolver = resolver.get_or_insert_with(|| graph::NeedResolver::of(project));
            let resolved: Vec<(usize, usize)> = sc
                .needs
                .iter()
                .filter_map(|n| resolver.resolve(si, &n.value).ok())
                .collect();
            scenarios[i].needs = resolved
                .iter()
                .filter_map(|key| scenario_index.get(key).copied())
                .collect();
            scenarios[i].inactive_needs = resolved
                .iter()
                .filter(|key| !scenario_index.contains_key(key))
                .map(|&(dsi, dci)| {
                    let dep = &project.suites[dsi].scenarios[dci];
                    let id = if dsi == si {
                        dep.id.value.clone()
                    } else {
                        format!("{}/{}", project.suites[dsi].name, dep.id.value)
                    };
                    let status = match dep.status {
                        Status::Draft => "a draft",
                        Status::Archived => "archived",
                        Status::Active => "not selected",
                    };
                    (id, status)
                })
                .collect();
        }

        Ok(Plan {
            scenarios,
            agents,
            templates,
            suites: project.suites.iter().map(|s| s.name.clone()).collect(),
            llm,
        })
    }

    /// What of this plan cannot run yet: trajectories (per agent, one repetition) recorded as
    /// skipped, and checks of the other trajectories recorded as skipped.
    pub fn not_runnable(&self) -> NotRunnableCounts {
        let mut counts = NotRunnableCounts::default();
        let judged = self.llm.has_judge();
        for s in &self.scenarios {
            count_scenario(s, &self.agents, judged, &mut counts);
        }
        counts
    }

    /// What `planned` tells a report about its scenario (the `run_started` entry's
    /// `scenarios`, and a sharded run's `shard.json`); the trajectories' fingerprints only
    /// once every one is stamped ([`crate::fingerprint::stamp`]).
    pub fn scenario_info(&self, planned: &PlannedScenario) -> crate::record::ScenarioInfo {
        let sc = &planned.scenario;
        crate::record::ScenarioInfo {
            suite: planned.suite.to_string(),
            scenario: sc.id.value.clone(),
            name: sc.name.clone(),
            description: sc.description.clone(),
            persona: planned.scope.persona(),
            user_context: sc.user_context.clone(),
            agents: planned
                .agents
                .iter()
                .filter_map(|&a| self.agents.get(a))
                .map(|a| a.id.to_string())
                .collect(),
            trajectories: planned
                .trajectories
                .iter()
                .map(|t| t.name.clone())
                .collect(),
            fingerprints: planned
                .trajectories
                .iter()
                .map(|t| t.fingerprint.as_deref().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default(),
            repeat: planned.repeat,
            instance: sc.instance.as_ref().map(|i| crate::record::InstanceInfo {
                of: i.base.clone(),
                dataset: i.dataset.clone(),
                row_id: i.row_id.clone(),
                row: i.row.clone(),
                vars: i.vars.iter().cloned().collect(),
            }),
            history: sc.history.as_ref().and_then(|h| h.messages.clone()),
        }
    }

    /// How many trajectories the plan runs (or records as skipped).
    pub fn trajectory_count(&self) -> u64 {
        self.scenarios
            .iter()
            .map(|s| s.trajectories.len() as u64 * s.agents.len() as u64 * u64::from(s.repeat))
            .sum()
    }
}

/// Adds what of one planned scenario cannot run yet to `counts` ([`Plan::not_runnable`]);
/// `judged`: a judge is configured, so judged checks run.
fn count_scenario(
    s: &PlannedScenario,
    agents: &[PlannedAgent],
    judged: bool,
    counts: &mut NotRunnableCounts,
) {
    // Each trajectory's nodes, read up from its leaf: testing every node for every
    // trajectory took seconds on a scenario of 10,000 branches.
    let mut leaves = vec![None; s.trajectories.len()];
    for (i, node) in s.nodes.iter().enumerate() {
        if let Some(slot) = node.ends.and_then(|t| leaves.get_mut(t)) {
            *slot = Some(i);
        }
    }
    let path = |ti: usize| {
        std::iter::successors(leaves.get(ti).copied().flatten(), |&n| {
            s.nodes.get(n).and_then(|node| node.parent)
        })
        .filter_map(|n| s.nodes.get(n))
    };
    for &a in &s.agents {
        let Some(agent) = agents.get(a) else {
            continue;
        };
        for (ti, t) in s.trajectories.iter().enumerate() {
            counts.trajectories += 1;
            if agent.unsupported.is_some() || t.unsupported_for(agent).is_some() {
                counts.skipped_trajectories += 1;
                continue;
            }
            let turn_checks = path(ti)
                .flat_map(|n| &n.steps)
                .filter_map(|step| match step {
                    PlannedStep::Expect(c) => Some(c),
                    _ => None,
                })
                .flatten();
            let skipped = turn_checks
                .chain(s.criteria.iter())
                .filter(|c| {
                    not_runnable::criterion(&c.criterion.kind).is_some()
                        && !(judged && crate::llm::LlmRuntime::is_judged(&c.criterion.kind))
                })
                .count()
                + if judged { 0 } else { s.scenario.outcomes.len() };
            counts.skipped_checks += skipped as u64;
        }
    }
}

/// See [`Plan::not_runnable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotRunnableCounts {
    /// Trajectories × agents, one repetition each.
    pub trajectories: u64,
    /// Of those, the ones that cannot run yet.
    pub skipped_trajectories: u64,
    /// Checks of the runnable ones that will be recorded as skipped.
    pub skipped_checks: u64,
}

fn execution_tree(
    scenario: &Scenario,
    protocols: &[Protocol],
    simulator: bool,
    templates: &mut Templates,
) -> Result<(Vec<ExecNode>, Vec<PlannedTrajectory>), RenderError> {
    let mut tg = TrajectoryGraph::build(scenario);
    // Taken, so each trajectory's name moves into the plan and its path is freed as it is
    // planned (names and paths grow with the nesting depth: copies were a third of the peak
    // of planning 10,000 branches nested 125 deep).
    let graph_trajectories = std::mem::take(&mut tg.trajectories);
    let mut nodes: Vec<ExecNode> = Vec::new();
    // (parent exec node, segment) -> exec node. Hashed with foldhash, and the segments'
    // steps kept by segment index: two std maps per scenario (SipHash, grown from empty)
    // were about 1,500 instructions of every scenario planned.
    let mut index: HashMap<(Option<usize>, petgraph::graph::NodeIndex), usize, FixedState> =
        HashMap::with_capacity_and_hasher(tg.graph.node_count(), FixedState::default());
    let mut compiled: Vec<Option<CompiledSegment>> = Vec::new();
    compiled.resize_with(tg.graph.node_count(), || None);
    let mut trajectories = Vec::new();

    for (ti, trajectory) in graph_trajectories.into_iter().enumerate() {
        let mut parent: Option<usize> = None;
        let mut unsupported = None;
        let mut unsupported_by_protocol: Vec<(Protocol, String)> = Vec::new();
        // The trajectory's node ids are its nodes' own `Arc`s: a fresh string per trajectory
        // and node grew with the square of the nesting depth (10,000 branches nested 126
        // deep took 250 MB).
        let mut ids: Vec<Arc<str>> = Vec::with_capacity(trajectory.segments.len());
        for &segment in &trajectory.segments {
            let slot = compiled.get_mut(segment.index());
            if let Some(slot @ None) = slot {
                *slot = Some(compile_steps(
                    tg.segment(segment),
                    protocols,
                    simulator,
                    templates,
                )?);
            }
            if let Some(Some(segment)) = compiled.get(segment.index()) {
                if let Some(reason) = &segment.unsupported {
                    unsupported.get_or_insert_with(|| reason.clone());
                }
                for (protocol, reason) in &segment.unsupported_by_protocol {
                    if !unsupported_by_protocol.iter().any(|(p, _)| p == protocol) {
                        unsupported_by_protocol.push((*protocol, reason.clone()));
                    }
                }
            }
            let node = match index.get(&(parent, segment)) {
                Some(&n) => n,
                None => {
                    let n = nodes.len();
                    let label = &tg.segment(segment).label;
                    // As `graph::node_ids`: the root is `start`, below it the labels from
                    // the root's child down, joined with `/`.
                    let id: Arc<str> = match parent.and_then(|p| nodes[p].parent.map(|_| p)) {
                        Some(p) => Arc::from(format!("{}/{label}", nodes[p].id)),
                        None => Arc::from(label.as_str()),
                    };
                    nodes.push(ExecNode {
                        id,
                        parent,
                        children: Vec::new(),
                        steps: compiled
                            .get(segment.index())
                            .and_then(Option::as_ref)
                            .map(|s| s.steps.clone())
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
            ids.push(Arc::clone(&nodes[node].id));
            parent = Some(node);
        }
        if let Some(leaf) = parent {
            nodes[leaf].ends = Some(ti);
        }
        trajectories.push(PlannedTrajectory {
            name: trajectory.name,
            nodes: ids,
            unsupported,
            unsupported_by_protocol,
            fingerprint: None,
        });
    }
    debug_assert!(tg.segment(tg.root).kind == SegmentKind::Root);
    // A plan holds these for every scenario: most scenarios have one node and one trajectory,
    // and the room a growing vector leaves was a tenth of planning 30,000 of them.
    nodes.shrink_to_fit();
    for node in &mut nodes {
        // Grown one trajectory and child at a time: up to twice their size.
        node.trajectories.shrink_to_fit();
        node.children.shrink_to_fit();
    }
    trajectories.shrink_to_fit();
    Ok((nodes, trajectories))
}

/// What a planned execution tree is shared by: the address of the steps it was compiled
/// from, the agents' protocols, whether the agent speaks first.
type SharedTreeKey = (usize, Vec<Protocol>, bool);

/// A planned execution tree kept for the scenarios that share its steps, with its
/// trajectories as planned.
type SharedTree = (Arc<Vec<ExecNode>>, Vec<PlannedTrajectory>);

/// A segment's steps as the executor runs them, and what keeps them from running.
struct CompiledSegment {
    steps: Vec<PlannedStep>,
    unsupported: Option<String>,
    unsupported_by_protocol: Vec<(Protocol, String)>,
}

fn compile_steps(
    segment: &graph::Segment,
    protocols: &[Protocol],
    simulator: bool,
    templates: &mut Templates,
) -> Result<CompiledSegment, RenderError> {
    let mut out = CompiledSegment {
        steps: Vec::new(),
        unsupported: None,
        unsupported_by_protocol: Vec::new(),
    };
    for step in &segment.steps {
        if let Some(reason) = not_runnable::step(&step.kind, None)
            && !matches!(&step.kind, StepKind::Simulate { simulator: own, .. } if simulator || names_provider(own))
            && !matches!(&step.kind, StepKind::Attack(a) if simulator || a.attacker.is_some())
        {
            out.unsupported.get_or_insert(reason);
        }
        for &protocol in protocols {
            // Such an agent's LLM is played by the simulator's provider (`protocol::fixie`).
            if let Some(reason) = not_runnable::step(&step.kind, Some(protocol))
                && !(simulator && protocol.capabilities().provider_plays_llm)
                && !out
                    .unsupported_by_protocol
                    .iter()
                    .any(|(p, _)| *p == protocol)
            {
                out.unsupported_by_protocol.push((protocol, reason));
            }
        }
        match &step.kind {
            StepKind::User(t) => out.steps.push(PlannedStep::User(templates.compile(t)?)),
            StepKind::Call { function, input } => out.steps.push(PlannedStep::Call {
                function: function.clone(),
                input: templates.compile(input)?,
            }),
            StepKind::Expect(criteria) => out.steps.push(PlannedStep::Expect(
                criteria
                    .iter()
                    .map(|c| PlannedCriterion::compile(c, templates))
                    .collect::<Result<_, _>>()?,
            )),
            StepKind::Capture { name, source } => out.steps.push(PlannedStep::Capture {
                name: name.clone(),
                source: source.clone(),
            }),
            StepKind::Hitl { approve, message } => out.steps.push(PlannedStep::Hitl {
                approve: *approve,
                message: message.as_ref().map(|m| templates.compile(m)).transpose()?,
            }),
            // Without a simulator the trajectory is recorded as skipped (`not_runnable::step`).
            StepKind::Simulate {
                turns,
                simulator,
                persona,
            } => out.steps.push(PlannedStep::Simulate {
                turns: *turns,
                simulator: simulator.clone(),
                persona: persona.clone(),
            }),
            StepKind::Attack(a) => out.steps.push(PlannedStep::Attack(a.clone())),
            // Segments never hold forks: the graph turned them into edges.
            StepKind::Fork(_) => {}
        }
    }
    Ok(out)
}

/// Whether a step's own simulator (a scenario's or branch's) names a provider in one of its
/// layers, so the step runs without a project-wide simulator.
fn names_provider(own: &Option<std::sync::Arc<trellis_dsl::Simulator>>) -> bool {
    own.as_deref()
        .is_some_and(|s| s.layers().any(|l| l.provider.is_some()))
}

/// What this version of trellis cannot run yet, and why. The planner skips it; `trellis check`
/// warns about it.
pub mod not_runnable {
    use super::*;

    /// Why an agent cannot run at all (its protocol or its kind of endpoint is not
    /// implemented yet).
    pub fn agent(agent: &Agent) -> Option<String> {
        match registry::module(agent.protocol) {
            Some(_) => None,
            None => Some(format!(
                "this trellis has no module for protocol `{}`",
                agent.protocol.as_str()
            )),
        }
    }

    /// Why a step cannot run: on any agent (`protocol: None`), or on an agent speaking
    /// `protocol` (then only reasons particular to that protocol).
    pub fn step(step: &StepKind, protocol: Option<Protocol>) -> Option<String> {
        match (step, protocol) {
            (StepKind::Simulate { .. }, None) => Some(
                "`simulate` needs the LLM user simulator: add a `provider` and `simulator \
                 provider=\"ID\"` (a lone `provider` is used as the simulator)"
                    .to_string(),
            ),
            (StepKind::Attack(_), None) => Some(
                "`attack` needs an attacker and a judge: add a `provider` (a lone one plays \
                 both), or `attacker=\"ID\"` and a `judge`"
                    .to_string(),
            ),
            (StepKind::User(_) | StepKind::Simulate { .. }, Some(p))
                if p.capabilities().provider_plays_llm =>
            {
                Some(format!(
                    "a `user` (or `simulate`) step on a `{}` agent is answered by a provider \
                     playing its LLM, and none is configured: add a `provider` (a lone one is \
                     used) or `simulator provider=\"ID\"`, or use `call` steps",
                    p.as_str()
                ))
            }
            _ => None,
        }
    }

    /// Why a criterion is recorded as skipped instead of checked.
    pub fn criterion(kind: &CriterionKind) -> Option<&'static str> {
        match kind {
            CriterionKind::Judge { .. } | CriterionKind::Outcome(_) => Some(OUTCOME),
            _ => None,
        }
    }

    /// Why `judge` criteria and scenario `outcome`s are skipped when the project configures
    /// no judge (with one, they are judged: see [`crate::llm::runtime`]).
    pub const OUTCOME: &str = crate::llm::runtime::NO_JUDGE;
}

/// Warnings for `trellis check`: every trajectory that cannot run and every check that will
/// be skipped, at the place written in the suite, with the reason the planner records.
pub fn warnings(project: &Project) -> Vec<Diagnostic> {
    use trellis_dsl::diagnostics::Kind;
    let files = &project.files;
    let setup = crate::llm::LlmSetup::from_project(project);
    let judged = setup.has_judge();
    let simulated = setup.has_simulator();
    let mut out = Vec::new();
    let warn = |span: Span, message: String, label: &str, help: &str| {
        Diagnostic::at_span(Kind::NotRunnable, message, files, span, label).with_help(help)
    };
    let mut agents_warned: BTreeSet<String> = BTreeSet::new();
    // The instances of one `for-each` / `matrix` scenario share its steps, checks and agents,
    // so they share its warnings: the first instance's are said once for all of them, naming
    // how many there are and the first few (10,000 rows made 10,000 identical warnings).
    let mut instances: HashMap<(&str, Span), Vec<&str>> = HashMap::new();
    for (_, sc) in project.scenarios() {
        if let Some(i) = &sc.instance {
            instances
                .entry((i.base.as_str(), sc.id.span))
                .or_default()
                .push(sc.id.value.as_str());
        }
    }
    for (_, sc) in project.scenarios() {
        let group = sc.instance.as_ref().and_then(|i| {
            instances
                .get(&(i.base.as_str(), sc.id.span))
                .map(|ids| (i.base.as_str(), ids))
        });
        if group.is_some_and(|(_, ids)| ids.first() != Some(&sc.id.value.as_str())) {
            continue;
        }
        let from = out.len();
        scenario_warnings(
            project,
            sc,
            judged,
            simulated,
            &mut agents_warned,
            &warn,
            &mut out,
        );
        if let Some((base, ids)) = group {
            let named = format!("`{}`", sc.id.value);
            let all = format!("`{base}` ({})", instances_shown(ids));
            for d in &mut out[from..] {
                d.message = d.message.replacen(&named, &all, 1);
            }
        }
    }
    out.extend(
        project
            .agents
            .iter()
            .filter_map(|a| spans_unmatchable(a, &warn)),
    );
    out
}

/// `spans #true` on an agent reached over stdio, TCP or a Unix socket: newline-delimited
/// JSON carries no `traceparent` (docs/opentelemetry.md), so its spans can never be matched
/// to its turns, and each turn would wait out `--spans-wait` for them.
fn spans_unmatchable(
    agent: &Agent,
    warn: &impl Fn(Span, String, &str, &str) -> Diagnostic,
) -> Option<Diagnostic> {
    if !agent.spans {
        return None;
    }
    let over = match &agent.endpoint {
        Endpoint::Command(_) => "its process's stdin and stdout",
        Endpoint::Socket(_) => "its socket",
        Endpoint::Builtin(_) => match agent
            .settings
            .setting("transport")
            .and_then(|t| t.value.value.as_str())
        {
            Some("process") => "its process's stdin and stdout",
            Some("tcp" | "unix") => "its socket",
            _ => return None,
        },
        _ => return None,
    };
    Some(warn(
        agent.id.span,
        format!(
            "agent `{}` has `spans #true`, but no `traceparent` reaches it over {over}: \
             its spans cannot be matched to its turns",
            agent.id.value
        ),
        "its spans cannot be collected",
        "reach it over HTTP (`url=`), where each request carries its turn's `traceparent`, \
         or remove `spans #true`",
    ))
}

/// A scenario's instances as warnings name them: how many, and the first few ids.
fn instances_shown(ids: &[&str]) -> String {
    const SHOWN: usize = 3;
    let first: Vec<&str> = ids.iter().take(SHOWN).copied().collect();
    match ids.len() {
        1 => format!("its 1 instance: {}", first[0]),
        n if n <= SHOWN => format!("all {n} instances: {}", first.join(", ")),
        n => format!("all {n} instances: {}, …", first.join(", ")),
    }
}

/// What `check` says of one scenario (every trajectory and check that will be skipped).
#[allow(clippy::too_many_arguments)]
fn scenario_warnings(
    project: &Project,
    sc: &Scenario,
    judged: bool,
    simulated: bool,
    agents_warned: &mut BTreeSet<String>,
    warn: &impl Fn(Span, String, &str, &str) -> Diagnostic,
    out: &mut Vec<Diagnostic>,
) {
    {
        let agents = project.scenario_agents(sc);
        for agent in &agents {
            if let Some(why) = not_runnable::agent(agent)
                && agents_warned.insert(agent.id.value.clone())
            {
                out.push(warn(
                    agent.id.span,
                    format!(
                        "agent `{}` cannot run yet: its trajectories will be skipped",
                        agent.id.value
                    ),
                    "not runnable yet",
                    &why,
                ));
            }
        }
        let mut user_warned = false;
        walk_steps(&sc.steps, &mut |step| {
            if let Some(why) = not_runnable::step(&step.kind, None)
                && !matches!(&step.kind, StepKind::Simulate { simulator: own, .. } if simulated || names_provider(own))
                && !matches!(&step.kind, StepKind::Attack(a) if simulated || a.attacker.is_some())
            {
                out.push(warn(
                    step.span,
                    format!(
                        "scenario `{}`: trajectories through this step will be skipped",
                        sc.id.value
                    ),
                    "cannot run yet",
                    &why,
                ));
            }
            for agent in &agents {
                if let Some(why) = not_runnable::step(&step.kind, Some(agent.protocol))
                    && !((simulated || agent.provider.is_some())
                        && agent.protocol.capabilities().provider_plays_llm)
                    && !user_warned
                {
                    user_warned = true;
                    out.push(warn(
                        step.span,
                        format!(
                            "scenario `{}`: trajectories through this step will be skipped on \
                             agent `{}`",
                            sc.id.value, agent.id.value
                        ),
                        "cannot run yet on this agent",
                        &why,
                    ));
                }
            }
            if let StepKind::Expect(criteria) = &step.kind {
                for c in criteria {
                    check_warnings(c, sc, &agents, judged, &warn, out);
                }
            }
            // A human's answer to an agent that never waits for one is never given.
            if let StepKind::Hitl { .. } = &step.kind
                && let Some(agent) = agents.iter().find(|a| !a.protocol.capabilities().pauses)
            {
                out.push(warn(
                    step.span,
                    format!(
                        "scenario `{}`: this `hitl` step has no effect on agent `{}`",
                        sc.id.value, agent.id.value
                    ),
                    "never answered",
                    &format!(
                        "a `{}` agent never pauses for a human: only `multiagent` agents \
                         (`hitl_pause`) do; remove the step, or run the scenario against \
                         one",
                        agent.protocol.as_str()
                    ),
                ));
            }
        });
        for c in sc.criteria.iter().chain(&sc.expect_tools) {
            check_warnings(c, sc, &agents, judged, &warn, out);
        }
        for outcome in sc.outcomes.iter().filter(|_| !judged) {
            out.push(warn(
                outcome.span,
                skipped_check(sc, "outcome"),
                "will be skipped",
                not_runnable::OUTCOME,
            ));
        }
    }
}

/// What `check` says of one criterion, added to `out`: skipped until a feature lands, or
/// nothing to time.
fn check_warnings(
    c: &Criterion,
    sc: &Scenario,
    agents: &[&Agent],
    judged: bool,
    warn: &impl Fn(Span, String, &str, &str) -> Diagnostic,
    out: &mut Vec<Diagnostic>,
) {
    let judged = judged && crate::llm::LlmRuntime::is_judged(&c.kind);
    if let Some(why) = not_runnable::criterion(&c.kind).filter(|_| !judged) {
        out.push(warn(
            c.span,
            skipped_check(sc, c.kind.name()),
            "will be skipped",
            why,
        ));
    }
    // Pushed one by one: a chain of the four optional diagnostics was a kilobyte moved
    // for every criterion of the project, most of them with nothing to say.
    out.extend(unmeasured_ttft(c, sc, agents, warn));
    out.extend(without_sandbox(c, sc, agents, warn));
    out.extend(without_spans(c, sc, agents, warn));
}

/// A check on spans against an agent whose spans are not collected for its turns: it will
/// be recorded as skipped there.
fn without_spans(
    c: &Criterion,
    sc: &Scenario,
    agents: &[&Agent],
    warn: &impl Fn(Span, String, &str, &str) -> Diagnostic,
) -> Option<Diagnostic> {
    if !matches!(
        c.kind,
        CriterionKind::Span { .. }
            | CriterionKind::SpanCount { .. }
            | CriterionKind::SpansInOrder(_)
            | CriterionKind::SpanDuration { .. }
    ) {
        return None;
    }
    let agent = agents.iter().find(|a| !a.spans)?;
    Some(warn(
        c.span,
        format!(
            "scenario `{}`: this `{}` check will be skipped on agent `{}`",
            sc.id.value,
            c.kind.name(),
            agent.id.value
        ),
        "the agent's spans are not collected",
        "add `spans #true` to the agent, and point its OTEL_EXPORTER_OTLP_ENDPOINT at the \
         run's receiver (`trellis run` prints its address)",
    ))
}

/// A `state` or `violations` check on an agent whose tool calls the engine does not answer:
/// there is no sandbox to look at, so the check will be recorded as skipped there.
fn without_sandbox(
    c: &Criterion,
    sc: &Scenario,
    agents: &[&Agent],
    warn: &impl Fn(Span, String, &str, &str) -> Diagnostic,
) -> Option<Diagnostic> {
    if !matches!(
        c.kind,
        CriterionKind::State { .. } | CriterionKind::Violations { .. }
    ) {
        return None;
    }
    let agent = agents
        .iter()
        .find(|a| !a.protocol.capabilities().engine_runs_tools)?;
    Some(warn(
        c.span,
        format!(
            "scenario `{}`: this `{}` check will be skipped on agent `{}`",
            sc.id.value,
            c.kind.name(),
            agent.id.value
        ),
        "no sandbox on this agent",
        crate::sandbox::NO_SANDBOX,
    ))
}

/// A `ttft` check against an agent that answers with one body: there is no first token to
/// time, so the check will be recorded as skipped.
fn unmeasured_ttft(
    c: &Criterion,
    sc: &Scenario,
    agents: &[&Agent],
    warn: &impl Fn(Span, String, &str, &str) -> Diagnostic,
) -> Option<Diagnostic> {
    if !matches!(c.kind, CriterionKind::Ttft { .. }) {
        return None;
    }
    // The agent's protocol module says whether it answers with one body.
    let (agent, why) = agents.iter().find_map(|a| {
        registry::module(a.protocol)
            .and_then(|m| m.untimed(a))
            .map(|why| (a, why))
    })?;
    Some(warn(
        c.span,
        format!(
            "scenario `{}`: this `ttft` check will be skipped on agent `{}`",
            sc.id.value, agent.id.value
        ),
        "nothing to time",
        &why,
    ))
}

fn skipped_check(sc: &Scenario, kind: &str) -> String {
    format!(
        "scenario `{}`: this `{kind}` check will be skipped",
        sc.id.value
    )
}

/// The settings of an agent whose protocol has no module (never planned to run: see
/// [`not_runnable::agent`]).
#[derive(Debug)]
struct NoModule;

impl PlannedSettings for NoModule {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
