//! The vocabulary the language table and the protocol registry are written in.
//!
//! A [`NodeSpec`] says what one node kind looks like (arguments, properties, children, how
//! often it may appear, which protocols allow it, a one-line help); a [`ProtocolSpec`] says
//! what an agent of one protocol accepts. Both are plain `'static` data so a table can be a
//! `const`, be walked to generate documentation, and be handed from the engine (which owns
//! the protocols) to the loader (which must not depend on the engine).

/// The type of one value: an argument, a property, or a setting's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    /// Any string.
    String,
    /// A string rendered by minijinja at run time (checked for syntax at load time).
    Template,
    /// A template rendered on every turn of an agent: besides what a [`Self::Template`]
    /// reads, these names are in scope (the conversation so far, the user's last words).
    TurnTemplate(&'static [&'static str]),
    /// A whole number ≥ 0.
    Count,
    /// Any number.
    Number,
    /// A number from the first bound to the second, both included.
    Between(i32, i32),
    /// A whole number ≥ 1.
    Positive,
    /// `#true` / `#false`.
    Boolean,
    /// `"30s"`, `"500ms"`, `"1h 30m"`.
    Duration,
    /// `"5MB"`, `"512KiB"`, or a number of bytes.
    Size,
    /// An `http://`/`https://` URL.
    Url,
    /// A regular expression (checked at load time).
    Regex,
    /// A JSON path (`$.a.b[0]`, checked at load time).
    JsonPath,
    /// An HTTP header name (an RFC 9110 token: letters, digits and `-` and the like).
    HeaderName,
    /// An environment variable name (letters, digits and `_`, not starting with a digit).
    EnvName,
    /// A file or directory, relative to the suite file that writes it (the loader hands the
    /// module the path joined to that file's directory).
    Path,
    /// The id of a top-level declaration of this node kind (`"tool"`, `"provider"`, …);
    /// checked by validation with a "did you mean".
    Ref(&'static str),
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Any KDL value (a JSON scalar); for mock outputs and data.
    Any,
}

impl ValueType {
    /// How the type reads in a diagnostic or the language reference ("a duration like
    /// `\"30s\"`").
    pub fn describe(self) -> String {
        match self {
            ValueType::String => "a string".into(),
            ValueType::Template => "a template string".into(),
            ValueType::TurnTemplate(names) => {
                let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                format!(
                    "a template string rendered per turn, with {} in scope besides what \
                     every template reads (`user_context`, `persona`, `scenario`, `env`, \
                     and `row` in a `for-each` scenario)",
                    names.join(", ")
                )
            }
            ValueType::Count => "a whole number".into(),
            ValueType::Number => "a number".into(),
            ValueType::Between(lo, hi) => format!("a number from {lo} to {hi}"),
            ValueType::Positive => "a whole number ≥ 1".into(),
            ValueType::Boolean => "#true or #false".into(),
            ValueType::Duration => "a duration like \"30s\"".into(),
            ValueType::Size => "a size like \"5MB\"".into(),
            ValueType::Url => "a URL".into(),
            ValueType::Regex => "a regular expression".into(),
            ValueType::JsonPath => "a JSON path like \"$.a.b\"".into(),
            ValueType::HeaderName => "a header name like \"X-Session-Id\"".into(),
            ValueType::EnvName => "an environment variable name like \"API_KEY\"".into(),
            ValueType::Path => "a path, relative to the suite file".into(),
            // Not "the id of a `tool`": checks also name the tools an agent runs itself,
            // which no `tool` node declares (where a declared one is needed, validation says).
            ValueType::Ref("tool") => "a tool's name".into(),
            ValueType::Ref(kind) => format!("the id of a `{kind}`"),
            ValueType::OneOf(words) => {
                let words: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
                format!("one of {}", words.join(", "))
            }
            ValueType::Any => "a value".into(),
        }
    }
}

/// How many times a positional argument (the last one, when variadic) may be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// Exactly once.
    One,
    /// Zero or one time.
    Optional,
    /// One or more times (only the last argument).
    Many,
    /// Zero or more times (only the last argument).
    Any,
}

/// One positional argument.
#[derive(Clone, Copy, Debug)]
pub struct ArgSpec {
    /// The placeholder shown in usage and docs (`ID`, `TEXT`, `NAME`).
    pub name: &'static str,
    pub ty: ValueType,
    pub repeat: Repeat,
}

impl ArgSpec {
    /// The one `VALUE` of a setting.
    pub const fn value(ty: ValueType) -> ArgSpec {
        ArgSpec {
            name: "VALUE",
            ty,
            repeat: Repeat::One,
        }
    }

    /// The `VALUE…` of a setting that takes one or more values.
    pub const fn values(ty: ValueType) -> ArgSpec {
        ArgSpec {
            name: "VALUE",
            ty,
            repeat: Repeat::Many,
        }
    }
}

impl ArgSpec {
    /// A positional argument named `name` (the placeholder in usage lines).
    pub const fn new(name: &'static str, ty: ValueType, repeat: Repeat) -> ArgSpec {
        ArgSpec { name, ty, repeat }
    }
}

/// The name of a [`PropSpec`] standing for any other `KEY=VALUE` (a tool call's parameters,
/// a mock's match, an outcome's label): a node with one takes properties of any name.
pub const ANY_KEY: &str = "KEY";

/// One `key=value` property.
#[derive(Clone, Copy, Debug)]
pub struct PropSpec {
    pub name: &'static str,
    pub ty: ValueType,
    /// The node is incomplete without it.
    pub required: bool,
    pub help: &'static str,
}

impl PropSpec {
    /// An optional property.
    pub const fn new(name: &'static str, ty: ValueType, help: &'static str) -> PropSpec {
        PropSpec {
            name,
            ty,
            required: false,
            help,
        }
    }

    /// The same property, required.
    pub const fn required(mut self) -> PropSpec {
        self.required = true;
        self
    }
}

/// What may appear in a node's `{ … }` block.
#[derive(Clone, Copy, Debug)]
pub enum Children {
    /// No block.
    None,
    /// These node kinds, each as its spec says.
    Nodes(&'static [&'static NodeSpec]),
    /// Free-form data (a JSON-like object, a script); decoded by the node's own code.
    Data,
    /// `KEY VALUE` lines (`env { API_KEY "…" }`), each key once, checked against these
    /// types; a setting with this block reaches its module as `[[KEY, VALUE], …]` in the
    /// order written.
    Map { key: ValueType, value: ValueType },
}

/// How a node may be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// A node of its own: `name ARGS… key=value… { children }`.
    Node,
    /// A setting: a child node with one value (`timeout "30s"`, or several values for a
    /// [`Repeat::Many`] argument) or, equally, a property of its parent (`timeout="30s"`).
    /// Its value is [`NodeSpec::args`]`[0]`.
    Setting,
}

/// One node kind of the language.
#[derive(Clone, Copy, Debug)]
pub struct NodeSpec {
    pub name: &'static str,
    pub form: Form,
    /// Positional arguments, in order.
    pub args: &'static [ArgSpec],
    pub props: &'static [PropSpec],
    pub children: Children,
    /// May appear more than once in the same parent; otherwise a second one is "set twice".
    pub repeatable: bool,
    /// Settings on an agent that only these protocols accept; `None`: every protocol.
    pub protocols: Option<&'static [&'static str]>,
    /// One line for diagnostics, `trellis check`, docs/language.md and editor hovers.
    pub help: &'static str,
}

impl NodeSpec {
    /// A setting: `name VALUE` or `name=VALUE`. Tables write
    /// `NodeSpec::setting("timeout", &[ArgSpec::value(ValueType::Duration)], "…")`; the slice
    /// is `'static` because it is built in a `const` initializer.
    pub const fn setting(
        name: &'static str,
        args: &'static [ArgSpec],
        help: &'static str,
    ) -> NodeSpec {
        NodeSpec {
            name,
            form: Form::Setting,
            args,
            props: &[],
            children: Children::None,
            repeatable: false,
            protocols: None,
            help,
        }
    }

    /// A node of its own without arguments, properties or block; the table adds them with
    /// [`Self::args`], [`Self::props`] and [`Self::children`].
    pub const fn node(name: &'static str, help: &'static str) -> NodeSpec {
        NodeSpec {
            name,
            form: Form::Node,
            args: &[],
            props: &[],
            children: Children::None,
            repeatable: false,
            protocols: None,
            help,
        }
    }

    /// The same spec with these positional arguments.
    pub const fn args(mut self, args: &'static [ArgSpec]) -> NodeSpec {
        self.args = args;
        self
    }

    /// The same spec with these properties.
    pub const fn props(mut self, props: &'static [PropSpec]) -> NodeSpec {
        self.props = props;
        self
    }

    /// The same spec with this block.
    pub const fn children(mut self, children: Children) -> NodeSpec {
        self.children = children;
        self
    }

    /// The child node kind `name`, if the block takes it.
    pub fn child(&self, name: &str) -> Option<&'static NodeSpec> {
        match self.children {
            Children::Nodes(nodes) => nodes.iter().copied().find(|n| n.name == name),
            _ => None,
        }
    }

    /// The child node kinds of the block, in table order (none for `Data` or no block).
    pub fn child_specs(&self) -> &'static [&'static NodeSpec] {
        match self.children {
            Children::Nodes(nodes) => nodes,
            _ => &[],
        }
    }

    /// The property `name`: one of [`Self::props`] or a setting child (which may equally be
    /// written as a property).
    pub fn prop(&self, name: &str) -> Option<&'static PropSpec> {
        self.props.iter().find(|p| p.name == name)
    }

    /// Whether the node takes properties of any name ([`ANY_KEY`]).
    pub fn any_key(&self) -> bool {
        self.props.iter().any(|p| p.name == ANY_KEY)
    }

    /// The same spec allowed only on agents of these protocols.
    pub const fn only(mut self, protocols: &'static [&'static str]) -> NodeSpec {
        self.protocols = Some(protocols);
        self
    }

    /// The same spec, allowed more than once.
    pub const fn repeatable(mut self) -> NodeSpec {
        self.repeatable = true;
        self
    }

    /// The usage line shown in hints and docs: `timeout DURATION`, `header NAME VALUE`.
    pub fn usage(&self) -> String {
        let mut out = self.name.to_string();
        for a in self.args {
            out.push(' ');
            match a.repeat {
                Repeat::One => out.push_str(a.name),
                Repeat::Optional => out.push_str(&format!("[{}]", a.name)),
                Repeat::Many => out.push_str(&format!("{}…", a.name)),
                Repeat::Any => out.push_str(&format!("[{}…]", a.name)),
            }
        }
        for p in self.props {
            if p.required {
                out.push_str(&format!(" {}=…", p.name));
            }
        }
        out
    }
}

/// Where an agent is reached; which of these a protocol accepts is in its [`ProtocolSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointKind {
    /// `url="http://…"`.
    Url,
    /// `base-url="http://…"` (model APIs).
    BaseUrl,
    /// `builtin="NAME"`: a reference agent Trellis embeds.
    Builtin,
    /// `command="…"`: a process Trellis starts.
    Command,
    /// `socket="host:port"` or a Unix socket path.
    Socket,
    /// `provider="ID"`: a declared provider is the endpoint (model APIs).
    Provider,
}

impl EndpointKind {
    /// Every kind, in the order an agent's endpoint properties are looked for.
    pub const ALL: [EndpointKind; 6] = [
        EndpointKind::Url,
        EndpointKind::BaseUrl,
        EndpointKind::Builtin,
        EndpointKind::Command,
        EndpointKind::Socket,
        EndpointKind::Provider,
    ];

    /// The property that names this endpoint.
    pub fn property(self) -> &'static str {
        match self {
            EndpointKind::Url => "url",
            EndpointKind::BaseUrl => "base-url",
            EndpointKind::Builtin => "builtin",
            EndpointKind::Command => "command",
            EndpointKind::Socket => "socket",
            EndpointKind::Provider => "provider",
        }
    }
}

/// What a protocol can do; the planner, executor and reports ask these instead of naming a
/// protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Replies can arrive as a stream (time to first token is measured when it does).
    pub streams: bool,
    /// A conversation can be copied at a fork (else the prefix is replayed per branch).
    pub forks: bool,
    /// Time to first token is measured.
    pub measures_ttft: bool,
    /// The engine runs the agent's tool calls against the suite's mock tools (a model under
    /// test); otherwise the agent runs its own tools and reports them.
    pub engine_runs_tools: bool,
    /// A conversation lives in server state bound to a session id.
    pub session_bound: bool,
    /// The agent can open a conversation unprompted (`first-turn "agent"`).
    pub speaks_first: bool,
    /// The agent is a model API the engine calls itself (`system-prompt`, `tools`, a
    /// `provider=` endpoint, `temperature`): a model under test.
    pub model_api: bool,
    /// The agent exposes functions that `call` steps invoke.
    pub function_calls: bool,
    /// A conversation can stop to wait for a human (`hitl` steps answer it).
    pub pauses: bool,
    /// The agent may branch the conversation itself (explored up to `agent-branches`).
    pub agent_branches: bool,
    /// A `provider` plays the agent's own LLM, so `user` steps need one configured.
    pub provider_plays_llm: bool,
    /// The protocol's test cases carry mock tool answers (a scenario `tool` with `mock` or
    /// `sequence` is accepted even though the engine does not answer its calls).
    pub carries_tool_mocks: bool,
}

impl Capabilities {
    /// Nothing: a base specs fill with `..Capabilities::NONE` (`default` is not `const`).
    pub const NONE: Capabilities = Capabilities {
        streams: false,
        forks: false,
        measures_ttft: false,
        engine_runs_tools: false,
        session_bound: false,
        speaks_first: false,
        model_api: false,
        function_calls: false,
        pauses: false,
        agent_branches: false,
        provider_plays_llm: false,
        carries_tool_mocks: false,
    };
}

/// What the language knows of one protocol: its name, where its agents are reached, the
/// settings it accepts beyond those every agent takes, what it can do and the reference
/// agents Trellis embeds for it. The engine's protocol module owns the value; the loader is
/// handed the registry's list.
#[derive(Clone, Copy, Debug)]
pub struct ProtocolSpec {
    /// The value of `protocol="…"`.
    pub name: &'static str,
    /// One line for docs and `trellis check`.
    pub help: &'static str,
    pub endpoints: &'static [EndpointKind],
    /// The protocol's own settings (in addition to the ones every agent takes).
    pub settings: &'static [NodeSpec],
    pub capabilities: Capabilities,
    /// `builtin="…"` names this protocol's embedded reference agents answer to.
    pub builtins: &'static [&'static str],
    /// The rules between the agent's settings that no value type states (a setting another
    /// one requires, two that exclude each other), checked once the agent is decoded; the
    /// loader reports each problem like its own.
    pub check: Option<SettingsCheck>,
}

/// A protocol module's check of an agent's settings as a whole ([`ProtocolSpec::check`]).
pub type SettingsCheck = fn(&AgentSettings<'_>) -> Vec<SettingProblem>;

/// What a [`SettingsCheck`] sees of an agent: its id, its endpoint (its kind, and its value when that is valid) and
/// its protocol's settings as written.
#[derive(Clone, Copy, Debug)]
pub struct AgentSettings<'a> {
    pub id: &'a crate::model::Spanned<String>,
    /// How the agent names its endpoint (`url=`, `command=`, …), even when the value is
    /// invalid (that was reported), so the rules that depend on it are still checked.
    pub endpoint_kind: Option<EndpointKind>,
    pub endpoint: Option<&'a crate::model::Endpoint>,
    pub settings: &'a crate::model::ProtocolSettings,
}

/// What a [`SettingsCheck`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// A setting the others require is not written.
    Missing,
    /// A setting is written where the others rule it out.
    InvalidValue,
}

/// A rule between an agent's settings, broken: where, what, and how to fix it.
#[derive(Clone, Debug)]
pub struct SettingProblem {
    pub kind: ProblemKind,
    pub message: String,
    pub span: crate::model::Span,
    pub label: String,
    /// A second place the problem involves, with its label.
    pub other: Option<(crate::model::Span, String)>,
    pub help: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: NodeSpec = NodeSpec::setting(
        "timeout",
        &[ArgSpec::value(ValueType::Duration)],
        "per call",
    );
    const HEADER: NodeSpec = NodeSpec {
        name: "header",
        form: Form::Node,
        args: &[
            ArgSpec {
                name: "NAME",
                ty: ValueType::String,
                repeat: Repeat::One,
            },
            ArgSpec {
                name: "VALUE",
                ty: ValueType::Template,
                repeat: Repeat::One,
            },
        ],
        props: &[],
        children: Children::None,
        repeatable: true,
        protocols: None,
        help: "an HTTP header",
    };

    #[test]
    fn usage_lines_name_every_argument() {
        assert_eq!(TIMEOUT.usage(), "timeout VALUE");
        assert_eq!(HEADER.usage(), "header NAME VALUE");
        const TOOLS: NodeSpec = NodeSpec::setting(
            "tools",
            &[ArgSpec::values(ValueType::Ref("tool"))],
            "offered tools",
        )
        .only(&["openai"]);
        assert_eq!(TOOLS.usage(), "tools VALUE…");
        assert_eq!(TOOLS.protocols, Some(&["openai"][..]));
        assert_eq!(ValueType::OneOf(&["a", "b"]).describe(), "one of `a`, `b`");
        // A check's tool may be one the agent runs itself: no `tool` declares it.
        assert_eq!(ValueType::Ref("tool").describe(), "a tool's name");
        assert_eq!(ValueType::Ref("judge").describe(), "the id of a `judge`");
    }
}
