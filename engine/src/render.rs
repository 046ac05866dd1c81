//! Template rendering (minijinja) for user messages, criterion values and header values.
//!
//! Templates are compiled when the plan is built, so a template that does not compile fails
//! planning, without keeping the compiled form: a compiled template takes ~10 KB, and kept
//! for every template of a plan they were most of what `check` and `list` held on a big suite.
//! A run keeps the templates it renders, up to [`COMPILED_MAX`] of them, and compiles each
//! once: a dataset's instances all render the same `user "{{ row.q }}"`, and an HTTP agent's
//! `request` renders on every turn, each compile about 5,000 instructions (a tenth of the
//! engine's own work on a turn). Plain strings without template syntax skip the template
//! engine entirely, so scripted messages cost nothing per turn.
//! Undefined variables are errors (strict mode): `trellis check` already rejects the ones it
//! can see statically, and whatever remains at run time (an unset `env` variable) must
//! not silently render as an empty string.
//!
//! `env` is an [`EnvSnapshot`] taken once when the plan is built and passed in explicitly:
//! rendering never reads the process environment, which other threads (and tests) may be
//! changing, and a run sees one consistent environment from start to end.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::value::{Object, Serde, Value};
use minijinja::{Environment, UndefinedBehavior};
use trellis_dsl::{CriterionKind, Persona, Scenario, Template, ValueSlot};

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("template `{source_text}`: {error}")]
    Compile {
        source_text: String,
        #[source]
        error: minijinja::Error,
    },
    #[error("{}{}", describe(.error), .at.as_ref().map(|at| format!(" in `{at}`")).unwrap_or_default())]
    Render {
        #[source]
        error: minijinja::Error,
        /// The variable that is undefined (`row.o.typo`), when the error is one: minijinja's
        /// "undefined value" names nothing by itself.
        at: Option<String>,
    },
    /// Names the unset variables, quoted and comma-separated.
    #[error("environment variable not set: {0}")]
    MissingEnv(String),
}

/// What went wrong, without minijinja's internal template names.
fn describe(error: &minijinja::Error) -> String {
    match (error.kind(), error.detail()) {
        (minijinja::ErrorKind::OutOfFuel, _) => format!(
            "the template ran too long (over {TEMPLATE_FUEL} steps); is there a runaway loop?"
        ),
        (kind, Some(detail)) => format!("{kind}: {detail}"),
        (kind, None) => kind.to_string(),
    }
}

/// Instructions one template render may execute.
const TEMPLATE_FUEL: u64 = 1_000_000;

/// The environment variables templates see as `env`, taken once per plan.
pub type EnvSnapshot = BTreeMap<String, String>;

/// The process environment now (variables whose name or value is not UTF-8 are left out:
/// a template could not name or print them).
pub fn snapshot_env() -> Arc<EnvSnapshot> {
    Arc::new(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect(),
    )
}

/// A template that compiles, or a literal string when there is nothing to render.
#[derive(Clone, Debug)]
pub enum CompiledTemplate {
    Literal(Arc<str>),
    /// The source of a template that compiled when it was planned.
    Compiled(Arc<str>),
}

impl CompiledTemplate {
    /// The text as written in the suite.
    pub fn source(&self) -> &str {
        match self {
            CompiledTemplate::Literal(s) | CompiledTemplate::Compiled(s) => s,
        }
    }
}

/// The environment every template of a plan renders in.
pub struct Templates {
    env: Environment<'static>,
    /// What `env.NAME` reads, for naming unset variables in errors.
    vars: Arc<EnvSnapshot>,
    /// Sources that compiled when planned, each once: a dataset's instances all send the
    /// same `user "{{ row.q }}"`, which was compiled again for each of them (about 5,000
    /// instructions) and held as a copy each. Only the text is kept, which the plan holds
    /// anyway, shared (the module docs say why the compiled form is not).
    planned: HashSet<Arc<str>>,
    /// The templates rendered so far, compiled, each named by its source in an environment
    /// of its own configured as `env` ([`Rendered`]).
    rendered: Mutex<Rendered>,
}

/// The most compiled templates a run keeps; past it they are let go and compiled again as
/// they render. A suite renders a handful of distinct templates over and over (a dataset's
/// instances share theirs); one with thousands of distinct ones, each rendered once or
/// twice, gained nothing from keeping them all.
pub const COMPILED_MAX: usize = 128;

/// Compiled templates by source, each named by its text. No template reaches another by
/// that name: every name an `include`, `import` or `extends` gives is made the empty name
/// here, which no kept template has (a text with nothing to render is never compiled), so
/// such a statement finds nothing, as in the plan's environment, which holds no template.
/// `trellis check` refuses them before a run (trellis_dsl::template); this holds for what it
/// cannot see too.
struct Rendered {
    env: Environment<'static>,
    count: usize,
}

impl Default for Templates {
    fn default() -> Self {
        Self::new(Arc::default())
    }
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates")
            .field("env", &self.vars.len())
            .finish()
    }
}

impl Templates {
    /// Templates whose `env` is `vars`.
    pub fn new(vars: Arc<EnvSnapshot>) -> Self {
        let mut env = Environment::new();
        // Debug mode (on in debug builds) changes what errors print: off, as in release.
        env.set_debug(false);
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // A template is a message, not a program: a runaway loop must end as a template
        // fault instead of stalling the engine.
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Messages are plain text, not HTML.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        // `true`, `null` and lists as JSON writes them, not as Python does.
        env.set_formatter(trellis_dsl::template::write_value);
        Templates {
            rendered: Mutex::new(Rendered {
                env: {
                    let mut rendered = env.clone();
                    rendered.set_path_join_callback(|_, _| std::borrow::Cow::Borrowed(""));
                    rendered
                },
                count: 0,
            }),
            env,
            vars,
            planned: HashSet::new(),
        }
    }

    /// The environment snapshot `env` renders from.
    pub fn env(&self) -> &Arc<EnvSnapshot> {
        &self.vars
    }

    pub fn compile(&mut self, template: &Template) -> Result<CompiledTemplate, RenderError> {
        let source = &template.source;
        if !source.contains("{{") && !source.contains("{%") && !source.contains("{#") {
            return Ok(CompiledTemplate::Literal(Arc::from(source.as_str())));
        }
        if let Some(known) = self.planned.get(source.as_str()) {
            return Ok(CompiledTemplate::Compiled(Arc::clone(known)));
        }
        self.env
            .template_from_str(source)
            .map_err(|error| RenderError::Compile {
                source_text: source.clone(),
                error,
            })?;
        let source: Arc<str> = Arc::from(source.as_str());
        self.planned.insert(Arc::clone(&source));
        Ok(CompiledTemplate::Compiled(source))
    }

    /// Whether `template` is one expression alone (`{{ row.want }}`) whose value in `ctx` is
    /// `null` or missing: it renders the text `null`, which a check would then look for
    /// (and `not-contains` pass on every reply) though the value meant was not there.
    pub fn is_null_alone(&self, template: &CompiledTemplate, ctx: Value) -> bool {
        let CompiledTemplate::Compiled(source) = template else {
            return false;
        };
        let Some(inner) = source
            .trim()
            .strip_prefix("{{")
            .and_then(|s| s.strip_suffix("}}"))
            .map(|s| s.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()))
        else {
            return false;
        };
        if inner.contains("{{") || inner.contains("}}") || inner.contains("{%") {
            return false;
        }
        self.env
            .compile_expression(inner)
            .and_then(|e| e.eval(ctx))
            .is_ok_and(|v| v.is_none() || v.is_undefined())
    }

    /// Renders a template given as source (a step's message, a check's value, the simulator's
    /// prompts, an HTTP agent's request) in the plan's environment (strict, fuelled,
    /// unescaped), compiled the first time it renders ([`COMPILED_MAX`]). Syntax and
    /// variables were checked by `trellis check`; `ctx` is only built when `source` has
    /// something to render.
    pub fn render_source(
        &self,
        source: &str,
        ctx: impl FnOnce() -> Value,
    ) -> Result<String, RenderError> {
        if !source.contains("{{") && !source.contains("{%") && !source.contains("{#") {
            return Ok(source.to_owned());
        }
        // Built before the lock is taken: building it may render other templates.
        // Kept (a reference count) to name what was undefined, should the render fail.
        let ctx = ctx();
        let mut rendered = self
            .rendered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if rendered.env.get_template(source).is_err() {
            if rendered.count >= COMPILED_MAX {
                rendered.env.clear_templates();
                rendered.count = 0;
            }
            rendered
                .env
                .add_template_owned(source.to_owned(), source.to_owned())
                .map_err(|error| RenderError::Compile {
                    source_text: source.to_owned(),
                    error,
                })?;
            rendered.count += 1;
        }
        let template = rendered
            .env
            .get_template(source)
            .map_err(|error| RenderError::Compile {
                source_text: source.to_owned(),
                error,
            })?;
        template
            .render(ctx.clone())
            .map_err(|error| self.render_error(&template, error, &ctx))
    }

    /// Renders `template`; `ctx` is only built when the template has something to render.
    pub fn render(
        &self,
        template: &CompiledTemplate,
        ctx: impl FnOnce() -> Value,
    ) -> Result<String, RenderError> {
        match template {
            CompiledTemplate::Literal(s) => Ok(s.to_string()),
            CompiledTemplate::Compiled(source) => self.render_source(source, ctx),
        }
    }

    /// The environment variables `template` reads (`env.NAME`).
    pub fn env_names(&self, template: &CompiledTemplate) -> Vec<String> {
        let CompiledTemplate::Compiled(source) = template else {
            return Vec::new();
        };
        let Ok(template) = self.env.template_from_str(source) else {
            return Vec::new();
        };
        template
            .undeclared_variables(true)
            .into_iter()
            .filter_map(|v| v.strip_prefix("env.").map(str::to_string))
            .collect()
    }

    fn render_error(
        &self,
        template: &minijinja::Template<'_, '_>,
        error: minijinja::Error,
        ctx: &Value,
    ) -> RenderError {
        // The only undefined values validation cannot rule out are unset environment
        // variables: name them instead of minijinja's position.
        let missing: Vec<String> = template
            .undeclared_variables(true)
            .into_iter()
            .filter_map(|v| v.strip_prefix("env.").map(str::to_string))
            .filter(|name| !self.vars.contains_key(name))
            .map(|name| format!("`{name}`"))
            .collect();
        if missing.is_empty() {
            let at = (error.kind() == minijinja::ErrorKind::UndefinedError)
                .then(|| first_undefined(template, ctx))
                .flatten();
            RenderError::Render { error, at }
        } else {
            RenderError::MissingEnv(missing.join(", "))
        }
    }
}

/// The first variable path `template` reads (`row.o.typo`, attribute by attribute) that is
/// undefined in `ctx`.
fn first_undefined(template: &minijinja::Template<'_, '_>, ctx: &Value) -> Option<String> {
    let mut paths: Vec<String> = template.undeclared_variables(true).into_iter().collect();
    paths.sort();
    paths.into_iter().find(|path| {
        let mut value = ctx.clone();
        for part in path.split('.') {
            value = value.get_attr(part).unwrap_or(Value::UNDEFINED);
            if value.is_undefined() {
                return true;
            }
        }
        false
    })
}

/// An environment snapshot as a template object: a lookup per name a template reads, without
/// copying the whole environment into every scope.
#[derive(Debug)]
struct EnvVars(Arc<EnvSnapshot>);

impl Object for EnvVars {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get(key.as_str()?).map(|v| Value::from(v.as_str()))
    }
}

/// The variables every template of a scenario sees, except `vars`, which grow along the
/// trajectory.
///
/// Built on first use: a plan holds one per scenario, and most of a big suite's scenarios
/// are only counted or listed (`trellis check`, `list`), never rendered; built up front they
/// were a sixth of the memory of planning 30,000 small scenarios. A run lets go of it once
/// the scenario is done ([`ScenarioScope::release`]): kept, the scopes of a 20,000-row
/// dataset's instances were 37 MB at the run's end.
///
/// Each variable is converted for templates the first time a template reads it, and a
/// render's scope is an object over the scenario's ([`Scope`]), not a copy of it: a
/// dataset's instance renders `{{ row.q }}` and never reads `scenario` or `user_context`,
/// and building all of them for every instance, copying them into a map for every render
/// and dropping them was a tenth of a 20,000-row run's thread (docs/performance.md, "Many
/// scenarios").
#[derive(Debug)]
pub struct ScenarioScope {
    from: ScopeFrom,
    base: Mutex<Option<Arc<ScopeBase>>>,
}

impl Clone for ScenarioScope {
    fn clone(&self) -> Self {
        ScenarioScope {
            from: self.from.clone(),
            base: Mutex::new(self.built()),
        }
    }
}

/// What a [`ScenarioScope`] is built from.
#[derive(Clone, Debug)]
enum ScopeFrom {
    Scenario {
        scenario: Arc<Scenario>,
        /// Shared with every scenario that plays the same named persona.
        persona: Option<Arc<Persona>>,
        env: Arc<EnvSnapshot>,
    },
    EnvOnly(Arc<EnvSnapshot>),
}

impl ScenarioScope {
    pub fn new(
        scenario: Arc<Scenario>,
        persona: Option<Arc<Persona>>,
        env: &Arc<EnvSnapshot>,
    ) -> Self {
        ScenarioScope {
            from: ScopeFrom::Scenario {
                scenario,
                persona,
                env: Arc::clone(env),
            },
            base: Mutex::new(None),
        }
    }

    /// The scope as built, if it is.
    fn built(&self) -> Option<Arc<ScopeBase>> {
        // A panic while the lock was held (none is expected: building does not lock) leaves
        // the value as it was, which is still the scope.
        self.base
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn base(&self) -> Arc<ScopeBase> {
        let mut slot = self
            .base
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(slot.get_or_insert_with(|| Arc::new(ScopeBase::new(self.from.clone()))))
    }

    /// Whether the scope is built and held (a render built it, and no release came since).
    pub fn is_built(&self) -> bool {
        self.built().is_some()
    }

    /// The scenario's variables a render has converted for templates since the scope was
    /// built (`row`, `scenario`, `user_context`, `persona`; `env` is read where it is), in
    /// that order.
    pub fn converted(&self) -> Vec<&'static str> {
        let Some(base) = self.built() else {
            return Vec::new();
        };
        [
            ("row", &base.row),
            ("scenario", &base.scenario),
            ("user_context", &base.user_context),
            ("persona", &base.persona),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.get().map(|_| name))
        .collect()
    }

    /// Drops the scope built for rendering; the next render builds it again. A run calls it
    /// once the scenario's trajectories are all recorded.
    pub fn release(&self) {
        *self
            .base
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The persona as templates see it (`{id, type, description, instructions}`), if any.
    /// Read from the persona itself: the scope is not built for it (a run's start lists
    /// every scenario's persona).
    pub fn persona(&self) -> Option<serde_json::Value> {
        match &self.from {
            ScopeFrom::Scenario {
                persona: Some(p), ..
            } => Some(persona_value(p)),
            _ => None,
        }
    }

    /// Scope for header values: only `env`.
    pub fn env_only(env: &Arc<EnvSnapshot>) -> Self {
        ScenarioScope {
            from: ScopeFrom::EnvOnly(Arc::clone(env)),
            base: Mutex::new(None),
        }
    }

    pub fn with_vars(&self, vars: &BTreeMap<String, String>) -> Value {
        self.with_vars_and(vars, BTreeMap::new())
    }

    /// The scope with `vars` and `extra` variables (which replace same-named ones).
    pub fn with_vars_and(
        &self,
        vars: &BTreeMap<String, String>,
        extra: BTreeMap<String, Value>,
    ) -> Value {
        let vars = match &self.from {
            // A matrix instance's values are variables from the first step on; a capture of
            // the same name replaces its value.
            ScopeFrom::Scenario { scenario, .. }
                if scenario
                    .instance
                    .as_ref()
                    .is_some_and(|i| !i.vars.is_empty()) =>
            {
                let mut all: BTreeMap<String, serde_json::Value> = scenario
                    .instance
                    .iter()
                    .flat_map(|i| i.vars.iter().cloned())
                    .collect();
                all.extend(
                    vars.iter()
                        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))),
                );
                Value::from(Serde(&all))
            }
            _ => Value::from(Serde(vars)),
        };
        Value::from_object(Scope {
            base: self.base(),
            vars,
            extra,
        })
    }
}

/// One render's variables: `extra`, then `vars`, then the scenario's ([`ScopeBase`]). A map
/// to templates, its names in order as a `BTreeMap`'s would be.
#[derive(Debug)]
struct Scope {
    base: Arc<ScopeBase>,
    vars: Value,
    extra: BTreeMap<String, Value>,
}

impl Object for Scope {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.get_value_by_str(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        if let Some(value) = self.extra.get(key) {
            return Some(value.clone());
        }
        if key == "vars" {
            return Some(self.vars.clone());
        }
        self.base.get(key)
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        let mut names: Vec<Value> = self
            .base
            .names()
            .chain(["vars"])
            .filter(|name| !self.extra.contains_key(*name))
            .map(Value::from)
            .chain(self.extra.keys().map(|name| Value::from(name.as_str())))
            .collect();
        names.sort();
        minijinja::value::Enumerator::Values(names)
    }
}

/// The variables of a [`ScenarioScope`] but `vars`, each converted for templates when a
/// template first reads it and kept until the scope is released.
#[derive(Debug)]
struct ScopeBase {
    from: ScopeFrom,
    user_context: OnceLock<Value>,
    scenario: OnceLock<Value>,
    row: OnceLock<Value>,
    persona: OnceLock<Value>,
}

impl ScopeBase {
    fn new(from: ScopeFrom) -> Self {
        ScopeBase {
            from,
            user_context: OnceLock::new(),
            scenario: OnceLock::new(),
            row: OnceLock::new(),
            persona: OnceLock::new(),
        }
    }

    /// The names this scope has, `vars` aside.
    fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        let (scenario, persona) = match &self.from {
            ScopeFrom::Scenario {
                scenario, persona, ..
            } => (Some(scenario), persona.is_some()),
            ScopeFrom::EnvOnly(_) => (None, false),
        };
        let row = scenario.is_some_and(|sc| row_of(sc).is_some());
        [
            ("env", true),
            ("persona", persona),
            ("row", row),
            ("scenario", scenario.is_some()),
            ("user_context", scenario.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, has)| has.then_some(name))
    }

    fn get(&self, key: &str) -> Option<Value> {
        let (scenario, persona, env) = match &self.from {
            ScopeFrom::Scenario {
                scenario,
                persona,
                env,
            } => (scenario, persona.as_deref(), env),
            ScopeFrom::EnvOnly(env) => {
                return (key == "env").then(|| Value::from_object(EnvVars(Arc::clone(env))));
            }
        };
        let value = match key {
            "env" => return Some(Value::from_object(EnvVars(Arc::clone(env)))),
            "user_context" => self
                .user_context
                .get_or_init(|| Value::from(Serde(&scenario.user_context))),
            "scenario" => self
                .scenario
                .get_or_init(|| Value::from(Serde(&scenario_value(scenario)))),
            // A `for-each` instance's row, typed as the dataset holds it.
            "row" => {
                let row = row_of(scenario)?;
                self.row.get_or_init(|| Value::from(Serde(row)))
            }
            "persona" => {
                let p = persona?;
                self.persona
                    .get_or_init(|| Value::from(Serde(&persona_value(p))))
            }
            _ => return None,
        };
        Some(value.clone())
    }
}

/// A `for-each` instance's row, if `scenario` is one.
fn row_of(scenario: &Scenario) -> Option<&serde_json::Map<String, serde_json::Value>> {
    scenario.instance.as_ref().and_then(|i| i.row.as_deref())
}

/// `scenario` as templates see it.
fn scenario_value(scenario: &Scenario) -> serde_json::Value {
    serde_json::json!({
        "id": scenario.id.value,
        // A scenario without a `name` is named by its id, as the report names it: written
        // into a message, its `null` reached the agent as the word.
        "name": scenario.name.as_deref().unwrap_or(&scenario.id.value),
        "description": scenario.description,
        "difficulty": match scenario.difficulty {
            trellis_dsl::Difficulty::Normal => "normal",
            trellis_dsl::Difficulty::Hard => "hard",
        },
        "status": match scenario.status {
            trellis_dsl::Status::Active => "active",
            trellis_dsl::Status::Draft => "draft",
            trellis_dsl::Status::Archived => "archived",
        },
        "tags": scenario.tags,
    })
}

/// A persona as templates (and the run's start) see it.
fn persona_value(p: &Persona) -> serde_json::Value {
    serde_json::json!({
        "id": p.id.value,
        "type": p.kind,
        "description": p.description,
        "instructions": p.instructions,
    })
}

/// `sc` with the texts every judge of it reads (its `outcome "…"` statements, listed in each
/// judge's prompt, and its `criteria-override`) rendered when they are templates, in the
/// scenario's scope before any capture: the judge reads `{{ user_context.day }}` as
/// `Tuesday`. A text that reads a capture cannot render before the run and stays as
/// written (an outcome's own check renders it at the trajectory's end).
pub fn judge_texts_rendered(
    sc: &Arc<Scenario>,
    templates: &Templates,
    scope: &ScenarioScope,
) -> Arc<Scenario> {
    let is_template = trellis_dsl::template::is_template;
    let outcome_templates = sc
        .outcomes
        .iter()
        .any(|o| matches!(&o.value, trellis_dsl::Outcome::Statement(s) if is_template(s)));
    let override_template = sc
        .criteria_override
        .as_ref()
        .is_some_and(|o| is_template(&o.value));
    if !outcome_templates && !override_template {
        return Arc::clone(sc);
    }
    let render = |text: &str| {
        templates
            .render_source(text, || scope.with_vars(&BTreeMap::new()))
            .ok()
    };
    let mut rendered = Scenario::clone(sc);
    for outcome in &mut rendered.outcomes {
        if let trellis_dsl::Outcome::Statement(statement) = &mut outcome.value
            && is_template(statement)
            && let Some(text) = render(statement)
        {
            *statement = text;
        }
    }
    if let Some(o) = &mut rendered.criteria_override
        && let Some(text) = render(&o.value)
    {
        o.value = text;
    }
    Arc::new(rendered)
}

/// `persona` with its `description` and `instructions` rendered where they are written as
/// templates (`You are {{ user_context.name }}`), by `render`; the same persona when neither
/// is one. The simulated user, the judges and `persona.*` in templates all read it so.
pub fn persona_rendered(
    persona: &Arc<Persona>,
    render: impl Fn(&str) -> Result<String, RenderError>,
) -> Result<Arc<Persona>, RenderError> {
    let is_template = trellis_dsl::template::is_template;
    let templated = |text: &Option<String>| text.as_deref().is_some_and(is_template);
    if !templated(&persona.description) && !templated(&persona.instructions) {
        return Ok(Arc::clone(persona));
    }
    let mut rendered = Persona::clone(persona);
    for text in [&mut rendered.description, &mut rendered.instructions]
        .into_iter()
        .flatten()
    {
        if is_template(text) {
            *text = render(text)?;
        }
    }
    Ok(Arc::new(rendered))
}

/// `sc`'s `expect-tool` calls as a judge is shown them: a string parameter written as a
/// template rendered by `render` (in the trajectory's scope where the judge is asked, as the
/// call's own check renders it), so the judge reads `A-1002`, not `{{ user_context.order }}`.
/// One that does not render is shown as written.
pub fn expected_tools_rendered(
    sc: &Scenario,
    render: impl Fn(&str) -> Option<String>,
) -> Vec<(String, serde_json::Map<String, serde_json::Value>)> {
    sc.expect_tools
        .iter()
        .filter_map(|c| match &c.kind {
            CriterionKind::Tool { name, params, .. } => {
                let mut params = params.clone();
                for value in params.values_mut() {
                    if let serde_json::Value::String(text) = value
                        && trellis_dsl::template::is_template(text)
                        && let Some(rendered) = render(text)
                    {
                        *text = rendered;
                    }
                }
                Some((name.clone(), params))
            }
            _ => None,
        })
        .collect()
}

/// `kind`, a judged criterion, with its statement and its `rubric=` rendered by `render`
/// where they are written as templates; borrowed as written otherwise. For statements not
/// compiled into a plan: a scenario's own `outcome`s and a rejudged run's checks.
pub fn statement_rendered<'k>(
    kind: &'k CriterionKind,
    render: impl Fn(&str) -> Result<String, RenderError>,
) -> Result<std::borrow::Cow<'k, CriterionKind>, RenderError> {
    let is_template = trellis_dsl::template::is_template;
    let templated = match kind {
        CriterionKind::Judge {
            criterion, rubric, ..
        } => is_template(criterion) || rubric.as_deref().is_some_and(is_template),
        CriterionKind::Outcome(trellis_dsl::Outcome::Statement(statement)) => {
            is_template(statement)
        }
        _ => false,
    };
    if !templated {
        return Ok(std::borrow::Cow::Borrowed(kind));
    }
    let mut kind = kind.clone();
    for slot in [ValueSlot::JudgeStatement, ValueSlot::JudgeRubric] {
        if let Some(text) = judged_value(&mut kind, &slot)
            && is_template(text)
        {
            *text = render(text)?;
        }
    }
    Ok(std::borrow::Cow::Owned(kind))
}

/// The value of a judged criterion's `kind` that `slot` names (its statement, its rubric),
/// to write rendered; `None` for another slot or a kind without that value.
pub fn judged_value<'k>(kind: &'k mut CriterionKind, slot: &ValueSlot) -> Option<&'k mut String> {
    match (kind, slot) {
        (CriterionKind::Judge { criterion, .. }, ValueSlot::JudgeStatement) => Some(criterion),
        (CriterionKind::Judge { rubric, .. }, ValueSlot::JudgeRubric) => rubric.as_mut(),
        (
            CriterionKind::Outcome(trellis_dsl::Outcome::Statement(statement)),
            ValueSlot::JudgeStatement,
        ) => Some(statement),
        _ => None,
    }
}

/// Why a judged check was not judged when its statement could not be rendered.
pub fn unrendered_detail(error: &RenderError) -> String {
    format!("the judge statement could not be rendered: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undefined_value_is_named_by_its_path() {
        let templates = Templates::new(Arc::new(EnvSnapshot::new()));
        let ctx = || minijinja::context! { row => minijinja::context! { o => minijinja::context! { k => 1 } } };
        let error = templates
            .render_source("hi {{ row.o.typo }}", ctx)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "undefined value in `row.o.typo`",
            "{error:?}"
        );
        assert_eq!(
            templates.render_source("hi {{ row.o.k }}", ctx).unwrap(),
            "hi 1"
        );
    }

    /// A source planned twice is compiled and held once; nothing is registered in the
    /// plan's environment, and a source that does not compile is described as before.
    #[test]
    fn a_source_planned_twice_is_compiled_and_held_once() {
        let mut templates = Templates::new(Arc::new(EnvSnapshot::new()));
        let template = |source: &str| trellis_dsl::Template {
            source: source.to_owned(),
            span: trellis_dsl::Span::new(0, miette::SourceSpan::from(0..0)),
        };
        let first = templates.compile(&template("Hi {{ row.q }}")).unwrap();
        let again = templates.compile(&template("Hi {{ row.q }}")).unwrap();
        let (CompiledTemplate::Compiled(a), CompiledTemplate::Compiled(b)) = (&first, &again)
        else {
            panic!("not compiled: {first:?} {again:?}");
        };
        assert!(Arc::ptr_eq(a, b), "the second instance holds its own copy");
        assert!(templates.env.get_template("Hi {{ row.q }}").is_err());
        let ctx = || minijinja::context! { row => minijinja::context! { q => "there" } };
        assert_eq!(templates.render(&again, ctx).unwrap(), "Hi there");
        let error = templates.compile(&template("Hi {{ row.q ")).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("template `Hi {{ row.q `: syntax error"),
            "{text}"
        );
        assert!(templates.compile(&template("Hi {{ row.q ")).is_err());
    }

    /// A run renders the same few templates over and over: each is compiled the first time
    /// it renders, and kept up to [`COMPILED_MAX`] of them.
    #[test]
    fn a_template_is_compiled_once_however_often_it_renders() {
        let templates = Templates::new(Arc::new(EnvSnapshot::new()));
        let count = || templates.rendered.lock().unwrap().count;
        for name in ["Ada", "Grace", "Edsger"] {
            let ctx = || minijinja::context! { row => minijinja::context! { name } };
            assert_eq!(
                templates.render_source("Hi {{ row.name }}", ctx).unwrap(),
                format!("Hi {name}")
            );
        }
        assert_eq!(count(), 1);
        // Strict as the plan's environment is, and as unescaped.
        let undefined = templates
            .render_source("Hi {{ row.name }}", || minijinja::context! {})
            .unwrap_err();
        assert!(undefined.to_string().contains("row.name"), "{undefined}");
        let ctx = || minijinja::context! { row => minijinja::context! { name => "<b>" } };
        assert_eq!(
            templates.render_source("Hi {{ row.name }}", ctx).unwrap(),
            "Hi <b>"
        );
        // A source that does not compile is said so, and not kept.
        let error = templates
            .render_source("Hi {{ row.name ", || minijinja::context! {})
            .unwrap_err();
        assert!(matches!(error, RenderError::Compile { .. }), "{error}");
        assert_eq!(count(), 1);
        // Past the most kept, they are let go and compiled again as they render, rightly.
        for i in 0..COMPILED_MAX + 10 {
            let source = format!("{i}: {{{{ n }}}}");
            let ctx = || minijinja::context! { n => i };
            assert_eq!(
                templates.render_source(&source, ctx).unwrap(),
                format!("{i}: {i}")
            );
            assert!(count() <= COMPILED_MAX);
        }
        let ctx = || minijinja::context! { row => minijinja::context! { name => "again" } };
        assert_eq!(
            templates.render_source("Hi {{ row.name }}", ctx).unwrap(),
            "Hi again"
        );
        // Kept templates are named by their text, and no template reaches another by it,
        // whatever `check` let through. (These statements parse with minijinja's
        // `multi_template`, which the program's reports crate enables; without it they do
        // not compile: an error either way.)
        for loads in [
            "[{% include 'Hi {{ row.name }}' ignore missing %}]",
            "[{% include 'Hi {{ row.name }}' %}]",
            "{% import 'Hi {{ row.name }}' as m %}[]",
            "{% extends 'Hi {{ row.name }}' %}",
        ] {
            let rendered = templates.render_source(loads, ctx);
            assert!(
                matches!(rendered.as_deref(), Ok("[]") | Err(_)),
                "{loads}: {rendered:?}"
            );
        }
    }

    /// minijinja writes values as Python does; suites read them as JSON (a dataset's `true`
    /// reaches the agent as `true`).
    #[test]
    fn values_are_written_as_json_writes_them() {
        let templates = Templates::new(Arc::new(EnvSnapshot::new()));
        let row: serde_json::Value = serde_json::json!({
            "on": true, "off": false, "gone": null, "n": 2, "x": 1.5, "s": "é\"",
            "list": [true, null, "a", 1], "map": {"k": false, "s": "v"},
        });
        let ctx =
            || minijinja::context! { row => minijinja::Value::from(minijinja::value::Serde(&row)) };
        let rendered = |source: &str| templates.render_source(source, ctx).unwrap();
        assert_eq!(
            rendered("{{ row.on }} {{ row.off }} {{ row.gone }}"),
            "true false null"
        );
        assert_eq!(rendered("{{ row.n }} {{ row.x }} {{ row.s }}"), "2 1.5 é\"");
        assert_eq!(rendered("{{ row.list }}"), r#"[true, null, "a", 1]"#);
        assert_eq!(rendered("{{ row.map }}"), r#"{"k": false, "s": "v"}"#);
        assert_eq!(rendered("{% if row.on %}yes{% endif %}"), "yes");
    }
}
