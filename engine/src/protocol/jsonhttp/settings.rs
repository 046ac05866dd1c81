//! The settings of a `protocol="http"` agent, decoded from its settings as written
//! (`dsl::Agent::settings`): the loader checked them against [`super::SPEC`] (JSON paths
//! parse, the `request` template and its scope, `method` a word of the spec) and wrote the
//! `reply`, `tool-calls`, `session` and `stream` nodes as objects of their properties.

use serde::Deserialize;
use serde_json_path::JsonPath;
use trellis_dsl::lang::{AgentSettings, ProblemKind, SettingProblem};
use trellis_dsl::{Agent, Template};

/// `reply json-path=…`, `tool-calls json-path=…` and the paths of `session` and `stream`,
/// with the text written (for messages).
#[derive(Clone, Debug)]
pub struct JsonPathSetting {
    pub path: JsonPath,
    pub source: String,
}

impl JsonPathSetting {
    fn parse(source: &str) -> Option<Self> {
        Some(JsonPathSetting {
            path: JsonPath::parse(source).ok()?,
            source: source.to_owned(),
        })
    }
}

/// The HTTP method of the agent's requests (`method`). Only methods that carry a body: the
/// request is always the rendered `request` template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    #[default]
    Post,
    Put,
    Patch,
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
    /// `session`, `vars`, `user_context`, `scenario`, `persona` and `env`, and must be JSON.
    pub request: Template,
    /// Where the reply text is in the answer (required unless `stream`).
    pub reply: Option<JsonPathSetting>,
    pub tool_calls: Option<JsonPathSetting>,
    pub session: Option<SessionCapture>,
    pub stream: Option<StreamSettings>,
}

/// The settings as the loader wrote them.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Written {
    #[serde(default)]
    method: HttpMethod,
    reply: Option<PathNode>,
    tool_calls: Option<PathNode>,
    session: Option<PathNode>,
    stream: Option<PathNode>,
}

/// A node of the form `NAME json-path="…" [other properties]`.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct PathNode {
    json_path: String,
    header: Option<String>,
    event: Option<String>,
    end_event: Option<String>,
}

impl HttpSettings {
    /// The settings of `agent`, or `None` when its settings are not an `http` agent's as
    /// the loader checks them (no `request`, a path that does not parse).
    pub fn of(agent: &Agent) -> Option<HttpSettings> {
        let written: Written = agent.settings.decode().ok()?;
        let request = agent.settings.spanned("request")?;
        let path = |node: &PathNode| JsonPathSetting::parse(&node.json_path);
        let optional = |node: Option<&PathNode>| match node {
            Some(node) => path(node).map(Some),
            None => Some(None),
        };
        Some(HttpSettings {
            method: written.method,
            request: Template {
                source: request.value.as_str()?.to_owned(),
                span: request.span,
            },
            reply: optional(written.reply.as_ref())?,
            tool_calls: optional(written.tool_calls.as_ref())?,
            session: match &written.session {
                Some(node) => Some(SessionCapture {
                    json_path: path(node)?,
                    header: node.header.clone(),
                }),
                None => None,
            },
            stream: match &written.stream {
                Some(node) => Some(StreamSettings {
                    json_path: path(node)?,
                    event: node.event.clone(),
                    end_event: node.end_event.clone().unwrap_or_else(|| "end".to_owned()),
                }),
                None => None,
            },
        })
    }

    /// The conversation is held by the agent (a `session` value is sent back), so it cannot
    /// be copied at a fork.
    pub fn session_bound(&self) -> bool {
        self.session.is_some()
    }
}

/// The rules between an `http` agent's settings ([`trellis_dsl::lang::ProtocolSpec::check`]):
/// it has a `request` and a `reply` or a `stream`, and a streamed answer is asked for with
/// POST.
pub fn check(agent: &AgentSettings<'_>) -> Vec<SettingProblem> {
    let written = &agent.settings;
    let mut problems = Vec::new();
    if written.get("request").is_none() {
        problems.push(SettingProblem {
            kind: ProblemKind::Missing,
            message: format!("agent `{}` needs a `request`", agent.id.value),
            span: agent.id.span,
            label: "no request".into(),
            other: None,
            help: "`http` agents describe their request body as a template: write \
                   `request #\"{\"input\": {{ messages | tojson }}}\"#`"
                .into(),
        });
    }
    let stream = written.setting("stream");
    if written.setting("reply").is_none() && stream.is_none() {
        problems.push(SettingProblem {
            kind: ProblemKind::Missing,
            message: format!("agent `{}` needs a `reply`", agent.id.value),
            span: agent.id.span,
            label: "no reply".into(),
            other: None,
            help: "say where the answer's text is: `reply json-path=\"$.output.content\"` (or \
                   `stream json-path=…` for server-sent events)"
                .into(),
        });
    }
    if let (Some(stream), Some(method)) = (stream, written.spanned("method"))
        && let Some(word) = method.value.as_str()
        && word != "POST"
    {
        problems.push(SettingProblem {
            kind: ProblemKind::InvalidValue,
            message: format!(
                "agent `{}` streams: its requests are POSTs, not {word}",
                agent.id.value
            ),
            span: method.span,
            label: "not with `stream`".into(),
            other: Some((stream.value.span, "streamed here".into())),
            help: "remove `method`, or `stream` to get one JSON answer".into(),
        });
    }
    problems
}
