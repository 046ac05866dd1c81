//! Decoding `tool` declarations (top level or in a scenario): `param`, `mock`, `sequence`,
//! `state` and `policy`.

use super::*;

impl<'f> Decoder<'f> {
    pub(super) fn tool(&mut self, v: &View) -> Option<Tool> {
        let usage = "tool \"NAME\" { description \"…\"; param …; mock …; sequence { … }; state …; policy … }";
        let (name, has_name) = self.id_or_stand_in(v, "a name", usage);
        let tool = self.tool_body(v, name, usage);
        tool.filter(|_| has_name)
    }

    fn tool_body(&mut self, v: &View, name: Spanned<String>, usage: &str) -> Option<Tool> {
        self.check_args_of(v, &lang::tool::TOOL, usage);
        let s = self.settings_of(
            v,
            &lang::tool::TOOL,
            "`tool`",
            &["param", "mock", "sequence", "state", "policy"],
        );
        let description = self.s_string(&s, "description");
        let mut params = Vec::new();
        let mut mocks = Vec::new();
        let mut policies = Vec::new();
        let mut sequence: Option<ToolSequence> = None;
        let mut state_changes = Vec::new();
        let mut first_mock: Option<SourceSpan> = None;
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            match cv.name {
                "param" => {
                    if let Some(p) = self.tool_param(&cv) {
                        if let Some(first) = params.iter().find(|q: &&ToolParam| q.name == p.name) {
                            let p = check::set_twice(check::Twice {
                                message: format!(
                                    "tool `{}` declares parameter `{}` twice",
                                    name.value, p.name
                                ),
                                again: (cv.span, "second declaration"),
                                first: (first.span.span, "first declaration"),
                                help: "keep one `param` per parameter (its type, whether it is \
                                       required and its description in one node)",
                            });
                            self.problem(p);
                        } else {
                            params.push(p);
                        }
                    }
                }
                "mock" => {
                    first_mock.get_or_insert(cv.name_span);
                    if let Some(m) = self.tool_mock(&cv) {
                        mocks.push(m);
                    }
                }
                "sequence" => {
                    if let Some(first) = &sequence {
                        let p = check::set_twice(check::Twice {
                            message: format!("tool `{}` has two `sequence` blocks", name.value),
                            again: (cv.name_span, "second sequence"),
                            first: (first.span.span, "first sequence"),
                            help: "put every output in one `sequence { output …; … }`",
                        });
                        self.problem(p);
                    } else {
                        sequence = self.tool_sequence(&cv);
                    }
                }
                "state" => state_changes.extend(self.state_change(&cv)),
                "policy" => {
                    if let Some(p) = self.tool_policy(&cv) {
                        policies.push(p);
                    }
                }
                _ => {}
            }
        }
        if let (Some(seq), Some(mock)) = (&sequence, first_mock) {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    format!(
                        "tool `{}` has both `mock` and `sequence` outputs",
                        name.value
                    ),
                    seq.span.span,
                    "outputs in order",
                )
                .with_label(mock, "outputs matched on parameters")
                .with_help("a tool answers either by matching parameters (`mock`) or in order (`sequence`); keep one");
            self.report(d);
        }
        Some(Tool {
            name,
            description,
            params,
            mocks,
            sequence,
            state_changes,
            policies,
            span: self.span(v.span),
        })
    }

    pub(super) fn tool_param(&mut self, v: &View) -> Option<ToolParam> {
        let usage = "param \"NAME\" type=\"string\" required=#true description=\"…\"";
        let name = self.id_arg(v, "a name", usage)?;
        self.check(v, &lang::tool::PARAM, usage);
        let ty = match v.prop("type") {
            Some(e) => {
                let choices: Vec<(&str, &str)> =
                    lang::tool::PARAM_TYPES.iter().map(|t| (*t, *t)).collect();
                self.choice(e, "parameter type", &choices)
                    .unwrap_or("string")
            }
            None => "string",
        };
        let required = v
            .prop("required")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let description = v.prop("description").and_then(|e| self.string(e));
        Some(ToolParam {
            name: name.value,
            ty: ty.to_string(),
            required,
            description,
            span: self.span(v.span),
        })
    }

    pub(super) fn tool_mock(&mut self, v: &View) -> Option<ToolMock> {
        let usage = "mock returns=#\"{\"ok\": true}\"# KEY=VALUE… { state path=\"…\" value=… }";
        self.check_entries(v, &lang::tool::MOCK, usage);
        let mut state_changes = Vec::new();
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            if cv.name == "state" {
                state_changes.extend(self.state_change(&cv));
            } else {
                let known = lang::tool::MOCK.child_specs().iter().map(|s| s.name);
                self.unknown_node(cv.name, cv.name_span, "a `mock`", known);
            }
        }
        let Some(returns) = v.prop("returns") else {
            // Every other key is an argument to match, so a misspelled `returns` is one of
            // them: point at it rather than at `mock`.
            let typo = v.props.iter().find(|p| {
                p.name().is_some_and(|n| {
                    crate::diagnostics::did_you_mean(n.value(), ["returns"]).is_some()
                })
            });
            match typo {
                Some(typo) => {
                    let name = typo.name().map_or("", |n| n.value());
                    let d = self
                        .diag(
                            Kind::Missing,
                            format!("`mock` needs `returns=…`; `{name}=` is an argument to match"),
                            typo.span(),
                            "did you mean `returns`?",
                        )
                        .with_help(format!(
                            "write `returns=` for the answer; as written, `{name}` is matched \
                             against the call's arguments"
                        ));
                    self.report(d);
                }
                None => self.missing(v, "`returns=…`", usage),
            }
            return None;
        };
        let returns = match returns.value() {
            // JSON text when it parses, else the string itself.
            KdlValue::String(s) => {
                serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
            }
            _ => self.json(returns)?,
        };
        let mut when = Map::new();
        for p in &v.props {
            let key = prop_name(p);
            if key == "returns" || key == "params-json" {
                continue;
            }
            if let Some(val) = self.json(p) {
                when.insert(key.to_string(), val);
            }
        }
        if let Some(e) = v.prop("params-json") {
            self.params_json(e, &mut when);
        }
        Some(ToolMock {
            when,
            returns,
            state_changes,
            span: self.span(v.span),
        })
    }

    /// A JSON output written as one value: JSON text when a string parses as JSON, else the
    /// string itself (as `mock returns=`).
    pub(super) fn output_value(&mut self, e: &KdlEntry) -> Option<Value> {
        match e.value() {
            KdlValue::String(s) => {
                Some(serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())))
            }
            _ => self.json(e),
        }
    }

    pub(super) fn tool_sequence(&mut self, v: &View) -> Option<ToolSequence> {
        let usage =
            "sequence when-exhausted=\"repeat-last\" { output #\"{\"ok\": true}\"# KEY=VALUE…; … }";
        self.check_entries(v, &lang::tool::SEQUENCE, usage);
        let when_exhausted = v
            .prop("when-exhausted")
            .and_then(|e| self.choice(e, "when-exhausted", &WhenExhausted::ALL))
            .unwrap_or_default();
        let mut outputs = Vec::new();
        for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
            let cv = View::of(child, self.text());
            if cv.name != "output" {
                let known = lang::tool::SEQUENCE.child_specs().iter().map(|s| s.name);
                self.unknown_node(cv.name, cv.name_span, "a `sequence`", known);
                continue;
            }
            let output_usage = "output #\"{\"ok\": true}\"# KEY=VALUE…";
            self.check(&cv, &lang::tool::OUTPUT, output_usage);
            let Some(first) = cv.args.first() else {
                self.missing(&cv, "the output value", output_usage);
                continue;
            };
            let Some(value) = self.output_value(first) else {
                continue;
            };
            let mut when = Map::new();
            for p in cv.props.iter().filter(|p| prop_name(p) != "params-json") {
                if let Some(val) = self.json(p) {
                    when.insert(prop_name(p).to_string(), val);
                }
            }
            if let Some(e) = cv.prop("params-json") {
                self.params_json(e, &mut when);
            }
            outputs.push(SequenceOutput { value, when });
        }
        if outputs.is_empty() {
            self.missing(v, "at least one `output`", usage);
            return None;
        }
        Some(ToolSequence {
            outputs,
            when_exhausted,
            span: self.span(v.span),
        })
    }

    /// `state path="a.b" value=…` or `state path="a.b" json=#"{…}"#`.
    pub(super) fn state_change(&mut self, v: &View) -> Option<StateChange> {
        let usage = "state path=\"orders.0.status\" value=\"refunded\"";
        self.check(v, &lang::tool::STATE, usage);
        let path = self.state_path(v, usage);
        let value = match (v.prop("value"), v.prop("json")) {
            (Some(e), None) => self.json(e),
            (None, Some(e)) => self.json_text(e),
            (None, None) => {
                self.missing(v, "`value=…` or `json=…`", usage);
                None
            }
            (Some(_), Some(e)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "`state` takes `value=` or `json=`, not both".to_string(),
                        e.span(),
                        "second value",
                    )
                    .with_help("`value=` for a string, number or boolean; `json=` for JSON text (objects, arrays)");
                self.report(d);
                None
            }
        };
        Some(StateChange {
            path: path?,
            value: value?,
            span: self.span(v.span),
        })
    }

    /// A required `path=` of the state document: a JSON pointer (`/a/b`) or dotted (`a.b.0`)
    /// without empty segments.
    pub(super) fn state_path(&mut self, v: &View, usage: &str) -> Option<String> {
        let Some(e) = v.prop("path") else {
            self.missing(v, "`path=…`", usage);
            return None;
        };
        let path = self.string(e)?;
        let problem = if path.is_empty() {
            Some("the path is empty")
        } else if !path.starts_with('/') && path.split('.').any(str::is_empty) {
            Some("a dotted path has an empty segment")
        } else {
            None
        };
        match problem {
            None => Some(path),
            Some(why) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid state path `{path}`: {why}"),
                        value_span(e),
                        why,
                    )
                    .with_help("write a dotted path like \"orders.0.status\" or a JSON pointer like \"/orders/0/status\"");
                self.report(d);
                None
            }
        }
    }

    /// `params-json=#"{…}"#`: arguments to match written as one JSON object, for a parameter
    /// a `KEY=VALUE` cannot write: one named as the node's own setting (`count`, `returns`,
    /// `params-json`), or one whose value is an object or a list. Its keys join `params`
    /// as `KEY=VALUE`s would; a key written both ways is an error, since which one holds
    /// would be a guess.
    pub(super) fn params_json(&mut self, e: &KdlEntry, params: &mut Map<String, Value>) {
        let Some(value) = self.json_text(e) else {
            return;
        };
        let Value::Object(object) = value else {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    "`params-json` must be a JSON object of the call's arguments",
                    value_span(e),
                    "not an object",
                )
                .with_help(r##"write the arguments as an object: params-json=#"{"count": 2}"#"##);
            self.report(d);
            return;
        };
        for (key, value) in object {
            if params.contains_key(&key) {
                let d = self
                    .diag(
                        Kind::DuplicateSetting,
                        format!(
                            "argument `{key}` is written both as `{key}=` and in `params-json`"
                        ),
                        value_span(e),
                        "written twice",
                    )
                    .with_help("keep one of the two");
                self.report(d);
                continue;
            }
            params.insert(key, value);
        }
    }

    /// A string property holding JSON text, parsed.
    pub(super) fn json_text(&mut self, e: &KdlEntry) -> Option<Value> {
        let text = self.string(e)?;
        match serde_json::from_str(&text) {
            Ok(v) => Some(v),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("invalid JSON: {err}"),
                        value_span(e),
                        "not JSON",
                    )
                    .with_help("write JSON text in a KDL raw string: #\"{\"a\": 1}\"#");
                self.report(d);
                None
            }
        }
    }

    /// `policy "PARAM" max=N`, `policy "PARAM" allowed="A" "B"…` (the arguments after the
    /// parameter are further allowed values), or the harness's `policy max-limit=N` (on
    /// `amount` unless `param="…"` names another parameter).
    pub(super) fn tool_policy(&mut self, v: &View) -> Option<ToolPolicy> {
        let usage = "policy \"PARAM\" max=3, policy \"PARAM\" allowed=\"EUR\" \"USD\" or policy max-limit=50";
        // `policy max-limt=50`: the misspelt property is the one error, not also the
        // parameter and the rule it would have given.
        let misspelt = self.check_props_of(v, &lang::tool::POLICY);
        self.check_block_of(v, &lang::tool::POLICY);
        let allowed = v.prop("allowed");
        if allowed.is_none() {
            self.check_args(v, 1, usage);
        }
        let param = match (v.args.first().copied(), v.prop("param")) {
            (Some(_), Some(p)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "the parameter is named twice".to_string(),
                        p.span(),
                        "second name",
                    )
                    .with_help(
                        "write the parameter as the first argument: policy \"amount\" max=50",
                    );
                self.report(d);
                None
            }
            (Some(e), None) | (None, Some(e)) => self.string(e),
            // The harness's `max_limit` always checks `amount`.
            (None, None) if v.prop("max-limit").is_some() => Some("amount".to_string()),
            (None, None) => {
                if !misspelt {
                    self.missing(v, "a parameter", usage);
                }
                None
            }
        };
        let maximum = [v.prop("max"), v.prop("max-limit")];
        let rules: Vec<&KdlEntry> = maximum.iter().flatten().copied().chain(allowed).collect();
        let rule = match rules.as_slice() {
            [] => {
                if !misspelt {
                    self.missing(v, "a rule (`max=…` or `allowed=…`)", usage);
                }
                None
            }
            [e] if allowed.is_some_and(|a| std::ptr::eq(a, *e)) => {
                let mut values: Vec<Value> = self.json(e).into_iter().collect();
                for extra in v.args.iter().skip(1) {
                    values.extend(self.json(extra));
                }
                Some(PolicyRule::Allowed(values))
            }
            [e] => self.number(e, None).map(PolicyRule::Maximum),
            [_, second, ..] => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "a `policy` has one rule".to_string(),
                        second.span(),
                        "second rule",
                    )
                    .with_help("write one `policy` node per rule");
                self.report(d);
                None
            }
        };
        Some(ToolPolicy {
            param: param?,
            rule: rule?,
            span: self.span(v.span),
        })
    }
}
