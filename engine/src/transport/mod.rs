//! Transports, written once for every protocol and for the engine's own LLM client: what
//! moving bytes to and from an agent or a model server takes, whatever the payload means.
//!
//! [`http`] is one pooled client per run with bounded bodies, every failure mapped to a
//! fault category, and the retry rule; [`sse`] reads server-sent events over that pool (time
//! to first event, idle timeout, size bounds, a stream that ends early); [`line`] speaks
//! newline-delimited JSON with a process or a socket; [`quote`] puts what a peer sent into a
//! fault message, bounded and readable.
//!
//! This layer sits just above the records (`docs/architecture.md`, "Layers"): it knows
//! faults and attempts, never a protocol, a plan or an LLM, so both `protocol` and `llm`
//! build on it.

use std::time::Duration;

use crate::record::Fault;

pub mod http;
pub mod line;
pub mod quote;
pub mod sse;

/// One attempt of an exchange.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub latency: Duration,
    /// Why this attempt failed; `None` for the attempt that succeeded.
    pub fault: Option<Fault>,
}
