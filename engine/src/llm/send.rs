//! The one call loop of every request to a model: the engine's own calls
//! ([`ProviderClient::complete`]) and those of agents under test ([`super::chat`]).
//!
//! One logical request is rounds of attempts. Each attempt first queues where the request
//! must (`Queue`: a provider's limits, else a model server's slots), then is sent; the
//! round retries within the caller's [`RetryPolicy`] ([`with_retries`]). A 429 ends the
//! round: it is waited out (its `Retry-After` honoured, [`RateLimitWaits`]) and a new round
//! starts, so a rate-limited model is never failed for it until the waits run out. The time
//! each attempt queued is taken off its latency and summed in [`Exchange::queued`]: it is
//! neither the model's latency nor (for an agent) the trajectory's time.
//!
//! Every attempt is admitted by the run's LLM budget before it queues ([`Request::budget`],
//! [`Tab::admit`]): each HTTP request sent is one against `--max-llm-calls`, retries, 429
//! re-sends and refused parameters' re-sends included. An attempt the budget refuses ends the
//! request unsent ([`SendError::Refused`]) and is not recorded as an attempt. It is admitted
//! before it queues so that nothing waiting for the budget holds a provider's slot, which the
//! requests in flight it waits for may need for their own retries.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::Url;
use reqwest::header::HeaderMap;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::meter::Tab;
use super::provider::{Admitted, ProviderClient};
use super::slots::ServerSlots;
use crate::record::{Fault, FaultCategory};
use crate::transport::Exchange;
use crate::transport::http::{
    CallLimits, HttpTransport, RateLimitWaits, RetryPolicy, answer_or_fault, retry_after,
    with_retries,
};
use crate::transport::sse::{self, Opened, StreamLimits};

/// Where each attempt of a request waits before it is sent.
#[derive(Clone, Copy)]
pub(super) enum Queue<'a> {
    /// The provider's concurrency, request and token limits, charged with the request's
    /// token estimate.
    Provider(&'a ProviderClient, u32),
    /// A plain-`http` model server's slots (llama.cpp), shared with the providers on it.
    Server(&'a ServerSlots),
    /// Nothing to wait for.
    Open,
}

/// What an attempt holds while it runs (a streamed answer: until it is read).
pub(super) enum Held {
    Provider(#[allow(dead_code)] Admitted),
    Server(#[allow(dead_code)] Option<OwnedSemaphorePermit>),
    Nothing,
}

impl Queue<'_> {
    async fn wait(self) -> Held {
        match self {
            Queue::Provider(provider, tokens) => Held::Provider(provider.admit(tokens).await),
            Queue::Server(server) => Held::Server(server.acquire().await),
            Queue::Open => Held::Nothing,
        }
    }
}

/// One request to a model.
#[derive(Clone)]
pub(super) struct Request<'a> {
    pub url: &'a Url,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    pub limits: CallLimits,
    pub retry: RetryPolicy,
    pub transport: &'a HttpTransport,
    pub queue: Queue<'a>,
    /// Ask for server-sent events.
    pub stream: bool,
    pub deadline: Option<Instant>,
    /// Cuts the key out of fault messages (servers echo request headers in error bodies).
    pub provider: Option<&'a ProviderClient>,
    /// The run's LLM budget, which admits each attempt, with what one may cost at most
    /// (its reservation, [`super::meter`]); `None` sends without asking.
    pub budget: Option<(&'a Tab<'a>, f64)>,
}

/// A 2xx answer other than a 429.
pub(super) enum Received {
    /// A whole body (also the answer to a streamed request that a server sent as JSON).
    Body(Bytes),
    /// A stream to read; the queue's slot is held until it is dropped.
    Events(Box<sse::EventStream>, Held),
}

/// Why a request got no answer.
pub(super) enum SendError {
    /// A transport failure or error status, after the retries.
    Failed(Fault),
    /// 429 answers kept coming past what the request may wait.
    RateLimited(Fault),
    /// The run's LLM budget refused an attempt (why): not sent, and the run is stopping.
    Refused(String),
}

/// The fault of a 429 answer on its attempt.
fn rate_limited() -> Fault {
    Fault::new(FaultCategory::Http4xx, "HTTP 429 Too Many Requests")
}

/// Sends `request` until an answer that is not a 429, recording every attempt, its fault
/// and its queue time on `exchange`; `waits` counts the 429s and the time waited for them.
/// A parameter the model refuses by name ([`adapted`]) is changed and the request sent again.
pub(super) async fn send(
    request: &Request<'_>,
    exchange: &mut Exchange,
    waits: &mut RateLimitWaits,
) -> Result<Received, SendError> {
    // Only OpenAI's chat form is changed: an Anthropic request behind a proxy that passes
    // OpenAI's words on must keep the `max_tokens` Anthropic requires.
    let speaks_openai = request.url.path().ends_with(super::openai::PATH);
    // The endpoint a refusal is learned for: read from the body only when something was
    // refused, in this call or before, not for every request.
    let endpoint = || format!("{} {}", request.url, model_of(&request.body));
    // What this endpoint's model refused before is changed before it is sent.
    let mut body: Option<Bytes> = None;
    if speaks_openai {
        for change in learned(endpoint) {
            if let Some(changed) = change.apply(body.as_ref().unwrap_or(&request.body)) {
                body = Some(changed);
            }
        }
    }
    let mut changed: Option<Request<'_>> = body.map(|body| Request {
        body,
        ..request.clone()
    });
    loop {
        let current = changed.as_ref().unwrap_or(request);
        let (outcome, asked) = match round(current, exchange).await {
            Round::Refused(reason) => return Err(SendError::Refused(reason)),
            Round::Ended(outcome, asked) => (outcome, asked),
        };
        let Some(asked) = asked else {
            if let Err(fault) = &outcome
                && speaks_openai
                && let Some(change) = Change::refused_in(fault)
                && let Some(body) = change.apply(&current.body)
            {
                learn(&endpoint(), change);
                changed = Some(Request {
                    body,
                    ..current.clone()
                });
                continue;
            }
            return outcome.map_err(SendError::Failed);
        };
        match waits.next(asked, request.deadline) {
            Some(wait) => crate::transport::http::wait_out_rate_limit(wait).await,
            None => {
                // A model agent reached by `base-url` has no provider's settings to lower.
                let load = if request.provider.is_some() {
                    "the provider's `concurrency`, `requests-per-minute`"
                } else {
                    "the agent's `concurrency`"
                };
                return Err(SendError::RateLimited(waits.gave_up(load)));
            }
        }
    }
}

/// A parameter a model refused by name, with a 400, the way OpenAI's reasoning models
/// (o-series, gpt-5) refuse them: the request is changed and sent again, and the endpoint's
/// later requests are sent changed ([`learn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// `max_tokens` sent as `max_completion_tokens`.
    CompletionTokens,
    /// A `temperature` they do not take left out (their only one is the default).
    NoTemperature,
}

impl Change {
    fn refused_in(fault: &Fault) -> Option<Change> {
        let message = &fault.message;
        if fault.category != FaultCategory::Http4xx || !message.starts_with("HTTP 400") {
            return None;
        }
        if message.contains("max_completion_tokens") && message.contains("'max_tokens'") {
            Some(Change::CompletionTokens)
        } else if message.contains("'temperature'")
            && (message.contains("Unsupported") || message.contains("not supported"))
        {
            Some(Change::NoTemperature)
        } else {
            None
        }
    }

    /// `body` changed; `None` when it has nothing to change (so a request is changed at most
    /// once per parameter).
    fn apply(self, body: &Bytes) -> Option<Bytes> {
        let mut json: serde_json::Value = serde_json::from_slice(body).ok()?;
        let object = json.as_object_mut()?;
        match self {
            Change::CompletionTokens => {
                let cap = object.remove("max_tokens")?;
                object.insert("max_completion_tokens".into(), cap);
            }
            Change::NoTemperature => {
                object.remove("temperature")?;
            }
        }
        serde_json::to_vec(&json).ok().map(Bytes::from)
    }
}

/// What each endpoint (URL and model) refused so far in this process.
static LEARNED: std::sync::LazyLock<Mutex<Vec<(String, Change)>>> =
    std::sync::LazyLock::new(Mutex::default);

/// What the endpoint `endpoint` names refused before; it is asked for only once anything was
/// refused in this process.
fn learned(endpoint: impl FnOnce() -> String) -> Vec<Change> {
    let Ok(learned) = LEARNED.lock() else {
        return Vec::new();
    };
    if learned.is_empty() {
        return Vec::new();
    }
    let endpoint = endpoint();
    learned
        .iter()
        .filter(|(e, _)| *e == endpoint)
        .map(|(_, c)| *c)
        .collect()
}

fn learn(endpoint: &str, change: Change) {
    if let Ok(mut learned) = LEARNED.lock()
        && !learned.iter().any(|(e, c)| e == endpoint && *c == change)
    {
        learned.push((endpoint.to_owned(), change));
    }
}

/// The `model` a request body asks for (empty when it names none).
fn model_of(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Model {
        #[serde(default)]
        model: String,
    }
    serde_json::from_slice::<Model>(body)
        .map(|m| m.model)
        .unwrap_or_default()
}

/// How a round of attempts ended.
enum Round {
    /// The answer, and `Some(Retry-After)` when it was a 429 to wait out.
    Ended(Result<Received, Fault>, Option<Option<Duration>>),
    /// The budget refused an attempt (why).
    Refused(String),
}

/// One round of attempts (with retries).
async fn round(request: &Request<'_>, exchange: &mut Exchange) -> Round {
    let redact = |mut fault: Fault| {
        if let Some(provider) = request.provider {
            fault.message = provider.redact(&fault.message);
        }
        fault
    };
    // Why the budget refused the last attempt, if it did: such an attempt ends the round as
    // a fault no retry policy allows, and is taken out of the attempts below.
    let refused: Mutex<Option<String>> = Mutex::new(None);
    // Returns how long the attempt waited for room under the budget: as time queued for a
    // provider's slot, it is neither the model's latency nor the trajectory's time.
    let admit = || async {
        let Some((tab, reservation)) = request.budget else {
            return Ok(Duration::ZERO);
        };
        let started = Instant::now();
        tab.admit(reservation)
            .await
            .map(|()| started.elapsed())
            .map_err(|reason| {
                if let Ok(mut refused) = refused.lock() {
                    *refused = Some(reason.clone());
                }
                Fault::new(FaultCategory::Internal, reason)
            })
    };
    // Time queued per attempt: taken off that attempt's latency below.
    let queued = Mutex::new(Vec::new());
    let queued_ref = &queued;
    let queue = move |admitted: Duration| async move {
        let started = Instant::now();
        let held = request.queue.wait().await;
        if let Ok(mut queued) = queued_ref.lock() {
            queued.push(admitted + started.elapsed());
        }
        held
    };
    let (outcome, asked) = if request.stream {
        let limits = StreamLimits::from(request.limits);
        let attempted = with_retries(
            request.retry,
            request.limits.timeout,
            request.deadline,
            |budget| {
                let body = request.body.clone();
                async move {
                    let admitted = admit().await?;
                    let held = queue(admitted).await;
                    sse::open(
                        request.transport,
                        request.url,
                        request.headers,
                        body,
                        limits,
                        budget,
                    )
                    .await
                    .map(|opened| (opened, held))
                    .map_err(redact)
                }
            },
        )
        .await;
        exchange.attempts.extend(attempted.attempts);
        match attempted.result {
            Err(fault) => (Err(fault), None),
            Ok((Opened::RateLimited(asked), _)) => (Err(rate_limited()), Some(asked)),
            Ok((Opened::Json(body), _)) => (Ok(Received::Body(body)), None),
            Ok((Opened::Events(stream), held)) => (Ok(Received::Events(stream, held)), None),
        }
    } else {
        let attempted = with_retries(
            request.retry,
            request.limits.timeout,
            request.deadline,
            |budget| {
                let body = request.body.clone();
                async move {
                    let admitted = admit().await?;
                    let _held = queue(admitted).await;
                    request
                        .transport
                        .post_json_raw(
                            request.url,
                            request.headers,
                            body,
                            request.limits.max_response_size,
                            budget,
                        )
                        .await
                        .and_then(answer_or_fault)
                        .map_err(redact)
                }
            },
        )
        .await;
        exchange.attempts.extend(attempted.attempts);
        match attempted.result {
            Err(fault) => (Err(fault), None),
            Ok(response) if response.status == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                let asked = retry_after(&response.headers, SystemTime::now());
                (Err(rate_limited()), Some(asked))
            }
            Ok(response) => (Ok(Received::Body(response.body)), None),
        }
    };
    let refused = refused.into_inner().ok().flatten();
    if refused.is_some() {
        // Not sent, and it never queued: no attempt of the exchange.
        exchange.attempts.pop();
    }
    // The round's attempts are the last ones recorded.
    let queued = queued.into_inner().unwrap_or_default();
    exchange.queued += queued.iter().sum::<Duration>();
    let first = exchange.attempts.len().saturating_sub(queued.len());
    for (attempt, wait) in exchange.attempts.iter_mut().skip(first).zip(queued) {
        attempt.latency = attempt.latency.saturating_sub(wait);
    }
    if asked.is_some()
        && let Some(last) = exchange.attempts.last_mut()
    {
        last.fault = Some(rate_limited());
    }
    match refused {
        Some(reason) => Round::Refused(reason),
        None => Round::Ended(outcome, asked),
    }
}
