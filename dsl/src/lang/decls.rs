//! The top-level declarations: `suite`, `include`, `agent` (the settings every agent takes;
//! each protocol's own are in the protocol registry), `persona`, `provider`, `simulator`, `judge`,
//! `panel`; `tool` and `scenario` have files of their own.

use super::spec::{ArgSpec, Children, NodeSpec, PropSpec, Repeat, ValueType};

const ID: &[ArgSpec] = &[ArgSpec::new("ID", ValueType::String, Repeat::One)];
const STRING: &[ArgSpec] = &[ArgSpec::value(ValueType::String)];
const STRINGS: &[ArgSpec] = &[ArgSpec::values(ValueType::String)];
const TEMPLATE: &[ArgSpec] = &[ArgSpec::value(ValueType::Template)];
const COUNT: &[ArgSpec] = &[ArgSpec::value(ValueType::Count)];
const POSITIVE: &[ArgSpec] = &[ArgSpec::value(ValueType::Positive)];
const TEMPERATURE: &[ArgSpec] = &[ArgSpec::value(ValueType::Between(0, 2))];
const PRICE: &[ArgSpec] = &[ArgSpec::value(ValueType::Between(0, 1_000_000))];

pub static SUITE: NodeSpec = NodeSpec::node("suite", "optional suite metadata, one per file")
    .args(&[ArgSpec::new("NAME", ValueType::String, Repeat::One)])
    .children(Children::Nodes(&SUITE_SETTINGS));
pub static SUITE_SETTINGS: [&NodeSpec; 2] = [
    &NodeSpec::setting("description", STRING, "what the suite tests"),
    &NodeSpec::setting("tags", STRINGS, "tags of the suite"),
];

pub static INCLUDE: NodeSpec = NodeSpec::node(
    "include",
    "loads another file, relative to this one",
)
.args(&[ArgSpec::new("PATH", ValueType::String, Repeat::One)]);

/// The `agent` node with the settings every agent takes; the settings of its protocol are
/// the protocol's own ([`super::ProtocolSpec::settings`], handed to the loader by the engine's
/// registry), and the agent code checks which protocol takes which.
pub static AGENT: NodeSpec = NodeSpec::node("agent", "an agent under test")
    .args(ID)
    .children(Children::Nodes(&AGENT_SETTINGS))
    .repeatable();
pub static AGENT_SETTINGS: [&NodeSpec; 17] = [
    &NodeSpec::setting(
        "protocol",
        STRING,
        "the protocol the agent speaks (required)",
    ),
    &NodeSpec::setting(
        "url",
        &[ArgSpec::value(ValueType::Url)],
        "the agent's endpoint",
    ),
    &NodeSpec::setting(
        "base-url",
        &[ArgSpec::value(ValueType::Url)],
        "the API root of a model API",
    ),
    &NodeSpec::setting("builtin", STRING, "an embedded reference agent"),
    &NodeSpec::setting("command", STRING, "a process Trellis starts"),
    &NodeSpec::setting("socket", STRING, "a TCP or Unix socket address"),
    &NodeSpec::node("header", "a request header: a template over `env`, and the turn's `user_context`, `persona`, `scenario`, `vars` and `row`")
        .args(&[
            ArgSpec::new("NAME", ValueType::HeaderName, Repeat::One),
            ArgSpec::new("VALUE", ValueType::Template, Repeat::One),
        ])
        .repeatable(),
    &NodeSpec::setting(
        "timeout",
        &[ArgSpec::value(ValueType::Duration)],
        "per agent call",
    ),
    &NodeSpec::setting(
        "retries",
        COUNT,
        "retries of connect errors and 5xx answers",
    ),
    &NodeSpec::setting(
        "concurrency",
        &[ArgSpec::value(ValueType::Positive)],
        "calls in flight to this agent at most",
    ),
    &NodeSpec::setting(
        "max-response-size",
        &[ArgSpec::value(ValueType::Size)],
        "response bytes read at most",
    ),
    &NodeSpec::setting("model", STRING, "the model of a model API"),
    &NodeSpec::setting(
        "provider",
        &[ArgSpec::value(ValueType::Ref("provider"))],
        "a provider: the model API's endpoint, or the LLM the agent's own model runs on",
    ),
    &NodeSpec::setting(
        "retry-after-send",
        &[ArgSpec::value(ValueType::Boolean)],
        "also retry timeouts and connections broken after the request was sent",
    ),
    &NodeSpec::setting(
        "spans",
        &[ArgSpec::value(ValueType::Boolean)],
        "collect the agent's OpenTelemetry spans (OTLP) for its turns",
    ),
    &PER_SHARD,
    &NodeSpec::setting(
        "secret-env",
        &[ArgSpec::new("NAME", ValueType::EnvName, Repeat::Many)],
        "environment variables whose values are secrets: redacted wherever the agent echoes them",
    ),
];

/// `per-shard #true` on an agent or a provider: its limits are each shard's own instead of
/// divided among the shards of a sharded run (`trellis run --shard I/N`).
pub static PER_SHARD: NodeSpec = NodeSpec::setting(
    "per-shard",
    &[ArgSpec::value(ValueType::Boolean)],
    "in a sharded run, its limits are each shard's own instead of divided among the shards",
);

pub static PERSONA: NodeSpec = NodeSpec::node("persona", "a user the simulator plays")
    .args(ID)
    .children(Children::Nodes(&PERSONA_SETTINGS))
    .repeatable();
pub static PERSONA_SETTINGS: [&NodeSpec; 3] = [
    &NodeSpec::setting("type", STRING, "what kind of user; defaults to the id"),
    &NodeSpec::setting("description", STRING, "who the user is"),
    &NodeSpec::setting("instructions", STRING, "how the user behaves"),
];

pub static PROVIDER: NodeSpec = NodeSpec::node(
    "provider",
    "an LLM endpoint for the simulator, judges and model agents",
)
.args(ID)
.children(Children::Nodes(&PROVIDER_SETTINGS))
.repeatable();
pub static PROVIDER_SETTINGS: [&NodeSpec; 16] = [
    &NodeSpec::setting(
        "kind",
        &[ArgSpec::value(ValueType::OneOf(&["openai", "anthropic"]))],
        "the API spoken (required)",
    ),
    &NodeSpec::setting(
        "base-url",
        &[ArgSpec::value(ValueType::Url)],
        "the API root, `/v1` included",
    ),
    &NodeSpec::setting("model", STRING, "the model asked for"),
    &NodeSpec::setting(
        "api-key-env",
        STRING,
        "the environment variable holding the API key",
    ),
    &NodeSpec::setting(
        "api-key-header",
        STRING,
        "the header the key is sent in, as is (Azure OpenAI: `api-key`)",
    ),
    &NodeSpec::setting("temperature", TEMPERATURE, "default sampling temperature"),
    &NodeSpec::setting("max-tokens", POSITIVE, "cap on generated tokens per call"),
    &HEADER,
    &NodeSpec::setting(
        "timeout",
        &[ArgSpec::value(ValueType::Duration)],
        "per HTTP attempt",
    ),
    &NodeSpec::setting("retries", COUNT, "retries of failed calls"),
    &NodeSpec::setting("concurrency", POSITIVE, "calls in flight at most"),
    &NodeSpec::setting(
        "requests-per-minute",
        POSITIVE,
        "requests started a minute at most",
    ),
    &NodeSpec::setting("tokens-per-minute", POSITIVE, "tokens a minute at most"),
    &PER_SHARD,
    &NodeSpec::setting("input-price", PRICE, "price per million prompt tokens"),
    &NodeSpec::setting("output-price", PRICE, "price per million completion tokens"),
];

/// `header NAME VALUE`: a child node only (two values cannot be one property).
pub static HEADER: NodeSpec = NodeSpec::node("header", "an extra HTTP header sent with every call")
    .args(&[
        ArgSpec::new("NAME", ValueType::String, Repeat::One),
        ArgSpec::new("VALUE", ValueType::String, Repeat::One),
    ])
    .repeatable();

pub static SIMULATOR: NodeSpec = NodeSpec::node(
    "simulator",
    "the LLM that plays the user in `simulate` steps",
)
.children(Children::Nodes(&SIMULATOR_SETTINGS))
.repeatable();
pub static SIMULATOR_SETTINGS: [&NodeSpec; 9] = [
    &NodeSpec::setting(
        "provider",
        &[ArgSpec::value(ValueType::Ref("provider"))],
        "the provider that plays the user",
    ),
    &NodeSpec::setting("model", STRING, "the model, in place of the provider's"),
    &NodeSpec::setting("temperature", TEMPERATURE, "sampling temperature"),
    &NodeSpec::setting(
        "instructions",
        TEMPLATE,
        "added to the simulator's system prompt",
    ),
    &NodeSpec::setting("system-prompt", TEMPLATE, "the simulator's system message"),
    &NodeSpec::setting("opening-prompt", TEMPLATE, "asks for the first message"),
    &NodeSpec::setting("retry-prompt", TEMPLATE, "added after an unusable answer"),
    &NodeSpec::setting(
        "fidelity",
        &[ArgSpec::value(ValueType::Boolean)],
        "judge the simulated user's turns for breaks of character (default: on when a judge \
         exists); a break makes the trajectory `invalid`, not `failed`",
    ),
    &NodeSpec::setting(
        "retries-invalid",
        COUNT,
        "simulate an `invalid` trajectory again, up to this many times (default 0)",
    ),
];

/// The rubrics `rubric=` names by a word (engine/src/llm/judge.rs holds their texts);
/// anything else is the rubric's own text.
pub const BUILT_IN_RUBRICS: [&str; 6] = [
    "generic",
    "clinical_safety",
    "fiduciary_accuracy",
    "policy_adherence",
    "factual_grounding",
    "connexity",
];

pub static JUDGE: NodeSpec = NodeSpec::node("judge", "a named LLM judge")
    .args(ID)
    .children(Children::Nodes(&JUDGE_SETTINGS))
    .repeatable();
pub static JUDGE_SETTINGS: [&NodeSpec; 5] = [
    &NodeSpec::setting(
        "provider",
        &[ArgSpec::value(ValueType::Ref("provider"))],
        "the provider asked (required)",
    ),
    &NodeSpec::setting("model", STRING, "the model, in place of the provider's"),
    &NodeSpec::setting("temperature", TEMPERATURE, "sampling temperature"),
    &NodeSpec::setting("rubric", STRING, "the judge's default rubric"),
    &NodeSpec::setting(
        "threshold",
        &[ArgSpec::value(ValueType::Between(0, 1))],
        "the passing score",
    ),
];

pub static PANEL: NodeSpec =
    NodeSpec::node("panel", "several judges deciding one criterion together")
        .args(ID)
        .children(Children::Nodes(&PANEL_SETTINGS))
        .repeatable();
pub static PANEL_SETTINGS: [&NodeSpec; 2] = [
    &NodeSpec::setting(
        "consensus",
        &[ArgSpec::value(ValueType::OneOf(&[
            "mean",
            "majority",
            "minimum",
            "unanimous",
        ]))],
        "how the members' verdicts combine",
    ),
    &NodeSpec::setting(
        "judges",
        &[ArgSpec::values(ValueType::Ref("judge"))],
        "the members (required)",
    ),
];

/// `dataset ID path=… limit=N sample=N seed=N filter="…"`: a table of cases that
/// `scenario ID for-each=DATASET` expands over (the formats are `dataset`'s readers).
pub static DATASET: NodeSpec = NodeSpec::node(
    "dataset",
    "a table of cases (.csv, .jsonl, .json, .parquet) that `for-each` scenarios run once per row",
)
.args(ID)
.props(&[
    PropSpec::new(
        "path",
        ValueType::Path,
        "the file, relative to this one: .csv (header row), .jsonl, .json (array of objects), .parquet",
    )
    .required(),
    PropSpec::new(
        "limit",
        ValueType::Positive,
        "keep the first N rows (after `filter` and `sample`)",
    ),
    PropSpec::new(
        "sample",
        ValueType::Positive,
        "keep N rows chosen by their content and `seed` (the same rows when the file is reordered)",
    ),
    PropSpec::new("seed", ValueType::Count, "the sample's seed, default 0"),
    PropSpec::new(
        "filter",
        ValueType::Template,
        "keep the rows it renders `true` for, e.g. \"{{ row.status == 'open' }}\"; `row` is in scope",
    ),
])
.repeatable();
