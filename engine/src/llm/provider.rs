//! One `provider` node as a client: endpoint, key, defaults, limits, prices, and the
//! engine's calls through it.
//!
//! Every request to the provider, the engine's and those of a model under test reached
//! through it, goes through the one call loop (`send.rs`), which layers three things over
//! the shared HTTP transport:
//! - **Limits** ([`Gate`]): a concurrency semaphore, requests per minute spaced evenly, and a
//!   token bucket charged with each request's estimate (prompt characters / 4 + `max_tokens`)
//!   before it is sent. Every HTTP attempt passes the gate, retries included.
//! - **Retries**: [`with_retries`](crate::transport::http::with_retries) with `retry-after-send` semantics, since asking a model
//!   again has no side effect beyond its cost: connect errors, timeouts, broken connections
//!   and 5xx are retried with backoff.
//! - **429**: an answer, not a failure. The call sleeps for its `Retry-After` (seconds or an
//!   HTTP date; exponential when absent) and tries again, for up to [`MAX_RATE_LIMIT_WAIT`](crate::transport::http::MAX_RATE_LIMIT_WAIT) or
//!   the caller's deadline.
//!
//! The key is read from the environment snapshot once, when the client is built, sent only
//! as a sensitive header value, and removed from every error message ([`Secret::redact`]),
//! because servers sometimes echo request headers back in error bodies.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use trellis_dsl::{DEFAULT_PROVIDER_RETRIES, Provider, ProviderKind};

use super::codec::{self, DecodeError, WireRequest};
use super::meter::Tab;
use super::send::{Queue, Received, Request, SendError, send};
use super::slots::{ServerRegistry, ServerSlots};
use super::{CacheUse, LlmCall, LlmError, LlmOutcome, LlmRequest};
use crate::record::{Fault, FaultCategory};
use crate::render::EnvSnapshot;
use crate::transport::Exchange;
use crate::transport::http::{CallLimits, HttpTransport, RateLimitWaits, RetryPolicy};

/// LLM answers are small; this bounds a misbehaving server.
const MAX_RESPONSE_SIZE: u64 = 4 * 1024 * 1024;
/// Output tokens assumed for the token rate limit when neither call nor provider caps them.
const ASSUMED_OUTPUT_TOKENS: u32 = 512;

/// A provider that cannot be used, found when the run is set up.
#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error("provider `{provider}`: invalid base URL `{url}`")]
    InvalidUrl { provider: String, url: String },
    #[error(
        "provider `{provider}`: the environment variable `{var}` (api-key-env) {state}; \
         export it with the key, or remove `api-key-env` for a local server that needs no key"
    )]
    MissingKey {
        provider: String,
        var: String,
        /// `is not set`, or `is empty` (a CI secret a pull request from a fork cannot read).
        state: &'static str,
    },
    #[error("provider `{provider}`: the API key in `{var}` cannot be sent as a header value")]
    InvalidKey { provider: String, var: String },
    #[error("provider `{provider}`: invalid header `{name}`")]
    InvalidHeader { provider: String, name: String },
}

/// An API key, and the other spellings it may be echoed in ([`crate::transport::quote::secret_spellings`]).
/// Its `Debug` never shows it.
#[derive(Clone)]
struct Secret(Arc<str>, Arc<[String]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// `text` with every occurrence of the key replaced.
    fn new(key: &str) -> Secret {
        Secret(
            Arc::from(key),
            crate::transport::quote::secret_spellings(key).into(),
        )
    }

    /// `text` with every occurrence of the key, in any of its spellings, replaced. A key
    /// shorter than [`crate::transport::quote::MIN_SECRET_LEN`] is not looked for, as no secret that
    /// short is: it protects nothing, and replacing every `k` of a text garbles it (a cache
    /// entry among them).
    fn redact(&self, text: &str) -> String {
        if self.0.chars().count() < crate::transport::quote::MIN_SECRET_LEN {
            return text.to_owned();
        }
        let mut out = text.to_owned();
        for spelling in self.1.iter() {
            if out.contains(spelling.as_str()) {
                out = out.replace(spelling.as_str(), "[redacted]");
            }
        }
        match crate::transport::quote::replace_percent_spelled(&out, &self.0, "[redacted]") {
            Some(redacted) => redacted,
            None => out,
        }
    }
}

/// The rate and concurrency limits of one provider, shared by all its calls in a run.
#[derive(Debug)]
struct Gate {
    slots: Slots,
    requests: Option<DefaultDirectRateLimiter>,
    tokens: Option<(DefaultDirectRateLimiter, NonZeroU32)>,
}

/// Where a provider's concurrency limit comes from.
#[derive(Debug)]
enum Slots {
    /// `concurrency=N`: this provider's own.
    Configured(Arc<Semaphore>),
    /// The server's slot count, shared by everything of the run that talks to the server.
    Server(Arc<ServerSlots>),
    /// No limit.
    Unlimited,
}

/// A concurrency slot taken, held while alive.
#[derive(Debug)]
pub struct SlotPermit(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Gate {
    fn new(provider: &Provider, server: Option<Arc<ServerSlots>>) -> Self {
        let requests = provider
            .requests_per_minute
            .and_then(NonZeroU32::new)
            .and_then(|n| Quota::with_period(Duration::from_secs(60) / n.get()))
            .map(RateLimiter::direct);
        let tokens = provider
            .tokens_per_minute
            .and_then(NonZeroU32::new)
            .map(|n| (RateLimiter::direct(Quota::per_minute(n)), n));
        let slots = match (provider.concurrency, server) {
            (Some(n), _) => Slots::Configured(Arc::new(Semaphore::new(n.max(1)))),
            (None, Some(server)) => Slots::Server(server),
            (None, None) => Slots::Unlimited,
        };
        Gate {
            slots,
            requests,
            tokens,
        }
    }

    /// Waits for a request of about `tokens` tokens to be allowed; the returned permit
    /// holds the concurrency slot. The rate limits are waited for first: a slot shared with
    /// every provider on the server is not held while this provider waits for its quota.
    async fn pass(&self, tokens: u32) -> SlotPermit {
        if let Some(limiter) = &self.requests {
            limiter.until_ready().await;
        }
        if let Some((limiter, capacity)) = &self.tokens {
            // A request larger than a whole minute's budget waits for a full bucket.
            let n = NonZeroU32::new(tokens.clamp(1, capacity.get())).unwrap_or(*capacity);
            let _ = limiter.until_n_ready(n).await;
        }
        let permit = match &self.slots {
            Slots::Configured(slots) => slots.clone().acquire_owned().await.ok(),
            Slots::Server(server) => server.acquire().await,
            Slots::Unlimited => None,
        };
        SlotPermit(permit)
    }
}

/// A `provider` as configured for a run. Cheap to share (`Arc`); every call of the run goes
/// through the same limits.
#[derive(Debug)]
pub struct ProviderClient {
    id: String,
    kind: ProviderKind,
    url: Url,
    headers: HeaderMap,
    key: Option<Secret>,
    model: Option<String>,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    limits: CallLimits,
    retry: RetryPolicy,
    input_price: Option<f64>,
    output_price: Option<f64>,
    gate: Gate,
    transport: HttpTransport,
}

impl ProviderClient {
    /// The client of `provider`, its key read from `env` (the run's environment snapshot).
    /// `servers` shares each plain-`http` server's slot count (llama.cpp) with the run's
    /// other providers and model agents on the same server.
    pub fn new(
        provider: &Provider,
        env: &EnvSnapshot,
        transport: HttpTransport,
        servers: &ServerRegistry,
    ) -> Result<Self, ProviderSetupError> {
        let id = provider.id.value.clone();
        let url = endpoint(provider.kind, provider.base_url.as_deref()).ok_or_else(|| {
            ProviderSetupError::InvalidUrl {
                provider: id.clone(),
                url: provider.base_url.clone().unwrap_or_default(),
            }
        })?;
        let key = match &provider.api_key_env {
            None => None,
            Some(var) => match env.get(&var.value) {
                Some(value) if !value.is_empty() => Some(Secret::new(value)),
                value => {
                    return Err(ProviderSetupError::MissingKey {
                        provider: id,
                        var: var.value.clone(),
                        state: if value.is_some() {
                            "is empty"
                        } else {
                            "is not set"
                        },
                    });
                }
            },
        };
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        codec::api_headers(provider.kind, &mut headers);
        for (name, value) in &provider.headers {
            let invalid = || ProviderSetupError::InvalidHeader {
                provider: id.clone(),
                name: name.clone(),
            };
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
            let mut value = HeaderValue::from_str(value).map_err(|_| invalid())?;
            value.set_sensitive(true);
            headers.append(name, value);
        }
        if let Some(key) = &key {
            let (name, text) = match &provider.api_key_header {
                Some(name) => (
                    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        ProviderSetupError::InvalidHeader {
                            provider: id.clone(),
                            name: name.clone(),
                        }
                    })?,
                    key.0.to_string(),
                ),
                None => codec::key_header(provider.kind, &key.0),
            };
            let mut value =
                HeaderValue::from_str(&text).map_err(|_| ProviderSetupError::InvalidKey {
                    provider: id.clone(),
                    var: provider
                        .api_key_env
                        .as_ref()
                        .map(|var| var.value.clone())
                        .unwrap_or_default(),
                })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let gate = Gate::new(provider, servers.for_url(&url, &headers, &transport));
        Ok(ProviderClient {
            kind: provider.kind,
            url,
            headers,
            key,
            model: provider.model.clone(),
            temperature: provider.temperature,
            max_tokens: provider.max_tokens,
            limits: CallLimits {
                timeout: provider.call_timeout(),
                max_response_size: MAX_RESPONSE_SIZE,
            },
            retry: RetryPolicy {
                retries: provider.retries.unwrap_or(DEFAULT_PROVIDER_RETRIES),
                after_send: true,
            },
            input_price: provider.input_price,
            output_price: provider.output_price,
            gate,
            transport,
            id,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn kind(&self) -> ProviderKind {
        self.kind
    }

    /// The endpoint called: `{base-url}/chat/completions` or `{base-url}/messages`.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The headers every request carries: content type, API version, the key, `header`s.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The provider's own `model`, `temperature` and `max-tokens`.
    pub fn defaults(&self) -> (Option<&str>, Option<f64>, Option<u32>) {
        (self.model.as_deref(), self.temperature, self.max_tokens)
    }

    /// The provider's `retries`, with retry-after-send semantics (asking a model again has
    /// no side effect beyond its cost).
    pub fn retry(&self) -> RetryPolicy {
        self.retry
    }

    /// Waits until the provider's limits let a request of about `tokens` tokens go; the
    /// concurrency slot is held until the returned value is dropped. Used by a model under
    /// test reached through this provider, so its calls queue with the judges' and the
    /// simulator's instead of piling up on a one-slot server.
    pub async fn admit(&self, tokens: u32) -> Admitted {
        let queued = Instant::now();
        let permit = self.gate.pass(tokens).await;
        Admitted {
            _permit: permit,
            waited: queued.elapsed(),
        }
    }

    /// Waits for one of the provider's concurrency slots (its `concurrency`, else its
    /// server's slot count) without its rate limits: an agent whose own model runs on this
    /// server holds it for a whole turn, so its model calls and the judges' take turns.
    pub async fn slot(&self) -> SlotPermit {
        SlotPermit(match &self.gate.slots {
            Slots::Configured(slots) => slots.clone().acquire_owned().await.ok(),
            Slots::Server(server) => server.acquire().await,
            Slots::Unlimited => None,
        })
    }

    /// `text` without the key (servers echo request headers in error bodies).
    pub fn redact(&self, text: &str) -> String {
        match &self.key {
            Some(key) => key.redact(text),
            None => text.to_owned(),
        }
    }

    /// The model a request is sent with: its own, else the provider's.
    pub fn model_for<'a>(&'a self, request: &'a LlmRequest) -> Option<&'a str> {
        request.model.as_deref().or(self.model.as_deref())
    }

    /// The parameters actually sent for `request` (its own, else the provider's): what the
    /// response cache keys on.
    pub fn resolved<'a>(&'a self, request: &'a LlmRequest) -> Option<WireRequest<'a>> {
        Some(WireRequest {
            model: self.model_for(request)?,
            messages: &request.messages,
            temperature: request
                .temperature
                .or(self.temperature)
                .or(request.temperature_default),
            max_tokens: request
                .max_tokens
                .or(self.max_tokens)
                .or(request.max_tokens_default),
            json_schema: request.json_schema.as_ref(),
        })
    }

    /// The cost of `input` and `output` tokens at the provider's prices, when it has any.
    /// `input` is in input tokens as billed ([`crate::transport::Usage::priced_prompt`]).
    pub fn cost(&self, input: Option<f64>, output: Option<u64>) -> Option<f64> {
        if self.input_price.is_none() && self.output_price.is_none() {
            return None;
        }
        if input.is_none() && output.is_none() {
            return None;
        }
        let input = input.unwrap_or(0.0) * self.input_price.unwrap_or(0.0);
        let output = output.unwrap_or(0) as f64 * self.output_price.unwrap_or(0.0);
        Some((input + output) / 1_000_000.0)
    }

    /// The most a request of `prompt_chars` characters of prompt that may write `max_tokens`
    /// is expected to cost at the provider's prices ([`token_estimate`]'s prompt and output
    /// apart): what it reserves under `--max-llm-cost` while in flight ([`super::meter`]).
    /// Nothing without prices.
    pub fn reservation(&self, prompt_chars: usize, max_tokens: Option<u32>) -> f64 {
        let prompt = u64::try_from(prompt_chars / 4).unwrap_or(u64::MAX);
        let output = u64::from(max_tokens.unwrap_or(ASSUMED_OUTPUT_TOKENS));
        self.cost(Some(prompt as f64), Some(output)).unwrap_or(0.0)
    }

    /// Sends `request` and reads the answer, within the provider's limits, retrying what is
    /// transient and waiting out 429s, never past `deadline`. Never panics on what the
    /// server sends; the record is filled either way.
    pub async fn complete(&self, request: &LlmRequest, deadline: Option<Instant>) -> LlmOutcome {
        self.complete_within(request, deadline, None).await
    }

    /// [`ProviderClient::complete`], each HTTP request admitted by the run's LLM budget
    /// through `tab` first; a request it refuses ends the call with [`LlmError::Budget`].
    pub(crate) async fn complete_within(
        &self,
        request: &LlmRequest,
        deadline: Option<Instant>,
        tab: Option<&Tab<'_>>,
    ) -> LlmOutcome {
        let started = Instant::now();
        let mut call = LlmCall {
            provider: self.id.clone(),
            model: self.model_for(request).unwrap_or_default().to_owned(),
            cache: CacheUse::Off,
            ..LlmCall::default()
        };
        let result = self.call(request, deadline, &mut call, tab).await;
        call.latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        if let Ok(completion) = &result {
            call.input_tokens = completion.input_tokens;
            call.output_tokens = completion.output_tokens;
            call.cost = self.cost(completion.priced_input(), completion.output_tokens);
        }
        if let Err(e) = &result {
            call.error = Some(e.to_string());
        }
        LlmOutcome { result, call }
    }

    async fn call(
        &self,
        request: &LlmRequest,
        deadline: Option<Instant>,
        call: &mut LlmCall,
        tab: Option<&Tab<'_>>,
    ) -> Result<super::Completion, LlmError> {
        let wire_request = self.resolved(request).ok_or_else(|| LlmError::NoModel {
            provider: self.id.clone(),
        })?;
        let body = Bytes::from(codec::encode(self.kind, &wire_request).to_string());
        let estimate = estimate_tokens(&wire_request);
        let chars: usize = wire_request.messages.iter().map(|m| m.content.len()).sum();
        let reservation = self.reservation(chars, wire_request.max_tokens);
        let request = Request {
            url: &self.url,
            headers: &self.headers,
            body,
            limits: self.limits,
            retry: self.retry,
            transport: &self.transport,
            queue: Queue::Provider(self, estimate),
            stream: false,
            deadline,
            provider: Some(self),
            budget: tab.map(|tab| (tab, reservation)),
        };
        let mut exchange = Exchange::default();
        let mut waits = RateLimitWaits::default();
        let sent = send(&request, &mut exchange, &mut waits).await;
        call.attempts = u32::try_from(exchange.attempts.len()).unwrap_or(u32::MAX);
        call.rate_limited = waits.count();
        call.waited_ms = (exchange.queued + waits.waited()).as_secs_f64() * 1000.0;
        let body = match sent {
            Ok(Received::Body(body)) => body,
            // Not asked for: the engine's calls never stream.
            Ok(Received::Events(..)) => {
                return Err(LlmError::Malformed {
                    provider: self.id.clone(),
                    detail: "the server answered with an event stream".to_owned(),
                });
            }
            Err(SendError::Failed(fault)) => return Err(self.http_error(fault)),
            Err(SendError::Refused(reason)) => return Err(LlmError::Budget(reason)),
            Err(SendError::RateLimited(_)) => {
                return Err(LlmError::RateLimited {
                    provider: self.id.clone(),
                    waited_s: waits.waited().as_secs_f64(),
                });
            }
        };
        codec::decode(self.kind, &body)
            .and_then(codec::Answer::into_completion)
            .map_err(|e| {
                // An answer that is not one (no text) may still say what it spent, and was
                // billed all the same.
                if let Some(usage) = codec::usage_in(self.kind, &body) {
                    call.input_tokens = usage.prompt_tokens;
                    call.output_tokens = usage.completion_tokens;
                    call.cost = self.cost(usage.priced_prompt(), usage.completion_tokens);
                }
                self.decode_error(e)
            })
    }

    fn decode_error(&self, e: DecodeError) -> LlmError {
        match e {
            DecodeError::NotJson { .. } => LlmError::NotJson {
                provider: self.id.clone(),
                detail: self.redact(&e.to_string()),
            },
            DecodeError::Malformed(detail) => LlmError::Malformed {
                provider: self.id.clone(),
                detail: self.redact(&detail),
            },
            DecodeError::Provider(detail) => LlmError::Provider {
                provider: self.id.clone(),
                detail: self.redact(&detail),
            },
        }
    }

    fn http_error(&self, fault: Fault) -> LlmError {
        LlmError::Http {
            provider: self.id.clone(),
            category: fault.category,
            message: self.redact(&fault.message),
        }
    }
}

/// A request let through a provider's limits: holds its concurrency slot while alive.
#[derive(Debug)]
pub struct Admitted {
    _permit: SlotPermit,
    /// How long the request waited for the limits.
    pub waited: Duration,
}

/// `{base}/chat/completions` or `{base}/messages`, unless the base already ends with it.
fn endpoint(kind: ProviderKind, base: Option<&str>) -> Option<Url> {
    let full = codec::endpoint_text(kind, base.unwrap_or(codec::default_base(kind)));
    let url: Url = full.parse().ok()?;
    matches!(url.scheme(), "http" | "https").then_some(url)
}

/// Tokens a request may use: its prompt (about four characters a token) plus what it may
/// generate. Charged against `tokens-per-minute` before the request is sent.
fn estimate_tokens(request: &WireRequest<'_>) -> u32 {
    let chars: usize = request.messages.iter().map(|m| m.content.len()).sum();
    token_estimate(chars, request.max_tokens)
}

/// The token estimate of a request with `prompt_chars` characters of prompt that may write
/// `max_tokens` ([`ASSUMED_OUTPUT_TOKENS`] when uncapped).
pub fn token_estimate(prompt_chars: usize, max_tokens: Option<u32>) -> u32 {
    let prompt = u32::try_from(prompt_chars / 4).unwrap_or(u32::MAX);
    prompt.saturating_add(max_tokens.unwrap_or(ASSUMED_OUTPUT_TOKENS))
}

impl From<&LlmError> for Fault {
    fn from(e: &LlmError) -> Self {
        let category = match e {
            LlmError::Http { category, .. } => *category,
            LlmError::RateLimited { .. } => FaultCategory::Timeout,
            LlmError::NotJson { .. } => FaultCategory::InvalidJson,
            LlmError::Malformed { .. } => FaultCategory::Protocol,
            LlmError::Provider { .. } => FaultCategory::AgentError,
            LlmError::NoModel { .. } | LlmError::CacheMiss { .. } | LlmError::Cache(_) => {
                FaultCategory::Setup
            }
            // Only seen by a path the stopping run no longer records.
            LlmError::Budget(_) => FaultCategory::Internal,
        };
        Fault::new(category, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::http::retry_after;
    use reqwest::header::RETRY_AFTER;
    use std::time::SystemTime;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after(&headers, now), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(3)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("0.5"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_millis(500)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        headers.insert(RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(7)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers, now), None);
        // Azure's milliseconds, alone or finer than `Retry-After`.
        headers.insert("retry-after-ms", HeaderValue::from_static("300"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_millis(300)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_millis(300)));
        headers.remove(RETRY_AFTER);
        headers.insert("retry-after-ms", HeaderValue::from_static("later"));
        assert_eq!(retry_after(&headers, now), None);
    }

    #[test]
    fn endpoints_accept_a_base_with_or_without_the_path() {
        let url = |kind, base| endpoint(kind, base).map(|u| u.to_string());
        assert_eq!(
            url(ProviderKind::OpenAi, Some("http://127.0.0.1:8080/v1/")).as_deref(),
            Some("http://127.0.0.1:8080/v1/chat/completions")
        );
        assert_eq!(
            url(ProviderKind::OpenAi, Some("http://h/v1/chat/completions")).as_deref(),
            Some("http://h/v1/chat/completions")
        );
        assert_eq!(
            url(ProviderKind::Anthropic, None).as_deref(),
            Some("https://api.anthropic.com/v1/messages")
        );
        assert_eq!(url(ProviderKind::OpenAi, Some("ftp://h")), None);
    }

    #[test]
    fn secrets_are_cut_out_and_never_debug_printed() {
        let key = Secret::new("sk-123");
        assert_eq!(
            key.redact("echo: Bearer sk-123!"),
            "echo: Bearer [redacted]!"
        );
        assert!(!format!("{key:?}").contains("sk-123"));
        // Echoed inside a JSON string that escapes `/` (PHP, some gateways).
        let key = Secret::new("sk/abc/123");
        assert_eq!(
            key.redact(r#"{"message": "Incorrect API key provided: sk\/abc\/123"}"#),
            r#"{"message": "Incorrect API key provided: [redacted]"}"#
        );
    }
}
