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
    ArgSpec, Capabilities, Children, EndpointKind, Form, NodeSpec, ProtocolSpec, ValueType,
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
            &[ArgSpec::value(ValueType::Count)],
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
            &[ArgSpec::value(ValueType::String)],
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
            children: Children::Data,
            repeatable: false,
            protocols: None,
            help: "`command=`: extra environment variables, `env { KEY \"VALUE\" }`",
        },
    ],
    capabilities: Capabilities {
        forks: true,
        engine_runs_tools: true,
        speaks_first: true,
        pauses: true,
        agent_branches: true,
        ..super::connexity::NO_CAPABILITIES
    },
    builtins: &["support"],

    check: None,
};

/// A `multiagent` agent's own settings, decoded from its settings as written (the loader
/// checked them against [`SPEC`], made `cwd` relative to the suite file and wrote the `env`
/// block as `[[KEY, VALUE], …]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct MultiAgentSettings {
    pub request: trellis_dsl::MultiAgentRequest,
    pub feedback: trellis_dsl::Feedback,
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
            trellis_dsl::MultiAgentRequest::Full => wire::RequestForm::Full,
            trellis_dsl::MultiAgentRequest::TaskOnly => wire::RequestForm::TaskOnly,
        },
        feedback: match settings.feedback {
            trellis_dsl::Feedback::Spec => crate::sandbox::FeedbackWording::Spec,
            trellis_dsl::Feedback::Harness => crate::sandbox::FeedbackWording::Harness,
        },
        max_actions: settings.max_actions,
        process_mode: match settings.process {
            trellis_dsl::ProcessMode::PerCall => crate::transport::line::ProcessMode::PerCall,
            trellis_dsl::ProcessMode::LongLived => crate::transport::line::ProcessMode::LongLived,
        },
        keep_open: settings.keep_open,
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
