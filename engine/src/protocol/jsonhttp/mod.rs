//! `protocol="http"`: any JSON-over-HTTP agent whose request and answer the suite describes
//! (LangServe `/invoke` and `/stream`, custom REST bots). docs/language.md has the forms.
//!
//! Each turn renders the agent's `request` template with `messages` (the OpenAI-style
//! conversation so far, including the new user message), the same as `langchain_messages`
//! for LangServe, `user`, `session` and the trajectory's template variables (handed over by
//! the executor through [`super::Session::set_template_scope`]), checks that it is JSON, and
//! sends it with the agent's `method` and headers through the shared transports:
//! [`crate::transport::http`] for one JSON answer (retries, bounded body, fault categories),
//! [`crate::transport::sse`] for `stream` (time to first event, idle timeout, size bounds,
//! `incomplete`). [`codec`] is the pure half that reads the answer; `session.rs` the client
//! and the conversation.
//!
//! Forking: without `session` the conversation is the history the template resends, so a
//! fork copies it; with `session` (a value the agent hands out in its first answer and gets
//! back on later turns) it lives on the agent's side, so `fork` returns `None` and the
//! executor replays the prefix in a fresh session.

pub mod codec;
mod session;
pub mod settings;

pub use session::{JsonHttpClient, JsonHttpError};
pub use settings::{HttpMethod, HttpSettings, JsonPathSetting, SessionCapture, StreamSettings};

// ----- registry glue (`super::registry`)

use std::sync::Arc;

use trellis_dsl::lang::{
    ArgSpec, Capabilities, Children, EndpointKind, Form, NodeSpec, PropSpec, ProtocolSpec,
    ValueType,
};

use super::{AgentProtocol, AgentSetup, registry};

const JSON_PATH: PropSpec = PropSpec {
    name: "json-path",
    ty: ValueType::JsonPath,
    required: true,
    help: "where the value is in the answer",
};

/// A child node of the agent block that takes properties only.
const fn answer_node(
    name: &'static str,
    props: &'static [PropSpec],
    help: &'static str,
) -> NodeSpec {
    NodeSpec {
        name,
        form: Form::Node,
        args: &[],
        props,
        children: Children::None,
        repeatable: false,
        protocols: None,
        help,
    }
}

/// `protocol="http"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "http",
    help: "Any JSON-over-HTTP agent: a `request` template of the body, JSON paths into the answer (LangServe, custom REST bots)",
    endpoints: &[EndpointKind::Url, EndpointKind::Builtin],
    settings: &[
        NodeSpec::setting(
            "method",
            &[ArgSpec::value(ValueType::OneOf(&["POST", "PUT", "PATCH"]))],
            "the HTTP method of every request",
        ),
        NodeSpec::setting(
            "request",
            &[ArgSpec::value(ValueType::TurnTemplate(&[
                "messages",
                "langchain_messages",
                "user",
                "session",
                "vars",
            ]))],
            "the request body, a template rendered per turn that must be JSON",
        ),
        answer_node(
            "reply",
            &[JSON_PATH],
            "where the reply text is in the answer",
        ),
        answer_node(
            "tool-calls",
            &[JSON_PATH],
            "where the agent's tool calls are",
        ),
        answer_node(
            "session",
            &[
                JSON_PATH,
                PropSpec {
                    name: "header",
                    ty: ValueType::HeaderName,
                    required: false,
                    help: "send the value back in this header",
                },
            ],
            "a value the agent hands out and expects back: the conversation lives on its side",
        ),
        answer_node(
            "stream",
            &[
                JSON_PATH,
                PropSpec {
                    name: "event",
                    ty: ValueType::String,
                    required: false,
                    help: "only events of this name carry deltas",
                },
                PropSpec {
                    name: "end-event",
                    ty: ValueType::String,
                    required: false,
                    help: "the event that ends the answer (default `end`)",
                },
            ],
            "the answer comes as server-sent events, each with a text delta at `json-path`",
        ),
    ],
    capabilities: Capabilities {
        streams: true,
        forks: true,
        measures_ttft: true,
        speaks_first: true,
        ..super::connexity::NO_CAPABILITIES
    },
    builtins: &["langserve", "forecast"],

    check: Some(settings::check),
};

/// An `http` agent's settings as planned: `None` for settings the loader would have refused
/// (building the client then fails instead of running with a guess).
impl registry::PlannedSettings for Option<HttpSettings> {
    fn as_any(&self) -> &dyn std::any::Any {
        self
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
        Ok(Arc::new(HttpSettings::of(agent)))
    }

    fn build(
        &self,
        setup: &AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, registry::BuildError> {
        let settings = registry::settings::<Option<HttpSettings>>(setup)?;
        Ok(Arc::new(JsonHttpClient::new(setup, settings.as_ref())?))
    }

    /// Without `stream` the agent answers with one JSON body.
    fn untimed(&self, agent: &trellis_dsl::Agent) -> Option<String> {
        agent
            .settings
            .get("stream")
            .is_none()
            .then(|| registry::one_body(agent))
    }
}
