//! Decoding steps (`user`, `simulate`, `call`, `hitl`, `expect`, `capture`) and `branch`
//! groups into forks.

use super::*;

impl<'f> Decoder<'f> {
    // ----- steps

    /// Decodes a block of steps; returns them and whether a turn has been taken at its end.
    pub(super) fn steps(
        &mut self,
        nodes: &[&KdlNode],
        mut has_turn: bool,
        st: &mut ScenarioState,
    ) -> (Vec<Step>, bool) {
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(node) = nodes.get(i) {
            if node.name().value() != "branch" {
                let v = View::of(node, self.text());
                if let Some(step) = self.step(&v, &mut has_turn, st) {
                    out.push(step);
                }
                i += 1;
                continue;
            }
            let group: Vec<&KdlNode> = nodes[i..]
                .iter()
                .take_while(|n| n.name().value() == "branch")
                .copied()
                .collect();
            i += group.len();
            let mut branches = Vec::new();
            let mut all_turn = true;
            let mut start = usize::MAX;
            let mut end = 0;
            for b in group {
                let v = View::of(b, self.text());
                start = start.min(v.span.offset());
                end = end.max(v.span.offset() + v.span.len());
                let usage = "branch \"NAME\" { steps… }";
                let name = self
                    .id_arg(&v, "a name", usage)
                    .filter(|name| self.branch_name_ok(name));
                self.check_entries(&v, &lang::steps::BRANCH, usage);
                let mut inner = Vec::new();
                let mut simulator = None;
                let mut persona = None;
                // Where each of the branch's two settings was first written: a second one
                // replaced the first without a word.
                let mut settings: HashMap<&str, SourceSpan> = HashMap::new();
                for child in v.children.map(|c| c.nodes()).unwrap_or_default() {
                    let name = child.name().value();
                    if lang::steps::STEPS.iter().any(|s| s.name == name) {
                        inner.push(child);
                        continue;
                    }
                    let cv = View::of(child, self.text());
                    if matches!(name, "simulator" | "persona") {
                        if let Some(first) = settings.get(name) {
                            let p =
                                check::setting_twice(name, " in this branch", cv.name_span, *first);
                            self.problem(p);
                            continue;
                        }
                        settings.insert(cv.name, cv.name_span);
                    }
                    match name {
                        "simulator" => simulator = self.nested_simulator(&cv),
                        "persona" => persona = self.persona_ref(&cv),
                        _ => self.unknown_node(
                            cv.name,
                            cv.name_span,
                            "a `branch`",
                            lang::steps::STEPS
                                .iter()
                                .map(|s| s.name)
                                .chain(["persona", "simulator"]),
                        ),
                    }
                }
                let (mut steps, turn) = self.steps(&inner, has_turn, st);
                let unplayed = |name| (name, settings.get(name).copied());
                if let Some(simulator) = simulator {
                    let simulator = std::sync::Arc::new(simulator);
                    if !assign_simulator(&mut steps, &simulator) {
                        self.info.unused_simulators.push((*simulator).clone());
                        self.unplayed(unplayed("simulator"));
                    }
                }
                if let Some(persona) = persona {
                    let persona = std::sync::Arc::new(persona);
                    if !assign_persona(&mut steps, &persona) {
                        self.info.unused_personas.push(persona);
                        self.unplayed(unplayed("persona"));
                    }
                }
                all_turn &= turn;
                if let Some(name) = name {
                    branches.push(Branch { name, steps });
                }
            }
            has_turn = all_turn;
            if !branches.is_empty() {
                out.push(Step {
                    kind: StepKind::Fork(branches),
                    span: self.span(SourceSpan::from(start..end.max(start))),
                });
            }
        }
        (out, has_turn)
    }

    pub(super) fn step(
        &mut self,
        v: &View,
        has_turn: &mut bool,
        st: &mut ScenarioState,
    ) -> Option<Step> {
        let span = self.span(v.span);
        let kind = match v.name {
            "user" => {
                *has_turn = true;
                let e = self.single(v, &lang::steps::USER, "user \"MESSAGE\"")?;
                StepKind::User(self.template(e)?)
            }
            "simulate" => {
                *has_turn = true;
                self.simulate(v)?
            }
            "attack" => {
                *has_turn = true;
                self.attack(v)?
            }
            "call" => {
                *has_turn = true;
                let usage = "call \"FUNCTION\" \"INPUT\"";
                self.check(v, &lang::steps::CALL, usage);
                let (Some(f), Some(input)) = (v.args.first(), v.args.get(1)) else {
                    self.missing(v, "a function and an input", usage);
                    return None;
                };
                let (f, input) = (*f, *input);
                StepKind::Call {
                    function: self.string(f)?,
                    input: self.template(input)?,
                }
            }
            "hitl" => {
                // Answering a pause is not an agent turn: an `expect` after it would have
                // nothing to look at.
                let usage = "hitl approve message=\"…\"";
                self.check(v, &lang::steps::HITL, usage);
                let Some(e) = v.args.first() else {
                    self.missing(v, "`approve` or `reject`", usage);
                    return None;
                };
                let approve =
                    self.choice(e, "hitl answer", &[("approve", true), ("reject", false)]);
                let message = v.prop("message").and_then(|e| self.template(e));
                StepKind::Hitl {
                    approve: approve?,
                    message,
                }
            }
            "expect" => {
                self.no_turn_check(v, *has_turn);
                StepKind::Expect(self.expect(v)?)
            }
            "capture" => {
                self.no_turn_check(v, *has_turn);
                self.capture(v, st)?
            }
            _ => return None,
        };
        Some(Step { kind, span })
    }

    pub(super) fn no_turn_check(&mut self, v: &View, has_turn: bool) {
        if !has_turn {
            let d = self
                .diag(
                    Kind::NoTurnYet,
                    format!("`{}` before any agent turn", v.name),
                    v.name_span,
                    "no turn has been taken yet",
                )
                .with_help(format!(
                    "`{}` looks at the last reply; put a `user`, `simulate` or `call` step (or `initial-message`) before it",
                    v.name
                ));
            self.report(d);
        }
    }

    pub(super) fn attack(&mut self, v: &View) -> Option<StepKind> {
        let usage = "attack goal=\"…\" width=3 keep=2 depth=3 { judge \"…\" }";
        self.check_args_of(v, &lang::steps::ATTACK, usage);
        let s = self.settings_of(v, &lang::steps::ATTACK, "`attack`", &[]);
        if s.get("goal").is_none() {
            self.missing(v, "`goal=…`", usage);
            return None;
        }
        let goal = self.s_string(&s, "goal")?;
        let count = |this: &mut Self, name: &str, default: u32| {
            s.value(name)
                .map_or(Some(default), |e| this.u32(e, 1))
                .unwrap_or(default)
        };
        Some(StepKind::Attack(std::sync::Arc::new(
            crate::model::Attack {
                goal,
                judge: self.s_string(&s, "judge"),
                width: count(self, "width", crate::model::Attack::DEFAULT_WIDTH),
                keep: count(self, "keep", crate::model::Attack::DEFAULT_KEEP),
                depth: count(self, "depth", crate::model::Attack::DEFAULT_DEPTH),
                attacker: self.s_spanned(&s, "attacker"),
            },
        )))
    }

    pub(super) fn simulate(&mut self, v: &View) -> Option<StepKind> {
        let usage = "simulate turns=3` or `simulate until-done";
        self.check(v, &lang::steps::SIMULATE, usage);
        let turns = v.prop("turns");
        match (v.args.first(), turns) {
            (Some(a), Some(t)) => {
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`simulate` takes either `turns=N` or `until-done`",
                        a.span(),
                        "remove this",
                    )
                    .with_label(t.span(), "or this")
                    .with_help(format!("write `{usage}`"));
                self.report(d);
                None
            }
            (Some(a), None) => {
                if a.value().as_string() == Some("until-done") {
                    Some(StepKind::Simulate {
                        turns: None,
                        simulator: None,
                        persona: None,
                    })
                } else {
                    let help = match a.value().as_string() {
                        Some(s) if did_you_mean(s, ["until-done"]).is_some() => {
                            "did you mean `until-done`?".to_string()
                        }
                        _ => format!("write `{usage}`"),
                    };
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            "invalid `simulate` argument",
                            a.span(),
                            "expected `until-done`",
                        )
                        .with_help(help);
                    self.report(d);
                    None
                }
            }
            (None, Some(t)) => self.u32(t, 1).map(|n| StepKind::Simulate {
                turns: Some(n),
                simulator: None,
                persona: None,
            }),
            (None, None) => Some(StepKind::Simulate {
                turns: None,
                simulator: None,
                persona: None,
            }),
        }
    }

    /// Records a branch's `simulator` or `persona` (by its name's span) as played by no
    /// step: [`crate::model::Project::unplayed`].
    fn unplayed(&mut self, (name, at): (&'static str, Option<SourceSpan>)) {
        if let Some(at) = at {
            let span = self.span(at);
            self.info.unplayed.push(Spanned::new(name, span));
        }
    }

    pub(super) fn capture(&mut self, v: &View, st: &mut ScenarioState) -> Option<StepKind> {
        let usage = "capture \"NAME\" regex=#\"…\"#` or `capture \"NAME\" json-path=\"$.a\"";
        let name = self.id_arg(v, "a name", usage)?;
        self.check(v, &lang::steps::CAPTURE, usage);
        let source = match (v.prop("regex"), v.prop("json-path")) {
            (Some(r), None) => self.regex(r).map(CaptureSource::Regex),
            (None, Some(p)) => self.json_path(p),
            (Some(r), Some(p)) => {
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`capture` takes either `regex=` or `json-path=`",
                        p.span(),
                        "second source",
                    )
                    .with_label(r.span(), "first source")
                    .with_help("keep one of them");
                self.report(d);
                None
            }
            (None, None) => {
                // A misspelt source is already reported as an unknown property.
                if v.props.is_empty() {
                    self.missing(v, "`regex=…` or `json-path=…`", usage);
                }
                None
            }
        };
        match source {
            Some(source) => Some(StepKind::Capture {
                name: name.value,
                source,
            }),
            None => {
                st.failed_captures
                    .entry(name.value)
                    .or_insert(v.span.offset());
                None
            }
        }
    }

    pub(super) fn json_path(&mut self, e: &KdlEntry) -> Option<CaptureSource> {
        let (path, source) = self.json_path_value(e, "\"$.booking.id\" or \"$.items[0].price\"")?;
        Some(CaptureSource::JsonPath { path, source })
    }

    pub(super) fn expect(&mut self, v: &View) -> Option<Vec<Criterion>> {
        let usage = "expect reply contains=\"…\"` or `expect { … }";
        match (v.args.is_empty(), v.children) {
            // An empty block checks nothing, as a bare `expect` does.
            (true, None) => {
                self.missing(v, "a criterion", usage);
                None
            }
            (true, Some(children)) if children.nodes().is_empty() => {
                self.missing(v, "a criterion", usage);
                None
            }
            (false, Some(children)) => {
                let d = self
                    .diag(
                        Kind::UnexpectedArgument,
                        "`expect` takes either an inline criterion or a block",
                        trim_span(self.text(), children.span()),
                        "block after an inline criterion",
                    )
                    .with_help(format!("write `{usage}`"));
                self.report(d);
                None
            }
            (true, Some(children)) => {
                self.check_props_of(v, &lang::steps::EXPECT);
                let mut out = Vec::new();
                for child in children.nodes() {
                    let cv = View::of(child, self.text());
                    if let Some(c) = self.criterion(&cv, "an `expect` block") {
                        out.push(c);
                    }
                }
                Some(out)
            }
            (false, None) => {
                let Some((inner, first)) = v.shifted() else {
                    if let Some(first) = v.args.first() {
                        self.wrong_type(
                            first,
                            "a criterion name",
                            "write e.g. `expect reply contains=\"…\"`",
                        );
                    }
                    return None;
                };
                let _ = first;
                self.criterion(&inner, "`expect`").map(|c| vec![c])
            }
        }
    }
}
