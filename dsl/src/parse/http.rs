//! Decoding the settings of `protocol="http"` agents ([`HttpSettings`]): the `request`
//! template, `method`, and the `reply`, `tool-calls`, `session` and `stream` nodes. Each of
//! them on another protocol is an error pointing at it; JSON paths are checked here, so a bad
//! one is a `trellis check` diagnostic rather than a fault on every turn.

use super::*;

/// Child nodes of an `agent` block only `http` agents take (handled here, not as settings).
const HTTP_NODES: &[&str] = &["reply", "tool-calls", "session"];
/// `agent` settings (properties or one-argument nodes) only `http` agents take.
const HTTP_SETTINGS: &[&str] = &["method"];
const REQUEST_USAGE: &str = "request #\"{\"input\": {{ messages | tojson }}}\"#";

impl Decoder<'_> {
    /// The `http` settings of an agent, `None` on other protocols (where each `http` setting
    /// written is reported) or when a required one is missing or invalid.
    pub(super) fn http_settings(
        &mut self,
        v: &View,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
    ) -> Option<HttpSettings> {
        // The protocol whose agents describe their request and answer (the one that declares
        // `reply`): `http`.
        let is_http = protocol.declares("reply");
        let nodes: Vec<View> = v
            .children
            .map(|c| c.nodes())
            .unwrap_or_default()
            .iter()
            .map(|n| View::of(n, self.text()))
            .filter(|cv| HTTP_NODES.contains(&cv.name) || (is_http && cv.name == "stream"))
            .collect();
        if !is_http {
            let written = nodes.iter().map(|cv| (cv.name, cv.name_span)).chain(
                HTTP_SETTINGS
                    .iter()
                    .filter_map(|n| Some((*n, s.get(n)?.name_span))),
            );
            for (name, at) in written.collect::<Vec<_>>() {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!(
                            "`{name}` is an `http` setting; agent `{}` is `{}`",
                            id.value,
                            protocol.as_str()
                        ),
                        at,
                        "not a setting of this protocol",
                    )
                    .with_help(format!(
                        "remove `{name}`: `{}` agents have a fixed request and answer shape",
                        protocol.as_str()
                    ));
                self.report(d);
            }
            return None;
        }
        let method = s
            .value("method")
            .and_then(|e| self.choice(e, "method", &HttpMethod::ALL))
            .unwrap_or_default();
        let request = match s.value("request") {
            Some(e) => self.template(e),
            None => {
                let d = self
                    .diag(
                        Kind::Missing,
                        format!("agent `{}` needs a `request`", id.value),
                        id.span.span,
                        "no request",
                    )
                    .with_help(format!(
                        "`http` agents describe their request body as a template: write \
                         `{REQUEST_USAGE}`"
                    ));
                self.report(d);
                None
            }
        };
        if let (Some(set), Some(e)) = (s.get("stream"), s.value("stream")) {
            let d = self
                .diag(
                    Kind::WrongType,
                    "`stream` of an `http` agent is a node naming where each event's text is",
                    set.name_span,
                    "not a switch here",
                )
                .with_label(value_span(e), "this value")
                .with_help("write `stream json-path=\"$.content\"` inside the agent's block");
            self.report(d);
        }
        let mut reply = None;
        let mut tool_calls = None;
        let mut session = None;
        let mut stream = None;
        let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
        for cv in &nodes {
            if let Some(first) = seen.get(cv.name) {
                let d = self
                    .diag(
                        Kind::DuplicateSetting,
                        format!("`{}` is set twice", cv.name),
                        cv.name_span,
                        "set again here",
                    )
                    .with_label(*first, "first set here")
                    .with_help("remove one of them");
                self.report(d);
                continue;
            }
            seen.insert(cv.name, cv.name_span);
            match cv.name {
                "reply" => reply = self.http_path_node(cv, &[], "reply json-path=\"$.output\""),
                "tool-calls" => {
                    tool_calls = self.http_path_node(
                        cv,
                        &[],
                        "tool-calls json-path=\"$.output.tool_calls\"",
                    );
                }
                "session" => {
                    let usage = "session json-path=\"$.session_id\" header=\"X-Session-Id\"";
                    let header = cv.prop("header").and_then(|e| self.header_name(e));
                    session = self
                        .http_path_node(cv, &["header"], usage)
                        .map(|json_path| SessionCapture { json_path, header });
                }
                _ => {
                    let usage = "stream json-path=\"$.content\"";
                    let event = cv.prop("event").and_then(|e| self.string(e));
                    let end_event = cv
                        .prop("end-event")
                        .and_then(|e| self.string(e))
                        .unwrap_or_else(|| "end".to_owned());
                    stream =
                        self.http_path_node(cv, &["event", "end-event"], usage)
                            .map(|json_path| StreamSettings {
                                json_path,
                                event,
                                end_event,
                            });
                    if method != HttpMethod::Post
                        && let Some(e) = s.value("method")
                    {
                        let d = self
                            .diag(
                                Kind::InvalidValue,
                                format!(
                                    "agent `{}` streams: its requests are POSTs, not {}",
                                    id.value,
                                    method.as_str()
                                ),
                                value_span(e),
                                "not with `stream`",
                            )
                            .with_label(cv.name_span, "streamed here")
                            .with_help("remove `method`, or `stream` to get one JSON answer");
                        self.report(d);
                    }
                }
            }
        }
        if reply.is_none() && stream.is_none() && !seen.contains_key("reply") {
            let d = self
                .diag(
                    Kind::Missing,
                    format!("agent `{}` needs a `reply`", id.value),
                    id.span.span,
                    "no reply",
                )
                .with_help(
                    "say where the answer's text is: `reply json-path=\"$.output.content\"` (or \
                     `stream json-path=…` for server-sent events)",
                );
            self.report(d);
            return None;
        }
        Some(HttpSettings {
            method,
            request: request?,
            reply,
            tool_calls,
            session,
            stream,
        })
    }

    /// A node of the form `NAME json-path="…" [other properties]`: the parsed path.
    fn http_path_node(
        &mut self,
        cv: &View,
        others: &[&str],
        usage: &str,
    ) -> Option<JsonPathSetting> {
        let mut allowed = vec!["json-path"];
        allowed.extend_from_slice(others);
        self.check_props(cv, &allowed, &[]);
        self.check_args(cv, 0, usage);
        self.check_no_children(cv);
        let Some(e) = cv.prop("json-path") else {
            self.missing(cv, "a `json-path`", usage);
            return None;
        };
        let (path, source) = self.json_path_value(
            e,
            "\"$.output.content\" or \"$.choices[0].message.content\"",
        )?;
        Some(JsonPathSetting {
            path,
            source,
            span: self.span(value_span(e)),
        })
    }

    /// `header="NAME"` of `session`: an RFC 9110 token, or a diagnostic.
    fn header_name(&mut self, e: &KdlEntry) -> Option<String> {
        let name = self.string(e)?;
        let token = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
        if token {
            return Some(name);
        }
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid header name `{name}`"),
                value_span(e),
                "not a header name",
            )
            .with_help("header names are letters, digits and `-`, e.g. header=\"X-Session-Id\"");
        self.report(d);
        None
    }
}
