//! The language as data: every node kind the suite language accepts is declared once as a
//! [`NodeSpec`], and every protocol as a [`ProtocolSpec`]. Decoding, the unknown / duplicate /
//! wrong-type diagnostics, `trellis check`, the language reference in docs/language.md and the
//! editor integration read these declarations; hand-written code remains only for what a node
//! means.
//!
//! [`top_level`] is the root of the table: each spec's [`Children::Nodes`] leads to the node
//! kinds its block takes. The table has cycles (a `branch` holds steps, among them `branch`),
//! so walk it with [`walk`], which visits each spec once.

pub mod check;
pub mod criteria;
pub mod decls;
pub mod explain;
pub mod scenario;
pub mod spec;
pub mod steps;
pub mod tool;

pub use spec::*;

/// The node kinds a suite file holds at its top level, in the order the unknown-node hint
/// lists them in.
pub fn top_level() -> &'static [&'static NodeSpec] {
    &TOP_LEVEL
}

pub static TOP_LEVEL: [&NodeSpec; 11] = [
    &decls::SUITE,
    &decls::INCLUDE,
    &decls::AGENT,
    &decls::PERSONA,
    &tool::TOOL,
    &decls::PROVIDER,
    &decls::SIMULATOR,
    &decls::JUDGE,
    &decls::PANEL,
    &decls::DATASET,
    &scenario::SCENARIO,
];

/// A top-level node kind by name.
pub fn top(name: &str) -> Option<&'static NodeSpec> {
    TOP_LEVEL.iter().copied().find(|n| n.name == name)
}

/// Visits every spec reachable from the top level once, with the names of the nodes leading
/// to it (`["scenario", "expect"]` for a criterion in an `expect` block); a spec reached
/// again (a `branch` inside a `branch`) is not entered again, so the walk is bounded by the
/// size of the table.
pub fn walk(mut visit: impl FnMut(&[&'static str], &'static NodeSpec)) {
    let mut seen: Vec<*const NodeSpec> = Vec::new();
    let mut queue: std::collections::VecDeque<(Vec<&'static str>, &'static NodeSpec)> =
        TOP_LEVEL.iter().map(|s| (Vec::new(), *s)).collect();
    while let Some((path, spec)) = queue.pop_front() {
        visit(&path, spec);
        let key: *const NodeSpec = spec;
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        for child in spec.child_specs() {
            let mut p = path.clone();
            p.push(spec.name);
            queue.push_back((p, child));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_walked_once_per_spec_although_branches_hold_branches() {
        let mut visits = 0;
        let mut branch_in_branch = false;
        walk(|path, spec| {
            visits += 1;
            branch_in_branch |= spec.name == "branch" && path.last() == Some(&"branch");
        });
        assert!(branch_in_branch, "a branch holds branches");
        // Each spec is entered once; a spec reached again is visited but not entered.
        assert!(visits < 400, "{visits} visits");
    }

    #[test]
    fn children_have_unique_names_and_settings_one_value() {
        walk(|path, spec| {
            let names: Vec<&str> = spec.child_specs().iter().map(|c| c.name).collect();
            let mut unique = names.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(
                unique.len(),
                names.len(),
                "{path:?} > {}: {names:?}",
                spec.name
            );
            if spec.form == Form::Setting {
                assert_eq!(spec.args.len(), 1, "{path:?} > {}", spec.name);
                assert!(spec.props.is_empty() && matches!(spec.children, Children::None));
            }
            for (i, a) in spec.args.iter().enumerate() {
                let last = i + 1 == spec.args.len();
                assert!(
                    last || !matches!(a.repeat, Repeat::Many | Repeat::Any),
                    "{}: only the last argument repeats",
                    spec.name
                );
            }
        });
    }

    #[test]
    fn the_top_level_lists_every_declaration() {
        let names: Vec<&str> = top_level().iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "suite",
                "include",
                "agent",
                "persona",
                "tool",
                "provider",
                "simulator",
                "judge",
                "panel",
                "dataset",
                "scenario"
            ]
        );
        assert!(top("scenario").is_some_and(|s| s.child("branch").is_some()));
        assert!(top("agent").is_some_and(|a| a.child("timeout").is_some()));
    }
}
