//! `protocol="anthropic"`: the agent under test is a model behind Anthropic Messages, given a
//! system prompt and tools, and the engine runs its tool loop. The session, tool loop and
//! settings are the `openai` agent's ([`super::openai`]); the wire format (the system prompt
//! apart, `tool_use` and `tool_result` blocks, typed stream events) is the LLM client's
//! ([`crate::llm::anthropic`]).

use trellis_dsl::ProviderKind;

use super::openai::{OpenAiClient, OpenAiOptions};
use crate::transport::http::{CallLimits, EndpointError, HttpTransport, RetryPolicy};

/// The client of an `anthropic` agent. `base_url` is the API root (`…/v1`; `/messages` is
/// appended unless already there); `headers` are the agent's rendered `header` nodes (an
/// `x-api-key` header carries a key; `anthropic-version` is sent unless one of them sets it).
pub fn client(
    base_url: &str,
    headers: Vec<(String, String)>,
    limits: CallLimits,
    retry: RetryPolicy,
    transport: HttpTransport,
    options: OpenAiOptions,
) -> Result<OpenAiClient, EndpointError> {
    OpenAiClient::for_api(
        ProviderKind::Anthropic,
        base_url,
        headers,
        limits,
        retry,
        transport,
        options,
    )
}

// ----- registry glue (`super::registry`): the `anthropic` protocol shares the `openai`
// agent's settings, planning and client; only its name and API differ.

use std::sync::Arc;

use trellis_dsl::lang::{Capabilities, ProtocolSpec};
use trellis_dsl::{Agent, Project};

use super::AgentProtocol;
use super::openai::{MODEL_CAPABILITIES, MODEL_ENDPOINTS, MODEL_SETTINGS};
use crate::render::{RenderError, Templates};

/// `protocol="anthropic"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "anthropic",
    help: "A model behind Anthropic Messages, with the same tool loop as `openai`",
    endpoints: MODEL_ENDPOINTS,
    settings: MODEL_SETTINGS,
    // Messages must start with a user message: the model cannot be asked to open.
    capabilities: Capabilities {
        speaks_first: false,
        ..MODEL_CAPABILITIES
    },
    // `trellis-agents`' deterministic order-desk model behind Anthropic Messages.
    builtins: &["concierge"],

    check: None,
};

pub struct Module;

impl super::registry::ProtocolModule for Module {
    fn spec(&self) -> &'static ProtocolSpec {
        &SPEC
    }
    fn plan(
        &self,
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, RenderError> {
        super::openai::plan_model(project, agent, templates, ProviderKind::Anthropic)
    }
    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        super::openai::build_model(setup)
    }
    fn untimed(&self, agent: &Agent) -> Option<String> {
        super::openai::unstreamed_model(agent)
    }
}
