//! The Trellis engine: from a validated suite model to run records.
//!
//! Data flows one way: [`plan`] expands the suite model into units (scenario × agent ×
//! repetition) and their execution trees; [`execute`] runs them concurrently against the
//! agents over their [`protocol`]s, checks [`criteria`], and emits [`event::Event`]s;
//! [`journal`] appends the resulting [`record`]s to disk as they finish. [`llm`] is the
//! engine's own client for language models (simulated users, judges).

pub mod criteria;
pub mod event;
pub mod execute;
pub mod fingerprint;
pub mod journal;
pub mod llm;
pub mod otel;
pub mod plan;
pub mod protocol;
pub mod record;
pub mod render;
pub mod sandbox;
pub mod secrets;
pub mod shard;
pub mod transport;
