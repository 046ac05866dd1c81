//! Decoding the top-level declarations other than `agent` and `tool`: `suite`, `persona`,
//! `provider`, `simulator`, `judge` and `panel`, and the dispatch of a file's top-level nodes.

use super::*;

impl<'f> Decoder<'f> {
    // ----- top level

    /// Decodes the top-level nodes of `doc` (all or some of the current file's) into `items`,
    /// and keeps its `include` nodes for the loader.
    pub(super) fn nodes(
        &mut self,
        doc: &KdlDocument,
        items: &mut FileItems,
        includes: &mut Vec<KdlNode>,
    ) {
        for node in doc.nodes() {
            let v = View::of(node, self.text());
            match v.name {
                "include" => includes.push(node.clone()),
                "suite" => self.suite(&v, items),
                "agent" => items.agents.extend(self.agent(&v)),
                "persona" => items.personas.extend(self.persona(&v)),
                "tool" => items.tools.extend(self.tool(&v)),
                "provider" => items.providers.extend(self.provider(&v)),
                "simulator" => items.simulators.extend(self.simulator(&v)),
                "judge" => items.judges.extend(self.judge(&v)),
                "panel" => items.panels.extend(self.panel(&v)),
                "dataset" => items.datasets.extend(self.dataset(&v)),
                "scenario" => items
                    .scenarios
                    .extend(self.scenario(&v).map(std::sync::Arc::new)),
                other => {
                    let known = lang::top_level().iter().map(|s| s.name);
                    self.unknown_node(other, v.name_span, "a suite file", known);
                    self.misspelled_definition(other, &v);
                    self.check_as_meant(other, &v);
                    // `inclde "shared.kdl"`: the file is loaded as it was meant to be, so
                    // that its definitions are known and the other errors are all said now.
                    if crate::diagnostics::did_you_mean(other, ["include"]).is_some() {
                        includes.push(node.clone());
                    }
                }
            }
        }
    }

    /// A top-level node a typo away from a declaration (`scenaro "s" { … }`) has its body
    /// checked as that declaration, so that the mistakes inside it are reported with the
    /// typo, all at once, not one save later; what it decodes to is dropped (the file has
    /// an error, and nothing runs).
    fn check_as_meant(&mut self, name: &str, v: &View) {
        let meant = crate::diagnostics::did_you_mean(
            name,
            [
                "scenario",
                "agent",
                "persona",
                "tool",
                "provider",
                "simulator",
                "judge",
                "panel",
            ],
        );
        match meant {
            Some("scenario") => drop(self.scenario(v)),
            Some("agent") => drop(self.agent(v)),
            Some("persona") => drop(self.persona(v)),
            Some("tool") => drop(self.tool(v)),
            Some("provider") => drop(self.provider(v)),
            Some("simulator") => drop(self.simulator(v)),
            Some("judge") => drop(self.judge(v)),
            Some("panel") => drop(self.panel(v)),
            _ => {}
        }
    }

    /// A top-level node misspelling a definition (`agnt "demo"`, `incude "…"`) is one
    /// mistake, reported as an unknown node: what it meant to define is declared, so that its
    /// uses are not also reported undefined (before the typo, as they sort), as for a
    /// definition with errors of its own; a misspelled `include` is loaded as one.
    fn misspelled_definition(&mut self, name: &str, v: &View) {
        let meant = crate::diagnostics::did_you_mean(
            name,
            [
                "agent", "persona", "tool", "provider", "judge", "panel", "dataset", "include",
            ],
        );
        let id = v.args.first().and_then(|a| a.value().as_string());
        let kind = match meant {
            // Loaded as an include (`nodes`): a missing file makes the definitions unknown
            // there, as for any include.
            Some("include") => return,
            Some("agent") => RefKind::Agent,
            Some("persona") => RefKind::Persona,
            Some("tool") => RefKind::Tool,
            Some("provider") => RefKind::Provider,
            Some("judge" | "panel") => RefKind::Judge,
            Some("dataset") => RefKind::Dataset,
            _ => return,
        };
        if let Some(id) = id {
            self.info.declare(kind, id);
        }
    }

    pub(super) fn suite(&mut self, v: &View, items: &mut FileItems) {
        let usage = "suite \"NAME\" { description \"…\"; tags \"…\" }";
        let Some(name) = self.id_arg(v, "a name", usage) else {
            return;
        };
        self.check_args_of(v, &lang::decls::SUITE, usage);
        let s = self.settings_of(v, &lang::decls::SUITE, "`suite`", &[]);
        let description = self.s_string(&s, "description");
        let tags = self.s_strings(&s, "tags");
        if let Some((_, first, _, _)) = &items.suite {
            let p = check::set_twice(check::Twice {
                message: "a file holds one `suite` node".into(),
                again: (v.name_span, "second `suite`"),
                first: (first.span, "first `suite`"),
                help: "one file is one suite; move the scenarios to another file",
            });
            self.problem(p);
            return;
        }
        items.suite = Some((name.value, name.span, description, tags));
    }
}

impl<'f> Decoder<'f> {
    pub(super) fn persona(&mut self, v: &View) -> Option<Persona> {
        let usage = "persona \"ID\" type=\"…\" { description \"…\"; instructions \"…\" }";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args_of(v, &lang::decls::PERSONA, usage);
        Some(self.persona_body(v, id))
    }

    /// A persona's `description` and `instructions`, and those of them written as templates.
    pub(super) fn persona_texts(
        &mut self,
        s: &Settings,
    ) -> (Option<String>, Option<String>, Vec<Template>) {
        let description = self.s_string(s, "description");
        let instructions = self.s_string(s, "instructions");
        let mut templates = Vec::new();
        for (name, text) in [
            ("description", &description),
            ("instructions", &instructions),
        ] {
            if let (Some(text), Some(e)) = (text, s.value(name))
                && crate::template::is_template(text)
            {
                templates.push(Template {
                    source: text.clone(),
                    span: self.span(value_span(e)),
                });
            }
        }
        (description, instructions, templates)
    }

    pub(super) fn persona_body(&mut self, v: &View, id: Spanned<String>) -> Persona {
        let s = self.settings_of(v, &lang::decls::PERSONA, "`persona`", &[]);
        let kind = self
            .s_string(&s, "type")
            .unwrap_or_else(|| id.value.clone());
        let (description, instructions, templates) = self.persona_texts(&s);
        Persona {
            description,
            instructions,
            templates,
            kind,
            id,
            span: self.span(v.span),
        }
    }
}

impl<'f> Decoder<'f> {
    pub(super) fn provider(&mut self, v: &View) -> Option<Provider> {
        let usage = "provider \"ID\" kind=\"openai\" model=\"…\" api-key-env=\"OPENAI_API_KEY\"";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args_of(v, &lang::decls::PROVIDER, usage);
        let s = self.settings_of(v, &lang::decls::PROVIDER, "`provider`", &[]);
        let kind = match s.value("kind") {
            Some(e) => self.choice(
                e,
                "provider kind",
                &[
                    ("openai", ProviderKind::OpenAi),
                    ("anthropic", ProviderKind::Anthropic),
                ],
            ),
            None => {
                self.missing(v, "`kind=…`", usage);
                None
            }
        };
        let base_url = self.s_string(&s, "base-url");
        let model = self.s_string(&s, "model");
        let api_key_env = self.s_string(&s, "api-key-env");
        if let (Some(e), Some(url)) = (s.value("base-url"), &base_url) {
            let problem = if crate::template::is_template(url) {
                Some((
                    "a provider's base URL is not a template".to_owned(),
                    "write it whole, e.g. base-url=\"http://127.0.0.1:8080/v1\"; only an \
                     agent's `url` or `base-url` may read `env`",
                ))
            } else {
                super::values::url_problem(url)
                    .map(|why| (why, "e.g. base-url=\"http://127.0.0.1:8080/v1\""))
            };
            if let Some((why, help)) = problem {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("provider base URL `{url}`: {why}"),
                        value_span(e),
                        "this URL",
                    )
                    .with_help(help);
                self.report(d);
            }
        }
        if let (Some(e), Some(var)) = (s.value("api-key-env"), &api_key_env)
            && !is_env_var_name(var)
        {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    "`api-key-env` takes the name of an environment variable, not a key"
                        .to_string(),
                    value_span(e),
                    "not a variable name",
                )
                .with_help(
                    "write the variable's name, never the key: api-key-env=\"OPENAI_API_KEY\"",
                );
            self.report(d);
        }
        let api_key_header = self.s_string(&s, "api-key-header");
        if let (Some(e), Some(name)) = (s.value("api-key-header"), &api_key_header) {
            if !is_header_name(name) {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("`{name}` is not an HTTP header name"),
                        value_span(e),
                        "not a header name",
                    )
                    .with_help("e.g. api-key-header=\"api-key\" (Azure OpenAI)");
                self.report(d);
            } else if api_key_env.is_none() {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "`api-key-header` names where the key goes, but no key is read".to_string(),
                        value_span(e),
                        "no `api-key-env` beside it",
                    )
                    .with_help(format!(
                        "add the variable holding the key: api-key-env=\"AZURE_OPENAI_API_KEY\" \
                         api-key-header=\"{name}\""
                    ));
                self.report(d);
            }
        }
        let temperature = self.s_number(&s, "temperature", (0.0, 2.0));
        let max_tokens = s.value("max-tokens").and_then(|e| self.u32(e, 1));
        let headers = self.headers(
            &s,
            "header \"NAME\" \"VALUE\"; secrets belong in `api-key-env`",
            |d, e| {
                let text = d.string(e)?;
                // Sent as written: a template here would reach the server as its text (and
                // a key read from `env` belongs in `api-key-env`, where it is redacted).
                if text.contains("{{") || text.contains("{%") {
                    let diag = d
                        .diag(
                            Kind::InvalidValue,
                            "a provider's header is sent as written, not rendered as a template"
                                .to_string(),
                            value_span(e),
                            "sent as this text",
                        )
                        .with_help(
                            "read a key with api-key-env=\"VAR\", and add api-key-header=\"NAME\" \
                             when it goes in another header than the API's own (Azure OpenAI: \
                             api-key-header=\"api-key\")",
                        );
                    d.report(diag);
                    return None;
                }
                Some(text)
            },
            String::as_str,
        );
        let timeout = s.value("timeout").and_then(|e| self.timeout(e));
        let retries = s.value("retries").and_then(|e| self.u32(e, 0));
        let concurrency = s
            .value("concurrency")
            .and_then(|e| self.u32(e, 1))
            .and_then(|c| usize::try_from(c).ok());
        let requests_per_minute = s.value("requests-per-minute").and_then(|e| self.u32(e, 1));
        let tokens_per_minute = s.value("tokens-per-minute").and_then(|e| self.u32(e, 1));
        let per_shard = s
            .value("per-shard")
            .and_then(|e| self.boolean(e))
            .unwrap_or(false);
        let input_price = self.s_number(&s, "input-price", (0.0, 1_000_000.0));
        let output_price = self.s_number(&s, "output-price", (0.0, 1_000_000.0));
        let Some(kind) = kind else {
            self.info.declare(RefKind::Provider, &id.value);
            return None;
        };
        let api_key_env = api_key_env
            .zip(s.value("api-key-env"))
            .map(|(var, e)| Spanned::new(var, self.span(value_span(e))));
        Some(Provider {
            id,
            kind,
            base_url,
            model,
            api_key_env,
            api_key_header,
            temperature,
            max_tokens,
            headers,
            timeout,
            retries,
            concurrency,
            requests_per_minute,
            tokens_per_minute,
            per_shard,
            input_price,
            output_price,
            span: self.span(v.span),
        })
    }

    /// The project's `simulator`: `provider` is required.
    pub(super) fn simulator(&mut self, v: &View) -> Option<Simulator> {
        let usage = "simulator provider=\"ID\" model=\"…\" temperature=0.7";
        let s = self.simulator_settings(v, usage);
        if s.provider.is_none() {
            self.missing(v, "`provider=…`", usage);
            return None;
        }
        Some(s)
    }

    pub(super) fn simulator_settings(&mut self, v: &View, usage: &str) -> Simulator {
        self.check_args_of(v, &lang::decls::SIMULATOR, usage);
        let s = self.settings_of(v, &lang::decls::SIMULATOR, "`simulator`", &[]);
        Simulator {
            provider: self.s_spanned(&s, "provider"),
            model: self.s_string(&s, "model"),
            temperature: self.s_number(&s, "temperature", (0.0, 2.0)),
            instructions: self.s_template(&s, "instructions"),
            system_prompt: self.s_template(&s, "system-prompt"),
            opening_prompt: self.s_template(&s, "opening-prompt"),
            retry_prompt: self.s_template(&s, "retry-prompt"),
            fidelity: s.value("fidelity").and_then(|e| self.boolean(e)),
            retries_invalid: s.value("retries-invalid").and_then(|e| self.u32(e, 0)),
            outer: None,
            span: self.span(v.span),
        }
    }

    /// A `simulator` inside a scenario or a branch: a layer over the enclosing simulator for
    /// the `simulate` steps there. Every setting is optional; without `provider` it keeps the
    /// enclosing provider, so a branch can add only `instructions` or a prompt.
    pub(super) fn nested_simulator(&mut self, v: &View) -> Option<Simulator> {
        let usage = "simulator provider=\"ID\" model=\"…\" temperature=0.7 instructions=\"…\"";
        Some(self.simulator_settings(v, usage))
    }

    pub(super) fn panel(&mut self, v: &View) -> Option<Panel> {
        let usage = "panel \"ID\" consensus=\"majority\" { judges \"A\" \"B\" \"C\" }";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args_of(v, &lang::decls::PANEL, usage);
        let s = self.settings_of(v, &lang::decls::PANEL, "`panel`", &[]);
        let consensus = match s.value("consensus") {
            Some(e) => self.choice(e, "consensus", &Consensus::ALL),
            None => Some(Consensus::default()),
        };
        let mut judges = Vec::new();
        if let Some(set) = s.get("judges") {
            for e in set.values.clone() {
                if let Some(j) = self.spanned_string(e) {
                    judges.push(j);
                }
            }
        }
        if judges.is_empty() {
            self.missing(v, "`judges \"A\" \"B\"…`", usage);
        }
        // Declared even when broken, so criteria naming it are not reported again.
        self.info.declare(RefKind::Judge, &id.value);
        // A `consensus` that is not one (said already, so nothing runs) leaves the panel in
        // for its members to be checked too, instead of only once it is fixed.
        let consensus = consensus.unwrap_or_default();
        (!judges.is_empty()).then(|| Panel {
            id,
            judges,
            consensus,
            span: self.span(v.span),
        })
    }

    pub(super) fn judge(&mut self, v: &View) -> Option<Judge> {
        let usage = "judge \"ID\" provider=\"ID\" model=\"…\" threshold=0.7";
        let id = self.id_arg(v, "an id", usage)?;
        self.check_args_of(v, &lang::decls::JUDGE, usage);
        let s = self.settings_of(v, &lang::decls::JUDGE, "`judge`", &[]);
        let provider = self.s_required_spanned(v, &s, "provider", usage);
        let model = self.s_string(&s, "model");
        let temperature = self.s_number(&s, "temperature", (0.0, 2.0));
        let rubric = s.value("rubric").and_then(|e| {
            let rubric = self.rubric(e)?;
            // A judge serves every scenario: there is no one scope to render it in, and its
            // text would reach the judge with the braces in it.
            if crate::template::is_template(&rubric) {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "a judge's default rubric is not a template",
                        value_span(e),
                        "template syntax here",
                    )
                    .with_help(
                        "write it as plain text; a rubric that reads the conversation's values \
                         belongs on the check (`judge \"…\" rubric=\"…\"`) or on the scenario \
                         (`criteria-override \"…\"`), where it is rendered in their scope",
                    );
                self.report(d);
                return None;
            }
            Some(rubric)
        });
        let threshold = self.s_number(&s, "threshold", (0.0, 1.0));
        let Some(provider) = provider else {
            self.info.declare(RefKind::Judge, &id.value);
            return None;
        };
        Some(Judge {
            id,
            provider,
            model,
            temperature,
            rubric,
            threshold,
            span: self.span(v.span),
        })
    }
}

/// A portable environment variable name: `[A-Za-z_][A-Za-z0-9_]*`. Anything else written as
/// `api-key-env` is most likely the key itself.
pub(super) fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl<'f> Decoder<'f> {
    /// `dataset ID path=… limit=N sample=N seed=N filter="…"`; the file is read once every
    /// file is decoded (`crate::expand`), when the scenarios that use it are known.
    pub(super) fn dataset(&mut self, v: &View) -> Option<Dataset> {
        let usage = "dataset \"ID\" path=\"data/cases.csv\"";
        let id = self.id_arg(v, "an id", usage)?;
        self.check(v, &lang::decls::DATASET, usage);
        // Known, though broken: its error is its own, not also "undefined dataset" at each
        // `for-each` that names it.
        let Some(path_entry) = v.prop("path") else {
            self.info.declare(RefKind::Dataset, &id.value);
            self.missing(v, "`path=…`", usage);
            return None;
        };
        let Some(path) = self.spanned_string(path_entry) else {
            self.info.declare(RefKind::Dataset, &id.value);
            return None;
        };
        let dir = self
            .files
            .get(self.file)
            .and_then(|f| f.path.parent())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let resolved = normalize(&dir.join(&path.value));
        let count = |d: &mut Self, name: &str| {
            v.prop(name)
                .and_then(|e| d.integer(e, 1, i128::from(u32::MAX)))
                .and_then(|n| usize::try_from(n).ok())
        };
        let limit = count(self, "limit");
        let sample = count(self, "sample");
        let seed = v
            .prop("seed")
            .and_then(|e| self.integer(e, 0, i128::from(u64::MAX)))
            .and_then(|n| u64::try_from(n).ok());
        if let (Some(e), None) = (v.prop("seed"), v.prop("sample")) {
            let d = self
                .diag(
                    Kind::InvalidValue,
                    "`seed` without `sample`",
                    e.span(),
                    "seeds nothing",
                )
                .with_help(
                    "`seed` chooses which rows `sample=N` keeps; add `sample=N` or remove it",
                );
            self.report(d);
        }
        let filter = v.prop("filter").and_then(|e| self.template(e));
        Some(Dataset {
            id,
            path,
            resolved,
            limit,
            sample,
            seed: seed.unwrap_or(0),
            filter,
            span: self.span(v.span),
        })
    }
}
