//! A model under test reached over its API: the `openai` and `anthropic` agents' calls.
//!
//! The same codecs as the engine's own calls ([`super::codec`]) and, with `provider=`, the
//! same provider ([`ProviderClient`]: endpoint, key, defaults, retries, prices, and its
//! limits through [`ProviderClient::admit`]); without one, the slots of a plain-`http` model
//! server ([`ServerSlots`]) shared with the providers on that server. What differs from the
//! engine's calls is what an agent call is for: its answers are what a run measures, so it
//! never goes through the response cache; every attempt is recorded with its fault on an
//! [`Exchange`], a streamed answer's time to first token is measured, and the time an
//! attempt queued for a provider's limits or a server's slot is taken off its latency
//! ([`Exchange::queued`]) instead of counting as the model's.
//!
//! Requests go through the same call loop as the engine's (`send.rs`): a 429 is waited
//! out (its `Retry-After` honoured) within the turn's deadline ([`RateLimitWaits`]). Asking a
//! model again has no side effect, so timeouts and broken connections are retried within
//! `retries` too.

use std::sync::Arc;

use bytes::Bytes;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use trellis_dsl::ProviderKind;

use super::codec::{self, ChatRequest};
use super::meter::Tab;
use super::provider::ProviderClient;
use super::send::{Queue, Received, Request, SendError, send};
use super::slots::ServerSlots;
use crate::record::ChatMessage;
use crate::record::{Fault, FaultCategory};
use crate::transport::Exchange;
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RateLimitWaits, RetryPolicy, agent_url,
    with_agent_headers,
};

/// The assistant message of one request and its usage, or the fault.
type Answer = Result<codec::Answer, Fault>;

/// `{base}/chat/completions` (or `/messages`), unless the base already ends with it.
fn completions_url(base: &str, api: ProviderKind) -> Result<Url, EndpointError> {
    agent_url(&codec::endpoint_text(api, base))
}

/// A client for one model under test. Cheap to clone: every session holds one.
#[derive(Clone, Debug)]
pub struct ChatClient {
    inner: Arc<ClientConfig>,
}

#[derive(Debug)]
struct ClientConfig {
    url: Url,
    headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    transport: HttpTransport,
    label: Arc<str>,
    model: String,
    system_prompt: Option<String>,
    tools: Vec<serde_json::Value>,
    stream: bool,
    api: ProviderKind,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    /// `provider=`: every request passes the provider's limits, and its usage is priced.
    provider: Option<Arc<ProviderClient>>,
    /// Without a provider: the slots of a plain-`http` server (llama.cpp), shared with the
    /// providers on the same server.
    server_slots: Option<Arc<ServerSlots>>,
}

/// Everything a [`ChatClient`] is built from besides its endpoint.
pub struct ChatOptions {
    pub api: ProviderKind,
    pub model: String,
    pub system_prompt: Option<String>,
    /// The offered tools as chat-completions function definitions.
    pub tools: Vec<serde_json::Value>,
    /// Ask for server-sent events (`stream #true`).
    pub stream: bool,
    /// `provider=`: the endpoint, key, headers, model, temperature, max tokens, retries,
    /// limits and prices come from this provider (the agent's `header`s are added).
    pub provider: Option<Arc<ProviderClient>>,
    /// The agent's own `temperature` and `max-tokens`, over the provider's.
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// The slots of the server behind `base-url` when it reports them (llama.cpp's
    /// `/props`): requests wait here for a free slot instead of in the server's queue.
    pub server_slots: Option<Arc<ServerSlots>>,
}

impl ChatClient {
    /// `base_url` is the API root (`…/v1`; the API's path is appended unless already
    /// there). `headers` are the agent's rendered `header` nodes (an `Authorization` header
    /// carries a key).
    pub fn new(
        base_url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        transport: HttpTransport,
        options: ChatOptions,
    ) -> Result<Self, EndpointError> {
        let (url, mut defaults, model, temperature, max_tokens, retry) = match &options.provider {
            Some(provider) => {
                let (model, temperature, max_tokens) = provider.defaults();
                let model = Some(options.model.clone())
                    .filter(|m| !m.is_empty())
                    .or(model.map(str::to_owned))
                    .unwrap_or_default();
                (
                    provider.url().clone(),
                    provider.headers().clone(),
                    model,
                    temperature,
                    max_tokens,
                    provider.retry(),
                )
            }
            // Asking a model again has no side effect: a broken connection or a timeout is
            // retried within `retries`, as a provider's calls are.
            None => (
                completions_url(base_url, options.api)?,
                HeaderMap::with_capacity(headers.len() + 2),
                options.model,
                None,
                None,
                RetryPolicy {
                    after_send: true,
                    ..retry
                },
            ),
        };
        let stream = options.stream;
        defaults.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        defaults.insert(
            ACCEPT,
            HeaderValue::from_static(if stream {
                "text/event-stream, application/json"
            } else {
                "application/json"
            }),
        );
        codec::api_headers(options.api, &mut defaults);
        let headers = with_agent_headers(defaults, &headers)?;
        let label = Arc::from(format!("POST {}", url.path()));
        Ok(ChatClient {
            inner: Arc::new(ClientConfig {
                url,
                headers,
                limits,
                retry,
                transport,
                label,
                model,
                system_prompt: options.system_prompt,
                tools: options.tools,
                stream,
                api: options.api,
                temperature: options.temperature.or(temperature),
                max_tokens: options.max_tokens.or(max_tokens),
                provider: options.provider,
                server_slots: options.server_slots,
            }),
        })
    }

    /// The model asked for.
    pub fn model(&self) -> &str {
        &self.inner.model
    }

    /// The id of the `provider` the model is reached through, if any.
    pub fn provider_id(&self) -> Option<&str> {
        self.inner.provider.as_deref().map(ProviderClient::id)
    }

    /// The request body for `history`.
    fn request_body(
        &self,
        history: &[ChatMessage],
        system_prompt: Option<&str>,
    ) -> Result<Bytes, serde_json::Error> {
        let config = &self.inner;
        let request = ChatRequest {
            model: &config.model,
            system_prompt: system_prompt.or(config.system_prompt.as_deref()),
            tools: &config.tools,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            stream: config.stream,
        };
        let body = codec::chat_body(config.api, &request, history)?;
        serde_json::to_vec(&body).map(Bytes::from)
    }

    /// One request for `history` (after retries and 429 waits): the exchange and the
    /// assistant message. `turn_headers`: the agent's `header` values rendered for this
    /// turn, sent over its others. `system_prompt`: the agent's `system-prompt` rendered for
    /// this turn, in place of the one of the run. `tab`: the run's LLM budget, which admits each HTTP
    /// request first; one it refuses ends the request unanswered ([`NoAnswer::refused`]).
    pub async fn complete(
        &self,
        history: &[ChatMessage],
        deadline: Option<tokio::time::Instant>,
        turn_headers: Option<&HeaderMap>,
        system_prompt: Option<&str>,
        tab: Option<&Tab<'_>>,
    ) -> (Exchange, Result<ChatMessage, NoAnswer>) {
        let config = &self.inner;
        let mut exchange = Exchange {
            label: config.label.clone(),
            ..Default::default()
        };
        let body = match self.request_body(history, system_prompt) {
            Ok(body) => body,
            Err(e) => {
                let fault = Fault::new(
                    FaultCategory::Internal,
                    format!("could not encode the request: {e}"),
                );
                return (exchange, Err(NoAnswer::from(fault)));
            }
        };
        // Charged against a provider's token limit, as the provider's own calls are.
        let estimate = super::provider::token_estimate(body.len(), config.max_tokens);
        // Priced only through a provider: a model reached by `base-url` reserves nothing.
        let reservation = config
            .provider
            .as_ref()
            .map_or(0.0, |p| p.reservation(body.len(), config.max_tokens));
        let queue = match (&config.provider, &config.server_slots) {
            (Some(provider), _) => Queue::Provider(provider, estimate),
            (None, Some(server)) => Queue::Server(server),
            (None, None) => Queue::Open,
        };
        let headers = crate::transport::http::headers_over(&config.headers, turn_headers);
        let request = Request {
            url: &config.url,
            headers: &headers,
            body,
            limits: config.limits,
            retry: config.retry,
            transport: &config.transport,
            queue,
            stream: config.stream,
            deadline,
            provider: config.provider.as_deref(),
            budget: tab.map(|tab| (tab, reservation)),
        };
        let mut waits = RateLimitWaits::default();
        // What a stream said (and spent) before it was cut.
        let mut heard = codec::Heard::default();
        let outcome = match send(&request, &mut exchange, &mut waits).await {
            Err(SendError::Failed(fault) | SendError::RateLimited(fault)) => Err(fault),
            Err(SendError::Refused(reason)) => {
                let fault = Fault::new(FaultCategory::Internal, reason);
                return (
                    exchange,
                    Err(NoAnswer {
                        fault,
                        said: None,
                        refused: true,
                    }),
                );
            }
            Ok(Received::Body(body)) => decode(config.api, &body).inspect_err(|_| {
                heard.usage = codec::usage_in(config.api, &body);
            }),
            // The queue's slot stays taken while the stream is read.
            Ok(Received::Events(mut stream, _held)) => {
                stream.set_deadline(deadline);
                let mut first_content = None;
                let outcome =
                    codec::read_stream(config.api, &mut stream, &mut first_content, &mut heard)
                        .await;
                exchange.ttft = first_content.or(stream.ttft());
                // From the request to the end of the stream (the stream started after the
                // queue).
                if let Some(last) = exchange.attempts.last_mut() {
                    last.latency = stream.started().elapsed();
                }
                outcome
            }
        };
        let outcome = outcome.map_err(|f| self.redact(f));
        // A fault in the answer the last attempt received is that attempt's own.
        if let (Err(fault), Some(last)) = (&outcome, exchange.attempts.last_mut())
            && last.fault.is_none()
        {
            last.fault = Some(fault.clone());
        }
        match outcome {
            Ok(answer) => {
                let mut usage = answer.usage;
                if let (Some(provider), Some(usage)) = (&config.provider, usage.as_mut()) {
                    usage.cost = provider.cost(usage.priced_prompt(), usage.completion_tokens);
                }
                // Spent whether or not the answer is whole.
                exchange.usage = usage;
                if let Some(fault) = cut_short(&answer) {
                    if let Some(last) = exchange.attempts.last_mut() {
                        last.fault = Some(fault.clone());
                    }
                    let said = answer.message.content.filter(|text| !text.is_empty());
                    return (
                        exchange,
                        Err(NoAnswer {
                            fault,
                            said,
                            refused: false,
                        }),
                    );
                }
                // An empty answer says nothing, streamed or not, unless the model refused
                // (`codec::refused`): refusing is an answer, its reply empty.
                let text = answer.message.content.as_deref().unwrap_or_default();
                if text.is_empty()
                    && answer.message.tool_calls.is_empty()
                    && !codec::refused(answer.finish_reason.as_deref())
                {
                    let fault = Fault::new(
                        FaultCategory::Protocol,
                        "the model answered with neither text nor tool calls (empty content)",
                    );
                    if let Some(last) = exchange.attempts.last_mut() {
                        last.fault = Some(fault.clone());
                    }
                    return (exchange, Err(NoAnswer::from(fault)));
                }
                (exchange, Ok(answer.message))
            }
            Err(fault) => {
                // Spent whether or not the answer is whole.
                let mut usage = heard.usage;
                if let (Some(provider), Some(usage)) = (&config.provider, usage.as_mut()) {
                    usage.cost = provider.cost(usage.priced_prompt(), usage.completion_tokens);
                }
                exchange.usage = usage;
                (
                    exchange,
                    Err(NoAnswer {
                        fault,
                        said: heard.text.filter(|text| !text.is_empty()),
                        refused: false,
                    }),
                )
            }
        }
    }

    /// `fault` without the provider's key, which servers sometimes echo in error bodies.
    fn redact(&self, mut fault: Fault) -> Fault {
        if let Some(provider) = &self.inner.provider {
            fault.message = provider.redact(&fault.message);
        }
        fault
    }
}

/// Why a request gave no answer to check, with the text the model had said by then (a stream
/// cut short, an answer stopped at the token limit): kept on the turn to read, not checked.
#[derive(Debug)]
pub struct NoAnswer {
    pub fault: Fault,
    pub said: Option<String>,
    /// The run's LLM budget refused a request (first or retry): no answer to record, and
    /// the run is stopping.
    pub refused: bool,
}

impl From<Fault> for NoAnswer {
    fn from(fault: Fault) -> Self {
        NoAnswer {
            fault,
            said: None,
            refused: false,
        }
    }
}

/// A whole (non-streamed) answer of `api`.
fn decode(api: ProviderKind, body: &[u8]) -> Answer {
    codec::decode(api, body).map_err(codec::DecodeError::into_fault)
}

/// Why an answer that stopped at the model's output token limit (`length`, Anthropic's
/// `max_tokens`) is not the agent's reply: it is cut mid-way, and checking it would pass or
/// fail it on half a sentence. (A content filter's stop is an answer: a refusal is what a
/// jailbreak scenario checks for.)
fn cut_short(answer: &codec::Answer) -> Option<Fault> {
    let reason = answer.finish_reason.as_deref()?;
    codec::cut_at_token_limit(Some(reason)).then(|| {
        Fault::new(
            FaultCategory::Incomplete,
            format!(
                "the model stopped at its output token limit (finish reason `{reason}`): its \
                 answer is cut short; raise the agent's `max-tokens` (or the server's limit)"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_url_is_appended_once() {
        assert_eq!(
            completions_url("http://127.0.0.1:8080/v1/", ProviderKind::OpenAi)
                .map(|u| u.to_string())
                .ok(),
            Some("http://127.0.0.1:8080/v1/chat/completions".to_owned())
        );
        assert_eq!(
            completions_url("http://h/v1/chat/completions", ProviderKind::OpenAi)
                .map(|u| u.to_string())
                .ok(),
            Some("http://h/v1/chat/completions".to_owned())
        );
        assert_eq!(
            completions_url("http://h/v1", ProviderKind::Anthropic)
                .map(|u| u.to_string())
                .ok(),
            Some("http://h/v1/messages".to_owned())
        );
        // Azure OpenAI: the deployment's URL with its API version.
        for base in [
            "https://r.openai.azure.com/openai/deployments/gpt4o?api-version=2024-06-01",
            "https://r.openai.azure.com/openai/deployments/gpt4o/?api-version=2024-06-01",
            "https://r.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01",
        ] {
            assert_eq!(
                completions_url(base, ProviderKind::OpenAi)
                    .map(|u| u.to_string())
                    .ok()
                    .as_deref(),
                Some(
                    "https://r.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01"
                ),
                "{base}"
            );
        }
    }
}
