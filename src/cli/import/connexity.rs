//! `trellis import connexity FILE|DIR`: Connexity test cases to suites.
//!
//! A file holds one case (an object), several (an array) or `{"test_cases": […]}`, in either
//! shape Connexity uses (docs/wire.md, "Connexity test cases"): the 1.0.0 schema document
//! (`persona{type,description,
//! instructions}`, `initial_message`, `expected_outcomes` as a dict) or the reference
//! implementation's files (`persona_context`, `first_turn`/`first_message`, outcome lists,
//! `expected_tool_calls[].mock_responses`). A file becomes one suite, each case one scenario
//! played by the simulator (`simulate until-done`) and judged on its outcomes and expected
//! tool calls. `expected_tool_calls[].mock_responses` become scenario `tool` nodes whose
//! `sequence` outputs carry the expected params (the sandbox then answers as Connexity's
//! `MockToolExecutor` does, for agents whose tools the engine runs). Whatever has no Trellis
//! counterpart is reported per file and written into the suite as comments, never dropped
//! silently.
//!
//! The command line, the directory layout (`OUT/agents.kdl` included by every suite), the
//! exit codes and the check-back of written suites are those of `trellis import multiagent`,
//! whose helpers this module reuses.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use rayon::prelude::*;
use serde_json::{Map, Value};

use super::super::console::{count, errln};
use super::super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};
use super::agents_file::{AgentsFile, WantedAgent};
use super::multiagent::{Written, check_text, collect_json, fits, write_checked};
use super::{AGENTS_FILE, comment, is_simple_id, json_kind, kdl_string, literal_template};

/// The agent id used when none is given.
const DEFAULT_AGENT_ID: &str = "connexity";
/// The builtin reference agent the suites run against by default.
const DEFAULT_BUILTIN: &str = "booking";

#[derive(Debug, Args)]
pub struct ConnexityImportArgs {
    /// A test-case file (JSON: one case, an array of cases or `{"test_cases": […]}`), or a
    /// directory: every `*.json` file below it is imported.
    source: PathBuf,
    /// Where to write: for a file, the suite file (default: standard output); for a
    /// directory, the output directory (required), mirroring the source tree, plus
    /// `agents.kdl`.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Replace files that already exist where the suites are written.
    #[arg(long)]
    replace: bool,
    /// The id of the agent every scenario runs against. Default: for a file imported to
    /// `--out FILE`, that file's name without its extension (so suites imported side by side
    /// do not define the same agent), else `connexity`.
    #[arg(long, value_name = "ID")]
    agent_id: Option<String>,
    /// Run every suite against the Connexity agent served at this URL (`POST URL`, e.g.
    /// http://127.0.0.1:8000/agent/respond).
    #[arg(long, value_name = "URL", group = "endpoint")]
    agent_url: Option<String>,
    /// Run every suite against a builtin Connexity agent (default: `booking`).
    #[arg(long, value_name = "NAME", group = "endpoint")]
    agent_builtin: Option<String>,
    /// Do not load each written suite back to check it (`trellis check OUT` does the same
    /// afterwards).
    #[arg(long)]
    no_check: bool,
    /// Only print the summary and the files that could not be imported, not what each file
    /// left unmapped (that is still written into each suite as comments).
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// One test-case file, mapped.
#[derive(Debug, Default)]
struct CaseFile {
    cases: Vec<Case>,
    /// What could not be mapped, each item naming its case.
    unmapped: Vec<String>,
}

/// One test case as the lines of its scenario.
#[derive(Debug, Default)]
struct Case {
    id: String,
    /// The id its name gives, before `-2`, `-3`… made it unique in its file.
    base_id: String,
    /// The case's own `id` (the platform's database id), when it has one.
    case_id: Option<String>,
    /// Settings, one KDL line each (without indentation).
    settings: Vec<String>,
    /// `persona type=… { … }`, written as a block.
    persona: Option<(String, Option<String>, Option<String>)>,
    /// `criteria { … }` lines.
    criteria: Vec<String>,
    /// Comments at the head of the scenario (database fields, approximations).
    notes: Vec<String>,
    /// Scenario `tool` nodes from `mock_responses`: per tool (in the order first named), its
    /// `output …` lines in order (several `expected_tool_calls` of one tool share one queue,
    /// as the reference's `MockToolExecutor` builds it).
    mock_tools: Vec<(String, Vec<String>)>,
}

/// `(scenario id, case id)` of each scenario of a suite this importer wrote that notes its
/// case's `id` (`    // id: …`, right after the `scenario` line and its other notes).
fn scenario_case_ids(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut scenario: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("scenario ") {
            scenario = rest
                .trim_end()
                .strip_suffix('{')
                .map(str::trim)
                .and_then(|id| serde_json::from_str::<String>(id).ok());
        } else if let Some(case_id) = line.strip_prefix("    // id: ") {
            if let Some(id) = scenario.take() {
                found.push((id, case_id.trim().to_owned()));
            }
        } else if !line.starts_with("    //") {
            scenario = None;
        }
    }
    found
}

/// The scenario ids given in one suite. A case whose id is taken gets the first of `ID-2`,
/// `ID-3`… that is not; each id's next number is kept, and the taken ids are a set: a file
/// of 10,000 cases under 50 names searched a list of every id for each number it tried, and
/// took 6.6 s to import.
#[derive(Default)]
struct UniqueIds {
    taken: HashSet<String>,
    next: HashMap<String, usize>,
}

impl UniqueIds {
    /// Takes `id` as it is; false when it was taken.
    fn take(&mut self, id: &str) -> bool {
        self.taken.insert(id.to_owned())
    }

    /// `base` when it is free, else the first of `base-2`, `base-3`… that is; taken now.
    fn unique(&mut self, base: &str) -> String {
        if self.take(base) {
            return base.to_owned();
        }
        // Ids are never given back, so every number below the kept one is still taken.
        let n = self.next.entry(base.to_owned()).or_insert(2);
        loop {
            let id = format!("{base}-{n}");
            *n += 1;
            if self.taken.insert(id.clone()) {
                return id;
            }
        }
    }
}

/// The fields that make an object a test case, in either shape the importer reads: what the
/// simulator plays or the judge checks (`name`, `description`, `tags` and `status` alone
/// are any JSON file's: a `package.json` has a `name`).
const CASE_FIELDS: &[&str] = &[
    "difficulty",
    "persona",
    "persona_context",
    "initial_message",
    "first_message",
    "first_turn",
    "user_context",
    "max_turns",
    "expected_outcomes",
    "expected_tool_calls",
    "evaluation_criteria_override",
];

impl CaseFile {
    fn parse(bytes: &[u8], stem: &str) -> Result<CaseFile, String> {
        if let Some(why) = super::not_utf8(bytes) {
            return Err(why);
        }
        let bytes = super::without_bom(bytes);
        let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let mut file = CaseFile::default();
        let cases: Vec<Value> = match value {
            Value::Array(items) => items,
            Value::Object(mut map) => match map.remove("test_cases") {
                Some(Value::Array(items)) => {
                    for key in map.keys() {
                        file.unmapped
                            .push(format!("`{key}` next to `test_cases` (not a case field)"));
                    }
                    items
                }
                Some(other) => {
                    return Err(format!(
                        "`test_cases` is {}, not an array of test cases",
                        json_kind(&other)
                    ));
                }
                // A file of one case: any JSON object would otherwise become an empty
                // scenario (a `package.json` in the directory, a MultiAgentEval file given
                // to this importer).
                None if !map.keys().any(|k| CASE_FIELDS.contains(&k.as_str())) => {
                    let mut fields: Vec<&str> = map.keys().map(String::as_str).take(5).collect();
                    if map.len() > fields.len() {
                        fields.push("…");
                    }
                    return Err(format!(
                        "not a Connexity test case: none of its fields ({}) says what to play \
                         or check (`persona`, `initial_message`, `expected_outcomes`, …)",
                        if fields.is_empty() {
                            "it has none".to_owned()
                        } else {
                            fields.join(", ")
                        }
                    ));
                }
                None => vec![Value::Object(map)],
            },
            other => {
                return Err(format!(
                    "the file holds {}, not a test case, an array of them or \
                     {{\"test_cases\": […]}}",
                    json_kind(&other)
                ));
            }
        };
        if cases.is_empty() {
            return Err("the file holds no test cases".into());
        }
        let many = cases.len() > 1;
        let mut ids = UniqueIds::default();
        for (index, case) in cases.into_iter().enumerate() {
            // One case that is not an object loses only itself: the file's other cases
            // are still imported.
            let Value::Object(map) = case else {
                file.unmapped.push(format!(
                    "test case {} is {}, not an object (not imported)",
                    index + 1,
                    json_kind(&case)
                ));
                continue;
            };
            let mut case = Case::from_map(map, stem, index, many, &mut file.unmapped);
            // A case whose scenario would be over what one suite node may hold (a document
            // in its context) loses only itself; the agent's id, not known here, is a line
            // the margin covers.
            let mut block = String::new();
            case.render(&mut block, "");
            let limit = trellis_dsl::depth::MAX_NODE_SIZE - 1024;
            if block.len() > limit {
                file.unmapped.push(format!(
                    "test case {} (`{}`) would be {} KiB of KDL, over the {} KiB one top-level \
                     node of a suite may hold (docs/language.md, \"Limits\"); not imported",
                    index + 1,
                    case.id,
                    block.len().div_ceil(1024),
                    trellis_dsl::depth::MAX_NODE_SIZE / 1024
                ));
                continue;
            }
            // Scenario ids are unique per suite.
            case.base_id = case.id.clone();
            case.id = ids.unique(&case.base_id);
            file.cases.push(case);
        }
        if file.cases.is_empty() {
            return Err(format!(
                "no test case of the file can be imported: {}",
                file.unmapped.join("; ")
            ));
        }
        Ok(file)
    }

    /// Gives each case with a database `id` the scenario id it had in `previous`, the suite
    /// an earlier import wrote from this file: a case renamed, or another inserted before
    /// one of the same name, keeps its scenario id, and with it its history and comparisons.
    /// The other cases take their own ids around those (`-2`, `-3`… on a clash).
    fn keep_ids(&mut self, previous: &str) {
        let earlier = scenario_case_ids(previous);
        if earlier.is_empty() {
            return;
        }
        // The first scenario that noted each case id.
        let mut earlier_of: HashMap<&str, &str> = HashMap::with_capacity(earlier.len());
        for (scenario, case_id) in &earlier {
            earlier_of.entry(case_id).or_insert(scenario);
        }
        let mut taken = UniqueIds::default();
        let mut kept = vec![false; self.cases.len()];
        for (case, kept) in self.cases.iter_mut().zip(&mut kept) {
            // As the note wrote it (escaped, trimmed).
            let noted = case.case_id.as_ref().map(|c| {
                let mut line = String::new();
                comment(&mut line, "    ", &format!("id: {c}"));
                line.lines()
                    .next()
                    .and_then(|l| l.strip_prefix("    // id: "))
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            });
            let Some(id) = noted
                .as_deref()
                .and_then(|c| earlier_of.get(c))
                .map(|scenario| (*scenario).to_owned())
            else {
                continue;
            };
            if taken.take(&id) {
                case.id = id;
                *kept = true;
            }
        }
        for (case, kept) in self.cases.iter_mut().zip(&kept) {
            if !*kept {
                case.id = taken.unique(&case.base_id);
            }
        }
    }

    fn render(&self, suite: &str, agent: &str, source: &str, preamble: &str) -> String {
        let mut out = String::with_capacity(4096);
        comment(
            &mut out,
            "",
            &format!("Imported by `trellis import connexity` from {source}."),
        );
        comment(
            &mut out,
            "",
            "The scenarios need a simulator and a judge: a `provider` (and optionally\n\
             `simulator`/`judge`) node in any file loaded with this suite; without one they are\n\
             skipped with a reason.",
        );
        if !self.unmapped.is_empty() {
            comment(&mut out, "", "Not mapped (reported by the import):");
            for item in &self.unmapped {
                comment(&mut out, "", &format!("- {item}"));
            }
        }
        out.push('\n');
        out.push_str(preamble);
        let _ = writeln!(
            out,
            "suite {} {{\n    description {}\n    tags \"connexity\" \"imported\"\n}}",
            kdl_string(suite),
            kdl_string(&format!("Connexity test cases {source}"))
        );
        for case in &self.cases {
            out.push('\n');
            case.render(&mut out, agent);
        }
        out
    }
}

impl Case {
    /// The case's `scenario` node, against `agent`.
    fn render(&self, out: &mut String, agent: &str) {
        let case = self;
        let _ = writeln!(out, "scenario {} {{", kdl_string(&case.id));
        for note in &case.notes {
            comment(out, "    ", note);
        }
        let _ = writeln!(out, "    agent {}", kdl_string(agent));
        // The schema's field order, whatever order the file had.
        let mut settings: Vec<&String> = case.settings.iter().collect();
        settings.sort_by_key(|line| setting_rank(line));
        for line in settings {
            let _ = writeln!(out, "    {line}");
        }
        if let Some((kind, description, instructions)) = &case.persona {
            if description.is_none() && instructions.is_none() {
                // No empty block: `trellis fmt` would rewrite one.
                let _ = writeln!(out, "    persona type={}", kdl_string(kind));
            } else {
                let _ = writeln!(out, "    persona type={} {{", kdl_string(kind));
                if let Some(d) = description {
                    let _ = writeln!(out, "        description {}", kdl_string(d));
                }
                if let Some(i) = instructions {
                    let _ = writeln!(out, "        instructions {}", kdl_string(i));
                }
                out.push_str("    }\n");
            }
        }
        if !case.mock_tools.is_empty() {
            out.push('\n');
            comment(
                out,
                "    ",
                "The case's `mock_responses`: the answers to an agent under test whose tools the\n\
             engine runs (`openai`, `anthropic`), in order, each taken by the first call\n\
             matching its params. A Connexity agent under test runs its own tools and\n\
             ignores them (not an error).",
            );
            for (tool, outputs) in &case.mock_tools {
                let _ = writeln!(out, "    tool {} {{", kdl_string(tool));
                out.push_str("        sequence when-exhausted=\"error\" {\n");
                for line in outputs {
                    let _ = writeln!(out, "            {line}");
                }
                out.push_str("        }\n    }\n");
            }
        }
        out.push_str("\n    simulate until-done\n");
        if !case.criteria.is_empty() {
            out.push_str("\n    criteria {\n");
            for line in &case.criteria {
                let _ = writeln!(out, "        {line}");
            }
            out.push_str("    }\n");
        }
        out.push_str("}\n");
    }

    fn from_map(
        mut map: Map<String, Value>,
        stem: &str,
        index: usize,
        many: bool,
        unmapped: &mut Vec<String>,
    ) -> Case {
        let name = map.get("name").and_then(Value::as_str).map(str::to_owned);
        let label = match (&name, many) {
            (Some(name), false) => name.clone(),
            (Some(name), true) => format!("test case {} ({name})", index + 1),
            (None, _) => format!("test case {}", index + 1),
        };
        let mut lost = |what: String| unmapped.push(format!("{label}: {what}"));
        let mut case = Case {
            id: name
                .as_deref()
                .map(slug)
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| format!("{}-{}", slug(stem), index + 1)),
            ..Case::default()
        };
        match name.as_deref().map(str::trim) {
            None => lost(
                "no `name` (required by the schema); the scenario is named after the file".into(),
            ),
            // Required as a human-readable name: an empty one names nothing.
            Some("") => lost(
                "`name` is empty (required: a short human-readable name); the scenario is \
                 named after the file"
                    .into(),
            ),
            Some(_) => {}
        }
        // Imported whole, but said: the platform would refuse the case as it stands.
        if let Some(long) = name.as_deref().filter(|n| n.chars().count() > 255) {
            lost(format!(
                "`name` is {} characters, over the schema's 255 (imported as it is)",
                long.chars().count()
            ));
        }

        let first_turn = map.remove("first_turn");
        let first_message = map.remove("first_message");
        let initial_message = map.remove("initial_message");
        let persona_context = map.remove("persona_context");
        let persona = map.remove("persona");
        for (key, value) in map {
            match (key.as_str(), value) {
                ("name", Value::String(text)) if text.trim().is_empty() => {}
                ("name", Value::String(text)) => {
                    case.settings.push(format!("name {}", kdl_string(&text)));
                }
                (_, Value::Null) => {}
                ("description", Value::String(text)) => {
                    case.settings
                        .push(format!("description {}", kdl_string(&text)));
                }
                ("difficulty", Value::String(text))
                    if matches!(text.as_str(), "normal" | "hard") =>
                {
                    case.settings
                        .push(format!("difficulty {}", kdl_string(&text)));
                }
                ("status", Value::String(text))
                    if matches!(text.as_str(), "active" | "draft" | "archived") =>
                {
                    if text != "active" {
                        case.notes.push(format!(
                            "status {text}: runs only with `trellis run --include-inactive`"
                        ));
                    }
                    case.settings.push(format!("status {}", kdl_string(&text)));
                }
                ("tags", Value::Array(tags)) => {
                    let mut line = String::from("tags");
                    for tag in &tags {
                        match tag.as_str() {
                            Some(t) => {
                                line.push(' ');
                                line.push_str(&kdl_string(t));
                            }
                            None => lost(format!("a tag that is {}", json_kind(tag))),
                        }
                    }
                    if line != "tags" {
                        case.settings.push(line);
                    }
                }
                ("user_context", Value::Object(context)) => {
                    let json = Value::Object(context).to_string();
                    case.settings
                        .push(format!("user-context json={}", kdl_string(&json)));
                }
                ("max_turns", Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {
                    case.settings.push(format!("max-turns {n}"));
                }
                ("expected_outcomes", Value::Object(outcomes)) => {
                    for (label, value) in outcomes {
                        match value {
                            Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Null => {
                                let value = match &value {
                                    Value::String(text) => kdl_string(&literal_template(text)),
                                    other => kdl_value(other),
                                };
                                case.settings
                                    .push(format!("outcome {}={value}", kdl_key(&label),));
                            }
                            other => {
                                // A KDL property holds no object or array: the judge reads
                                // the same expectation as a statement.
                                case.notes.push(format!(
                                    "outcome `{label}` is {}: written as a statement",
                                    json_kind(&other)
                                ));
                                case.settings.push(format!(
                                    "outcome {}",
                                    kdl_string(&literal_template(&format!("{label}: {other}")))
                                ));
                            }
                        }
                    }
                }
                ("expected_outcomes", Value::Array(statements)) => {
                    for statement in statements {
                        match statement {
                            Value::String(text) => {
                                case.settings.push(format!(
                                    "outcome {}",
                                    kdl_string(&literal_template(&text))
                                ));
                            }
                            other => lost(format!(
                                "an expected outcome that is {}, not a statement",
                                json_kind(&other)
                            )),
                        }
                    }
                }
                ("expected_tool_calls", Value::Array(calls)) => {
                    if calls.is_empty() {
                        case.notes
                            .push("expected_tool_calls: [] means no tool may be called".to_owned());
                        case.criteria.push("no-tool".to_owned());
                    }
                    for (i, call) in calls.into_iter().enumerate() {
                        expected_tool_call(&mut case, i, call, &mut lost);
                    }
                }
                ("evaluation_criteria_override", Value::String(text)) => {
                    case.settings.push(format!(
                        "criteria-override {}",
                        kdl_string(&literal_template(&text))
                    ));
                    // The platform's judge scores every case, with this text instead of its
                    // default rubric: a `judge` check (whose rubric the override is) does
                    // that here; without it the override would be read by no judge.
                    if !text.trim().is_empty() {
                        case.criteria.push(
                            "judge \"The agent meets this test case's evaluation criteria\""
                                .to_owned(),
                        );
                    }
                }
                // The case's id is what the platform sends as `metadata.test_case_id`: an
                // agent that looks its case up by it gets it (the note keeps a re-import's
                // scenario ids).
                ("id", value) => {
                    let id = scalar_text(&value);
                    case.settings
                        .push(format!("test-case-id {}", kdl_string(&id)));
                    case.notes.push(format!("id: {id}"));
                    case.case_id = Some(id);
                }
                ("created_at" | "updated_at", value) => {
                    case.notes.push(format!("{key}: {}", scalar_text(&value)));
                    lost(format!("`{key}` (a database field; kept as a comment)"));
                }
                (key, value) => lost(format!("`{key}` {}", brief(&value))),
            }
        }

        match (persona, persona_context) {
            (Some(Value::Object(mut p)), context) => {
                // A persona field that is not text (a list of instructions, a number) is
                // written as its JSON text, and said: never lost silently.
                let mut text = |p: &mut Map<String, Value>, key: &str| match p.remove(key) {
                    Some(Value::String(s)) => Some(s),
                    None | Some(Value::Null) => None,
                    Some(other) => {
                        lost(format!(
                            "`persona.{key}` is {}: written as its JSON text",
                            json_kind(&other)
                        ));
                        Some(other.to_string())
                    }
                };
                let kind = text(&mut p, "type");
                let description = text(&mut p, "description");
                let instructions = text(&mut p, "instructions");
                let kind = kind.unwrap_or_else(|| {
                    lost("`persona.type` missing; written as `user`".into());
                    "user".to_owned()
                });
                for (key, value) in p {
                    lost(format!("`persona.{key}` {}", brief(&value)));
                }
                case.persona = Some((kind, description, instructions));
                if let Some(c) = context.filter(|c| !c.is_null()) {
                    lost(format!("`persona_context` next to `persona` {}", brief(&c)));
                }
            }
            (None | Some(Value::Null), Some(Value::String(context))) => {
                // The reference files write description, a blank line, instructions.
                let (description, instructions) = match context.split_once("\n\n") {
                    Some((d, i)) => (d.trim().to_owned(), Some(i.trim().to_owned())),
                    None => (context.trim().to_owned(), None),
                };
                case.persona = Some((
                    "persona-context".to_owned(),
                    Some(description),
                    instructions,
                ));
            }
            (None | Some(Value::Null), None | Some(Value::Null)) => {}
            (persona, context) => {
                if let Some(p) = persona.filter(|p| !p.is_null()) {
                    lost(format!("`persona` {}", brief(&p)));
                }
                if let Some(c) = context.filter(|c| !c.is_null()) {
                    lost(format!("`persona_context` {}", brief(&c)));
                }
            }
        }

        let agent_first = match first_turn {
            None | Some(Value::Null) => false,
            Some(Value::String(who)) if who == "user" => false,
            Some(Value::String(who)) if who == "agent" => true,
            Some(other) => {
                lost(format!("`first_turn` {}", brief(&other)));
                false
            }
        };
        let opener = match (initial_message, first_message) {
            (Some(Value::String(text)), other) => {
                if let Some(other) = other.filter(|o| !o.is_null()) {
                    lost(format!(
                        "`first_message` next to `initial_message` {}",
                        brief(&other)
                    ));
                }
                Some(text)
            }
            (_, Some(Value::String(text))) if agent_first => {
                // The agent's scripted greeting opens the conversation as the agent's
                // message: the first request carries it before the user's answer, and the
                // agent is not asked for a greeting of its own (`messages: []` is for a
                // case without one).
                let opening = serde_json::json!([{"role": "assistant", "content": text}]);
                case.settings.push(format!(
                    "history {}",
                    kdl_string(&literal_template(&opening.to_string()))
                ));
                None
            }
            (_, Some(Value::String(text))) => Some(text),
            (initial, first) => {
                for (key, value) in [("initial_message", initial), ("first_message", first)] {
                    if let Some(v) = value.filter(|v| !v.is_null()) {
                        lost(format!("`{key}` {}", brief(&v)));
                    }
                }
                None
            }
        };
        // The agent speaks first and is asked for its greeting (no scripted one).
        if agent_first
            && !case
                .settings
                .iter()
                .any(|line| line.starts_with("history "))
        {
            case.settings.push("first-turn \"agent\"".to_owned());
        }
        if let Some(text) = opener {
            case.settings.push(format!(
                "initial-message {}",
                kdl_string(&literal_template(&text))
            ));
        }
        // The platform's judge scores every case, one with nothing else to check too (a
        // red-team case: a persona and an opening message): without a check, its
        // trajectories would be skipped, never judged.
        let checks_something = !case.criteria.is_empty()
            || case
                .settings
                .iter()
                .any(|line| line.starts_with("outcome ") || line.starts_with("expect-tool "));
        if !checks_something {
            case.criteria
                .push("judge \"The agent meets this test case's evaluation criteria\"".to_owned());
            case.notes.push(
                "no expected outcome, tool call or criteria override: judged as the platform \
                 judges every case"
                    .to_owned(),
            );
        }
        case
    }
}

/// One entry of `expected_tool_calls`: an `expect-tool` setting.
fn expected_tool_call(case: &mut Case, index: usize, call: Value, lost: &mut impl FnMut(String)) {
    let Value::Object(mut call) = call else {
        lost(format!(
            "`expected_tool_calls[{index}]` is {}, not an object",
            json_kind(&call)
        ));
        return;
    };
    let Some(Value::String(tool)) = call.remove("tool") else {
        lost(format!("`expected_tool_calls[{index}]` names no `tool`"));
        return;
    };
    if tool.trim().is_empty() {
        lost(format!(
            "`expected_tool_calls[{index}]` has an empty tool name"
        ));
        return;
    }
    let mut line = format!("expect-tool {}", kdl_string(&tool));
    for (key, value) in call {
        match (key.as_str(), value) {
            ("expected_params", Value::Object(params)) => {
                // A param named `count` (`expect-tool`'s own number of calls) or holding an
                // object or a list goes in `params-json`, which writes any of them.
                let mut as_json = serde_json::Map::new();
                for (param, value) in params {
                    match value {
                        Value::String(s) if param != "count" => {
                            let v = kdl_string(&literal_template(&s));
                            let _ = write!(line, " {}={v}", kdl_key(&param));
                        }
                        Value::Bool(_) | Value::Number(_) | Value::Null if param != "count" => {
                            let _ = write!(line, " {}={}", kdl_key(&param), kdl_value(&value));
                        }
                        Value::String(s) => {
                            as_json.insert(param, Value::String(literal_template(&s)));
                        }
                        value => {
                            as_json.insert(param, value);
                        }
                    }
                }
                write_params_json(&mut line, as_json);
            }
            ("expected_params" | "mock_responses", Value::Null) => {}
            ("mock_responses", Value::Array(mocks)) => {
                let outputs = mock_outputs(index, mocks, lost);
                if !outputs.is_empty() {
                    match case.mock_tools.iter_mut().find(|(name, _)| *name == tool) {
                        Some((_, queue)) => queue.extend(outputs),
                        None => case.mock_tools.push((tool.clone(), outputs)),
                    }
                }
            }
            (key, value) => lost(format!(
                "`expected_tool_calls[{index}].{key}` {}",
                brief(&value)
            )),
        }
    }
    case.settings.push(line);
}

/// `mock_responses [{expected_params?, response}]` as a sequence's `output` lines: the
/// response as JSON text, each expected param a property (matched as Connexity matches
/// them, see docs/language.md), and a param KDL cannot write as a property (an object or a
/// list) in `params-json`.
fn mock_outputs(index: usize, mocks: Vec<Value>, lost: &mut impl FnMut(String)) -> Vec<String> {
    let mut outputs = Vec::with_capacity(mocks.len());
    for (i, mock) in mocks.into_iter().enumerate() {
        let at = format!("`expected_tool_calls[{index}].mock_responses[{i}]");
        let Value::Object(mut mock) = mock else {
            lost(format!("{at}` is {}, not an object", json_kind(&mock)));
            continue;
        };
        let Some(response) = mock.remove("response") else {
            lost(format!("{at}` has no `response`"));
            continue;
        };
        // A string is the tool's answer as it is (the platform hands it to the agent
        // verbatim; one holding JSON is read as that JSON, as the DSL reads `output`); anything
        // else as JSON. A string holding JSON was written as a JSON string literal, and the
        // agent got the answer quoted.
        let written = match &response {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let mut line = format!("output {}", kdl_string(&written));
        for (key, value) in mock {
            match (key.as_str(), value) {
                ("expected_params", Value::Object(params)) => {
                    let mut as_json = serde_json::Map::new();
                    for (param, value) in params {
                        match &value {
                            Value::String(_) | Value::Bool(_) | Value::Number(_) | Value::Null => {
                                let _ = write!(line, " {}={}", kdl_key(&param), kdl_value(&value));
                            }
                            _ => {
                                as_json.insert(param, value);
                            }
                        }
                    }
                    write_params_json(&mut line, as_json);
                }
                ("expected_params", Value::Null) => {}
                ("expected_params", other) => lost(format!(
                    "{at}.expected_params` {} is not an object (not matched: this answer takes \
                     any call)",
                    brief(&other)
                )),
                (key, value) => lost(format!("{at}.{key}` {}", brief(&value))),
            }
        }
        outputs.push(line);
    }
    outputs
}

/// ` params-json="{…}"` after a line's `KEY=VALUE`s, for the params none can write.
fn write_params_json(line: &mut String, params: serde_json::Map<String, Value>) {
    if !params.is_empty() {
        let text = Value::Object(params).to_string();
        let _ = write!(line, " params-json={}", kdl_string(&text));
    }
}

/// Where a setting line goes among the scenario's settings (stable for equal ranks).
fn setting_rank(line: &str) -> usize {
    const ORDER: [&str; 14] = [
        "name",
        "description",
        "difficulty",
        "tags",
        "status",
        "first-turn",
        "history",
        "initial-message",
        "user-context",
        "max-turns",
        "outcome",
        "expect-tool",
        "criteria-override",
        "",
    ];
    let node = line.split([' ', '=']).next().unwrap_or_default();
    ORDER.iter().position(|n| *n == node).unwrap_or(ORDER.len())
}

/// A property key: bare when KDL reads it back as the same identifier, else quoted.
fn kdl_key(key: &str) -> String {
    let mut chars = key.chars();
    let bare = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(key, "true" | "false" | "null" | "inf" | "nan");
    if bare {
        key.to_owned()
    } else {
        kdl_string(key)
    }
}

/// A JSON scalar as a KDL value.
fn kdl_value(value: &Value) -> String {
    match value {
        Value::String(s) => kdl_string(s),
        Value::Bool(true) => "#true".into(),
        Value::Bool(false) => "#false".into(),
        Value::Null => "#null".into(),
        Value::Number(n) => n.to_string(),
        other => kdl_string(&other.to_string()),
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `(VALUE)`, shortened, for the report.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("({cut}…)")
    } else {
        format!("({text})")
    }
}

/// A scenario id from a case name: lower case letters and digits, `-` between words.
fn slug(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

pub fn import_connexity(args: &ConnexityImportArgs) -> u8 {
    let started = Instant::now();
    if let Some(id) = &args.agent_id
        && !is_simple_id(id)
    {
        errln!("error: --agent-id `{id}` must be letters, digits, `_` or `-`");
        return EXIT_INVALID;
    }
    let is_dir = match std::fs::metadata(&args.source) {
        Ok(metadata) => metadata.is_dir(),
        Err(e) => {
            errln!("error: {}: {e}", args.source.display());
            return EXIT_INVALID;
        }
    };
    let agent_id = args.agent_id.clone().unwrap_or_else(|| {
        super::multiagent::default_agent_id(is_dir, args.out.as_deref(), DEFAULT_AGENT_ID)
    });
    let endpoint = match &args.agent_url {
        Some(url) => format!("url={}", kdl_string(url)),
        None => format!(
            "builtin={}",
            kdl_string(args.agent_builtin.as_deref().unwrap_or(DEFAULT_BUILTIN))
        ),
    };
    let agents_text = format!(
        "agent {} protocol=\"connexity\" {endpoint}\n",
        kdl_string(&agent_id)
    );
    if let Err(e) = check_text(&agents_text) {
        errln!("error: the agent options do not make a valid agent:\n{e}");
        return EXIT_INVALID;
    }

    let inputs: Vec<(PathBuf, PathBuf)> = if is_dir {
        if !super::multiagent::directory_out(&args.source, args.out.as_deref()) {
            return EXIT_INVALID;
        }
        let mut files = Vec::new();
        let mut ignored = Vec::new();
        if let Err(e) = collect_json(&args.source, &mut files, &mut ignored) {
            errln!("error: {e}");
            return EXIT_INVALID;
        }
        files.sort();
        if !args.quiet {
            super::multiagent::report_ignored(&args.source, &mut ignored);
        }
        files
            .into_iter()
            .map(|input| {
                let relative = input
                    .strip_prefix(&args.source)
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|_| input.clone());
                (input, relative)
            })
            .collect()
    } else {
        vec![(
            args.source.clone(),
            PathBuf::from(args.source.file_name().unwrap_or_default()),
        )]
    };
    if inputs.is_empty() {
        errln!(
            "error: {} holds no .json test-case files",
            args.source.display()
        );
        return EXIT_INVALID;
    }

    let parsed: Vec<Result<CaseFile, String>> = inputs
        .par_iter()
        .map(|(input, relative)| {
            let stem = input
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("case")
                .to_owned();
            let mut file = std::fs::read(input)
                .map_err(|e| e.to_string())
                .and_then(|bytes| CaseFile::parse(&bytes, &stem))?;
            // Importing again: each case keeps the scenario id it was given before.
            let target = match &args.out {
                Some(out) if is_dir => Some(out.join(relative.with_extension("kdl"))),
                out => out.clone(),
            };
            if args.replace
                && let Some(previous) = target.and_then(|t| std::fs::read_to_string(t).ok())
            {
                file.keep_ids(&previous);
            }
            Ok(file)
        })
        .collect();

    // Suites of an earlier import into the directory that this one did not write.
    let mut left = Vec::new();
    let results: Vec<Result<Written, String>> = if is_dir {
        let Some(out) = args.out.as_deref() else {
            return EXIT_INVALID;
        };
        let agents_path = out.join(AGENTS_FILE);
        let targets: Vec<PathBuf> = inputs
            .iter()
            .map(|(_, relative)| out.join(relative.with_extension("kdl")))
            .collect();
        if !args.replace {
            let existing = std::iter::once(&agents_path)
                .chain(
                    targets
                        .iter()
                        .zip(&parsed)
                        .filter(|(_, p)| p.is_ok())
                        .map(|(t, _)| t),
                )
                .find(|p| p.exists());
            if let Some(path) = existing {
                errln!(
                    "error: {} exists; pass --replace to replace the files this import writes",
                    path.display()
                );
                return EXIT_INVALID;
            }
        }
        if let Err(e) = std::fs::create_dir_all(out) {
            errln!("error: {}: {e}", out.display());
            return EXIT_INVALID;
        }
        // `--replace` keeps the agents file's agents (agents_file.rs).
        let existing = if args.replace {
            match AgentsFile::read(&agents_path) {
                Ok(existing) => existing,
                Err(e) => {
                    errln!("error: {e}");
                    return EXIT_INVALID;
                }
            }
        } else {
            None
        };
        let merged = existing.map(|file| {
            file.merge(&[WantedAgent {
                id: agent_id.clone(),
                text: agents_text.clone(),
                explicit: args.agent_url.is_some() || args.agent_builtin.is_some(),
                like: None,
            }])
        });
        let agents_file = match &merged {
            Some(merged) => merged.text.clone(),
            None => {
                let mut header = String::new();
                comment(
                    &mut header,
                    "",
                    "The agent the suites imported by `trellis import connexity` run against; \
                     edit its\nendpoint here (url= or builtin=), and add a `provider` for the \
                     simulator and judge.",
                );
                format!("{header}\n{agents_text}")
            }
        };
        if let Err(e) = super::write_file(&agents_path, &agents_file, true) {
            errln!("error: could not write the agents file: {e}");
            return EXIT_INVALID;
        }
        if let Some(merged) = &merged {
            errln!("{}", merged.note(&agents_path));
        }
        // `sub/refund.json` and `sub.refund.json` both read `sub.refund`: suite names must
        // differ (`-2`, `-3`… on a clash), or the suites do not load together.
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let suites: Vec<String> = inputs
            .iter()
            .map(|(_, relative)| {
                let name = relative
                    .with_extension("")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(".");
                let count = seen.entry(name.clone()).or_insert(0);
                *count += 1;
                if *count > 1 {
                    format!("{name}-{count}")
                } else {
                    name
                }
            })
            .collect();
        let results: Vec<Result<Written, String>> = inputs
            .par_iter()
            .zip(&parsed)
            .zip(&targets)
            .zip(&suites)
            .map(|((((input, relative), file), target), suite)| {
                let Ok(file) = file else {
                    return Ok(Written::Written);
                };
                if *target == agents_path {
                    return Err(format!(
                        "its suite would be written over the agents file {}",
                        agents_path.display()
                    ));
                }
                let depth = relative.components().count().saturating_sub(1);
                let include = format!("{}{AGENTS_FILE}", "../".repeat(depth));

                let text = file.render(
                    suite,
                    &agent_id,
                    &input.display().to_string(),
                    &format!("include {}\n\n", kdl_string(&include)),
                );
                write_checked(target, &text, args.replace, !args.no_check)
            })
            .collect();
        if args.replace {
            let imported: std::collections::HashSet<PathBuf> = results
                .iter()
                .zip(&parsed)
                .zip(&targets)
                .filter(|((r, p), _)| r.is_ok() && p.is_ok())
                .map(|(_, t)| t.clone())
                .chain([agents_path])
                .collect();
            left = super::edits::left_from_earlier(out, &imported, "connexity", &args.source);
        }
        results
    } else {
        let (Some((input, relative)), Some(file)) = (inputs.first(), parsed.first()) else {
            return EXIT_INVALID;
        };
        match file {
            Err(_) => vec![Ok(Written::Written)],
            Ok(file) => {
                if let Some(out) = &args.out
                    && out.exists()
                    && !args.replace
                {
                    errln!(
                        "error: {} exists; pass --replace to replace it",
                        out.display()
                    );
                    return EXIT_INVALID;
                }
                let suite = args
                    .out
                    .as_deref()
                    .unwrap_or(relative)
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .filter(|s| !s.trim().is_empty())
                    .unwrap_or("connexity")
                    .to_owned();
                let text = file.render(
                    &suite,
                    &agent_id,
                    &input.display().to_string(),
                    &format!("{agents_text}\n"),
                );
                vec![match &args.out {
                    Some(out) => write_checked(out, &text, args.replace, !args.no_check),
                    None => fits(&text)
                        .and_then(|()| {
                            check_text(&text).map_err(|e| {
                                format!(
                                    "internal: the suite written for it does not check; \
                                     please report:\n{e}"
                                )
                            })
                        })
                        .and_then(|()| {
                            std::io::stdout()
                                .write_all(super::edits::stamped(&text).as_bytes())
                                .map_err(|e| format!("standard output: {e}"))
                        })
                        .map(|()| Written::Written),
                }]
            }
        }
    };

    let mut failed = 0usize;
    let mut unmapped_files = 0usize;
    let mut cases = 0usize;
    let mut kept = 0usize;
    for (((input, _), file), result) in inputs.iter().zip(&parsed).zip(&results) {
        match (file, result) {
            (Err(e), _) | (_, Err(e)) => {
                failed += 1;
                errln!(
                    "error: {}: {e}",
                    super::one_line(&input.display().to_string())
                );
            }
            (Ok(_), Ok(written)) if written.report(input, kept) => kept += 1,
            (Ok(file), Ok(_)) => {
                cases += file.cases.len();
                if !file.unmapped.is_empty() {
                    unmapped_files += 1;
                    if !args.quiet {
                        super::report_unmapped(input, &file.unmapped);
                    }
                }
            }
        }
    }
    let imported = inputs.len() - failed - kept;
    let target = args
        .out
        .as_deref()
        .map_or_else(|| "standard output".to_owned(), |p| p.display().to_string());
    if let Some(out) = &args.out {
        super::edits::report_left(out, &left);
    }
    errln!(
        "imported {} from {imported} of {} into {target} in {:.2}s; {unmapped_files} with \
         unmapped parts (listed in each suite's header){}{}",
        count(cases as u64, "test case", "test cases"),
        count(inputs.len() as u64, "file", "files"),
        started.elapsed().as_secs_f64(),
        if kept > 0 {
            format!("; {kept} kept as they were (edited, or without an import digest)")
        } else {
            String::new()
        },
        if failed > 0 {
            format!("; {failed} could not be imported")
        } else {
            String::new()
        }
    );
    if let Some(out) = &args.out
        && imported + kept > 0
    {
        errln!("check them with `trellis check {}`", out.display());
    }
    if failed > 0 { EXIT_FAILED } else { EXIT_OK }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A string response is the tool's answer as it is, JSON text included: one holding JSON
    /// was written as a JSON string literal, and the agent got the answer quoted.
    #[test]
    fn a_string_response_is_written_as_it_is() {
        let mut lost = |why: String| panic!("{why}");
        let lines = mock_outputs(
            0,
            vec![
                serde_json::json!({"response": "{\"serviced\": false}"}),
                serde_json::json!({"response": "plain text"}),
                serde_json::json!({"response": {"serviced": true}}),
            ],
            &mut lost,
        );
        assert_eq!(
            lines,
            [
                r#"output "{\"serviced\": false}""#,
                r#"output "plain text""#,
                r#"output "{\"serviced\":true}""#,
            ]
        );
    }

    /// The ids the search through every id given so far chose, for bases that repeat and
    /// bases that are another's numbered id (`a-2`).
    #[test]
    fn unique_ids_are_those_a_search_of_every_id_finds() {
        let bases: Vec<String> = (0..3_000u32)
            .map(|i| match i.wrapping_mul(2_654_435_761) % 7 {
                0 => "a-2".to_owned(),
                1 => "a-3-2".to_owned(),
                2 | 3 => "a".to_owned(),
                4 => "a-3".to_owned(),
                5 => format!("b{}", i % 5),
                _ => format!("b{}-2", i % 3),
            })
            .collect();
        let mut searched: Vec<String> = Vec::new();
        for base in &bases {
            let mut id = base.clone();
            let mut n = 1;
            while searched.contains(&id) {
                n += 1;
                id = format!("{base}-{n}");
            }
            searched.push(id);
        }
        let mut ids = UniqueIds::default();
        let given: Vec<String> = bases.iter().map(|b| ids.unique(b)).collect();
        assert_eq!(given, searched);
        assert!(!ids.take("a") && ids.take("never-given"));
    }

    #[test]
    fn slugs_are_ids() {
        assert_eq!(slug("Refund Request — Valid"), "refund-request-valid");
        assert_eq!(slug("  !! "), "");
    }
}
