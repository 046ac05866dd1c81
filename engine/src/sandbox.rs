//! The tool sandbox: the engine answers an agent's tool calls itself.
//!
//! MultiAgentEval agents do not run their tools: they answer `call_tool` /
//! `call_multiple_tools`, and the harness runs the tools in its own sandbox, enforces
//! governance policies and sends the result back as the next `task_description`
//! (docs/wire.md, "MultiAgentEval"). This module is that
//! sandbox, independent of any transport:
//!
//! - [`SandboxSpec`] is the immutable configuration of one scenario's tools (built from the
//!   suite's `tool` nodes with [`SandboxSpec::from_tools`], or by the scenario-file importer
//!   from `tools`, `policies` and `initial_state`).
//! - [`Sandbox`] is the per-trajectory state: the state document, sequence cursors and the
//!   record of every call. It is `Clone` (the spec is shared through an [`Arc`]) so a fork of
//!   the conversation forks the sandbox with it.
//! - [`feedback`] renders outcomes as the text the harness sends back to the agent, in the
//!   spec's wording or the newer harness's ([`FeedbackWording`]).
//! - [`StateExpectation`] checks a value of the final state document (the future
//!   `state path=… equals=…` criterion, and the importer's `expected_outcome` state targets).
//!
//! Rules chosen where the harness and the spec say nothing (all tested below):
//! - **Matching outputs** ([`ToolAnswer::Matched`]): the first output whose `when` keys are all
//!   present in the call's parameters with equal values answers (subset match). Equality is
//!   [`written_matches`], the rule of every value written in a suite against one an agent
//!   sent (criteria use it too): JSON equality with numbers compared by value (`1` equals
//!   `1.0`, see [`json_eq`]), and a written string is text, which a number or boolean
//!   written that way also matches (`"2"` answers `2`); strings are compared exactly (case
//!   matters: a mock keyed on an account id must not answer a differently spelled one). No
//!   match is an error outcome.
//! - **Outputs in order** ([`ToolAnswer::Sequence`]): each executed call consumes the next
//!   output; past the end, [`Exhausted`] decides: the last output repeats (the default, as a
//!   real tool keeps answering) or the call is an error.
//! - **Outputs in order, matched** ([`ToolAnswer::Queue`], Connexity's `mock_responses`):
//!   a call takes the first output not yet consumed whose `when` matches, and consumes it.
//!   Matching is Connexity's (its `MockToolExecutor`): every `when` key present, strings
//!   compared case-insensitively with surrounding whitespace ignored, other values by
//!   [`written_matches`]; a `null` in `when` matches anything, absent included (as `expect-tool` and
//!   the case files mean it; the executor itself compares it with `==`). No
//!   match among the unconsumed outputs is [`SandboxError::NoMatchingOutput`]; with every
//!   output consumed, [`Exhausted`] decides (`RepeatLast`: the last output again when it
//!   matches). Connexity answers both with an `{"error": …}` tool result; here they are error
//!   outcomes, sent to the agent and recorded.
//! - **Policies** are checked before anything runs; a breach is not executed, consumes no
//!   sequence output and changes no state. A `max_limit` breach is a number strictly greater
//!   than the limit (the harness's `>`); a numeric string (`"100"`) is read as its number,
//!   and so is money as people write it (`"$100"`, `"1,000.50"`, `"75 €"`, `"100 USD"`,
//!   `"1.000,00 €"`); an absent or `null` parameter breaches no maximum, and any other value
//!   that reads as no number breaches it (it cannot be checked, so it is not let through).
//! - **State changes** (`[{path, value}]`) are applied after a call executes, tool-level ones
//!   first, then the matched output's. A path is dotted (`account.balance`, as scenario files
//!   write them) or a JSON pointer (`/account/balance`); missing objects on the way are
//!   created, a decimal segment indexes an array. A change that cannot be applied (through a
//!   string or number, or past an array's end) is skipped and noted on the call's record,
//!   never a panic and never a silent overwrite.
//! - **Bounded:** at most [`SandboxSpec::max_calls`] calls are recorded and run per trajectory
//!   (default [`DEFAULT_MAX_CALLS`]); later calls are error outcomes counted in
//!   [`Sandbox::refused_calls`] but not stored, so an agent that sends a million `tool_names`
//!   cannot exhaust memory.
//! - **Errors go back to the agent** as a result object `{"status": "error", "message": …}`
//!   (the harness has no error results; this shape lets an agent read it and carry on), and
//!   count in [`Sandbox::error_count`]; breaches count in [`Sandbox::violation_count`].
//! - **Feedback text** is byte-exact to the harness (see [`feedback`]): Python's
//!   `json.dumps` / `repr` forms, floats as Python prints them (`50.0`), `status` first in
//!   result objects whatever serde_json's map order is.
//! - **State checks** follow the harness's assertion modes: `contains` is case-sensitive,
//!   the harness's `regex` is a case-insensitive search, `numerical_tolerance` is
//!   [`HARNESS_TOLERANCE`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use regex::Regex;
use serde_json::{Map, Value};

/// Why `state` and `violations` are skipped on agents without a tool sandbox.
pub const NO_SANDBOX: &str = "no tool sandbox: the engine answers tool calls (and keeps a state \
                              document) only for MultiAgentEval agents and models \
                              under test (`openai`, `anthropic`)";

/// How many calls a trajectory's sandbox runs and records before refusing further calls.
pub const DEFAULT_MAX_CALLS: usize = 1_000;

/// The immutable sandbox configuration of one scenario, shared by all its trajectories.
#[derive(Clone, Debug)]
pub struct SandboxSpec {
    /// Declared tools by name (names are compared exactly): the scenario's own, which
    /// replace [`SandboxSpec::shared_tools`] of the same name.
    pub tools: HashMap<String, ToolSpec>,
    /// The project's tools, one map shared by the sandbox of every scenario (a copy per
    /// scenario made planning 20,000 scenarios of a project with 20 tools take 1.1 GB).
    pub shared_tools: Arc<HashMap<String, ToolSpec>>,
    /// The state document every trajectory starts from (`initial_state`).
    pub initial_state: Value,
    /// What a call to a tool that is not declared gets.
    pub undeclared: UndeclaredTool,
    /// Calls run and recorded per trajectory before further calls are refused.
    pub max_calls: usize,
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            tools: HashMap::new(),
            shared_tools: Arc::default(),
            initial_state: Value::Object(Map::new()),
            undeclared: UndeclaredTool::HarnessDefault,
            max_calls: DEFAULT_MAX_CALLS,
        }
    }
}

/// What a call to an undeclared tool gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UndeclaredTool {
    /// The harness's answer: `{"status":"success","message":"Executed NAME"}`.
    #[default]
    HarnessDefault,
    /// An error outcome ([`SandboxError::UndeclaredTool`]).
    Error,
}

/// One declared tool.
#[derive(Clone, Debug, Default)]
pub struct ToolSpec {
    pub answer: ToolAnswer,
    /// Applied on every executed call, before the matched output's own changes.
    pub state_changes: Vec<StateChange>,
    /// Checked in order before the call runs; the first breach wins.
    pub policies: Vec<Policy>,
    /// The parameters declared `required=#true`: a call without one is answered with an
    /// error, as a tool runtime validating its schema answers, and does not run.
    pub required: Vec<String>,
}

impl ToolSpec {
    /// A tool that always answers `output` (a scenario file's `tools{NAME:{output}}`).
    pub fn fixed(output: Value) -> Self {
        ToolSpec {
            answer: ToolAnswer::Matched(vec![MatchedOutput::any(output)]),
            ..ToolSpec::default()
        }
    }
}

/// How a declared tool chooses its output.
#[derive(Clone, Debug)]
pub enum ToolAnswer {
    /// The first output whose `when` is a subset of the call's parameters.
    Matched(Vec<MatchedOutput>),
    /// Outputs consumed one per executed call.
    Sequence {
        outputs: Vec<Value>,
        when_exhausted: Exhausted,
    },
    /// Outputs in order, each consumed by the first call its `when` matches (Connexity's
    /// rules, see the module docs).
    Queue {
        outputs: Vec<MatchedOutput>,
        when_exhausted: Exhausted,
    },
}

impl Default for ToolAnswer {
    fn default() -> Self {
        ToolAnswer::Matched(Vec::new())
    }
}

/// An output answered when the call's parameters contain `when` (empty: any call).
#[derive(Clone, Debug)]
pub struct MatchedOutput {
    pub when: Map<String, Value>,
    pub output: Value,
    pub state_changes: Vec<StateChange>,
}

impl MatchedOutput {
    /// An output for any call.
    pub fn any(output: Value) -> Self {
        MatchedOutput {
            when: Map::new(),
            output,
            state_changes: Vec::new(),
        }
    }
}

/// What a call past the end of a [`ToolAnswer::Sequence`] or [`ToolAnswer::Queue`] gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Exhausted {
    /// The last output again.
    #[default]
    RepeatLast,
    /// An error outcome ([`SandboxError::Exhausted`]).
    Error,
}

/// `{path, value}`: set `value` at `path` in the state document.
#[derive(Clone, Debug, PartialEq)]
pub struct StateChange {
    pub path: String,
    pub value: Value,
}

/// A governance policy on one tool's parameters.
#[derive(Clone, Debug)]
pub enum Policy {
    /// The parameter, read as an amount ([`amount_value`]; one that reads as none is
    /// refused), must not exceed `limit` (the harness's `max_limit`,
    /// which checks `params.amount`).
    Maximum { param: String, limit: f64 },
    /// The parameter, when present, must equal one of `values` ([`written_matches`]).
    AllowedValues { param: String, values: Vec<Value> },
}

impl Policy {
    /// The harness's `policies{TOOL:{max_limit}}`: a maximum on `amount`.
    pub fn max_limit(limit: f64) -> Self {
        Policy::Maximum {
            param: "amount".to_string(),
            limit,
        }
    }

    /// The violation text when `params` breach this policy.
    ///
    /// The maximum's wording generalises the harness's
    /// `f"Amount {amount} exceeds limit of {max_limit}"` (docs/wire.md, "MultiAgentEval":
    /// `Amount 100 exceeds
    /// limit of 50.0`): the parameter's name with its first letter upper-cased, the value as
    /// the agent sent it (Python `str`), the limit as a Python float.
    fn breach(&self, params: &Value) -> Option<String> {
        match self {
            Policy::Maximum { param, limit } => {
                let value = params.get(param).filter(|v| !v.is_null())?;
                // A value the limit cannot be checked against is refused, not let through: a
                // refund of "100 USD" read as no number went past a limit of 50.
                let Some(number) = amount_value(value) else {
                    return Some(format!(
                        "{} {} cannot be checked against the limit of {}: it is not a number",
                        capitalized(param),
                        python_str(value),
                        python_float(*limit)
                    ));
                };
                (number > *limit).then(|| {
                    format!(
                        "{} {} exceeds limit of {}",
                        capitalized(param),
                        python_str(value),
                        python_float(*limit)
                    )
                })
            }
            Policy::AllowedValues { param, values } => {
                let value = params.get(param)?;
                if values.iter().any(|allowed| {
                    written_matches(value, allowed, TextCase::Exact, Written::Literal)
                }) {
                    return None;
                }
                Some(format!(
                    "{} {} is not one of the allowed values {}",
                    capitalized(param),
                    python_str(value),
                    python_repr(&Value::Array(values.clone()))
                ))
            }
        }
    }
}

/// Why a call produced no output.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    #[error("tool '{name}' is not declared in this scenario")]
    UndeclaredTool { name: String },
    #[error("tool '{name}' has no output for these parameters")]
    NoMatchingOutput { name: String },
    #[error("tool '{name}' has answered all of its {outputs} outputs")]
    Exhausted { name: String, outputs: usize },
    #[error("the sandbox refuses calls after {limit} calls in one trajectory")]
    TooManyCalls { limit: usize },
    #[error(
        "tool '{name}' was called with arguments that are {kind} in JSON, not an object of \
         named parameters: it did not run"
    )]
    ArgumentsNotObject { name: String, kind: &'static str },
    #[error("tool '{name}' was called without its required parameter(s) {missing}: it did not run")]
    MissingRequired { name: String, missing: String },
}

/// Whether `params` lacks `param` (a `null` is no value: a required parameter sent as
/// `null` is not given).
fn absent(params: &Value, param: &str) -> bool {
    params.get(param).is_none_or(Value::is_null)
}

/// The result of one call.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutcome {
    /// The tool ran: its output (state changes applied).
    Executed(Value),
    /// A policy forbade the call; it did not run. The text is the harness's violation text.
    Violation(String),
    /// The call could not be answered.
    Error(SandboxError),
}

impl ToolOutcome {
    /// The result object as the agent sees it: the output; for a breach the harness's
    /// `{"status": "policy_violation", "violation": TEXT}`; for an error
    /// `{"status": "error", "message": TEXT}` (the harness has no errors; this keeps the same
    /// shape so an agent can read it and carry on).
    pub fn result_object(&self) -> Value {
        match self {
            ToolOutcome::Executed(output) => output.clone(),
            ToolOutcome::Violation(text) => violation_object(text),
            ToolOutcome::Error(error) => {
                let mut object = Map::new();
                object.insert("status".into(), Value::String("error".into()));
                object.insert("message".into(), Value::String(error.to_string()));
                Value::Object(object)
            }
        }
    }
}

fn violation_object(text: &str) -> Value {
    // Built by hand so the key order is the harness's whatever serde_json's map order is.
    let mut object = Map::new();
    object.insert("status".into(), Value::String("policy_violation".into()));
    object.insert("violation".into(), Value::String(text.to_string()));
    Value::Object(object)
}

/// One call as the sandbox saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    pub tool: String,
    pub params: Value,
    pub outcome: ToolOutcome,
    /// State changes that could not be applied (why), in order.
    pub state_errors: Vec<String>,
}

/// A trajectory's sandbox: state document, sequence positions and call records.
#[derive(Clone, Debug)]
pub struct Sandbox {
    spec: Arc<SandboxSpec>,
    state: Value,
    next_output: HashMap<String, usize>,
    /// Per [`ToolAnswer::Queue`] tool: which outputs calls have consumed.
    consumed: HashMap<String, Vec<bool>>,
    calls: Vec<CallRecord>,
    refused_calls: usize,
}

impl Sandbox {
    pub fn new(spec: Arc<SandboxSpec>) -> Self {
        Sandbox {
            state: spec.initial_state.clone(),
            spec,
            next_output: HashMap::new(),
            consumed: HashMap::new(),
            calls: Vec::new(),
            refused_calls: 0,
        }
    }

    /// Run one call: policies first, then the tool's answer and its state changes.
    /// Never panics, whatever shape `params` has (a non-object has no parameters: it is an
    /// error for a tool with policies or required parameters, which it would get past).
    pub fn call(&mut self, name: &str, params: &Value) -> ToolOutcome {
        if self.calls.len() >= self.spec.max_calls {
            self.refused_calls = self.refused_calls.saturating_add(1);
            return ToolOutcome::Error(SandboxError::TooManyCalls {
                limit: self.spec.max_calls,
            });
        }
        let spec = Arc::clone(&self.spec);
        let mut state_errors = Vec::new();
        let outcome = match spec.tool(name) {
            None => match spec.undeclared {
                UndeclaredTool::HarnessDefault => ToolOutcome::Executed(harness_default(name)),
                UndeclaredTool::Error => ToolOutcome::Error(SandboxError::UndeclaredTool {
                    name: name.to_string(),
                }),
            },
            // Arguments a model sent as a string of JSON, a list or a number name no
            // parameter: the policies, reading named parameters, would find none to refuse
            // and let the call through (a double-encoded refund of 100 past a limit of 50).
            // A tool with neither policies nor required parameters answers them as the
            // harness does (its fixed output takes any call).
            Some(tool)
                if !matches!(params, Value::Object(_) | Value::Null)
                    && (!tool.policies.is_empty() || !tool.required.is_empty()) =>
            {
                ToolOutcome::Error(SandboxError::ArgumentsNotObject {
                    name: name.to_string(),
                    kind: crate::transport::quote::kind_of(params),
                })
            }
            Some(tool) if tool.required.iter().any(|p| absent(params, p)) => {
                let missing: Vec<String> = tool
                    .required
                    .iter()
                    .filter(|p| absent(params, p))
                    .map(|p| format!("'{p}'"))
                    .collect();
                ToolOutcome::Error(SandboxError::MissingRequired {
                    name: name.to_string(),
                    missing: missing.join(", "),
                })
            }
            Some(tool) => match tool.policies.iter().find_map(|p| p.breach(params)) {
                Some(violation) => ToolOutcome::Violation(violation),
                None => self.execute(name, tool, params, &mut state_errors),
            },
        };
        self.calls.push(CallRecord {
            tool: name.to_string(),
            params: params.clone(),
            outcome: outcome.clone(),
            state_errors,
        });
        outcome
    }

    fn execute(
        &mut self,
        name: &str,
        tool: &ToolSpec,
        params: &Value,
        state_errors: &mut Vec<String>,
    ) -> ToolOutcome {
        let (output, output_changes) = match &tool.answer {
            ToolAnswer::Matched(outputs) => {
                match outputs.iter().find(|o| params_contain(params, &o.when)) {
                    Some(matched) => (matched.output.clone(), matched.state_changes.as_slice()),
                    None => {
                        return ToolOutcome::Error(SandboxError::NoMatchingOutput {
                            name: name.to_string(),
                        });
                    }
                }
            }
            ToolAnswer::Sequence {
                outputs,
                when_exhausted,
            } => {
                let position = self.next_output.entry(name.to_string()).or_insert(0);
                let output = match (outputs.get(*position), when_exhausted) {
                    (Some(output), _) => output,
                    (None, Exhausted::RepeatLast) if !outputs.is_empty() => {
                        outputs.last().unwrap_or(&Value::Null)
                    }
                    _ => {
                        return ToolOutcome::Error(SandboxError::Exhausted {
                            name: name.to_string(),
                            outputs: outputs.len(),
                        });
                    }
                };
                *position = position.saturating_add(1).min(outputs.len());
                (output.clone(), &[][..])
            }
            ToolAnswer::Queue {
                outputs,
                when_exhausted,
            } => {
                let consumed = self
                    .consumed
                    .entry(name.to_string())
                    .or_insert_with(|| vec![false; outputs.len()]);
                let unconsumed = outputs
                    .iter()
                    .zip(consumed.iter())
                    .position(|(output, used)| {
                        !*used && params_match_loosely(params, &output.when)
                    });
                let all_consumed = !consumed.contains(&false);
                let chosen = match (unconsumed, when_exhausted) {
                    (Some(index), _) => {
                        if let Some(used) = consumed.get_mut(index) {
                            *used = true;
                        }
                        outputs.get(index)
                    }
                    (None, Exhausted::RepeatLast) if all_consumed => outputs
                        .last()
                        .filter(|last| params_match_loosely(params, &last.when)),
                    (None, _) => None,
                };
                match chosen {
                    Some(output) => (output.output.clone(), output.state_changes.as_slice()),
                    None if all_consumed && *when_exhausted == Exhausted::Error => {
                        return ToolOutcome::Error(SandboxError::Exhausted {
                            name: name.to_string(),
                            outputs: outputs.len(),
                        });
                    }
                    None => {
                        return ToolOutcome::Error(SandboxError::NoMatchingOutput {
                            name: name.to_string(),
                        });
                    }
                }
            }
        };
        for change in tool.state_changes.iter().chain(output_changes) {
            if let Err(why) = set_at_path(&mut self.state, &change.path, change.value.clone()) {
                state_errors.push(format!("state change at '{}': {why}", change.path));
            }
        }
        ToolOutcome::Executed(output)
    }

    /// The state document.
    pub fn state(&self) -> &Value {
        &self.state
    }

    /// The value at a dotted path or JSON pointer in the state document.
    pub fn state_at(&self, path: &str) -> Option<&Value> {
        value_at_path(&self.state, path)
    }

    /// Every call run, in order (refused calls past the limit are only counted).
    pub fn calls(&self) -> &[CallRecord] {
        &self.calls
    }

    /// The calls a policy refused, with their violation texts.
    pub fn violations(&self) -> impl Iterator<Item = (&CallRecord, &str)> {
        self.calls.iter().filter_map(|call| match &call.outcome {
            ToolOutcome::Violation(text) => Some((call, text.as_str())),
            _ => None,
        })
    }

    pub fn violation_count(&self) -> usize {
        self.violations().count()
    }

    /// Calls answered with an error outcome, including refused ones past the limit.
    pub fn error_count(&self) -> usize {
        let recorded = self
            .calls
            .iter()
            .filter(|call| matches!(call.outcome, ToolOutcome::Error(_)))
            .count();
        recorded.saturating_add(self.refused_calls)
    }

    /// Calls refused because the trajectory reached [`SandboxSpec::max_calls`].
    pub fn refused_calls(&self) -> usize {
        self.refused_calls
    }
}

/// Whether a recorded tool result (JSON text) is a policy breach: the harness's
/// `{"status":"policy_violation", …}` object. Cheap on other results: only text naming the
/// status is parsed.
pub fn is_violation_result(result: &str) -> bool {
    result.contains("policy_violation")
        && serde_json::from_str::<Value>(result).is_ok_and(|result| {
            result.get("status").and_then(Value::as_str) == Some("policy_violation")
        })
}

/// The harness's answer to an undeclared tool: `{"status":"success","message":"Executed NAME"}`.
pub fn harness_default(name: &str) -> Value {
    let mut object = Map::new();
    object.insert("status".into(), Value::String("success".into()));
    object.insert("message".into(), Value::String(format!("Executed {name}")));
    Value::Object(object)
}

fn params_contain(params: &Value, when: &Map<String, Value>) -> bool {
    when.iter().all(|(key, expected)| {
        params.get(key).is_some_and(|actual| {
            written_matches(actual, expected, TextCase::Exact, Written::Literal)
        })
    })
}

/// Connexity's subset match of `expected_params` (see the module docs).
fn params_match_loosely(params: &Value, when: &Map<String, Value>) -> bool {
    when.iter().all(|(key, expected)| {
        expected.is_null()
            || params.get(key).is_some_and(|actual| {
                written_matches(
                    actual,
                    expected,
                    TextCase::InsensitiveTrimmed,
                    Written::Literal,
                )
            })
    })
}

/// A JSON number, or a string that reads as a finite number.
fn numeric_value(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|n| n.is_finite()),
        _ => None,
    }
}

/// [`numeric_value`], or an amount written as people write money: a currency before or
/// after it, as a sign (`$100`, `100 €`, `US$100`, `C$ 20`) or a code (`100 USD`, `EUR
/// 75.50`); thousands grouped by commas (`1,000.50`), or by points with a decimal comma
/// (`1.000,00 €`); a decimal comma alone with one or two digits after it (`100,50`). `None`
/// for anything else, which a maximum refuses rather than lets through ([`Policy::breach`]).
fn amount_value(value: &Value) -> Option<f64> {
    if let Some(number) = numeric_value(value) {
        return Some(number);
    }
    let text = value.as_str()?.trim();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, text),
    };
    let bare = without_currency(text)?;
    let number = grouped_number(bare)?;
    Some(if negative { -number } else { number })
}

/// `text` without the currency written before or after it (at most one), or `text` itself.
/// `None` when what is left around the number is not a currency.
fn without_currency(text: &str) -> Option<&str> {
    const SIGNS: &[char] = &['$', '€', '£', '¥', '₹', '₩', '₽', '₺', '₪', '₫', '฿', '₱'];
    // `US$`, `C$`, `CA$`, `R$`: a sign after up to three letters.
    let sign_with_letters = |word: &str| {
        let letters = word.trim_end_matches(SIGNS);
        letters.len() < word.len()
            && letters.len() <= 3
            && letters.bytes().all(|b| b.is_ascii_alphabetic())
    };
    // `USD`, `eur`: a three-letter code.
    let code = |word: &str| word.len() == 3 && word.bytes().all(|b| b.is_ascii_alphabetic());
    let is_currency = |word: &str| !word.is_empty() && (sign_with_letters(word) || code(word));
    let starts_number = |c: char| c.is_ascii_digit();
    if text.starts_with(starts_number) {
        let end = text
            .rfind(|c: char| c.is_ascii_digit())
            .map_or(0, |at| at + 1);
        let (number, rest) = text.split_at(end);
        let rest = rest.trim_start();
        return (rest.is_empty() || is_currency(rest)).then_some(number);
    }
    let start = text.find(starts_number)?;
    let (currency, number) = text.split_at(start);
    is_currency(currency.trim_end()).then_some(number)
}

/// Digits with their thousands grouped by commas and a decimal point, or grouped by points
/// with a decimal comma; a lone decimal comma takes one or two digits after it (three would
/// be a group: `1,500` is fifteen hundred).
fn grouped_number(text: &str) -> Option<f64> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let grouped = |whole: &str, by: char| {
        let mut groups = whole.split(by);
        let first = groups.next().unwrap_or_default();
        (1..=3).contains(&first.len()) && digits(first) && groups.all(|g| g.len() == 3 && digits(g))
    };
    let last_point = text.rfind('.');
    let last_comma = text.rfind(',');
    let (whole, fraction, group) = match (last_point, last_comma) {
        // `1.000` is a thousand where a point groups thousands, and one where it is the
        // decimal point: which was meant is not for a guardrail to guess, so it reads as
        // no number (and is refused), never as the smaller.
        (Some(p), None) if text.len() - p == 4 => return None,
        // `1,000.50`, `1000.5`
        (Some(p), c) if c.is_none_or(|c| c < p) => (&text[..p], Some(&text[p + 1..]), ','),
        // `1.000,50`, `100,50`
        (p, Some(c)) if p.is_none_or(|p| p < c) => {
            let fraction = &text[c + 1..];
            if p.is_none() && !(1..=2).contains(&fraction.len()) {
                // `1,000` or `12,345,678`: commas that group, no fraction.
                (text, None, ',')
            } else {
                (&text[..c], Some(fraction), '.')
            }
        }
        _ => (text, None, ','),
    };
    let plain = digits(whole);
    if !(plain || grouped(whole, group)) || fraction.is_some_and(|f| !digits(f)) {
        return None;
    }
    let mut number: String = whole.chars().filter(|&c| c != group).collect();
    if let Some(fraction) = fraction {
        number.push('.');
        number.push_str(fraction);
    }
    number.parse::<f64>().ok().filter(|n| n.is_finite())
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// State paths

/// A path's segments: a JSON pointer (`/a/b`, with `~1` and `~0` escapes) or dotted (`a.b`).
fn segments(path: &str) -> Vec<String> {
    if let Some(pointer) = path.strip_prefix('/') {
        pointer
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect()
    } else if path.is_empty() {
        Vec::new()
    } else {
        path.split('.').map(str::to_string).collect()
    }
}

fn value_at_path<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    segments(path)
        .iter()
        .try_fold(root, |value, segment| match value {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        })
}

fn set_at_path(root: &mut Value, path: &str, new_value: Value) -> Result<(), String> {
    let segments = segments(path);
    let Some((last, parents)) = segments.split_last() else {
        return Err("the path is empty".to_string());
    };
    let mut current = root;
    for segment in parents {
        current = match current {
            Value::Object(map) => map
                .entry(segment.clone())
                .or_insert_with(|| Value::Object(Map::new())),
            Value::Array(items) => {
                let len = items.len();
                segment
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get_mut(i))
                    .ok_or_else(|| format!("'{segment}' is not an index of a {len}-item array"))?
            }
            other => return Err(format!("'{segment}' is inside a {}", kind(other))),
        };
    }
    match current {
        Value::Object(map) => {
            map.insert(last.clone(), new_value);
            Ok(())
        }
        Value::Array(items) => {
            let len = items.len();
            let slot = last
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get_mut(i))
                .ok_or_else(|| format!("'{last}' is not an index of a {len}-item array"))?;
            *slot = new_value;
            Ok(())
        }
        other => Err(format!("'{last}' is inside a {}", kind(other))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ---------------------------------------------------------------------------------------------
// State expectations

/// A check on one value of the state document (MultiAgentEval assertion modes: `exact`,
/// `contains`, `regex`, `numerical_tolerance`).
#[derive(Clone, Debug)]
pub enum StateExpectation {
    /// JSON equality, numbers by value.
    Equals(Value),
    /// A string contains the text; an array has an equal element; an object has the key.
    /// An expected array means any of its elements (the harness's list form).
    Contains(Value),
    /// The regex finds a match in the value's text (a string as is, anything else as compact
    /// JSON). Build with [`StateExpectation::regex`] for the harness's case-insensitive search.
    Regex(Regex),
    /// A number (or numeric string) within `tolerance` of `value`.
    Near { value: f64, tolerance: f64 },
    /// The path exists (any value, `null` included).
    Exists,
    /// The path does not exist.
    Absent,
}

/// The harness's `numerical_tolerance`.
pub const HARNESS_TOLERANCE: f64 = 1e-9;

impl StateExpectation {
    /// A regex expectation; `case_insensitive` as the harness's `re.search(…, re.I)`.
    pub fn regex(pattern: &str, case_insensitive: bool) -> Result<Self, regex::Error> {
        regex::RegexBuilder::new(pattern)
            .case_insensitive(case_insensitive)
            .size_limit(1 << 20)
            .build()
            .map(StateExpectation::Regex)
    }

    /// Whether the value found at a path (`None`: the path does not exist) satisfies this.
    pub fn holds(&self, actual: Option<&Value>) -> bool {
        match (self, actual) {
            (StateExpectation::Exists, found) => found.is_some(),
            (StateExpectation::Absent, found) => found.is_none(),
            (_, None) => false,
            (StateExpectation::Equals(expected), Some(actual)) => json_eq(actual, expected),
            (StateExpectation::Contains(Value::Array(any)), Some(actual)) => {
                any.iter().any(|expected| contains(actual, expected))
            }
            (StateExpectation::Contains(expected), Some(actual)) => contains(actual, expected),
            (StateExpectation::Regex(regex), Some(actual)) => regex.is_match(&plain_text(actual)),
            (StateExpectation::Near { value, tolerance }, Some(actual)) => numeric_value(actual)
                .is_some_and(|number| (number - value).abs() <= tolerance.abs()),
        }
    }
}

fn contains(actual: &Value, expected: &Value) -> bool {
    match actual {
        Value::String(text) => text.contains(plain_text(expected).as_str()),
        Value::Array(items) => items.iter().any(|item| json_eq(item, expected)),
        Value::Object(map) => expected.as_str().is_some_and(|key| map.contains_key(key)),
        _ => false,
    }
}

fn plain_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Feedback to the agent

/// Which harness's words the tool results go back in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FeedbackWording {
    /// The spec and the older harness (the default).
    #[default]
    Spec,
    /// The newer (AgentV) harness.
    Harness,
}

/// The next `task_description` after the calls of one agent action, in order.
///
/// [`FeedbackWording::Spec`] (docs/wire.md, "MultiAgentEval"):
/// - one call: `Tool 'NAME' returned: {json}. Continue with the task.`, the result as
///   Python's `json.dumps` writes it (`{"status": "success", "message": "Executed X"}`:
///   `, ` and `: ` separators, non-ASCII as `\uXXXX`);
/// - several calls: `Tools ['A', 'B'] returned: [{json}, {json}]. Continue with the task.`
///   (the names as a Python list, the results as one `json.dumps` list; a breached call's
///   element is its `{"status": "policy_violation", "violation": TEXT}` object);
/// - one breached call: `GOVERNANCE ERROR: TEXT. Please adjust your action.`
///   (e.g. `GOVERNANCE ERROR: Amount 100 exceeds limit of 50.0. Please adjust your action.`).
///
/// [`FeedbackWording::Harness`] (docs/wire.md, "MultiAgentEval": newer harnesses send the
/// result's `message`):
/// - per call, the result's `message` when it is a string (`Executed NAME` for an undeclared
///   tool); otherwise the Python `str` of the result, which for a breach is
///   `{'status': 'policy_violation', 'violation': 'Amount 100 exceeds limit of 50.0'}`;
/// - several calls: those texts joined by newlines (the newer harness sends one text per
///   result; one line each keeps every result visible).
pub fn feedback(wording: FeedbackWording, calls: &[(&str, &ToolOutcome)]) -> String {
    match wording {
        FeedbackWording::Spec => match calls {
            [(_, ToolOutcome::Violation(text))] => {
                format!("GOVERNANCE ERROR: {text}. Please adjust your action.")
            }
            [(name, outcome)] => format!(
                "Tool '{name}' returned: {}. Continue with the task.",
                python_json_dumps(&outcome.result_object())
            ),
            _ => {
                let names = Value::Array(
                    calls
                        .iter()
                        .map(|(name, _)| Value::String((*name).to_string()))
                        .collect(),
                );
                let results = Value::Array(
                    calls
                        .iter()
                        .map(|(_, outcome)| outcome.result_object())
                        .collect(),
                );
                format!(
                    "Tools {} returned: {}. Continue with the task.",
                    python_repr(&names),
                    python_json_dumps(&results)
                )
            }
        },
        FeedbackWording::Harness => calls
            .iter()
            .map(|(_, outcome)| {
                let result = outcome.result_object();
                match result.get("message") {
                    Some(Value::String(message)) => message.clone(),
                    _ => python_str(&result),
                }
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

// ---------------------------------------------------------------------------------------------
// Python text forms (what the Python harness's f-strings produce)

/// Python's `str(x)` of the value as `json.loads` would give it: a string is itself,
/// anything else its `repr`.
pub fn python_str(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => python_repr(other),
    }
}

/// Python's `repr` of the value as `json.loads` would give it: `{'a': [1, 2.0, True, None]}`.
pub fn python_repr(value: &Value) -> String {
    let mut out = String::new();
    write_python(&mut out, value, PythonStyle::Repr);
    out
}

/// The two Python renderings of a JSON value: `repr` of what `json.loads` returns, and
/// `json.dumps` with its defaults. They differ only in the words for the literals and in
/// how strings are quoted.
#[derive(Clone, Copy)]
enum PythonStyle {
    Repr,
    Json,
}

fn write_python(out: &mut String, value: &Value, style: PythonStyle) {
    let string = |out: &mut String, text: &str| match style {
        PythonStyle::Repr => write_python_string_repr(out, text),
        PythonStyle::Json => write_ascii_json_string(out, text),
    };
    match (value, style) {
        (Value::Null, PythonStyle::Repr) => out.push_str("None"),
        (Value::Null, PythonStyle::Json) => out.push_str("null"),
        (Value::Bool(true), PythonStyle::Repr) => out.push_str("True"),
        (Value::Bool(true), PythonStyle::Json) => out.push_str("true"),
        (Value::Bool(false), PythonStyle::Repr) => out.push_str("False"),
        (Value::Bool(false), PythonStyle::Json) => out.push_str("false"),
        (Value::Number(number), _) => out.push_str(&python_number(number)),
        (Value::String(text), _) => string(out, text),
        (Value::Array(items), _) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python(out, item, style);
            }
            out.push(']');
        }
        (Value::Object(map), _) => {
            out.push('{');
            for (i, (key, item)) in status_first(map).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                string(out, key);
                out.push_str(": ");
                write_python(out, item, style);
            }
            out.push('}');
        }
    }
}

/// An object's entries with `status` first, then the others in the map's order.
///
/// The harness's result dicts start with `status` (`{'status': 'policy_violation',
/// 'violation': …}`, `{"status": "success", "message": "Executed NAME"}`); serde_json's map
/// sorts keys unless a crate in the build enables `preserve_order`, so the order is fixed here
/// to give the same text in every build.
fn status_first(map: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    let status = map.get_key_value("status");
    status
        .into_iter()
        .chain(map.iter().filter(|(key, _)| key.as_str() != "status"))
}

/// Python's string repr: single quotes unless the text has a `'` and no `"`.
fn write_python_string_repr(out: &mut String, text: &str) {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let code = u32::from(c);
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else {
                    write!(out, "\\u{code:04x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `json.dumps(x)` with its defaults: `, ` and `: ` separators, `ensure_ascii`.
pub fn python_json_dumps(value: &Value) -> String {
    let mut out = String::new();
    write_python(&mut out, value, PythonStyle::Json);
    out
}

fn write_ascii_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// A JSON number as Python prints it: integers as written, floats as `repr(float)`.
fn python_number(number: &serde_json::Number) -> String {
    if number.is_f64() {
        number.as_f64().map(python_float).unwrap_or_default()
    } else {
        number.to_string()
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, `50.0` not `50`, scientific
/// notation from `1e+16` up and below `0.0001` (`1e-05`).
pub fn python_float(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0.0"
        } else {
            "0.0"
        }
        .to_string();
    }
    // `{:e}` gives the shortest round-trip digits as `d.ddde-x`.
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if value < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let body = if exponent >= 0 {
            let point = usize::try_from(exponent).unwrap_or(0).saturating_add(1);
            if digits.len() > point {
                format!("{}.{}", &digits[..point], &digits[point..])
            } else {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            }
        } else {
            let zeros = usize::try_from(-exponent - 1).unwrap_or(0);
            format!("0.{}{digits}", "0".repeat(zeros))
        };
        format!("{sign}{body}")
    } else {
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        format!(
            "{sign}{mantissa}e{exponent_sign}{:02}",
            exponent.unsigned_abs()
        )
    }
}

// ---------------------------------------------------------------------------------------------
// From the suite model

impl SandboxSpec {
    /// The sandbox of a suite's `tool` nodes: each `mock` is a [`MatchedOutput`] (first match
    /// wins, in the order written) with its own `state` changes, a `sequence` is a
    /// [`ToolAnswer::Sequence`] (a [`ToolAnswer::Queue`] when an `output` has params), a
    /// tool's own `state` changes apply on every call, each
    /// `policy` is a [`Policy`]. A declared tool without outputs answers the harness default,
    /// as an undeclared one does. The state starts empty; see [`SandboxSpec::for_scenario`].
    pub fn from_tools(tools: &[trellis_dsl::Tool]) -> Self {
        let state_changes = |changes: &[trellis_dsl::StateChange]| -> Vec<StateChange> {
            changes
                .iter()
                .map(|c| StateChange {
                    path: c.path.clone(),
                    value: c.value.clone(),
                })
                .collect()
        };
        let tools = tools
            .iter()
            .map(|tool| {
                let name = tool.name.value.clone();
                let answer = match &tool.sequence {
                    Some(sequence) => {
                        let when_exhausted = match sequence.when_exhausted {
                            trellis_dsl::WhenExhausted::RepeatLast => Exhausted::RepeatLast,
                            trellis_dsl::WhenExhausted::Error => Exhausted::Error,
                        };
                        if sequence.outputs.iter().all(|o| o.when.is_empty()) {
                            ToolAnswer::Sequence {
                                outputs: sequence.outputs.iter().map(|o| o.value.clone()).collect(),
                                when_exhausted,
                            }
                        } else {
                            ToolAnswer::Queue {
                                outputs: sequence
                                    .outputs
                                    .iter()
                                    .map(|o| MatchedOutput {
                                        when: o.when.clone(),
                                        ..MatchedOutput::any(o.value.clone())
                                    })
                                    .collect(),
                                when_exhausted,
                            }
                        }
                    }
                    None if tool.mocks.is_empty() => {
                        ToolAnswer::Matched(vec![MatchedOutput::any(harness_default(&name))])
                    }
                    None => ToolAnswer::Matched(
                        tool.mocks
                            .iter()
                            .map(|mock| MatchedOutput {
                                when: mock.when.clone(),
                                output: mock.returns.clone(),
                                state_changes: state_changes(&mock.state_changes),
                            })
                            .collect(),
                    ),
                };
                let policies = tool
                    .policies
                    .iter()
                    .map(|policy| match &policy.rule {
                        trellis_dsl::PolicyRule::Maximum(limit) => Policy::Maximum {
                            param: policy.param.clone(),
                            limit: *limit,
                        },
                        trellis_dsl::PolicyRule::Allowed(values) => Policy::AllowedValues {
                            param: policy.param.clone(),
                            values: values.clone(),
                        },
                    })
                    .collect();
                let spec = ToolSpec {
                    answer,
                    state_changes: state_changes(&tool.state_changes),
                    policies,
                    required: tool
                        .params
                        .iter()
                        .filter(|p| p.required)
                        .map(|p| p.name.clone())
                        .collect(),
                };
                (name, spec)
            })
            .collect();
        SandboxSpec {
            tools,
            ..SandboxSpec::default()
        }
    }

    /// The tool called `name`: the scenario's own, else the project's.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name).or_else(|| self.shared_tools.get(name))
    }

    /// The project's tools, to be shared by every scenario's sandbox
    /// ([`SandboxSpec::for_scenario`]).
    pub fn project_tools(project: &trellis_dsl::Project) -> Arc<HashMap<String, ToolSpec>> {
        Arc::new(SandboxSpec::from_tools(&project.tools).tools)
    }

    /// The sandbox of one scenario: the project's tools (`shared`, from
    /// [`SandboxSpec::project_tools`]; a `tool` written inside the scenario replaces the
    /// project's tool of that name), the scenario's `initial-state` and `undeclared-tools`.
    pub fn for_scenario(
        shared: &Arc<HashMap<String, ToolSpec>>,
        scenario: &trellis_dsl::Scenario,
    ) -> Self {
        let spec = SandboxSpec::from_tools(&scenario.tools);
        SandboxSpec {
            shared_tools: Arc::clone(shared),
            initial_state: Value::Object(scenario.initial_state.clone()),
            undeclared: match scenario.undeclared_tools {
                trellis_dsl::UndeclaredTools::Default => UndeclaredTool::HarnessDefault,
                trellis_dsl::UndeclaredTools::Error => UndeclaredTool::Error,
            },
            ..spec
        }
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        // Integers compare exactly (f64 would make 2^53 + 1 equal 2^53); mixed integer and
        // float values compare by value.
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(a), Some(b), _, _) => a == b,
                (_, _, Some(a), Some(b)) => a == b,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// How a written string compares with a string it is matched against
/// ([`written_matches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextCase {
    /// Equal strings only (`tool`, `mock`, `policy … allowed=`, `reply json-path=… equals=`).
    Exact,
    /// Equal ignoring case (`expect-tool`).
    Insensitive,
    /// Equal ignoring case and surrounding whitespace (a `sequence` output's params,
    /// Connexity's `MockToolExecutor`).
    InsensitiveTrimmed,
}

impl TextCase {
    /// Text compared in Unicode NFC: `Montréal` with a precomposed `é` (as a suite is
    /// usually typed) and with `e` and a combining accent (as macOS and copied text often
    /// give it) are one text, as they look.
    fn same(self, a: &str, b: &str) -> bool {
        let (a, b) = (nfc(a), nfc(b));
        let (a, b) = (a.as_ref(), b.as_ref());
        match self {
            TextCase::Exact => a == b,
            TextCase::Insensitive => a.to_lowercase() == b.to_lowercase(),
            TextCase::InsensitiveTrimmed => a.trim().to_lowercase() == b.trim().to_lowercase(),
        }
    }
}

/// How a value written in a suite is compared with one an agent sent (a call's argument, a
/// node of a turn's structured data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written as a KDL value: JSON equality (the suite language's contract), numbers by
    /// value, strings as [`TextCase`] says; a written `"2"` is a string and never equals the
    /// number `2` (write `2`), so a check can tell an agent that sends `"2"` from one that
    /// sends `2`.
    Literal,
    /// A template's rendered text, which has no type (captures are strings): text that
    /// equals a string holding it, or a number, boolean or null that reads as it (`"{{ vars.n }}"`
    /// rendering `2` matches `2` and `2.0`; `"\"2\""` does not).
    Rendered,
}

/// `text` in Unicode NFC, borrowed when it already is (ASCII always is).
pub fn nfc(text: &str) -> std::borrow::Cow<'_, str> {
    if text.is_ascii() {
        std::borrow::Cow::Borrowed(text)
    } else {
        trellis_dsl::names::nfc(text)
    }
}

/// The one rule for a value written in a suite against a value an agent sent, as `written`
/// says ([`Written`]); arrays and objects element by element under the same rule.
pub fn written_matches(actual: &Value, written: &Value, case: TextCase, how: Written) -> bool {
    match (actual, written) {
        (Value::String(a), Value::String(w)) => case.same(a, w),
        (Value::Number(_) | Value::Bool(_) | Value::Null, Value::String(w))
            if how == Written::Rendered =>
        {
            serde_json::from_str::<Value>(w.trim())
                .is_ok_and(|parsed| !parsed.is_string() && json_eq(actual, &parsed))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(a, w)| written_matches(a, w, case, how))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && y.iter()
                    .all(|(k, w)| x.get(k).is_some_and(|a| written_matches(a, w, case, how)))
        }
        _ => json_eq(actual, written),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sandbox(tools: Vec<(&str, ToolSpec)>) -> Sandbox {
        Sandbox::new(Arc::new(SandboxSpec {
            tools: tools
                .into_iter()
                .map(|(name, spec)| (name.to_string(), spec))
                .collect(),
            ..SandboxSpec::default()
        }))
    }

    fn refund_tool(limit: f64) -> ToolSpec {
        ToolSpec {
            policies: vec![Policy::max_limit(limit)],
            state_changes: vec![StateChange {
                path: "account.refunded".into(),
                value: json!(true),
            }],
            ..ToolSpec::fixed(json!({"status": "success", "message": "Refund applied"}))
        }
    }

    /// The protocol of the fixtures' agent, which the sandbox never calls (the sandbox sits
    /// below the protocols, so their registry is not used here).
    const FIXTURE_PROTOCOL: trellis_dsl::lang::ProtocolSpec = trellis_dsl::lang::ProtocolSpec {
        name: "multiagent",
        help: "a fixture",
        endpoints: &[trellis_dsl::lang::EndpointKind::Url],
        settings: &[],
        capabilities: trellis_dsl::lang::Capabilities {
            engine_runs_tools: true,
            carries_tool_mocks: true,
            ..trellis_dsl::lang::Capabilities::NONE
        },
        builtins: &[],

        check: None,
    };

    #[test]
    fn large_integers_compare_exactly() {
        assert!(!json_eq(
            &serde_json::json!(9007199254740993u64),
            &serde_json::json!(9007199254740992u64)
        ));
        assert!(json_eq(&serde_json::json!(2), &serde_json::json!(2.0)));
    }

    /// Arguments that are no object of named parameters (a double-encoded string, a list)
    /// do not get past a tool's policy or required parameters: an error, and it does not
    /// run. A required parameter left out is an error too.
    #[test]
    fn arguments_a_policy_cannot_read_do_not_get_past_it() {
        let mut refund = refund_tool(50.0);
        refund.required = vec!["amount".into()];
        let mut sandbox = sandbox(vec![("refund", refund)]);
        for params in [json!("{\"amount\": 100}"), json!([100]), json!(100)] {
            let outcome = sandbox.call("refund", &params);
            assert!(
                matches!(
                    outcome,
                    ToolOutcome::Error(SandboxError::ArgumentsNotObject { .. })
                ),
                "{params}: {outcome:?}"
            );
        }
        for params in [json!({}), Value::Null, json!({"amount": null})] {
            let outcome = sandbox.call("refund", &params);
            assert!(
                matches!(
                    outcome,
                    ToolOutcome::Error(SandboxError::MissingRequired { .. })
                ),
                "{params}: {outcome:?}"
            );
        }
        assert!(matches!(
            sandbox.call("refund", &json!({"amount": 100})),
            ToolOutcome::Violation(_)
        ));
        assert_eq!(
            sandbox.call("refund", &json!({})).result_object()["message"],
            "tool 'refund' was called without its required parameter(s) 'amount': it did not run"
        );
    }

    #[test]
    fn a_static_output_answers_any_call() {
        let mut sandbox = sandbox(vec![(
            "lookup",
            ToolSpec::fixed(json!({"plan": "100 Mbps"})),
        )]);
        assert_eq!(
            sandbox.call("lookup", &json!({"customer_id": "c1"})),
            ToolOutcome::Executed(json!({"plan": "100 Mbps"}))
        );
        assert_eq!(
            sandbox.call("lookup", &json!("not an object")),
            ToolOutcome::Executed(json!({"plan": "100 Mbps"}))
        );
        assert_eq!(sandbox.calls().len(), 2);
        assert_eq!(sandbox.calls()[0].params, json!({"customer_id": "c1"}));
    }

    #[test]
    fn rendered_text_matches_scalars_written_that_way_and_literals_are_json() {
        let rendered = |actual: Value, written: &str| {
            written_matches(
                &actual,
                &Value::String(written.into()),
                TextCase::Exact,
                Written::Rendered,
            )
        };
        assert!(rendered(json!("A-17"), "A-17"));
        assert!(!rendered(json!("A-17"), "A-18"));
        assert!(!rendered(json!("a-17"), "A-17"));
        assert!(rendered(json!(42), "42"));
        assert!(rendered(json!(42.0), "42"));
        assert!(rendered(json!(42), "42.0"));
        assert!(rendered(json!(42), " 42 "));
        assert!(!rendered(json!(42), "42x"));
        assert!(rendered(json!(true), "true"));
        assert!(!rendered(json!(true), "1"));
        // Text that reads as a JSON string is still text, not the number inside it.
        assert!(!rendered(json!(42), "\"42\""));
        assert!(!rendered(json!({"a": 1}), r#"{"a": 1}"#));
        // A dataset's null renders as `null` and equals the null an agent sends.
        assert!(rendered(Value::Null, "null"));
        assert!(!rendered(Value::Null, ""));
        assert!(!rendered(Value::Null, "None"));
        // A literal is JSON: the string "42" and the number 42 differ both ways.
        let literal = |actual: Value, written: Value| {
            written_matches(&actual, &written, TextCase::Exact, Written::Literal)
        };
        assert!(!literal(json!(42), json!("42")));
        assert!(!literal(json!("42"), json!(42)));
        assert!(literal(json!(42.0), json!(42)));
        assert!(literal(json!("A-17"), json!("A-17")));
        // Case rules apply to strings only, at any depth.
        assert!(written_matches(
            &json!({"to": "oslo", "n": [2]}),
            &json!({"to": "OSLO", "n": [2]}),
            TextCase::Insensitive,
            Written::Literal
        ));
        assert!(!written_matches(
            &json!("oslo "),
            &json!("OSLO"),
            TextCase::Insensitive,
            Written::Literal
        ));
        assert!(written_matches(
            &json!("oslo "),
            &json!("OSLO"),
            TextCase::InsensitiveTrimmed,
            Written::Literal
        ));
    }

    #[test]
    fn mocks_outputs_and_policies_compare_by_json_equality() {
        let when = |v: Value| v.as_object().cloned().unwrap_or_default();
        let mut sandbox = sandbox(vec![(
            "book",
            ToolSpec {
                answer: ToolAnswer::Matched(vec![MatchedOutput {
                    when: when(json!({"passengers": "2"})),
                    output: json!("two"),
                    state_changes: vec![],
                }]),
                policies: vec![Policy::AllowedValues {
                    param: "class".into(),
                    values: vec![json!("1"), json!("2")],
                }],
                ..ToolSpec::default()
            },
        )]);
        assert_eq!(
            sandbox.call("book", &json!({"passengers": "2", "class": "2"})),
            ToolOutcome::Executed(json!("two"))
        );
        // A mock keyed on the string "2" does not answer the number 2, and a number is
        // not among allowed strings.
        assert!(!matches!(
            sandbox.call("book", &json!({"passengers": 2})),
            ToolOutcome::Executed(_)
        ));
        assert!(matches!(
            sandbox.call("book", &json!({"passengers": "2", "class": 2})),
            ToolOutcome::Violation(_)
        ));
    }

    #[test]
    fn matched_outputs_are_a_subset_match_in_order_with_exact_strings() {
        let tool = ToolSpec {
            answer: ToolAnswer::Matched(vec![
                MatchedOutput {
                    when: json!({"id": "c1", "verbose": true})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                    output: json!("verbose c1"),
                    state_changes: vec![],
                },
                MatchedOutput {
                    when: json!({"id": "c1"}).as_object().cloned().unwrap_or_default(),
                    output: json!("c1"),
                    state_changes: vec![],
                },
                MatchedOutput {
                    when: json!({"n": 2}).as_object().cloned().unwrap_or_default(),
                    output: json!("two"),
                    state_changes: vec![],
                },
            ]),
            ..ToolSpec::default()
        };
        let mut sandbox = sandbox(vec![("get", tool)]);
        let executed = |v: &str| ToolOutcome::Executed(json!(v));
        assert_eq!(
            sandbox.call("get", &json!({"id": "c1", "verbose": true, "x": 1})),
            executed("verbose c1")
        );
        assert_eq!(sandbox.call("get", &json!({"id": "c1"})), executed("c1"));
        // Numbers compare by value.
        assert_eq!(sandbox.call("get", &json!({"n": 2.0})), executed("two"));
        // Strings are exact: case matters.
        let no_match = ToolOutcome::Error(SandboxError::NoMatchingOutput { name: "get".into() });
        assert_eq!(sandbox.call("get", &json!({"id": "C1"})), no_match);
        assert_eq!(sandbox.call("get", &json!([1, 2])), no_match);
        assert_eq!(sandbox.call("get", &Value::Null), no_match);
        assert_eq!(sandbox.error_count(), 3);
    }

    #[test]
    fn sequences_repeat_the_last_output_or_fail_when_exhausted() {
        let sequence = |when_exhausted| ToolSpec {
            answer: ToolAnswer::Sequence {
                outputs: vec![json!("pending"), json!("done")],
                when_exhausted,
            },
            ..ToolSpec::default()
        };
        let mut sandbox = sandbox(vec![
            ("poll", sequence(Exhausted::RepeatLast)),
            ("once", sequence(Exhausted::Error)),
            (
                "empty",
                ToolSpec {
                    answer: ToolAnswer::Sequence {
                        outputs: vec![],
                        when_exhausted: Exhausted::RepeatLast,
                    },
                    ..ToolSpec::default()
                },
            ),
        ]);
        let outputs: Vec<ToolOutcome> = (0..4).map(|_| sandbox.call("poll", &json!({}))).collect();
        assert_eq!(
            outputs,
            ["pending", "done", "done", "done"]
                .map(|v| ToolOutcome::Executed(json!(v)))
                .to_vec()
        );
        assert_eq!(
            sandbox.call("once", &json!({})),
            ToolOutcome::Executed(json!("pending"))
        );
        assert_eq!(
            sandbox.call("once", &json!({})),
            ToolOutcome::Executed(json!("done"))
        );
        let exhausted = ToolOutcome::Error(SandboxError::Exhausted {
            name: "once".into(),
            outputs: 2,
        });
        assert_eq!(sandbox.call("once", &json!({})), exhausted);
        assert_eq!(sandbox.call("once", &json!({})), exhausted);
        assert!(matches!(
            sandbox.call("empty", &json!({})),
            ToolOutcome::Error(SandboxError::Exhausted { outputs: 0, .. })
        ));
    }

    #[test]
    fn a_breach_consumes_no_sequence_output() {
        let tool = ToolSpec {
            answer: ToolAnswer::Sequence {
                outputs: vec![json!(1), json!(2)],
                when_exhausted: Exhausted::Error,
            },
            policies: vec![Policy::max_limit(10.0)],
            ..ToolSpec::default()
        };
        let mut sandbox = sandbox(vec![("pay", tool)]);
        assert!(matches!(
            sandbox.call("pay", &json!({"amount": 11})),
            ToolOutcome::Violation(_)
        ));
        assert_eq!(
            sandbox.call("pay", &json!({"amount": 10})),
            ToolOutcome::Executed(json!(1))
        );
    }

    #[test]
    fn undeclared_tools_get_the_harness_default_or_an_error() {
        let mut default = sandbox(vec![]);
        assert_eq!(
            default.call("reboot_router", &json!({})),
            ToolOutcome::Executed(
                json!({"status": "success", "message": "Executed reboot_router"})
            )
        );
        let mut strict = Sandbox::new(Arc::new(SandboxSpec {
            undeclared: UndeclaredTool::Error,
            ..SandboxSpec::default()
        }));
        assert_eq!(
            strict.call("reboot_router", &json!({})),
            ToolOutcome::Error(SandboxError::UndeclaredTool {
                name: "reboot_router".into()
            })
        );
        assert_eq!(strict.error_count(), 1);
    }

    #[test]
    fn a_max_limit_breach_is_not_executed_and_is_recorded() {
        let mut sandbox = sandbox(vec![("apply_refund", refund_tool(50.0))]);
        let breach = sandbox.call("apply_refund", &json!({"amount": 100}));
        assert_eq!(
            breach,
            ToolOutcome::Violation("Amount 100 exceeds limit of 50.0".into())
        );
        assert_eq!(sandbox.state_at("account.refunded"), None);
        // The agent self-corrects: at the limit is allowed.
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": 50})),
            ToolOutcome::Executed(json!({"status": "success", "message": "Refund applied"}))
        );
        assert_eq!(sandbox.state_at("account.refunded"), Some(&json!(true)));
        assert_eq!(sandbox.violation_count(), 1);
        let (call, text) = sandbox
            .violations()
            .next()
            .unwrap_or_else(|| unreachable!());
        assert_eq!(call.params, json!({"amount": 100}));
        assert_eq!(text, "Amount 100 exceeds limit of 50.0");
        assert_eq!(sandbox.error_count(), 0);
    }

    #[test]
    fn max_limit_reads_money_and_refuses_what_it_cannot_compare() {
        let mut sandbox = sandbox(vec![("apply_refund", refund_tool(50.0))]);
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": "100.50"})),
            ToolOutcome::Violation("Amount 100.50 exceeds limit of 50.0".into())
        );
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": 50.5})),
            ToolOutcome::Violation("Amount 50.5 exceeds limit of 50.0".into())
        );
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": 1e300})),
            ToolOutcome::Violation("Amount 1e+300 exceeds limit of 50.0".into())
        );
        // Money as people (and models) write it is read as its amount.
        for amount in [
            "$100",
            "1,000",
            "€ 1,250.50",
            "75£",
            "100 USD",
            "USD 100",
            "US$100",
            "C$ 75",
            "100.00 EUR",
            "1.000,00 €",
            "100,50",
            "12,345,678",
            "eur 60",
        ] {
            assert_eq!(
                sandbox.call("apply_refund", &json!({ "amount": amount })),
                ToolOutcome::Violation(format!("Amount {amount} exceeds limit of 50.0")),
                "{amount}"
            );
        }
        for amount in ["$40", "40 USD", "49,99 €", "EUR 12.5", "1,5"] {
            assert!(
                matches!(
                    sandbox.call("apply_refund", &json!({ "amount": amount })),
                    ToolOutcome::Executed(_)
                ),
                "{amount}"
            );
        }
        // What cannot be compared with the limit is refused, never let through unchecked.
        for amount in [
            json!("lots"),
            json!("$"),
            json!("12,34,567"),
            json!("$1e9"),
            json!("$ -"),
            json!("NaN"),
            json!("100 dollars"),
            json!("1.000.000"),
            json!("1.000 €"),
            json!("10.000 EUR"),
            json!([100]),
            json!(true),
        ] {
            let ToolOutcome::Violation(text) =
                sandbox.call("apply_refund", &json!({ "amount": amount }))
            else {
                panic!("{amount} went through");
            };
            assert!(
                text.ends_with("cannot be checked against the limit of 50.0: it is not a number"),
                "{text}"
            );
        }
        // Without the parameter there is nothing to check (the harness's reading); arguments
        // that are no object at all are refused, not read as having none.
        for params in [json!({}), json!({"amount": null})] {
            assert!(
                matches!(
                    sandbox.call("apply_refund", &params),
                    ToolOutcome::Executed(_)
                ),
                "{params}"
            );
        }
        assert!(matches!(
            sandbox.call("apply_refund", &json!("amount")),
            ToolOutcome::Error(SandboxError::ArgumentsNotObject { .. })
        ));
    }

    #[test]
    fn general_policies_name_the_parameter() {
        let tool = ToolSpec {
            policies: vec![
                Policy::Maximum {
                    param: "quantity".into(),
                    limit: 3.0,
                },
                Policy::AllowedValues {
                    param: "currency".into(),
                    values: vec![json!("EUR"), json!("USD")],
                },
            ],
            ..ToolSpec::fixed(json!("ok"))
        };
        let mut sandbox = sandbox(vec![("order", tool)]);
        assert_eq!(
            sandbox.call("order", &json!({"quantity": 4})),
            ToolOutcome::Violation("Quantity 4 exceeds limit of 3.0".into())
        );
        assert_eq!(
            sandbox.call("order", &json!({"quantity": 2, "currency": "GBP"})),
            ToolOutcome::Violation(
                "Currency GBP is not one of the allowed values ['EUR', 'USD']".into()
            )
        );
        assert_eq!(
            sandbox.call("order", &json!({"quantity": 2, "currency": "EUR"})),
            ToolOutcome::Executed(json!("ok"))
        );
        assert_eq!(sandbox.violation_count(), 2);
    }

    #[test]
    fn state_changes_apply_to_a_state_seeded_from_the_initial_state() {
        let tool = ToolSpec {
            state_changes: vec![
                StateChange {
                    path: "account.balance".into(),
                    value: json!(0),
                },
                StateChange {
                    path: "/tickets/1/status".into(),
                    value: json!("closed"),
                },
                StateChange {
                    path: "a~1b".into(),
                    value: json!("dotted keeps ~1"),
                },
                StateChange {
                    path: "/a~1b".into(),
                    value: json!("pointer unescapes"),
                },
                StateChange {
                    path: "new.deep.key".into(),
                    value: json!([1]),
                },
            ],
            ..ToolSpec::fixed(json!("ok"))
        };
        let spec = SandboxSpec {
            tools: [("close".to_string(), tool)].into_iter().collect(),
            initial_state: json!({
                "account": {"balance": 100, "owner": "Jane"},
                "tickets": [{"status": "open"}, {"status": "open"}]
            }),
            ..SandboxSpec::default()
        };
        let mut sandbox = Sandbox::new(Arc::new(spec));
        assert_eq!(sandbox.state_at("account.balance"), Some(&json!(100)));
        sandbox.call("close", &json!({}));
        assert_eq!(
            sandbox.state(),
            &json!({
                "account": {"balance": 0, "owner": "Jane"},
                "tickets": [{"status": "open"}, {"status": "closed"}],
                "a~1b": "dotted keeps ~1",
                "a/b": "pointer unescapes",
                "new": {"deep": {"key": [1]}}
            })
        );
        assert_eq!(sandbox.state_at("tickets.1.status"), Some(&json!("closed")));
        assert_eq!(sandbox.state_at("/account/owner"), Some(&json!("Jane")));
        assert!(sandbox.calls()[0].state_errors.is_empty());
    }

    #[test]
    fn state_changes_that_cannot_apply_are_noted_not_forced() {
        let change = |path: &str| StateChange {
            path: path.into(),
            value: json!(1),
        };
        let tool = ToolSpec {
            state_changes: vec![
                change("name.first"),
                change("list.5"),
                change("list.x.y"),
                change(""),
                change("ok"),
            ],
            ..ToolSpec::fixed(json!("ok"))
        };
        let spec = SandboxSpec {
            tools: [("t".to_string(), tool)].into_iter().collect(),
            initial_state: json!({"name": "Jane", "list": [0]}),
            ..SandboxSpec::default()
        };
        let mut sandbox = Sandbox::new(Arc::new(spec));
        assert_eq!(
            sandbox.call("t", &json!({})),
            ToolOutcome::Executed(json!("ok"))
        );
        assert_eq!(
            sandbox.state(),
            &json!({"name": "Jane", "list": [0], "ok": 1})
        );
        assert_eq!(
            sandbox.calls()[0].state_errors,
            vec![
                "state change at 'name.first': 'first' is inside a string",
                "state change at 'list.5': '5' is not an index of a 1-item array",
                "state change at 'list.x.y': 'x' is not an index of a 1-item array",
                "state change at '': the path is empty",
            ]
        );
        // A state that is not an object at all.
        let spec = SandboxSpec {
            tools: [(
                "t".to_string(),
                ToolSpec {
                    state_changes: vec![change("a")],
                    ..ToolSpec::fixed(json!("ok"))
                },
            )]
            .into_iter()
            .collect(),
            initial_state: json!(7),
            ..SandboxSpec::default()
        };
        let mut sandbox = Sandbox::new(Arc::new(spec));
        sandbox.call("t", &json!({}));
        assert_eq!(sandbox.state(), &json!(7));
        assert_eq!(sandbox.state_at("a"), None);
        assert_eq!(sandbox.state_at(""), Some(&json!(7)));
    }

    #[test]
    fn a_fork_copies_the_state_and_shares_the_spec() {
        let mut trunk = sandbox(vec![("apply_refund", refund_tool(50.0))]);
        trunk.call("lookup", &json!({}));
        let mut fork = trunk.clone();
        assert!(Arc::ptr_eq(&trunk.spec, &fork.spec));
        fork.call("apply_refund", &json!({"amount": 10}));
        assert_eq!(fork.state_at("account.refunded"), Some(&json!(true)));
        assert_eq!(trunk.state_at("account.refunded"), None);
        assert_eq!((trunk.calls().len(), fork.calls().len()), (1, 2));
    }

    #[test]
    fn calls_past_the_limit_are_refused_and_counted_not_stored() {
        let mut sandbox = Sandbox::new(Arc::new(SandboxSpec {
            max_calls: 3,
            ..SandboxSpec::default()
        }));
        for _ in 0..3 {
            assert!(matches!(
                sandbox.call("t", &json!({})),
                ToolOutcome::Executed(_)
            ));
        }
        for _ in 0..5 {
            assert_eq!(
                sandbox.call("t", &json!({})),
                ToolOutcome::Error(SandboxError::TooManyCalls { limit: 3 })
            );
        }
        assert_eq!(sandbox.calls().len(), 3);
        assert_eq!(sandbox.refused_calls(), 5);
        assert_eq!(sandbox.error_count(), 5);
    }

    #[test]
    fn spec_wording_feedback() {
        let executed = ToolOutcome::Executed(harness_default("x"));
        assert_eq!(
            feedback(FeedbackWording::Spec, &[("x", &executed)]),
            r#"Tool 'x' returned: {"status": "success", "message": "Executed x"}. Continue with the task."#
        );
        let breach = ToolOutcome::Violation("Amount 100 exceeds limit of 50.0".into());
        assert_eq!(
            feedback(FeedbackWording::Spec, &[("apply_refund", &breach)]),
            "GOVERNANCE ERROR: Amount 100 exceeds limit of 50.0. Please adjust your action."
        );
        let line = ToolOutcome::Executed(json!({"line": "ok"}));
        let speed = ToolOutcome::Executed(json!({"mbps": 93.5, "note": "café"}));
        assert_eq!(
            feedback(
                FeedbackWording::Spec,
                &[("run_line_test", &line), ("run_remote_speed_test", &speed)]
            ),
            "Tools ['run_line_test', 'run_remote_speed_test'] returned: \
             [{\"line\": \"ok\"}, {\"mbps\": 93.5, \"note\": \"caf\\u00e9\"}]. Continue with the task."
        );
        let error = ToolOutcome::Error(SandboxError::UndeclaredTool { name: "zap".into() });
        let text = feedback(FeedbackWording::Spec, &[("zap", &error), ("a", &breach)]);
        assert_eq!(
            text,
            "Tools ['zap', 'a'] returned: [\
             {\"status\": \"error\", \"message\": \"tool 'zap' is not declared in this scenario\"}, \
             {\"status\": \"policy_violation\", \"violation\": \"Amount 100 exceeds limit of 50.0\"}\
             ]. Continue with the task."
        );
    }

    #[test]
    fn harness_wording_feedback() {
        let mut sandbox = sandbox(vec![("apply_refund", refund_tool(50.0))]);
        let undeclared = sandbox.call("reset_modem", &json!({}));
        assert_eq!(
            feedback(FeedbackWording::Harness, &[("reset_modem", &undeclared)]),
            "Executed reset_modem"
        );
        let breach = sandbox.call("apply_refund", &json!({"amount": 100}));
        assert_eq!(
            feedback(FeedbackWording::Harness, &[("apply_refund", &breach)]),
            "{'status': 'policy_violation', 'violation': 'Amount 100 exceeds limit of 50.0'}"
        );
        let no_message = ToolOutcome::Executed(json!({"balance": 12.0}));
        assert_eq!(
            feedback(
                FeedbackWording::Harness,
                &[("balance", &no_message), ("reset_modem", &undeclared)]
            ),
            "{'balance': 12.0}\nExecuted reset_modem"
        );
    }

    #[test]
    fn python_repr_of_nested_values() {
        assert_eq!(
            python_repr(&json!({"a": [1, 2.0, true, false, null, {"b": "it's"}], "c": "x\"y'z\n"})),
            r#"{'a': [1, 2.0, True, False, None, {'b': "it's"}], 'c': 'x"y\'z\n'}"#
        );
        assert_eq!(
            python_repr(&json!("back\\slash\u{1}é")),
            r"'back\\slash\x01é'"
        );
        assert_eq!(python_str(&json!("plain")), "plain");
        assert_eq!(python_str(&json!(-3)), "-3");
        assert_eq!(
            python_str(&json!(18446744073709551615u64)),
            "18446744073709551615"
        );
    }

    #[test]
    fn python_float_repr() {
        let cases = [
            (50.0, "50.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (value, expected) in cases {
            assert_eq!(python_float(value), expected, "{value:e}");
        }
    }

    #[test]
    fn python_json_dumps_matches_python_defaults() {
        assert_eq!(
            python_json_dumps(&json!([{"k": [1, 2.5, null, true]}, "\"q\"\t\u{7}😀"])),
            r#"[{"k": [1, 2.5, null, true]}, "\"q\"\t\u0007\ud83d\ude00"]"#
        );
        assert_eq!(python_json_dumps(&json!(3.0)), "3.0");
        assert_eq!(python_json_dumps(&json!({})), "{}");
    }

    #[test]
    fn state_expectations() {
        let spec = SandboxSpec {
            initial_state: json!({
                "balance": 49.9999,
                "status": "Refund Approved",
                "tags": ["vip", "eu"],
                "profile": {"tier": "gold"},
                "count": 2,
                "nothing": null,
                "text_number": "12.5"
            }),
            ..SandboxSpec::default()
        };
        let sandbox = Sandbox::new(Arc::new(spec));
        let holds = |path: &str, e: StateExpectation| e.holds(sandbox.state_at(path));
        assert!(holds("count", StateExpectation::Equals(json!(2.0))));
        assert!(!holds("count", StateExpectation::Equals(json!("2"))));
        assert!(holds(
            "profile",
            StateExpectation::Equals(json!({"tier": "gold"}))
        ));
        assert!(!holds("missing", StateExpectation::Equals(Value::Null)));
        assert!(holds("nothing", StateExpectation::Equals(Value::Null)));
        assert!(holds(
            "status",
            StateExpectation::Contains(json!("Approved"))
        ));
        assert!(!holds(
            "status",
            StateExpectation::Contains(json!("approved"))
        ));
        assert!(holds(
            "status",
            StateExpectation::Contains(json!(["x", "Refund"]))
        ));
        assert!(holds("tags", StateExpectation::Contains(json!("eu"))));
        assert!(!holds("tags", StateExpectation::Contains(json!("us"))));
        assert!(holds("profile", StateExpectation::Contains(json!("tier"))));
        assert!(!holds("count", StateExpectation::Contains(json!(2))));
        let regex = |p: &str, ci| StateExpectation::regex(p, ci).unwrap_or_else(|e| panic!("{e}"));
        assert!(holds("status", regex("refund\\s+approved", true)));
        assert!(!holds("status", regex("refund\\s+approved", false)));
        assert!(holds("tags", regex(r#""vip""#, false)));
        assert!(StateExpectation::regex("(unclosed", true).is_err());
        let near = |value| StateExpectation::Near {
            value,
            tolerance: HARNESS_TOLERANCE,
        };
        assert!(!holds("balance", near(50.0)));
        assert!(holds(
            "balance",
            StateExpectation::Near {
                value: 50.0,
                tolerance: 1e-3
            }
        ));
        assert!(holds("count", near(2.0)));
        assert!(holds("text_number", near(12.5)));
        assert!(!holds("status", near(0.0)));
        assert!(!holds("count", near(f64::NAN)));
        assert!(holds("nothing", StateExpectation::Exists));
        assert!(!holds("nothing", StateExpectation::Absent));
        assert!(holds("profile.tier.deeper", StateExpectation::Absent));
        assert!(holds("tags.9", StateExpectation::Absent));
    }

    #[test]
    fn agent_input_of_any_shape_never_panics() {
        let tool = ToolSpec {
            answer: ToolAnswer::Matched(vec![MatchedOutput {
                when: json!({"id": {"nested": [1]}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                output: json!("nested"),
                state_changes: vec![StateChange {
                    path: "x.y".into(),
                    value: json!(1),
                }],
            }]),
            policies: vec![
                Policy::max_limit(50.0),
                Policy::Maximum {
                    param: "".into(),
                    limit: f64::NAN,
                },
                Policy::AllowedValues {
                    param: "mode".into(),
                    values: vec![],
                },
            ],
            ..ToolSpec::default()
        };
        let mut sandbox = sandbox(vec![("t", tool)]);
        let inputs = [
            json!(null),
            json!(true),
            json!(-1),
            json!(u64::MAX),
            json!(1.7976931348623157e308),
            json!("🙂"),
            json!([[[]]]),
            json!({"amount": u64::MAX}),
            json!({"amount": i64::MIN}),
            json!({"amount": -1.7976931348623157e308}),
            json!({"amount": "1e999"}),
            json!({"amount": "inf"}),
            json!({"": 1e300}),
            json!({"id": {"nested": [1.0]}}),
            json!({"mode": {"deep": [null]}}),
        ];
        for params in &inputs {
            let outcome = sandbox.call("t", params);
            let _ = feedback(FeedbackWording::Spec, &[("t", &outcome)]);
            let _ = feedback(
                FeedbackWording::Harness,
                &[("t", &outcome), ("u", &outcome)],
            );
            let _ = python_repr(params);
            let _ = python_json_dumps(params);
        }
        assert_eq!(
            sandbox.call("t", &json!({"amount": u64::MAX})),
            ToolOutcome::Violation("Amount 18446744073709551615 exceeds limit of 50.0".into())
        );
        assert_eq!(
            sandbox.call("t", &json!({"id": {"nested": [1.0]}})),
            ToolOutcome::Executed(json!("nested"))
        );
        assert_eq!(
            sandbox.call("t", &json!({"mode": "any"})),
            ToolOutcome::Violation("Mode any is not one of the allowed values []".into())
        );
        assert_eq!(sandbox.calls().len(), inputs.len() + 3);
    }

    #[test]
    fn from_the_suites_tool_nodes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("tools.kdl");
        std::fs::write(
            &file,
            r##"
tool "apply_refund" {
    mock returns=#"{"status": "success", "message": "Refunded VIP"}"# tier="vip"
    mock returns=#"{"status": "success", "message": "Refunded"}"#
    policy param="amount" max-limit=50
}
tool "ping"
"##,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let project =
            trellis_dsl::load(&[&file], &[&FIXTURE_PROTOCOL]).unwrap_or_else(|d| panic!("{d:?}"));
        let mut sandbox = Sandbox::new(Arc::new(SandboxSpec::from_tools(&project.tools)));
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": 20, "tier": "vip"})),
            ToolOutcome::Executed(json!({"status": "success", "message": "Refunded VIP"}))
        );
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": 20})),
            ToolOutcome::Executed(json!({"status": "success", "message": "Refunded"}))
        );
        assert_eq!(
            sandbox.call("apply_refund", &json!({"amount": 100})),
            ToolOutcome::Violation("Amount 100 exceeds limit of 50.0".into())
        );
        assert_eq!(
            sandbox.call("ping", &json!({})),
            ToolOutcome::Executed(harness_default("ping"))
        );
    }

    #[test]
    fn a_scenario_sandbox_from_state_sequence_and_policy_nodes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("s.kdl");
        std::fs::write(
            &file,
            r##"
agent "a" protocol="multiagent" url="http://127.0.0.1:9/execute_task"
tool "refund" {
    state path="audit.refunds" value=1
    mock returns=#"{"status": "success"}"# {
        state path="orders.0.status" value="refunded"
    }
    policy "currency" allowed="EUR" "USD"
}
tool "poll" {
    sequence when-exhausted="error" { output "pending"; output "done"; }
}
scenario "s" {
    initial-state json=#"{"orders": [{"status": "open"}]}"#
    undeclared-tools "error"
    user "hi"
}
"##,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let project =
            trellis_dsl::load(&[&file], &[&FIXTURE_PROTOCOL]).unwrap_or_else(|d| panic!("{d:?}"));
        let (_, scenario) = project
            .scenarios()
            .next()
            .unwrap_or_else(|| panic!("one scenario"));
        let mut sandbox = Sandbox::new(Arc::new(SandboxSpec::for_scenario(
            &SandboxSpec::project_tools(&project),
            scenario,
        )));
        assert_eq!(sandbox.state_at("orders.0.status"), Some(&json!("open")));
        assert_eq!(
            sandbox.call("refund", &json!({"currency": "GBP"})),
            ToolOutcome::Violation(
                "Currency GBP is not one of the allowed values ['EUR', 'USD']".into()
            )
        );
        assert_eq!(sandbox.state_at("orders.0.status"), Some(&json!("open")));
        assert_eq!(
            sandbox.call("refund", &json!({"currency": "EUR"})),
            ToolOutcome::Executed(json!({"status": "success"}))
        );
        assert_eq!(
            sandbox.state_at("orders.0.status"),
            Some(&json!("refunded"))
        );
        assert_eq!(sandbox.state_at("audit.refunds"), Some(&json!(1)));
        assert_eq!(
            sandbox.call("poll", &json!({})),
            ToolOutcome::Executed(json!("pending"))
        );
        assert_eq!(
            sandbox.call("poll", &json!({})),
            ToolOutcome::Executed(json!("done"))
        );
        assert!(matches!(
            sandbox.call("poll", &json!({})),
            ToolOutcome::Error(_)
        ));
        assert!(matches!(
            sandbox.call("nope", &json!({})),
            ToolOutcome::Error(_)
        ));
    }

    #[test]
    fn sequence_outputs_with_params_are_consumed_by_the_first_matching_call() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("tools.kdl");
        // Connexity's mock_responses: ordered, matched, consumed.
        std::fs::write(
            &file,
            r##"
tool "lookup_order" {
    sequence when-exhausted="error" {
        output #"{"order": "A", "n": 1}"# order_id="ORD-1"
        output #"{"order": "B"}"# order_id="ORD-2" region=#null
        output #"{"order": "A", "n": 2}"# order_id="ORD-1"
        output #"{"any": true}"#
    }
}
tool "ping" {
    sequence { output "first" id=1; output "last" id=2; }
}
"##,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let project =
            trellis_dsl::load(&[&file], &[&FIXTURE_PROTOCOL]).unwrap_or_else(|d| panic!("{d:?}"));
        let mut sandbox = Sandbox::new(Arc::new(SandboxSpec::from_tools(&project.tools)));
        // Strings match case-insensitively and trimmed; `#null` matches a missing key.
        assert_eq!(
            sandbox.call("lookup_order", &json!({"order_id": " ord-2 "})),
            ToolOutcome::Executed(json!({"order": "B"}))
        );
        // The first unconsumed match, not the next in line.
        assert_eq!(
            sandbox.call("lookup_order", &json!({"order_id": "ORD-1", "extra": 3})),
            ToolOutcome::Executed(json!({"order": "A", "n": 1}))
        );
        // ORD-2's answer is consumed: the output without params answers.
        assert_eq!(
            sandbox.call("lookup_order", &json!({"order_id": "ORD-2"})),
            ToolOutcome::Executed(json!({"any": true}))
        );
        // Nothing left for ORD-9, one output left for ORD-1.
        assert_eq!(
            sandbox.call("lookup_order", &json!({"order_id": "ORD-9"})),
            ToolOutcome::Error(SandboxError::NoMatchingOutput {
                name: "lookup_order".into()
            })
        );
        assert_eq!(
            sandbox.call("lookup_order", &json!({"order_id": "ord-1"})),
            ToolOutcome::Executed(json!({"order": "A", "n": 2}))
        );
        let exhausted = sandbox.call("lookup_order", &json!({"order_id": "ORD-1"}));
        assert_eq!(
            exhausted,
            ToolOutcome::Error(SandboxError::Exhausted {
                name: "lookup_order".into(),
                outputs: 4
            })
        );
        assert_eq!(
            exhausted.result_object(),
            json!({"status": "error", "message": "tool 'lookup_order' has answered all of its 4 outputs"})
        );
        assert_eq!(sandbox.error_count(), 2);
        // Numbers by value; a non-string never equals a string; repeat-last repeats the
        // last output only for a call it matches.
        assert!(matches!(
            sandbox.call("ping", &json!({"id": "1"})),
            ToolOutcome::Error(SandboxError::NoMatchingOutput { .. })
        ));
        assert_eq!(
            sandbox.call("ping", &json!({"id": 1.0})),
            ToolOutcome::Executed(json!("first"))
        );
        assert_eq!(
            sandbox.call("ping", &json!({"id": 2})),
            ToolOutcome::Executed(json!("last"))
        );
        assert_eq!(
            sandbox.call("ping", &json!({"id": 2})),
            ToolOutcome::Executed(json!("last"))
        );
        assert!(matches!(
            sandbox.call("ping", &json!({"id": 1})),
            ToolOutcome::Error(SandboxError::NoMatchingOutput { .. })
        ));
        // A fork keeps its own consumption.
        let mut fresh = Sandbox::new(Arc::new(SandboxSpec::from_tools(&project.tools)));
        let fork = fresh.clone();
        let _ = fresh.call("lookup_order", &json!({"order_id": "ORD-2"}));
        let mut fork = fork;
        assert_eq!(
            fork.call("lookup_order", &json!({"order_id": "ORD-2"})),
            ToolOutcome::Executed(json!({"order": "B"}))
        );
    }

    #[test]
    fn a_scenarios_own_tools_replace_the_projects_for_that_scenario_only() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("s.kdl");
        std::fs::write(
            &file,
            r##"
agent "a" protocol="multiagent" url="http://127.0.0.1:9/execute_task"
tool "lookup" { mock returns=#"{"from": "project"}"#; }
scenario "own" {
    tool "lookup" { mock returns=#"{"from": "scenario"}"#; }
    tool "extra" { policy max-limit=5; }
    user "hi"
}
scenario "shared" {
    user "hi"
}
"##,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let project =
            trellis_dsl::load(&[&file], &[&FIXTURE_PROTOCOL]).unwrap_or_else(|d| panic!("{d:?}"));
        let sandbox_of = |id: &str| {
            let (_, scenario) = project
                .scenarios()
                .find(|(_, s)| s.id.value == id)
                .unwrap_or_else(|| panic!("scenario {id}"));
            Sandbox::new(Arc::new(SandboxSpec::for_scenario(
                &SandboxSpec::project_tools(&project),
                scenario,
            )))
        };
        let mut own = sandbox_of("own");
        assert_eq!(
            own.call("lookup", &json!({})),
            ToolOutcome::Executed(json!({"from": "scenario"}))
        );
        assert!(matches!(
            own.call("extra", &json!({"amount": 9})),
            ToolOutcome::Violation(_)
        ));
        let mut shared = sandbox_of("shared");
        assert_eq!(
            shared.call("lookup", &json!({})),
            ToolOutcome::Executed(json!({"from": "project"}))
        );
        assert_eq!(
            shared.call("extra", &json!({"amount": 9})),
            ToolOutcome::Executed(harness_default("extra"))
        );
    }
}
