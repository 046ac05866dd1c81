//! `builtin="support"`: a deterministic MultiAgentEval reference agent (customer support for
//! orders), for the example suite and tests of the action loop over every transport.
//!
//! **Stateless.** Every answer is decided from the one request it answers ([`decide`]): the
//! current `task_description`, and `conversation_history` when the harness sends the spec's
//! full request. So the same agent works with `{task_description}`-only requests, over HTTP
//! (`POST /execute_task`), a process (`trellis agent support --stdio|--per-call`) and a
//! socket, and a fork of the conversation needs nothing from it. Every reply carries
//! `"name":"trellis-support"` at top level (the harness's name discovery).
//!
//! **What the current `task_description` is**, tested in this order:
//! 1. `Continue on branch K of N: OPTION.` — a continuation of its own `branch` action;
//! 2. `Approved`, `Approved: MESSAGE`, `Rejected…` — a human's answer to its `hitl_pause`;
//! 3. tool results in the spec's wording (`Tool 'NAME' returned: {json}. Continue with the
//!    task.`, `Tools ['A', 'B'] returned: [{json}, …]. …`);
//! 4. governance feedback: any text saying `… exceeds limit of X` (the spec's `GOVERNANCE
//!    ERROR: Amount 100 exceeds limit of 50.0. Please adjust your action.` and the newer
//!    harness's `{'status': 'policy_violation', 'violation': 'Amount 100 exceeds limit of
//!    50.0'}`);
//! 5. with the full request, whatever follows environment entries at the end of the history
//!    is the newer harness's wording of those tool results (the results are read from the
//!    history, the tool names from the agent's last call there);
//! 6. `Executed NAME` — the harness's default result of an undeclared tool;
//! 7. anything else is a new task from the user.
//!
//! **Tasks** (case-insensitive; an order id is letters, `-`, digits like `A-1001`, a customer
//! id `C-7`; an amount is the first number that is not part of an id, `$120`, `120.50`,
//! `1,200 USD`):
//! - `How do I …?` / `How can I …?` → `provide_instructions` (returns, tracking, cancelling;
//!   anything else gets what it can explain);
//! - `Refund $120 for order A-1001` → `call_tool get_order {order_id}` → `call_tool
//!   apply_refund {order_id, amount}` (the amount from the task, else the order's
//!   `refund_amount`/`amount`/`total`) → on governance feedback, `apply_refund` again with
//!   `amount` = the limit → `final_answer` "Refunded $50 for order A-1001. …";
//! - `Check order A-1001` → `call_multiple_tools` in the newer shape, `tool_calls:
//!   [{tool_name, tool_params}]` (`get_shipping_status`, `get_payment_status`, each with the
//!   order id) → `final_answer` summarising both results;
//! - `Run diagnostics` → `call_multiple_tools` in the spec's shape, `tool_names` +
//!   `tool_outputs` (`check_payment_gateway`, `check_shipping_api`; no parameters, which the
//!   spec's shape cannot carry) → `final_answer`;
//! - `Raise the credit limit of customer C-7 to 900` → `hitl_pause` with `reason` (and the
//!   change it waits to make in `metadata.pending`) → `Approved…` → `call_tool
//!   set_credit_limit {customer_id, credit_limit}` → `final_answer` "Raised the credit limit
//!   …"; `Rejected…` → `final_answer` "Left the credit limit … unchanged …";
//! - `Resolve the complaint on order A-1001` → `branch` with `metadata.options`
//!   `["refund", "replacement"]` → `Continue on branch K of N: refund.` follows the refund
//!   flow above (straight to `apply_refund` when the complaint names an amount);
//!   `…: replacement.` → `call_tool ship_replacement {order_id}` → `final_answer` "Shipped a
//!   replacement …";
//! - `Export the order history of customer C-7` → `processing` once, then `completed`. Only
//!   with the full request: it answers `processing` when `turn` is the number of its own
//!   replies in the history plus one (the first time this request is sent) and `completed`
//!   on the resend, whose `turn` is one higher. A `task_description`-only request is
//!   identical when resent, so it gets `completed` at once.
//! - anything else → `error` "Unsupported task: …".
//!
//! **What a `task_description`-only conversation loses**: the earlier messages. Order and
//! customer ids, amounts and the option being followed are then read from the tool results
//! (`order_id`, `amount`, …) when they carry them, and a retry after a policy breach or an
//! approved change goes out with the parameters it can still know. With neither a history
//! nor the spec's wording (`task_description` alone and the newer harness's words), only
//! `Executed NAME` and policy violations are recognisable as tool results; any other result
//! text reads as a new task.

use std::sync::LazyLock;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use regex::Regex;
use serde_json::{Map, Value, json};

/// The agent's name in every reply.
pub const AGENT_NAME: &str = "trellis-support";
/// The endpoint path, as the spec's agents serve it.
pub const PATH: &str = "/execute_task";

/// `POST /execute_task`: answers every JSON request with [`decide`]; a body that is not a
/// JSON object is a 400 with an `error` action.
pub fn router() -> Router {
    Router::new().route(PATH, post(execute_task))
}

async fn execute_task(body: Bytes) -> Response {
    match serde_json::from_slice::<Value>(&body) {
        Ok(request) => axum::Json(decide(&request)).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(unreadable(&format!("the body is not JSON ({e})"))),
        )
            .into_response(),
    }
}

/// The answer to one request as bytes (compact JSON, no line ending): what the line server,
/// the stdio loop and the per-call process send. Never fails: a request that is not JSON
/// gets an `error` action.
pub fn answer(request: &[u8]) -> Vec<u8> {
    let reply = match serde_json::from_slice::<Value>(request) {
        Ok(request) => decide(&request),
        Err(e) => unreadable(&format!("the request is not JSON ({e})")),
    };
    // Serialising a `Value` cannot fail (its keys are strings).
    serde_json::to_vec(&reply).unwrap_or_default()
}

fn unreadable(why: &str) -> Value {
    reply(
        "error",
        json!({ "summary": format!("Unreadable request: {why}") }),
    )
}

/// The reply to one MultiAgentEval request (`{task_description, turn?,
/// conversation_history?}`).
pub fn decide(request: &Value) -> Value {
    let Some(task) = request.get("task_description").and_then(Value::as_str) else {
        return reply(
            "error",
            json!({ "summary": "Unreadable request: no `task_description` string" }),
        );
    };
    let context = Context::of(request);
    match classify(task.trim(), &context) {
        Input::Branch(option) => follow_branch(option.as_deref(), &context),
        Input::Human { approved, message } => human_answer(approved, message, &context),
        Input::Violation { text, results } => self_correct(&text, &results, &context),
        Input::Results(results) => after_results(&results, &context),
        Input::Task(text) => new_task(text, &context),
    }
}

// ---------------------------------------------------------------------------------------------
// The request and its history

/// What the history says, when the harness sent one.
struct Context<'a> {
    /// `None` for a `task_description`-only request.
    history: Option<&'a [Value]>,
    turn: Option<u64>,
}

impl<'a> Context<'a> {
    fn of(request: &'a Value) -> Self {
        Context {
            history: request
                .get("conversation_history")
                .and_then(Value::as_array)
                .map(Vec::as_slice),
            turn: request.get("turn").and_then(Value::as_u64),
        }
    }

    fn entries(&self) -> impl DoubleEndedIterator<Item = (&'a str, &'a Value)> {
        self.history.unwrap_or_default().iter().filter_map(|entry| {
            let role = entry.get("role").and_then(Value::as_str)?;
            Some((role, entry.get("content").unwrap_or(&Value::Null)))
        })
    }

    /// The task of the user step under way: the latest user entry.
    fn user_task(&self) -> Option<&'a str> {
        self.entries()
            .rev()
            .find(|(role, _)| *role == "user")
            .and_then(|(_, content)| content.as_str())
    }

    /// The agent's replies in the history (the agent's own earlier answers).
    fn own_replies(&self) -> impl DoubleEndedIterator<Item = &'a Map<String, Value>> {
        self.entries()
            .filter(|(role, _)| *role == "agent")
            .filter_map(|(_, content)| content.as_object())
    }

    /// The calls of the agent's latest tool-calling reply, in order.
    fn last_calls(&self) -> Vec<(String, Map<String, Value>)> {
        self.own_replies()
            .rev()
            .find_map(|reply| {
                let calls = calls_of(reply);
                (!calls.is_empty()).then_some(calls)
            })
            .unwrap_or_default()
    }

    /// The parameters of the latest call to `tool`.
    fn last_params_of(&self, tool: &str) -> Option<Map<String, Value>> {
        self.own_replies().rev().find_map(|reply| {
            calls_of(reply)
                .into_iter()
                .rev()
                .find(|(name, _)| name == tool)
                .map(|(_, params)| params)
        })
    }

    /// The tool results the harness sent after the agent's latest reply (trailing
    /// environment entries), paired with the names of that reply's calls.
    fn trailing_results(&self) -> Option<Vec<(String, Value)>> {
        let history = self.history?;
        let results: Vec<&Value> = history
            .iter()
            .rev()
            .take_while(|entry| entry.get("role").and_then(Value::as_str) == Some("environment"))
            .filter_map(|entry| entry.get("content"))
            .collect();
        if results.is_empty() {
            return None;
        }
        let names = self.last_calls();
        Some(
            results
                .into_iter()
                .rev()
                .enumerate()
                .map(|(i, result)| {
                    let name = names.get(i).map(|(n, _)| n.clone()).unwrap_or_default();
                    (name, result.clone())
                })
                .collect(),
        )
    }

    /// The option of the branch being followed (from the harness's environment entry).
    fn branch_option(&self) -> Option<&'a str> {
        self.entries().rev().find_map(|(role, content)| {
            (role == "environment")
                .then(|| content.pointer("/branch/option").and_then(Value::as_str))
                .flatten()
        })
    }

    /// The change the agent's latest `hitl_pause` waits to make.
    fn pending_change(&self) -> Option<(String, Map<String, Value>)> {
        self.own_replies().rev().find_map(|reply| {
            if reply.get("action").and_then(Value::as_str) != Some("hitl_pause") {
                return None;
            }
            let pending = reply.get("metadata")?.get("pending")?;
            let tool = pending.get("tool_name")?.as_str()?.to_owned();
            let params = pending.get("tool_params")?.as_object()?.clone();
            Some((tool, params))
        })
    }
}

/// The calls a reply asked for: `call_tool`, or `call_multiple_tools` in either shape.
fn calls_of(reply: &Map<String, Value>) -> Vec<(String, Map<String, Value>)> {
    let params_of = |value: Option<&Value>| value.and_then(Value::as_object).cloned();
    match reply.get("action").and_then(Value::as_str) {
        Some("call_tool") => reply
            .get("tool_name")
            .and_then(Value::as_str)
            .map(|name| {
                let params = params_of(reply.get("tool_params")).unwrap_or_default();
                vec![(name.to_owned(), params)]
            })
            .unwrap_or_default(),
        Some("call_multiple_tools") => {
            if let Some(calls) = reply.get("tool_calls").and_then(Value::as_array) {
                calls
                    .iter()
                    .filter_map(|call| {
                        let name = call
                            .get("tool_name")
                            .or_else(|| call.get("tool"))
                            .and_then(Value::as_str)?;
                        let params =
                            params_of(call.get("tool_params").or_else(|| call.get("params")))
                                .unwrap_or_default();
                        Some((name.to_owned(), params))
                    })
                    .collect()
            } else {
                reply
                    .get("tool_names")
                    .and_then(Value::as_array)
                    .map(|names| {
                        names
                            .iter()
                            .filter_map(Value::as_str)
                            .map(|name| (name.to_owned(), Map::new()))
                            .collect()
                    })
                    .unwrap_or_default()
            }
        }
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// What the task description is

enum Input<'t> {
    /// `Continue on branch K of N[: OPTION].`
    Branch(Option<String>),
    Human {
        approved: bool,
        message: Option<&'t str>,
    },
    /// A policy refused the last call: the violation text, and the results when known.
    Violation {
        text: String,
        results: Vec<(String, Value)>,
    },
    /// Tool results, with the tool names when known (empty otherwise).
    Results(Vec<(String, Value)>),
    Task(&'t str),
}

fn regex(pattern: &str) -> Regex {
    // Every pattern is a constant of this file, covered by the unit tests.
    Regex::new(pattern).unwrap_or_else(|e| panic!("invalid built-in pattern {pattern}: {e}"))
}

static BRANCH: LazyLock<Regex> =
    LazyLock::new(|| regex(r"(?is)^continue on branch \d+ of \d+(?::\s*(.*?))?\.?\s*$"));
static HUMAN: LazyLock<Regex> =
    LazyLock::new(|| regex(r"(?is)^(approved|rejected)\b[\s:.,!-]*(.*)$"));
static ONE_RESULT: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?s)^Tool '([^']*)' returned: (.*)\.\s*Continue(?: with the task)?\.?\s*$")
});
static SEVERAL_RESULTS: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?s)^Tools \[(.*?)\] returned: (.*)\.\s*Continue(?: with the task)?\.?\s*$")
});
static QUOTED: LazyLock<Regex> = LazyLock::new(|| regex(r#"'([^']*)'|"([^"]*)""#));
static LIMIT: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)exceeds\s+(?:the\s+)?(?:maximum\s+)?(?:allowed\s+)?limit\s+of\s+[$€£]?\s*(-?\d[\d,]*(?:\.\d+)?)",
    )
});
static TRIED: LazyLock<Regex> =
    LazyLock::new(|| regex(r"(?i)\b\w+\s+[$€£]?(-?\d[\d,]*(?:\.\d+)?)\s+exceeds"));
static EXECUTED: LazyLock<Regex> = LazyLock::new(|| regex(r"^Executed (\S+)$"));
static ORDER_ID: LazyLock<Regex> = LazyLock::new(|| regex(r"\b([A-BD-Z][A-Z]?-\d+)\b"));
static CUSTOMER_ID: LazyLock<Regex> = LazyLock::new(|| regex(r"\b(C-\d+)\b"));
static ANY_ID: LazyLock<Regex> = LazyLock::new(|| regex(r"\b[A-Z]{1,2}-\d+\b"));
static AMOUNT: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?i)([$€£]\s*)?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(\s*(?:usd|eur|gbp|dollars?|euros?)\b)?")
});

fn classify<'t>(task: &'t str, context: &Context<'_>) -> Input<'t> {
    if let Some(caps) = BRANCH.captures(task) {
        let option = caps
            .get(1)
            .map(|m| m.as_str().trim().to_owned())
            .filter(|option| !option.is_empty());
        return Input::Branch(option);
    }
    if let Some(caps) = HUMAN.captures(task) {
        let approved = caps
            .get(1)
            .is_some_and(|m| m.as_str().eq_ignore_ascii_case("approved"));
        let message = caps
            .get(2)
            .map(|m| m.as_str().trim())
            .filter(|m| !m.is_empty());
        return Input::Human { approved, message };
    }
    if let Some(results) = spec_results(task) {
        return results_or_violation(results, None);
    }
    if LIMIT.is_match(task) {
        return Input::Violation {
            text: task.to_owned(),
            results: context.trailing_results().unwrap_or_default(),
        };
    }
    if let Some(results) = context.trailing_results() {
        return results_or_violation(results, Some(task));
    }
    if let Some(caps) = EXECUTED.captures(task) {
        let name = caps.get(1).map(|m| m.as_str()).unwrap_or_default();
        return Input::Results(vec![(
            name.to_owned(),
            json!({ "status": "success", "message": task }),
        )]);
    }
    Input::Task(task)
}

/// Results whose first policy violation makes them a violation.
fn results_or_violation<'t>(results: Vec<(String, Value)>, text: Option<&str>) -> Input<'t> {
    let violation = results.iter().find_map(|(_, result)| {
        (result.get("status").and_then(Value::as_str) == Some("policy_violation")).then(|| {
            result
                .get("violation")
                .map(text_of)
                .or_else(|| text.map(str::to_owned))
                .unwrap_or_default()
        })
    });
    match violation {
        Some(text) => Input::Violation { text, results },
        None => Input::Results(results),
    }
}

/// Tool results in the spec's wording, with the tool names.
fn spec_results(task: &str) -> Option<Vec<(String, Value)>> {
    if let Some(caps) = ONE_RESULT.captures(task) {
        let name = caps.get(1)?.as_str().to_owned();
        let result = parse_result(caps.get(2)?.as_str());
        return Some(vec![(name, result)]);
    }
    let caps = SEVERAL_RESULTS.captures(task)?;
    let names: Vec<String> = QUOTED
        .captures_iter(caps.get(1)?.as_str())
        .filter_map(|c| c.get(1).or_else(|| c.get(2)))
        .map(|m| m.as_str().to_owned())
        .collect();
    let results = match parse_result(caps.get(2)?.as_str()) {
        Value::Array(results) => results,
        other => vec![other],
    };
    Some(
        results
            .into_iter()
            .enumerate()
            .map(|(i, result)| (names.get(i).cloned().unwrap_or_default(), result))
            .collect(),
    )
}

/// A result as JSON when it is JSON, else the text itself.
fn parse_result(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| Value::String(text.trim().to_owned()))
}

/// A value as text: a string is itself, anything else its JSON.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Answers

fn reply(action: &str, fields: Value) -> Value {
    let mut reply = Map::new();
    reply.insert("action".into(), Value::String(action.into()));
    reply.insert("name".into(), Value::String(AGENT_NAME.into()));
    if let Value::Object(fields) = fields {
        reply.extend(fields);
    }
    Value::Object(reply)
}

fn call_tool(tool: &str, params: Map<String, Value>, summary: String) -> Value {
    reply(
        "call_tool",
        json!({ "tool_name": tool, "tool_params": params, "summary": summary }),
    )
}

fn final_answer(summary: String) -> Value {
    reply("final_answer", json!({ "summary": summary }))
}

/// Characters of a task quoted back in an error.
const QUOTED_TASK: usize = 200;

fn unsupported(what: &str) -> Value {
    let quoted: String = what.chars().take(QUOTED_TASK).collect();
    let cut = if quoted.len() < what.len() { "…" } else { "" };
    reply(
        "error",
        json!({ "summary": format!("Unsupported task: {quoted}{cut}") }),
    )
}

fn new_task(task: &str, context: &Context<'_>) -> Value {
    let lower = task.to_lowercase();
    if lower.starts_with("how do i") || lower.starts_with("how can i") {
        return instructions(&lower);
    }
    let order = order_id(task);
    if lower.contains("complaint") {
        return match order {
            Some(order) => reply(
                "branch",
                json!({
                    "summary": format!("Order {order} can be settled in two ways."),
                    "metadata": {
                        "reason": format!("The complaint on order {order} can be resolved by a refund or a replacement"),
                        "options": ["refund", "replacement"],
                    },
                }),
            ),
            None => unsupported("a complaint needs an order id (like A-1001)"),
        };
    }
    if lower.contains("refund") {
        return match order {
            Some(order) => {
                let wanted = amount(task)
                    .map(|a| format!(" before refunding {}", money(a)))
                    .unwrap_or_default();
                call_tool(
                    "get_order",
                    params([("order_id", json!(order))]),
                    format!("Looking up order {order}{wanted}."),
                )
            }
            None => unsupported("a refund needs an order id (like A-1001)"),
        };
    }
    if lower.contains("credit limit") {
        let (Some(customer), Some(limit)) = (customer_id(task), amount(task)) else {
            return unsupported(
                "a credit limit change needs a customer id (like C-7) and an amount",
            );
        };
        let change = params([
            ("customer_id", json!(customer)),
            ("credit_limit", number(limit)),
        ]);
        return reply(
            "hitl_pause",
            json!({
                "reason": format!(
                    "Raising the credit limit of customer {customer} to {} needs a human's approval.",
                    money(limit)
                ),
                "metadata": { "pending": { "tool_name": "set_credit_limit", "tool_params": change } },
            }),
        );
    }
    if lower.contains("diagnostic") {
        return reply(
            "call_multiple_tools",
            json!({
                "tool_names": ["check_payment_gateway", "check_shipping_api"],
                "tool_outputs": [{ "status": "unknown" }, { "status": "unknown" }],
                "summary": "Checking the payment gateway and the shipping API.",
            }),
        );
    }
    if lower.starts_with("check") {
        return match order {
            Some(order) => reply(
                "call_multiple_tools",
                json!({
                    "tool_calls": [
                        { "tool_name": "get_shipping_status", "tool_params": { "order_id": order } },
                        { "tool_name": "get_payment_status", "tool_params": { "order_id": order } },
                    ],
                    "summary": format!("Checking shipping and payment of order {order}."),
                }),
            ),
            None => unsupported("checking an order needs its id (like A-1001)"),
        };
    }
    if lower.contains("export") {
        let subject = customer_id(task)
            .map(|c| format!("the order history of customer {c}"))
            .unwrap_or_else(|| "the order history".to_owned());
        return match (context.history, context.turn) {
            (Some(_), Some(turn)) if turn == context.own_replies().count() as u64 + 1 => reply(
                "processing",
                json!({ "summary": format!("Exporting {subject}…") }),
            ),
            _ => reply(
                "completed",
                json!({ "summary": format!("Exported {subject} to orders.csv.") }),
            ),
        };
    }
    unsupported(task)
}

fn instructions(question: &str) -> Value {
    let (instructions, summary) = if question.contains("return") {
        (
            "To return an item: open Orders, choose the order, select \"Return an item\" and print the prepaid label. The refund reaches your card within 5 business days of our receiving it.",
            "Explained how to return an item.",
        )
    } else if question.contains("track") {
        (
            "To track an order: open Orders and select \"Track package\"; the carrier's tracking number is there too.",
            "Explained how to track an order.",
        )
    } else if question.contains("cancel") {
        (
            "To cancel an order: open Orders, choose the order and select \"Cancel\" before it ships; after that, return it instead.",
            "Explained how to cancel an order.",
        )
    } else {
        (
            "I can explain how to return an item, track an order or cancel an order. Ask me about one of those.",
            "Listed what I can explain.",
        )
    };
    reply(
        "provide_instructions",
        json!({ "instructions": instructions, "summary": summary }),
    )
}

fn follow_branch(option: Option<&str>, context: &Context<'_>) -> Value {
    let task = context.user_task().unwrap_or_default();
    let order = order_id(task);
    let order_params = || {
        order
            .as_ref()
            .map(|o| params([("order_id", json!(o))]))
            .unwrap_or_default()
    };
    let option = option.map(str::to_lowercase).unwrap_or_default();
    if option.contains("refund") {
        return match amount(task) {
            Some(wanted) => {
                let mut refund = order_params();
                refund.insert("amount".into(), number(wanted));
                call_tool(
                    "apply_refund",
                    refund,
                    format!("Following the refund option: refunding {}.", money(wanted)),
                )
            }
            None => call_tool(
                "get_order",
                order_params(),
                "Following the refund option: looking up the order.".to_owned(),
            ),
        };
    }
    if option.contains("replace") {
        return call_tool(
            "ship_replacement",
            order_params(),
            "Following the replacement option: shipping a replacement.".to_owned(),
        );
    }
    if option.is_empty() {
        return unsupported("a branch continuation without an option");
    }
    unsupported(&format!("branch option `{option}`"))
}

fn human_answer(approved: bool, message: Option<&str>, context: &Context<'_>) -> Value {
    let (tool, change) = context.pending_change().unwrap_or_else(|| {
        // Without a history, what the human's message says (or nothing).
        let text = context.user_task().or(message).unwrap_or_default();
        let mut change = Map::new();
        if let Some(customer) = customer_id(text) {
            change.insert("customer_id".into(), json!(customer));
        }
        if let Some(limit) = amount(text) {
            change.insert("credit_limit".into(), number(limit));
        }
        ("set_credit_limit".to_owned(), change)
    });
    let note = message.map(|m| format!(" ({m})")).unwrap_or_default();
    if !approved {
        let (customer, limit) = change_parts(&change);
        return final_answer(format!(
            "Left the credit limit{customer} unchanged: the change{limit} was rejected{note}."
        ));
    }
    call_tool(
        &tool,
        change.clone(),
        format!(
            "Approved{note}: setting the credit limit{}.",
            describe_change(&change)
        ),
    )
}

/// ` of customer C-7 to $900`, as far as the change says.
fn describe_change(change: &Map<String, Value>) -> String {
    let (customer, limit) = change_parts(change);
    format!("{customer}{limit}")
}

/// (` of customer C-7`, ` to $900`), each empty when the change does not say.
fn change_parts(change: &Map<String, Value>) -> (String, String) {
    let customer = change
        .get("customer_id")
        .and_then(Value::as_str)
        .map(|c| format!(" of customer {c}"))
        .unwrap_or_default();
    let limit = change
        .get("credit_limit")
        .and_then(amount_of)
        .map(|l| format!(" to {}", money(l)))
        .unwrap_or_default();
    (customer, limit)
}

fn self_correct(text: &str, results: &[(String, Value)], context: &Context<'_>) -> Value {
    let limit = LIMIT
        .captures(text)
        .and_then(|c| c.get(1))
        .and_then(|m| parse_number(m.as_str()));
    let tried = TRIED
        .captures(text)
        .and_then(|c| c.get(1))
        .and_then(|m| parse_number(m.as_str()));
    let refused = results
        .iter()
        .find(|(_, r)| r.get("status").and_then(Value::as_str) == Some("policy_violation"))
        .map(|(name, _)| name.as_str())
        .filter(|name| !name.is_empty());
    let last = context.last_calls();
    let tool = refused
        .map(str::to_owned)
        .or_else(|| last.first().map(|(name, _)| name.clone()))
        .unwrap_or_else(|| "apply_refund".to_owned());
    let Some(limit) = limit.filter(|l| *l > 0.0) else {
        return final_answer(format!(
            "Nothing was refunded: a policy refused the refund ({text})."
        ));
    };
    if tried.is_some_and(|t| t <= limit) {
        // Retrying would be refused again: stop rather than loop.
        return final_answer(format!(
            "Nothing was refunded: a policy refused {} although it is within the limit of {} ({text}).",
            tried.map(money).unwrap_or_default(),
            money(limit)
        ));
    }
    let mut retry = context
        .last_params_of(&tool)
        .or_else(|| {
            context
                .user_task()
                .and_then(order_id)
                .map(|o| params([("order_id", json!(o))]))
        })
        .unwrap_or_default();
    retry.insert("amount".into(), number(limit));
    call_tool(
        &tool,
        retry,
        format!(
            "The refund limit is {}: refunding {} instead{}.",
            money(limit),
            money(limit),
            tried
                .map(|t| format!(" of {}", money(t)))
                .unwrap_or_default()
        ),
    )
}

fn after_results(results: &[(String, Value)], context: &Context<'_>) -> Value {
    let Some((first, result)) = results.first() else {
        return unsupported("an empty tool result");
    };
    match first.as_str() {
        "get_order" => refund_order(result, context),
        "apply_refund" => refunded(result, context),
        "ship_replacement" => {
            let order = result
                .get("order_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| context.user_task().and_then(order_id))
                .map(|o| format!(" for order {o}"))
                .unwrap_or_default();
            let tracking = result
                .get("tracking")
                .or_else(|| result.get("tracking_number"))
                .map(|t| format!(" (tracking {})", text_of(t)))
                .unwrap_or_default();
            final_answer(format!(
                "Shipped a replacement{order}{tracking}. Resolved the complaint with the replacement option."
            ))
        }
        "set_credit_limit" => {
            let change = context
                .last_params_of("set_credit_limit")
                .or_else(|| result.as_object().cloned())
                .unwrap_or_default();
            final_answer(format!(
                "Raised the credit limit{} as approved.",
                describe_change(&change)
            ))
        }
        _ => {
            let order = context
                .user_task()
                .and_then(order_id)
                .map(|o| format!("Order {o}: "))
                .unwrap_or_default();
            let parts: Vec<String> = results
                .iter()
                .map(|(name, result)| {
                    let name = if name.is_empty() { "result" } else { name };
                    format!("{name}: {}", describe(result))
                })
                .collect();
            final_answer(format!("{order}{}.", parts.join("; ")))
        }
    }
}

/// A result in a few words: its `status`, else its `message`, else its JSON.
fn describe(result: &Value) -> String {
    result
        .get("status")
        .or_else(|| result.get("message"))
        .map(text_of)
        .unwrap_or_else(|| text_of(result))
}

fn is_failure(result: &Value) -> bool {
    result.get("error").is_some_and(|e| !e.is_null())
        || matches!(
            result.get("status").and_then(Value::as_str),
            Some("error" | "not_found" | "failed")
        )
}

fn refund_order(order: &Value, context: &Context<'_>) -> Value {
    let task = context.user_task().unwrap_or_default();
    let order_id = order
        .get("order_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| self::order_id(task));
    let shown = order_id.clone().unwrap_or_else(|| "the order".to_owned());
    if is_failure(order) {
        return final_answer(format!(
            "Nothing was refunded: {shown} could not be found ({}).",
            describe(order)
        ));
    }
    let wanted = amount(task).or_else(|| {
        ["refund_amount", "amount", "total"]
            .iter()
            .find_map(|key| order.get(*key).and_then(amount_of))
    });
    let Some(wanted) = wanted else {
        return final_answer(format!(
            "Nothing was refunded: neither the request nor {shown} says how much to refund."
        ));
    };
    if wanted <= 0.0 {
        return final_answer(format!(
            "Nothing was refunded: {} is not an amount to refund for {shown}.",
            money(wanted)
        ));
    }
    let mut refund = Map::new();
    if let Some(order_id) = order_id {
        refund.insert("order_id".into(), json!(order_id));
    }
    refund.insert("amount".into(), number(wanted));
    call_tool(
        "apply_refund",
        refund,
        format!("Refunding {} for {shown}.", money(wanted)),
    )
}

fn refunded(result: &Value, context: &Context<'_>) -> Value {
    let call = context.last_params_of("apply_refund").unwrap_or_default();
    let field = |key: &str| call.get(key).or_else(|| result.get(key));
    let order = field("order_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| context.user_task().and_then(order_id))
        .map(|o| format!(" for order {o}"))
        .unwrap_or_default();
    if is_failure(result) {
        return final_answer(format!(
            "The refund{order} failed: {}.",
            result
                .get("message")
                .or_else(|| result.get("error"))
                .map(text_of)
                .unwrap_or_else(|| describe(result))
        ));
    }
    let refunded = field("amount")
        .or_else(|| result.get("refunded"))
        .and_then(amount_of)
        .or_else(|| {
            result
                .get("message")
                .and_then(Value::as_str)
                .and_then(amount)
        });
    let mut summary = match refunded {
        Some(refunded) => format!("Refunded {}{order}.", money(refunded)),
        None => format!("Refunded{order}."),
    };
    let wanted = context.user_task().and_then(amount);
    if let (Some(wanted), Some(refunded)) = (wanted, refunded)
        && wanted > refunded
    {
        summary.push_str(&format!(
            " The {} requested exceeds the refund limit; the remaining {} needs a manual review.",
            money(wanted),
            money(wanted - refunded)
        ));
    }
    if context.branch_option().is_some() {
        summary.push_str(" Resolved the complaint with the refund option.");
    }
    final_answer(summary)
}

// ---------------------------------------------------------------------------------------------
// Reading ids and amounts

fn params<const N: usize>(entries: [(&str, Value); N]) -> Map<String, Value> {
    entries
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

fn order_id(text: &str) -> Option<String> {
    ORDER_ID
        .captures(text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
}

fn customer_id(text: &str) -> Option<String> {
    CUSTOMER_ID
        .captures(text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
}

/// The amount a text names: the first number with a currency (`$120`, `120 USD`), else the
/// first number; numbers inside ids (`A-1001`) do not count.
pub fn amount(text: &str) -> Option<f64> {
    let without_ids = ANY_ID.replace_all(text, " ");
    let mut first = None;
    for caps in AMOUNT.captures_iter(&without_ids) {
        let digits = caps.get(2).map(|m| m.as_str()).unwrap_or_default();
        let fraction = caps.get(3).map(|m| m.as_str()).unwrap_or_default();
        let Some(value) = parse_number(&format!("{digits}{fraction}")) else {
            continue;
        };
        if caps.get(1).is_some() || caps.get(4).is_some() {
            return Some(value);
        }
        first.get_or_insert(value);
    }
    first
}

/// A number written with optional thousands separators; finite values only.
fn parse_number(text: &str) -> Option<f64> {
    text.replace(',', "")
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
}

/// An amount in a JSON value: a number, or a string naming one (`"120.00"`, `"$120"`).
fn amount_of(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64().filter(|n| n.is_finite()),
        Value::String(text) => amount(text),
        _ => None,
    }
}

/// A JSON number: whole amounts as integers (`50`, not `50.0`), so they compare as written.
fn number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        // In range and whole: the conversion is exact.
        json!(value as i64)
    } else {
        json!(value)
    }
}

/// `$120`, `$12.50`.
fn money(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        format!("${}", value as i64)
    } else {
        format!("${value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(task: &str, turn: u64, history: Value) -> Value {
        json!({ "task_description": task, "turn": turn, "conversation_history": history })
    }

    fn task_only(task: &str) -> Value {
        json!({ "task_description": task })
    }

    fn action(reply: &Value) -> &str {
        reply["action"].as_str().unwrap_or_default()
    }

    #[test]
    fn amounts_are_read_robustly() {
        assert_eq!(amount("Refund $120 for order A-1001"), Some(120.0));
        assert_eq!(amount("Refund order A-1001: 12.50"), Some(12.5));
        assert_eq!(amount("A-1001 costs 1,200 USD, pay 3"), Some(1200.0));
        assert_eq!(
            amount("Raise the credit limit of customer C-7 to 900"),
            Some(900.0)
        );
        assert_eq!(amount("€ 75.25 please"), Some(75.25));
        assert_eq!(amount("order A-1001"), None);
        assert_eq!(amount(&"9".repeat(400)), None);
        assert_eq!(number(50.0), json!(50));
        assert_eq!(number(12.5), json!(12.5));
        assert_eq!(money(50.0), "$50");
        assert_eq!(money(12.5), "$12.50");
    }

    #[test]
    fn every_reply_is_named_and_nonsense_is_an_error() {
        for request in [
            task_only("Refund $120 for order A-1001"),
            task_only("Sing me a song"),
            json!({ "turn": 1 }),
            json!([1, 2]),
        ] {
            let reply = decide(&request);
            assert_eq!(reply["name"], AGENT_NAME, "{reply}");
        }
        let reply = decide(&task_only("Sing me a song"));
        assert_eq!(action(&reply), "error");
        assert_eq!(reply["summary"], "Unsupported task: Sing me a song");
        let long = "x".repeat(10_000);
        let summary = decide(&task_only(&long))["summary"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(summary.len() < 300 && summary.ends_with('…'), "{summary}");
        let bytes = answer(b"not json");
        let reply: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        assert_eq!(action(&reply), "error");
        assert!(!bytes.contains(&b'\n'));
    }

    #[test]
    fn a_refund_runs_lookup_refund_self_correction_and_final_answer_with_history() {
        let task = "Refund $120 for order A-1001";
        let first = decide(&full(task, 1, json!([])));
        assert_eq!(action(&first), "call_tool");
        assert_eq!(first["tool_name"], "get_order");
        assert_eq!(first["tool_params"], json!({ "order_id": "A-1001" }));

        let order = json!({ "order_id": "A-1001", "total": 150, "status": "delivered" });
        let mut history = json!([{ "role": "user", "content": task }, { "role": "agent", "content": first }, { "role": "environment", "content": order }]);
        let second = decide(&full(
            &format!("Tool 'get_order' returned: {order}. Continue with the task."),
            2,
            history.clone(),
        ));
        assert_eq!(second["tool_name"], "apply_refund");
        assert_eq!(
            second["tool_params"],
            json!({ "order_id": "A-1001", "amount": 120 })
        );

        let violation = json!({ "status": "policy_violation", "violation": "Amount 120 exceeds limit of 50.0" });
        if let Some(h) = history.as_array_mut() {
            h.push(json!({ "role": "agent", "content": second }));
            h.push(json!({ "role": "environment", "content": violation }));
        }
        // The spec's wording and the newer harness's give the same retry.
        for feedback in [
            "GOVERNANCE ERROR: Amount 120 exceeds limit of 50.0. Please adjust your action."
                .to_owned(),
            "{'status': 'policy_violation', 'violation': 'Amount 120 exceeds limit of 50.0'}"
                .to_owned(),
        ] {
            let third = decide(&full(&feedback, 3, history.clone()));
            assert_eq!(third["tool_name"], "apply_refund", "{feedback}");
            assert_eq!(
                third["tool_params"],
                json!({ "order_id": "A-1001", "amount": 50 })
            );
        }
        let third = decide(&full(
            "GOVERNANCE ERROR: Amount 120 exceeds limit of 50.0. Please adjust your action.",
            3,
            history.clone(),
        ));
        let done = json!({ "status": "success", "refund_id": "R-1" });
        if let Some(h) = history.as_array_mut() {
            h.push(json!({ "role": "agent", "content": third }));
            h.push(json!({ "role": "environment", "content": done }));
        }
        let last = decide(&full(
            &format!("Tool 'apply_refund' returned: {done}. Continue with the task."),
            4,
            history,
        ));
        assert_eq!(action(&last), "final_answer");
        let summary = last["summary"].as_str().unwrap_or_default();
        assert!(
            summary.starts_with("Refunded $50 for order A-1001."),
            "{summary}"
        );
        assert!(summary.contains("remaining $70"), "{summary}");
    }

    #[test]
    fn a_refund_works_from_task_descriptions_alone() {
        let first = decide(&task_only("Please refund 30 USD on order B-77"));
        assert_eq!(first["tool_params"], json!({ "order_id": "B-77" }));
        // No history: the amount comes from the order.
        let second = decide(&task_only(
            r#"Tool 'get_order' returned: {"order_id": "B-77", "amount": "80.00"}. Continue with the task."#,
        ));
        assert_eq!(
            second["tool_params"],
            json!({ "order_id": "B-77", "amount": 80 })
        );
        let third = decide(&task_only(
            "GOVERNANCE ERROR: Amount 80 exceeds limit of 50.0. Please adjust your action.",
        ));
        assert_eq!(third["tool_name"], "apply_refund");
        assert_eq!(third["tool_params"], json!({ "amount": 50 }));
        // The spec's own example wording.
        let spec = decide(&task_only(
            "GOVERNANCE ERROR: Amount 100 exceeds maximum allowed limit of 50. Please adjust.",
        ));
        assert_eq!(spec["tool_params"]["amount"], json!(50));
        let last = decide(&task_only(
            r#"Tool 'apply_refund' returned: {"status": "success", "amount": 50, "order_id": "B-77"}. Continue with the task."#,
        ));
        assert_eq!(last["summary"], "Refunded $50 for order B-77.");
        // A breach at or under the limit is not retried forever.
        let stuck = decide(&task_only(
            "GOVERNANCE ERROR: Amount 40 exceeds limit of 50.0. Please adjust your action.",
        ));
        assert_eq!(action(&stuck), "final_answer");
    }

    #[test]
    fn several_tools_in_both_shapes() {
        let newer = decide(&task_only("Check order A-1001"));
        assert_eq!(action(&newer), "call_multiple_tools");
        assert_eq!(newer["tool_calls"][1]["tool_name"], "get_payment_status");
        assert_eq!(
            newer["tool_calls"][0]["tool_params"],
            json!({ "order_id": "A-1001" })
        );
        let spec = decide(&task_only("Run diagnostics"));
        assert_eq!(
            spec["tool_names"],
            json!(["check_payment_gateway", "check_shipping_api"])
        );
        assert!(spec.get("tool_calls").is_none());
        let last = decide(&task_only(
            r#"Tools ['check_payment_gateway', 'check_shipping_api'] returned: [{"status": "ok"}, {"status": "degraded"}]. Continue with the task."#,
        ));
        assert_eq!(
            last["summary"],
            "check_payment_gateway: ok; check_shipping_api: degraded."
        );
        // The newer wording, read from the history.
        let history = json!([
            { "role": "user", "content": "Check order A-1001" },
            { "role": "agent", "content": newer },
            { "role": "environment", "content": { "status": "in_transit" } },
            { "role": "environment", "content": { "status": "captured", "message": "Paid" } },
        ]);
        let last = decide(&full("in_transit\nPaid", 2, history));
        assert_eq!(
            last["summary"],
            "Order A-1001: get_shipping_status: in_transit; get_payment_status: captured."
        );
    }

    #[test]
    fn hitl_waits_for_a_human() {
        let task = "Raise the credit limit of customer C-7 to 900";
        let pause = decide(&full(task, 1, json!([])));
        assert_eq!(action(&pause), "hitl_pause");
        assert!(
            pause["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("C-7 to $900")
        );
        let history =
            json!([{ "role": "user", "content": task }, { "role": "agent", "content": pause }]);
        let approved = decide(&full("Approved: go ahead", 2, history.clone()));
        assert_eq!(approved["tool_name"], "set_credit_limit");
        assert_eq!(
            approved["tool_params"],
            json!({ "customer_id": "C-7", "credit_limit": 900 })
        );
        let rejected = decide(&full("Rejected", 2, history));
        assert_eq!(action(&rejected), "final_answer");
        assert_eq!(
            rejected["summary"],
            "Left the credit limit of customer C-7 unchanged: the change to $900 was rejected."
        );
        // Without a history the human's message is all there is.
        let approved = decide(&task_only("Approved: raise C-7 to 900"));
        assert_eq!(
            approved["tool_params"],
            json!({ "customer_id": "C-7", "credit_limit": 900 })
        );
        let done = decide(&task_only(
            r#"Tool 'set_credit_limit' returned: {"customer_id": "C-7", "credit_limit": 900}. Continue with the task."#,
        ));
        assert_eq!(
            done["summary"],
            "Raised the credit limit of customer C-7 to $900 as approved."
        );
    }

    #[test]
    fn a_complaint_branches_and_each_option_is_followed() {
        let task = "Resolve the complaint on order A-1001";
        let branch = decide(&full(task, 1, json!([])));
        assert_eq!(action(&branch), "branch");
        assert_eq!(
            branch["metadata"]["options"],
            json!(["refund", "replacement"])
        );
        let history = |option: &str, k: u64| {
            json!([
                { "role": "user", "content": task },
                { "role": "agent", "content": branch },
                { "role": "environment", "content": { "branch": { "index": k, "count": 2, "option": option } } },
            ])
        };
        let refund = decide(&full(
            "Continue on branch 1 of 2: refund.",
            2,
            history("refund", 1),
        ));
        assert_eq!(refund["tool_name"], "get_order");
        let replace = decide(&full(
            "Continue on branch 2 of 2: replacement.",
            2,
            history("replacement", 2),
        ));
        assert_eq!(replace["tool_name"], "ship_replacement");
        assert_eq!(replace["tool_params"], json!({ "order_id": "A-1001" }));
        let done = decide(&task_only(
            r#"Tool 'ship_replacement' returned: {"tracking": "T-9"}. Continue with the task."#,
        ));
        let summary = done["summary"].as_str().unwrap_or_default();
        assert!(summary.contains("replacement option"), "{summary}");
        assert_eq!(
            action(&decide(&task_only("Continue on branch 1 of 1."))),
            "error"
        );
        // A complaint naming an amount refunds it straight away.
        let direct = decide(&full(
            "Continue on branch 1 of 2: refund.",
            2,
            json!([{ "role": "user", "content": "Resolve the complaint on order A-1001 ($30)" }]),
        ));
        assert_eq!(
            direct["tool_params"],
            json!({ "order_id": "A-1001", "amount": 30 })
        );
    }

    #[test]
    fn instructions_processing_and_executed() {
        let how = decide(&task_only("How do I return an item?"));
        assert_eq!(action(&how), "provide_instructions");
        assert!(
            how["instructions"]
                .as_str()
                .unwrap_or_default()
                .contains("prepaid label")
        );
        let export = "Export the order history of customer C-7";
        assert_eq!(action(&decide(&full(export, 1, json!([])))), "processing");
        assert_eq!(action(&decide(&full(export, 2, json!([])))), "completed");
        assert_eq!(action(&decide(&task_only(export))), "completed");
        let executed = decide(&task_only("Executed check_shipping_api"));
        assert_eq!(executed["summary"], "check_shipping_api: success.");
    }
}
