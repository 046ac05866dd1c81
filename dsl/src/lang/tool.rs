//! `tool` declarations (top level or in a scenario) and their `param`, `mock`, `sequence`,
//! `state` and `policy` nodes.

use super::spec::{ANY_KEY, ArgSpec, Children, NodeSpec, PropSpec, Repeat, ValueType};

/// The JSON types a `param` may declare.
pub const PARAM_TYPES: &[&str] = &["string", "number", "integer", "boolean", "object", "array"];

pub static TOOL: NodeSpec = NodeSpec::node(
    "tool",
    "a tool: what the model is offered and how the sandbox answers it",
)
.args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
.children(Children::Nodes(&TOOL_CHILDREN))
.repeatable();
pub static TOOL_CHILDREN: [&NodeSpec; 6] = [
    &NodeSpec::setting(
        "description",
        &[ArgSpec::value(ValueType::String)],
        "shown to the model",
    ),
    &PARAM,
    &MOCK,
    &SEQUENCE,
    &STATE,
    &POLICY,
];

pub static PARAM: NodeSpec = NodeSpec::node("param", "a parameter offered to the model")
    .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
    .props(&[
        PropSpec::new(
            "type",
            ValueType::OneOf(PARAM_TYPES),
            "its JSON type, default `string`",
        ),
        PropSpec::new("required", ValueType::Boolean, "default #false"),
        PropSpec::new("description", ValueType::String, "shown to the model"),
    ])
    .repeatable();

pub static MOCK: NodeSpec = NodeSpec::node(
    "mock",
    "the answer to calls whose arguments contain the KEY=VALUEs",
)
.props(&[
    PropSpec::new(
        "returns",
        ValueType::Any,
        "the answer: JSON text, else the string",
    )
    .required(),
    PropSpec::new(
        "params-json",
        ValueType::String,
        "more arguments, as one JSON object",
    ),
    PropSpec::new(ANY_KEY, ValueType::Any, "an argument the call must have"),
])
.children(Children::Nodes(&MOCK_CHILDREN))
.repeatable();
pub static MOCK_CHILDREN: [&NodeSpec; 1] = [&STATE];

pub static SEQUENCE: NodeSpec =
    NodeSpec::node("sequence", "outputs consumed in order, one per call")
        .props(&[PropSpec::new(
            "when-exhausted",
            ValueType::OneOf(&["repeat-last", "error"]),
            "what answers past the last output",
        )])
        .children(Children::Nodes(&SEQUENCE_CHILDREN));
pub static SEQUENCE_CHILDREN: [&NodeSpec; 1] = [&OUTPUT];

pub static OUTPUT: NodeSpec = NodeSpec::node("output", "one output of a `sequence`")
    .args(&[ArgSpec::new("VALUE", ValueType::Any, Repeat::One)])
    .props(&[
        PropSpec::new(
            "params-json",
            ValueType::String,
            "more arguments, as one JSON object",
        ),
        PropSpec::new(ANY_KEY, ValueType::Any, "an argument the call must match"),
    ])
    .repeatable();

/// A change to the sandbox's state document (in a `tool` or a `mock`).
pub static STATE: NodeSpec = NodeSpec::node("state", "a change to the sandbox's state document")
    .props(&[
        PropSpec::new("path", ValueType::String, "dotted path or JSON pointer").required(),
        PropSpec::new(
            "value",
            ValueType::Any,
            "a string, number, boolean or #null",
        ),
        PropSpec::new("json", ValueType::String, "JSON text (objects, arrays)"),
    ])
    .repeatable();

pub static POLICY: NodeSpec =
    NodeSpec::node("policy", "a rule a call must keep, else a policy violation")
        .args(&[
            ArgSpec::new("PARAM", ValueType::String, Repeat::Optional),
            ArgSpec::new("VALUE", ValueType::Any, Repeat::Any),
        ])
        .props(&[
            PropSpec::new("param", ValueType::String, "the parameter, for `max-limit`"),
            PropSpec::new("max", ValueType::Number, "the largest allowed number"),
            PropSpec::new("max-limit", ValueType::Number, "the harness's `max_limit`"),
            PropSpec::new("allowed", ValueType::Any, "an allowed value"),
        ])
        .repeatable();
