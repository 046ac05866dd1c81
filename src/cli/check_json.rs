//! `trellis check --message-format json`: every diagnostic as one JSON line on stdout, with
//! its file, 1-based line and column (characters) and end, labels, help and related notes,
//! then a `summary` line: for editors without an LSP client, pre-commit hooks and CI
//! tools that annotate files. The exit code is `check`'s.

use serde_json::{Value, json};
use trellis_dsl::{Diagnostic, SourceFile};

use super::console::outln;

/// The JSON line of `diagnostic`, whose labels point into `files`.
pub(super) fn diagnostic(diagnostic: &Diagnostic, files: &[SourceFile]) -> Value {
    let file = diagnostic.file.and_then(|f| files.get(f));
    let labels: Vec<Value> = file
        .map(|file| {
            diagnostic
                .labels()
                .iter()
                .map(|label| {
                    let mut at = place(file, label.offset(), label.len());
                    at["label"] = json!(label.label());
                    at
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = json!({
        "type": "diagnostic",
        "severity": severity(diagnostic),
        "code": diagnostic.code_str(),
        "message": diagnostic.message,
        "file": file.map(|f| f.name.as_str()),
        "help": diagnostic.help_text(),
    });
    // The primary label's place, at the top level for tools that read one position.
    if let Some(first) = labels.first() {
        for key in ["line", "column", "end_line", "end_column"] {
            out[key] = first[key].clone();
        }
    }
    out["labels"] = Value::Array(labels);
    let related: Vec<Value> = diagnostic
        .related_diagnostics()
        .iter()
        .map(|r| self::diagnostic(r, files))
        .collect();
    if !related.is_empty() {
        out["related"] = Value::Array(related);
    }
    out
}

/// The lines of suites that did not load: their warnings and errors, then the summary.
pub(super) fn invalid(diagnostics: &trellis_dsl::Diagnostics) {
    let files = diagnostics.files();
    for d in diagnostics.warnings().iter().chain(diagnostics.iter()) {
        outln!("{}", self::diagnostic(d, files));
    }
    outln!(
        "{}",
        json!({
            "type": "summary",
            "ok": false,
            "errors": diagnostics.len(),
            "warnings": diagnostics.warnings().len(),
        })
    );
}

/// The lines of a project the planner refused (`warnings` of it said already).
pub(super) fn plan_error(error: &trellis_engine::plan::PlanError, warnings: usize) {
    outln!(
        "{}",
        json!({
            "type": "diagnostic",
            "severity": "error",
            "code": miette::Diagnostic::code(error).map(|c| c.to_string()),
            "message": error.to_string(),
            "file": null,
            "labels": [],
        })
    );
    outln!(
        "{}",
        json!({"type": "summary", "ok": false, "errors": 1, "warnings": warnings})
    );
}

fn severity(diagnostic: &Diagnostic) -> &'static str {
    use miette::Diagnostic as _;
    match diagnostic.severity() {
        Some(miette::Severity::Warning) => "warning",
        Some(miette::Severity::Advice) => "note",
        _ => "error",
    }
}

/// Where `len` bytes from `offset` are in `file`: 1-based lines and columns, the end
/// column just past the span (as editors count it).
fn place(file: &SourceFile, offset: usize, len: usize) -> Value {
    let (line, column) = file.line_col(offset);
    let (end_line, end_column) = file.line_col(offset.saturating_add(len));
    json!({
        "line": line,
        "column": column,
        "end_line": end_line,
        "end_column": end_column,
    })
}
