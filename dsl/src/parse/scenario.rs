//! Decoding `scenario` nodes: their settings, `user-context`/`initial-state` objects, inline
//! personas and tools; steps and criteria are in their own modules.

use super::*;

/// Per-scenario decoding state.
pub(super) struct ScenarioState {
    /// Singular nodes already seen, for duplicate reports.
    pub(super) seen: HashMap<&'static str, SourceSpan>,
    /// Captures that failed to decode, each with the offset of its first `capture` node: a
    /// template after it does not report the name again (its own error is said), one
    /// before it still reads the name as not yet captured.
    pub(super) failed_captures: HashMap<String, usize>,
}

impl<'f> Decoder<'f> {
    pub(super) fn scenario(&mut self, v: &View) -> Option<Scenario> {
        let usage = "scenario \"ID\" { … }";
        let (id, has_id) = self.id_or_stand_in(v, "an id", usage);
        let scenario = self.scenario_body(v, id, has_id, usage);
        scenario.filter(|_| has_id)
    }

    fn scenario_body(
        &mut self,
        v: &View,
        id: Spanned<String>,
        has_id: bool,
        usage: &str,
    ) -> Option<Scenario> {
        self.check_entries(v, &lang::scenario::SCENARIO, usage);
        if has_id {
            self.scenario_id_ok(&id);
        }
        let mut sc = Scenario {
            id: id.clone(),
            name: None,
            description: None,
            difficulty: Difficulty::default(),
            tags: Vec::new(),
            status: Status::default(),
            agents: Vec::new(),
            persona: None,
            user_context: Map::new(),
            initial_state: Map::new(),
            undeclared_tools: UndeclaredTools::default(),
            tools: Vec::new(),
            max_turns: None,
            stop_on_failure: false,
            agent_branches: AgentBranches::default(),
            outcomes: Vec::new(),
            expect_tools: Vec::new(),
            criteria_override: None,
            test_case_id: None,
            repeat: 1,
            needs: Vec::new(),
            timeout: None,
            first_turn: FirstTurn::default(),
            steps: Default::default(),
            criteria: Default::default(),
            // A misspelt `foreach=` is reported as an unknown property, with the spelling
            // meant, and read as meant: its `row-id` and `row.*` are then checked against its
            // dataset, rather than each reported as reading no dataset (three errors for one
            // slip).
            for_each: v
                .prop("for-each")
                .or_else(|| {
                    v.props.iter().rev().copied().find(|e| {
                        e.name().is_some_and(|n| {
                            crate::diagnostics::did_you_mean(n.value(), ["for-each"]).is_some()
                        })
                    })
                })
                .and_then(|e| self.spanned_string(e))
                .map(Box::new),
            row_id: None,
            matrix: Vec::new(),
            instance: None,
            history: None,
            span: self.span(v.span),
        };
        let mut st = ScenarioState {
            seen: HashMap::new(),
            failed_captures: HashMap::new(),
        };
        let mut initial: Option<Step> = None;
        let mut scenario_simulator: Option<(Simulator, SourceSpan)> = None;
        let mut has_initial = false;
        let mut step_nodes: Vec<&KdlNode> = Vec::new();
        let mut typo_first_turn = false;
        let nodes = v.children.map(|c| c.nodes()).unwrap_or_default();
        for node in nodes {
            let cv = View::of(node, self.text());
            let name = cv.name;
            if lang::steps::STEPS.iter().any(|s| s.name == name) {
                step_nodes.push(node);
                continue;
            }
            let twice = format!(" in scenario `{}`", id.value);
            let mut found = Vec::new();
            let spec = check::check_child(
                &lang::scenario::SCENARIO,
                name,
                cv.name_span,
                "a `scenario`",
                &twice,
                &mut st.seen,
                &mut |p| found.push(p),
            );
            for p in found {
                self.problem(p);
            }
            let Some(spec) = spec else {
                // `usr "hi"` first: reported above as a typo of `user`; the `expect`s after
                // it are not also told that no turn was taken.
                if step_nodes.is_empty()
                    && crate::diagnostics::did_you_mean(name, ["user", "simulate", "call"])
                        .is_some()
                {
                    typo_first_turn = true;
                }
                // `critera { … }`: its checks are checked as they would be once the name is
                // fixed, so that one save shows every mistake in them too.
                if crate::diagnostics::did_you_mean(name, ["criteria"]).is_some() {
                    for child in cv.children.map(|c| c.nodes()).unwrap_or_default() {
                        let ccv = View::of(child, self.text());
                        let _ = self.criterion(&ccv, "`criteria`");
                    }
                }
                continue;
            };
            let key = spec.name;
            match key {
                "name" => {
                    sc.name = self
                        .single(&cv, spec, "name \"…\"")
                        .and_then(|e| self.string(e))
                }
                "description" => {
                    sc.description = self
                        .single(&cv, spec, "description \"…\"")
                        .and_then(|e| self.string(e))
                }
                "criteria-override" => {
                    // A rubric like `rubric=`: a near miss of a built-in one is an error.
                    sc.criteria_override = self
                        .single(&cv, spec, "criteria-override \"…\"")
                        .and_then(|e| {
                            self.rubric(e)?;
                            self.spanned_string(e)
                        })
                }
                "test-case-id" => {
                    sc.test_case_id = self
                        .single(&cv, spec, "test-case-id \"…\"")
                        .and_then(|e| self.spanned_string(e))
                }
                "difficulty" => {
                    if let Some(d) = self
                        .single(&cv, spec, "difficulty \"normal\"")
                        .and_then(|e| {
                            self.choice(
                                e,
                                "difficulty",
                                &[("normal", Difficulty::Normal), ("hard", Difficulty::Hard)],
                            )
                        })
                    {
                        sc.difficulty = d;
                    }
                }
                "status" => {
                    if let Some(s) = self.single(&cv, spec, "status \"active\"").and_then(|e| {
                        self.choice(
                            e,
                            "status",
                            &[
                                ("active", Status::Active),
                                ("draft", Status::Draft),
                                ("archived", Status::Archived),
                            ],
                        )
                    }) {
                        sc.status = s;
                    }
                }
                "tags" => sc.tags = self.strings(&cv, spec, "tags \"…\" \"…\""),
                "persona" => sc.persona = self.persona_ref(&cv),
                "initial-message" => {
                    has_initial = true;
                    // It is the first user message: written after a step, the run would
                    // still send it first and the `expect`s written before it would check
                    // the wrong turns.
                    if let Some(first) = step_nodes.first() {
                        let first = View::of(first, self.text());
                        let d = self
                            .diag(
                                Kind::InvalidValue,
                                "`initial-message` must come before the scenario's steps",
                                cv.span,
                                "written after a step",
                            )
                            .with_help(format!(
                                "it is the first user message, sent before any step: move it \
                                 above the first step (`{}`), or write `user \"…\"` here",
                                first.name
                            ));
                        self.report(d);
                    }
                    if let Some(t) = self
                        .single(&cv, spec, "initial-message \"…\"")
                        .and_then(|e| self.template(e))
                    {
                        initial = Some(Step {
                            kind: StepKind::User(t),
                            span: self.span(cv.span),
                        });
                    }
                }
                "user-context" => {
                    if let Some(context) = self.json_object_node(&cv, spec, "user-context") {
                        sc.user_context = context;
                    }
                }
                "initial-state" => {
                    if let Some(state) = self.json_object_node(&cv, spec, "initial-state") {
                        sc.initial_state = state;
                    }
                }
                "undeclared-tools" => {
                    if let Some(u) = self
                        .single(&cv, spec, "undeclared-tools \"error\"")
                        .and_then(|e| self.choice(e, "undeclared-tools", &UndeclaredTools::ALL))
                    {
                        sc.undeclared_tools = u;
                    }
                }
                "max-turns" => {
                    sc.max_turns = self
                        .single(&cv, spec, "max-turns 8")
                        .and_then(|e| self.u32(e, 1))
                }
                "stop-on-failure" => {
                    if let Some(stop) = self
                        .single(&cv, spec, "stop-on-failure #true")
                        .and_then(|e| self.boolean(e))
                    {
                        sc.stop_on_failure = stop;
                    }
                }
                "agent-branches" => {
                    let usage = "agent-branches breadth=5 depth=3";
                    self.check(&cv, spec, usage);
                    if cv.props.is_empty() {
                        self.missing(&cv, "`breadth=` or `depth=`", usage);
                    }
                    if let Some(n) = cv.prop("breadth").and_then(|e| self.u32(e, 1)) {
                        sc.agent_branches.breadth = n;
                    }
                    if let Some(n) = cv.prop("depth").and_then(|e| self.u32(e, 1)) {
                        sc.agent_branches.depth = n;
                    }
                }
                "repeat" => {
                    if let Some(n) = self
                        .single(&cv, spec, "repeat 3")
                        .and_then(|e| self.u32(e, 1))
                    {
                        sc.repeat = n;
                    }
                }
                "timeout" => {
                    sc.timeout = self
                        .single(&cv, spec, "timeout \"2m\"")
                        .and_then(|e| self.timeout(e))
                }
                "simulator" => {
                    scenario_simulator = self.nested_simulator(&cv).map(|s| (s, cv.name_span))
                }
                "first-turn" => {
                    if let Some(t) = self
                        .single(&cv, spec, "first-turn \"agent\"")
                        .and_then(|e| self.choice(e, "first-turn", &FirstTurn::ALL))
                    {
                        sc.first_turn = t;
                    }
                }
                "outcome" => {
                    self.check_block_of(&cv, spec);
                    if let Some(o) = self.outcome(&cv) {
                        sc.outcomes.push(Spanned::new(o, self.span(cv.span)));
                    }
                }
                "tool" => {
                    if let Some(tool) = self.tool(&cv) {
                        self.push_scenario_tool(&mut sc.tools, tool, &id.value);
                    }
                }
                "expect-tool" => {
                    self.check_block_of(&cv, spec);
                    let text = self.criterion_text(&cv);
                    let mut templates = Vec::new();
                    if let Some(kind) = self.tool_criterion(&cv, spec, &mut templates) {
                        sc.expect_tools.push(Criterion {
                            kind,
                            text,
                            templates,
                            span: self.span(cv.span),
                        });
                    }
                }
                "agent" => {
                    // Several ids: the plural is what was meant, and its usage says so.
                    let usage = if cv.args.len() > 1 {
                        "agents \"ID\" \"ID\""
                    } else {
                        "agent \"ID\""
                    };
                    if let Some(e) = self.single(&cv, spec, usage)
                        && let Some(a) = self.spanned_string(e)
                    {
                        self.push_scenario_agent(&mut sc.agents, a);
                    }
                }
                "agents" => {
                    for a in self.spanned_strings(&cv, spec, "agents \"ID\" \"ID\"") {
                        self.push_scenario_agent(&mut sc.agents, a);
                    }
                }
                "needs" => {
                    let mut needs: Vec<Spanned<String>> = Vec::new();
                    for need in self.spanned_strings(&cv, spec, "needs \"SCENARIO\"…") {
                        let message = format!("`{}` is needed twice", need.value);
                        self.push_listed_once(
                            &mut needs,
                            need,
                            message,
                            "list each scenario a scenario needs once",
                        );
                    }
                    sc.needs = needs;
                }
                "row-id" => {
                    sc.row_id = self
                        .single(&cv, spec, "row-id \"{{ row.id }}\"")
                        .and_then(|e| self.template(e))
                        .map(Box::new);
                    if sc.for_each.is_none() {
                        let d = self
                            .diag(
                                Kind::InvalidValue,
                                "`row-id` in a scenario without `for-each`",
                                cv.name_span,
                                "no rows to name",
                            )
                            .with_help(
                                "write `scenario \"ID\" for-each=\"DATASET\"`, or remove `row-id`",
                            );
                        self.report(d);
                    }
                }
                "matrix" => sc.matrix = self.matrix(&cv, spec),
                "history" => {
                    // It opens the trajectory: written after a step, it would read as
                    // happening there, and the run would still send it first.
                    if let Some(first) = step_nodes.first() {
                        let first = View::of(first, self.text());
                        let d = self
                            .diag(
                                Kind::InvalidValue,
                                "`history` must come before the scenario's steps",
                                cv.span,
                                "written after a step",
                            )
                            .with_help(format!(
                                "a history opens every trajectory as if it had happened; \
                                 move it above the first step (`{}`)",
                                first.name
                            ));
                        self.report(d);
                    }
                    sc.history = self.history(&cv, spec).map(Box::new);
                }
                "criteria" => {
                    self.check_entries(&cv, spec, "criteria { CRITERION… }");
                    if cv.children.is_none_or(|c| c.nodes().is_empty()) {
                        // Written to check something; an empty block checks nothing.
                        self.missing(&cv, "a criterion", "criteria { no-error }");
                    }
                    for child in cv.children.map(|c| c.nodes()).unwrap_or_default() {
                        let ccv = View::of(child, self.text());
                        if let Some(c) = self.criterion(&ccv, "`criteria`") {
                            Arc::make_mut(&mut sc.criteria).push(c);
                        }
                    }
                }
                _ => {}
            }
        }
        // With `first-turn "agent"` the agent has spoken before the first step.
        // A `history` may end with a user message the agent answers first.
        let has_turn = has_initial
            || sc.first_turn == FirstTurn::Agent
            || sc.history.is_some()
            || typo_first_turn;
        let (steps, _) = self.steps(&step_nodes, has_turn, &mut st);
        let mut steps: Vec<Step> = initial.into_iter().chain(steps).collect();
        if let Some((simulator, at)) = scenario_simulator {
            let simulator = std::sync::Arc::new(simulator);
            if !assign_simulator(&mut steps, &simulator) {
                self.info.unused_simulators.push((*simulator).clone());
                let span = self.span(at);
                self.info.unplayed.push(Spanned::new("simulator", span));
            }
        }
        if !st.failed_captures.is_empty() {
            self.info
                .failed_captures
                .insert(id.span, st.failed_captures.clone());
        }
        sc.steps = Arc::new(steps);
        sc.shrink_to_fit();
        Some(sc)
    }

    /// `history "TEMPLATE"` or `history path="FILE"` (one of them).
    fn history(&mut self, v: &View, spec: &NodeSpec) -> Option<History> {
        let usage = "history \"{{ row.messages }}\" or history path=\"conversation.json\"";
        self.check(v, spec, usage);
        let source = match (v.args.first(), v.prop("path")) {
            (Some(_), Some(p)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        "`history` takes a template or `path=`, not both",
                        p.span(),
                        "and a path",
                    )
                    .with_help("keep one of them");
                self.report(d);
                return None;
            }
            (Some(e), None) => HistorySource::Template(self.template(e)?),
            (None, Some(p)) => {
                let path = self.spanned_string(p)?;
                let dir = self
                    .files
                    .get(self.file)
                    .and_then(|f| f.path.parent())
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                let resolved = normalize(&dir.join(&path.value));
                HistorySource::File { path, resolved }
            }
            (None, None) => {
                self.missing(v, "a template or `path=…`", usage);
                return None;
            }
        };
        Some(History {
            source,
            messages: None,
            span: self.span(v.span),
        })
    }

    /// `matrix { NAME VALUE…; … }`: each line a variable and its values (typed as written).
    fn matrix(&mut self, v: &View, spec: &NodeSpec) -> Vec<MatrixVar> {
        let usage = "matrix { model \"a\" \"b\"; temperature 0 1 }";
        self.check_entries(v, spec, usage);
        let mut out: Vec<MatrixVar> = Vec::new();
        let Some(children) = v.children else {
            self.missing(v, "a block of `NAME VALUE…` lines", usage);
            return out;
        };
        for node in children.nodes() {
            let cv = View::of(node, self.text());
            self.check_props(&cv, &[], &[]);
            self.check_no_children(&cv);
            if cv.args.is_empty() {
                self.missing(&cv, "one or more values", usage);
                continue;
            }
            if let Some(first) = out.iter().find(|m| m.name.value == cv.name) {
                let p = check::setting_twice(
                    cv.name,
                    " in `matrix`",
                    cv.name_span,
                    first.name.span.span,
                );
                self.problem(p);
                continue;
            }
            let mut values: Vec<Value> = Vec::new();
            // Each value as its instance id writes it, in NFC: looked up, not compared with
            // every earlier value (a matrix of 4,000 values compared 8 million pairs).
            let mut written: std::collections::HashSet<String> = std::collections::HashSet::new();
            for e in cv.args.iter() {
                let Some(value) = self.json(e) else { continue };
                // An instance is named by its values as written in its id (`1` and `"1"`
                // both `n=1`): two that read the same would be one instance, the other
                // never run.
                let shown = crate::expand::display(&value);
                // Said as a row id's are: an id holding them breaks how instances are named
                // and selected (`--filter`, `needs`), and a line break the console's tables.
                if shown.contains(['[', ']', '\n', '\r']) {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!(
                                "matrix value `{}` of `{}` holds `[`, `]` or a line break, \
                                 which instance ids cannot",
                                shown.escape_debug(),
                                cv.name
                            ),
                            value_span(e),
                            "in the instance's id",
                        )
                        .with_help(
                            "each value names its instance (`scenario[NAME=VALUE]`): write it \
                             without them, and map it to the text it stands for in a template \
                             if needed",
                        );
                    self.report(d);
                    continue;
                }
                // In NFC, as ids are compared: `é` precomposed and with a combining accent
                // would be two instances that read the same.
                let nfc: String = {
                    use unicode_normalization::UnicodeNormalization;
                    shown.nfc().collect()
                };
                if !written.insert(nfc) {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!(
                                "matrix value `{shown}` of `{}` is given twice (as the \
                                 instance id writes it)",
                                cv.name
                            ),
                            value_span(e),
                            "the same as an earlier value",
                        )
                        .with_help(
                            "each value makes one instance, named by the value as written: \
                             remove the repeat (`1` and `\"1\"` are both `=1`)",
                        );
                    self.report(d);
                    continue;
                }
                values.push(value);
            }
            out.push(MatrixVar {
                name: Spanned::new(cv.name.to_string(), self.span(cv.name_span)),
                values,
            });
        }
        if out.is_empty() && !children.nodes().is_empty() {
            return out;
        }
        if out.is_empty() {
            self.missing(v, "a `NAME VALUE…` line", usage);
        }
        out
    }

    /// `initial-state { KEY VALUE; … }` (as `user-context`) or `initial-state json=#"{…}"#`
    /// (JSON text, for documents with arrays of objects the block form cannot write).
    pub(super) fn json_object_node(
        &mut self,
        v: &View,
        spec: &NodeSpec,
        node: &str,
    ) -> Option<Map<String, Value>> {
        let usage = format!("{node} {{ KEY VALUE; … }} or {node} json=#\"{{…}}\"#");
        self.check_entries(v, spec, &usage);
        match (v.prop("json"), v.children) {
            (Some(e), Some(children)) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("`{node}` takes `json=` or a block, not both"),
                        trim_span(self.text(), children.span()),
                        "block",
                    )
                    .with_label(e.span(), "JSON text")
                    .with_help("keep one of them");
                self.report(d);
                None
            }
            (Some(e), None) => match self.json_text(e)? {
                Value::Object(map) => Some(map),
                other => {
                    let d = self
                        .diag(
                            Kind::InvalidValue,
                            format!(
                                "the {} must be a JSON object, not {}",
                                node.replace('-', " "),
                                json_kind(&other)
                            ),
                            value_span(e),
                            "not an object",
                        )
                        .with_help("write an object: json=#\"{\"orders\": []}\"#");
                    self.report(d);
                    None
                }
            },
            (None, Some(children)) => Some(self.json_object(children)),
            (None, None) => Some(Map::new()),
        }
    }

    /// One or more string values, checked against `spec`.
    pub(super) fn strings(&mut self, v: &View, spec: &NodeSpec, usage: &str) -> Vec<String> {
        self.spanned_strings(v, spec, usage)
            .into_iter()
            .map(|s| s.value)
            .collect()
    }

    pub(super) fn spanned_strings(
        &mut self,
        v: &View,
        spec: &NodeSpec,
        usage: &str,
    ) -> Vec<Spanned<String>> {
        self.check(v, spec, usage);
        if v.args.is_empty() {
            self.missing(v, "at least one value", usage);
        }
        let mut out = Vec::new();
        for e in v.args.clone() {
            if let Some(s) = self.spanned_string(e) {
                out.push(s);
            }
        }
        out
    }

    pub(super) fn persona_ref(&mut self, v: &View) -> Option<PersonaRef> {
        if v.props.is_empty() && v.children.is_none() {
            let e = self.single(v, &lang::scenario::PERSONA_REF, "persona \"ID\"")?;
            return self.spanned_string(e).map(PersonaRef::Named);
        }
        let usage = "persona type=\"…\" { description \"…\"; instructions \"…\" }";
        if let Some(named) = v.args.first() {
            // `persona "p" type="y"`: a name and an inline description at once.
            let d = self
                .diag(
                    Kind::UnexpectedArgument,
                    "`persona` names a declared persona or describes one inline, not both",
                    named.span(),
                    "a declared persona's name",
                )
                .with_help(format!(
                    "write `persona \"ID\"` alone to play a declared persona, or `{usage}` \
                     without the name"
                ));
            self.report(d);
            return None;
        }
        let s = self.settings_of(v, &lang::scenario::PERSONA_REF, "an inline `persona`", &[]);
        let Some(kind) = self.s_spanned(&s, "type") else {
            if s.get("type").is_none() {
                self.missing(v, "`type=…`", usage);
            }
            return None;
        };
        let (description, instructions, templates) = self.persona_texts(&s);
        Some(PersonaRef::Inline(Box::new(Persona {
            id: kind.clone(),
            kind: kind.value,
            description,
            instructions,
            templates,
            span: self.span(v.span),
        })))
    }

    /// Scenario ids are written `SUITE/ID` from other suites (`needs`, `--filter`, reports), so
    /// an id holding `/` would make such a reference mean two scenarios.
    pub(super) fn scenario_id_ok(&mut self, id: &Spanned<String>) {
        let problem = if id.value.contains('/') {
            "`/` separates the suite from the scenario in `SUITE/ID` references"
        } else if id.value.trim().is_empty() {
            "a scenario needs an id to be referred to and reported"
        } else {
            return;
        };
        let suggestion = id.value.replace('/', "-");
        let help = if id.value.contains('/') {
            format!("{problem}; choose another id, e.g. `{suggestion}`")
        } else {
            format!("{problem}; write `scenario \"ID\"`")
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid scenario id `{}`", id.value),
                id.span.span,
                "this id",
            )
            .with_help(help);
        self.report(d);
    }

    /// Branch names become trajectory names (joined with `/`) and execution node ids, where
    /// `start` and `then` name the segments before and after a fork.
    pub(super) fn branch_name_ok(&mut self, name: &Spanned<String>) -> bool {
        let problem = if name.value.contains('/') {
            Some("`/` separates branch names in trajectory names")
        } else if matches!(name.value.as_str(), "start" | "then") {
            Some("`start` and `then` name the steps before and after a fork")
        } else if name.value.trim().is_empty() {
            Some("a branch needs a name to tell its trajectories apart")
        } else {
            None
        };
        let Some(why) = problem else {
            return true;
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid branch name `{}`", name.value),
                name.span.span,
                "this name",
            )
            .with_help(format!("{why}; choose another name"));
        self.report(d);
        false
    }

    /// Adds a scenario's own `tool`; a name declared twice in one scenario is an error (the
    /// global duplicate check does not see scenario tools).
    pub(super) fn push_scenario_tool(&mut self, tools: &mut Vec<Tool>, tool: Tool, scenario: &str) {
        if let Some(first) = tools.iter().find(|t| t.name.value == tool.name.value) {
            let d = self
                .diag(
                    Kind::DuplicateId,
                    format!(
                        "tool `{}` is declared twice in scenario `{scenario}`",
                        tool.name.value
                    ),
                    tool.name.span.span,
                    "declared again here",
                )
                .with_label(first.name.span.span, "first declared here")
                .with_help("merge the two `tool` nodes into one");
            self.report(d);
            return;
        }
        tools.push(tool);
    }

    /// Adds an agent to a scenario's list; naming one twice would run it twice.
    pub(super) fn push_scenario_agent(
        &mut self,
        agents: &mut Vec<Spanned<String>>,
        agent: Spanned<String>,
    ) {
        let message = format!("agent `{}` is listed twice", agent.value);
        self.push_listed_once(
            agents,
            agent,
            message,
            "list each agent once; `repeat N` runs a scenario several times",
        );
    }

    /// Adds `item` to `list` unless it is there already: then `message` is reported at it,
    /// with `help` (an agent or a need listed twice would count twice).
    fn push_listed_once(
        &mut self,
        list: &mut Vec<Spanned<String>>,
        item: Spanned<String>,
        message: String,
        help: &str,
    ) {
        if let Some(first) = list.iter().find(|a| a.value == item.value) {
            let d = self
                .diag(
                    Kind::DuplicateId,
                    message,
                    item.span.span,
                    "listed again here",
                )
                .with_label(first.span.span, "first listed here")
                .with_help(help);
            self.report(d);
            return;
        }
        list.push(item);
    }

    /// `user-context { … }` children as a JSON object.
    pub(super) fn json_object(&mut self, doc: &KdlDocument) -> Map<String, Value> {
        let mut map = Map::new();
        let mut seen: HashMap<String, SourceSpan> = HashMap::new();
        for node in doc.nodes() {
            let v = View::of(node, self.text());
            let key = v.name.to_string();
            if let Some(first) = seen.get(&key) {
                self.duplicate_key(&key, v.name_span, *first);
                continue;
            }
            seen.insert(key.clone(), v.name_span);
            let value = self.json_node(&v);
            map.insert(key, value);
        }
        map
    }

    pub(super) fn json_node(&mut self, v: &View) -> Value {
        if !v.args.is_empty() && (!v.props.is_empty() || v.children.is_some()) {
            let at = v
                .props
                .first()
                .map(|p| p.span())
                .or_else(|| v.children.map(|c| trim_span(self.text(), c.span())))
                .unwrap_or(v.span);
            let d = self
                .diag(
                    Kind::UnexpectedArgument,
                    format!("`{}` mixes values with an object", v.name),
                    at,
                    "object part",
                )
                .with_help("write either values (KEY \"a\" \"b\") or an object (KEY { k \"v\" } or KEY k=\"v\")");
            self.report(d);
            return Value::Null;
        }
        match v.args.as_slice() {
            [one] => return self.json(one).unwrap_or(Value::Null),
            [] => {}
            many => {
                let many = many.to_vec();
                return Value::Array(many.into_iter().filter_map(|e| self.json(e)).collect());
            }
        }
        if v.props.is_empty() && v.children.is_none() {
            return Value::Null;
        }
        let mut map = Map::new();
        let mut seen: HashMap<String, SourceSpan> = HashMap::new();
        for p in v.props.clone() {
            let key = prop_name(p).to_string();
            if let Some(first) = seen.get(&key) {
                self.duplicate_key(&key, p.span(), *first);
                continue;
            }
            seen.insert(key.clone(), p.span());
            if let Some(val) = self.json(p) {
                map.insert(key, val);
            }
        }
        if let Some(children) = v.children {
            for (key, value) in self.json_object(children) {
                if let Some(first) = seen.get(&key) {
                    let at = children
                        .nodes()
                        .iter()
                        .find(|n| n.name().value() == key)
                        .map_or(v.span, |n| n.name().span());
                    self.duplicate_key(&key, at, *first);
                    continue;
                }
                map.insert(key, value);
            }
        }
        Value::Object(map)
    }

    /// A key of a JSON object written twice (`KEY k=1 k=2`, or as a property and a child):
    /// the last would silently win.
    fn duplicate_key(&mut self, key: &str, again: SourceSpan, first: SourceSpan) {
        let d = self
            .diag(
                Kind::DuplicateId,
                format!("duplicate key `{key}`"),
                again,
                "written again here",
            )
            .with_label(first, "first written here")
            .with_help("each key is written once; several values make an array: KEY \"a\" \"b\"");
        self.report(d);
    }
}

/// Gives `persona` to every `simulate` step of a branch's `steps` (and of their branches)
/// that has none yet: the innermost branch's persona wins.
/// Whether any step took it (or had a persona of its own, an inner branch's: the
/// persona was still written for the branch's `simulate` steps).
pub(super) fn assign_persona(steps: &mut [Step], persona: &std::sync::Arc<PersonaRef>) -> bool {
    let mut taken = false;
    for step in steps {
        match &mut step.kind {
            StepKind::Simulate { persona: slot, .. } => {
                taken = true;
                if slot.is_none() {
                    *slot = Some(persona.clone());
                }
            }
            StepKind::Fork(branches) => {
                for branch in branches {
                    taken |= assign_persona(&mut branch.steps, persona);
                }
            }
            _ => {}
        }
    }
    taken
}

/// Gives `simulator` to every `simulate` step of `steps` (and of their branches): a step that
/// already has one (an inner branch's, assigned first) gets it layered over `simulator`.
/// Whether any step took it.
pub(super) fn assign_simulator(steps: &mut [Step], simulator: &std::sync::Arc<Simulator>) -> bool {
    let mut taken = false;
    for step in steps {
        match &mut step.kind {
            StepKind::Simulate {
                simulator: slot, ..
            } => {
                taken = true;
                *slot = Some(match slot.as_deref() {
                    None => simulator.clone(),
                    Some(inner) => std::sync::Arc::new(inner.over(simulator)),
                })
            }
            StepKind::Fork(branches) => {
                for branch in branches {
                    taken |= assign_simulator(&mut branch.steps, simulator);
                }
            }
            _ => {}
        }
    }
    taken
}
