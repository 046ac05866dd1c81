//! Criteria: the checks of `expect` (the last turn) and `criteria { }` (the whole trajectory).

use super::spec::{ANY_KEY, ArgSpec, NodeSpec, PropSpec, Repeat, ValueType};

const MAX_COUNT: &[PropSpec] =
    &[PropSpec::new("max", ValueType::Count, "at most this many").required()];
const MAX_DURATION: &[PropSpec] =
    &[PropSpec::new("max", ValueType::Duration, "within this limit").required()];

/// The criteria, in the order the unknown-criterion hint lists them in.
pub static CRITERIA: [&NodeSpec; 17] = [
    &NodeSpec::node("reply", "checks on the reply's text or structured data")
        .props(&[
            PropSpec::new(
                "contains",
                ValueType::Template,
                "the reply contains the text",
            ),
            PropSpec::new(
                "not-contains",
                ValueType::Template,
                "the reply does not contain it",
            ),
            PropSpec::new("matches", ValueType::Regex, "the regex is found"),
            PropSpec::new("equals", ValueType::Template, "the reply is the text"),
            PropSpec::new(
                "json-path",
                ValueType::JsonPath,
                "a node of the structured data",
            ),
        ])
        .repeatable(),
    &NodeSpec::node("tool", "a call to the tool with those params")
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
        .repeatable(),
    &NodeSpec::node("no-tool", "no call to the tool (no name: no call at all)")
        .args(&[ArgSpec::new(
            "NAME",
            ValueType::Ref("tool"),
            Repeat::Optional,
        )])
        .repeatable(),
    &NodeSpec::node("tools-in-order", "those calls happen in that order")
        .args(&[ArgSpec::new("NAME", ValueType::Ref("tool"), Repeat::Many)])
        .repeatable(),
    &NodeSpec::node("latency", "the turn answered within the limit")
        .props(MAX_DURATION)
        .repeatable(),
    &NodeSpec::node("ttft", "first streamed token within the limit")
        .props(MAX_DURATION)
        .repeatable(),
    &NodeSpec::node("turns", "at most N agent turns")
        .props(MAX_COUNT)
        .repeatable(),
    &NodeSpec::node("tokens", "reported usage at most N tokens")
        .props(MAX_COUNT)
        .repeatable(),
    &NodeSpec::node(
        "no-error",
        "no transport, protocol or agent error, no violation",
    )
    .repeatable(),
    &NodeSpec::node("judge", "an LLM judge scores at or above the threshold")
        .args(&[ArgSpec::new("CRITERION", ValueType::String, Repeat::One)])
        .props(&[
            PropSpec::new("threshold", ValueType::Number, "the passing score, 0–1"),
            PropSpec::new("judge", ValueType::Ref("judge"), "the judge or panel"),
            PropSpec::new("rubric", ValueType::String, "the rubric"),
        ])
        .repeatable(),
    &OUTCOME,
    &NodeSpec::node("state", "a check on the sandbox's state document")
        .props(&[
            PropSpec::new("path", ValueType::String, "dotted path or JSON pointer").required(),
            PropSpec::new("tolerance", ValueType::Number, "for `near`, default 1e-9"),
            PropSpec::new("equals", ValueType::Any, "JSON equality"),
            PropSpec::new("equals-json", ValueType::String, "as `equals`, JSON text"),
            PropSpec::new("contains", ValueType::Any, "contains the value"),
            PropSpec::new(
                "contains-json",
                ValueType::String,
                "as `contains`, JSON text",
            ),
            PropSpec::new("matches", ValueType::Regex, "the regex is found"),
            PropSpec::new("near", ValueType::Number, "a number near this one"),
            PropSpec::new("exists", ValueType::Boolean, "the path exists"),
            PropSpec::new("absent", ValueType::Boolean, "the path does not exist"),
        ])
        .repeatable(),
    &NodeSpec::node("violations", "at most N policy violations")
        .props(MAX_COUNT)
        .repeatable(),
    &NodeSpec::node(
        "span",
        "the agent reported a span of that name with those attributes",
    )
    .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
    .props(&[
        PropSpec::new("count", ValueType::Count, "exactly N such spans"),
        PropSpec::new(ANY_KEY, ValueType::Any, "an attribute the span has"),
    ])
    .repeatable(),
    &NodeSpec::node(
        "span-count",
        "how many spans of that name the agent reported",
    )
    .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
    .props(&[
        PropSpec::new("min", ValueType::Count, "at least this many"),
        PropSpec::new("max", ValueType::Count, "at most this many"),
    ])
    .repeatable(),
    &NodeSpec::node(
        "spans-in-order",
        "spans of those names, each after the one before ended",
    )
    .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::Many)])
    .repeatable(),
    &NodeSpec::node("span-duration", "every span of that name within the limit")
        .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
        .props(MAX_DURATION)
        .repeatable(),
];

/// `outcome "STATEMENT"` or `outcome LABEL=VALUE`: the judge decides it holds.
pub static OUTCOME: NodeSpec = NodeSpec::node("outcome", "an expected outcome, judged")
    .args(&[ArgSpec::new(
        "STATEMENT",
        ValueType::String,
        Repeat::Optional,
    )])
    .props(&[PropSpec::new(ANY_KEY, ValueType::Any, "a labelled outcome")])
    .repeatable();
