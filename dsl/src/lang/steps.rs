//! Steps: what a scenario (or a branch) does, in order.

use super::criteria::CRITERIA;
use super::scenario::{PERSONA_REF, SIMULATOR_LAYER};
use super::spec::{ArgSpec, Children, NodeSpec, PropSpec, Repeat, ValueType};

/// The steps, in the order the unknown-node hint lists them in.
pub static STEPS: [&NodeSpec; 8] = [
    &USER, &SIMULATE, &ATTACK, &CALL, &EXPECT, &CAPTURE, &HITL, &BRANCH,
];

/// `attack goal=… width= keep= depth= attacker=PROVIDER { judge "…" }`: a beam search of
/// adversarial user messages (docs/simulator.md). The scenario's last step.
pub static ATTACK: NodeSpec = NodeSpec::node(
    "attack",
    "an attacker LLM searches for user messages that reach `goal`; every explored path is a \
     trajectory",
)
.children(Children::Nodes(&ATTACK_SETTINGS));
pub static ATTACK_SETTINGS: [&NodeSpec; 6] = [
    &NodeSpec::setting(
        "goal",
        &[ArgSpec::value(ValueType::String)],
        "what the attacker tries to make the agent do (required)",
    ),
    &NodeSpec::setting(
        "judge",
        &[ArgSpec::value(ValueType::String)],
        "what reaching the goal looks like in the agent's reply (the judge's criterion; \
         default: the goal)",
    ),
    &NodeSpec::setting(
        "width",
        &[ArgSpec::value(ValueType::Positive)],
        "candidate user messages proposed per kept path and turn (default 3)",
    ),
    &NodeSpec::setting(
        "keep",
        &[ArgSpec::value(ValueType::Positive)],
        "paths kept for the next turn, best scores first (default 2)",
    ),
    &NodeSpec::setting(
        "depth",
        &[ArgSpec::value(ValueType::Positive)],
        "attack turns at most (default 3)",
    ),
    &NodeSpec::setting(
        "attacker",
        &[ArgSpec::value(ValueType::Ref("provider"))],
        "the provider playing the attacker (default: the simulator's, else the lone provider)",
    ),
];

pub static USER: NodeSpec =
    NodeSpec::node("user", "a scripted user message, then the agent's turn")
        .args(&[ArgSpec::new("MESSAGE", ValueType::Template, Repeat::One)])
        .repeatable();

pub static SIMULATE: NodeSpec = NodeSpec::node("simulate", "the simulator plays the user")
    .args(&[ArgSpec::new(
        "until-done",
        ValueType::OneOf(&["until-done"]),
        Repeat::Optional,
    )])
    .props(&[PropSpec::new("turns", ValueType::Count, "this many turns")])
    .repeatable();

pub static CALL: NodeSpec = NodeSpec::node("call", "Fixie: call one agent function")
    .args(&[
        ArgSpec::new("FUNCTION", ValueType::String, Repeat::One),
        ArgSpec::new("INPUT", ValueType::Template, Repeat::One),
    ])
    .repeatable();

/// `expect CRITERION…` (inline: the first argument names the criterion) or `expect { … }`.
pub static EXPECT: NodeSpec = NodeSpec::node("expect", "check the last turn")
    .args(&[ArgSpec::new("CRITERION", ValueType::Any, Repeat::Any)])
    .children(Children::Nodes(&CRITERIA))
    .repeatable();

pub static CAPTURE: NodeSpec =
    NodeSpec::node("capture", "store a value of the last reply as `vars.NAME`")
        .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
        .props(&[
            PropSpec::new("regex", ValueType::Regex, "first group, else the match"),
            PropSpec::new("json-path", ValueType::JsonPath, "first node selected"),
        ])
        .repeatable();

pub static HITL: NodeSpec = NodeSpec::node("hitl", "the answer to an agent waiting for a human")
    .args(&[ArgSpec::new(
        "ANSWER",
        ValueType::OneOf(&["approve", "reject"]),
        Repeat::One,
    )])
    .props(&[PropSpec::new(
        "message",
        ValueType::Template,
        "sent with the answer",
    )])
    .repeatable();

/// Consecutive `branch` nodes fork the conversation.
pub static BRANCH: NodeSpec = NodeSpec::node("branch", "one branch of a fork")
    .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
    .children(Children::Nodes(&BRANCH_CHILDREN))
    .repeatable();
pub static BRANCH_CHILDREN: [&NodeSpec; 10] = [
    &USER,
    &SIMULATE,
    &ATTACK,
    &CALL,
    &EXPECT,
    &CAPTURE,
    &HITL,
    &BRANCH,
    &SIMULATOR_LAYER,
    &PERSONA_REF,
];
