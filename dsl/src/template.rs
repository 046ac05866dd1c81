//! Static checks of minijinja templates (user messages, header values, prompts).
//!
//! A template is compiled once to find syntax errors, then every variable it reads is checked
//! against the [`Scope`] of the place it is written in, so that a typo such as
//! `{{ user_context.postl_code }}` fails `trellis check` instead of rendering as an error at
//! run time.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use miette::SourceSpan;
use minijinja::value::ValueKind;
use minijinja::{Environment, Output, State, Value};

use crate::diagnostics::{Diagnostic, Kind, did_you_mean};
use crate::model::{Scenario, SourceFile, Span, Spanned, Template};

/// Which names under one root variable exist.
#[derive(Clone, Debug)]
pub enum Names {
    /// Any attribute (e.g. `env.NAME`, resolved at run time).
    Any,
    /// Only these attributes.
    Only(BTreeSet<String>),
}

/// The variables a template may use.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    roots: BTreeMap<String, Names>,
    /// Extra help for specific undefined variables (`vars.x` captured too late).
    hints: BTreeMap<String, String>,
    /// Roots whose values are known when the suite is checked (`user_context`): a read
    /// deeper than their first level (`user_context.address.city`) is checked against them.
    values: BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
}

impl Scope {
    /// No variables at all.
    pub fn empty() -> Self {
        Scope::default()
    }

    /// Header values: only `env`.
    pub fn env_only() -> Self {
        Scope::empty().with("env", Names::Any)
    }

    /// Adds (or replaces) a root variable.
    pub fn with(mut self, root: &str, names: Names) -> Self {
        self.roots.insert(root.to_string(), names);
        self
    }

    /// Adds a help line used when `var` (e.g. `vars.quote`) is reported undefined.
    pub fn with_hint(mut self, var: &str, help: impl Into<String>) -> Self {
        self.hints.insert(var.to_string(), help.into());
        self
    }

    /// User messages of `scenario`, with `vars` holding the captures available at that step.
    pub fn scenario(scenario: &Scenario, has_persona: bool, vars: &BTreeSet<String>) -> Self {
        let keys = scenario.user_context.keys().cloned().collect();
        let mut scope = Scope::env_only().with("user_context", Names::Only(keys));
        scope
            .values
            .insert("user_context".to_owned(), scenario.user_context.clone());
        let mut scope = scope.with("scenario", names(SCENARIO_FIELDS)).with(
            "vars",
            Names::Only({
                // Matrix values are variables from the first step on.
                let mut vars = vars.clone();
                vars.extend(scenario.matrix.iter().map(|m| m.name.value.clone()));
                vars
            }),
        );
        if has_persona {
            scope = scope.with("persona", names(PERSONA_FIELDS));
        } else {
            scope = scope.with_hint(
                "persona",
                "this scenario has no persona; add `persona \"ID\"` to use `persona.*`",
            );
        }
        scope
    }

    /// Every `root.attr` name in scope (for suggestions).
    fn candidates(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (root, names) in &self.roots {
            out.push(root.clone());
            if let Names::Only(set) = names {
                out.extend(set.iter().map(|n| format!("{root}.{n}")));
            }
        }
        out
    }
}

/// minijinja's built-in filters (its `builtins` feature), for "did you mean".
const BUILTIN_FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "urlencode",
    "chain",
    "zip",
    "format",
];

/// minijinja's built-in tests.
const BUILTIN_TESTS: &[&str] = &[
    "boolean",
    "defined",
    "divisibleby",
    "endingwith",
    "eq",
    "equalto",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "gt",
    "in",
    "integer",
    "iterable",
    "le",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "safe",
    "sameas",
    "sequence",
    "startingwith",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
    "lessthan",
    "greaterthan",
];

/// minijinja's built-in functions.
const BUILTIN_FUNCTIONS: &[&str] = &["debug", "dict", "namespace", "range"];

/// The fields templates see in `scenario`.
pub const SCENARIO_FIELDS: &[&str] = &["id", "name", "description", "difficulty", "tags", "status"];

/// The fields templates see in `persona`.
pub const PERSONA_FIELDS: &[&str] = &["id", "type", "description", "instructions"];

pub fn names(list: &[&str]) -> Names {
    Names::Only(list.iter().map(|s| s.to_string()).collect())
}

/// Whether the string goes through the template engine at all (the engine sends strings
/// without template syntax verbatim).
pub fn is_template(source: &str) -> bool {
    source.contains("{{") || source.contains("{%") || source.contains("{#")
}

/// How a suite's templates write a value into text, set on every environment that renders
/// one (`env.set_formatter`): as JSON writes it. minijinja follows Python (`True`, `False`,
/// `None`, lists of `True`), but suites are read next to JSON: a dataset's `true` must reach
/// the agent as `true`, and a rendered `"{{ row.flag }}"` must equal the boolean an agent sends
/// (`Written::Rendered` in the engine's sandbox). Booleans are `true`/`false`, a null is
/// `null`; lists and maps are their JSON text with Python's `json.dumps` spacing (`["a",
/// 1]`, `{"k": true}`), which is what minijinja writes for them without booleans or nulls.
/// Everything else (strings, numbers, undefined) is written as minijinja writes it.
pub fn write_value(
    out: &mut Output<'_>,
    state: &mut State<'_, '_>,
    value: &Value,
) -> Result<(), minijinja::Error> {
    let text = match value.kind() {
        ValueKind::Bool => Some(if value.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Some("null".to_owned()),
        ValueKind::Seq | ValueKind::Map => json_text(value),
        _ => None,
    };
    match text {
        Some(text) => Ok(out.write_str(&text)?),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// `value` as JSON with `", "` and `": "` between items, or `None` when it has no JSON form
/// (a map with keys that are not text).
fn json_text(value: &Value) -> Option<String> {
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn begin_array_value<W: ?Sized + std::io::Write>(
            &mut self,
            writer: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                writer.write_all(b", ")
            }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(
            &mut self,
            writer: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                writer.write_all(b", ")
            }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(
            &mut self,
            writer: &mut W,
        ) -> std::io::Result<()> {
            writer.write_all(b": ")
        }
    }
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, Spaced);
    serde::Serialize::serialize(value, &mut ser).ok()?;
    String::from_utf8(buf).ok()
}

/// Whether a `header` value reads more than `env`: such a header is rendered for each turn,
/// with the turn's `user_context`, `persona`, `scenario`, `vars` and `row`; one reading only
/// `env` (or nothing) is rendered once per run. A template that does not compile counts as
/// per run, where its error is reported.
pub fn reads_turn_scope(source: &str) -> bool {
    if !is_template(source) {
        return false;
    }
    let mut env = Environment::new();
    // Debug mode (on in debug builds) changes what errors print: off, as in release.
    env.set_debug(false);
    let Ok(compiled) = env.template_from_str(source) else {
        return false;
    };
    compiled
        .undeclared_variables(false)
        .iter()
        .any(|var| var != "env")
}

/// Checks one template: syntax, then every variable against `scope`.
pub fn check(template: &Template, scope: &Scope, files: &[SourceFile]) -> Vec<Diagnostic> {
    check_reading_env(template, scope, files, &mut Vec::new())
}

/// [`check`], also adding every `env.NAME` the template reads to `env_reads` (the name, where
/// it is written), so `trellis check` can warn about variables unset where it runs.
pub fn check_reading_env(
    template: &Template,
    scope: &Scope,
    files: &[SourceFile],
    env_reads: &mut Vec<Spanned<String>>,
) -> Vec<Diagnostic> {
    if !is_template(&template.source) {
        return Vec::new();
    }
    // A statement that loads another template fails on every render: a template is one text,
    // and there are no others for it to load. Looked for before compiling: whether minijinja
    // parses these statements depends on a feature another crate of the program enables.
    if let Some((at, statement)) = loads_another_template(&template.source) {
        let span = locate_where(template, statement, files, |before, _| before.len() == at)
            .unwrap_or(template.span);
        return vec![
            Diagnostic::at_span(
                Kind::TemplateSyntax,
                format!("invalid template: `{{% {statement} %}}` has no template to load"),
                files,
                span,
                format!("`{statement}` loads another template"),
            )
            .with_help(
                "a template is one text: `include`, `import`, `from` and `extends` name other \
                 templates, and there are none; write the text here (a `{% macro %}` in this \
                 template is reused)",
            ),
        ];
    }
    // Chainable: the trial render below reads every variable as undefined, lookups through
    // it included; compiling is the same under any behaviour.
    let mut env = Environment::new();
    // Debug mode (on in debug builds) changes what errors print: off, as in release.
    env.set_debug(false);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    let compiled = match env.template_from_str(&template.source) {
        Ok(t) => t,
        Err(err) => {
            let detail = err
                .detail()
                .map(str::to_string)
                .unwrap_or_else(|| err.kind().to_string());
            // The message says what is wrong: the label says only where, not it again (an
            // editor shows both, one after the other).
            let label = match err.line() {
                Some(line) if template.source.contains('\n') => {
                    format!("this template does not parse (at its line {line})")
                }
                _ => "this template does not parse".to_owned(),
            };
            // The token the parser stopped at, when the literal is written without escapes
            // (a long `request` body underlined whole says nothing of where).
            let at = err
                .range()
                .and_then(|r| locate_at(template, r.start, r.len().max(1), files));
            let label = match at {
                Some(_) => "parsing stops here".to_owned(),
                None => label,
            };
            return vec![
                Diagnostic::at_span(
                    Kind::TemplateSyntax,
                    format!("invalid template: {detail}"),
                    files,
                    at.unwrap_or(template.span),
                    label,
                )
                .with_help("templates use minijinja syntax, e.g. {{ user_context.postal_code }}"),
            ];
        }
    };
    // A filter, test or function that does not exist fails only when rendered: the template
    // is rendered once here with every variable undefined (and lookups through it allowed),
    // and such an error is reported now rather than on every turn of the run. The variables
    // are checked all the same: one misspelt filter hid every other problem of the text.
    let mut out = Vec::new();
    // An unknown function is a name nothing defines, said once, as the function.
    let mut unknown_function = None;
    if let Err(err) = compiled.render(())
        && let Some(known) = match err.kind() {
            minijinja::ErrorKind::UnknownFilter => Some(BUILTIN_FILTERS),
            minijinja::ErrorKind::UnknownTest => Some(BUILTIN_TESTS),
            minijinja::ErrorKind::UnknownFunction => Some(BUILTIN_FUNCTIONS),
            _ => None,
        }
    {
        let detail = err
            .detail()
            .map(str::to_string)
            .unwrap_or_else(|| err.kind().to_string());
        // minijinja says `filter NAME is unknown`, `test NAME is unknown`, `NAME is unknown`.
        let name = detail
            .strip_suffix(" is unknown")
            .map(|d| d.trim_start_matches("filter ").trim_start_matches("test "))
            .filter(|n| !n.is_empty() && !n.contains(' '));
        let help = match name.and_then(|n| did_you_mean(n, known.iter().copied())) {
            Some(best) => format!("did you mean `{best}`?"),
            None => "templates have minijinja's built-in filters, tests and functions: `upper`, \
                     `lower`, `default`, `replace`, `trim`, `join`, `length`, `tojson`, `int`, \
                     `float`, … (https://docs.rs/minijinja/latest/minijinja/filters/)"
                .to_owned(),
        };
        if err.kind() == minijinja::ErrorKind::UnknownFunction {
            unknown_function = name.map(str::to_owned);
        }
        // Where it is used as one: the same word may be text before it.
        let kind = err.kind();
        let used_as = |before: &str, after: &str| {
            // The whole name (`low` is not the start of `lower`).
            !after.starts_with(|c: char| c.is_alphanumeric() || c == '_')
                && match kind {
                    minijinja::ErrorKind::UnknownFilter => {
                        let before = before.trim_end();
                        before.ends_with('|') || before.ends_with("{% filter")
                    }
                    minijinja::ErrorKind::UnknownTest => {
                        let before = before.trim_end();
                        before.ends_with(" is") || before.ends_with(" not")
                    }
                    _ => after.trim_start().starts_with('('),
                }
        };
        let span = name
            .and_then(|n| locate_where(template, n, files, used_as))
            .unwrap_or(template.span);
        out.push(
            Diagnostic::at_span(
                Kind::TemplateSyntax,
                format!("invalid template: {detail}"),
                files,
                span,
                detail.clone(),
            )
            .with_help(help),
        );
    }
    let globals: BTreeSet<String> = env.globals().map(|(k, _)| k.to_string()).collect();
    let mut used: Vec<String> = compiled.undeclared_variables(true).into_iter().collect();
    used.sort();
    for var in used {
        if unknown_function.as_deref() == Some(var.as_str()) {
            continue;
        }
        let mut parts = var.splitn(3, '.');
        let root = parts.next().unwrap_or("");
        let attr = parts.next();
        let defined = match (scope.roots.get(root), attr) {
            (Some(_), None) | (Some(Names::Any), _) => true,
            (Some(Names::Only(set)), Some(attr)) => set.contains(attr),
            (None, _) => globals.contains(root),
        };
        if defined
            && let Some(known) = scope.values.get(root)
            && let Some(missing) = missing_below(known, &var)
            && !every_read_guarded_in_blocks(&template.source, &var)
            // A read through a null is usually guarded by a condition on it (`{% if
            // user_context.address.street %}`), which renders fine: as for row fields
            // ([`nested_row_reads`]), a conditional template is not judged.
            && !(matches!(missing, Missing::Null { .. }) && is_conditional(&template.source))
        {
            let help = match missing {
                Missing::Null { path } => format!("`{path}` is null"),
                Missing::Field { name, there } => {
                    match did_you_mean(name, there.iter().map(String::as_str)) {
                        Some(best) => format!("did you mean `{best}`?"),
                        None if there.is_empty() => "it holds no fields".to_owned(),
                        None => format!(
                            "it has: {}",
                            there
                                .iter()
                                .map(|k| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                }
            };
            out.push(
                Diagnostic::at_span(
                    Kind::UndefinedVariable,
                    format!("undefined template variable `{var}`"),
                    files,
                    locate(template, &var, files).unwrap_or(template.span),
                    "not defined here",
                )
                .with_help(help),
            );
            continue;
        }
        if defined {
            if let ("env", Some(name)) = (root, attr)
                && scope.roots.contains_key("env")
                && !every_read_guarded(&template.source, &var)
            {
                env_reads.push(Spanned {
                    value: name.to_string(),
                    span: locate(template, &var, files).unwrap_or(template.span),
                });
            }
            continue;
        }
        let shown = match attr {
            Some(a) => format!("{root}.{a}"),
            None => root.to_string(),
        };
        // A field the scope does not have, of a variable it has, read only where it may be
        // missing (`{{ user_context.zip | default('') }}`): it renders. An unknown variable
        // is reported however it is read (a typo guarded by `default` would never show).
        // `row` is in scope only in a `for-each` scenario: a template shared with others (an
        // agent's header) may read it where it is defined, guarded as `user_context` is.
        // Only behind `row is defined`: `row.x | default(…)` reads a field of an undefined
        // value, which strict rendering refuses at run time.
        let guarded_root =
            root == "row" && every_read_where_defined(&template.source, &shown, root);
        if scope.roots.contains_key(root) && every_read_guarded_in_blocks(&template.source, &shown)
            || guarded_root
        {
            continue;
        }
        let help = if let Some(h) = scope.hints.get(&shown).or(scope.hints.get(root)) {
            h.clone()
        } else if let (Some(Names::Only(set)), Some(attr)) = (scope.roots.get(root), attr) {
            // A near miss of a name the scope knows only later (a capture after this step)
            // is the likelier typo than "nothing here".
            let later = did_you_mean(&shown, scope.hints.keys().map(String::as_str))
                .and_then(|best| Some((best, scope.hints.get(best)?)));
            match did_you_mean(attr, set.iter().map(String::as_str)) {
                Some(best) => format!("did you mean `{root}.{best}`?"),
                None if let Some((best, hint)) = later => {
                    format!("did you mean `{best}`? {hint}")
                }
                None if set.is_empty() => format!("`{root}` is empty here"),
                None => format!(
                    "`{root}` has: {}",
                    set.iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        } else if let Some(best) =
            did_you_mean(&shown, scope.candidates().iter().map(String::as_str))
        {
            format!("did you mean `{best}`?")
        } else {
            let roots: Vec<String> = scope.roots.keys().map(|r| format!("`{r}`")).collect();
            if roots.is_empty() {
                "no variables are available here".to_string()
            } else {
                format!("available here: {}", roots.join(", "))
            }
        };
        let span = locate(template, &shown, files).unwrap_or(template.span);
        out.push(
            Diagnostic::at_span(
                Kind::UndefinedVariable,
                format!("undefined template variable `{shown}`"),
                files,
                span,
                "not defined here",
            )
            .with_help(help),
        );
    }
    out
}

/// The fields two or more levels into `row` (`row.customer.name`) that `template` reads
/// without a `default` or `is defined` guard, each with where it is written. Validation
/// checks `row.COLUMN` against the dataset's columns; a nested field can be missing in some
/// rows only, which only a look at each row finds. A template with `{% … %}` or an inline
/// `if` may guard its reads in ways this does not follow, so it is left out.
pub fn nested_row_reads(template: &Template, files: &[SourceFile]) -> Vec<Spanned<String>> {
    let source = &template.source;
    if !is_template(source) || is_conditional(source) {
        return Vec::new();
    }
    let mut env = Environment::new();
    // Debug mode (on in debug builds) changes what errors print: off, as in release.
    env.set_debug(false);
    let Ok(compiled) = env.template_from_str(source) else {
        return Vec::new();
    };
    let mut reads: Vec<String> = compiled
        .undeclared_variables(true)
        .into_iter()
        .filter(|var| var.starts_with("row.") && var.matches('.').count() >= 2)
        .filter(|var| !every_read_guarded(source, var))
        .collect();
    reads.sort();
    reads
        .into_iter()
        .map(|var| Spanned {
            span: locate(template, &var, files).unwrap_or(template.span),
            value: var,
        })
        .collect()
}

/// Whether a template has a condition (`{% … %}` or an inline `… if … else …`), whose
/// branches a read may be guarded by.
fn is_conditional(source: &str) -> bool {
    source.contains("{%") || source.contains(" if ")
}

/// Where the dotted path `var` (`user_context.address.cty`, `row.customer.name`) leaves what
/// `known` holds below its first level: an object on the way without the next field, or a
/// `null` on the way. `None` when the path is there, when its first level is not (that is
/// checked against the names in scope), or when it goes through a value that is neither
/// (text has methods, a list is indexed), which is not checked.
pub(crate) fn missing_below<'v>(
    known: &serde_json::Map<String, serde_json::Value>,
    var: &'v str,
) -> Option<Missing<'v>> {
    let mut segments = var.split('.');
    let root = segments.next()?;
    let first = segments.next()?;
    let mut value = known.get(first)?;
    // `var[..path_len]` names `value`.
    let mut path_len = root.len() + 1 + first.len();
    for part in segments {
        match value {
            serde_json::Value::Object(map) => match map.get(part) {
                Some(next) => value = next,
                None => {
                    return Some(Missing::Field {
                        name: part,
                        there: map.keys().cloned().collect(),
                    });
                }
            },
            serde_json::Value::Null => {
                return Some(Missing::Null {
                    path: &var[..path_len],
                });
            }
            _ => return None,
        }
        path_len += 1 + part.len();
    }
    None
}

/// What [`missing_below`] found missing.
pub(crate) enum Missing<'v> {
    /// An object on the way has no field `name`; it has `there`.
    Field { name: &'v str, there: Vec<String> },
    /// The value at `path` is `null`.
    Null { path: &'v str },
}

/// Whether every place `source` reads `var` (`env.NAME`) gives a value when it is unset: it
/// is piped into `default` (or `d`), or tested with `is defined` / `is undefined` / `is not
/// defined`. Such a read renders without the variable, so an unset one is nothing to warn
/// about. A read this cannot find (written `env["NAME"]`) counts as unguarded.
fn every_read_guarded(source: &str, var: &str) -> bool {
    let guards = read_guards(source, var);
    !guards.is_empty() && guards.iter().all(|g| *g != Guard::None)
}

/// Whether every read of `var` in `source` renders when `var` is missing: piped into
/// `default`, tested with `is defined`, or inside a block only entered when it is defined
/// (`{% if user_context.zip is defined %}…{% endif %}`, or the `else` of an `is not defined`
/// test). A read outside such a block is not guarded by a test elsewhere: strict rendering
/// fails on it.
fn every_read_guarded_in_blocks(source: &str, var: &str) -> bool {
    let reads = read_guards_at(source, var);
    !reads.is_empty()
        && reads
            .iter()
            .all(|(at, g)| *g != Guard::None || inside_defined_block(source, var, *at))
}

/// Whether every read of `var` in `source` is inside an `if` (a block, or the tag's own
/// inline `if`) entered only when `root` is defined.
fn every_read_where_defined(source: &str, var: &str, root: &str) -> bool {
    let reads = read_guards_at(source, var);
    !reads.is_empty()
        && reads
            .iter()
            .all(|(at, _)| inside_defined_block(source, root, *at))
}

/// Whether byte `at` of `source` is inside an `if` branch entered only when `var` is
/// defined, or inside a tag whose own expression tests it (`{{ var if var is defined else
/// "" }}`).
fn inside_defined_block(source: &str, var: &str, at: usize) -> bool {
    let text = without_comments(source);
    // The tag `at` is in, read alone: an inline `if`, a `set`.
    let opened = text[..at].rfind("{{").max(text[..at].rfind("{%"));
    if let Some(open) = opened
        && let Some(close) = text[at..].find(['}', '%']).map(|i| at + i)
        && tests(&text[open + 2..close.max(open + 2)], var, true)
        && !text[open..at].contains("}}")
        && !text[open..at].contains("%}")
    {
        return true;
    }
    inside_branch_where(&text, at, |condition| {
        (tests(condition, var, true), tests(condition, var, false))
    })
}

/// The first statement of `source` that loads another template (`include`, `import`, `from`,
/// `extends`), with the byte offset of its keyword. Read as minijinja reads it: a comment, a
/// `{% raw %}` block and a string inside a tag or an expression are text, so `{{ "{% include"
/// }}` loads nothing and `{% set a = "{#" %}` hides nothing after it.
fn loads_another_template(source: &str) -> Option<(usize, &'static str)> {
    const LOADERS: [&str; 4] = ["include", "import", "from", "extends"];
    let bytes = source.as_bytes();
    let mut at = 0;
    while let Some(open) = source.get(at..)?.find('{').map(|i| at + i) {
        match bytes.get(open + 1) {
            Some(b'#') => {
                at = source[open + 2..]
                    .find("#}")
                    .map_or(source.len(), |i| open + 2 + i + 2);
            }
            Some(b'{') => at = past_close(source, open + 2, "}}"),
            Some(b'%') => {
                let (keyword_at, keyword) = tag_keyword(source, open + 2);
                if let Some(loader) = LOADERS.iter().find(|l| **l == keyword) {
                    return Some((keyword_at, loader));
                }
                at = past_close(source, open + 2, "%}");
                if keyword == "raw" {
                    // Text up to the tag that ends it, whatever it holds.
                    at = raw_end(source, at);
                }
            }
            _ => at = open + 1,
        }
    }
    None
}

/// The keyword of the tag whose text starts at `from` (after `{%`), and where it starts.
fn tag_keyword(source: &str, from: usize) -> (usize, &str) {
    let rest = &source[from..];
    let trimmed = rest.trim_start_matches(['-', '+']).trim_start();
    let at = from + (rest.len() - trimmed.len());
    let len = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(trimmed.len());
    (at, &trimmed[..len])
}

/// Where the tag or expression whose text starts at `from` ends, past its `close` (`%}` or
/// `}}`), its strings skipped; the end of `source` if it does not.
fn past_close(source: &str, from: usize, close: &str) -> usize {
    let bytes = source.as_bytes();
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'"' | b'\'') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'+' if bytes[i + 1..].starts_with(close.as_bytes()) => {
                return i + 1 + close.len();
            }
            _ if bytes[i..].starts_with(close.as_bytes()) => return i + close.len(),
            _ => i += 1,
        }
    }
    source.len()
}

/// Where the text of a `{% raw %}` block that starts at `from` ends: past its `{% endraw %}`.
fn raw_end(source: &str, from: usize) -> usize {
    let mut at = from;
    while let Some(open) = source.get(at..).and_then(|s| s.find("{%")).map(|i| at + i) {
        let (_, keyword) = tag_keyword(source, open + 2);
        at = past_close(source, open + 2, "%}");
        if keyword == "endraw" {
            return at;
        }
    }
    source.len()
}

/// `source` with its `{# … #}` comments blanked out, offsets kept: an `{% if %}` inside one
/// guards nothing.
fn without_comments(source: &str) -> Cow<'_, str> {
    if !source.contains("{#") {
        return Cow::Borrowed(source);
    }
    let mut text = source.to_owned();
    let mut from = 0;
    while let Some(open) = text[from..].find("{#").map(|i| from + i) {
        let close = text[open..].find("#}").map_or(text.len(), |i| open + i + 2);
        text.replace_range(open..close, &" ".repeat(close - open));
        from = close;
    }
    Cow::Owned(text)
}

/// Whether byte `at` of `text` is inside an `if` branch that `guards` says is a guard. For
/// each `if`/`elif` condition, `guards` says whether its branch is entered only when guarded
/// and whether every later branch is (an `if` that tested the opposite). Tags are followed
/// as written (`if`, `elif`, `else`, `endif`, and `for` blocks, whose `else` is theirs),
/// with `-` trimming.
fn inside_branch_where(text: &str, at: usize, guards: impl Fn(&str) -> (bool, bool)) -> bool {
    /// One block being read: for an `if`, whether its current branch is guarded, and
    /// whether a later one is.
    enum Block {
        If { guarded: bool, later: bool },
        For,
    }
    let mut open: Vec<Block> = Vec::new();
    let mut rest = 0;
    while let Some(start) = text[rest..].find("{%").map(|i| rest + i) {
        if start >= at {
            break;
        }
        let Some(end) = text[start..].find("%}").map(|i| start + i) else {
            break;
        };
        let tag =
            text[start + 2..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let (keyword, condition) = tag.split_once(char::is_whitespace).unwrap_or((tag, ""));
        match (keyword, open.last_mut()) {
            ("if", _) => {
                let (guarded, later) = guards(condition);
                open.push(Block::If { guarded, later });
            }
            ("for", _) => open.push(Block::For),
            ("elif", Some(Block::If { guarded, later })) => {
                *guarded = *later || guards(condition).0;
            }
            ("else", Some(Block::If { guarded, later })) => *guarded = *later,
            ("endif" | "endfor", _) => {
                open.pop();
            }
            _ => {}
        }
        rest = end + 2;
    }
    open.iter()
        .any(|b| matches!(b, Block::If { guarded: true, .. }))
}

/// Whether `condition` tests `var` as defined (`var is defined`, `var is not undefined`;
/// `defined` true) or as missing (`var is not defined`, `var is undefined`, `not var is
/// defined`; false). A condition with `or` guards nothing: its branch may be entered either
/// way.
fn tests(condition: &str, var: &str, defined: bool) -> bool {
    let condition = condition.replace(['(', ')'], " ");
    if condition.split_whitespace().any(|w| w == "or") {
        return false;
    }
    condition.match_indices(var).any(|(at, _)| {
        let before = &condition[..at];
        if before
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
        {
            return false;
        }
        let negated = before.split_whitespace().next_back() == Some("not");
        let words: Vec<&str> = condition[at + var.len()..]
            .split_whitespace()
            .take(3)
            .collect();
        let positive = match words.as_slice() {
            ["is", "defined", ..] | ["is", "not", "undefined", ..] => true,
            ["is", "not", "defined", ..] | ["is", "undefined", ..] => false,
            _ => return false,
        };
        (positive != negated) == defined
    })
}

/// The offset of the first read of a field of `var` (`persona.type`) in `source` that is
/// not inside a block entered only when `var` is something (`{% if persona %}`, `{% if
/// persona is not none %}`, `{% if persona is defined %}`): where `var` is `none`, such a
/// read fails when rendered.
pub fn unguarded_field_of_none(source: &str, var: &str) -> Option<usize> {
    let field = format!("{var}.");
    source.match_indices(&field).map(|(at, _)| at).find(|&at| {
        let before = source[..at].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
            && !inside_defined_block(source, var, at)
            && !inside_branch_where(&without_comments(source), at, |condition| {
                (is_something(condition, var), false)
            })
    })
}

/// Whether `condition` is `var` itself or `var is not none` (alone or joined by `and`): the
/// other guard of a value that may be `none`.
fn is_something(condition: &str, var: &str) -> bool {
    let words: Vec<&str> = condition.split_whitespace().collect();
    !words.contains(&"or")
        && (words.windows(4).any(|w| w == [var, "is", "not", "none"])
            || words.first() == Some(&var) && words.get(1).is_none_or(|w| *w == "and")
            || words
                .windows(3)
                .any(|w| w[0] == "and" && w[1] == var && w[2] != "is"))
}

/// What follows a read of a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guard {
    /// `| default(…)` or `| d`.
    Default,
    /// `is defined`, `is undefined`, `is not defined`.
    Test,
    None,
}

/// How each read of `var` in `source` is guarded, in order.
fn read_guards(source: &str, var: &str) -> Vec<Guard> {
    read_guards_at(source, var)
        .into_iter()
        .map(|(_, g)| g)
        .collect()
}

/// [`read_guards`], each with the byte offset of its read.
fn read_guards_at(source: &str, var: &str) -> Vec<(usize, Guard)> {
    fn ident(c: char) -> bool {
        c.is_alphanumeric() || c == '_'
    }
    /// `rest` after the word `w` and the spaces that follow it.
    fn word<'a>(rest: &'a str, w: &str) -> Option<&'a str> {
        rest.strip_prefix(w)
            .filter(|after| !after.starts_with(ident))
            .map(str::trim_start)
    }
    let mut guards = Vec::new();
    for (at, _) in source.match_indices(var) {
        let before = source[..at].chars().next_back();
        let after = &source[at + var.len()..];
        if before.is_some_and(|c| ident(c) || c == '.') || after.starts_with(ident) {
            continue;
        }
        let after = after.trim_start();
        let guard = if let Some(filter) = after.strip_prefix('|') {
            let filter = filter.trim_start();
            if word(filter, "default")
                .or_else(|| word(filter, "d"))
                .is_some()
            {
                Guard::Default
            } else {
                Guard::None
            }
        } else if let Some(test) = word(after, "is") {
            let test = word(test, "not").unwrap_or(test);
            if word(test, "defined")
                .or_else(|| word(test, "undefined"))
                .is_some()
            {
                Guard::Test
            } else {
                Guard::None
            }
        } else {
            Guard::None
        };
        guards.push((at, guard));
    }
    guards
}

/// The span of `needle` inside the template's string literal, when the literal is written
/// without escapes (so offsets in the value equal offsets in the source).
/// The span of the `len` bytes at `at` in the template's text, when its literal is written
/// without escapes.
pub fn locate_at(template: &Template, at: usize, len: usize, files: &[SourceFile]) -> Option<Span> {
    let needle = template.source.get(at..at + len)?;
    locate_where(template, needle, files, |before, _| before.len() == at)
}

fn locate(template: &Template, needle: &str, files: &[SourceFile]) -> Option<Span> {
    locate_where(template, needle, files, |_, _| true)
}

/// [`locate`] of the first `needle` that `fits` (given the text before it and after it).
fn locate_where(
    template: &Template,
    needle: &str,
    files: &[SourceFile],
    fits: impl Fn(&str, &str) -> bool,
) -> Option<Span> {
    let file = files.get(template.span.file)?;
    let start = template.span.span.offset();
    let raw = file.text.get(start..start + template.span.span.len())?;
    let hashes = raw.len() - raw.trim_start_matches('#').len();
    let body = raw.get(hashes..raw.len().checked_sub(hashes)?)?;
    let inner = body.strip_prefix('"')?.strip_suffix('"')?;
    if inner != template.source {
        return None;
    }
    let (at, _) = inner
        .match_indices(needle)
        .find(|(at, _)| fits(&inner[..*at], &inner[at + needle.len()..]))?;
    let offset = start + hashes + 1 + at;
    Some(Span::new(
        template.span.file,
        SourceSpan::from(offset..offset + needle.len()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::Arc;

    fn setup(src: &str) -> (Vec<SourceFile>, Template) {
        let text = format!("user \"{src}\"\n");
        let files = vec![SourceFile::new(
            PathBuf::from("t.kdl"),
            "t.kdl".into(),
            Arc::from(text.as_str()),
        )];
        let t = Template {
            source: src.to_string(),
            span: Span::new(0, SourceSpan::from(5..5 + src.len() + 2)),
        };
        (files, t)
    }

    fn scope() -> Scope {
        Scope::env_only()
            .with("user_context", names(&["postal_code"]))
            .with("vars", names(&["quote"]))
    }

    /// A template has no other templates to load: a statement that loads one failed on
    /// every render of the run, and `check` passed it.
    #[test]
    fn a_statement_loading_another_template_is_an_error_at_its_keyword() {
        for (src, statement) in [
            ("Hi {% include 'x' %}", "include"),
            ("{%- from 'm' import f %}{{ f() }}", "from"),
            ("{% import 'm' as m %}", "import"),
            ("{% extends 'base' %}", "extends"),
        ] {
            let (files, t) = setup(src);
            let diags = check(&t, &scope(), &files);
            assert_eq!(diags.len(), 1, "{src}: {diags:?}");
            let text = format!("{:?}", diags[0]);
            assert!(
                text.contains(&format!("`{{% {statement} %}}` has no template to load")),
                "{text}"
            );
            let at = 6 + src.find(statement).unwrap();
            assert!(
                text.contains(&format!(
                    "offset: SourceOffset({at}), length: {}",
                    statement.len()
                )),
                "{src}: {text}"
            );
        }
        // Read as minijinja reads them: what a comment, a raw block or a string holds is
        // text, and hides nothing after it.
        for (src, statement) in [
            (
                "{% set a = \"{#\" %}[{% include 'x' %}]{% set b = \"#}\" %}",
                "include",
            ),
            ("{% raw %}{# {% endraw %} #}<{% include 'x' %}>", "include"),
            (
                "{%+ raw -%} {% include 'x' %} {%- endraw %}{% extends 'y' %}",
                "extends",
            ),
            ("{{ '}}' }}{% import 'm' as m %}", "import"),
        ] {
            let (files, t) = setup(src);
            let diags = check(&t, &scope(), &files);
            let text = format!("{diags:?}");
            assert!(
                text.contains(&format!("`{{% {statement} %}}` has no template to load")),
                "{src}: {text}"
            );
        }
        // Letters of more than one byte inside a tag are read past, not cut (names of
        // their own, checked as names).
        let (files, t) = setup("{{ é }}{% if ü %}{% endif %}");
        let diags = format!("{:?}", check(&t, &scope(), &files));
        assert!(diags.contains("undefined template variable `é`"), "{diags}");
        assert!(diags.contains("undefined template variable `ü`"), "{diags}");
        // Text that only names them: a comment, a raw block, a string, a variable.
        for src in [
            "{{ vars.quote ~ 'é' }} — ünïcode {{ 'ß' }}{% if vars.quote %}ü{% endif %}",
            "{# {% include 'x' %} #}hi",
            "{% raw %}{% include 'x' %}{% endraw %}",
            "{% set word = 'include' %}{{ word }}",
            "{{ vars.quote }} from {{ env.X }}",
            "{{ \"{% include\" }} is text",
            "{{ vars.quote ~ '{% import' }}",
        ] {
            let (files, t) = setup(src);
            assert!(check(&t, &scope(), &files).is_empty(), "{src}");
        }
    }

    #[test]
    fn accepts_defined_variables() {
        let (files, t) =
            setup("{{ user_context.postal_code }} {{ vars.quote }} {{ env.X }} {{ range(3) }}");
        assert!(check(&t, &scope(), &files).is_empty());
    }

    #[test]
    fn reports_undefined_with_suggestion_and_exact_span() {
        let (files, t) = setup("code {{ user_context.postl_code }}");
        let diags = check(&t, &scope(), &files);
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].kind, Kind::UndefinedVariable);
        assert_eq!(
            diags[0].message,
            "undefined template variable `user_context.postl_code`"
        );
        assert_eq!(
            diags[0].help_text(),
            Some("did you mean `user_context.postal_code`?")
        );
        // `user "` is 6 bytes, `code {{ ` is 8.
        assert_eq!(diags[0].offset(), 14);
    }

    /// Reads guarded by `default` or by an `is defined` test render without the field, as
    /// docs/language.md says; they were errors, and a valid suite did not load.
    #[test]
    fn guarded_reads_of_a_missing_field_are_accepted() {
        for src in [
            "{{ user_context.zip | default('z') }}",
            "{% if user_context.zip is defined %}{{ user_context.zip }}{% endif %}",
            "{% if user_context.zip is not defined %}none{% else %}{{ user_context.zip }}{% endif %}",
            "{%- if vars.quote %}{% elif user_context.zip is defined -%}{{ user_context.zip }}{% endif %}",
            "{% if user_context.zip is defined %}{% if vars.quote %}{{ user_context.zip }}{% endif %}{% endif %}",
            "{{ user_context.zip if user_context.zip is defined else 'none' }}",
            "{% if (user_context.zip is defined) %}{{ user_context.zip }}{% endif %}",
            "{% if user_context.postal_code and (user_context.zip is defined) %}{{ user_context.zip }}{% endif %}",
            "{% if user_context.zip is defined %}{% for c in vars.quote %}{{ c }}{% else %}none{% endfor %}{{ user_context.zip }}{% endif %}",
            "{% if user_context.zip is not defined %}none{% elif vars.quote %}{{ user_context.zip }}{% endif %}",
        ] {
            let (files, t) = setup(src);
            let diags = check(&t, &scope(), &files);
            assert!(diags.is_empty(), "{src}: {diags:?}");
        }
        // Unguarded, or a variable the scope does not have at all (a typo a default would
        // hide for ever): reported.
        for (src, var) in [
            ("{{ user_context.zip }}", "user_context.zip"),
            ("{{ user_context.zip | upper }}", "user_context.zip"),
            ("{{ user_contxt.zip | default('z') }}", "user_contxt"),
            // Tested in one place, read unguarded in another: strict rendering fails there.
            (
                "{% if user_context.zip is defined %}{{ user_context.zip }}{% endif %} {{ user_context.zip }}",
                "user_context.zip",
            ),
            (
                "{% if user_context.zip is defined %}a{% else %}{{ user_context.zip }}{% endif %}",
                "user_context.zip",
            ),
            (
                "{% if not user_context.zip is defined %}{{ user_context.zip }}{% endif %}",
                "user_context.zip",
            ),
            (
                "{% if user_context.zip is defined or vars.quote %}{{ user_context.zip }}{% endif %}",
                "user_context.zip",
            ),
            (
                "{# {% if user_context.zip is defined %} #}{{ user_context.zip }}",
                "user_context.zip",
            ),
        ] {
            let (files, t) = setup(src);
            let diags = check(&t, &scope(), &files);
            assert_eq!(diags.len(), 1, "{src}: {diags:?}");
            assert!(diags[0].message.contains(var), "{src}: {diags:?}");
        }
    }

    #[test]
    fn header_scope_is_env_only() {
        let (files, t) = setup("Bearer {{ env.TOKEN }} {{ user_context.x }}");
        let diags = check(&t, &Scope::env_only(), &files);
        assert_eq!(diags.len(), 1);
        assert_eq!(
            diags[0].message,
            "undefined template variable `user_context.x`"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        let (files, t) = setup("{{ user_context.postal_code ");
        let diags = check(&t, &scope(), &files);
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].kind, Kind::TemplateSyntax);
    }

    #[test]
    fn env_reads_with_a_default_are_not_reported() {
        let reads = |src: &str| {
            let (files, t) = setup(src);
            let mut reads = Vec::new();
            assert!(check_reading_env(&t, &Scope::env_only(), &files, &mut reads).is_empty());
            reads.into_iter().map(|r| r.value).collect::<Vec<_>>()
        };
        assert_eq!(
            reads("{{ env.A | default('x') }} {{ env.B|d }}"),
            Vec::<String>::new()
        );
        assert_eq!(
            reads("{{ 'y' if env.A is defined else 'n' }}"),
            Vec::<String>::new()
        );
        assert_eq!(reads("{{ env.A is not defined }}"), Vec::<String>::new());
        // One unguarded read is enough, and another variable's guard is not this one's.
        assert_eq!(reads("{{ env.A | default('x') }} {{ env.A }}"), ["A"]);
        assert_eq!(reads("{{ env.AB }} {{ env.A | default('x') }}"), ["AB"]);
        assert_eq!(reads("{{ env.A | upper }}"), ["A"]);
    }

    #[test]
    fn a_filter_test_or_function_that_does_not_exist_is_reported() {
        for src in [
            "{{ env.A | defaults }}",
            "{{ user_context.postal_code | uppercase }}",
            "{% if env.A is blank %}x{% endif %}",
            "{{ nowish() }}",
        ] {
            let (files, t) = setup(src);
            let diags = check(&t, &scope().with("env", Names::Any), &files);
            assert_eq!(diags.len(), 1, "{src}: {diags:?}");
            assert_eq!(diags[0].kind, Kind::TemplateSyntax, "{src}");
            assert!(
                diags[0].message.contains("unknown"),
                "{src}: {}",
                diags[0].message
            );
        }
        let (files, t) = setup("{{ user_context.postal_code | upper | replace(' ', '') }}");
        assert!(check(&t, &scope(), &files).is_empty());
        // Said at the filter's name, with the name meant; and the text's other problems are
        // said too.
        let (files, t) = setup("uppr {{ user_context.postl_code }} {{ vars.quote | uppr }}");
        let diags = check(&t, &scope(), &files);
        assert_eq!(diags.len(), 2, "{diags:?}");
        assert_eq!(diags[0].help_text(), Some("did you mean `upper`?"));
        // `user "` is 6 bytes, and the filter (not the word before) starts 51 bytes in.
        assert_eq!(diags[0].offset(), 6 + 51);
        assert_eq!(
            diags[1].message,
            "undefined template variable `user_context.postl_code`"
        );
        // The whole name, where it is a filter: not inside a longer one, and in a filter
        // block too.
        for (src, at) in [
            ("{{ vars.quote | lower }} {{ vars.quote | low }}", 41),
            ("{% filter uppr %}x{% endfilter %}", 10),
        ] {
            let (files, t) = setup(src);
            let diags = check(&t, &scope(), &files);
            assert_eq!(diags.len(), 1, "{src}: {diags:?}");
            assert_eq!(diags[0].offset(), 6 + at, "{src}");
        }
    }

    #[test]
    fn plain_strings_are_not_templates() {
        let (files, t) = setup("price is } or {");
        assert!(check(&t, &Scope::empty(), &files).is_empty());
    }
}
