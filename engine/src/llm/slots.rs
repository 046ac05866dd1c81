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
//! and rate limit instead), once, before the first request, with a short timeout. A server
//! that does not answer `/props` (vLLM, Ollama, anything else) gets no limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::Url;
use reqwest::header::HeaderMap;
use tokio::sync::{OnceCell, Semaphore, SemaphorePermit};

use crate::protocol::http::HttpTransport;

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
    slots: OnceCell<Option<Semaphore>>,
}

impl ServerSlots {
    /// Waits for a free slot when the server reports a slot count; `None` (go ahead) when it
    /// does not. The slot is held while the returned permit lives.
    pub async fn acquire(&self) -> Option<SemaphorePermit<'_>> {
        let slots = self
            .slots
            .get_or_init(|| async { self.probe().await.map(Semaphore::new) })
            .await;
        match slots {
            Some(slots) => slots.acquire().await.ok(),
            None => None,
        }
    }

    async fn probe(&self) -> Option<usize> {
        let response = self
            .transport
            .get(&self.props, &self.headers, PROBE_MAX_BODY, PROBE_TIMEOUT)
            .await
            .ok()?;
        let value: serde_json::Value = serde_json::from_slice(&response.body).ok()?;
        let slots = value.get("total_slots")?.as_u64()?;
        usize::try_from(slots).ok().filter(|n| *n > 0)
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
                slots: OnceCell::new(),
            })
        });
        Some(slots.clone())
    }
}
