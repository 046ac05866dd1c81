//! Instances: reading each `dataset` and replacing every `for-each` / `matrix` scenario by
//! one scenario per row and combination of values.
//!
//! The loader reads the datasets after decoding (their columns scope `row.*` in the
//! templates `validate` checks on the scenario as written, once, not once per row), and
//! expands only a project without errors, so each instance is a plain scenario to the
//! planner, the executor and the reports: its id is `ID[ROW-ID]`, `ID[NAME=VALUE,…]` or
//! `ID[ROW-ID,NAME=VALUE,…]`, and [`Scenario::instance`] carries its row and values.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use minijinja::value::Serde;
use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value;

use crate::dataset::{self, Row, Select};
use crate::diagnostics::{Diagnostic, Kind, suggest};
use crate::model::*;
use crate::validate::LoadInfo;

/// The rows each dataset keeps, by id (a dataset of a format without a reader here has
/// none).
pub(crate) type Tables = HashMap<String, Vec<Row>>;

/// A map hashed with foldhash, for keys from the suites and their datasets.
type Hashed<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// A set hashed with foldhash, as [`Hashed`].
type HashedSet<T> = std::collections::HashSet<T, foldhash::fast::FixedState>;

/// Reads every dataset (filter, sample and limit applied as rows stream by), records their
/// columns in `info` for the template checks, and reports unreadable files, bad rows and
/// `for-each` references to no dataset; CSV columns of two types go to `warnings`.
pub(crate) fn read_datasets(
    project: &Project,
    info: &mut LoadInfo,
    diags: &mut Vec<Diagnostic>,
    warnings: &mut Vec<Diagnostic>,
) -> Tables {
    let files = &project.files;
    let mut tables = Tables::new();
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for ds in &project.datasets {
        if let Some(first) = seen.get(ds.id.value.as_str()) {
            diags.push(
                Diagnostic::at_span(
                    Kind::DuplicateId,
                    format!("dataset `{}` is declared twice", ds.id.value),
                    files,
                    ds.id.span,
                    "declared again",
                )
                .with_other(files, *first, "first declared here")
                .with_help("dataset ids are global across the files loaded together; rename one"),
            );
            continue;
        }
        seen.insert(&ds.id.value, ds.id.span);
        match read_one(ds, files, diags) {
            Ok(Some((columns, rows))) => {
                mixed_columns(ds, &columns, &rows, files, warnings);
                // No row and no declared column (an empty JSON array): nothing to check
                // `row.*` against, and nothing will run.
                let known = (!columns.is_empty()).then(|| columns.clone());
                info.dataset_columns.insert(ds.id.value.clone(), known);
                tables.insert(ds.id.value.clone(), fill_columns(&columns, rows));
            }
            Ok(None) => {
                info.dataset_columns.insert(ds.id.value.clone(), None);
            }
            Err(d) => {
                // Known but unread: `row.*` is not checked, so the one error is the file's.
                info.dataset_columns.insert(ds.id.value.clone(), None);
                diags.push(*d);
            }
        }
    }
    let ids: Vec<&str> = project
        .datasets
        .iter()
        .map(|d| d.id.value.as_str())
        .collect();
    for suite in &project.suites {
        for sc in &suite.scenarios {
            let Some(name) = &sc.for_each else { continue };
            let misspelled = info
                .declared
                .contains(&(crate::validate::RefKind::Dataset, name.value.clone()));
            if !seen.contains_key(name.value.as_str()) && !misspelled && !info.broken {
                diags.push(
                    Diagnostic::at_span(
                        Kind::UndefinedReference,
                        format!("undefined dataset `{}`", name.value),
                        files,
                        name.span,
                        "no such dataset",
                    )
                    .with_help(if ids.is_empty() {
                        "declare it with `dataset \"ID\" path=\"…\"`".to_owned()
                    } else {
                        let hint = suggest(&name.value, ids.iter().copied(), "the datasets");
                        let stop = if hint.ends_with('?') { "" } else { "." };
                        format!("{hint}{stop} Or declare it with `dataset \"ID\" path=\"…\"`")
                    }),
                );
            }
        }
    }
    tables
}

/// Warns of each column of a CSV dataset whose fields read as numbers in some rows and as
/// text in others: CSV has no types, a field is typed alone (`10001` a number, `02134`
/// text), so a template comparing the column (`row.zip > 10000`) meets both, and the
/// `row` column of the tables holds both (a typed decode of it fails).
fn mixed_columns(
    ds: &Dataset,
    columns: &[String],
    rows: &[dataset::Row],
    files: &[SourceFile],
    diags: &mut Vec<Diagnostic>,
) {
    let csv = ds
        .resolved
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| {
            ["csv", "tsv", "tab"]
                .iter()
                .any(|c| e.eq_ignore_ascii_case(c))
        });
    if !csv {
        return;
    }
    for column in columns {
        // Rows of numbers, and of non-empty text with the first such row and its field.
        let (mut numbers, mut texts) = (0usize, (0usize, 0usize, ""));
        for row in rows {
            match row.fields.get(column) {
                Some(Value::Number(_)) => numbers += 1,
                Some(Value::String(text)) if !text.is_empty() => {
                    if texts.0 == 0 {
                        texts = (0, row.number, text.as_str());
                    }
                    texts.0 += 1;
                }
                _ => {}
            }
        }
        if numbers == 0 || texts.0 == 0 {
            continue;
        }
        let shown: String = texts.2.chars().take(40).collect();
        diags.push(
            Diagnostic::at_span(
                Kind::MixedColumn,
                format!(
                    "column `{column}` of dataset `{}` reads as a number in {} and as text in {} \
                     (row {}: `{shown}`)",
                    ds.id.value,
                    rows_said(numbers),
                    rows_said(texts.0),
                    texts.1
                ),
                files,
                ds.path.span,
                "a column of two types",
            )
            .with_help(format!(
                "CSV is typed field by field (`007` and `1.50` stay text, `10001` is a number): \
                 compare it as text in templates (`row.{column} | string`), or write its values \
                 alike"
            )),
        );
    }
}

fn rows_said(n: usize) -> String {
    if n == 1 {
        "1 row".to_owned()
    } else {
        format!("{n} rows")
    }
}

/// Rows of a heterogeneous file (JSON Lines whose objects differ) get every column, absent
/// ones as `null`, so `row.x` means the same in every instance.
fn fill_columns(columns: &[String], rows: Vec<Row>) -> Vec<Row> {
    rows.into_iter()
        .map(|row| {
            if columns.iter().all(|c| row.fields.contains_key(c)) {
                return row;
            }
            let mut fields = (*row.fields).clone();
            for c in columns {
                fields.entry(c.clone()).or_insert(Value::Null);
            }
            Row {
                number: row.number,
                fields: Arc::new(fields),
            }
        })
        .collect()
}

/// One dataset's columns and kept rows; `None` when no reader of its format is registered.
#[allow(clippy::type_complexity)]
fn read_one(
    ds: &Dataset,
    files: &[SourceFile],
    diags: &mut Vec<Diagnostic>,
) -> Result<Option<(Vec<String>, Vec<Row>)>, Box<Diagnostic>> {
    let shown = crate::parse::display_name(&ds.resolved);
    let at = |kind: Kind, message: String, label: &str| {
        Diagnostic::at_span(kind, message, files, ds.path.span, label)
    };
    // Said before the format, which a directory or an empty path has none of.
    if ds.path.value.trim().is_empty() {
        return Err(Box::new(
            at(
                Kind::InvalidValue,
                format!("dataset `{}`: the path is empty", ds.id.value),
                "no file named",
            )
            .with_help(
                "name the dataset's file, relative to this suite file: path=\"data/cases.csv\"",
            ),
        ));
    }
    if ds.resolved.is_dir() {
        return Err(Box::new(
            at(
                Kind::InvalidValue,
                format!("dataset `{}`: {shown} is a directory", ds.id.value),
                "a directory, not a file",
            )
            .with_help("name one .csv, .tsv, .jsonl, .json or .parquet file in it"),
        ));
    }
    let reader = match dataset::reader_for(&ds.resolved) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(None),
        Err(why) => {
            return Err(Box::new(
                at(
                    Kind::InvalidValue,
                    format!("dataset `{}`: {why}", ds.id.value),
                    "unknown format",
                )
                .with_help(
                    "name a .csv or .tsv (header row), .jsonl, .json (array of objects) or .parquet file",
                ),
            ));
        }
    };
    let env = row_env();
    // `filter="{{ EXPR }}"` is evaluated as an expression (its truth, as `if` would take
    // it); a filter with text around its expressions must render `true` or `false`.
    enum Filter<'e> {
        Expr(minijinja::Expression<'e, 'e>),
        Text(minijinja::Template<'e, 'e>),
    }
    let filter = match &ds.filter {
        None => None,
        Some(t) => {
            let src = t.source.trim();
            let inner = src
                .strip_prefix("{{")
                .and_then(|s| s.strip_suffix("}}"))
                .filter(|s| !s.contains("{{") && !s.contains("}}"));
            let compiled = match inner {
                Some(expr) => env.compile_expression(expr.trim()).map(Filter::Expr),
                None => env.template_from_str(&t.source).map(Filter::Text),
            };
            match compiled {
                Ok(f) => Some(f),
                Err(e) => {
                    return Err(Box::new(
                        Diagnostic::at_span(
                            Kind::TemplateSyntax,
                            format!(
                                "dataset `{}`: invalid filter: {}",
                                ds.id.value,
                                template_error(&e)
                            ),
                            files,
                            t.span,
                            "this filter",
                        )
                        .with_help("e.g. filter=\"{{ row.status == 'open' }}\""),
                    ));
                }
            }
        }
    };
    // A column the file does not declare is one mistake, said once where it is written
    // (with the columns' names), not a failure of the first row. The dataset then keeps no
    // row, but its columns, so the scenarios over it are checked too: every error at once.
    if let (Some(t), Ok(Some(columns))) = (&ds.filter, reader.declared_columns(&ds.resolved)) {
        let scope = crate::template::Scope::empty().with(
            "row",
            crate::template::Names::Only(columns.iter().cloned().collect()),
        );
        if let Some(first) = crate::template::check(t, &scope, files).into_iter().next() {
            diags.push(first);
            return Ok(Some((columns, Vec::new())));
        }
    }
    let (mut filter_failed, mut filter_typed) = (false, false);
    let eval = |f: &Filter<'_>, fields: &Arc<dataset::Fields>| -> Result<bool, String> {
        let ctx = minijinja::context! { row => dataset::RowObject::value(fields) };
        let result = match f {
            // A text's truth is only whether it is empty: `{{ row.status }}` kept every row
            // with a status, surely meant as a comparison.
            Filter::Expr(e) => e.eval(ctx).map(|v| match v.as_str().map(str::trim) {
                None => Ok(v.is_true()),
                // Read as the text form's are: pandas writes `True` and `False`.
                Some(t) if t.eq_ignore_ascii_case("true") => Ok(true),
                Some(t) if t.eq_ignore_ascii_case("false") || t.is_empty() => Ok(false),
                Some(other) => Err(format!(
                    "the filter gave the text `{other}`, not true or false: compare it \
                     (`row.status == 'open'`)"
                )),
            }),
            Filter::Text(t) => t.render(ctx).map(|text| match text.trim() {
                t if t.eq_ignore_ascii_case("true") => Ok(true),
                t if t.eq_ignore_ascii_case("false") || t.is_empty() => Ok(false),
                other => Err(format!(
                    "the filter rendered `{other}`, not `true` or `false`"
                )),
            }),
        };
        result
            .map_err(|e| format!("the filter failed: {}", template_error(&e)))
            .and_then(|r| r)
    };
    // A filter that tests a field's type (`row.code is string`) asks about types, whose
    // verdict rightly changes with them.
    let tests_types = ds.filter.as_ref().is_some_and(|t| {
        let words: Vec<&str> = t.source.split_whitespace().collect();
        words.iter().enumerate().any(|(i, w)| {
            let tested = match words.get(i + 1) {
                Some(&"not") => words.get(i + 2),
                next => next,
            };
            *w == "is"
                && tested.is_some_and(|t| {
                    ["string", "number", "integer", "float"]
                        .iter()
                        .any(|kind| t.starts_with(kind))
                })
        })
    });
    let mut keep = |fields: &Arc<dataset::Fields>| -> Result<bool, String> {
        let Some(f) = &filter else { return Ok(true) };
        let result = eval(f, fields).and_then(|kept| {
            if tests_types {
                return Ok(kept);
            }
            match text_taken_for_number(fields, kept, &|view| eval(f, view)) {
                Some(why) => {
                    filter_typed = true;
                    Err(why)
                }
                None => Ok(kept),
            }
        });
        filter_failed |= result.is_err();
        result
    };
    let select = Select {
        filter: Some(&mut keep),
        sample: ds.sample.map(|n| (n, ds.seed)),
        limit: ds.limit,
    };
    match dataset::read(reader.as_ref(), &ds.resolved, select) {
        Ok(read) => Ok(Some(read)),
        Err(e) => {
            let (label, help) = match &e {
                dataset::ReadError::Io(_) => (
                    "cannot read",
                    "the path is relative to the suite file that declares the dataset",
                ),
                dataset::ReadError::Row { .. } if filter_failed => {
                    let span = ds.filter.as_ref().map_or(ds.path.span, |f| f.span);
                    return Err(Box::new(
                        Diagnostic::at_span(
                            Kind::InvalidValue,
                            format!("dataset `{}` ({shown}): {e}", ds.id.value),
                            files,
                            span,
                            "for this row",
                        )
                        .with_help(if filter_typed {
                            "CSV keeps a field as written when it would not read back the same \
                             as a number (`1.50`, `007`); a JSON string stays text"
                        } else {
                            "the filter sees `row` (the row's fields); a column some rows lack \
                             is an error: test it first, e.g. \"{{ row.x is defined and row.x > 1 }}\""
                        }),
                    ));
                }
                dataset::ReadError::Row { .. } => (
                    "bad row",
                    "fix the row in the file (`filter=` sees only rows that read)",
                ),
                dataset::ReadError::Rows(_) => (
                    "bad rows",
                    "fix the rows in the file (`filter=` sees only rows that read)",
                ),
                dataset::ReadError::Format(_) => ("not of its format", format_help(&ds.resolved)),
            };
            Err(Box::new(
                at(
                    Kind::InvalidValue,
                    format!("dataset `{}` ({shown}): {e}", ds.id.value),
                    label,
                )
                .with_help(help),
            ))
        }
    }
}

/// Why a filter's verdict on a row is one of types, not of values: a field that holds a
/// number as text (CSV keeps `1.50` and `007` as written) compared with a number is never
/// equal to it and orders after every number, so `row.price > 10` keeps `"1.50"`
/// silently. Told by evaluating the row again: with those fields as numbers, and with them
/// as other text; a verdict that changes with the type but not with the text is one the
/// text's value never entered (a comparison of the text itself, `row.zip == '02134'`,
/// changes with the text, and stands).
fn text_taken_for_number(
    fields: &Arc<dataset::Fields>,
    kept: bool,
    eval: &dyn Fn(&Arc<dataset::Fields>) -> Result<bool, String>,
) -> Option<String> {
    let as_number = |text: &str| -> Option<Value> {
        let text = text.trim();
        if let Ok(n) = text.parse::<i64>() {
            return Some(Value::from(n));
        }
        // `inf` and `NaN` parse as floats and are no one's number.
        let n = text.parse::<f64>().ok().filter(|n| n.is_finite())?;
        serde_json::Number::from_f64(n).map(Value::Number)
    };
    let numeric: Vec<(&String, &str, Value)> = fields
        .iter()
        .filter_map(|(k, v)| {
            let text = v.as_str()?;
            Some((k, text, as_number(text)?))
        })
        .collect();
    if numeric.is_empty() {
        return None;
    }
    let view = |which: &dyn Fn(&str) -> bool, text: bool| {
        let mut view = (**fields).clone();
        for (k, _, n) in &numeric {
            if which(k) {
                // A text no column holds and no filter names.
                let value = if text {
                    Value::from("\u{0}")
                } else {
                    n.clone()
                };
                view.insert((*k).clone(), value);
            }
        }
        Arc::new(view)
    };
    // As numbers the filter must still evaluate: one that fails on a number (`| length`,
    // `in`, a slice) does text work on the field, not a comparison with a number.
    match eval(&view(&|_| true, false)) {
        Ok(as_numbers) if as_numbers != kept => {}
        _ => return None,
    }
    if eval(&view(&|_| true, true)).ok() != Some(kept) {
        return None;
    }
    let (column, text, number) = numeric
        .iter()
        .find(|(k, _, _)| eval(&view(&|c| c == k.as_str(), false)).is_ok_and(|v| v != kept))
        .unwrap_or(&numeric[0]);
    // `007` is an integer's text: `| int` reads it as the number it spells.
    let as_number = if number.is_i64() { "int" } else { "float" };
    Some(format!(
        "the filter compares `{column}`, the text `{text}`, with a number: a text is never \
         equal to a number and orders after every one, so the row was {} by type, not by \
         value; compare it as a number (`row.{column} | {as_number}`) or as text (`'{text}'`)",
        if kept { "kept" } else { "dropped" }
    ))
}

/// What a file of `path`'s format must hold, for one that does not read as it.
fn format_help(path: &std::path::Path) -> &'static str {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "csv" | "tsv" | "tab" => "a CSV or TSV file starts with a header row naming its columns",
        "json" => "a .json dataset is one top-level array of objects, a row each",
        "jsonl" | "ndjson" => "a JSON Lines dataset is one JSON object per line",
        "parquet" => {
            "the file is damaged or not Parquet: write it again from its source (pandas' \
             `to_parquet`, polars' `write_parquet`); a file cut short or edited as text does not read"
        }
        _ => {
            "CSV needs a header row; JSON a top-level array of objects; JSON Lines one object per line"
        }
    }
}

fn row_env() -> Environment<'static> {
    let mut env = Environment::new();
    // Debug mode (on in debug builds) changes what errors print: off, as in release.
    env.set_debug(false);
    // `row.orderid` for `row.order_id` is an error naming the row, not an empty id.
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_formatter(crate::template::write_value);
    env
}

fn template_error(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(detail) => detail.to_string(),
        None => e.kind().to_string(),
    }
}

/// Replaces every `for-each` / `matrix` scenario of `project` by its instances and points
/// `needs` on such a scenario at all of them. Reports row ids that fail to render, are empty
/// or repeat.
pub(crate) fn expand(project: &mut Project, tables: &Tables, diags: &mut Vec<Diagnostic>) {
    let env = row_env();
    // `suite/ID` and (within the suite) `ID` of an expanded scenario → its instance ids.
    let mut expanded: HashMap<(usize, String), Vec<String>> = HashMap::new();
    let files = std::mem::take(&mut project.files);
    let with_filter: HashSet<String> = project
        .datasets
        .iter()
        .filter(|d| d.filter.is_some())
        .map(|d| d.id.value.clone())
        .collect();
    let mut empty = Vec::new();
    // Only a `needs` reads which instances a scenario became: without one, their ids are
    // not listed again (100,000 copies for a dataset of as many rows).
    let any_needs = project
        .suites
        .iter()
        .any(|suite| suite.scenarios.iter().any(|sc| !sc.needs.is_empty()));
    for (si, suite) in project.suites.iter_mut().enumerate() {
        if suite
            .scenarios
            .iter()
            .all(|s| s.for_each.is_none() && s.matrix.is_empty())
        {
            continue;
        }
        let mut out: Vec<Arc<Scenario>> = Vec::with_capacity(suite.scenarios.len());
        for sc in std::mem::take(&mut suite.scenarios) {
            if sc.for_each.is_none() && sc.matrix.is_empty() {
                out.push(sc);
                continue;
            }
            let instances = instances(&sc, tables, &env, &files, diags);
            if let Some(name) = sc.for_each.as_deref()
                && tables.get(&name.value).is_some_and(Vec::is_empty)
            {
                let filtered = with_filter.contains(name.value.as_str());
                empty.push((
                    sc.id.clone(),
                    format!(
                        "dataset `{}` keeps no row{}",
                        name.value,
                        if filtered {
                            " (its filter is false for every row)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            if any_needs {
                expanded.insert(
                    (si, sc.id.value.clone()),
                    instances.iter().map(|i| i.id.value.clone()).collect(),
                );
            }
            out.extend(instances.into_iter().map(Arc::new));
        }
        suite.scenarios = out;
    }
    project.files = files;
    project.empty_expansions = empty;
    histories(project, &env, diags);
    if expanded.is_empty() {
        return;
    }
    let names: HashMap<String, usize> = project
        .suites
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.clone(), i))
        .collect();
    for (si, suite) in project.suites.iter_mut().enumerate() {
        for sc in &mut suite.scenarios {
            for need in &sc.needs {
                if let Some(d) = missing_instance(&names, si, need, &expanded, &project.files) {
                    diags.push(d);
                }
            }
            let touches = sc
                .needs
                .iter()
                .any(|n| target(&names, si, &n.value, &expanded).is_some());
            if !touches {
                continue;
            }
            let sc = Arc::make_mut(sc);
            let mut needs = Vec::with_capacity(sc.needs.len());
            for need in std::mem::take(&mut sc.needs) {
                match target(&names, si, &need.value, &expanded) {
                    Some((prefix, ids)) => needs.extend(
                        ids.iter()
                            .map(|id| Spanned::new(format!("{prefix}{id}"), need.span)),
                    ),
                    None => needs.push(need),
                }
            }
            sc.needs = needs;
        }
    }
}

/// The instances `need` (as written in suite `si`) stands for, with the `suite/` prefix to
/// write them with.
fn target<'e>(
    names: &HashMap<String, usize>,
    si: usize,
    need: &str,
    expanded: &'e HashMap<(usize, String), Vec<String>>,
) -> Option<(String, &'e Vec<String>)> {
    if let Some((suite, id)) = crate::graph::split_reference(need) {
        let s = *names.get(suite)?;
        return expanded
            .get(&(s, id.to_string()))
            .map(|ids| (format!("{suite}/"), ids));
    }
    expanded
        .get(&(si, need.to_string()))
        .map(|ids| (String::new(), ids))
}

/// The error of a `need` that names one instance (`m[model=a]`, as `check` lets through
/// for a `for-each` or `matrix` scenario `m`) that its scenario did not expand into.
fn missing_instance(
    names: &HashMap<String, usize>,
    si: usize,
    need: &Spanned<String>,
    expanded: &HashMap<(usize, String), Vec<String>>,
    files: &[SourceFile],
) -> Option<Diagnostic> {
    let (suite, id) = match crate::graph::split_reference(&need.value) {
        Some((suite, id)) => (*names.get(suite)?, id),
        None => (si, need.value.as_str()),
    };
    let base = crate::graph::instance_base(id)?;
    let ids = expanded.get(&(suite, base.to_string()))?;
    if ids.iter().any(|i| i == id) {
        return None;
    }
    // The suite, as the reference is written (`full/`), goes with what it is told to write.
    let prefix = &need.value[..need.value.len() - id.len()];
    let help = match crate::diagnostics::did_you_mean(id, ids.iter().map(String::as_str)) {
        Some(best) => format!("did you mean `{prefix}{best}`?"),
        None => {
            let shown: Vec<String> = ids.iter().take(5).map(|i| format!("`{i}`")).collect();
            let more = ids.len().saturating_sub(shown.len());
            format!(
                "`{base}` has {} instance{}: {}{}; `needs \"{base}\"` waits for all of them",
                ids.len(),
                if ids.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            )
        }
    };
    Some(
        Diagnostic::at_span(
            Kind::UndefinedReference,
            format!("scenario `{base}` has no instance `{id}`"),
            files,
            need.span,
            "no instance with this id",
        )
        .with_help(help),
    )
}

/// The `row.NAME` columns a template reads by name (`{{ row.id }}`, `row.id | upper`).
fn row_reads(template: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find("row.") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + 4..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `row.x` itself, not `borrow.x` or `vars.row.x`.
        if !name.is_empty()
            && before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        {
            out.push(name.clone());
        }
        rest = &after[name.len()..];
    }
    out
}

/// One scenario per row (or one without rows) and per combination of matrix values.
fn instances(
    sc: &Scenario,
    tables: &Tables,
    env: &Environment<'static>,
    files: &[SourceFile],
    diags: &mut Vec<Diagnostic>,
) -> Vec<Scenario> {
    let dataset = sc.for_each.as_ref().map(|d| d.value.clone());
    // Each row with its id (`None` rows: a matrix-only scenario).
    let mut rows: Vec<Option<(String, &Row)>> = Vec::new();
    match &dataset {
        None => rows.push(None),
        Some(name) => {
            let compiled = match &sc.row_id {
                None => None,
                Some(t) => match env.template_from_str(&t.source) {
                    Ok(c) => Some((c, t.span)),
                    Err(e) => {
                        diags.push(Diagnostic::at_span(
                            Kind::TemplateSyntax,
                            format!("invalid row-id: {}", template_error(&e)),
                            files,
                            t.span,
                            "this template",
                        ));
                        return Vec::new();
                    }
                },
            };
            // `row-id "{{ EXPR }}"` of a row where EXPR is null would render `none`: an
            // error instead, as an id of `none` for every such row is surely not meant.
            let expr = sc.row_id.as_ref().and_then(|t| {
                let inner = t.source.trim().strip_prefix("{{")?.strip_suffix("}}")?;
                if inner.contains("{{") || inner.contains("}}") {
                    return None;
                }
                env.compile_expression(inner.trim()).ok()
            });
            // Whether the template is that expression alone, with no whitespace control
            // (`{{- x }}`): then a string or number it evaluates to is the id as rendered
            // (the environment escapes nothing, and writes both as they display), without
            // rendering the template after evaluating it for the null check above.
            let lone = sc.row_id.as_ref().is_some_and(|t| {
                t.source
                    .trim()
                    .strip_prefix("{{")
                    .and_then(|inner| inner.strip_suffix("}}"))
                    .is_some_and(|inner| {
                        !inner.starts_with(['-', '+']) && !inner.ends_with(['-', '+'])
                    })
            });
            // Sized for every row, hashed with foldhash (ids come from the user's own rows):
            // grown from empty with SipHash, the two sets of ids were a fifth of expanding a
            // dataset of 100,000 rows.
            let mut first: Hashed<String, usize> = Hashed::with_capacity_and_hasher(
                tables.get(name).map_or(0, Vec::len),
                Default::default(),
            );
            // A template wrong for every row would otherwise give one error per row: the
            // first few are shown, the rest counted in one more.
            const SHOWN_ROW_ERRORS: usize = 3;
            let mut row_errors = 0usize;
            let mut clashes = 0usize;
            let all_rows = tables.get(name).map(Vec::as_slice).unwrap_or_default();
            // A column no row has is `check`'s error on the template (with the columns'
            // names): its failure on every row says nothing more.
            let reads_no_column = sc.row_id.as_ref().is_some_and(|t| {
                row_reads(&t.source).iter().any(|column| {
                    !all_rows.is_empty()
                        && all_rows
                            .iter()
                            .all(|row| !row.fields.contains_key(column.as_str()))
                })
            });
            if reads_no_column {
                return Vec::new();
            }
            for row in all_rows {
                let ctx = || minijinja::context! { row => dataset::RowObject::value(&row.fields) };
                let value = match &compiled {
                    Some(_) => expr.as_ref().and_then(|e| e.eval(ctx()).ok()),
                    None => None,
                };
                // In NFC, as ids are compared: `café` typed precomposed in one row and with a
                // combining accent in another is one id, not two instances that look the same.
                let id = match (&compiled, value) {
                    (None, _) => Ok(dataset::content_id(&row.fields)),
                    (Some(_), Some(v)) if v.is_none() || v.is_undefined() => Err(format!(
                        "`{}` is null in this row",
                        sc.row_id.as_ref().map_or("", |t| t.source.trim())
                    )),
                    (Some(_), Some(v))
                        if lone
                            && matches!(
                                v.kind(),
                                minijinja::value::ValueKind::String
                                    | minijinja::value::ValueKind::Number
                            ) =>
                    {
                        Ok(crate::names::nfc(v.to_string().trim()).into_owned())
                    }
                    (Some((c, _)), _) => c
                        .render(ctx())
                        .map(|s| crate::names::nfc(s.trim()).into_owned())
                        .map_err(|e| template_error(&e)),
                };
                // Each problem with the help that fits it.
                let problem = match &id {
                    Err(e) => Some((
                        format!("row-id failed: {e}"),
                        "each row needs an id from its own values: check the columns the \
                         template reads against the dataset's, and that this row has them",
                    )),
                    Ok(id) if id.is_empty() => Some((
                        "row-id rendered empty".to_string(),
                        "the column is empty in this row: use one every row fills",
                    )),
                    Ok(id) if id.contains(['/', '[', ']', '\n']) => Some((
                        format!(
                            "row-id `{id}` holds `/`, `[`, `]` or a line break, which instance \
                             ids cannot"
                        ),
                        "replace them in the template, e.g. \"{{ row.id | replace('/', '-') }}\"",
                    )),
                    Ok(id) => first.get(id).map(|other| {
                        (
                            format!("row id `{id}` is also row {other}'s"),
                            if compiled.is_some() {
                                "two rows give this id: use a column whose values are unique, \
                                 or join two (\"{{ row.customer }}-{{ row.order }}\")"
                            } else {
                                "the default id is a hash of the row's content: two rows are \
                                 identical; remove one or add `row-id`"
                            },
                        )
                    }),
                };
                if let Some((problem, help)) = problem {
                    let span = compiled.as_ref().map_or(sc.id.span, |(_, s)| *s);
                    // A failing template and ids that clash are each counted together
                    // past the first few (`row-id "{{ row.status }}"` clashes on nearly
                    // every row); an id holding a `/` is a row of its own to fix.
                    let clash = id.as_ref().is_ok_and(|id| first.contains_key(id));
                    if id.is_err() || clash {
                        let counter = if clash { &mut clashes } else { &mut row_errors };
                        *counter += 1;
                        if *counter > SHOWN_ROW_ERRORS {
                            continue;
                        }
                    }
                    diags.push(
                        Diagnostic::at_span(
                            Kind::InvalidValue,
                            format!(
                                "scenario `{}`, row {} of dataset `{name}`: {problem}",
                                sc.id.value, row.number
                            ),
                            files,
                            span,
                            "for this row",
                        )
                        .with_help(help),
                    );
                    continue;
                }
                let Ok(id) = id else { continue };
                first.insert(id.clone(), row.number);
                rows.push(Some((id, row)));
            }
            if clashes > SHOWN_ROW_ERRORS {
                let span = sc.row_id.as_ref().map_or(sc.id.span, |t| t.span);
                diags.push(
                    Diagnostic::at_span(
                        Kind::InvalidValue,
                        format!(
                            "scenario `{}`: {} more rows of dataset `{name}` have an id an \
                             earlier row has ({} in all)",
                            sc.id.value,
                            clashes - SHOWN_ROW_ERRORS,
                            clashes
                        ),
                        files,
                        span,
                        "for those rows",
                    )
                    .with_help(
                        "row ids must be unique: use a column whose values are, or join two \
                         (\"{{ row.customer }}-{{ row.order }}\")",
                    ),
                );
            }
            if row_errors > SHOWN_ROW_ERRORS {
                let span = sc.row_id.as_ref().map_or(sc.id.span, |t| t.span);
                diags.push(
                    Diagnostic::at_span(
                        Kind::InvalidValue,
                        format!(
                            "scenario `{}`: row-id failed for {} more rows of dataset `{name}` \
                             ({} of its {} rows in all)",
                            sc.id.value,
                            row_errors - SHOWN_ROW_ERRORS,
                            row_errors,
                            all_rows.len()
                        ),
                        files,
                        span,
                        "for those rows",
                    )
                    .with_help("the rows above show why the template fails"),
                );
            }
        }
    }
    if let Some(name) = &dataset {
        missing_nested_fields(sc, &rows, name, files, diags);
    }
    // Counted before anything is built: a matrix of eight variables of ten values is a
    // hundred million instances, which took every byte of memory before any error.
    let count = sc.matrix.iter().fold(rows.len() as u64, |n, var| {
        n.saturating_mul(var.values.len() as u64)
    });
    if count > crate::validate::MAX_TRAJECTORIES {
        let (span, what) = match sc.matrix.first() {
            Some(var) => (var.name.span, "the matrix starts here"),
            None => (sc.id.span, "in this scenario"),
        };
        let shown = crate::validate::count_label(count);
        diags.push(
            Diagnostic::at_span(
                Kind::OutOfRange,
                format!(
                    "scenario `{}` has {shown} instances (at most {})",
                    sc.id.value,
                    crate::validate::MAX_TRAJECTORIES
                ),
                files,
                span,
                what,
            )
            .with_help(if sc.matrix.is_empty() {
                "one instance per dataset row: split the rows over several scenarios (each \
                 with its own `filter` on the dataset), or take part of them with \
                 `limit=`/`sample=`"
            } else {
                "a matrix makes one instance per combination of its values, times the \
                 dataset's rows: its variables' value counts multiply (8 variables of 10 \
                 values are 100,000,000); use fewer values, or `limit=`/`sample=` on the \
                 dataset"
            }),
        );
        return Vec::new();
    }
    // Runs of the whole scenario: its instances' trajectories, each `repeat` times (the
    // cap `check` applies to one instance, `validate::MAX_EXECUTIONS`).
    let per_instance =
        crate::graph::TrajectoryGraph::count(sc).saturating_mul(u64::from(sc.repeat));
    let runs = count.saturating_mul(per_instance);
    // One instance past the caps is `check`'s error already (validate.rs).
    let within_one = crate::graph::TrajectoryGraph::count(sc) <= crate::validate::MAX_TRAJECTORIES
        && per_instance <= crate::validate::MAX_EXECUTIONS;
    if count > 1 && !within_one {
        // Refused already; building its instances would only take the time.
        return Vec::new();
    }
    if count > 1 && runs > crate::validate::MAX_EXECUTIONS {
        let shown = crate::validate::count_label(runs);
        diags.push(
            Diagnostic::at_span(
                Kind::OutOfRange,
                format!(
                    "scenario `{}` runs {shown} times: {count} instances × their trajectories × \
                     `repeat {}` (at most {})",
                    sc.id.value,
                    sc.repeat,
                    crate::validate::MAX_EXECUTIONS
                ),
                files,
                sc.id.span,
                "too many runs",
            )
            .with_help(if sc.for_each.is_some() {
                "every run of a trajectory is a row of each results table and an entry of the \
                 journal: lower `repeat`, or take fewer rows with `limit=`/`sample=` on the \
                 dataset"
            } else {
                "every run of a trajectory is a row of each results table and an entry of the \
                 journal: lower `repeat`, or give the matrix fewer values"
            }),
        );
        return Vec::new();
    }
    let combos = combinations(&sc.matrix);
    // What each instance starts as: the scenario without its matrix, which was checked
    // before expansion and which no instance reads (its own values are `instance.vars`).
    // Each instance cloned the whole matrix: a matrix of 4,000 values held 16 million.
    let base = Scenario {
        matrix: Vec::new(),
        ..sc.clone()
    };
    let mut out = Vec::with_capacity(rows.len() * combos.len());
    let mut seen: HashedSet<String> =
        HashedSet::with_capacity_and_hasher(rows.len() * combos.len(), Default::default());
    // Each problem once, at the first instance that has it, with how many more do: a
    // misspelt column in a `user-context` value fails every row the same way.
    let mut problems = RowProblems::default();
    for row in &rows {
        for combo in &combos {
            let mut parts: Vec<String> = Vec::new();
            if let Some((id, _)) = row {
                parts.push(id.clone());
            }
            for (name, value) in combo {
                parts.push(format!("{name}={}", display(value)));
            }
            let id = format!("{}[{}]", sc.id.value, parts.join(","));
            if !seen.insert(id.clone()) {
                // Values of one variable that read the same (`1` and `"1"`) are refused
                // where they are written; here two combinations read as one because a value
                // holds `,` or `=` (`"p,b=q"`): one of them would silently never run.
                diags.push(
                    Diagnostic::at_span(
                        Kind::InvalidValue,
                        format!(
                            "scenario `{}`: two instances have the id `{id}`",
                            sc.id.value
                        ),
                        files,
                        sc.matrix.first().map_or(sc.id.span, |var| var.name.span),
                        "the matrix starts here",
                    )
                    .with_help(
                        "an instance id joins the row id and the matrix values with `,` and \
                         `=`: a value (or row id) holding them reads like another \
                         combination; write the values without `,` and `=`",
                    ),
                );
                continue;
            }
            let mut instance = base.clone();
            let fields = row.as_ref().map(|(_, r)| &*r.fields);
            let vars: serde_json::Map<String, Value> = combo.iter().cloned().collect();
            // Every field's problem at once: one per save made a suite of several typos
            // take as many saves to read.
            let mut found = render_user_context(env, &mut instance.user_context, fields, &vars);
            // A statement's `row.COLUMN` that is not a column was said where it is written
            // (validate.rs checks criteria templates against the columns): not again here.
            found.extend(
                render_judged(env, &mut instance, fields, &vars)
                    .into_iter()
                    .filter(|problem| {
                        !((problem.starts_with("judge statement: ")
                            || problem.starts_with("outcome: "))
                            && fields.is_some_and(|row| {
                                undefined_row_field(problem)
                                    .is_some_and(|name| !row.contains_key(name))
                            }))
                    }),
            );
            if !found.is_empty() {
                let at = match row {
                    Some((_, r)) => format!(
                        "row {} of dataset `{}`",
                        r.number,
                        dataset.as_deref().unwrap_or_default()
                    ),
                    None => format!("instance `{id}`"),
                };
                for problem in found {
                    let problem = with_column_hint(problem, fields);
                    problems.add(problem, || format!("scenario `{}`, {at}", sc.id.value));
                }
                continue;
            }
            instance.id = Spanned::new(id, sc.id.span);
            instance.instance = Some(Arc::new(Instance {
                base: sc.id.value.clone(),
                dataset: dataset.clone(),
                row_id: row.as_ref().map(|(id, _)| id.clone()),
                row_number: row.as_ref().map(|(_, r)| r.number),
                row: row.as_ref().map(|(_, r)| Arc::clone(&r.fields)),
                vars: combo.clone(),
            }));
            out.push(instance);
        }
    }
    problems.report(
        Said {
            what: "",
            span: sc.id.span,
            label: "in this scenario",
            help: "user-context values, `judge` statements, `outcome`s, `name` and \
                   `description` of a `for-each` or `matrix` scenario are templates over `row` \
                   and `vars`: check the field names against the dataset's columns",
        },
        files,
        diags,
    );
    out
}

/// `problem` with the column a `row.NAME` it says is undefined was most likely meant to be
/// (`row.amountt`: did you mean `row.amount`?), from the row's own columns.
fn with_column_hint(problem: String, row: Option<&dataset::Fields>) -> String {
    let (Some(row), Some(name)) = (row, undefined_row_field(&problem)) else {
        return problem;
    };
    match crate::diagnostics::did_you_mean(name, row.keys().map(String::as_str)) {
        Some(best) => format!("{problem}: did you mean `row.{best}`?"),
        None => problem,
    }
}

/// The `NAME` of the `row.NAME` a rendering problem says is undefined.
fn undefined_row_field(problem: &str) -> Option<&str> {
    if !problem.ends_with("is undefined") {
        return None;
    }
    problem.split("row.").nth(1).map(|rest| {
        rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default()
    })
}

/// Problems of instances, each with where it first happened and how many more instances
/// had it, in the order first seen.
#[derive(Default)]
struct RowProblems(Vec<(String, String, usize)>);

/// How [`RowProblems::report`] says its problems: after `what`, at `span`.
struct Said<'a> {
    what: &'a str,
    span: Span,
    label: &'a str,
    help: &'a str,
}

impl RowProblems {
    fn add(&mut self, problem: String, at: impl FnOnce() -> String) {
        match self.0.iter_mut().find(|(p, ..)| *p == problem) {
            Some((_, _, more)) => *more += 1,
            None => self.0.push((problem, at(), 0)),
        }
    }

    /// One diagnostic per problem, at its first instance, with how many more had it.
    fn report(self, said: Said<'_>, files: &[SourceFile], diags: &mut Vec<Diagnostic>) {
        for (problem, at, more) in self.0 {
            let more = match more {
                0 => String::new(),
                1 => " (and 1 more instance)".to_string(),
                n => format!(" (and {n} more instances)"),
            };
            diags.push(
                Diagnostic::at_span(
                    Kind::InvalidValue,
                    format!("{at}{more}: {}{problem}", said.what),
                    files,
                    said.span,
                    said.label,
                )
                .with_help(said.help),
            );
        }
    }
}

/// Reports each nested row field (`row.customer.name`) that a step of `sc` reads and some
/// rows lack: the turn would fault at run time, so it is an error now, at the read, naming
/// the first such row.
fn missing_nested_fields(
    sc: &Scenario,
    rows: &[Option<(String, &Row)>],
    dataset: &str,
    files: &[SourceFile],
    diags: &mut Vec<Diagnostic>,
) {
    let mut templates: Vec<&Template> = Vec::new();
    walk_steps(&sc.steps, &mut |step| match &step.kind {
        StepKind::User(t)
        | StepKind::Call { input: t, .. }
        | StepKind::Hitl {
            message: Some(t), ..
        } => templates.push(t),
        StepKind::Expect(criteria) => templates.extend(
            criteria
                .iter()
                .flat_map(|c| &c.templates)
                .map(|t| &t.template),
        ),
        _ => {}
    });
    templates.extend(
        sc.criteria
            .iter()
            .flat_map(|c| &c.templates)
            .map(|t| &t.template),
    );
    let mut reported = HashSet::new();
    for read in templates
        .into_iter()
        .flat_map(|t| crate::template::nested_row_reads(t, files))
    {
        let lacking: Vec<usize> = rows
            .iter()
            .flatten()
            .filter(|(_, row)| lacks(&row.fields, &read.value))
            .map(|(_, row)| row.number)
            .collect();
        let Some(first) = lacking.first() else {
            continue;
        };
        if !reported.insert((read.value.clone(), read.span)) {
            continue;
        }
        let more = match lacking.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more row)".to_string(),
            n => format!(" (and {n} more rows)"),
        };
        diags.push(
            Diagnostic::at_span(
                Kind::UndefinedVariable,
                format!(
                    "scenario `{}`: `{}` is missing in row {first} of dataset `{dataset}`{more}",
                    sc.id.value, read.value
                ),
                files,
                read.span,
                "read here",
            )
            .with_help(format!(
                "that turn would fail at run time: give every row the field, guard the read \
                 (`{{{{ {} | default('') }}}}`), or leave those rows out with `filter=`",
                read.value
            )),
        );
    }
}

/// Whether a row lacks the nested field `var` (`row.customer.name`) reads: its first level
/// (which other rows have, so the dataset's columns do not catch it), or a field below it.
fn lacks(fields: &dataset::Fields, var: &str) -> bool {
    let first = var.split('.').nth(1).unwrap_or_default();
    !fields.contains_key(first) || crate::template::missing_below(fields, var).is_some()
}

/// Every combination of the matrix's values, the first variable varying slowest.
fn combinations(matrix: &[MatrixVar]) -> Vec<Vec<(String, Value)>> {
    let mut out: Vec<Vec<(String, Value)>> = vec![Vec::new()];
    for var in matrix {
        let mut next = Vec::with_capacity(out.len() * var.values.len());
        for prefix in &out {
            for v in &var.values {
                let mut c = prefix.clone();
                c.push((var.name.value.clone(), v.clone()));
                next.push(c);
            }
        }
        out = next;
    }
    out
}

/// A matrix value in an instance id: strings as written, others as JSON.
pub fn display(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Loads every scenario's `history`: a file once however many scenarios name it, a
/// template once per instance (with its `row` and matrix `vars`).
fn histories(project: &mut Project, env: &Environment<'static>, diags: &mut Vec<Diagnostic>) {
    let Project { files, suites, .. } = project;
    let mut read: HashMap<std::path::PathBuf, Result<Arc<Vec<Value>>, String>> = HashMap::new();
    // Per history as written (its span): each problem once, as [`RowProblems`].
    let mut problems: Vec<(Span, RowProblems)> = Vec::new();
    for suite in suites.iter_mut() {
        for sc in &mut suite.scenarios {
            let Some(history) = &sc.history else { continue };
            if history.messages.is_some() {
                continue;
            }
            let (result, span) = match &history.source {
                HistorySource::File { path, resolved } => {
                    let r = read
                        .entry(resolved.clone())
                        .or_insert_with(|| {
                            let text = std::fs::read_to_string(resolved)
                                .map_err(|e| format!("cannot read `{}`: {e}", path.value))?;
                            let value: Value = serde_json::from_str(&text)
                                .map_err(|e| format!("`{}` is not JSON: {e}", path.value))?;
                            dataset::messages(value).map(Arc::new)
                        })
                        .clone();
                    (r, path.span)
                }
                HistorySource::Template(t) => {
                    let instance = sc.instance.as_deref();
                    let row = instance.and_then(|i| i.row.as_deref());
                    let vars: serde_json::Map<String, Value> = instance
                        .map(|i| i.vars.iter().cloned().collect())
                        .unwrap_or_default();
                    (
                        evaluate(env, &t.source, row, &vars)
                            .and_then(dataset::messages)
                            .map(Arc::new),
                        t.span,
                    )
                }
            };
            match result {
                Ok(list) => {
                    if let Some(h) = &mut Arc::make_mut(sc).history {
                        h.messages = Some(list);
                    }
                }
                Err(why) => {
                    // A `row.NAME` of no column: the template check says so, with the column
                    // meant; "invalid history" of each instance as well was the typo twice.
                    let row = sc.instance.as_deref().and_then(|i| i.row.as_deref());
                    if let (Some(row), Some(name)) = (row, undefined_row_field(&why))
                        && !row.contains_key(name)
                    {
                        continue;
                    }
                    let at = || match sc.instance.as_deref() {
                        Some(Instance {
                            dataset: Some(d),
                            row_number: Some(n),
                            ..
                        }) => format!("scenario `{}`, row {n} of dataset `{d}`", sc.id.value),
                        _ => format!("scenario `{}`", sc.id.value),
                    };
                    let index = match problems.iter().position(|(s, _)| *s == span) {
                        Some(index) => index,
                        None => {
                            problems.push((span, RowProblems::default()));
                            problems.len() - 1
                        }
                    };
                    problems[index].1.add(why, at);
                }
            }
        }
    }
    for (span, problems) in problems {
        problems.report(
            Said {
                what: "invalid history: ",
                span,
                label: "this history",
                help: "a history is an OpenAI-style message list: \
                       [{\"role\": \"user\", \"content\": \"…\"}, {\"role\": \"assistant\", …}], \
                       or an object with `messages`; from a column, a list or its JSON text",
            },
            files,
            diags,
        );
    }
}

/// Renders the `{{ … }}` templates in the string values of an instance's `user-context`
/// (nested ones too) with its `row` and matrix `vars`: a value that is one expression keeps
/// the expression's type (`"{{ row.amount }}"` is the number), others are text.
fn render_user_context(
    env: &Environment<'static>,
    context: &mut serde_json::Map<String, Value>,
    row: Option<&dataset::Fields>,
    vars: &serde_json::Map<String, Value>,
) -> Vec<String> {
    fn render(
        env: &Environment<'static>,
        value: &mut Value,
        row: Option<&dataset::Fields>,
        vars: &serde_json::Map<String, Value>,
    ) -> Result<(), String> {
        match value {
            Value::String(text) if text.contains("{{") || text.contains("{%") => {
                *value = evaluate_value(env, text, row, vars)?;
            }
            Value::Array(items) => {
                for item in items {
                    render(env, item, row, vars)?;
                }
            }
            Value::Object(map) => {
                for item in map.values_mut() {
                    render(env, item, row, vars)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let mut problems = Vec::new();
    for (key, value) in context.iter_mut() {
        if let Err(e) = render(env, value, row, vars) {
            problems.push(format!("user-context `{key}`: {e}"));
        }
    }
    problems
}

/// Renders the `{{ … }}` templates in an instance's `judge` statements and rubrics and
/// `outcome` statements (scenario-level, in `criteria` and in every `expect`), its `name` and its
/// `description` as text, with its `row` and matrix `vars`, so the judge reads the row's
/// values and the report names the row.
fn render_judged(
    env: &Environment<'static>,
    sc: &mut Scenario,
    row: Option<&dataset::Fields>,
    vars: &serde_json::Map<String, Value>,
) -> Vec<String> {
    // Whether `source` is a template the instance renders now. One that reads more than
    // the instance's `row` and `vars` (its `user_context`, `persona`, a capture…) is
    // rendered at run time, in the scope of the trajectory, with the row and matrix values
    // too.
    let renders = |source: &str| {
        (source.contains("{{") || source.contains("{%"))
            && env.template_from_str(source).is_ok_and(|t| {
                t.undeclared_variables(true).iter().all(|var| {
                    let mut parts = var.splitn(3, '.');
                    match (parts.next(), parts.next()) {
                        (Some("row"), _) => true,
                        (Some("vars"), Some(name)) => vars.contains_key(name),
                        _ => false,
                    }
                })
            })
    };
    let text = |source: &mut String| -> Result<(), String> {
        if renders(source) {
            // A null inside the text (`the agent answered {{ row.msg }}`) rendered as
            // `none`, and the judge was asked about it: each expression is looked at (not
            // in a `{% %}` block, whose loop variables are not the row's).
            let parts = expressions(source);
            // One expression alone is evaluated whole just below, null checked there.
            let alone = matches!(parts.as_slice(), [only] if *only == source.trim());
            if !alone && !source.contains("{%") {
                for expression in parts {
                    if evaluate_value(env, expression, row, vars)? == Value::Null {
                        return Err(format!("`{}` is null", expression.trim()));
                    }
                }
            }
            let rendered = evaluate_value(env, source, row, vars)?;
            *source = match rendered {
                Value::Null => return Err(format!("`{}` is null", source.trim())),
                Value::String(text) => text,
                other => other.to_string(),
            };
        }
        Ok(())
    };
    fn criteria(
        list: &mut [Criterion],
        text: &dyn Fn(&mut String) -> Result<(), String>,
        problems: &mut Vec<String>,
    ) {
        for c in list {
            let (statement, rubric) = match &mut c.kind {
                CriterionKind::Judge {
                    criterion, rubric, ..
                } => (criterion, rubric.as_mut()),
                CriterionKind::Outcome(Outcome::Statement(statement)) => (statement, None),
                _ => continue,
            };
            // The criterion's text holds the statement and the rubric, and fails as they do:
            // said once. The judge reads both as the record writes them.
            let rendered = text(statement)
                .map_err(|e| format!("judge statement: {e}"))
                .and_then(|()| match rubric {
                    Some(rubric) => text(rubric).map_err(|e| format!("judge rubric: {e}")),
                    None => Ok(()),
                })
                .and_then(|()| text(&mut c.text).map_err(|e| format!("judge statement: {e}")));
            if let Err(e) = rendered {
                problems.push(e);
            }
        }
    }
    fn steps(
        list: &mut [Step],
        text: &dyn Fn(&mut String) -> Result<(), String>,
        problems: &mut Vec<String>,
    ) {
        for step in list {
            match &mut step.kind {
                StepKind::Expect(list) => criteria(list, text, problems),
                StepKind::Fork(branches) => {
                    for branch in branches {
                        steps(&mut branch.steps, text, problems);
                    }
                }
                _ => {}
            }
        }
    }
    let mut problems = Vec::new();
    for outcome in &mut sc.outcomes {
        if let Outcome::Statement(statement) = &mut outcome.value
            && let Err(e) = text(statement)
        {
            problems.push(format!("outcome: {e}"));
        }
    }
    // `row` is in template scope everywhere (LANGUAGE.md): an instance's name and
    // description name its row, as the report and the tables show them.
    if let Some(name) = &mut sc.name
        && let Err(e) = text(name)
    {
        problems.push(format!("name: {e}"));
    }
    if let Some(description) = &mut sc.description
        && let Err(e) = text(description)
    {
        problems.push(format!("description: {e}"));
    }
    // The instances share the scenario's steps and criteria (model.rs): copied only for
    // an instance with a judged text to render in them.
    if sc.criteria.iter().any(|c| judged_template(c, &renders)) {
        criteria(
            Arc::make_mut(&mut sc.criteria).as_mut_slice(),
            &text,
            &mut problems,
        );
    }
    if steps_judged_template(&sc.steps, &renders) {
        steps(
            Arc::make_mut(&mut sc.steps).as_mut_slice(),
            &text,
            &mut problems,
        );
    }
    problems
}

/// Whether `c` is a `judge` or `outcome` check whose statement, rubric or text is a
/// template [`render_judged`] renders per instance (`renders` says which are).
fn judged_template(c: &Criterion, renders: &dyn Fn(&str) -> bool) -> bool {
    match &c.kind {
        CriterionKind::Judge {
            criterion, rubric, ..
        } => renders(criterion) || rubric.as_deref().is_some_and(renders) || renders(&c.text),
        CriterionKind::Outcome(Outcome::Statement(statement)) => {
            renders(statement) || renders(&c.text)
        }
        _ => false,
    }
}

/// Whether an `expect` in `list` (or in a branch of it) has a [`judged_template`] check.
fn steps_judged_template(list: &[Step], renders: &dyn Fn(&str) -> bool) -> bool {
    list.iter().any(|step| match &step.kind {
        StepKind::Expect(checks) => checks.iter().any(|c| judged_template(c, renders)),
        StepKind::Fork(branches) => branches
            .iter()
            .any(|b| steps_judged_template(&b.steps, renders)),
        _ => false,
    })
}

/// Each `{{ … }}` of `source`, braces included, in order.
fn expressions(source: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        found.push(&rest[start..start + len + 2]);
        rest = &rest[start + len + 2..];
    }
    found
}

/// `source` rendered with `row` and `vars`: a template that is one `{{ expression }}` gives
/// the expression's value (typed: a null column is `Value::Null`, an undefined value an
/// error), any other template its text.
fn evaluate_value(
    env: &Environment<'static>,
    source: &str,
    row: Option<&dataset::Fields>,
    vars: &serde_json::Map<String, Value>,
) -> Result<Value, String> {
    let ctx = minijinja::context! {
        row => row.map(|r| minijinja::Value::from(Serde(r))),
        vars => minijinja::Value::from(Serde(vars)),
    };
    let inner = source
        .trim()
        .strip_prefix("{{")
        .and_then(|s| s.strip_suffix("}}"))
        .filter(|s| !s.contains("{{") && !s.contains("}}"));
    match inner {
        Some(expr) => {
            let e = env
                .compile_expression(expr.trim())
                .map_err(|e| template_error(&e))?;
            let v = e.eval(ctx).map_err(|e| {
                // minijinja's "undefined value" names nothing: the expression does.
                if e.kind() == minijinja::ErrorKind::UndefinedError {
                    format!("`{}` is undefined", source.trim())
                } else {
                    template_error(&e)
                }
            })?;
            if v.is_undefined() {
                return Err(format!("`{}` is undefined", source.trim()));
            }
            if v.is_none() {
                return Ok(Value::Null);
            }
            serde_json::to_value(&v).map_err(|e| e.to_string())
        }
        None => Ok(Value::String(
            env.render_str(source, ctx)
                .map_err(|e| template_error(&e))?,
        )),
    }
}

/// A history template's value: `"{{ EXPR }}"` evaluated (a list stays a list), any other
/// template rendered; text is read as JSON.
fn evaluate(
    env: &Environment<'static>,
    source: &str,
    row: Option<&dataset::Fields>,
    vars: &serde_json::Map<String, Value>,
) -> Result<Value, String> {
    let value = evaluate_value(env, source, row, vars)?;
    match value {
        Value::Null => Err(format!("`{}` is null", source.trim())),
        // An empty cell is no message to send; a row without a history says `[]`.
        Value::String(text) if text.trim().is_empty() => Err(format!(
            "`{}` is empty (a row without a history holds `[]`)",
            source.trim()
        )),
        // A column holding the list as JSON text (CSV has no lists).
        Value::String(text) if text.trim_start().starts_with(['[', '{']) => {
            serde_json::from_str(&text)
                .map_err(|e| format!("the text is not a JSON message list: {e}"))
        }
        // Plain text is one user message, as a sample's `input` is in Inspect and most
        // exports of cases: `history "{{ row.input }}"` takes either form.
        Value::String(text) => Ok(serde_json::json!([{"role": "user", "content": text}])),
        other => Ok(other),
    }
}
