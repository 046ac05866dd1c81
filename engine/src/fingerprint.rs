//! Fingerprints: stable hashes of what a scenario means, so `trellis watch` can tell what an
//! edit changed and rerun only that, and `trellis list --verbose` can show why.
//!
//! Each fingerprint has two halves. The *conversation* half covers what the agent sees or
//! what shapes its answers: the steps that call the agent (`user`, `call`, `hitl`,
//! `simulate`), `capture`s (their values feed later messages), and the scenario's setup: its
//! agents, persona, the project's and its own tools and providers, the simulator, `user-context`,
//! `initial-state`, `first-turn`, `max-turns`, `timeout` (the *setup*), and `repeat`. The *checks* half covers
//! what only judges the answers: `expect`s (with the position of the turn they check),
//! `criteria`, `expect-tool`, `outcome`s and the judges they use. A change to the checks
//! half alone can be re-checked against recorded transcripts without calling the agent.
//! Under `stop-on-failure` an `expect` decides which steps are sent: it is in both halves.
//!
//! Hashes are taken over the resolved model, never the source text: spans, comments,
//! formatting and where a definition lives (which included file) do not count. An
//! execution node's fingerprint chains its parent's, so editing one branch changes the
//! fingerprints of that branch's nodes and of the nodes below it, and nothing else.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::sync::Arc;

use trellis_dsl::graph::{self, TrajectoryGraph};
use trellis_dsl::{
    Agent, CaptureSource, Criterion, CriterionKind, Persona, PersonaRef, Project, Scenario,
    StepKind,
};

/// A 64-bit digest (the first bytes of a BLAKE3 hash), shown as 12 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Digest(pub u64);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // 48 bits are plenty to tell versions of one scenario apart on screen.
        write!(f, "{:012x}", self.0 >> 16)
    }
}

/// The two halves of a fingerprint; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Fingerprint {
    pub conversation: Digest,
    pub checks: Digest,
}

impl Fingerprint {
    /// What differs between two fingerprints of the same thing.
    pub fn change_from(&self, before: &Fingerprint) -> Change {
        match (
            self.conversation != before.conversation,
            self.checks != before.checks,
        ) {
            (true, _) => Change::Conversation,
            (false, true) => Change::Checks,
            (false, false) => Change::None,
        }
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conv {} checks {}", self.conversation, self.checks)
    }
}

/// How a fingerprint changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    None,
    /// Only the checks: re-check recorded transcripts.
    Checks,
    /// What the agent sees: call it again from the first changed step.
    Conversation,
}

/// The fingerprints of one scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioFingerprints {
    /// The setup alone (agents, persona, tools, providers, simulator, scenario settings):
    /// the part of the conversation half that is neither a step nor `repeat`.
    pub setup: Digest,
    /// The setup without the tools' mock answers, state changes and policies (what the
    /// agent is never told): `trellis watch` keeps a scenario's recorded turns under it, so
    /// that an edited mock makes only the turns that called that tool talk afresh
    /// (`engine/src/execute/reuse.rs`). Equal to `setup` when not asked for ([`stamp`]).
    pub salt: Digest,
    /// The whole scenario: setup and every step (conversation), every check (checks).
    pub scenario: Fingerprint,
    /// Each execution node by id (`start`, `accepts`, `accepts/then`): its own steps
    /// chained to its parent's fingerprint.
    pub nodes: BTreeMap<Arc<str>, Fingerprint>,
    /// `scenario` and `nodes` with the `salt` in place of the `setup`: what changed
    /// besides what tools answer (`trellis watch` reruns a scenario whose only change is
    /// an edited mock none of its turns called as unchanged). `scenario` and no nodes when
    /// not asked for ([`stamp`]).
    pub salted_scenario: Fingerprint,
    pub salted_nodes: BTreeMap<Arc<str>, Fingerprint>,
}

/// Records in `plan` what each planned trajectory means: the fingerprint of its last
/// execution node, which chains the scenario's setup and every node above it, so it
/// changes exactly when something the trajectory sends or checks changes (`repeat` and
/// other scenarios do not count). The run journal carries it (`ScenarioInfo::fingerprints`),
/// so `trellis run --resume` can tell which finished trajectories an edit invalidated.
pub fn stamp(project: &Project, plan: &mut crate::plan::Plan) {
    let shared = Fingerprinter::of(project);
    in_parallel(&mut plan.scenarios, |scenarios| {
        for planned in scenarios {
            // The trajectories' fingerprints need no salt.
            let prints = scenario_with(&shared, &planned.scenario, false);
            for trajectory in &mut planned.trajectories {
                trajectory.fingerprint = trajectory
                    .nodes
                    .last()
                    .and_then(|leaf| prints.nodes.get(leaf))
                    .map(|f| Arc::from(format!("{}:{}", f.conversation, f.checks)));
            }
        }
    });
}

/// Runs `work` over all of `items`, a part at a time. A dataset's thousands of instances
/// have fingerprints independent of each other, and nothing else runs yet (a run's start,
/// a watch session's reload), so from [`PARALLEL_FROM`] items the parts are split over the
/// cores.
fn in_parallel<T: Send>(items: &mut [T], work: impl Fn(&mut [T]) + Sync) {
    let threads = if items.len() >= PARALLEL_FROM {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
    } else {
        1
    };
    if threads <= 1 {
        work(items);
        return;
    }
    // Parts taken from a shared list: a thread that cannot start leaves its parts to the
    // others, this one included.
    let chunk = items.len().div_ceil(threads * 4);
    let parts = std::sync::Mutex::new(items.chunks_mut(chunk).collect::<Vec<_>>());
    let take = || {
        loop {
            let part = parts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            match part {
                Some(part) => work(part),
                None => break,
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            let _ = std::thread::Builder::new()
                .name("trellis-fingerprint".into())
                .stack_size(STACK_SIZE)
                .spawn_scoped(scope, take);
        }
        take();
    });
}

/// Scenarios from which [`in_parallel`] uses more than one thread: starting one costs about
/// what fingerprinting a hundred scenarios does.
const PARALLEL_FROM: usize = 1024;

/// At most this many threads for [`in_parallel`].
const MAX_THREADS: usize = 4;

/// The stack of [`in_parallel`]'s threads: a fingerprint writes the model's `Debug` text, which
/// recurses once per level of a nested value (a dataset row, a `user-context`), and the
/// loader accepts nesting as deep as the command thread's stack (src/main.rs) allows.
/// Reserved, not committed: pages are only used as deep values need them.
const STACK_SIZE: usize = 512 * 1024 * 1024;

/// `suite/scenario` → its fingerprints, for every scenario of the project.
pub fn project(project: &Project) -> BTreeMap<String, ScenarioFingerprints> {
    let shared = Fingerprinter::of(project);
    let mut prints: Vec<_> = project
        .scenarios()
        .map(|(suite, sc)| (suite, sc, None))
        .collect();
    in_parallel(&mut prints, |part| {
        for (_, sc, prints) in part {
            *prints = Some(shared.scenario(sc));
        }
    });
    prints
        .into_iter()
        .filter_map(|(suite, sc, prints)| {
            Some((format!("{}/{}", suite.name, sc.id.value), prints?))
        })
        .collect()
}

/// The fingerprints of `sc`, resolved against `project` (its agents, persona, …); for
/// many scenarios of one project, [`Fingerprinter`] writes what they share once.
pub fn scenario(project: &Project, sc: &Scenario) -> ScenarioFingerprints {
    Fingerprinter::of(project).scenario(sc)
}

/// The canonical texts of what a project's scenarios share (its agents, personas, tools,
/// providers, simulator and judges), each written once. Written again for every scenario,
/// they were most of the work of fingerprinting a dataset's instances: 60,000 instructions
/// an instance, 14% of a 5,000-row run's instructions, for the same few agents and tools.
pub struct Fingerprinter<'p> {
    project: &'p Project,
    /// By the address of the project's agent: `Project::scenario_agents` hands out
    /// references into `project.agents`.
    agents: HashMap<usize, String>,
    /// The hash of each agent's text so far, by the same addresses: a setup text starts
    /// with its first agent's (most of it, for a one-turn scenario), which is hashed once.
    agent_hashes: HashMap<usize, blake3::Hasher>,
    personas: HashMap<usize, String>,
    /// The project's tools, providers and simulator, as the setup half writes them.
    sandbox: String,
    /// The same with only what the agent is told of each tool (its name, description and
    /// parameters), for [`ScenarioFingerprints::salt`].
    declared_sandbox: String,
    /// The project's judges and providers, as the checks half writes them.
    judges: String,
}

impl<'p> Fingerprinter<'p> {
    pub fn of(project: &'p Project) -> Self {
        let mut sandbox = String::new();
        let mut declared_sandbox = String::new();
        // Every scenario's sandbox holds the project's tools; providers serve the simulator.
        for tool in &project.tools {
            sandbox.push_str(&canonical(tool));
            write_declaration(&mut declared_sandbox, tool);
        }
        let mut rest = String::new();
        for provider in &project.providers {
            rest.push_str(&canonical(provider));
        }
        if let Some(simulator) = &project.simulator {
            rest.push_str(&canonical(simulator));
        }
        sandbox.push_str(&rest);
        declared_sandbox.push_str(&rest);
        let mut judges = String::new();
        // Judges decide `judge` criteria and outcomes; their providers serve them.
        for judge in &project.judges {
            judges.push_str(&canonical(judge));
        }
        for provider in &project.providers {
            judges.push_str(&canonical(provider));
        }
        let agents: HashMap<usize, String> = project
            .agents
            .iter()
            .map(|a| (address(a), canonical(a)))
            .collect();
        let agent_hashes = agents
            .iter()
            .map(|(&at, text)| {
                let mut hasher = blake3::Hasher::new();
                hasher.update(text.as_bytes());
                (at, hasher)
            })
            .collect();
        Fingerprinter {
            project,
            agents,
            agent_hashes,
            personas: project
                .personas
                .iter()
                .map(|p| (address(p), canonical(p)))
                .collect(),
            sandbox,
            declared_sandbox,
            judges,
        }
    }

    /// The fingerprints of `sc`, one of the project's scenarios.
    pub fn scenario(&self, sc: &Scenario) -> ScenarioFingerprints {
        scenario_with(self, sc, true)
    }

    fn agent(&self, agent: &Agent) -> Cow<'_, str> {
        match self.agents.get(&address(agent)) {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(canonical(agent)),
        }
    }

    fn persona(&self, persona: &Persona) -> Cow<'_, str> {
        match self.personas.get(&address(persona)) {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(canonical(persona)),
        }
    }
}

/// Where `value` lives: the cache's key for the project's own agents and personas.
fn address<T>(value: &T) -> usize {
    std::ptr::from_ref(value).addr()
}

fn scenario_with(shared: &Fingerprinter<'_>, sc: &Scenario, salted: bool) -> ScenarioFingerprints {
    // Every text is written into these two and hashed: a dataset's thousands of instances
    // were mostly strings made, grown and copied for one hash each.
    let mut conversation = String::new();
    let mut checks = String::new();
    let setup = setup_digest(shared, sc, Tools::Whole, &mut conversation);
    let salt = if salted {
        conversation.clear();
        setup_digest(shared, sc, Tools::Declared, &mut conversation)
    } else {
        setup
    };
    checks_setup_text(shared, sc, &mut checks);
    let checks_setup = digest(&checks);

    let tg = TrajectoryGraph::build(sc);
    let mut nodes: BTreeMap<Arc<str>, Fingerprint> = BTreeMap::new();
    // The same chained from the salt, when asked for.
    let mut salted_nodes: BTreeMap<Arc<str>, Fingerprint> = BTreeMap::new();
    for trajectory in &tg.trajectories {
        let labels: Vec<&str> = trajectory
            .segments
            .iter()
            .map(|&s| tg.segment(s).label.as_str())
            .collect();
        let ids = graph::node_ids(labels);
        let mut parent = Fingerprint {
            conversation: setup,
            checks: checks_setup,
        };
        let mut salted_parent = Fingerprint {
            conversation: salt,
            checks: checks_setup,
        };
        for (&segment, id) in trajectory.segments.iter().zip(&ids) {
            let id: Arc<str> = Arc::from(id.as_str());
            let fingerprint = match nodes.get(&id) {
                Some(&known) => {
                    if salted && let Some(&known) = salted_nodes.get(&id) {
                        salted_parent = known;
                    }
                    known
                }
                None => {
                    conversation.clear();
                    checks.clear();
                    steps_text(
                        &tg.segment(segment).steps,
                        sc.stop_on_failure,
                        &mut conversation,
                        &mut checks,
                    );
                    let fingerprint = Fingerprint {
                        conversation: chain(parent.conversation, &conversation),
                        checks: chain(parent.checks, &checks),
                    };
                    if salted {
                        salted_parent = Fingerprint {
                            conversation: chain(salted_parent.conversation, &conversation),
                            checks: fingerprint.checks,
                        };
                        salted_nodes.insert(id.clone(), salted_parent);
                    }
                    nodes.insert(id, fingerprint);
                    fingerprint
                }
            };
            parent = fingerprint;
        }
    }
    // The scenario as a whole: every node, in id order (the tree's shape is in the ids).
    // `repeat` counts here, not in the setup: more repetitions add runs and leave the
    // recorded ones valid.
    conversation.clear();
    checks.clear();
    let _ = write!(conversation, "repeat {};", sc.repeat);
    for (id, fingerprint) in &nodes {
        let _ = write!(conversation, "{id}={};", fingerprint.conversation.0);
        let _ = write!(checks, "{id}={};", fingerprint.checks.0);
    }
    let scenario = Fingerprint {
        conversation: chain(setup, &conversation),
        checks: chain(checks_setup, &checks),
    };
    let salted_scenario = if salted {
        conversation.clear();
        let _ = write!(conversation, "repeat {};", sc.repeat);
        for (id, fingerprint) in &salted_nodes {
            let _ = write!(conversation, "{id}={};", fingerprint.conversation.0);
        }
        Fingerprint {
            conversation: chain(salt, &conversation),
            checks: scenario.checks,
        }
    } else {
        scenario
    };
    ScenarioFingerprints {
        setup,
        salt,
        scenario,
        nodes,
        salted_scenario,
        salted_nodes,
    }
}

/// How much of each tool a setup text holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tools {
    /// All of it ([`ScenarioFingerprints::setup`]).
    Whole,
    /// What the agent is told of it ([`ScenarioFingerprints::salt`]).
    Declared,
}

/// A tool as the agent is told of it: its name, description and parameters.
fn write_declaration(text: &mut String, tool: &trellis_dsl::Tool) {
    write_canonical(text, &(&tool.name.value, &tool.description, &tool.params));
}

/// The digest of what shapes the agent's answers besides the steps, with `text` to write
/// it in.
fn setup_digest(
    shared: &Fingerprinter<'_>,
    sc: &Scenario,
    tools: Tools,
    text: &mut String,
) -> Digest {
    let agents = shared.project.scenario_agents(sc);
    // The text starts with the first agent's, already hashed.
    let (mut hasher, rest) = match agents.split_first() {
        Some((first, rest)) => match shared.agent_hashes.get(&address(*first)) {
            Some(hashed) => (hashed.clone(), rest),
            None => (blake3::Hasher::new(), &agents[..]),
        },
        None => (blake3::Hasher::new(), &agents[..]),
    };
    setup_text(shared, sc, rest, tools, text);
    hasher.update(text.as_bytes());
    digest_of(hasher.finalize())
}

/// What shapes the agent's answers besides the steps, from `agents` (the scenario's, or
/// those of them not yet hashed) on, written to `text`.
fn setup_text(
    shared: &Fingerprinter<'_>,
    sc: &Scenario,
    agents: &[&Agent],
    tools: Tools,
    text: &mut String,
) {
    let project = shared.project;
    for agent in agents {
        text.push_str(&shared.agent(agent));
    }
    match &sc.persona {
        Some(PersonaRef::Named(id)) => {
            if let Some(persona) = project.persona(&id.value) {
                text.push_str(&shared.persona(persona));
            }
        }
        Some(PersonaRef::Inline(persona)) => write_canonical(text, persona),
        None => {}
    }
    match tools {
        Tools::Whole => {
            text.push_str(&shared.sandbox);
            write_canonical(
                text,
                &(
                    &sc.user_context,
                    &sc.initial_state,
                    &sc.undeclared_tools,
                    &sc.tools,
                    &sc.max_turns,
                    &sc.agent_branches,
                    &sc.timeout,
                    &sc.first_turn,
                ),
            );
        }
        Tools::Declared => {
            text.push_str(&shared.declared_sandbox);
            for tool in &sc.tools {
                write_declaration(text, tool);
            }
            write_canonical(
                text,
                &(
                    &sc.user_context,
                    &sc.initial_state,
                    &sc.undeclared_tools,
                    &sc.max_turns,
                    &sc.agent_branches,
                    &sc.timeout,
                    &sc.first_turn,
                ),
            );
        }
    }
    // Written only when set, so that the fingerprints of runs from before it are the same.
    if sc.stop_on_failure {
        text.push_str("stop-on-failure;");
    }
    // Sent with every Connexity request: another id is another conversation.
    if let Some(id) = &sc.test_case_id {
        text.push_str("test-case-id ");
        write_canonical(text, &id.value);
    }
    // A dataset row or matrix value changes what the steps render, so an edited row reruns
    // that row's instance (and only it).
    write_canonical(text, &sc.instance);
    write_canonical(text, &sc.history.as_ref().map(|h| &h.messages));
}

/// What judges the answers besides the steps' `expect`s, written to `text`.
fn checks_setup_text(shared: &Fingerprinter<'_>, sc: &Scenario, text: &mut String) {
    for c in sc.criteria.iter().chain(&sc.expect_tools) {
        criterion_text(c, text);
        text.push(';');
    }
    for outcome in &sc.outcomes {
        write_canonical(text, &outcome.value);
    }
    // The text alone, written as before it kept its span: earlier runs' fingerprints hold.
    write_canonical(text, &sc.criteria_override.as_ref().map(|s| &s.value));
    text.push_str(&shared.judges);
}

/// The conversation and checks text of a segment's steps, written to `conversation` and
/// `checks`. An `expect` is tied to the number of agent-calling steps before it in the
/// segment: moving it to another turn is a change of what it checks. Under
/// `stop-on-failure` (`expects_steer`) an `expect` decides whether the steps after it are
/// sent, so it is part of the conversation half too.
fn steps_text(
    steps: &[trellis_dsl::Step],
    expects_steer: bool,
    conversation: &mut String,
    checks: &mut String,
) {
    let mut calls = 0usize;
    // `write!` to a `String` cannot fail.
    for step in steps {
        match &step.kind {
            StepKind::User(t) => {
                calls += 1;
                let _ = write!(conversation, "user {:?};", t.source);
            }
            StepKind::Call { function, input } => {
                calls += 1;
                let _ = write!(conversation, "call {function:?} {:?};", input.source);
            }
            StepKind::Simulate {
                turns,
                simulator,
                persona,
            } => {
                calls += 1;
                // Every layer: provider, model, temperature, instructions and prompts.
                let by = simulator.as_deref().map(canonical);
                let playing = persona.as_deref().map(|p| match p {
                    trellis_dsl::PersonaRef::Named(id) => format!("{:?}", id.value),
                    trellis_dsl::PersonaRef::Inline(p) => {
                        format!("{:?}", (&p.kind, &p.description, &p.instructions))
                    }
                });
                let _ = write!(conversation, "simulate {turns:?} {by:?} {playing:?};");
            }
            StepKind::Attack(a) => {
                calls += 1;
                let attacker = a.attacker.as_ref().map(|s| &s.value);
                let _ = write!(
                    conversation,
                    "attack {:?};",
                    (&a.goal, &a.judge, a.width, a.keep, a.depth, attacker)
                );
            }
            StepKind::Hitl { approve, message } => {
                calls += 1;
                let message = message.as_ref().map(|m| &m.source);
                let _ = write!(conversation, "hitl {approve} {message:?};");
            }
            StepKind::Capture { name, source } => {
                let _ = match source {
                    CaptureSource::Regex(re) => {
                        write!(conversation, "capture {name:?} regex {:?};", re.as_str())
                    }
                    CaptureSource::JsonPath { source, .. } => {
                        write!(conversation, "capture {name:?} json-path {source:?};")
                    }
                };
            }
            StepKind::Expect(criteria) => {
                let start = checks.len();
                let _ = write!(checks, "@{calls}:");
                for c in criteria {
                    criterion_text(c, checks);
                    checks.push(';');
                }
                if expects_steer {
                    conversation.push_str(&checks[start..]);
                }
            }
            // The graph turned forks into edges; a segment holds none.
            StepKind::Fork(_) => {}
        }
    }
}

/// A criterion by meaning, written to `text`: its kind and values, not its text as written.
fn criterion_text(c: &Criterion, text: &mut String) {
    match &c.kind {
        // The judge is referred to by id; the judge's definition is in the checks setup.
        CriterionKind::Judge {
            criterion,
            threshold,
            judge,
            rubric,
        } => {
            let _ = write!(
                text,
                "judge {criterion:?} {threshold:?} {:?} {rubric:?}",
                judge.as_ref().map(|j| &j.value)
            );
        }
        kind => write_canonical(text, kind),
    }
}

/// The `Debug` form of a model value with every source span written as `_`: the model's
/// `Debug` covers every field, so nothing that changes behaviour is left out, and spans
/// (which move with formatting and comments) are the only part that is not meaning.
fn canonical<T: fmt::Debug>(value: &T) -> String {
    let mut text = String::new();
    write_canonical(&mut text, value);
    text
}

/// [`canonical`], written at the end of `text`.
fn write_canonical<T: fmt::Debug>(text: &mut String, value: &T) {
    trellis_dsl::debug_without_spans(|| {
        let _ = write!(text, "{value:?}");
    });
}

fn digest(text: &str) -> Digest {
    digest_of(blake3::hash(text.as_bytes()))
}

/// The digest of `parent` and `text`: the hash of `"{parent}|{text}"`, without writing
/// that text out again.
fn chain(parent: Digest, text: &str) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(itoa::Buffer::new().format(parent.0).as_bytes());
    hasher.update(b"|");
    hasher.update(text.as_bytes());
    digest_of(hasher.finalize())
}

fn digest_of(hash: blake3::Hash) -> Digest {
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    Digest(u64::from_le_bytes(first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn load(dir: &Path, files: &[(&str, &str)]) -> Project {
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        trellis_dsl::load(&[dir.join(files[0].0)], &crate::protocol::registry::specs()).unwrap()
    }

    fn prints(files: &[(&str, &str)]) -> ScenarioFingerprints {
        let dir = tempfile::tempdir().unwrap();
        let project = load(dir.path(), files);
        let (_, sc) = project.scenarios().next().unwrap();
        scenario(&project, sc)
    }

    const AGENT: &str = r#"agent "bot" protocol="connexity" builtin="booking""#;

    fn suite(first: &str, left: &str, criterion: &str) -> String {
        format!(
            r#"{AGENT}
scenario "s" {{
    user "{first}"
    expect reply contains="a"
    branch "left" {{
        user "{left}"
    }}
    branch "right" {{
        user "going right"
        branch "deep" {{
            user "deeper"
        }}
        branch "shallow" {{
            user "shallower"
        }}
    }}
    criteria {{
        {criterion}
    }}
}}
"#
        )
    }

    /// Fingerprints are compared across versions (`--resume` of a run an older binary
    /// started): the same suite must keep the same digests. These are what the binary
    /// before `Fingerprinter` wrote for it; a change here invalidates every finished run.
    #[test]
    fn digests_stay_what_earlier_versions_wrote() {
        let text = format!(
            r##"provider "local" kind="openai" base-url="http://127.0.0.1:8080/v1" model="qwen2.5-1.5b-instruct"
{AGENT}
simulator provider="local"
judge "strict" provider="local" rubric="connexity"
persona "ann" type="polite" description="Ann"
tool "get_order" {{
    param "order_id" required=#true
    mock returns=#"{{"status": "not_found"}}"#
}}
scenario "s" {{
    persona "ann"
    user "hi"
    expect reply contains="a"
    branch "left" {{
        user "go left"
    }}
    branch "right" {{
        user "go right"
        expect judge "polite" judge="strict"
    }}
}}
"##
        );
        let p = prints(&[("g.kdl", &text)]);
        assert_eq!(
            p.scenario.to_string(),
            "conv 310d92f26516 checks 37013b19120e"
        );
        assert_eq!(p.setup.to_string(), "1d60d9ed50a2");
        let nodes: Vec<String> = p.nodes.iter().map(|(id, f)| format!("{id}: {f}")).collect();
        assert_eq!(
            nodes,
            [
                "left: conv b43dc686c33a checks 20217f728f83",
                "right: conv 91296bcea2ff checks 9d2d630c10a0",
                "start: conv 71fbaa3eb413 checks 6514c8731c86",
            ]
        );
    }

    /// A plan of a dataset's many instances is stamped on several threads: every
    /// trajectory gets what fingerprinting its scenario alone gives.
    #[test]
    fn many_instances_are_stamped_as_one_at_a_time_would() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = String::from("id,q\n");
        for i in 0..(PARALLEL_FROM + 77) {
            rows.push_str(&format!("r{i},question {i}\n"));
        }
        std::fs::write(dir.path().join("rows.csv"), rows).unwrap();
        let suite = format!(
            "{AGENT}\ndataset \"d\" path=\"rows.csv\"\nscenario \"s\" for-each=\"d\" {{\n    \
             row-id \"{{{{ row.id }}}}\"\n    user \"{{{{ row.q }}}}\"\n    \
             expect no-error\n    branch \"a\" {{\n        user \"more\"\n    }}\n    \
             branch \"b\" {{\n        user \"else\"\n    }}\n}}\n"
        );
        let project = load(dir.path(), &[("s.kdl", &suite)]);
        let mut plan = crate::plan::Plan::build_with_env(
            &project,
            &crate::plan::Selection::default(),
            Arc::new(Default::default()),
        )
        .unwrap();
        assert_eq!(plan.scenarios.len(), PARALLEL_FROM + 77);
        stamp(&project, &mut plan);
        let mut seen = std::collections::HashSet::new();
        for planned in &plan.scenarios {
            let prints = scenario(&project, &planned.scenario);
            for t in &planned.trajectories {
                let leaf = t.nodes.last().unwrap();
                let f = prints.nodes[leaf];
                let want = format!("{}:{}", f.conversation, f.checks);
                assert_eq!(t.fingerprint.as_deref(), Some(want.as_str()), "{}", t.name);
                seen.insert(want);
            }
        }
        // Each instance's row makes its fingerprints its own.
        assert_eq!(seen.len(), 2 * (PARALLEL_FROM + 77));
        // Watch's fingerprints of every scenario, on several threads too.
        let all = super::project(&project);
        assert_eq!(all.len(), PARALLEL_FROM + 77);
        for (suite, sc) in project.scenarios() {
            let key = format!("{}/{}", suite.name, sc.id.value);
            assert_eq!(all[&key], scenario(&project, sc), "{key}");
        }
    }

    /// What fingerprints hash is what they hashed when spans were erased from the derived
    /// `Debug` text with a pattern afterwards: earlier runs' fingerprints hold. The example
    /// suites' whole project covers every protocol, tools, personas, simulated users,
    /// histories and criteria.
    #[test]
    fn canonical_text_is_the_debug_text_with_each_span_erased() {
        let suites = Path::new(env!("CARGO_MANIFEST_DIR")).join("../suites");
        let project = trellis_dsl::load(&[suites], &crate::protocol::registry::specs()).unwrap();
        let span = regex::Regex::new(
            r"Span \{ file: [0-9]+, span: SourceSpan \{ offset: SourceOffset\([0-9]+\), length: [0-9]+ \} \}",
        )
        .unwrap();
        let derived = format!("{:?}", (&project.agents, &project.suites, &project.tools));
        let erased = span.replace_all(&derived, "_");
        assert!(erased.len() < derived.len(), "the suites hold spans");
        let canonical = canonical(&(&project.agents, &project.suites, &project.tools));
        assert_eq!(canonical, erased);
        assert!(!canonical.contains("SourceSpan"));
    }

    #[test]
    fn formatting_and_comments_do_not_count() {
        let plain = prints(&[("a.kdl", &suite("hi", "go left", "turns max=5"))]);
        let messy = suite("hi", "go left", "turns max=5")
            .replace(
                "    user \"hi\"",
                "// a comment\n\n        user   \"hi\"   /* inline */",
            )
            .replace("turns max=5", "turns    max=5 // why");
        let reformatted = prints(&[("a.kdl", &format!("\n\n// header\n{messy}"))]);
        assert_eq!(plain, reformatted);
    }

    #[test]
    fn a_branch_edit_changes_that_branch_and_below_only() {
        let before = prints(&[("a.kdl", &suite("hi", "go left", "turns max=5"))]);
        let after = prints(&[("a.kdl", &suite("hi", "go LEFT", "turns max=5"))]);
        let changed: Vec<&str> = before
            .nodes
            .iter()
            .filter(|(id, fp)| after.nodes.get(*id) != Some(fp))
            .map(|(id, _)| &**id)
            .collect();
        assert_eq!(changed, ["left"]);
        assert_ne!(before.scenario.conversation, after.scenario.conversation);
        assert_eq!(before.scenario.checks, after.scenario.checks);

        let before = prints(&[("a.kdl", &suite("hi", "go left", "turns max=5"))]);
        let right = suite("hi", "go left", "turns max=5").replace("going right", "going on");
        let after = prints(&[("a.kdl", &right)]);
        let changed: Vec<&str> = before
            .nodes
            .iter()
            .filter(|(id, fp)| after.nodes.get(*id) != Some(fp))
            .map(|(id, _)| &**id)
            .collect();
        assert_eq!(changed, ["right", "right/deep", "right/shallow"]);
    }

    #[test]
    fn a_criterion_edit_changes_only_the_checks() {
        let before = prints(&[("a.kdl", &suite("hi", "go left", "turns max=5"))]);
        let after = prints(&[("a.kdl", &suite("hi", "go left", "turns max=6"))]);
        assert_eq!(before.scenario.conversation, after.scenario.conversation);
        assert_ne!(before.scenario.checks, after.scenario.checks);
        assert_eq!(after.scenario.change_from(&before.scenario), Change::Checks);
        for (id, fp) in &before.nodes {
            assert_eq!(fp.conversation, after.nodes[id].conversation, "{id}");
        }
        // An `expect` on a turn is a check too.
        let expect =
            suite("hi", "go left", "turns max=5").replace("contains=\"a\"", "contains=\"b\"");
        let after = prints(&[("a.kdl", &expect)]);
        assert_eq!(after.scenario.change_from(&before.scenario), Change::Checks);
        assert!(
            after
                .nodes
                .iter()
                .all(|(id, fp)| fp.conversation == before.nodes[id].conversation)
        );
    }

    /// Under `stop-on-failure` an `expect` decides what is sent after it: editing one is a
    /// change of the conversation, and setting it is one too.
    #[test]
    fn under_stop_on_failure_an_expect_edit_changes_the_conversation() {
        let stopping = |text: &str| {
            text.replace(
                "    user \"hi\"",
                "    stop-on-failure #true\n    user \"hi\"",
            )
        };
        let plain = prints(&[("a.kdl", &suite("hi", "go left", "turns max=5"))]);
        let before = prints(&[("a.kdl", &stopping(&suite("hi", "go left", "turns max=5")))]);
        assert_eq!(
            before.scenario.change_from(&plain.scenario),
            Change::Conversation
        );
        let expect =
            suite("hi", "go left", "turns max=5").replace("contains=\"a\"", "contains=\"b\"");
        let after = prints(&[("a.kdl", &stopping(&expect))]);
        assert_eq!(
            after.scenario.change_from(&before.scenario),
            Change::Conversation
        );
    }

    #[test]
    fn a_scenario_tool_is_part_of_its_setup() {
        let with = |answer: &str| {
            suite("hi", "go left", "turns max=5").replace(
                "    user \"hi\"\n",
                &format!(
                    "    tool \"lookup\" {{\n        mock returns=\"{answer}\"\n    }}\n    user \"hi\"\n"
                ),
            )
        };
        let before = prints(&[("a.kdl", &with("shipped"))]);
        let after = prints(&[("a.kdl", &with("lost"))]);
        assert_ne!(before.setup, after.setup);
        assert_eq!(
            after.scenario.change_from(&before.scenario),
            Change::Conversation
        );
    }

    #[test]
    fn included_definitions_count_where_they_are_used() {
        let main = format!(
            "include \"agents.kdl\"\n{}",
            suite("hi", "go left", "turns max=5").replace(AGENT, "")
        );
        let before = prints(&[("a.kdl", &main), ("agents.kdl", AGENT)]);
        let moved = prints(&[
            ("a.kdl", &main),
            ("agents.kdl", &format!("// moved down\n\n{AGENT}")),
        ]);
        assert_eq!(before, moved);
        let other = AGENT.replace("builtin=\"booking\"", "url=\"http://127.0.0.1:9/\"");
        let after = prints(&[("a.kdl", &main), ("agents.kdl", &other)]);
        assert_eq!(
            after.scenario.change_from(&before.scenario),
            Change::Conversation
        );
        assert_ne!(before.setup, after.setup);
    }
}
