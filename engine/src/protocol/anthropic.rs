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
