//! The nodes of properties an agent's protocol declares (`http`'s `reply`, `tool-calls`,
//! `session` and `stream`): each one on another protocol is an error pointing at it; on its
//! own protocol it is checked from its spec ([`Decoder::node_setting`]: JSON paths parse
//! here, so a bad one is a `trellis check` diagnostic rather than a fault on every turn) and
//! reaches the module (`engine/src/protocol/jsonhttp/settings.rs`) in `Agent::settings` as an
//! object of its properties (`null` when it was reported). The rules between them (a
//! `request` and a `reply` or `stream` are required, streams are POSTs) are the module's
//! `ProtocolSpec::check`.

use super::*;

/// Child nodes of an `agent` block only `http` agents take (handled here, not as settings).
const HTTP_NODES: &[&str] = &["reply", "tool-calls", "session"];
/// `agent` settings (properties or one-argument nodes) only `http` agents take.
const HTTP_SETTINGS: &[&str] = &["method"];
/// `method` values (the methods that carry a body).
const METHODS: [(&str, &str); 3] = [("POST", "POST"), ("PUT", "PUT"), ("PATCH", "PATCH")];

impl Decoder<'_> {
    /// Checks the `http` settings of an agent (on other protocols, each one written is
    /// reported) and adds its `reply`, `tool-calls`, `session` and `stream` nodes to
    /// `settings`.
    pub(super) fn http_settings(
        &mut self,
        v: &View,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
        settings: &mut ProtocolSettings,
    ) {
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
            return;
        }
        if let Some(e) = s.value("method") {
            let _ = self.choice(e, "method", &METHODS);
        }
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
            let Some(spec) = super::agent::setting_spec(protocol, cv.name) else {
                continue;
            };
            let value = self.node_setting(cv, spec);
            // A node that is written but wrong is still there for the protocol's check (it
            // was reported here): `null`.
            let value = value.unwrap_or(Value::Null);
            let name = match cv.name {
                "reply" => "reply",
                "tool-calls" => "tool-calls",
                "session" => "session",
                _ => "stream",
            };
            settings.0.push(ProtocolSetting {
                name,
                value: Spanned {
                    value,
                    span: self.span(cv.name_span),
                },
                items: Vec::new(),
                checked: true,
            });
        }
    }

    /// `header="NAME"` of `session`: an RFC 9110 token, or a diagnostic.
    pub(super) fn header_name(&mut self, e: &KdlEntry) -> Option<String> {
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
