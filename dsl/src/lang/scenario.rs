//! `scenario` nodes and their settings; the steps and criteria they hold have files of their
//! own.

use super::criteria::{CRITERIA, OUTCOME};
use super::decls::{PERSONA_SETTINGS, SIMULATOR_SETTINGS};
use super::spec::{ANY_KEY, ArgSpec, Children, NodeSpec, PropSpec, Repeat, ValueType};
use super::steps;
use super::tool::TOOL;

const STRING: &[ArgSpec] = &[ArgSpec::value(ValueType::String)];

pub static SCENARIO: NodeSpec = NodeSpec::node("scenario", "one conversation to run and check")
    .args(&[ArgSpec::new("ID", ValueType::String, Repeat::One)])
    .props(&[PropSpec::new(
        "for-each",
        ValueType::Ref("dataset"),
        "a `dataset` id: one scenario per row, `row` in template scope, ids `ID[ROW-ID]`",
    )])
    .children(Children::Nodes(&SCENARIO_CHILDREN))
    .repeatable();

/// A scenario's settings, then its steps (the order the unknown-node hint lists them in).
pub static SCENARIO_CHILDREN: [&NodeSpec; 37] = [
    &NodeSpec::setting("name", STRING, "the scenario's name"),
    &NodeSpec::setting("description", STRING, "what the scenario is about"),
    &NodeSpec::setting(
        "difficulty",
        &[ArgSpec::value(ValueType::OneOf(&["normal", "hard"]))],
        "default `normal`",
    ),
    &NodeSpec::setting("tags", &[ArgSpec::values(ValueType::String)], "tags"),
    &NodeSpec::setting(
        "status",
        &[ArgSpec::value(ValueType::OneOf(&[
            "active", "draft", "archived",
        ]))],
        "only active scenarios run by default",
    ),
    &PERSONA_REF,
    &NodeSpec::setting(
        "initial-message",
        &[ArgSpec::value(ValueType::Template)],
        "the first user message",
    ),
    &USER_CONTEXT,
    &INITIAL_STATE,
    &NodeSpec::setting(
        "undeclared-tools",
        &[ArgSpec::value(ValueType::OneOf(&["default", "error"]))],
        "what a call to an undeclared tool gets",
    ),
    &TOOL,
    &NodeSpec::setting(
        "max-turns",
        &[ArgSpec::value(ValueType::Positive)],
        "agent turns at most",
    ),
    &NodeSpec::setting(
        "stop-on-failure",
        &[ArgSpec::value(ValueType::Boolean)],
        "a failed `expect` ends the trajectory there: no later step is sent",
    ),
    &AGENT_BRANCHES,
    &OUTCOME,
    &EXPECT_TOOL,
    &NodeSpec::setting(
        "criteria-override",
        STRING,
        "replaces the judge's default rubric",
    ),
    &NodeSpec::setting(
        "test-case-id",
        STRING,
        "Connexity: the `metadata.test_case_id` sent (default: the scenario id)",
    ),
    &NodeSpec::setting(
        "agent",
        &[ArgSpec::value(ValueType::Ref("agent"))],
        "the agent to run against",
    ),
    &NodeSpec::setting(
        "agents",
        &[ArgSpec::values(ValueType::Ref("agent"))],
        "the agents to run against",
    ),
    &NodeSpec::setting(
        "repeat",
        &[ArgSpec::value(ValueType::Positive)],
        "independent samples of every trajectory",
    ),
    &NodeSpec::setting(
        "needs",
        &[ArgSpec::values(ValueType::Ref("scenario"))],
        "scenarios that must finish first",
    ),
    &NodeSpec::setting(
        "timeout",
        &[ArgSpec::value(ValueType::Duration)],
        "limit for the whole trajectory",
    ),
    &NodeSpec::setting(
        "first-turn",
        &[ArgSpec::value(ValueType::OneOf(&["user", "agent"]))],
        "who speaks first",
    ),
    &SCENARIO_CRITERIA,
    &SIMULATOR_LAYER,
    &ROW_ID,
    &MATRIX,
    &HISTORY,
    &steps::USER,
    &steps::SIMULATE,
    &steps::ATTACK,
    &steps::CALL,
    &steps::EXPECT,
    &steps::CAPTURE,
    &steps::HITL,
    &steps::BRANCH,
];

/// `persona "ID"` (a named persona) or `persona type="…" { … }` (an inline one).
pub static PERSONA_REF: NodeSpec =
    NodeSpec::node("persona", "the persona the simulated user plays")
        .args(&[ArgSpec::new(
            "ID",
            ValueType::Ref("persona"),
            Repeat::Optional,
        )])
        .children(Children::Nodes(&PERSONA_SETTINGS));

pub static USER_CONTEXT: NodeSpec =
    NodeSpec::node("user-context", "a JSON object the templates see")
        .props(&[PropSpec::new(
            "json",
            ValueType::String,
            "the object as JSON text",
        )])
        .children(Children::Data);

pub static INITIAL_STATE: NodeSpec =
    NodeSpec::node("initial-state", "the sandbox's state document at the start")
        .props(&[PropSpec::new(
            "json",
            ValueType::String,
            "the object as JSON text",
        )])
        .children(Children::Data);

pub static AGENT_BRANCHES: NodeSpec = NodeSpec::node(
    "agent-branches",
    "how far forks the agent asks for are explored",
)
.props(&[
    PropSpec::new(
        "breadth",
        ValueType::Count,
        "alternatives per fork, default 5",
    ),
    PropSpec::new("depth", ValueType::Count, "nesting at most, default 3"),
]);

pub static EXPECT_TOOL: NodeSpec = NodeSpec::node(
    "expect-tool",
    "an expected tool call on the whole trajectory",
)
.args(&[ArgSpec::new("NAME", ValueType::Ref("tool"), Repeat::One)])
.props(&[
    PropSpec::new("count", ValueType::Count, "exactly N such calls"),
    PropSpec::new(
        "params-json",
        ValueType::String,
        "more parameters, as one JSON object",
    ),
    PropSpec::new(ANY_KEY, ValueType::Any, "a parameter the call has"),
])
.repeatable();

pub static SCENARIO_CRITERIA: NodeSpec = NodeSpec::node(
    "criteria",
    "checked on the whole trajectory after its last step",
)
.children(Children::Nodes(&CRITERIA))
.repeatable();

/// A scenario's or a branch's `simulator`: a layer over the enclosing one.
pub static SIMULATOR_LAYER: NodeSpec = NodeSpec::node(
    "simulator",
    "a simulator layer for the `simulate` steps in here",
)
.children(Children::Nodes(&SIMULATOR_SETTINGS));

/// `row-id "TEMPLATE"` in a `for-each` scenario. A node rather than a setting: it is only
/// meaningful with `for-each`, so it is not offered as a property of every scenario.
pub static ROW_ID: NodeSpec = NodeSpec::node(
    "row-id",
    "a `for-each` instance's stable key, e.g. \"{{ row.order_id }}\"; default: a hash of the row's content",
)
.args(&[ArgSpec::new("TEMPLATE", ValueType::Template, Repeat::One)]);

/// `matrix { NAME VALUE…; … }`: one instance per combination of values.
pub static MATRIX: NodeSpec = NodeSpec::node(
    "matrix",
    "one instance per combination of the values, each as `vars.NAME`; ids `ID[NAME=VALUE,…]`",
)
.children(Children::Data);

/// `history "TEMPLATE"` / `history path="conv.json"`: a recorded conversation that opens
/// every trajectory of the scenario.
pub static HISTORY: NodeSpec = NodeSpec::node(
    "history",
    "an OpenAI-style message list that opens the trajectory as if it had happened: \
     `history \"{{ row.messages }}\"` or `history path=\"conv.json\"`",
)
.args(&[ArgSpec::new(
    "TEMPLATE",
    ValueType::Template,
    Repeat::Optional,
)])
.props(&[PropSpec::new(
    "path",
    ValueType::Path,
    "a JSON file: an array of messages, or an object with `messages`",
)]);
