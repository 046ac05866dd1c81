//! The MultiAgentEval protocol (`protocol="multiagent"`, docs/wire.md, "MultiAgentEval"):
//! agents that answer every request with an action, in an action loop the harness drives.
//!
//! [`wire`] is the codec: requests in both generations, replies decoded into typed actions,
//! agent name discovery and the final text for criteria. [`session`] runs the action loop
//! over HTTP (`POST /execute_task`), processes and sockets ([`crate::transport::line`]), answers tool
//! calls from the trajectory's [`crate::sandbox::Sandbox`] and feeds the results back, and
//! handles HITL pauses. A branch action the agent takes is explored by the executor up to
//! the scenario's `agent-branches` limits (docs/language.md).

pub mod session;
pub mod wire;

// ----- registry glue (`super::registry`)

use std::sync::Arc;

use trellis_dsl::lang::{
    AgentSettings, ArgSpec, Capabilities, Children, EndpointKind, Form, NodeSpec, ProblemKind,
    ProtocolSpec, SettingProblem, ValueType,
};

use super::{AgentProtocol, AgentSetup, registry};

/// `protocol="multiagent"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "multiagent",
    help: "MultiAgentEval: the harness's action loop over HTTP, a process or a socket, tool calls answered by the sandbox",
    endpoints: &[
        EndpointKind::Url,
        EndpointKind::Builtin,
        EndpointKind::Command,
        EndpointKind::Socket,
    ],
    settings: &[
        NodeSpec::setting(
            "request",
            &[ArgSpec::value(ValueType::OneOf(&["full", "task-only"]))],
            "what each request carries: the whole dialogue, or the task description only",
        ),
        NodeSpec::setting(
            "feedback",
            &[ArgSpec::value(ValueType::OneOf(&["spec", "harness"]))],
            "whose wording tool results go back in",
        ),
        NodeSpec::setting(
            "max-actions",
            &[ArgSpec::value(ValueType::Positive)],
            "agent actions answered within one user step",
        ),
        NodeSpec::setting(
            "process",
            &[ArgSpec::value(ValueType::OneOf(&[
                "per-call",
                "long-lived",
            ]))],
            "`command=`: one process per call, or one for the trajectory",
        ),
        NodeSpec::setting(
            "keep-open",
            &[ArgSpec::value(ValueType::Boolean)],
            "`socket=`: one connection for the trajectory instead of one per call",
        ),
        NodeSpec::setting(
            "cwd",
            &[ArgSpec::value(ValueType::Path)],
            "`command=`: the working directory, relative to the suite file",
        ),
        NodeSpec::setting(
            "transport",
            &[ArgSpec::value(ValueType::OneOf(&[
                "http", "process", "tcp", "unix",
            ]))],
            "`builtin=`: how the embedded agent is served",
        ),
        NodeSpec {
            name: "env",
            form: Form::Node,
            args: &[],
            props: &[],
            children: Children::Map {
                key: ValueType::EnvName,
                value: ValueType::String,
            },
            repeatable: false,
            protocols: None,
            help: "`command=`: extra environment variables, `env { KEY \"VALUE\" }`",
        },
    ],
    capabilities: Capabilities {
        forks: true,
        engine_runs_tools: true,
        speaks_first: false,
        pauses: true,
        agent_branches: true,
        ..super::connexity::NO_CAPABILITIES
    },
    builtins: &["support"],
    check: Some(check),
};

/// The settings that mean something on one kind of endpoint only, with that endpoint.
const ENDPOINT_SETTINGS: [(&str, &str); 4] = [
    ("process", "command"),
    ("env", "command"),
    ("cwd", "command"),
    ("keep-open", "socket"),
];

/// The rules between a `multiagent` agent's settings and its endpoint
/// ([`trellis_dsl::lang::ProtocolSpec::check`]): `process`, `env` and `cwd` are for
/// `command=` agents and `keep-open` for `socket=` ones (a builtin served as a process takes
/// `process`, one served on a socket `keep-open`); `transport` is for `builtin=` ones.
fn check(agent: &AgentSettings<'_>) -> Vec<SettingProblem> {
    use trellis_dsl::BuiltinTransport;
    let Some(kind) = agent.endpoint_kind.map(EndpointKind::property) else {
        return Vec::new();
    };
    let transport = agent.settings.spanned("transport");
    let served_as = match transport
        .and_then(|t| serde_json::from_value::<BuiltinTransport>(t.value.clone()).ok())
    {
        _ if kind != "builtin" => None,
        Some(BuiltinTransport::Process) => Some("process"),
        Some(BuiltinTransport::Tcp | BuiltinTransport::Unix) => Some("keep-open"),
        Some(BuiltinTransport::Http) | None => None,
    };
    let mut problems = Vec::new();
    for (name, needed) in ENDPOINT_SETTINGS {
        let Some(set) = agent.settings.setting(name) else {
            continue;
        };
        if kind == needed || served_as == Some(name) {
            continue;
        }
        let help = match (name, kind) {
            ("process", "builtin") => "add transport=\"process\" to run the builtin as a process \
                 of the trellis executable, or remove `process`"
                .to_owned(),
            ("keep-open", "builtin") => "add transport=\"tcp\" or transport=\"unix\" to serve \
                 the builtin on a socket, or remove `keep-open`"
                .to_owned(),
            _ => format!("remove `{name}`"),
        };
        problems.push(SettingProblem {
            kind: ProblemKind::InvalidValue,
            message: format!(
                "`{name}` is a setting of `{needed}=` agents; agent `{}` uses `{kind}=`",
                agent.id.value
            ),
            span: set.name_span,
            label: format!("only for `{needed}=`"),
            other: None,
            help,
        });
    }
    if let (Some(set), Some(value)) = (agent.settings.setting("transport"), transport)
        && kind != "builtin"
    {
        problems.push(SettingProblem {
            kind: ProblemKind::InvalidValue,
            message: format!(
                "`transport` chooses how a builtin agent is served; agent `{}` uses `{kind}=`",
                agent.id.value
            ),
            span: set.name_span,
            label: "only for `builtin=`".into(),
            other: Some((value.span, "this transport".into())),
            help: "remove `transport`: `url=`, `command=` and `socket=` already say how to \
                   reach the agent"
                .into(),
        });
    }
    problems
}

/// A `multiagent` agent's own settings, decoded from its settings as written (the loader
/// checked them against [`SPEC`], made `cwd` relative to the suite file and wrote the `env`
/// block as `[[KEY, VALUE], …]`; [`check`] checked them against the endpoint).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct MultiAgentSettings {
    pub request: MultiAgentRequest,
    pub feedback: Feedback,
    /// Agent actions answered within one user step before the loop ends (`max-actions`).
    pub max_actions: u32,
    pub process: trellis_dsl::ProcessMode,
    /// `socket=`: keep one connection open for the trajectory instead of one per call.
    pub keep_open: bool,
    /// `builtin=`: how the embedded agent is served (`transport`).
    pub transport: trellis_dsl::BuiltinTransport,
    /// `command=`: extra environment variables, in the order written.
    pub env: Vec<(String, String)>,
    /// `command=`: the working directory.
    pub cwd: Option<std::path::PathBuf>,
}

impl Default for MultiAgentSettings {
    fn default() -> Self {
        MultiAgentSettings {
            request: Default::default(),
            feedback: Default::default(),
            max_actions: session::DEFAULT_MAX_ACTIONS,
            process: Default::default(),
            keep_open: false,
            transport: Default::default(),
            env: Vec::new(),
            cwd: None,
        }
    }
}

impl registry::PlannedSettings for MultiAgentSettings {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn builtin_serving(&self) -> (trellis_dsl::BuiltinTransport, trellis_dsl::ProcessMode) {
        (self.transport, self.process)
    }
}

/// `request` of a multiagent agent: what each request carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MultiAgentRequest {
    /// `{task_description, turn, conversation_history}` (the spec and the older harness).
    #[default]
    Full,
    /// `{task_description}` only, as newer harnesses send it.
    TaskOnly,
}

/// `feedback` of a multiagent agent: whose wording tool results go back in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feedback {
    /// `Tool 'NAME' returned: {json}. Continue with the task.` (the spec).
    #[default]
    Spec,
    /// The newer harness's wording (the result's `message`).
    Harness,
}

pub struct Module;

impl registry::ProtocolModule for Module {
    fn spec(&self) -> &'static ProtocolSpec {
        &SPEC
    }

    fn plan(
        &self,
        _project: &trellis_dsl::Project,
        agent: &trellis_dsl::Agent,
        _templates: &mut crate::render::Templates,
    ) -> Result<Arc<dyn registry::PlannedSettings>, crate::render::RenderError> {
        Ok(registry::decoded::<MultiAgentSettings>(agent))
    }

    fn build(
        &self,
        setup: &AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, registry::BuildError> {
        multiagent_client(setup)
    }

    /// The action loop's replies are timed as exchanges; `trellis check` has never warned
    /// about `ttft` here.
    fn untimed(&self, _agent: &trellis_dsl::Agent) -> Option<String> {
        None
    }
}

/// A MultiAgentEval client from the agent's endpoint and its `multiagent` settings. The
/// scenario's tools reach each conversation through [`super::Conversation::sandbox`].
pub(super) fn multiagent_client(
    setup: &AgentSetup<'_>,
) -> Result<Arc<dyn AgentProtocol>, registry::BuildError> {
    use session::{MultiAgentClient, MultiAgentOptions};
    use trellis_dsl::Endpoint;
    let settings = registry::settings::<MultiAgentSettings>(setup)?;
    let options = MultiAgentOptions {
        request_form: match settings.request {
            MultiAgentRequest::Full => wire::RequestForm::Full,
            MultiAgentRequest::TaskOnly => wire::RequestForm::TaskOnly,
        },
        feedback: match settings.feedback {
            Feedback::Spec => crate::sandbox::FeedbackWording::Spec,
            Feedback::Harness => crate::sandbox::FeedbackWording::Harness,
        },
        max_actions: settings.max_actions,
        process_mode: match settings.process {
            trellis_dsl::ProcessMode::PerCall => crate::transport::line::ProcessMode::PerCall,
            trellis_dsl::ProcessMode::LongLived => crate::transport::line::ProcessMode::LongLived,
        },
        keep_open: settings.keep_open,
        redone: setup.transport.connections_redone(),
        resent: setup.transport.requests_resent(),
        ..MultiAgentOptions::default()
    };
    let line_limits = crate::transport::line::LineLimits {
        timeout: setup.limits.timeout,
        max_line: setup.limits.max_response_size,
    };
    let client = match (setup.endpoint, &setup.line) {
        // A builtin agent served as a process or on a socket (`transport=`).
        (Endpoint::Builtin(_), Some(super::LineTarget::Command(command)))
        | (Endpoint::Command(command), _) => MultiAgentClient::process(
            command,
            settings.env.clone(),
            settings.cwd.clone(),
            line_limits,
            setup.retry,
            options,
        ),
        (Endpoint::Builtin(_), Some(super::LineTarget::Socket(address))) => {
            MultiAgentClient::socket(address, line_limits, setup.retry, options)?
        }
        (Endpoint::Socket(address), _) => {
            let address = match address {
                trellis_dsl::SocketAddress::Tcp { host, port } if host.contains(':') => {
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    format!("tcp:[{host}]:{port}")
                }
                trellis_dsl::SocketAddress::Tcp { host, port } => format!("tcp:{host}:{port}"),
                trellis_dsl::SocketAddress::Unix(path) => format!("unix:{}", path.display()),
            };
            MultiAgentClient::socket(&address, line_limits, setup.retry, options)?
        }
        (Endpoint::Url(_) | Endpoint::Builtin(_) | Endpoint::Provider(_), _) => {
            MultiAgentClient::http(
                setup.url,
                setup.headers.clone(),
                setup.limits,
                setup.retry,
                setup.transport.clone(),
                options,
            )?
        }
    };
    Ok(Arc::new(client))
}
