//! One MultiAgentEval scenario file, any of its three generations, read into what a Trellis
//! scenario holds: `user` steps in the order the harness runs them, the criteria its
//! assertions become, and the sandbox (tools, policies, initial state) its conversation runs
//! in. Every mapping decision is made here, so [`ScenarioFile::render`] only lays the pieces
//! out; whatever has no Trellis counterpart is kept in [`ScenarioFile::unmapped`], which the
//! importer reports and writes into the suite as comments.
//!
//! The generations (docs/wire.md, "MultiAgentEval scenario files"): AES 1.4 files
//! (`workflow.nodes` and
//! `edges`, `expected_outcome` a list of assertions), transitional files (the same shape,
//! `expected_outcome` one typed object), and legacy files (`scenario_id`, `tasks` run in
//! order, `expected_outcome` a sentence).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::{comment, json_kind, kdl_string, literal_template};

/// The harness's default `max_turns` for AES files: its action loop's cap.
pub const HARNESS_MAX_TURNS: u64 = 20;
/// A node's `timeout` when it gives none (seconds).
const DEFAULT_NODE_TIMEOUT: f64 = 30.0;

/// Why a file could not be imported at all (the other files of a directory still are).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("the file is empty: a scenario file is one JSON object")]
    EmptyFile,
    #[error("not JSON: {0} (a scenario file is one JSON object)")]
    NotJson(#[from] serde_json::Error),
    #[error("{0}")]
    NotUtf8(String),
    #[error("the file holds {0}, not a JSON object")]
    NotAnObject(&'static str),
    #[error(
        "not a MultiAgentEval scenario: it has neither `workflow` (AES 1.4 and transitional \
         files) nor `tasks` (legacy files)"
    )]
    UnknownShape,
    #[error("`workflow` is {0}, not an object")]
    WorkflowNotAnObject(&'static str),
    #[error("`{0}` is not a list")]
    NotAList(&'static str),
    #[error("the scenario has no {0}: there is nothing to send the agent")]
    Empty(&'static str),
    #[error("{what} {index} is not an object")]
    NotAnObjectAt { what: &'static str, index: usize },
    #[error("workflow node {index} has no `id`")]
    NodeWithoutId { index: usize },
    #[error("workflow node `{0}` is declared twice")]
    DuplicateNode(String),
    #[error("edge {index} ({from} -> {to}) names a node the workflow does not have: `{missing}`")]
    UnknownNode {
        index: usize,
        from: String,
        to: String,
        missing: String,
    },
    #[error("the workflow's edges form a cycle through {0}")]
    Cycle(String),
    #[error("{what} `{id}` has no `{field}` (or a blank one): there is nothing to send the agent")]
    NoTask {
        what: &'static str,
        id: String,
        field: &'static str,
    },
}

/// Which of the three file generations a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    Aes,
    Transitional,
    Legacy,
}

impl Generation {
    pub fn describe(self) -> &'static str {
        match self {
            Generation::Aes => "AES 1.4 workflow file",
            Generation::Transitional => "transitional workflow file",
            Generation::Legacy => "legacy scenario_id/tasks file",
        }
    }
}

/// `metadata.agent {protocol, endpoint}`: the agent the file was written for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileAgent {
    Url(String),
    Command(String),
    Socket(String),
}

/// A sandbox tool of the scenario: `tools.NAME` and `policies.NAME` merged.
#[derive(Debug, Default)]
struct ToolDecl {
    output: Option<Value>,
    state_changes: Vec<(String, Value)>,
    max_limit: Option<f64>,
}

/// One `user` step (a workflow node or a legacy task) and what is checked after it.
#[derive(Debug)]
struct StepOut {
    id: String,
    title: Option<String>,
    message: String,
    /// KDL criteria, each written as `expect CRITERION`.
    expects: Vec<String>,
    /// What of this node could not be mapped (also in [`ScenarioFile::unmapped`]).
    unmapped: Vec<String>,
    /// Remarks that are not losses (a field the harness ignores too).
    notes: Vec<String>,
}

/// A scenario file, mapped.
#[derive(Debug)]
pub struct ScenarioFile {
    pub generation: Generation,
    /// The scenario's id (no `/`).
    pub id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub tags: Vec<String>,
    /// `metadata.agent`, when it names an endpoint trellis can reach.
    pub agent: Option<FileAgent>,
    /// The action loop's cap the harness would use for this file (`max_turns`), if known.
    pub max_turns: Option<u64>,
    initial_state: Option<Map<String, Value>>,
    tools: BTreeMap<String, ToolDecl>,
    steps: Vec<StepOut>,
    /// Whole-scenario criteria (`criteria { … }`).
    criteria: Vec<String>,
    /// Everything not mapped, one line each, naming the field.
    pub unmapped: Vec<String>,
    /// File-level remarks that are not losses.
    notes: Vec<String>,
    /// `metadata.dataset.path`, relative to the file: a data file beside the scenarios,
    /// which a directory's import passes over instead of failing on it.
    pub dataset_path: Option<String>,
}

/// Where the rendered suite points.
pub struct RenderOptions<'a> {
    /// The suite's name (unique among the suites imported together).
    pub suite: &'a str,
    /// The agent id the scenario runs against.
    pub agent: &'a str,
    /// The input file, for the header comment.
    pub source: &'a str,
    /// KDL written before the suite: `include` of the shared agents file, or the agent node.
    pub preamble: &'a str,
}

impl ScenarioFile {
    /// Reads `text` (a whole file). `fallback_id` (the file's stem) is the scenario id when
    /// the file names none.
    pub fn parse(text: &[u8], fallback_id: &str) -> Result<ScenarioFile, ScenarioError> {
        if let Some(why) = super::not_utf8(text) {
            return Err(ScenarioError::NotUtf8(why));
        }
        let text = super::without_bom(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            return Err(ScenarioError::EmptyFile);
        }
        let value: Value = serde_json::from_slice(text)?;
        let Value::Object(file) = value else {
            return Err(ScenarioError::NotAnObject(json_kind(&value)));
        };
        if file.contains_key("workflow") {
            Reader::default().workflow(&file, fallback_id)
        } else if file.contains_key("tasks") {
            Reader::default().legacy(&file, fallback_id)
        } else {
            Err(ScenarioError::UnknownShape)
        }
    }

    /// The suite: a header comment listing what was not mapped, `preamble`, the `suite`
    /// node and the scenario.
    pub fn render(&self, options: &RenderOptions<'_>) -> String {
        let mut out = String::with_capacity(4096);
        comment(
            &mut out,
            "",
            &format!(
                "Imported by `trellis import multiagent` from {} ({}).",
                options.source,
                self.generation.describe()
            ),
        );
        for note in &self.notes {
            comment(&mut out, "", note);
        }
        let at_steps: usize = self.steps.iter().map(|s| s.unmapped.len()).sum();
        if !self.unmapped.is_empty() {
            comment(&mut out, "", "Not mapped (reported by the import):");
            let file_level = self.unmapped.len().saturating_sub(at_steps);
            for item in self.unmapped.iter().take(file_level) {
                comment(&mut out, "", &format!("- {item}"));
            }
            if at_steps > 0 {
                comment(
                    &mut out,
                    "",
                    &format!("- {at_steps} item(s) of the steps, noted at each step below"),
                );
            }
        }
        out.push('\n');
        out.push_str(options.preamble);
        let _ = writeln!(
            out,
            "suite {} {{\n    description {}\n    tags \"multiagent\" \"imported\"\n}}\n",
            kdl_string(options.suite),
            kdl_string(&format!("MultiAgentEval scenario {}", options.source))
        );
        let _ = writeln!(out, "scenario {} {{", kdl_string(&self.id));
        let _ = writeln!(out, "    agent {}", kdl_string(options.agent));
        if let Some(name) = &self.name {
            let _ = writeln!(out, "    name {}", kdl_string(name));
        }
        if let Some(description) = &self.description {
            let _ = writeln!(out, "    description {}", kdl_string(description));
        }
        if !self.tags.is_empty() {
            out.push_str("    tags");
            for tag in &self.tags {
                out.push(' ');
                out.push_str(&kdl_string(tag));
            }
            out.push('\n');
        }
        // A workflow's failing node stops the scenario: the nodes after it are not sent.
        if self.generation != Generation::Legacy && self.steps.len() > 1 {
            out.push_str("    stop-on-failure #true\n");
        }
        if let Some(state) = &self.initial_state {
            let json = Value::Object(state.clone()).to_string();
            let _ = writeln!(out, "    initial-state json={}", kdl_string(&json));
        }
        for (name, tool) in &self.tools {
            render_tool(&mut out, name, tool);
        }
        for step in &self.steps {
            out.push('\n');
            let heading = match &step.title {
                Some(title) => format!("{}: {title}", step.id),
                None => step.id.clone(),
            };
            comment(&mut out, "    ", &heading);
            for note in &step.notes {
                comment(&mut out, "    ", note);
            }
            let _ = writeln!(
                out,
                "    user {}",
                kdl_string(&literal_template(&step.message))
            );
            let mut written: Vec<&str> = Vec::with_capacity(step.expects.len());
            for expect in &step.expects {
                // `required_tools` and a `tool_calls` assertion often name the same tool.
                if !written.contains(&expect.as_str()) {
                    written.push(expect);
                    let _ = writeln!(out, "    expect {expect}");
                }
            }
            for item in &step.unmapped {
                comment(&mut out, "    ", &format!("not mapped: {item}"));
            }
        }
        if !self.criteria.is_empty() {
            out.push_str("\n    criteria {\n");
            for criterion in &self.criteria {
                let _ = writeln!(out, "        {criterion}");
            }
            out.push_str("    }\n");
        }
        out.push_str("}\n");
        out
    }
}

fn render_tool(out: &mut String, name: &str, tool: &ToolDecl) {
    let _ = write!(out, "    tool {}", kdl_string(name));
    if tool.output.is_none() && tool.state_changes.is_empty() && tool.max_limit.is_none() {
        out.push('\n');
        return;
    }
    out.push_str(" {\n");
    if let Some(output) = &tool.output {
        // JSON text, so that a string output stays a string (`"42"`, not 42).
        let _ = writeln!(
            out,
            "        mock returns={}",
            kdl_string(&output.to_string())
        );
    }
    for (path, value) in &tool.state_changes {
        let _ = writeln!(
            out,
            "        state path={} {}",
            kdl_string(path),
            state_value(value)
        );
    }
    if let Some(limit) = tool.max_limit {
        let _ = writeln!(out, "        policy max-limit={}", kdl_number(limit));
    }
    out.push_str("    }\n");
}

/// `value=…` for a scalar, `json=…` for an object or array.
fn state_value(value: &Value) -> String {
    match kdl_scalar(value) {
        Some(scalar) => format!("value={scalar}"),
        None => format!("json={}", kdl_string(&value.to_string())),
    }
}

/// A JSON scalar as a KDL value (strings quoted, numbers as the `kdl` crate writes them,
/// `#true`, `#null`); `None` for objects and arrays.
fn kdl_scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(kdl_string(s)),
        Value::Bool(b) => Some(kdl::KdlValue::Bool(*b).to_string()),
        Value::Null => Some(kdl::KdlValue::Null.to_string()),
        Value::Number(n) => Some(match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => kdl::KdlValue::Integer(i.into()).to_string(),
            (None, Some(u), _) => kdl::KdlValue::Integer(u.into()).to_string(),
            (None, None, Some(f)) => kdl_number(f),
            (None, None, None) => kdl_string(&n.to_string()),
        }),
        Value::Array(_) | Value::Object(_) => None,
    }
}

fn kdl_number(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        // Whole numbers read back as integers, as the file most likely meant (`50`, `50.0`).
        #[allow(clippy::cast_possible_truncation)]
        let whole = f as i64;
        kdl::KdlValue::Integer(whole.into()).to_string()
    } else {
        kdl::KdlValue::Float(f).to_string()
    }
}

/// A JSON value on one line (compact JSON), for messages and comments.
fn brief(value: &Value) -> String {
    // Whole: what was not mapped is kept in the suite so nothing of the file is lost.
    value.to_string()
}

/// `text` as a scenario id: `/` (which separates suite and scenario) becomes `-`, and so do
/// `[` and `]` (which name an instance); line breaks, tabs and other control characters
/// (which would break every console line and report row naming it) become one space.
fn scenario_id(text: &str) -> Option<String> {
    let id: String = text
        .trim()
        .chars()
        .map(|c| match c {
            '/' | '[' | ']' => '-',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    let id = id.split_whitespace().collect::<Vec<_>>().join(" ");
    (!id.is_empty()).then_some(id)
}

/// The per-file reading state: what was not mapped accumulates here.
#[derive(Default)]
struct Reader {
    unmapped: Vec<String>,
    notes: Vec<String>,
    tags: Vec<String>,
    /// `metadata.dataset.path`, as written (relative to the file).
    dataset_path: Option<String>,
}

/// Top-level keys each generation defines, and whether trellis uses them.
const WORKFLOW_KEYS: &[&str] = &[
    "id",
    "aes_version",
    "metadata",
    "workflow",
    "evaluation",
    "max_turns",
    "initial_state",
    "tools",
    "policies",
    "agent_topology",
    "scenario_id",
    "description",
];
const LEGACY_KEYS: &[&str] = &[
    "scenario_id",
    "title",
    "description",
    "industry",
    "use_case",
    "core_function",
    "version",
    "tasks",
    "policies",
    "initial_state",
    "agent_topology",
    "ground_truth_history",
    "max_turns",
    "tools",
];
const NODE_KEYS: &[&str] = &[
    "id",
    "task_description",
    "expected_outcome",
    "success_criteria",
    "required_tools",
    "expected_state_changes",
    "timeout",
    "state_hygiene",
    "input_payload",
    "keywords",
    "title",
];
const TASK_KEYS: &[&str] = &[
    "task_id",
    "description",
    "expected_outcome",
    "required_tools",
    "success_criteria",
    "expected_state_changes",
    "expected_delegations",
];

impl Reader {
    fn unmapped(&mut self, item: impl Into<String>) {
        self.unmapped.push(item.into());
    }

    fn extra_keys(&mut self, object: &Map<String, Value>, known: &[&str], prefix: &str) {
        for key in object.keys() {
            if !known.contains(&key.as_str()) {
                self.unmapped(format!("`{prefix}{key}` (not a field trellis knows)"));
            }
        }
    }

    fn workflow(
        mut self,
        file: &Map<String, Value>,
        fallback_id: &str,
    ) -> Result<ScenarioFile, ScenarioError> {
        let workflow = file.get("workflow").and_then(Value::as_object);
        let Some(workflow) = workflow else {
            return Err(ScenarioError::WorkflowNotAnObject(json_kind(
                file.get("workflow").unwrap_or(&Value::Null),
            )));
        };
        let nodes = match workflow.get("nodes") {
            Some(Value::Array(nodes)) => nodes,
            None | Some(Value::Null) => return Err(ScenarioError::Empty("workflow nodes")),
            Some(_) => return Err(ScenarioError::NotAList("workflow.nodes")),
        };
        if nodes.is_empty() {
            return Err(ScenarioError::Empty("workflow nodes"));
        }
        let transitional = nodes
            .iter()
            .any(|n| matches!(n.get("expected_outcome"), Some(Value::Object(_))));
        let generation = if transitional {
            Generation::Transitional
        } else {
            Generation::Aes
        };
        match file.get("aes_version") {
            Some(v) if v.as_f64() == Some(1.4) => {}
            Some(v) => self.unmapped(format!(
                "`aes_version` {} (read as 1.4, the version trellis knows)",
                brief(v)
            )),
            None if generation == Generation::Aes => self
                .notes
                .push("The file has no `aes_version`; read as AES 1.4.".into()),
            None => {}
        }
        self.extra_keys(file, WORKFLOW_KEYS, "");
        for key in workflow.keys() {
            if key != "nodes" && key != "edges" {
                self.unmapped(format!("`workflow.{key}` (not a field trellis knows)"));
            }
        }

        let metadata = file.get("metadata").and_then(Value::as_object);
        let mut id = None;
        let mut name = None;
        let mut description = None;
        let mut agent = None;
        if let Some(metadata) = metadata {
            for (key, value) in metadata {
                match (key.as_str(), value) {
                    ("id", Value::String(s)) => id = scenario_id(s),
                    ("id", Value::Number(n)) => id = scenario_id(&n.to_string()),
                    ("name", Value::String(s)) => name = Some(s.clone()),
                    ("description", Value::String(s)) => description = Some(s.clone()),
                    ("compliance_level", Value::String(s)) => {
                        self.tags.push(format!("compliance:{s}"))
                    }
                    ("industry", Value::String(s)) => self.tags.push(s.clone()),
                    ("standards_registry", Value::Array(list))
                        if list.iter().all(Value::is_string) =>
                    {
                        self.tags.extend(
                            list.iter()
                                .filter_map(Value::as_str)
                                .map(|s| format!("standard:{s}")),
                        )
                    }
                    ("tags", Value::Array(tags)) if tags.iter().all(Value::is_string) => self
                        .tags
                        .extend(tags.iter().filter_map(Value::as_str).map(str::to_owned)),
                    ("agent", value) => agent = self.file_agent(value),
                    ("dataset", value) => {
                        self.dataset_path =
                            value.get("path").and_then(Value::as_str).map(str::to_owned);
                        self.unmapped(format!(
                            "`metadata.dataset` {} (datasets are not imported)",
                            brief(value)
                        ));
                    }
                    (key, value) => {
                        self.unmapped(format!("`metadata.{key}` {}", brief(value)));
                    }
                }
            }
        } else if let Some(value) = file.get("metadata") {
            self.unmapped(format!("`metadata` is {}, not an object", json_kind(value)));
        }
        // `metadata.id` names the scenario; files written by the harness's tools repeat it
        // (or give it only) at top level; `scenario_id` is the legacy spelling.
        for key in ["id", "scenario_id"] {
            if id.is_none()
                && let Some(Value::String(s)) = file.get(key)
            {
                id = scenario_id(s);
            }
        }

        // Files written by hand often describe the scenario at top level, not in `metadata`.
        match (&description, file.get("description")) {
            (_, None | Some(Value::Null)) => {}
            (None, Some(Value::String(s))) => description = Some(s.clone()),
            (Some(d), Some(Value::String(s))) if d == s => {}
            (_, Some(other)) => self.unmapped(format!(
                "`description` {} (the scenario's description is `metadata.description`)",
                brief(other)
            )),
        }
        let order = topological_order(nodes, workflow.get("edges"), &mut self)?;
        let mut steps = Vec::with_capacity(order.len());
        for index in order {
            let Some(Value::Object(node)) = nodes.get(index) else {
                return Err(ScenarioError::NotAnObjectAt {
                    what: "workflow node",
                    index,
                });
            };
            let mut step = self.node(node)?;
            if let Some(hygiene) = node.get("state_hygiene").filter(|h| !h.is_null()) {
                state_hygiene(hygiene, &mut step, steps.last_mut());
            }
            steps.push(step);
        }
        let mut criteria = Vec::new();
        if let Some(evaluation) = file.get("evaluation") {
            self.evaluation(evaluation, &steps, &mut criteria);
        }
        let max_turns = self.max_turns(file).or(Some(HARNESS_MAX_TURNS));
        self.finish(
            generation,
            file,
            Parts {
                id: id.unwrap_or_else(|| fallback(fallback_id)),
                name,
                description,
                agent,
                max_turns,
                steps,
                criteria,
            },
        )
    }

    fn legacy(
        mut self,
        file: &Map<String, Value>,
        fallback_id: &str,
    ) -> Result<ScenarioFile, ScenarioError> {
        let tasks = match file.get("tasks") {
            Some(Value::Array(tasks)) => tasks,
            Some(Value::Null) | None => return Err(ScenarioError::Empty("tasks")),
            Some(_) => return Err(ScenarioError::NotAList("tasks")),
        };
        if tasks.is_empty() {
            return Err(ScenarioError::Empty("tasks"));
        }
        self.extra_keys(file, LEGACY_KEYS, "");
        let text = |key: &str| file.get(key).and_then(Value::as_str).map(str::to_owned);
        self.tags.push("legacy".into());
        for key in ["industry", "use_case", "core_function"] {
            match file.get(key) {
                Some(Value::String(s)) if !s.trim().is_empty() => self.tags.push(s.clone()),
                Some(Value::String(_)) | None | Some(Value::Null) => {}
                Some(other) => self.unmapped(format!("`{key}` {}", brief(other))),
            }
        }
        if let Some(version) = file.get("version") {
            self.notes
                .push(format!("Scenario version {}.", brief(version)));
        }
        if let Some(history) = file.get("ground_truth_history") {
            let entries = history.as_array().map_or(0, Vec::len);
            self.unmapped(format!(
                "`ground_truth_history` ({entries} entries: a reference conversation, not \
                 something trellis checks)"
            ));
        }
        let mut steps = Vec::with_capacity(tasks.len());
        for (index, task) in tasks.iter().enumerate() {
            let Value::Object(task) = task else {
                return Err(ScenarioError::NotAnObjectAt {
                    what: "task",
                    index,
                });
            };
            steps.push(self.task(task, index)?);
        }
        let max_turns = self.max_turns(file);
        self.finish(
            Generation::Legacy,
            file,
            Parts {
                id: text("scenario_id")
                    .and_then(|s| scenario_id(&s))
                    .unwrap_or_else(|| fallback(fallback_id)),
                name: text("title"),
                description: text("description"),
                agent: None,
                max_turns,
                steps,
                criteria: Vec::new(),
            },
        )
    }

    /// What both shapes share: sandbox, topology, the result.
    fn finish(
        mut self,
        generation: Generation,
        file: &Map<String, Value>,
        parts: Parts,
    ) -> Result<ScenarioFile, ScenarioError> {
        let initial_state = match file.get("initial_state") {
            None | Some(Value::Null) => None,
            Some(Value::Object(state)) if state.is_empty() => None,
            Some(Value::Object(state)) => Some(state.clone()),
            Some(other) => {
                self.unmapped(format!(
                    "`initial_state` is {}, not an object",
                    json_kind(other)
                ));
                None
            }
        };
        let mut tools = BTreeMap::new();
        if let Some(declared) = file.get("tools") {
            self.tools(declared, &mut tools);
        }
        if let Some(policies) = file.get("policies") {
            self.policies(policies, &mut tools);
        }
        if let Some(topology) = file.get("agent_topology") {
            let agents = topology.as_object().map_or(0, Map::len);
            self.unmapped(format!(
                "`agent_topology` ({agents} agents' reads and writes: trellis sees one agent)"
            ));
        }
        for step in &self.steps_unmapped(&parts.steps) {
            self.unmapped.push(step.clone());
        }
        Ok(ScenarioFile {
            generation,
            id: parts.id,
            name: parts.name,
            description: parts.description,
            tags: self.tags,
            agent: parts.agent,
            max_turns: parts.max_turns,
            initial_state,
            tools,
            steps: parts.steps,
            criteria: parts.criteria,
            unmapped: self.unmapped,
            notes: self.notes,
            dataset_path: self.dataset_path,
        })
    }

    /// The per-step losses, named by step, for the file's list.
    fn steps_unmapped(&self, steps: &[StepOut]) -> Vec<String> {
        steps
            .iter()
            .flat_map(|s| s.unmapped.iter().map(move |u| format!("{}: {u}", s.id)))
            .collect()
    }

    fn max_turns(&mut self, file: &Map<String, Value>) -> Option<u64> {
        match file.get("max_turns") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().filter(|n| *n >= 1) {
                Some(n) => Some(n),
                None => {
                    self.unmapped(format!(
                        "`max_turns` {} (not a whole number of at least 1)",
                        brief(v)
                    ));
                    None
                }
            },
        }
    }

    fn file_agent(&mut self, value: &Value) -> Option<FileAgent> {
        let protocol = value
            .get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_ascii_lowercase();
        let Some(endpoint) = value
            .get("endpoint")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|e| !e.is_empty())
        else {
            self.unmapped(format!(
                "`metadata.agent` {} (no `endpoint`: the default agent is used)",
                brief(value)
            ));
            return None;
        };
        let lower = endpoint.to_ascii_lowercase();
        let agent = if lower.starts_with("http://") || lower.starts_with("https://") {
            Some(FileAgent::Url(endpoint.to_owned()))
        } else if valid_socket(endpoint) {
            Some(FileAgent::Socket(endpoint.to_owned()))
        } else if matches!(protocol.as_str(), "tcp" | "socket")
            && valid_socket(&format!("tcp:{endpoint}"))
        {
            Some(FileAgent::Socket(format!("tcp:{endpoint}")))
        } else if matches!(protocol.as_str(), "unix") && valid_socket(&format!("unix:{endpoint}")) {
            Some(FileAgent::Socket(format!("unix:{endpoint}")))
        } else if matches!(
            protocol.as_str(),
            "local" | "stdio" | "process" | "command" | "subprocess"
        ) {
            Some(FileAgent::Command(endpoint.to_owned()))
        } else {
            None
        };
        if agent.is_none() {
            self.unmapped(format!(
                "`metadata.agent` {} (an endpoint trellis cannot reach: the default agent is \
                 used)",
                brief(value)
            ));
        }
        agent
    }

    /// One workflow node: its `user` step and the checks after it.
    fn node(&mut self, node: &Map<String, Value>) -> Result<StepOut, ScenarioError> {
        let id = node_id(node.get("id")).unwrap_or_default();
        let mut step = StepOut {
            title: node.get("title").and_then(Value::as_str).map(str::to_owned),
            message: String::new(),
            expects: Vec::new(),
            unmapped: Vec::new(),
            notes: Vec::new(),
            id,
        };
        step.message = match node.get("task_description") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            None | Some(Value::Null | Value::String(_)) => {
                return Err(ScenarioError::NoTask {
                    what: "workflow node",
                    id: step.id,
                    field: "task_description",
                });
            }
            Some(other) => {
                step.notes.push(format!(
                    "`task_description` is {}: sent as its JSON text",
                    json_kind(other)
                ));
                other.to_string()
            }
        };
        for key in node.keys() {
            if !NODE_KEYS.contains(&key.as_str()) {
                step.unmapped
                    .push(format!("`{key}` (not a field trellis knows)"));
            }
        }
        match node.get("expected_outcome") {
            None | Some(Value::Null) => {}
            Some(Value::Array(assertions)) => {
                for assertion in assertions {
                    match assertion_criterion(assertion) {
                        Ok(criterion) => step.expects.push(criterion),
                        Err(why) => step
                            .unmapped
                            .push(format!("assertion {} ({why})", brief(assertion))),
                    }
                }
            }
            Some(Value::Object(typed)) => typed_outcome(typed, &mut step),
            Some(Value::String(sentence)) if sentence.trim().is_empty() => step
                .unmapped
                .push("`expected_outcome` is empty: nothing of this node is checked".to_owned()),
            Some(Value::String(sentence)) => step.expects.push(format!(
                "outcome {}",
                kdl_string(&literal_template(sentence))
            )),
            Some(other) => step
                .unmapped
                .push(format!("`expected_outcome` {}", brief(other))),
        }
        self.required_tools(node.get("required_tools"), &mut step);
        self.state_changes(node.get("expected_state_changes"), &mut step);
        let keywords = node.get("keywords");
        if let Some(criteria) = node.get("success_criteria") {
            success_criteria(criteria, keywords, &mut step);
        }
        match node.get("timeout") {
            None | Some(Value::Null) => {}
            Some(v) if v.as_f64() == Some(DEFAULT_NODE_TIMEOUT) => {}
            Some(v) => step.unmapped.push(format!(
                "`timeout` {} (a per-node limit; trellis limits each agent call with the \
                 agent's `timeout` and the whole trajectory with the scenario's)",
                brief(v)
            )),
        }
        for key in ["input_payload", "keywords"] {
            if node.get(key).is_some_and(|v| !v.is_null()) {
                step.notes.push(format!(
                    "`{key}` is not sent (the harness does not send it either)"
                ));
            }
        }
        Ok(step)
    }

    /// One legacy task.
    fn task(&mut self, task: &Map<String, Value>, index: usize) -> Result<StepOut, ScenarioError> {
        let id = node_id(task.get("task_id")).unwrap_or_else(|| format!("task {}", index + 1));
        let mut step = StepOut {
            title: None,
            message: String::new(),
            expects: Vec::new(),
            unmapped: Vec::new(),
            notes: Vec::new(),
            id,
        };
        step.message = match task.get("description") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            None | Some(Value::Null | Value::String(_)) => {
                return Err(ScenarioError::NoTask {
                    what: "task",
                    id: step.id,
                    field: "description",
                });
            }
            Some(other) => {
                step.notes.push(format!(
                    "`description` is {}: sent as its JSON text",
                    json_kind(other)
                ));
                other.to_string()
            }
        };
        for key in task.keys() {
            if !TASK_KEYS.contains(&key.as_str()) {
                step.unmapped
                    .push(format!("`{key}` (not a field trellis knows)"));
            }
        }
        match task.get("expected_outcome") {
            None | Some(Value::Null) => {}
            // Said, not dropped: the task then has no check, which `check` would say only
            // as a scenario skipped for want of one.
            Some(Value::String(sentence)) if sentence.trim().is_empty() => step
                .unmapped
                .push("`expected_outcome` is empty: nothing of this task is checked".to_owned()),
            Some(Value::String(sentence)) => step.expects.push(format!(
                "outcome {}",
                kdl_string(&literal_template(sentence))
            )),
            Some(Value::Array(assertions)) => {
                for assertion in assertions {
                    match assertion_criterion(assertion) {
                        Ok(criterion) => step.expects.push(criterion),
                        Err(why) => step
                            .unmapped
                            .push(format!("assertion {} ({why})", brief(assertion))),
                    }
                }
            }
            Some(Value::Object(typed)) => typed_outcome(typed, &mut step),
            Some(other) => step
                .unmapped
                .push(format!("`expected_outcome` {}", brief(other))),
        }
        self.required_tools(task.get("required_tools"), &mut step);
        self.state_changes(task.get("expected_state_changes"), &mut step);
        if let Some(criteria) = task.get("success_criteria") {
            success_criteria(criteria, None, &mut step);
        }
        if let Some(delegations) = task.get("expected_delegations")
            && !delegations.is_null()
        {
            step.unmapped.push(format!(
                "`expected_delegations` {} (trellis sees one agent, not its delegations)",
                brief(delegations)
            ));
        }
        Ok(step)
    }

    fn required_tools(&mut self, tools: Option<&Value>, step: &mut StepOut) {
        match tools {
            None | Some(Value::Null) => {}
            Some(Value::Array(tools)) => {
                for tool in tools {
                    match tool.as_str().filter(|t| !t.trim().is_empty()) {
                        Some(name) => step.expects.push(format!("tool {}", kdl_string(name))),
                        None => step
                            .unmapped
                            .push(format!("`required_tools` entry {}", brief(tool))),
                    }
                }
            }
            Some(other) => step
                .unmapped
                .push(format!("`required_tools` {}", brief(other))),
        }
    }

    fn state_changes(&mut self, changes: Option<&Value>, step: &mut StepOut) {
        match changes {
            None | Some(Value::Null) => {}
            Some(Value::Array(changes)) => {
                for change in changes {
                    let path = change.get("path").and_then(Value::as_str);
                    let value = change.get("value");
                    match (path.filter(|p| valid_state_path(p)), value) {
                        (Some(path), Some(value)) => step.expects.push(format!(
                            "state path={} {}",
                            kdl_string(path),
                            state_value_check("equals", value)
                        )),
                        _ => step.unmapped.push(format!(
                            "`expected_state_changes` entry {} (needs a dotted `path` and a \
                             `value`)",
                            brief(change)
                        )),
                    }
                }
            }
            Some(other) => step
                .unmapped
                .push(format!("`expected_state_changes` {}", brief(other))),
        }
    }

    fn tools(&mut self, declared: &Value, tools: &mut BTreeMap<String, ToolDecl>) {
        let Value::Object(declared) = declared else {
            if !declared.is_null() {
                self.unmapped(format!("`tools` {} (not an object)", brief(declared)));
            }
            return;
        };
        for (name, spec) in declared {
            if name.trim().is_empty() {
                self.unmapped(format!("`tools` entry with an empty name {}", brief(spec)));
                continue;
            }
            let mut decl = ToolDecl::default();
            match spec {
                Value::Object(spec) => {
                    for (key, value) in spec {
                        match key.as_str() {
                            "output" => decl.output = Some(value.clone()),
                            "state_changes" => self.tool_state_changes(name, value, &mut decl),
                            other => {
                                self.unmapped(format!("`tools.{name}.{other}` {}", brief(value)))
                            }
                        }
                    }
                }
                Value::Null => {}
                other => {
                    self.unmapped(format!("`tools.{name}` {} (not an object)", brief(other)));
                    continue;
                }
            }
            tools.insert(name.clone(), decl);
        }
    }

    fn tool_state_changes(&mut self, tool: &str, changes: &Value, decl: &mut ToolDecl) {
        let Value::Array(changes) = changes else {
            if !changes.is_null() {
                self.unmapped(format!(
                    "`tools.{tool}.state_changes` {} (not a list)",
                    brief(changes)
                ));
            }
            return;
        };
        for change in changes {
            match (
                change
                    .get("path")
                    .and_then(Value::as_str)
                    .filter(|p| valid_state_path(p)),
                change.get("value"),
            ) {
                (Some(path), Some(value)) => {
                    decl.state_changes.push((path.to_owned(), value.clone()))
                }
                _ => self.unmapped(format!(
                    "`tools.{tool}.state_changes` entry {} (needs a dotted `path` and a `value`)",
                    brief(change)
                )),
            }
        }
    }

    fn policies(&mut self, policies: &Value, tools: &mut BTreeMap<String, ToolDecl>) {
        let Value::Object(policies) = policies else {
            if !policies.is_null() {
                self.unmapped(format!("`policies` {} (not an object)", brief(policies)));
            }
            return;
        };
        for (tool, policy) in policies {
            if tool.trim().is_empty() {
                self.unmapped(format!(
                    "`policies` entry with an empty tool name {}",
                    brief(policy)
                ));
                continue;
            }
            let Value::Object(policy) = policy else {
                self.unmapped(format!(
                    "`policies.{tool}` {} (not an object)",
                    brief(policy)
                ));
                continue;
            };
            for (key, value) in policy {
                let limit = value
                    .as_f64()
                    .or_else(|| value.as_str().and_then(|s| s.trim().parse::<f64>().ok()))
                    .filter(|f| f.is_finite());
                match (key.as_str(), limit) {
                    ("max_limit", Some(limit)) => {
                        tools.entry(tool.clone()).or_default().max_limit = Some(limit)
                    }
                    ("max_limit", None) => self.unmapped(format!(
                        "`policies.{tool}.max_limit` {} (not a number)",
                        brief(value)
                    )),
                    (other, _) => self.unmapped(format!(
                        "`policies.{tool}.{other}` {} (only `max_limit` is a harness policy)",
                        brief(value)
                    )),
                }
            }
        }
    }

    /// `evaluation.metrics` as criteria on the whole trajectory (see [`classify_metric`]);
    /// the judge panel settings have no counterpart yet.
    fn evaluation(&mut self, evaluation: &Value, steps: &[StepOut], criteria: &mut Vec<String>) {
        let Value::Object(evaluation) = evaluation else {
            if !evaluation.is_null() {
                self.unmapped(format!(
                    "`evaluation` {} (not an object)",
                    brief(evaluation)
                ));
            }
            return;
        };
        for (key, value) in evaluation {
            match (key.as_str(), value) {
                ("metrics", Value::Array(metrics)) => {
                    for metric in metrics {
                        let (name, object) = match metric {
                            Value::String(name) if !name.trim().is_empty() => (name.as_str(), None),
                            Value::Object(m) => match m.get("metric").and_then(Value::as_str) {
                                Some(name) if !name.trim().is_empty() => (name, Some(m)),
                                _ => {
                                    self.unmapped(format!(
                                        "`evaluation.metrics` entry {} (no `metric` name)",
                                        brief(metric)
                                    ));
                                    continue;
                                }
                            },
                            other => {
                                self.unmapped(format!(
                                    "`evaluation.metrics` entry {}",
                                    brief(other)
                                ));
                                continue;
                            }
                        };
                        let written: Vec<String> = steps
                            .iter()
                            .flat_map(|s| s.expects.iter().cloned())
                            .collect();
                        match classify_metric(name, object, &written) {
                            Metric::Judged => {
                                match object.map(|m| judge_criterion(m, None, None)) {
                                    Some(Ok((criterion, remarks))) => {
                                        criteria.push(criterion);
                                        for remark in remarks {
                                            self.unmapped(format!(
                                                "`evaluation.metrics`: {remark}"
                                            ));
                                        }
                                    }
                                    Some(Err(why)) => self.unmapped(format!(
                                        "`evaluation.metrics` entry {} ({why})",
                                        brief(metric)
                                    )),
                                    None => criteria.push(format!(
                                        "judge {}",
                                        kdl_string(&literal_template(name))
                                    )),
                                }
                            }
                            Metric::NoViolations => {
                                criteria.push("violations max=0".into());
                                if let Some(remark) = violations_threshold_remark(
                                    name,
                                    object.and_then(|m| m.get("threshold")),
                                ) {
                                    self.unmapped(format!("`evaluation.metrics`: {remark}"));
                                }
                            }
                            Metric::CoveredBy(what) => self
                                .notes
                                .push(format!("`evaluation.metrics` `{name}`: checked by {what}")),
                            Metric::Unmapped(why) => self.unmapped(format!(
                                "`evaluation.metrics` entry {} ({why})",
                                brief(metric)
                            )),
                        }
                    }
                }
                ("metrics", Value::Null) => {}
                (key, value) => self.unmapped(format!(
                    "`evaluation.{key}` {} (judge panels and consensus are not imported)",
                    brief(value)
                )),
            }
        }
    }
}

/// The fields of a scenario gathered before [`Reader::finish`].
struct Parts {
    id: String,
    name: Option<String>,
    description: Option<String>,
    agent: Option<FileAgent>,
    max_turns: Option<u64>,
    steps: Vec<StepOut>,
    criteria: Vec<String>,
}

fn fallback(stem: &str) -> String {
    scenario_id(stem).unwrap_or_else(|| "scenario".to_owned())
}

fn node_id(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The indices of `nodes` in an order where every edge's `from` comes before its `to`;
/// among nodes that are ready together, the order written (Kahn's algorithm).
fn topological_order(
    nodes: &[Value],
    edges: Option<&Value>,
    reader: &mut Reader,
) -> Result<Vec<usize>, ScenarioError> {
    let mut index_of: HashMap<String, usize> = HashMap::with_capacity(nodes.len());
    let mut ids = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        if !node.is_object() {
            return Err(ScenarioError::NotAnObjectAt {
                what: "workflow node",
                index,
            });
        }
        let id = node_id(node.get("id")).ok_or(ScenarioError::NodeWithoutId { index })?;
        if index_of.insert(id.clone(), index).is_some() {
            return Err(ScenarioError::DuplicateNode(id));
        }
        ids.push(id);
    }
    let edges = match edges {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(edges)) => edges.as_slice(),
        Some(_) => return Err(ScenarioError::NotAList("workflow.edges")),
    };
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut incoming = vec![0usize; nodes.len()];
    let mut conditions = 0;
    for (index, edge) in edges.iter().enumerate() {
        let end = |key: &str| node_id(edge.get(key)).unwrap_or_default();
        let (from, to) = (end("from"), end("to"));
        let lookup = |id: &str| index_of.get(id).copied();
        let (Some(a), Some(b)) = (lookup(&from), lookup(&to)) else {
            let missing = if lookup(&from).is_none() {
                from.clone()
            } else {
                to.clone()
            };
            return Err(ScenarioError::UnknownNode {
                index,
                from,
                to,
                missing,
            });
        };
        if edge.get("condition").is_some_and(|c| !c.is_null()) {
            conditions += 1;
        }
        if let Some(list) = successors.get_mut(a) {
            list.push(b);
        }
        if let Some(count) = incoming.get_mut(b) {
            *count += 1;
        }
    }
    if conditions > 0 {
        reader.notes.push(format!(
            "{conditions} edge condition(s) are not evaluated (the harness does not evaluate \
             them either): every node runs."
        ));
    }
    let mut ready: VecDeque<usize> = (0..nodes.len())
        .filter(|&i| incoming.get(i) == Some(&0))
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_front() {
        order.push(i);
        let mut newly: Vec<usize> = Vec::new();
        for &next in successors.get(i).map(Vec::as_slice).unwrap_or_default() {
            if let Some(count) = incoming.get_mut(next) {
                *count -= 1;
                if *count == 0 {
                    newly.push(next);
                }
            }
        }
        newly.sort_unstable();
        ready.extend(newly);
    }
    if order.len() < nodes.len() {
        let stuck: Vec<String> = (0..nodes.len())
            .filter(|i| incoming.get(*i).is_some_and(|c| *c > 0))
            .filter_map(|i| ids.get(i).map(|id| format!("`{id}`")))
            .collect();
        return Err(ScenarioError::Cycle(stuck.join(", ")));
    }
    Ok(order)
}

/// `state_hygiene {rules: [{path, expected, op}]}`: checks of the state before `step` runs,
/// which is the state after the step before it; so they become `expect state` criteria of
/// `previous`. Before the first step nothing has run: those rules are not mapped.
fn state_hygiene(hygiene: &Value, step: &mut StepOut, previous: Option<&mut StepOut>) {
    let Some(previous) = previous else {
        step.unmapped.push(format!(
            "`state_hygiene` {} (pre-checks before the first node: there is no turn to check them after)",
            brief(hygiene)
        ));
        return;
    };
    let Some(rules) = hygiene.get("rules").and_then(Value::as_array) else {
        step.unmapped.push(format!(
            "`state_hygiene` {} (no `rules` list)",
            brief(hygiene)
        ));
        return;
    };
    let mut mapped = 0;
    for rule in rules {
        let path = rule
            .get("path")
            .and_then(Value::as_str)
            .filter(|p| valid_state_path(p));
        let op = rule.get("op").and_then(Value::as_str).unwrap_or("eq");
        let expected = rule.get("expected").unwrap_or(&Value::Null);
        let check = match (path, op) {
            (None, _) => None,
            (Some(_), "exists") => Some("exists=#true".to_owned()),
            (Some(_), "not_exists") => Some("absent=#true".to_owned()),
            (Some(_), "eq") => Some(state_value_check("equals", expected)),
            (Some(_), "contains") => Some(state_value_check("contains", expected)),
            (Some(_), _) => None,
        };
        match (path, check) {
            (Some(path), Some(check)) => {
                mapped += 1;
                previous
                    .expects
                    .push(format!("state path={} {check}", kdl_string(path)));
            }
            _ => step.unmapped.push(format!(
                "`state_hygiene` rule {} (needs a dotted `path`, an `op` of eq, exists, \
                 not_exists or contains, and a scalar `expected`)",
                brief(rule)
            )),
        }
    }
    if mapped > 0 {
        step.notes.push(format!(
            "{mapped} `state_hygiene` pre-check(s) of this node are checked after the step before it"
        ));
    }
}

/// A transitional `expected_outcome` object `{type: "typed_value", data_type, value}`: the
/// value the node's answer should have. A string value of data type `string` is a concrete
/// answer (`"VALID"`), checked deterministically as contained in the reply; any other value
/// (a boolean, a number, a description of an object) is judged.
fn typed_outcome(typed: &Map<String, Value>, step: &mut StepOut) {
    let kind = typed.get("type").and_then(Value::as_str);
    let data_type = typed
        .get("data_type")
        .and_then(Value::as_str)
        .unwrap_or("unspecified");
    let value = typed.get("value").unwrap_or(&Value::Null);
    match (kind, data_type, value) {
        (Some("typed_value"), "string", Value::String(text)) if !text.trim().is_empty() => {
            step.notes.push(
                "expected outcome: a typed value (string), checked as contained in the reply"
                    .into(),
            );
            step.expects.push(format!(
                "reply contains={}",
                kdl_string(&literal_template(text))
            ));
        }
        (Some("typed_value"), _, Value::String(text)) if !text.trim().is_empty() => {
            step.notes.push(format!(
                "expected outcome: a typed value ({data_type}), judged as a statement"
            ));
            step.expects
                .push(format!("outcome {}", kdl_string(&literal_template(text))));
        }
        (Some("typed_value"), _, Value::Null) => step.unmapped.push(format!(
            "`expected_outcome` {} (a typed value without a `value`)",
            brief(&Value::Object(typed.clone()))
        )),
        (Some("typed_value"), _, other) => {
            step.notes.push(format!(
                "expected outcome: a typed value ({data_type}), judged"
            ));
            let written = kdl_scalar(other).unwrap_or_else(|| kdl_string(&other.to_string()));
            step.expects.push(format!("outcome value={written}"));
        }
        _ => step.unmapped.push(format!(
            "`expected_outcome` {} (of type `{}`: only `typed_value` objects are imported)",
            brief(&Value::Object(typed.clone())),
            kind.unwrap_or("none")
        )),
    }
}

/// One assertion `{target, property, expected, mode}` as a criterion, or why it cannot be.
fn assertion_criterion(assertion: &Value) -> Result<String, String> {
    let Value::Object(a) = assertion else {
        return Err(format!("{} is not an object", json_kind(assertion)));
    };
    let target = match a.get("target") {
        None | Some(Value::Null) => "message",
        Some(Value::String(t)) => t.as_str(),
        Some(other) => return Err(format!("target {} is not a string", brief(other))),
    };
    let mut mode = match a.get("mode") {
        None | Some(Value::Null) => "exact".to_owned(),
        Some(Value::String(m)) => m.to_ascii_lowercase(),
        Some(other) => return Err(format!("mode {} is not a string", brief(other))),
    };
    let mut expected = a.get("expected").cloned().unwrap_or(Value::Null);
    if let Value::String(text) = &expected
        && let Some(pattern) = text.strip_prefix("regex:")
    {
        mode = "regex".into();
        expected = Value::String(pattern.to_owned());
    }
    let property = a.get("property").and_then(Value::as_str).unwrap_or("");
    match target {
        "message" => message_criterion(&mode, &expected, property),
        "state" => state_criterion(&mode, &expected, property, a.get("tolerance")),
        "tool_calls" => tool_call_criterion(&mode, &expected, property),
        other => Err(format!("unknown target `{other}`")),
    }
}

fn message_criterion(mode: &str, expected: &Value, property: &str) -> Result<String, String> {
    // A named field of the agent's last reply object, compared exactly: that field, by
    // JSON path into the reply as received (the turn's data), whichever field the reply's
    // text is taken from (a `provide_instructions` reply's text is its `instructions`, and
    // `property: "summary"` asks for its summary).
    let is_path = !property.is_empty()
        && property.split('.').all(|segment| {
            !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if is_path && mode == "exact" {
        let value = match expected {
            Value::String(text) => kdl_string(&literal_template(text)),
            other => kdl_scalar(other).ok_or_else(|| {
                format!(
                    "an exact value of property `{property}` that is {}",
                    json_kind(other)
                )
            })?,
        };
        return Ok(format!(
            "reply json-path={} equals={value}",
            kdl_string(&format!("$.{property}"))
        ));
    }
    const REPLY_PROPERTIES: &[&str] = &["", "summary", "instructions", "message", "content"];
    if !REPLY_PROPERTIES.contains(&property) {
        return Err(format!(
            "property `{property}` of the message: trellis checks the reply's text"
        ));
    }
    match mode {
        "exact" => {
            let text = scalar_text(expected).ok_or_else(|| {
                format!(
                    "an exact value that is {}: a reply is text",
                    json_kind(expected)
                )
            })?;
            Ok(format!(
                "reply equals={}",
                kdl_string(&literal_template(&text))
            ))
        }
        "regex" => Ok(format!(
            "reply matches={}",
            kdl_string(&search_regex(expected)?)
        )),
        "contains" => match expected {
            Value::Array(items) => {
                let texts: Vec<String> = items
                    .iter()
                    .map(|item| {
                        scalar_text(item).ok_or_else(|| format!("list element {}", brief(item)))
                    })
                    .collect::<Result<_, _>>()?;
                match texts.as_slice() {
                    [] => Err("an empty `contains` list".into()),
                    [one] => Ok(format!(
                        "reply contains={}",
                        kdl_string(&literal_template(one))
                    )),
                    many => {
                        // Any element: an alternation of the literal texts.
                        let alternatives: Vec<String> =
                            many.iter().map(|t| regex::escape(t)).collect();
                        let pattern = format!("(?:{})", alternatives.join("|"));
                        Ok(format!("reply matches={}", kdl_string(&pattern)))
                    }
                }
            }
            other => {
                let text =
                    scalar_text(other).ok_or_else(|| format!("`contains` {}", json_kind(other)))?;
                Ok(format!(
                    "reply contains={}",
                    kdl_string(&literal_template(&text))
                ))
            }
        },
        "numerical_tolerance" => {
            Err("a numerical tolerance on the message: trellis compares replies as text".into())
        }
        other => Err(format!("unknown assertion mode `{other}`")),
    }
}

/// `equals=VALUE` / `contains=VALUE` for a scalar, `equals-json=…` / `contains-json=…` (JSON
/// text) for an object or array.
fn state_value_check(check: &str, expected: &Value) -> String {
    match kdl_scalar(expected) {
        Some(value) => format!("{check}={value}"),
        None => format!("{check}-json={}", kdl_string(&expected.to_string())),
    }
}

fn state_criterion(
    mode: &str,
    expected: &Value,
    property: &str,
    tolerance: Option<&Value>,
) -> Result<String, String> {
    if !valid_state_path(property) {
        return Err(format!(
            "state property `{property}` is not a dotted path or JSON pointer"
        ));
    }
    let path = kdl_string(property);
    match mode {
        "exact" => Ok(format!(
            "state path={path} {}",
            state_value_check("equals", expected)
        )),
        "regex" => Ok(format!(
            "state path={path} matches={}",
            kdl_string(&search_regex(expected)?)
        )),
        // A list means any of its elements, as `contains-json` with an array does.
        "contains" => Ok(format!(
            "state path={path} {}",
            state_value_check("contains", expected)
        )),
        "numerical_tolerance" => {
            let number = expected
                .as_f64()
                .or_else(|| expected.as_str().and_then(|s| s.trim().parse().ok()))
                .filter(|f: &f64| f.is_finite())
                .ok_or_else(|| format!("numerical tolerance on {}", brief(expected)))?;
            match tolerance.and_then(Value::as_f64) {
                Some(t) if t >= 0.0 && t.is_finite() => Ok(format!(
                    "state path={path} near={} tolerance={}",
                    kdl_number(number),
                    kdl::KdlValue::Float(t)
                )),
                _ => Ok(format!("state path={path} near={}", kdl_number(number))),
            }
        }
        other => Err(format!("unknown assertion mode `{other}`")),
    }
}

fn tool_call_criterion(mode: &str, expected: &Value, property: &str) -> Result<String, String> {
    // `0.tool_name`, `calls[1].name`: the call at a position, which `tool "NAME"` (a call
    // anywhere) would check more loosely than written: not carried over, and said so.
    if property
        .split(['.', '[', ']'])
        .any(|segment| !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "property `{property}` names a call by its position: trellis checks which tools \
             were called, not in which order"
        ));
    }
    let last = property.rsplit('.').next().unwrap_or("");
    if !matches!(
        last,
        "" | "tool" | "tool_name" | "name" | "tools" | "tool_names"
    ) {
        return Err(format!(
            "property `{property}` of the tool calls: trellis checks which tools were called"
        ));
    }
    let name = match (mode, expected) {
        ("exact" | "contains", Value::String(name)) => name,
        ("contains", Value::Array(items)) if items.len() == 1 => match items.first() {
            Some(Value::String(name)) => name,
            _ => return Err(format!("`contains` {}", brief(expected))),
        },
        ("exact" | "contains", _) => {
            return Err(format!(
                "expected {}: trellis checks a call to one named tool",
                brief(expected)
            ));
        }
        (other, _) => return Err(format!("mode `{other}` on the tool calls")),
    };
    if name.trim().is_empty() {
        return Err("an empty tool name".into());
    }
    Ok(format!("tool {}", kdl_string(name)))
}

/// A regex as the harness searches with it (case-insensitive, anywhere in the text), in
/// the Rust syntax `trellis check` compiles.
fn search_regex(expected: &Value) -> Result<String, String> {
    let Value::String(pattern) = expected else {
        return Err(format!("a regex that is {}", json_kind(expected)));
    };
    // `{{ … }}` in `matches=` is refused as template syntax; `[{]` is the same literal `{`.
    let chars: Vec<char> = pattern.chars().collect();
    let mut escaped = String::with_capacity(pattern.len() + 4);
    let mut backslashes = 0usize;
    for (i, &c) in chars.iter().enumerate() {
        if c == '{' && chars.get(i + 1) == Some(&'{') {
            if backslashes % 2 == 1 {
                escaped.pop();
            }
            escaped.push_str("[{]");
        } else {
            escaped.push(c);
        }
        backslashes = if c == '\\' { backslashes + 1 } else { 0 };
    }
    let full = format!("(?i){escaped}");
    // Parsed, not compiled: the parser finds every syntax trellis does not support
    // (look-around, back-references), at a fraction of the cost of compiling.
    regex_syntax::Parser::new().parse(&full).map_err(|e| {
        let first = e.to_string();
        let line = first.lines().last().unwrap_or_default().trim().to_owned();
        format!("regex `{pattern}` is not valid in trellis's regex syntax: {line}")
    })?;
    Ok(full)
}

/// Text a reply is compared with: a string as is, a number or boolean as written in JSON.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn valid_state_path(path: &str) -> bool {
    !path.is_empty() && (path.starts_with('/') || !path.split('.').any(str::is_empty))
}

fn valid_socket(address: &str) -> bool {
    if let Some(rest) = address.strip_prefix("tcp:") {
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        rest.rsplit_once(':').is_some_and(|(host, port)| {
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            !host.is_empty()
                && !host.contains(['/', ' '])
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        })
    } else if let Some(rest) = address.strip_prefix("unix:") {
        let path = rest.strip_prefix("//").unwrap_or(rest);
        !path.is_empty() && (!rest.starts_with("//") || path.starts_with('/'))
    } else {
        false
    }
}

/// What a harness metric becomes. A metric name is the harness's own scorer, not a statement
/// a judge could score: only metrics an LLM judges with a rubric become `judge` criteria;
/// those trellis checks deterministically become those checks; the rest stay comments.
#[derive(Debug, PartialEq)]
enum Metric {
    /// An LLM-judged metric with a rubric: `judge "METRIC" rubric=…`.
    Judged,
    /// Policy compliance: `violations max=0`.
    NoViolations,
    /// A metric on tool calls or state changes, checked by the `tool`/`state` criteria of
    /// `required_tools`/`expected_state_changes` (the ones it scores) when there are any.
    CoveredBy(&'static str),
    /// Nothing trellis can check; the reason.
    Unmapped(String),
}

/// What a policy metric's threshold loses as `violations max=0`, which passes only without
/// any breach: the harness scores every metric `>= threshold`, so a compliance score's
/// threshold short of 1 lets some breaches pass there, and a violation rate's or count's
/// threshold means what that comparison makes of it. `None` without a threshold, or for a
/// compliance score's threshold of 1 (no breach, as here).
fn violations_threshold_remark(metric: &str, threshold: Option<&Value>) -> Option<String> {
    let threshold = threshold?.as_f64()?;
    let score = !metric.to_ascii_lowercase().contains("violation");
    (!(score && threshold >= 1.0)).then(|| {
        format!(
            "metric `{metric}`'s threshold {threshold}: checked as `violations max=0`, which \
             fails on any policy breach, where the harness compares the metric's score with \
             the threshold (`>=`)"
        )
    })
}

/// Classifies the metric `name` of `c` (`None` for a plain metric name) on a step or scenario
/// whose criteria so far are `written`.
fn classify_metric(name: &str, c: Option<&Map<String, Value>>, written: &[String]) -> Metric {
    let rubric = c
        .and_then(|c| c.get("judge_config"))
        .and_then(|j| j.get("judge_rubric"))
        .is_some_and(Value::is_string);
    if rubric {
        return Metric::Judged;
    }
    let lower = name.to_ascii_lowercase();
    let has = |prefix: &str| written.iter().any(|w| w.starts_with(prefix));
    if lower.contains("policy") || lower.contains("governance") || lower.contains("violation") {
        return Metric::NoViolations;
    }
    if lower.contains("tool") {
        return if has("tool ") {
            Metric::CoveredBy("the `tool` checks of `required_tools`")
        } else {
            Metric::Unmapped("a tool metric, but `required_tools` names no tool".into())
        };
    }
    if lower.contains("state") {
        return if has("state ") {
            Metric::CoveredBy("the `state` checks of `expected_state_changes`")
        } else {
            Metric::Unmapped("a state metric, but `expected_state_changes` lists no change".into())
        };
    }
    let judged = lower.contains("judge")
        || c.and_then(|c| c.get("requires_llm_judge"))
            .and_then(Value::as_bool)
            == Some(true);
    Metric::Unmapped(if judged {
        "scored by the harness's LLM judge without a `judge_rubric`: no statement to judge".into()
    } else {
        "a harness metric trellis has no check for".into()
    })
}

/// `success_criteria` entries: LLM-judged metrics with a rubric as `judge` criteria;
/// `keyword_match` with a threshold of 1 (every keyword) as case-insensitive reply checks;
/// policy metrics as `violations max=0`; the rest (see [`classify_metric`]) as comments.
fn success_criteria(criteria: &Value, keywords: Option<&Value>, step: &mut StepOut) {
    let Value::Array(criteria) = criteria else {
        if !criteria.is_null() {
            step.unmapped.push(format!(
                "`success_criteria` {} (not a list)",
                brief(criteria)
            ));
        }
        return;
    };
    for criterion in criteria {
        let Value::Object(c) = criterion else {
            match criterion {
                Value::String(name) if !name.trim().is_empty() => {
                    match classify_metric(name, None, &step.expects) {
                        Metric::Judged => step
                            .expects
                            .push(format!("judge {}", kdl_string(&literal_template(name)))),
                        Metric::NoViolations => step.expects.push("violations max=0".into()),
                        Metric::CoveredBy(what) => step
                            .notes
                            .push(format!("metric `{name}`: checked by {what}")),
                        Metric::Unmapped(why) => step
                            .unmapped
                            .push(format!("`success_criteria` metric `{name}` ({why})")),
                    }
                }
                other => step
                    .unmapped
                    .push(format!("`success_criteria` entry {}", brief(other))),
            }
            continue;
        };
        let metric = c.get("metric").and_then(Value::as_str).unwrap_or("");
        if metric.trim().is_empty() {
            step.unmapped.push(format!(
                "`success_criteria` entry {} (no `metric` name)",
                brief(criterion)
            ));
            continue;
        }
        if c.get("expect_refusal").and_then(Value::as_bool) == Some(true) {
            step.expects
                .push("outcome \"The agent refuses the request.\"".to_owned());
            step.notes.push(format!(
                "metric `{metric}`: checked by the outcome it expects (a refusal)"
            ));
            continue;
        }
        if metric == "keyword_match" {
            match keyword_match(c, keywords) {
                Ok(Some(criterion)) => {
                    step.expects.push(criterion);
                    continue;
                }
                Ok(None) => {}
                Err(why) => {
                    step.unmapped.push(format!(
                        "`success_criteria` entry {} ({why})",
                        brief(criterion)
                    ));
                    continue;
                }
            }
        }
        match classify_metric(metric, Some(c), &step.expects) {
            Metric::Judged => {}
            Metric::NoViolations => {
                step.expects.push("violations max=0".into());
                if let Some(remark) = violations_threshold_remark(metric, c.get("threshold")) {
                    step.unmapped.push(remark);
                }
                continue;
            }
            Metric::CoveredBy(what) => {
                step.notes
                    .push(format!("metric `{metric}`: checked by {what}"));
                continue;
            }
            Metric::Unmapped(why) => {
                step.unmapped.push(format!(
                    "`success_criteria` entry {} ({why})",
                    brief(criterion)
                ));
                continue;
            }
        }
        let task = Some(step.message.as_str()).filter(|t| !t.trim().is_empty());
        match judge_criterion(c, Some(&["expect_refusal", "requires_llm_judge"][..]), task) {
            Ok((criterion, remarks)) => {
                step.expects.push(criterion);
                step.unmapped.extend(remarks);
            }
            Err(why) => step.unmapped.push(format!(
                "`success_criteria` entry {} ({why})",
                brief(criterion)
            )),
        }
    }
}

/// `keyword_match` scored `>= 1`: every keyword appears (case-insensitively) in the reply.
/// The keywords are the criterion's `expected` (a list, or one string), else the node's
/// `keywords`; `Ok(None)` when there are none. A lower threshold over several keywords (a
/// share of them) has no deterministic counterpart: `Err` says so.
fn keyword_match(
    c: &Map<String, Value>,
    keywords: Option<&Value>,
) -> Result<Option<String>, String> {
    let threshold = c.get("threshold").and_then(Value::as_f64).unwrap_or(1.0);
    // A number in the list is looked for as its text (`9999`), as the harness's `str(kw)`
    // does; any other value cannot be, and is not dropped silently.
    let word = |v: &Value| match v {
        Value::String(word) => Ok(word.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("keyword_match keyword {}", brief(other))),
    };
    let words: Vec<String> = match c.get("expected").filter(|e| !e.is_null()).or(keywords) {
        Some(Value::Array(list)) => list.iter().map(word).collect::<Result<_, _>>()?,
        Some(Value::String(w)) => vec![w.clone()],
        Some(v @ (Value::Number(_) | Value::Bool(_))) => vec![word(v)?],
        _ => Vec::new(),
    };
    let words: Vec<String> = words.into_iter().filter(|w| !w.trim().is_empty()).collect();
    if words.is_empty() {
        return Ok(None);
    }
    if threshold < 1.0 && words.len() > 1 {
        return Err(format!(
            "keyword_match needs {threshold} of the {} keywords: trellis checks all of them or \
             one, not a share",
            words.len()
        ));
    }
    let checks: Vec<String> = words
        .iter()
        .map(|w| {
            format!(
                "matches={}",
                kdl_string(&format!("(?i){}", regex::escape(w)))
            )
        })
        .collect();
    Ok(Some(format!("reply {}", checks.join(" "))))
}

/// `{metric, threshold, judge_config?, expected?}` as `judge "STATEMENT" threshold=…
/// rubric=…` (the statement: `expected`, else a `judge_rubric` written as a sentence, else
/// the `task` the criterion's node sends, as "The agent handles this request well: …", else
/// the metric's name), plus what of it was not written (the judge's provider and model:
/// the DSL's judge nodes carry those).
fn judge_criterion(
    c: &Map<String, Value>,
    also_known: Option<&[&str]>,
    task: Option<&str>,
) -> Result<(String, Vec<String>), String> {
    let metric = c
        .get("metric")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .ok_or("no `metric` name")?;
    let mut remarks = Vec::new();
    // What the judge is asked: the file's own words when it has them (`expected`, or a
    // `judge_rubric` written as a question rather than a rubric's name), else the metric's
    // name. A metric id (`luna_judge_score`) alone means nothing to a judge.
    fn sentence(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| t.contains(char::is_whitespace))
    }
    let rubric_text = sentence(c.get("judge_config").and_then(|j| j.get("judge_rubric")));
    let expected = sentence(c.get("expected"));
    let statement = match expected.or(rubric_text) {
        Some(own) => own.to_owned(),
        // A metric id (`luna_judge_score`) asked of a judge is no statement: the node's task
        // is what the harness's judge scored the answer against.
        None => match task {
            Some(task) => format!("The agent handles this request well: {}", task.trim()),
            None => metric.to_owned(),
        },
    };
    let mut out = format!("judge {}", kdl_string(&literal_template(&statement)));
    match c.get("threshold") {
        None | Some(Value::Null) => {}
        Some(t) => {
            let unit = c
                .get("threshold_unit")
                .and_then(Value::as_str)
                .unwrap_or("");
            let percent = matches!(unit, "percent" | "percentage" | "%");
            match t.as_f64().filter(|f| f.is_finite()) {
                Some(f) if (0.0..=1.0).contains(&f) && !percent => {
                    let _ = write!(out, " threshold={}", kdl::KdlValue::Float(f));
                }
                Some(f) if percent && (0.0..=100.0).contains(&f) => {
                    let _ = write!(out, " threshold={}", kdl::KdlValue::Float(f / 100.0));
                }
                // A score out of 100 without a unit (`luna_judge_score` 85): left out, the
                // check would run at the default threshold, another bar than the file's. Up
                // to 10 it may as well be a 0–10 scale: that is not guessed.
                Some(f) if unit.is_empty() && f > 10.0 && f <= 100.0 => {
                    let _ = write!(out, " threshold={}", kdl::KdlValue::Float(f / 100.0));
                    remarks.push(format!(
                        "{metric}: threshold {} read as a percentage ({}: a judge's threshold \
                         is a score from 0 to 1)",
                        brief(t),
                        f / 100.0
                    ));
                }
                _ => remarks.push(format!(
                    "{metric}: threshold {} (a judge's threshold is a score from 0 to 1; the \
                     check is scored against the judge's default threshold)",
                    brief(t)
                )),
            }
        }
    }
    let mut known = vec!["metric", "threshold", "threshold_unit", "threshold_type"];
    if expected.is_some() {
        known.push("expected");
    }
    known.extend(also_known.unwrap_or_default());
    if let Some(config) = c.get("judge_config") {
        known.push("judge_config");
        match config {
            Value::Object(config) => {
                for (key, value) in config {
                    match (key.as_str(), value) {
                        // A rubric's text (sentences), or the name of one: a name trellis
                        // has is written; any other (a misspelt one, a plugin's) would reach
                        // the judge as the rubric's own text, or fail the suite's check.
                        // The statement already, unless `expected` is: then the rubric.
                        ("judge_rubric", Value::String(rubric))
                            if rubric.trim().contains(char::is_whitespace) =>
                        {
                            if expected.is_some() {
                                let _ = write!(out, " rubric={}", kdl_string(rubric.trim()));
                            }
                        }
                        // A name as the harness spells it: case and `-` aside.
                        ("judge_rubric", Value::String(rubric))
                            if let Some(name) = trellis_dsl::lang::decls::BUILT_IN_RUBRICS
                                .into_iter()
                                .find(|n| *n == rubric.trim().to_lowercase().replace('-', "_")) =>
                        {
                            let _ = write!(out, " rubric={}", kdl_string(name));
                        }
                        ("judge_rubric", Value::String(rubric)) => remarks.push(format!(
                            "{metric}: judge_config.judge_rubric `{rubric}` names no rubric \
                             trellis has ({}); judged with the default rubric",
                            trellis_dsl::lang::decls::BUILT_IN_RUBRICS.join(", ")
                        )),
                        (key, value) => remarks.push(format!(
                            "{metric}: judge_config.{key} {} (set it on a `judge` node)",
                            brief(value)
                        )),
                    }
                }
            }
            Value::Null => {}
            other => remarks.push(format!("{metric}: judge_config {}", brief(other))),
        }
    }
    for (key, value) in c {
        if !known.contains(&key.as_str()) {
            remarks.push(format!("{metric}: `{key}` {}", brief(value)));
        }
    }
    Ok((out, remarks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn criterion(assertion: Value) -> Result<String, String> {
        assertion_criterion(&assertion)
    }

    #[test]
    fn assertions_map_to_criteria() {
        assert_eq!(
            criterion(json!({"target": "message", "expected": "Done"})),
            Ok("reply equals=\"Done\"".into())
        );
        assert_eq!(
            criterion(json!({"target": "message", "expected": "regex:refund(ed)?"})),
            Ok("reply matches=\"(?i)refund(ed)?\"".into())
        );
        assert_eq!(
            criterion(json!({"target": "message", "mode": "contains", "expected": ["a.b", "c"]})),
            Ok("reply matches=\"(?:a\\\\.b|c)\"".into())
        );
        assert_eq!(
            criterion(
                json!({"target": "state", "property": "order.total", "mode": "numerical_tolerance", "expected": "9.99"})
            ),
            Ok("state path=\"order.total\" near=9.99".into())
        );
        assert_eq!(
            criterion(json!({"target": "state", "property": "order.paid", "expected": true})),
            Ok("state path=\"order.paid\" equals=#true".into())
        );
        assert_eq!(
            criterion(json!({"target": "tool_calls", "expected": "refund"})),
            Ok("tool \"refund\"".into())
        );
        assert!(
            criterion(json!({"target": "message", "mode": "fuzzy", "expected": "x"}))
                .is_err_and(|e| e.contains("unknown assertion mode `fuzzy`"))
        );
        // Python-only syntax is not silently changed.
        assert!(
            criterion(json!({"target": "message", "mode": "regex", "expected": "(?<=a)b"}))
                .is_err_and(|e| e.contains("not valid"))
        );
    }

    #[test]
    fn scenario_ids_lose_separators_and_control_characters() {
        assert_eq!(scenario_id(" a/b "), Some("a-b".into()));
        assert_eq!(
            scenario_id("we\"ird\nid\t[x]"),
            Some("we\"ird id -x-".into())
        );
        assert_eq!(scenario_id(" \n "), None);
    }

    #[test]
    fn keyword_match_takes_a_list_or_one_word_and_refuses_a_share() {
        let map = |c: Value, keywords: Option<Value>| {
            let Value::Object(c) = c else { panic!() };
            keyword_match(&c, keywords.as_ref())
        };
        assert_eq!(
            map(
                json!({"metric": "keyword_match", "expected": "Refunded"}),
                None
            ),
            Ok(Some("reply matches=\"(?i)Refunded\"".into()))
        );
        assert_eq!(
            map(
                json!({"metric": "keyword_match", "threshold": 1, "expected": ["a", "b"]}),
                None
            ),
            Ok(Some("reply matches=\"(?i)a\" matches=\"(?i)b\"".into()))
        );
        // Without `expected`, the node's keywords.
        assert_eq!(
            map(json!({"metric": "keyword_match"}), Some(json!(["refund"]))),
            Ok(Some("reply matches=\"(?i)refund\"".into()))
        );
        assert!(
            map(
                json!({"metric": "keyword_match", "threshold": 0.5, "expected": ["a", "b"]}),
                None
            )
            .is_err_and(|why| why.contains("0.5 of the 2 keywords"))
        );
        assert_eq!(map(json!({"metric": "keyword_match"}), None), Ok(None));
    }

    #[test]
    fn regexes_never_open_a_template_tag() {
        for (pattern, text) in [
            ("\\{\\{x\\}\\}", "{{x}}"),
            ("a\\{{2}", "a{{"),
            ("x\\{{1,3}\\}", "x{{}"),
        ] {
            let written = search_regex(&json!(pattern)).unwrap_or_else(|e| panic!("{e}"));
            assert!(!written.contains("{{"), "{pattern} -> {written}");
            let compiled = regex::Regex::new(&written).unwrap_or_else(|e| panic!("{e}"));
            assert!(compiled.is_match(text), "{written} on {text}");
        }
        // Python reads `{{x}}` as literal braces; Rust regex syntax does not: reported.
        assert!(search_regex(&json!("{{x}}")).is_err());
    }

    #[test]
    fn nodes_run_in_topological_order_and_cycles_are_errors() {
        let mut reader = Reader::default();
        let nodes = vec![json!({"id": "c"}), json!({"id": "a"}), json!({"id": "b"})];
        let edges = json!([{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]);
        assert_eq!(
            topological_order(&nodes, Some(&edges), &mut reader).ok(),
            Some(vec![1, 2, 0])
        );
        let cycle = json!([{"from": "a", "to": "b"}, {"from": "b", "to": "a"}]);
        assert!(matches!(
            topological_order(&nodes, Some(&cycle), &mut reader),
            Err(ScenarioError::Cycle(ids)) if ids == "`a`, `b`"
        ));
    }
}
