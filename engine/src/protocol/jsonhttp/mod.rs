//! `protocol="http"`: any JSON-over-HTTP agent whose request and answer the suite describes
//! (LangServe `/invoke` and `/stream`, custom REST bots). docs/language.md has the forms.
//!
//! Each turn renders the agent's `request` template with `messages` (the OpenAI-style
//! conversation so far, including the new user message), the same as `langchain_messages`
//! for LangServe, `user`, `session` and the trajectory's template variables (handed over by
//! the executor through [`super::Session::set_template_scope`]), checks that it is JSON, and
//! sends it with the agent's `method` and headers through the shared transports:
//! [`crate::transport::http`] for one JSON answer (retries, bounded body, fault categories),
//! [`crate::transport::sse`] for `stream` (time to first event, idle timeout, size bounds,
//! `incomplete`). [`codec`] is the pure half that reads the answer; `session.rs` the client
//! and the conversation.
//!
//! Forking: without `session` the conversation is the history the template resends, so a
//! fork copies it; with `session` (a value the agent hands out in its first answer and gets
//! back on later turns) it lives on the agent's side, so `fork` returns `None` and the
//! executor replays the prefix in a fresh session.

pub mod codec;
mod session;

pub use session::{JsonHttpClient, JsonHttpError};
