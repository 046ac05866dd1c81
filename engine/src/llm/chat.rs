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
//! A 429 is waited out (its `Retry-After` honoured) as a provider's is, within the turn's
//! deadline ([`RateLimitWaits`]). Asking a model again has no side effect, so timeouts and
//! broken connections are retried within `retries` too.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use trellis_dsl::ProviderKind;

use super::codec::{self, ChatRequest};
use super::provider::{Admitted, ProviderClient};
use super::slots::ServerSlots;
use crate::protocol::http::{
    CallLimits, EndpointError, HttpTransport, RateLimitWaits, RetryPolicy, agent_url,
    answer_or_fault, retry_after, with_agent_headers, with_retries,
};
use crate::protocol::sse::{self, Opened, StreamLimits};
use crate::protocol::{ChatMessage, Exchange};
use crate::record::{Fault, FaultCategory};

/// The assistant message of one request and its usage, or the fault.
type Answer = Result<(ChatMessage, Option<crate::protocol::Usage>), Fault>;

/// A round of attempts: the answer, and `Some(Retry-After)` when it was a 429 to wait out.
type Round = (Answer, Option<Option<Duration>>);

/// What an attempt holds while it runs: a provider's limits or a server's slot.
enum Held {
    Provider(#[allow(dead_code)] Admitted),
    Server(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>),
    Nothing,
}

/// The fault of a 429 answer on its attempt; the call waits and asks again, or gives up
/// with [`RateLimitWaits::gave_up`].
fn rate_limited() -> Fault {
    Fault::new(FaultCategory::Http4xx, "HTTP 429 Too Many Requests")
}

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

    /// The request body for `history`.
    fn request_body(&self, history: &[ChatMessage]) -> Result<Bytes, serde_json::Error> {
        let config = &self.inner;
        let request = ChatRequest {
            model: &config.model,
            system_prompt: config.system_prompt.as_deref(),
            tools: &config.tools,
            temperature: config.temperature,
            max_tokens: config.max_tokens,
            stream: config.stream,
        };
        let body = codec::chat_body(config.api, &request, history)?;
        serde_json::to_vec(&body).map(Bytes::from)
    }

    /// One request for `history` (after retries): the exchange and the assistant message.
    pub async fn complete(
        &self,
        history: &[ChatMessage],
        deadline: Option<tokio::time::Instant>,
    ) -> (Exchange, Result<ChatMessage, Fault>) {
        let config = &self.inner;
        let mut exchange = Exchange {
            label: config.label.clone(),
            ..Default::default()
        };
        let body = match self.request_body(history) {
            Ok(body) => body,
            Err(e) => {
                let fault = Fault::new(
                    FaultCategory::Internal,
                    format!("could not encode the request: {e}"),
                );
                return (exchange, Err(fault));
            }
        };
        // Charged against a provider's token limit, as the provider's own calls are.
        let estimate = super::provider::token_estimate(body.len(), config.max_tokens);
        let mut rate_limits = RateLimitWaits::default();
        let outcome = loop {
            let (outcome, rate_limited) =
                self.attempt(&body, estimate, deadline, &mut exchange).await;
            let Some(asked) = rate_limited else {
                break outcome;
            };
            match rate_limits.next(asked, deadline) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => break Err(rate_limits.gave_up()),
            }
        };
        // A fault in the answer the last attempt received is that attempt's own.
        if let (Err(fault), Some(last)) = (&outcome, exchange.attempts.last_mut())
            && last.fault.is_none()
        {
            last.fault = Some(fault.clone());
        }
        match outcome {
            Ok((message, mut usage)) => {
                if let (Some(provider), Some(usage)) = (&config.provider, usage.as_mut()) {
                    usage.cost = provider.cost(usage.prompt_tokens, usage.completion_tokens);
                }
                exchange.usage = usage;
                (exchange, Ok(message))
            }
            Err(fault) => (exchange, Err(fault)),
        }
    }

    /// One round of attempts (with retries) through the provider's limits, if any. A 429
    /// answer is `Some(Retry-After)` in the second value: the caller waits and asks again.
    async fn attempt(
        &self,
        body: &Bytes,
        estimate: u32,
        deadline: Option<tokio::time::Instant>,
        exchange: &mut Exchange,
    ) -> Round {
        let config = &self.inner;
        // Held for the whole request (a streamed answer included).
        // Time queued for a provider's limits or a server's slot, per attempt: not the
        // agent's latency, and not spent from the trajectory's time budget.
        let queued = std::sync::Mutex::new(Vec::new());
        let admit = || async {
            let started = tokio::time::Instant::now();
            let held = match (&config.provider, &config.server_slots) {
                (Some(provider), _) => Held::Provider(provider.admit(estimate).await),
                (None, Some(server)) => Held::Server(server.acquire().await),
                (None, None) => Held::Nothing,
            };
            if let Ok(mut queued) = queued.lock() {
                queued.push(started.elapsed());
            }
            held
        };
        let (outcome, asked) = if config.stream {
            let limits = StreamLimits::from(config.limits);
            let attempted = with_retries(config.retry, config.limits.timeout, deadline, |budget| {
                let body = body.clone();
                async move {
                    let held = admit().await;
                    sse::open(
                        &config.transport,
                        &config.url,
                        &config.headers,
                        body,
                        limits,
                        budget,
                    )
                    .await
                    .map(|opened| (opened, held))
                    .map_err(|f| self.redact(f))
                }
            })
            .await;
            exchange.attempts.extend(attempted.attempts);
            let outcome = match attempted.result {
                Err(fault) => Err(fault),
                Ok((Opened::RateLimited(asked), _)) => {
                    return self.round_done(exchange, &queued, Err(rate_limited()), Some(asked));
                }
                Ok((Opened::Json(body), _)) => decode(config.api, &body),
                // The provider's slot stays taken while the stream is read.
                Ok((Opened::Events(mut stream), _held)) => {
                    stream.set_deadline(deadline);
                    let mut first_content = None;
                    let outcome = codec::read_stream(config.api, &mut stream, &mut first_content)
                        .await
                        .map(|answer| (answer.message, answer.usage));
                    exchange.ttft = first_content.or(stream.ttft());
                    // From the request to the end of the stream (the stream started after the
                    // queue, which is taken off below: added here so it comes out even).
                    let queue = queued
                        .lock()
                        .ok()
                        .and_then(|q| q.last().copied())
                        .unwrap_or_default();
                    if let Some(last) = exchange.attempts.last_mut() {
                        last.latency = stream.started().elapsed() + queue;
                    }
                    outcome
                }
            };
            (outcome.map_err(|f| self.redact(f)), None)
        } else {
            let attempted = with_retries(config.retry, config.limits.timeout, deadline, |budget| {
                let body = body.clone();
                async move {
                    let _held = admit().await;
                    config
                        .transport
                        .post_json_raw(
                            &config.url,
                            &config.headers,
                            body,
                            config.limits.max_response_size,
                            budget,
                        )
                        .await
                        .and_then(answer_or_fault)
                        .map_err(|f| self.redact(f))
                }
            })
            .await;
            exchange.attempts.extend(attempted.attempts);
            match attempted.result {
                Err(fault) => (Err(fault), None),
                Ok(response) if response.status == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                    let asked = retry_after(&response.headers, std::time::SystemTime::now());
                    (Err(rate_limited()), Some(asked))
                }
                Ok(response) => (
                    decode(config.api, &response.body).map_err(|f| self.redact(f)),
                    None,
                ),
            }
        };
        self.round_done(exchange, &queued, outcome, asked)
    }

    /// Ends a round of attempts: each attempt's queue time is taken off its latency (the
    /// round's attempts are the last ones recorded), and a 429 answer is its attempt's fault.
    fn round_done(
        &self,
        exchange: &mut Exchange,
        queued: &std::sync::Mutex<Vec<Duration>>,
        outcome: Answer,
        asked: Option<Option<Duration>>,
    ) -> Round {
        let queued = queued.lock().map(|q| q.clone()).unwrap_or_default();
        exchange.queued += queued.iter().sum::<Duration>();
        let round = exchange.attempts.len().saturating_sub(queued.len());
        for (attempt, wait) in exchange.attempts.iter_mut().skip(round).zip(queued) {
            attempt.latency = attempt.latency.saturating_sub(wait);
        }
        if asked.is_some()
            && let Some(last) = exchange.attempts.last_mut()
        {
            last.fault = Some(rate_limited());
        }
        (outcome, asked)
    }

    /// `fault` without the provider's key, which servers sometimes echo in error bodies.
    fn redact(&self, mut fault: Fault) -> Fault {
        if let Some(provider) = &self.inner.provider {
            fault.message = provider.redact(&fault.message);
        }
        fault
    }
}

/// A whole (non-streamed) answer of `api`, as an agent's message and usage.
fn decode(api: ProviderKind, body: &[u8]) -> Answer {
    codec::decode(api, body)
        .map(|answer| (answer.message, answer.usage))
        .map_err(codec::DecodeError::into_fault)
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
    }
}
