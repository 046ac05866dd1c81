//! Decoding criteria (in `expect`, `criteria { }` and a scenario's `expect-tool` and
//! `outcome`).

use super::*;

impl<'f> Decoder<'f> {
    // ----- criteria

    /// The criterion as written, on one line.
    pub(super) fn criterion_text(&self, v: &View) -> String {
        let mut text = v.name.to_string();
        for e in v.args.iter().chain(v.props.iter()) {
            let src = self.source_of(e.span());
            text.push(' ');
            if src.contains('\n') {
                text.push_str(&src.lines().map(str::trim).collect::<Vec<_>>().join(" "));
            } else {
                text.push_str(src);
            }
        }
        text
    }

    pub(super) fn criterion(&mut self, v: &View, context: &str) -> Option<Criterion> {
        let known = || lang::criteria::CRITERIA.iter().map(|s| s.name);
        let Some(spec) = lang::criteria::CRITERIA.iter().find(|s| s.name == v.name) else {
            let p = check::unknown_criterion(v.name, v.name_span, context, known());
            self.problem(p);
            return None;
        };
        self.check_block_of(v, spec);
        let text = self.criterion_text(v);
        let mut templates = Vec::new();
        let kind = match v.name {
            "reply" => self.reply_criterion(v, &mut templates)?,
            "tool" => self.tool_criterion(v, spec, &mut templates)?,
            "no-tool" => {
                let usage = "no-tool \"NAME\" (or `no-tool` alone: no tool call at all)";
                self.check_entries(v, spec, usage);
                if v.args.is_empty() {
                    CriterionKind::NoTool { name: None }
                } else {
                    let name = self.id_arg(v, "a tool name", usage)?;
                    CriterionKind::NoTool {
                        name: Some(name.value),
                    }
                }
            }
            "tools-in-order" => {
                let names = self.strings(v, spec, "tools-in-order \"A\" \"B\"");
                if names.is_empty() {
                    return None;
                }
                CriterionKind::ToolsInOrder(names)
            }
            "latency" | "ttft" => {
                let usage = format!("{} max=\"2s\"", v.name);
                self.check_entries(v, spec, &usage);
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", &usage);
                    return None;
                };
                let max = self.duration(e)?;
                if v.name == "latency" {
                    CriterionKind::Latency { max }
                } else {
                    CriterionKind::Ttft { max }
                }
            }
            "turns" | "tokens" => {
                let usage = format!("{} max=8", v.name);
                self.check_entries(v, spec, &usage);
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", &usage);
                    return None;
                };
                if v.name == "turns" {
                    CriterionKind::Turns {
                        max: self.u32(e, 0)?,
                    }
                } else {
                    CriterionKind::Tokens {
                        max: self.u64(e, 0)?,
                    }
                }
            }
            "no-error" => {
                self.check_entries(v, spec, "no-error");
                CriterionKind::NoError
            }
            "state" => self.state_criterion(v, spec)?,
            "span" => {
                let usage = "span \"NAME\" KEY=VALUE… count=N";
                self.check_args_of(v, spec, usage);
                self.check_props_of(v, spec);
                let name = self.id_arg(v, "a span name", usage)?;
                let mut attributes = Map::new();
                let mut count = None;
                for p in v.props.clone() {
                    let key = prop_name(p);
                    if key == "count" {
                        count = self.u32(p, 0);
                    } else if let Some(val) = self.json(p) {
                        attributes.insert(key.to_string(), val);
                    }
                }
                CriterionKind::Span {
                    name: name.value,
                    attributes,
                    count,
                }
            }
            "span-count" => {
                let usage = "span-count \"NAME\" min=1 max=3";
                self.check_entries(v, spec, usage);
                let name = self.id_arg(v, "a span name", usage)?;
                let min = v.prop("min").and_then(|e| self.u32(e, 0));
                let max = v.prop("max").and_then(|e| self.u32(e, 0));
                if min.is_none() && max.is_none() {
                    // A bound written with a bad value has its own error already.
                    if v.prop("min").is_none() && v.prop("max").is_none() {
                        self.missing(v, "`min=…` or `max=…`", usage);
                    }
                    return None;
                }
                // No count is both: the check could never pass.
                if let (Some(lo), Some(hi), Some(e)) = (min, max, v.prop("max"))
                    && hi < lo
                {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!("`max={hi}` is below `min={lo}`: no count passes"),
                            e.span(),
                            "below min",
                        )
                        .with_help("swap them, or write the one bound meant");
                    self.report(d);
                    return None;
                }
                CriterionKind::SpanCount {
                    name: name.value,
                    min,
                    max,
                }
            }
            "spans-in-order" => {
                let names = self.strings(v, spec, "spans-in-order \"A\" \"B\"");
                if names.is_empty() {
                    return None;
                }
                CriterionKind::SpansInOrder(names)
            }
            "span-duration" => {
                let usage = "span-duration \"NAME\" max=\"2s\"";
                self.check_entries(v, spec, usage);
                let name = self.id_arg(v, "a span name", usage)?;
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", usage);
                    return None;
                };
                CriterionKind::SpanDuration {
                    name: name.value,
                    max: self.duration(e)?,
                }
            }
            "violations" => {
                let usage = "violations max=0";
                self.check_entries(v, spec, usage);
                let Some(e) = v.prop("max") else {
                    self.missing(v, "`max=…`", usage);
                    return None;
                };
                CriterionKind::Violations {
                    max: self.u32(e, 0)?,
                }
            }
            "judge" => {
                let usage = "judge \"CRITERION\" threshold=0.7 judge=\"ID\" rubric=\"…\"";
                self.check_entries(v, spec, usage);
                let criterion = self.id_arg(v, "a criterion", usage)?;
                if template::is_template(&criterion.value) {
                    templates.push(CriterionTemplate {
                        slot: ValueSlot::JudgeStatement,
                        template: Template {
                            source: criterion.value.clone(),
                            span: criterion.span,
                        },
                    });
                }
                let threshold = v
                    .prop("threshold")
                    .and_then(|e| self.number(e, Some((0.0, 1.0))));
                let judge = v.prop("judge").and_then(|e| self.spanned_string(e));
                let rubric = v.prop("rubric").and_then(|e| {
                    let rubric = self.rubric(e)?;
                    if template::is_template(&rubric) {
                        templates.push(CriterionTemplate {
                            slot: ValueSlot::JudgeRubric,
                            template: Template {
                                source: rubric.clone(),
                                span: self.span(value_span(e)),
                            },
                        });
                    }
                    Some(rubric)
                });
                CriterionKind::Judge {
                    criterion: criterion.value,
                    threshold,
                    judge,
                    rubric,
                }
            }
            _ => {
                let outcome = self.outcome(v)?;
                if let (Outcome::Statement(statement), Some(arg)) = (&outcome, v.args.first())
                    && template::is_template(statement)
                {
                    templates.push(CriterionTemplate {
                        slot: ValueSlot::JudgeStatement,
                        template: Template {
                            source: statement.clone(),
                            span: self.span(value_span(arg)),
                        },
                    });
                }
                CriterionKind::Outcome(outcome)
            }
        };
        Some(Criterion {
            kind,
            text,
            templates,
            span: self.span(v.span),
        })
    }

    /// `state path=… CHECK`: exactly one of `equals`, `contains`, `matches`, `near` (with an
    /// optional `tolerance`), `exists`, `absent`.
    pub(super) fn state_criterion(&mut self, v: &View, spec: &NodeSpec) -> Option<CriterionKind> {
        let checks = [
            "equals",
            "equals-json",
            "contains",
            "contains-json",
            "matches",
            "near",
            "exists",
            "absent",
        ];
        let usage = "state path=\"orders.0.status\" equals=\"refunded\"";
        self.check_entries(v, spec, usage);
        let path = self.state_path(v, usage);
        let given: Vec<&KdlEntry> = v
            .props
            .iter()
            .copied()
            .filter(|p| checks.contains(&prop_name(p)))
            .collect();
        let e = match given.as_slice() {
            [] => {
                self.missing(
                    v,
                    "a check (`equals`, `equals-json`, `contains`, `contains-json`, `matches`, \
                     `near`, `exists` or `absent`)",
                    usage,
                );
                return None;
            }
            [e] => *e,
            [_, second, ..] => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "a `state` criterion has one check".to_string(),
                        second.span(),
                        "second check",
                    )
                    .with_help("write one `state` criterion per check");
                self.report(d);
                return None;
            }
        };
        let tolerance = v.prop("tolerance");
        if let Some(t) = tolerance
            && prop_name(e) != "near"
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    "`tolerance` belongs to `near`".to_string(),
                    t.span(),
                    "without `near=`",
                )
                .with_help(
                    "write state path=\"…\" near=9.99 tolerance=0.01, or remove `tolerance`",
                );
            self.report(d);
            return None;
        }
        let check = match prop_name(e) {
            "equals" => StateCheck::Equals(self.json(e)?),
            // JSON text, for objects and arrays a KDL value cannot write.
            "equals-json" => StateCheck::Equals(self.json_text(e)?),
            "contains" => StateCheck::Contains(self.json(e)?),
            "contains-json" => StateCheck::Contains(self.json_text(e)?),
            "matches" => StateCheck::Matches(self.regex(e)?),
            "near" => {
                let value = self.number(e, None)?;
                let tolerance = match tolerance {
                    Some(t) => {
                        let tolerance = self.number(t, None)?;
                        if !(tolerance >= 0.0 && tolerance.is_finite()) {
                            let d = self
                                .diag(
                                    Kind::OutOfRange,
                                    format!(
                                        "{tolerance} is out of range: a tolerance is at least 0"
                                    ),
                                    value_span(t),
                                    "negative tolerance",
                                )
                                .with_help(
                                    "write the largest allowed difference, e.g. tolerance=0.01",
                                );
                            self.report(d);
                            return None;
                        }
                        tolerance
                    }
                    None => DEFAULT_STATE_TOLERANCE,
                };
                StateCheck::Near { value, tolerance }
            }
            name => {
                let exists = self.boolean(e)?;
                if exists == (name == "exists") {
                    StateCheck::Exists
                } else {
                    StateCheck::Absent
                }
            }
        };
        Some(CriterionKind::State { path: path?, check })
    }

    /// `reply json-path="$.a" equals=VALUE`: a check on the turn's structured data; a string
    /// VALUE written with template syntax is added to `templates` (it is the criterion's
    /// only check, slot `ReplyCheck(0)`).
    pub(super) fn reply_json_path(
        &mut self,
        v: &View,
        p: &KdlEntry,
        templates: &mut Vec<CriterionTemplate>,
    ) -> Option<CriterionKind> {
        self.check_props(v, &["json-path", "equals"], &[]);
        self.check_args(v, 0, "reply json-path=\"$.a\" equals=VALUE");
        if let Some(e) = v.prop("equals")
            && let Some(source) = e.value().as_string()
            && template::is_template(source)
        {
            templates.push(CriterionTemplate {
                slot: ValueSlot::ReplyCheck(0),
                template: Template {
                    source: source.to_string(),
                    span: self.span(value_span(e)),
                },
            });
        }
        let equals = v.prop("equals").map(|e| match e.value() {
            KdlValue::String(s) => serde_json::Value::String(s.clone()),
            KdlValue::Integer(i) => match i64::try_from(*i) {
                Ok(i) => serde_json::Value::from(i),
                Err(_) => serde_json::Value::from(*i as f64),
            },
            KdlValue::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            KdlValue::Bool(b) => serde_json::Value::Bool(*b),
            KdlValue::Null => serde_json::Value::Null,
        });
        match self.json_path(p)? {
            CaptureSource::JsonPath { path, source } => {
                Some(CriterionKind::Reply(vec![ReplyCheck::JsonPath {
                    path,
                    source,
                    equals,
                }]))
            }
            CaptureSource::Regex(_) => None,
        }
    }

    /// `reply …`; string checks written with template syntax are added to `templates`.
    pub(super) fn reply_criterion(
        &mut self,
        v: &View,
        templates: &mut Vec<CriterionTemplate>,
    ) -> Option<CriterionKind> {
        let checks = ["contains", "not-contains", "matches", "equals"];
        let usage = "reply contains=\"…\"";
        if let Some(p) = v.prop("json-path") {
            return self.reply_json_path(v, p, templates);
        }
        // `json-path` is read above; listed here so a misspelling of it is suggested.
        self.check_props(
            v,
            &["contains", "not-contains", "matches", "equals", "json-path"],
            &checks,
        );
        self.check_args(v, 0, usage);
        let mut out = Vec::new();
        let mut failed = false;
        for p in v.props.clone() {
            let name = prop_name(p);
            if matches!(name, "contains" | "not-contains" | "equals")
                && let Some(source) = p.value().as_string()
                && template::is_template(source)
            {
                templates.push(CriterionTemplate {
                    slot: ValueSlot::ReplyCheck(out.len()),
                    template: Template {
                        source: source.to_string(),
                        span: self.span(value_span(p)),
                    },
                });
            }
            if matches!(name, "contains" | "not-contains") && p.value().as_string() == Some("") {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("an empty `{name}` checks nothing"),
                        p.span(),
                        "empty",
                    )
                    .with_help(
                        "every reply contains the empty text: write the text to look for, or \
                         `equals=\"\"` for an empty reply",
                    );
                self.report(d);
                failed = true;
                continue;
            }
            if name == "matches" && p.value().as_string() == Some("") {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "an empty `matches` checks nothing",
                        p.span(),
                        "empty",
                    )
                    .with_help(
                        "the empty pattern matches every reply: write the pattern to look for, \
                         or `equals=\"\"` for an empty reply",
                    );
                self.report(d);
                failed = true;
                continue;
            }
            let check = match name {
                "contains" => self.string(p).map(ReplyCheck::Contains),
                "not-contains" => self.string(p).map(ReplyCheck::NotContains),
                "equals" => self.string(p).map(ReplyCheck::Equals),
                "matches" if self.templated_regex(p) => None,
                "matches" => self.regex(p).map(ReplyCheck::Matches),
                _ => continue,
            };
            match check {
                Some(c) => out.push(c),
                None => failed = true,
            }
        }
        if out.is_empty() {
            if !failed && v.props.is_empty() {
                let mut p = check::missing(v.name, v.name_span, "a check", "");
                p.help = "write `reply contains=\"…\"`, or `not-contains=`, `matches=`, \
                          `equals=` (with `json-path=` to check a part of the structured answer)"
                    .to_owned();
                self.problem(p);
            }
            return None;
        }
        Some(CriterionKind::Reply(out))
    }

    /// A regex is fixed when the suite is checked, so that a bad pattern fails `check`;
    /// one written like a template is reported instead of silently matching `{{`.
    pub(super) fn templated_regex(&mut self, e: &KdlEntry) -> bool {
        let Some(pattern) = e.value().as_string() else {
            return false;
        };
        let Some(open) = pattern.find("{{") else {
            return false;
        };
        if !pattern[open..].contains("}}") {
            return false;
        }
        let d = self
            .diag(
                Kind::InvalidValue,
                "`matches` is a regex, not a template",
                value_span(e),
                "template syntax in a regex",
            )
            .with_help(
                "regexes are compiled when the suite is checked; to compare the reply with a \
                 variable write `contains=\"{{ … }}\"` or `equals=\"{{ … }}\"`",
            );
        self.report(d);
        true
    }

    /// `tool` / `expect-tool`; string parameters written with template syntax are added to
    /// `templates`.
    pub(super) fn tool_criterion(
        &mut self,
        v: &View,
        spec: &NodeSpec,
        templates: &mut Vec<CriterionTemplate>,
    ) -> Option<CriterionKind> {
        let usage = format!("{} \"NAME\" KEY=VALUE… count=N params-json=JSON", v.name);
        self.check_args_of(v, spec, &usage);
        self.check_props_of(v, spec);
        let name = self.id_arg(v, "a tool name", &usage)?;
        let mut params = Map::new();
        let mut count = None;
        let mut spans = Vec::new();
        for p in v.props.clone() {
            let key = prop_name(p);
            if key == "count" {
                count = self.u32(p, 0);
            } else if key == "params-json" {
                continue;
            } else if let Some(val) = self.json(p) {
                spans.push((key.to_string(), value_span(p)));
                params.insert(key.to_string(), val);
            }
        }
        if let Some(e) = v.prop("params-json") {
            let written: Vec<String> = params.keys().cloned().collect();
            self.params_json(e, &mut params);
            spans.extend(
                params
                    .keys()
                    .filter(|k| !written.contains(k))
                    .map(|k| (k.clone(), value_span(e))),
            );
        }
        // A top-level string argument written with template syntax is rendered per run,
        // in either form.
        for (key, span) in spans {
            if let Some(Value::String(source)) = params.get(&key)
                && template::is_template(source)
            {
                templates.push(CriterionTemplate {
                    slot: ValueSlot::ToolParam(key),
                    template: Template {
                        source: source.clone(),
                        span: self.span(span),
                    },
                });
            }
        }
        Some(CriterionKind::Tool {
            name: name.value,
            params,
            count,
            loose: v.name == "expect-tool",
        })
    }

    pub(super) fn outcome(&mut self, v: &View) -> Option<Outcome> {
        let usage = "outcome \"STATEMENT\"` or `outcome LABEL=VALUE";
        match (v.args.as_slice(), v.props.as_slice()) {
            ([arg], []) => self.string(arg).map(Outcome::Statement),
            ([], [prop]) => Some(Outcome::Labeled {
                label: prop_name(prop).to_string(),
                value: self.json(prop)?,
            }),
            ([], []) => {
                self.missing(v, "a statement", usage);
                None
            }
            _ => {
                // A judge's settings written on an outcome: it takes none, and saying so
                // beats "one statement or one LABEL=VALUE".
                let judge_setting = v.props.iter().find(|p| {
                    let name = prop_name(p);
                    ["threshold", "judge", "rubric"].iter().any(|s| {
                        *s == name || crate::diagnostics::did_you_mean(name, [*s]).is_some()
                    })
                });
                if let (Some(p), [_]) = (judge_setting, v.args.as_slice()) {
                    let d = self
                        .diag(
                            Kind::UnknownProperty,
                            format!("`outcome` takes no `{}`", prop_name(p)),
                            p.span(),
                            "not a setting of `outcome`",
                        )
                        .with_help(
                            "an outcome is judged as holding or not (pass mark 1) by the \
                             scenario's judge; for a scored check with its own threshold, judge \
                             or rubric write `judge \"STATEMENT\" threshold=… judge=… rubric=…`",
                        );
                    self.report(d);
                    return None;
                }
                let extra = v
                    .args
                    .get(1)
                    .or(v.props.get(1))
                    .or(v.props.first())
                    .map_or(v.span, |e| e.span());
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`outcome` takes one statement or one LABEL=VALUE",
                        extra,
                        "unexpected",
                    )
                    .with_help("write one `outcome` per expected outcome");
                self.report(d);
                None
            }
        }
    }
}
