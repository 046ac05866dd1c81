//! How many requests a model server answers at once, discovered per server for a run.
//!
//! A llama.cpp server has a fixed number of slots (often one on a CPU machine) and queues
//! every other request itself. A queued request's time counts against its timeout on our
//! side, so a run that sends the agent under test, the simulated user and the judge to one
//! small server at once sees timeouts that are nobody's fault. The server says how many slots
//! it has (`GET /props` → `total_slots`); queueing here, one [`ServerSlots`] per server
//! origin shared by every provider and model agent that talks to it, keeps each request's
//! timeout for its answer.
//!
//! Only plain `http://` servers are asked (local and LAN servers; hosted APIs are `https://`
//! and rate limit instead), before the first request, with a short timeout; a transient
//! failure (a server still loading its model answers 503) is asked again 2 s later. A server
//! that does not answer `/props` (vLLM, Ollama, anything else) gets no limit. Slots are keyed
//! by the URL's origin as written: `localhost:8080` and `127.0.0.1:8080` are two servers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use std::time::Instant;

use reqwest::Url;
use reqwest::header::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::transport::http::HttpTransport;

/// How long the slot probe waits for `/props`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// `/props` bodies are small; this bounds a server that answers something else.
const PROBE_MAX_BODY: u64 = 1024 * 1024;

/// The slots of one server, found on first use.
#[derive(Debug)]
pub struct ServerSlots {
    props: Url,
    headers: HeaderMap,
    transport: HttpTransport,
    state: tokio::sync::Mutex<Probe>,
}

/// What is known of a server's slots.
#[derive(Debug)]
enum Probe {
    /// Not asked yet, or the last answer was transient (a server still loading its model
    /// answers 503; one starting up refuses connections): asked again after
    /// [`PROBE_RETRY_AFTER`].
    Unknown(Option<Instant>),
    /// The server's slot count, or `None` when it says it has none (no `/props`, no
    /// `total_slots`): no limit.
    Known(Option<Arc<Semaphore>>),
}

/// How long after a transient probe failure the server is asked again.
const PROBE_RETRY_AFTER: Duration = Duration::from_secs(2);
/// A slot count above this is not believed (it would only make a huge semaphore).
const MAX_SLOTS: u64 = 1024;

impl ServerSlots {
    /// Waits for a free slot when the server reports a slot count; `None` (go ahead) when it
    /// does not. The slot is held while the returned permit lives.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        let slots = {
            let mut state = self.state.lock().await;
            match &*state {
                Probe::Known(slots) => slots.clone(),
                Probe::Unknown(Some(at)) if at.elapsed() < PROBE_RETRY_AFTER => None,
                Probe::Unknown(_) => {
                    let (found, settled) = self.probe().await;
                    let slots = found.map(|n| Arc::new(Semaphore::new(n)));
                    *state = if settled {
                        Probe::Known(slots.clone())
                    } else {
                        Probe::Unknown(Some(Instant::now()))
                    };
                    slots
                }
            }
        };
        match slots {
            Some(slots) => slots.acquire_owned().await.ok(),
            None => None,
        }
    }

    /// The slot count, and whether the answer is final (`false` after a transient failure:
    /// 5xx, timeout, no connection).
    async fn probe(&self) -> (Option<usize>, bool) {
        let response = match self
            .transport
            .get(&self.props, &self.headers, PROBE_MAX_BODY, PROBE_TIMEOUT)
            .await
        {
            Ok(response) => response,
            Err(fault) => return (None, !fault.category.is_retryable()),
        };
        let slots = serde_json::from_slice::<serde_json::Value>(&response.body)
            .ok()
            .and_then(|v| v.get("total_slots")?.as_u64())
            .filter(|n| (1..=MAX_SLOTS).contains(n))
            .and_then(|n| usize::try_from(n).ok());
        (slots, true)
    }
}

/// Every server of a run, by origin (`http://host:port`).
#[derive(Debug, Default)]
pub struct ServerRegistry {
    servers: Mutex<HashMap<String, Arc<ServerSlots>>>,
}

impl ServerRegistry {
    /// The slots of the server behind `url`; `None` for `https://` URLs. `headers` (the
    /// key of a server that needs one) are used for the probe by the first to ask.
    pub fn for_url(
        &self,
        url: &Url,
        headers: &HeaderMap,
        transport: &HttpTransport,
    ) -> Option<Arc<ServerSlots>> {
        if url.scheme() != "http" {
            return None;
        }
        let origin = url.origin().ascii_serialization();
        let props = url.join("/props").ok()?;
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        let slots = servers.entry(origin).or_insert_with(|| {
            Arc::new(ServerSlots {
                props,
                headers: headers.clone(),
                transport: transport.clone(),
                state: tokio::sync::Mutex::new(Probe::Unknown(None)),
            })
        });
        Some(slots.clone())
    }
}
