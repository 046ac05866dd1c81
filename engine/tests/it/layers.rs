//! The engine's modules form layers without cycles, and the reports read records without
//! the engine (`docs/architecture.md`, "Layers").
//!
//! Reads `engine/src/**/*.rs`, maps each file to its top-level module (`protocol/a2a/wire.rs`
//! is `protocol`), collects the paths that name another top-level module (`crate::plan::…`,
//! `crate::{plan, record::Fault}`, `super::…` climbing out of the module) and checks that each
//! goes to a lower layer of [`LAYERS`]. Comments are left out (a doc link is not a
//! dependency); a re-export counts as a use, which it is. Since every allowed edge goes down,
//! the modules cannot form a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The engine's layers, lowest first. A module may use the modules of lower layers only;
/// modules of one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    // The stored schema, re-exported from `trellis-records`.
    &["record"],
    // The event channel and the journal writer carry records; templates need nothing.
    &["event", "journal", "render"],
    // HTTP, SSE, JSON lines and quoting peers' text: shared by protocols and the LLM client.
    &["transport"],
    // The sandbox (tool state, mocks, policies) and the OTLP span receiver: both on
    // records and transports, for protocols, the planner, criteria and the executor.
    &["sandbox", "otel"],
    // The engine's LLM client: providers, cache, judges, the simulated user.
    &["llm"],
    // Agent protocols, on transports, the LLM client (Fixie's model) and the sandbox.
    &["protocol"],
    // The planner: what runs, with which protocol, judges and sandboxes.
    &["plan"],
    // What works on a plan: deterministic criteria (compiled by the planner), scenario
    // fingerprints, the secrets a plan names, splitting it into shards.
    &["criteria", "fingerprint", "secrets", "shard"],
    // The executor, on everything else.
    &["execute"],
];

/// Upward edges still in the tree, each owned by work under way elsewhere. This list only
/// ever shrinks: an entry whose edge is gone fails the test until it is removed.
const PENDING: &[(&str, &str)] = &[];

/// Crates `trellis-reports` must not depend on (outside `[dev-dependencies]`).
const NOT_UNDER_REPORTS: &[&str] = &["trellis-engine", "tokio", "reqwest", "axum"];
/// Crates `trellis-records` must not depend on: it is the bottom of the workspace.
const NOT_UNDER_RECORDS: &[&str] = &[
    "trellis-dsl",
    "trellis-engine",
    "trellis-reports",
    "tokio",
    "reqwest",
    "axum",
    "polars",
    "polars-core",
    "polars-io",
];

/// Crates `trellis-journal` must not depend on: readers of results take it without the
/// engine's runtime or polars.
const NOT_UNDER_JOURNAL: &[&str] = &[
    "trellis-dsl",
    "trellis-engine",
    "trellis-reports",
    "tokio",
    "reqwest",
    "axum",
    "polars",
    "polars-core",
    "polars-io",
];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Use {
    file: String,
    line: usize,
}

#[test]
fn engine_modules_only_use_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, mods)| mods.iter().map(move |m| (*m, i)))
        .collect();

    let modules = top_level_modules(&src);
    let unlisted: Vec<_> = modules
        .iter()
        .filter(|m| !layer_of.contains_key(m.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "modules missing from LAYERS in {}: {unlisted:?}",
        file!()
    );
    let stale: Vec<_> = layer_of.keys().filter(|m| !modules.contains(**m)).collect();
    assert!(
        stale.is_empty(),
        "LAYERS names modules that no longer exist: {stale:?}"
    );

    let edges = edges(&src, &modules);
    let mut violations = Vec::new();
    for ((from, to), uses) in &edges {
        let (lf, lt) = (layer_of[from.as_str()], layer_of[to.as_str()]);
        if lt < lf || PENDING.contains(&(from.as_str(), to.as_str())) {
            continue;
        }
        for u in uses {
            violations.push(format!(
                "engine/src/{}:{}: `{from}` (layer {lf}) uses `{to}` (layer {lt})",
                u.file, u.line
            ));
        }
    }
    assert!(
        violations.is_empty(),
        "upward or sideways edges between engine modules (move the code down, or change \
         LAYERS in {} and docs/architecture.md if the design changed):\n{}",
        file!(),
        violations.join("\n")
    );

    let gone: Vec<_> = PENDING
        .iter()
        .filter(|(from, to)| !edges.contains_key(&(from.to_string(), to.to_string())))
        .collect();
    assert!(
        gone.is_empty(),
        "PENDING edges no longer in the tree: remove them from PENDING in {}: {gone:?}",
        file!()
    );
}

#[test]
fn reports_and_records_do_not_depend_on_the_engine() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (krate, forbidden) in [
        ("reports", NOT_UNDER_REPORTS),
        ("records", NOT_UNDER_RECORDS),
        ("journal", NOT_UNDER_JOURNAL),
    ] {
        let manifest = root.join(krate).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", manifest.display()));
        let deps = dependencies(&text);
        assert!(
            !deps.is_empty(),
            "{}: found no [dependencies]",
            manifest.display()
        );
        let bad: Vec<_> = deps
            .iter()
            .filter(|(name, _)| forbidden.contains(&name.as_str()))
            .map(|(name, line)| format!("{krate}/Cargo.toml:{line}: {name}"))
            .collect();
        assert!(
            bad.is_empty(),
            "{krate} must not depend on {forbidden:?}:\n{}",
            bad.join("\n")
        );
    }
}

#[test]
fn the_scanner_sees_every_form_of_path() {
    let modules: BTreeSet<String> = ["plan", "record", "protocol", "llm"]
        .map(String::from)
        .into();
    let text = "use crate::plan::Plan;\n\
                use crate::{\n    record::{Fault, FaultCategory},\n    llm,\n};\n\
                let x = super::super::super::protocol::Turn::default(); // crate::llm\n\
                /// [`crate::llm`] in a doc\n\
                let url = \"http://host\"; crate::record::Fault::new();\n";
    let found = references(
        text,
        &["protocol".into(), "a2a".into(), "wire".into()],
        &modules,
    );
    assert_eq!(
        found,
        [
            ("plan".to_string(), 1),
            ("record".to_string(), 3),
            ("llm".to_string(), 4),
            ("protocol".to_string(), 6),
            ("record".to_string(), 8),
        ]
    );
}

/// The names of `src`'s top-level modules: its directories and `.rs` files but `lib.rs`.
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            if p.is_dir() {
                Some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                (stem != "lib").then(|| stem.to_owned())
            }
        })
        .collect()
}

/// Every use of another top-level module, by (from, to).
fn edges(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<(String, String), Vec<Use>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<(String, String), Vec<Use>> = BTreeMap::new();
    for path in files {
        let rel = path.strip_prefix(src).unwrap();
        let file = rel.to_string_lossy().replace('\\', "/");
        // The module path of the file: `protocol/a2a/mod.rs` is `protocol::a2a`.
        let mut module: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        let from = module[0].clone();
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (to, line) in references(&text, &module, modules) {
            if to != from {
                edges.entry((from.clone(), to)).or_default().push(Use {
                    file: file.clone(),
                    line,
                });
            }
        }
    }
    edges
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text` names, with 1-based line numbers, for a file whose module
/// path is `module`. `super` is resolved from the file's module: inside an inline module
/// (`mod tests`) it points one level too high, which can only make this stricter.
fn references(text: &str, module: &[String], modules: &BTreeSet<String>) -> Vec<(String, usize)> {
    let code: String = text
        .lines()
        .map(strip_comment)
        .collect::<Vec<_>>()
        .join("\n");
    let bytes = code.as_bytes();
    let line_at = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &code[at..];
        let boundary = at == 0 || !is_ident(bytes[at - 1]);
        if boundary && rest.starts_with("crate::") {
            let after = at + "crate::".len();
            for (name, pos) in path_heads(&code, after) {
                if modules.contains(&name) {
                    found.push((name, line_at(pos)));
                }
            }
            at = after;
        } else if boundary && rest.starts_with("super::") {
            let mut depth = module.len();
            let mut after = at;
            while code[after..].starts_with("super::") {
                depth = depth.saturating_sub(1);
                after += "super::".len();
            }
            // Only a path that climbs to the crate root can name a top-level module.
            if depth == 0 {
                for (name, pos) in path_heads(&code, after) {
                    if modules.contains(&name) {
                        found.push((name, line_at(pos)));
                    }
                }
            }
            at = after;
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    found
}

/// The first segments of the path starting at `at`: one name, or each name of a
/// `{a::…, b, c::{…}}` group at its top level.
fn path_heads(code: &str, at: usize) -> Vec<(String, usize)> {
    let bytes = code.as_bytes();
    let ident_at = |start: usize| {
        let end = (start..bytes.len())
            .find(|&i| !is_ident(bytes[i]))
            .unwrap_or(bytes.len());
        code[start..end].to_owned()
    };
    if bytes.get(at) != Some(&b'{') {
        return vec![(ident_at(at), at)];
    }
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (i, &b) in bytes.iter().enumerate().skip(at) {
        match b {
            b'{' => {
                depth += 1;
                expect_head = depth == 1;
            }
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            b',' if depth == 1 => expect_head = true,
            _ if expect_head && depth == 1 && is_ident(b) => {
                heads.push((ident_at(i), i));
                expect_head = false;
            }
            _ => {}
        }
    }
    heads
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The line without its `//` comment. A `//` right after `:` is a URL in a string.
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let cut = (0..bytes.len().saturating_sub(1))
        .find(|&i| bytes[i] == b'/' && bytes[i + 1] == b'/' && (i == 0 || bytes[i - 1] != b':'));
    match cut {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The dependency names of a manifest's `[dependencies]` table, with their lines
/// (`name = …`, `name.workspace = true` and `[dependencies.name]` forms).
fn dependencies(manifest: &str) -> Vec<(String, usize)> {
    let mut deps = Vec::new();
    let mut in_deps = false;
    for (i, line) in manifest.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']').trim();
            in_deps = header == "dependencies";
            if let Some(name) = header.strip_prefix("dependencies.") {
                deps.push((name.trim().to_owned(), i + 1));
            }
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.']).next().unwrap_or_default().trim();
        deps.push((name.trim_matches('"').to_owned(), i + 1));
    }
    deps
}
