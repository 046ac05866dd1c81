//! docs/language.md against the language table: every node kind the table declares is
//! documented under its parent, and every node the reference documents is in the table. A
//! node added to one and not the other fails here, naming it.
//!
//! The reference documents a node's children in the first column of its tables (headed
//! `node`, `child`, `setting`, `step` or `criterion`), in the forms written in its headings and
//! tables (`persona "ID" type="…" { description "…"; instructions "…" }`: `type`,
//! `description` and `instructions` of `persona`). An `agent` takes the settings the table
//! gives every agent and those of the protocols in the registry.

use std::collections::{BTreeMap, BTreeSet};

use trellis_dsl::lang::{self, Children};

const TOP: &str = "(top level)";

/// `parent -> children` as the reference documents them.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/language.md");
    let text = std::fs::read_to_string(path).expect("docs/language.md is readable");
    let steps: Vec<&str> = lang::steps::STEPS.iter().map(|s| s.name).collect();
    let criteria: Vec<&str> = lang::criteria::CRITERIA.iter().map(|s| s.name).collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut owner: Option<String> = None;
    let mut in_table = false;
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            owner = match code_spans(h).first() {
                Some(form) => Some(form_name(form)),
                None if h == "Files" => Some(TOP.to_string()),
                None => None,
            };
            if let Some(o) = &owner {
                for form in code_spans(h) {
                    add_form(&mut out, o, &form, &steps, &criteria, true);
                }
            }
            in_table = false;
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            if h == "Steps" || h == "Criteria" {
                owner = owner.filter(|o| o == "scenario");
            }
            in_table = false;
            continue;
        }
        let Some(row) = line.strip_prefix('|') else {
            in_table = false;
            continue;
        };
        let first = row.split(" | ").next().unwrap_or("").trim();
        if !in_table {
            // A header row starts a table; only tables of nodes are read.
            in_table = matches!(
                first,
                "node" | "node / property" | "child" | "setting" | "step" | "criterion"
            );
            if first == "criterion" {
                owner = owner
                    .filter(|o| o == "scenario")
                    .map(|_| "expect".to_string());
            }
            continue;
        }
        let Some(o) = owner.clone() else { continue };
        if first.starts_with("---") {
            continue;
        }
        for form in code_spans(first) {
            add_form(&mut out, &o, &form, &steps, &criteria, false);
        }
    }
    // Criteria are documented once, for `expect` and `criteria { }` alike.
    let expect = out.get("expect").cloned().unwrap_or_default();
    out.entry("criteria".into()).or_default().extend(expect);
    out
}

/// The `` `…` `` spans of a line.
fn code_spans(line: &str) -> Vec<String> {
    line.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// The node a form writes: `timeout`, `provider="ID"` → `provider`.
fn form_name(form: &str) -> String {
    let first = form.split_whitespace().next().unwrap_or("");
    first
        .split('=')
        .next()
        .unwrap_or("")
        .trim_end_matches('…')
        .to_string()
}

/// Adds what `form` documents: the node itself (a child of `owner`, unless the form is the
/// owner's own heading), its `key=` properties and its `{ … }` block's nodes as its children.
fn add_form(
    out: &mut BTreeMap<String, BTreeSet<String>>,
    owner: &str,
    form: &str,
    steps: &[&str],
    criteria: &[&str],
    heading: bool,
) {
    let name = form_name(form);
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
        return;
    }
    if !heading {
        out.entry(owner.to_string())
            .or_default()
            .insert(name.clone());
    }
    let (head, block) = match form.split_once('{') {
        Some((h, b)) => (h, Some(b.trim_end().trim_end_matches('}'))),
        None => (form, None),
    };
    for word in head.split_whitespace().skip(1) {
        if let Some((key, _)) = word.split_once('=')
            && !key.is_empty()
            && key.chars().all(|c| c.is_ascii_lowercase() || c == '-')
        {
            out.entry(name.clone()).or_default().insert(key.to_string());
        }
    }
    for child in block.into_iter().flat_map(|b| b.split(';')) {
        let child = form_name(child.trim());
        let names: Vec<String> = match child.as_str() {
            "STEP" => steps.iter().map(|s| s.to_string()).collect(),
            "CRITERION" => criteria.iter().map(|s| s.to_string()).collect(),
            c if !c.is_empty() && c.chars().all(|c| c.is_ascii_lowercase() || c == '-') => {
                vec![c.to_string()]
            }
            _ => Vec::new(),
        };
        out.entry(name.clone()).or_default().extend(names);
    }
}

/// `parent -> children` as the table declares them (an `agent` takes its protocol's settings
/// too); with `props`, each node's properties too.
fn declared(props: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for spec in lang::top_level() {
        out.entry(TOP.into()).or_default().insert(spec.name.into());
    }
    lang::walk(|_, spec| {
        if props && !spec.props.is_empty() {
            let set = out.entry(spec.name.into()).or_default();
            set.extend(spec.props.iter().map(|p| p.name.to_string()));
        }
        if let Children::Nodes(children) = spec.children {
            let set = out.entry(spec.name.into()).or_default();
            set.extend(children.iter().map(|c| c.name.to_string()));
        }
    });
    for protocol in trellis_engine::protocol::registry::specs() {
        for setting in protocol.settings {
            out.entry("agent".into())
                .or_default()
                .insert(setting.name.into());
            if props && !setting.props.is_empty() {
                let set = out.entry(setting.name.into()).or_default();
                set.extend(setting.props.iter().map(|p| p.name.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_node_of_the_table_is_documented() {
    let docs = documented();
    let mut missing = Vec::new();
    for (parent, children) in declared(false) {
        for child in children {
            if !docs.get(&parent).is_some_and(|d| d.contains(&child)) {
                missing.push(format!("`{child}` in `{parent}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/language.md does not document {}",
        missing.join(", ")
    );
}

#[test]
fn every_documented_node_is_in_the_table() {
    let table = declared(true);
    let mut unknown = Vec::new();
    for (parent, children) in documented() {
        for child in children {
            if !table.get(&parent).is_some_and(|t| t.contains(&child)) {
                unknown.push(format!("`{child}` in `{parent}`"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/language.md documents nodes the language table does not have: {}",
        unknown.join(", ")
    );
}
