//! The settings of a `protocol="http"` agent: any JSON-over-HTTP agent whose request and
//! answer shapes the suite describes (a `request` template of the body, JSON paths into the
//! answer). Decoded in `parse/http.rs`; run by `engine/src/protocol/jsonhttp/`.

use serde_json_path::JsonPath;

use super::{Span, Template};

/// `reply json-path=…`, `tool-calls json-path=…` and the paths of `session` and `stream`:
/// a JSON path checked when the suite is loaded, with the text written (for messages).
#[derive(Clone, Debug)]
pub struct JsonPathSetting {
    pub path: JsonPath,
    pub source: String,
    pub span: Span,
}

/// The HTTP method of a `protocol="http"` agent's requests (`method`). Only methods that
/// carry a body: the request is always the rendered `request` template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HttpMethod {
    #[default]
    Post,
    Put,
    Patch,
}

impl HttpMethod {
    pub const ALL: [(&'static str, HttpMethod); 3] = [
        ("POST", HttpMethod::Post),
        ("PUT", HttpMethod::Put),
        ("PATCH", HttpMethod::Patch),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
        }
    }
}

/// `session json-path=… header=…`: a value the agent hands out in its first answer and
/// expects back on later turns (as `{{ session }}` in the `request` template, or in a
/// header). With it the conversation lives on the agent's side: forks replay the prefix.
#[derive(Clone, Debug)]
pub struct SessionCapture {
    pub json_path: JsonPathSetting,
    /// Sent with this header name once the value is known.
    pub header: Option<String>,
}

/// `stream json-path=… event=… end-event=…`: the answer comes as server-sent events, each
/// a JSON object holding a text delta at `json_path`.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    pub json_path: JsonPathSetting,
    /// Only events of this name carry deltas; by default unnamed events and those named
    /// `data` or `message` do.
    pub event: Option<String>,
    /// The event that says the answer is complete (default `end`, LangServe's); a
    /// `data: [DONE]` line ends it too.
    pub end_event: String,
}

/// Everything a `protocol="http"` agent is configured with beyond the shared agent settings.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    pub method: HttpMethod,
    /// The request body; rendered per turn with `messages`, `langchain_messages`, `user`,
    /// `session`, `vars`,
    /// `user_context`, `scenario`, `persona` and `env`, and must be JSON.
    pub request: Template,
    /// Where the reply text is in the answer (required unless `stream`).
    pub reply: Option<JsonPathSetting>,
    pub tool_calls: Option<JsonPathSetting>,
    pub session: Option<SessionCapture>,
    pub stream: Option<StreamSettings>,
}

impl HttpSettings {
    /// The conversation is held by the agent (a `session` value is sent back), so it cannot
    /// be copied at a fork.
    pub fn session_bound(&self) -> bool {
        self.session.is_some()
    }
}
