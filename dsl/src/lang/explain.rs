//! The language table as text, for `trellis check --explain NODE`: a node's usage, help,
//! arguments, properties and the node kinds its block takes, read from its [`NodeSpec`].

use std::fmt::Write as _;

use super::spec::{ANY_KEY, Children, Form, NodeSpec};
use super::{top, walk};
use crate::diagnostics::did_you_mean;

/// The spec a path names: `scenario`, `scenario.branch`, `tool.mock`; a first name that is
/// not a top-level node is looked for below (`branch`, `reply`), nearest the top first.
/// Unknown: a message with the closest name.
pub fn find(path: &str) -> Result<&'static NodeSpec, String> {
    let mut parts = path.split('.').map(str::trim);
    let first = parts.next().unwrap_or("");
    let mut spec = top(first).or_else(|| {
        let mut found = None;
        walk(|_, s| {
            if found.is_none() && s.name == first {
                found = Some(s);
            }
        });
        found
    });
    let mut parent: Option<&'static NodeSpec> = None;
    let mut name = first;
    for next in parts {
        let Some(s) = spec else { break };
        parent = Some(s);
        name = next;
        spec = s.child(next);
    }
    spec.ok_or_else(|| {
        let known: Vec<&str> = match parent {
            Some(p) => p.child_specs().iter().map(|s| s.name).collect(),
            None => {
                let mut all = Vec::new();
                walk(|_, s| {
                    if !all.contains(&s.name) {
                        all.push(s.name);
                    }
                });
                all
            }
        };
        let hint = match did_you_mean(name, known.iter().copied()) {
            Some(best) => format!("did you mean `{best}`?"),
            None => format!(
                "known here: {}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        match parent {
            Some(p) => format!("`{}` takes no node `{name}`; {hint}", p.name),
            None => format!("the language has no node `{name}`; {hint}"),
        }
    })
}

/// The text `trellis check --explain` prints for `spec`.
pub fn explain(spec: &NodeSpec) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", spec.usage());
    let _ = writeln!(out, "  {}", spec.help);
    if spec.form == Form::Setting {
        let value = spec
            .args
            .first()
            .map_or_else(String::new, |a| a.ty.describe());
        let _ = writeln!(out, "  a setting: {value}");
    }
    if spec.repeatable {
        let _ = writeln!(out, "  may be given more than once");
    }
    if !spec.args.is_empty() {
        let _ = writeln!(out, "\narguments:");
        for a in spec.args {
            let _ = writeln!(out, "  {:<24} {}", a.name, a.ty.describe());
        }
    }
    if !spec.props.is_empty() {
        let _ = writeln!(out, "\nproperties:");
        for p in spec.props {
            let name = if p.name == ANY_KEY {
                "KEY=VALUE".to_string()
            } else {
                format!("{}=", p.name)
            };
            let required = if p.required { " (required)" } else { "" };
            let _ = writeln!(
                out,
                "  {name:<24} {}: {}{required}",
                p.ty.describe(),
                p.help
            );
        }
    }
    match spec.children {
        Children::None => {}
        Children::Data => {
            let _ = writeln!(out, "\nblock: free-form, see docs/language.md");
        }
        Children::Map { key, value } => {
            let _ = writeln!(
                out,
                "\nblock: `KEY VALUE` lines, each KEY {} and each VALUE {}",
                key.describe(),
                value.describe()
            );
        }
        Children::Nodes(children) => {
            let _ = writeln!(out, "\nblock:");
            for c in children {
                let _ = writeln!(out, "  {:<24} {}", c.usage(), c.help);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_nodes_at_the_top_below_and_inside_others() {
        assert_eq!(find("scenario").map(|s| s.name), Ok("scenario"));
        assert_eq!(find("branch").map(|s| s.name), Ok("branch"));
        assert_eq!(find("tool.mock").map(|s| s.name), Ok("mock"));
        assert!(find("tool").is_ok_and(|s| s.child("mock").is_some()));
        assert!(find("expect.tool").is_ok_and(|s| s.child("mock").is_none()));
        assert_eq!(
            find("scenario.brnch").map(|s| s.name),
            Err("`scenario` takes no node `brnch`; did you mean `branch`?".into())
        );
        assert!(find("scenaro").is_err_and(|e| e.contains("did you mean `scenario`?")));
    }

    #[test]
    fn the_text_shows_usage_properties_and_block() {
        let text = explain(find("scenario.agent-branches").unwrap());
        assert!(text.starts_with("agent-branches\n"), "{text}");
        assert!(text.contains("breadth="), "{text}");
        let text = explain(find("scenario").unwrap());
        assert!(text.contains("branch NAME"), "{text}");
        assert!(text.contains("timeout VALUE"), "{text}");
    }
}
