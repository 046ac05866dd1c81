//! Decoding the `agent` node: the settings every agent takes, its `protocol`, its endpoint
//! and the settings of the protocol it speaks, each checked from the protocol's spec
//! ([`crate::lang::ProtocolSpec::settings`]); the rules between them are the protocol
//! module's own check ([`crate::lang::ProtocolSpec::check`]).

use super::*;
use crate::lang::{
    AgentSettings, Children, EndpointKind, Form, NodeSpec, ProblemKind, ProtocolSpec, Repeat,
    ValueType,
};

/// The settings every agent takes, whatever its protocol (the language table's
/// [`crate::lang::decls::AGENT`]), as the settings reader takes them.
fn common_settings() -> Vec<(&'static str, Arity)> {
    crate::lang::decls::AGENT
        .child_specs()
        .iter()
        .map(|spec| (spec.name, arity(spec)))
        .collect()
}

/// How many values a setting takes: one, one or more, or a `NAME VALUE` pair (a node such
/// as `header`).
fn arity(spec: &NodeSpec) -> Arity {
    match (spec.form, spec.args.first().map(|a| a.repeat)) {
        (Form::Node, _) => Arity::Pair,
        (_, Some(Repeat::Many | Repeat::Any)) => Arity::Many,
        _ => Arity::One,
    }
}
const ENDPOINTS: &[&str] = &["url", "base-url", "builtin", "command", "socket"];

impl Decoder<'_> {
    pub(super) fn agent(&mut self, v: &View) -> Option<Agent> {
        let usage = "agent \"ID\" protocol=\"connexity\" url=\"https://…\"";
        let (id, has_id) = self.id_or_stand_in(v, "an id", usage);
        let agent = self.agent_body(v, &id, usage);
        if !has_id {
            return None;
        }
        if agent.is_none() {
            self.info.declare(RefKind::Agent, &id.value);
        }
        agent
    }

    fn agent_body(&mut self, v: &View, id: &Spanned<String>, usage: &str) -> Option<Agent> {
        // The agent's own protocol's settings when it names one it has: a child form
        // another protocol takes would be refused here.
        let own: Vec<&'static ProtocolSpec> = match v
            .prop("protocol")
            .and_then(|e| e.value().as_string())
            .and_then(|name| self.info.protocols.iter().find(|p| p.name == name))
        {
            Some(p) => vec![*p],
            None => self.info.protocols.clone(),
        };
        let settings = agent_settings(&own);
        self.check_args_several(v, 1, usage, &|property| {
            settings
                .iter()
                .any(|(name, arity)| *name == property && matches!(arity, Arity::Many))
        });
        // `http` agents' answer nodes take properties, so they are decoded in `http.rs`.
        let named = v
            .prop("protocol")
            .and_then(|e| e.value().as_string())
            .and_then(|name| self.info.protocols.iter().find(|p| p.name == name).copied());
        let other_children = node_settings(&self.info.protocols, named);
        let spec = agent_settings(&self.info.protocols);
        let s = self.settings(v, &spec, "`agent`", &other_children);
        let protocol = match s.value("protocol") {
            None => {
                let d = self
                    .diag(
                        Kind::Missing,
                        if id.value.is_empty() {
                            // Its missing id is said already; "agent ``" names nothing.
                            "the agent needs a `protocol` too".to_owned()
                        } else {
                            format!("agent `{}` needs a `protocol`", id.value)
                        },
                        id.span.span,
                        "no protocol",
                    )
                    .with_help(format!(
                        "add protocol=\"…\": one of {}",
                        self.info
                            .protocols
                            .iter()
                            .map(|p| p.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                self.report(d);
                None
            }
            Some(e) => {
                let choices: Vec<(&str, Protocol)> = self
                    .info
                    .protocols
                    .iter()
                    .map(|p| (p.name, Protocol::new(p)))
                    .collect();
                self.choice(e, "protocol", &choices)
            }
        };
        let headers = self.headers(
            &s,
            "header \"NAME\" \"VALUE\", e.g. header \"Authorization\" \"Bearer {{ env.TOKEN }}\"",
            Self::template,
            |t| &t.source,
        );
        let timeout = s.value("timeout").and_then(|e| self.timeout(e));
        let retries = s.value("retries").and_then(|e| self.u32(e, 0)).unwrap_or(0);
        let concurrency = s
            .value("concurrency")
            .and_then(|e| self.u32(e, 1))
            .and_then(|c| usize::try_from(c).ok());
        let max_response_size = s
            .value("max-response-size")
            .and_then(|e| self.size(e))
            .unwrap_or(DEFAULT_MAX_RESPONSE_SIZE);
        let model = self.s_string(&s, "model");
        let provider = self.s_spanned(&s, "provider");
        let retry_after_send = s
            .value("retry-after-send")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let spans = s
            .value("spans")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let per_shard = s
            .value("per-shard")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let history_entry = s.value("history");
        let mut secret_env = Vec::new();
        for set in s.all("secret-env") {
            for &e in &set.values {
                if let Some(name) = self.string(e)
                    && let Some(name) = self.name_of(ValueType::EnvName, name, value_span(e))
                {
                    secret_env.push(Spanned::new(name, self.span(value_span(e))));
                }
            }
        }

        let protocol = protocol?;
        if let (Some(e), Some(set)) = (history_entry, s.get("history"))
            && !protocol.declares("history")
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    self.not_this_protocol("history", id, protocol),
                    set.name_span,
                    "not a setting of this protocol",
                )
                .with_label(value_span(e), "this value")
                .with_help(if protocol.capabilities().session_bound {
                    format!(
                        "`{}` agents keep the conversation on their server; remove `history`",
                        protocol.as_str()
                    )
                } else {
                    format!(
                        "only {} agents choose what each request carries; remove `history`",
                        owners(&self.info.protocols, "history")
                    )
                });
            self.report(d);
        }
        if let (Some(e), Some(set)) = (s.value("stream"), s.get("stream"))
            && !protocol.declares("stream")
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!(
                        "`stream` is a setting of streaming protocols; agent `{}` is `{}`, which \
                         answers with one JSON body",
                        id.value,
                        protocol.as_str()
                    ),
                    set.name_span,
                    "not a setting of this protocol",
                )
                .with_label(value_span(e), "this value")
                .with_help(
                    "remove `stream`; it chooses between SSE and one JSON body for `agentscope`",
                );
            self.report(d);
        }
        if protocol.is_model() && s.get("provider").is_some() {
            for name in ["retries", "retry-after-send"] {
                if let Some(set) = s.get(name) {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!(
                                "agent `{}` reaches its model through a provider, whose `retries` \
                                 apply",
                                id.value
                            ),
                            set.name_span,
                            "the provider decides this",
                        )
                        .with_help(
                            "remove it here and set `retries` on the provider (its calls are \
                             retried after send: asking a model again has no side effect)",
                        );
                    self.report(d);
                }
            }
        }
        self.settings_of_other_protocols(v, &s, id, protocol);
        let mut settings = self.protocol_settings(&s, protocol);
        self.protocol_nodes(v, &s, id, protocol, &mut settings);
        // A misspelt endpoint (`bultin=`) is reported as an unknown property, with the
        // spelling meant: "has no endpoint" as well would be the same mistake twice, first.
        let endpoint_misspelt = v.props.iter().filter_map(|e| e.name()).any(|n| {
            let name = n.value();
            s.get(name).is_none()
                && !ENDPOINTS.contains(&name)
                && did_you_mean(name, ENDPOINTS.iter().copied()).is_some()
        });
        let endpoint = self.endpoint(&s, id, protocol, endpoint_misspelt);
        self.protocol_check(
            protocol,
            &AgentSettings {
                id,
                endpoint_kind: EndpointKind::ALL
                    .into_iter()
                    .find(|k| s.get(k.property()).is_some()),
                endpoint: endpoint.as_ref(),
                settings: &settings,
            },
        );
        let endpoint = endpoint?;
        // A model agent reached through a `provider` may take the provider's model.
        if protocol.is_model() && s.get("model").is_none() && s.get("provider").is_none() {
            let d = self
                .diag(
                    Kind::Missing,
                    format!("agent `{}` needs a `model`", id.value),
                    id.span.span,
                    "no model",
                )
                .with_help(format!(
                    "`{}` agents name the model to call: model=\"gpt-4o-mini\"",
                    protocol.as_str()
                ));
            self.report(d);
        }
        let agent = Agent {
            id: id.clone(),
            protocol,
            endpoint,
            headers,
            timeout,
            retries,
            retry_after_send,
            concurrency,
            per_shard,
            spans,
            max_response_size,
            model,
            provider,
            secret_env,
            settings,
            span: self.span(v.span),
        };
        Some(agent)
    }

    /// The problems the agent's protocol module finds between its settings
    /// ([`crate::lang::ProtocolSpec::check`]), reported where they are written (in this file:
    /// the agent was decoded from it).
    fn protocol_check(&mut self, protocol: Protocol, agent: &AgentSettings<'_>) {
        let Some(check) = protocol.spec().check else {
            return;
        };
        for problem in check(agent) {
            let kind = match problem.kind {
                ProblemKind::Missing => Kind::Missing,
                ProblemKind::InvalidValue => Kind::InvalidValue,
            };
            let mut d = self.diag(kind, problem.message, problem.span.span, problem.label);
            if let Some((span, label)) = problem.other {
                d = d.with_label(span.span, label);
            }
            self.report(d.with_help(problem.help));
        }
    }

    /// A `socket=` address: `tcp://HOST:PORT` or `tcp:HOST:PORT`, `unix:///PATH` or
    /// `unix:/PATH` (the spec's and the harness's spellings).
    fn socket_address(&mut self, e: &KdlEntry) -> Option<SocketAddress> {
        let text = self.string(e)?;
        let parsed = if let Some(rest) = text.strip_prefix("tcp:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            match rest.rsplit_once(':') {
                None => Err("a TCP address needs a port: tcp://HOST:PORT"),
                Some((host, port)) => {
                    let host = host
                        .strip_prefix('[')
                        .and_then(|h| h.strip_suffix(']'))
                        .unwrap_or(host);
                    match port.parse::<u16>() {
                        _ if host.is_empty() => Err("the TCP address has no host"),
                        _ if host.contains(['/', ' ']) => Err("the host is not a host name"),
                        Ok(0) | Err(_) => Err("the port must be a number from 1 to 65535"),
                        Ok(port) => Ok(SocketAddress::Tcp {
                            host: host.to_string(),
                            port,
                        }),
                    }
                }
            }
        } else if let Some(rest) = text.strip_prefix("unix:") {
            // `unix:///p` and `unix:/p` both mean `/p`; `unix://p` would be a host, not a path.
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                Err("the Unix socket address has no path")
            } else if rest.starts_with("//") && !path.starts_with('/') {
                Err("`unix://` is followed by the path: write unix:///PATH")
            } else {
                Ok(SocketAddress::Unix(PathBuf::from(path)))
            }
        } else {
            Err("expected tcp://HOST:PORT, tcp:HOST:PORT, unix:///PATH or unix:/PATH")
        };
        match parsed {
            Ok(address) => Some(address),
            Err(why) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid socket address `{text}`"),
                        value_span(e),
                        why,
                    )
                    .with_help(
                        "write socket=\"tcp://127.0.0.1:9000\" or socket=\"unix:///tmp/agent.sock\"",
                    );
                self.report(d);
                None
            }
        }
    }

    fn endpoint(
        &mut self,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
        misspelt: bool,
    ) -> Option<Endpoint> {
        let allowed: Vec<&str> = protocol
            .spec()
            .endpoints
            .iter()
            .map(|e| e.property())
            .collect();
        let allowed_list = allowed
            .iter()
            .map(|a| format!("{a}=…"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut ok = true;
        let mut valid = Vec::new();
        for name in ENDPOINTS {
            let Some(set) = s.get(name) else { continue };
            if allowed.contains(name) {
                valid.push(set);
                continue;
            }
            ok = false;
            let help = match did_you_mean(name, allowed.iter().copied()) {
                Some(best) => format!(
                    "did you mean `{best}`? `{}` agents use {allowed_list}",
                    protocol.as_str()
                ),
                None => format!("`{}` agents use {allowed_list}", protocol.as_str()),
            };
            let d = self
                .diag(
                    Kind::InvalidEndpoint,
                    format!(
                        "`{name}` is not supported by protocol `{}`",
                        protocol.as_str()
                    ),
                    set.name_span,
                    "not supported by this protocol",
                )
                .with_help(help);
            self.report(d);
        }
        // A model under test can be reached through a `provider` node instead: its endpoint,
        // key, limits and prices (`provider` on a Fixie agent is not an endpoint).
        let via_provider = s
            .get("provider")
            .filter(|_| protocol.spec().endpoints.contains(&EndpointKind::Provider));
        if let Some(set) = via_provider {
            match valid.first() {
                None => {
                    let name = set.values.first().and_then(|e| self.spanned_string(e))?;
                    return Some(Endpoint::Provider(name));
                }
                Some(other) => {
                    let d = self
                        .diag(
                            Kind::InvalidEndpoint,
                            format!("agent `{}` has more than one endpoint", id.value),
                            set.name_span,
                            "the provider's endpoint",
                        )
                        .with_label(other.name_span, "an endpoint of its own")
                        .with_help(
                            "keep `provider=` (the provider's base URL, key, limits and prices) \
                             or `base-url=` (headers written on the agent), not both",
                        );
                    self.report(d);
                    return None;
                }
            }
        }
        let first = match valid.as_slice() {
            [] => {
                if ok && !misspelt {
                    let d = self
                        .diag(
                            Kind::InvalidEndpoint,
                            format!("agent `{}` has no endpoint", id.value),
                            id.span.span,
                            "no endpoint",
                        )
                        .with_help(format!("add one of {allowed_list}"));
                    self.report(d);
                }
                return None;
            }
            [first] => *first,
            [first, second, ..] => {
                let d = self
                    .diag(
                        Kind::InvalidEndpoint,
                        format!("agent `{}` has more than one endpoint", id.value),
                        second.name_span,
                        "second endpoint",
                    )
                    .with_label(first.name_span, "first endpoint")
                    .with_help(format!("keep exactly one of {allowed_list}"));
                self.report(d);
                return None;
            }
        };
        let e = first.values.first().copied()?;
        match first.name {
            "url" | "base-url" => {
                let url = self.template(e)?;
                // A template (`{{ env.PORT }}`) is checked by the validator, and the URL it
                // renders to when the run starts.
                let problem = if crate::template::is_template(&url.source) {
                    None
                } else {
                    super::values::url_problem(&url.source)
                };
                match problem {
                    None => Some(Endpoint::Url(url)),
                    Some(why) => {
                        let url = url.source;
                        let d = self
                            .diag(
                                Kind::InvalidValue,
                                format!("invalid URL `{url}`: {why}"),
                                value_span(e),
                                "this URL",
                            )
                            .with_help(
                                "write the full endpoint, e.g. \"https://host/agent/respond\"",
                            );
                        self.report(d);
                        None
                    }
                }
            }
            "command" => {
                let command = self.string(e)?;
                if command.trim().is_empty() {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            "an empty `command` starts no agent",
                            value_span(e),
                            "empty",
                        )
                        .with_help(
                            "write the command that runs the agent, e.g. \"python3 -u agent.py\"",
                        );
                    self.report(d);
                    return None;
                }
                Some(Endpoint::Command(command))
            }
            "socket" => self.socket_address(e).map(Endpoint::Socket),
            _ => {
                let name = self.spanned_string(e)?;
                let known: Vec<&str> = protocol.spec().builtins.to_vec();
                if known.contains(&name.value.as_str()) {
                    return Some(Endpoint::Builtin(name));
                }
                let help = if known.is_empty() {
                    format!(
                        "protocol `{}` has no builtin agents; use {allowed_list}",
                        protocol.as_str()
                    )
                } else {
                    suggest(&name.value, known.iter().copied(), "the builtin agents")
                };
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("unknown builtin agent `{}`", name.value),
                        value_span(e),
                        format!("no such `{}` builtin", protocol.as_str()),
                    )
                    .with_help(help);
                self.report(d);
                None
            }
        }
    }
}

impl Decoder<'_> {
    /// "`NAME` is a `P` setting; agent `ID` is `Q`": the protocols that declare `name` come
    /// from the registry, so the message names them whatever they are.
    fn not_this_protocol(&self, name: &str, id: &Spanned<String>, protocol: Protocol) -> String {
        let owners_of: Vec<&str> = self
            .info
            .protocols
            .iter()
            .filter(|p| p.settings.iter().any(|s| s.name == name))
            .map(|p| p.name)
            .collect();
        let whose = match owners_of.as_slice() {
            [one] => format!("{} `{one}` setting", article(one)),
            _ => format!("a setting of {} agents", owners(&self.info.protocols, name)),
        };
        format!(
            "`{name}` is {whose}; agent `{}` is `{}`",
            id.value,
            protocol.as_str()
        )
    }

    /// Settings that belong to other protocols and that no dedicated check above reports:
    /// each one is an error at its name, so a setting a new protocol declares is rejected
    /// on every other protocol without code here.
    fn settings_of_other_protocols(
        &mut self,
        v: &View,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
    ) {
        // Settings written as blocks (`env { … }`) are child nodes the settings left alone.
        let others = node_settings(&self.info.protocols, None);
        let children = v.children.map(|c| c.nodes()).unwrap_or_default();
        for child in children {
            let cv = View::of(child, self.text());
            if !others.contains(&cv.name) || protocol.declares(cv.name) {
                continue;
            }
            let d = self
                .diag(
                    Kind::InvalidValue,
                    self.not_this_protocol(cv.name, id, protocol),
                    cv.name_span,
                    "not a setting of this protocol",
                )
                .with_help(removal_help(&self.info.protocols, cv.name));
            self.report(d);
        }
        for set in &s.items {
            if DEDICATED_CHECKS.contains(&set.name)
                || crate::lang::decls::AGENT.child(set.name).is_some()
                || protocol.declares(set.name)
            {
                continue;
            }
            let mut d = self
                .diag(
                    Kind::InvalidValue,
                    self.not_this_protocol(set.name, id, protocol),
                    set.name_span,
                    "not a setting of this protocol",
                )
                .with_help(removal_help(&self.info.protocols, set.name));
            if let Some(e) = set.values.first() {
                d = d.with_label(value_span(e), "this value");
            }
            self.report(d);
        }
    }
}

impl Decoder<'_> {
    /// The protocol's own one-value settings written on the agent, each checked against the
    /// type its spec gives and kept as JSON for the protocol's module. A setting that
    /// takes several values (`tools "a" "b"`) is kept as an array.
    fn protocol_settings(&mut self, s: &Settings, protocol: Protocol) -> ProtocolSettings {
        let mut out = ProtocolSettings::default();
        for spec in protocol.spec().settings {
            let (Form::Setting, Some(arg), Some(set)) =
                (spec.form, spec.args.first(), s.get(spec.name))
            else {
                continue;
            };
            let Some(first) = set.values.first().copied() else {
                continue;
            };
            let many = matches!(arg.repeat, Repeat::Many | Repeat::Any);
            let written: Vec<&KdlEntry> = if many {
                set.values.clone()
            } else {
                vec![first]
            };
            let mut values = Vec::with_capacity(written.len());
            let mut items = Vec::with_capacity(written.len());
            for e in written {
                if let Some(value) = self.setting_value(e, spec.name, arg.ty) {
                    values.push(value);
                    items.push(self.span(value_span(e)));
                }
            }
            let value = if many {
                Some(Value::Array(values))
            } else {
                values.pop()
            };
            if let Some(value) = value {
                let last = set.values.last().copied().unwrap_or(first);
                let (start, end) = (value_span(first), value_span(last));
                let whole = miette::SourceSpan::new(
                    start.offset().into(),
                    (end.offset() + end.len()).saturating_sub(start.offset()),
                );
                out.0.push(ProtocolSetting {
                    name: spec.name,
                    name_span: self.span(set.name_span),
                    value: Spanned {
                        value,
                        span: self.span(whole),
                    },
                    items,
                    checked: false,
                });
            }
        }
        out
    }

    /// A setting written as a node of properties (`reply json-path="$.output"`), checked
    /// against its spec (no arguments or children, known properties, required ones present,
    /// each of its type) and kept as an object of its properties; `None` when a required
    /// property is missing or invalid.
    pub(super) fn node_setting(&mut self, cv: &View, spec: &NodeSpec) -> Option<Value> {
        let usage = node_usage(spec);
        self.check_props_of(cv, spec);
        self.check_args(cv, 0, &usage);
        self.check_no_children(cv);
        let mut object = serde_json::Map::new();
        let mut complete = true;
        for prop in spec.props {
            let Some(e) = cv.prop(prop.name) else {
                if prop.required {
                    self.missing(cv, &format!("a `{}`", prop.name), &usage);
                    complete = false;
                }
                continue;
            };
            let value = self.setting_value(e, prop.name, prop.ty);
            match value {
                Some(value) => {
                    object.insert(prop.name.into(), value);
                }
                None => complete &= !prop.required,
            }
        }
        complete.then_some(Value::Object(object))
    }

    /// One value of a protocol setting as JSON, checked against its type (a wrong one is
    /// reported).
    fn setting_value(&mut self, e: &KdlEntry, name: &str, ty: ValueType) -> Option<Value> {
        match ty {
            ValueType::Boolean => self.boolean(e).map(Value::Bool),
            ValueType::OneOf(words) => {
                let choices: Vec<(&str, &str)> = words.iter().map(|w| (*w, *w)).collect();
                self.choice(e, name, &choices)
                    .map(|w| Value::String(w.to_owned()))
            }
            ValueType::Count => self.u64(e, 0).map(Value::from),
            ValueType::Positive => self.u32(e, 1).map(Value::from),
            ValueType::Between(lo, hi) => self
                .number(e, Some((f64::from(lo), f64::from(hi))))
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number),
            ValueType::Number => self
                .number(e, None)
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number),
            ValueType::JsonPath => self
                .json_path_value(
                    e,
                    "\"$.output.content\" or \"$.choices[0].message.content\"",
                )
                .map(|(_, source)| Value::String(source)),
            ValueType::HeaderName | ValueType::EnvName => {
                let text = self.string(e)?;
                self.name_of(ty, text, value_span(e)).map(Value::String)
            }
            ValueType::Path => {
                let path = self.string(e)?;
                let base = self
                    .files
                    .get(self.file)
                    .and_then(|f| f.path.parent())
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                Some(Value::String(
                    base.join(path).to_string_lossy().into_owned(),
                ))
            }
            _ => self.string(e).map(Value::String),
        }
    }

    /// `text` if it is a name of type `ty` (a header or an environment variable name), else
    /// a diagnostic at `span`.
    fn name_of(&mut self, ty: ValueType, text: String, span: SourceSpan) -> Option<String> {
        let (valid, what, help) = match ty {
            ValueType::EnvName => (
                !text.is_empty()
                    && !text.starts_with(|c: char| c.is_ascii_digit())
                    && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                ("environment variable name", "not a variable name"),
                "use letters, digits and `_`, not starting with a digit",
            ),
            ValueType::HeaderName => (
                !text.is_empty()
                    && text
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)),
                ("header name", "not a header name"),
                "header names are letters, digits and `-`, e.g. header=\"X-Session-Id\"",
            ),
            _ => (true, ("", ""), ""),
        };
        if valid {
            return Some(text);
        }
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid {} `{text}`", what.0),
                span,
                what.1,
            )
            .with_help(help);
        self.report(d);
        None
    }

    /// The protocol's settings written as nodes (an `http` agent's `reply json-path=…`, a
    /// `multiagent` agent's `env { … }`): each at most once, checked from its spec and added
    /// to `settings` (an object of its properties, or `[[KEY, VALUE], …]` for a block of
    /// `KEY VALUE` lines; `null` when it was reported, so that the protocol's check still
    /// sees it written). One written as a value (`stream #true` where `stream` is a node) is
    /// an error pointing at it.
    fn protocol_nodes(
        &mut self,
        v: &View,
        s: &Settings,
        id: &Spanned<String>,
        protocol: Protocol,
        settings: &mut ProtocolSettings,
    ) {
        let children: Vec<View> = v
            .children
            .map(|c| c.nodes())
            .unwrap_or_default()
            .iter()
            .map(|n| View::of(n, self.text()))
            .collect();
        for spec in protocol.spec().settings {
            if spec.form != Form::Node {
                continue;
            }
            let usage = node_usage(spec);
            if let Some(set) = s.get(spec.name) {
                let mut d = self
                    .diag(
                        Kind::WrongType,
                        format!(
                            "`{}` of {} `{}` agent is a node: {}",
                            spec.name,
                            article(protocol.as_str()),
                            protocol.as_str(),
                            spec.help
                        ),
                        set.name_span,
                        "not a value here",
                    )
                    .with_help(format!(
                        "write `{usage}` inside agent `{}`'s block",
                        id.value
                    ));
                if let Some(e) = set.values.first() {
                    d = d.with_label(value_span(e), "this value");
                }
                self.report(d);
            }
            let mut first: Option<SourceSpan> = None;
            for cv in children.iter().filter(|cv| cv.name == spec.name) {
                if let Some(first) = first {
                    self.problem(check::setting_twice(spec.name, "", cv.name_span, first));
                    continue;
                }
                first = Some(cv.name_span);
                let value = match spec.children {
                    Children::Map { key, value } => self.map_block(cv, spec, key, value),
                    // Free-form data: the block as a JSON object, as `user-context` reads.
                    Children::Data => {
                        self.check_props_of(cv, spec);
                        self.check_args(cv, 0, &node_usage(spec));
                        let object = cv.children.map(|c| self.json_object(c)).unwrap_or_default();
                        Some(Value::Object(object))
                    }
                    _ => self.node_setting(cv, spec),
                };
                settings.0.push(ProtocolSetting {
                    name: spec.name,
                    name_span: self.span(cv.name_span),
                    value: Spanned {
                        value: value.unwrap_or(Value::Null),
                        span: self.span(cv.name_span),
                    },
                    items: Vec::new(),
                    checked: true,
                });
            }
        }
    }

    /// A setting written as a block of `KEY VALUE` lines (`env { API_KEY "…" }`), each key
    /// once and of type `key`, each value of type `value`: `[[KEY, VALUE], …]` in the order
    /// written.
    fn map_block(
        &mut self,
        v: &View,
        spec: &NodeSpec,
        key: ValueType,
        value: ValueType,
    ) -> Option<Value> {
        let usage = format!("{} {{ KEY VALUE }}", spec.name);
        self.check_props_of(v, spec);
        self.check_args(v, 0, &usage);
        let mut out = Vec::new();
        let mut seen: HashMap<String, SourceSpan> = HashMap::new();
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            self.check_props(&cv, &[], &[]);
            self.check_no_children(&cv);
            self.check_args(&cv, 1, &usage);
            let Some(e) = cv.args.first() else {
                self.missing(&cv, "a value", &usage);
                continue;
            };
            let Some(item) = self.setting_value(e, cv.name, value) else {
                continue;
            };
            let Some(name) = self.name_of(key, cv.name.to_owned(), cv.name_span) else {
                continue;
            };
            if let Some(first) = seen.get(&name) {
                let suffix = format!(" in `{}`", spec.name);
                self.problem(check::setting_twice(&name, &suffix, cv.name_span, *first));
                continue;
            }
            seen.insert(name.clone(), cv.name_span);
            out.push(Value::Array(vec![Value::String(name), item]));
        }
        Some(Value::Array(out))
    }
}

/// Protocol settings whose misuse the decoder reports with a message of its own (the rest
/// get [`Decoder::settings_of_other_protocols`]'s).
const DEDICATED_CHECKS: &[&str] = &["history", "stream"];

/// "remove `temperature`; on `openai` and `anthropic` agents it is the sampling
/// temperature …": what the setting does where it belongs, from its spec's help.
fn removal_help(protocols: &[&'static ProtocolSpec], name: &str) -> String {
    match protocols
        .iter()
        .flat_map(|p| p.settings)
        .find(|s| s.name == name)
    {
        Some(spec) => format!(
            "remove `{name}`: on {} agents, {}",
            owners(protocols, name),
            spec.help
        ),
        None => format!("remove `{name}`"),
    }
}

/// "`openai` and `anthropic`": the protocols that declare `name`, as a message names them.
fn owners(protocols: &[&'static ProtocolSpec], name: &str) -> String {
    let names: Vec<String> = protocols
        .iter()
        .filter(|p| p.settings.iter().any(|s| s.name == name))
        .map(|p| format!("`{}`", p.name))
        .collect();
    match names.as_slice() {
        [] => "no".to_owned(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Every setting an `agent` node may be written with (properties or one-value child nodes):
/// those every agent takes, then each protocol's own, in registry order. Which protocol
/// takes which is checked once the agent's protocol is known.
fn agent_settings(protocols: &[&'static ProtocolSpec]) -> Vec<(&'static str, Arity)> {
    let mut out = common_settings();
    for spec in protocols.iter().flat_map(|p| p.settings) {
        if spec.form != Form::Setting || out.iter().any(|(n, _)| *n == spec.name) {
            continue;
        }
        out.push((spec.name, arity(spec)));
    }
    out
}

/// Child nodes of an `agent` block that protocols decode themselves (`env { … }`, an `http`
/// agent's `reply json-path=…`): those no protocol takes as a plain setting, and those the
/// agent's own protocol takes as a node.
fn node_settings(
    protocols: &[&'static ProtocolSpec],
    own: Option<&'static ProtocolSpec>,
) -> Vec<&'static str> {
    let as_setting = |name: &str| {
        protocols
            .iter()
            .flat_map(|p| p.settings)
            .any(|s| s.name == name && s.form == Form::Setting)
    };
    let mut out: Vec<&'static str> = Vec::new();
    for spec in protocols.iter().flat_map(|p| p.settings) {
        let own_node = own.is_some_and(|o| {
            o.settings
                .iter()
                .any(|s| s.name == spec.name && s.form == Form::Node)
        });
        if spec.form == Form::Node
            && (!as_setting(spec.name) || own_node)
            && !out.contains(&spec.name)
        {
            out.push(spec.name);
        }
    }
    out
}

/// How a node setting is written, with an example value for each required property:
/// `reply json-path="$.output"`, `env { KEY VALUE }`.
fn node_usage(spec: &NodeSpec) -> String {
    match spec.children {
        Children::Map { .. } => return format!("{} {{ KEY VALUE }}", spec.name),
        Children::Data => return format!("{} {{ … }}", spec.name),
        _ => {}
    }
    let mut usage = spec.name.to_owned();
    for prop in spec.props.iter().filter(|p| p.required) {
        let example = match prop.ty {
            ValueType::JsonPath => "\"$.output\"",
            ValueType::HeaderName => "\"X-Session-Id\"",
            ValueType::String => "\"…\"",
            _ => "…",
        };
        usage.push_str(&format!(" {}={example}", prop.name));
    }
    usage
}

/// "an `http` agent", "a `multiagent` agent": the article as the name is read aloud (`http`
/// is spelled out, aitch-tee-tee-pee).
fn article(name: &str) -> &'static str {
    if name.starts_with(['a', 'e', 'i', 'o', 'u', 'h']) {
        "an"
    } else {
        "a"
    }
}
