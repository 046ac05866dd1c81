//! The generic checker: what a node may hold is read from its [`NodeSpec`], and every
//! unknown-node, unknown-property, extra-argument, missing, wrong-type, unexpected-block and
//! set-twice problem is built by the one builder function of its kind below, so the wording,
//! code, labels and hint of each are the same wherever the language is checked.
//!
//! The checker looks at one node and its direct children (never deeper): the decoders call it
//! per node as they descend, and how deep they descend is bounded by `depth.rs`, which refuses
//! a file nesting blocks more than 128 deep before it is parsed.

use std::collections::HashMap;

use kdl::KdlEntry;
use miette::SourceSpan;

use super::spec::{Children, Form, NodeSpec, Repeat};
use crate::diagnostics::{Kind, did_you_mean, suggest};

/// One problem, located in the checked file's text; the loader turns it into a diagnostic of
/// that file.
#[derive(Clone, Debug)]
pub struct Problem {
    pub kind: Kind,
    pub message: String,
    pub span: SourceSpan,
    pub label: String,
    /// A second place (the first of two settings).
    pub also: Option<(SourceSpan, String)>,
    pub help: String,
}

/// A node as the checker sees it: for an inline criterion (`expect tool "x"`) the first
/// argument plays the name, so this is not a `KdlNode`.
#[derive(Clone, Copy)]
pub struct Node<'s, 'a> {
    pub name: &'a str,
    pub name_span: SourceSpan,
    pub args: &'s [&'a KdlEntry],
    pub props: &'s [&'a KdlEntry],
    /// The span of the `{ … }` block, when there is one.
    pub block: Option<SourceSpan>,
}

/// A setting found by [`settings`]: its name and values, from a property or a child node.
pub struct Setting<'a> {
    pub name: &'a str,
    pub name_span: SourceSpan,
    pub values: Vec<&'a KdlEntry>,
}

fn prop_name(e: &KdlEntry) -> &str {
    e.name().map_or("", |n| n.value())
}

// ----- the builders, one per kind of problem

/// A node the parent does not take.
pub fn unknown_node<'a>(
    name: &str,
    span: SourceSpan,
    context: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Problem {
    let known: Vec<&str> = known.into_iter().collect();
    // The names Connexity test cases and MultiAgentEval files give these nodes: no likeness
    // finds them (`expected_outcomes` reads like `expect`).
    // (`first_message` and `initial_message` are `initial-message`, which the likeness
    // finds.)
    const OTHER_NAMES: [(&str, &str); 3] = [
        ("expected_outcomes", "outcome"),
        ("expected_outcome", "outcome"),
        ("expected_tool_calls", "expect-tool"),
    ];
    let other_name = OTHER_NAMES
        .iter()
        .find(|(other, meant)| {
            name.replace('-', "_").eq_ignore_ascii_case(other) && known.contains(meant)
        })
        .map(|(_, meant)| format!("did you mean `{meant}`?"));
    let help = match placement(name, &known).or(other_name).or_else(|| {
        did_you_mean(name, known.iter().copied()).map(|best| format!("did you mean `{best}`?"))
    }) {
        Some(help) => help,
        None => format!(
            "{context} accepts: {}",
            known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Problem {
        kind: Kind::UnknownNode,
        message: format!("unknown node `{name}` in {context}"),
        span,
        label: "unknown node".into(),
        also: None,
        help,
    }
}

/// Where a node of the language written in the wrong place belongs, told from what the
/// place takes (`known`): a check written as a step, a step outside a scenario or inside a
/// check, a top-level definition inside a block. A right name in the wrong place is not a
/// typo, so this comes before any did-you-mean (`persona` inside an `agent` is not
/// `per-shard`).
fn placement(name: &str, known: &[&str]) -> Option<String> {
    let named = |specs: &[&NodeSpec]| specs.iter().any(|s| s.name == name);
    let at_top = known.contains(&"scenario");
    let in_steps = known.contains(&"user");
    let in_checks = known.contains(&"no-error");
    let scenario_setting = super::scenario::SCENARIO.child(name).is_some();
    let a_check = named(&super::criteria::CRITERIA);
    // A branch takes steps only; the scenario's own settings are the scenario's (a `tool`
    // or an `outcome` there may also have been meant as this branch's check).
    if in_steps && !known.contains(&"criteria") && scenario_setting {
        let also = if a_check {
            format!(" (to check this branch, write `expect {name}`)")
        } else {
            String::new()
        };
        return Some(format!(
            "`{name}` belongs to the scenario, not to a branch: write it in the `scenario` \
             block, where it applies to every branch{also}"
        ));
    }
    if in_steps && a_check {
        return Some(format!(
            "`{name}` is a check: write `expect {name}` to check the turn just taken, or put it \
             in `criteria {{ }}` to check the whole trajectory"
        ));
    }
    // A scenario setting among checks (`expect-tool` in `criteria { }`, next to which
    // Connexity lists it).
    if in_checks && scenario_setting && !a_check && !named(&super::steps::STEPS) {
        let also = if name == "expect-tool" {
            " (it checks the whole trajectory), or check the call here with `tool \"NAME\" …`"
        } else {
            ""
        };
        return Some(format!(
            "`{name}` is a scenario setting, not a check: write it in the `scenario` block{also}"
        ));
    }
    if (at_top || in_checks) && named(&super::steps::STEPS) {
        return Some(if at_top {
            format!("`{name}` is a step: write it inside a `scenario \"ID\" {{ … }}`")
        } else {
            format!("`{name}` is a step, not a check: write it among the scenario's steps")
        });
    }
    if !at_top && named(super::top_level()) {
        // A name this block takes one letter away (`tools` in an `agent`) may be what was
        // meant; a mere likeness is not (`persona` in an `agent` is not `per-shard`).
        let near = known
            .iter()
            .find(|k| strsim::osa_distance(name, k) == 1)
            .map(|best| format!("; did you mean `{best}`, which this block takes?"))
            .unwrap_or_default();
        return Some(if scenario_setting {
            format!(
                "`{name}` is set in the `scenario` block, or defined at the top level of a \
                 suite file, not here{near}"
            )
        } else {
            format!("`{name}` is written at the top level of a suite file, outside any block{near}")
        });
    }
    None
}

/// A criterion name that is none of the criteria.
pub fn unknown_criterion<'a>(
    name: &str,
    span: SourceSpan,
    context: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Problem {
    let known: Vec<&str> = known.into_iter().collect();
    let help = match placement(name, &known).or_else(|| {
        did_you_mean(name, known.iter().copied()).map(|best| format!("did you mean `{best}`?"))
    }) {
        Some(help) => help,
        None => format!("criteria are: {}", known.join(", ")),
    };
    Problem {
        kind: Kind::UnknownNode,
        message: format!("unknown criterion `{name}` in {context}"),
        span,
        label: "unknown criterion".into(),
        also: None,
        help,
    }
}

/// A property the node does not take; `on` names the node (`` `persona` ``, `an inline
/// `persona``).
pub fn unknown_property<'a>(
    name: &str,
    span: SourceSpan,
    node: &str,
    on: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Problem {
    let known: Vec<&str> = known.into_iter().collect();
    // Names other tools give these properties: not typos, so no likeness finds them.
    const OTHER_NAMES: [(&str, &str); 6] = [
        ("regex", "matches"),
        ("regexp", "matches"),
        ("pattern", "matches"),
        ("match", "matches"),
        ("includes", "contains"),
        ("jsonpath", "json-path"),
    ];
    let other_name = OTHER_NAMES
        .iter()
        .find(|(other, meant)| name.eq_ignore_ascii_case(other) && known.contains(meant));
    let help = if known.is_empty() {
        format!("`{node}` takes no properties")
    } else if let Some((_, meant)) = other_name {
        format!("did you mean `{meant}`?")
    } else {
        suggest(name, known.iter().copied(), "the properties")
    };
    Problem {
        kind: Kind::UnknownProperty,
        message: format!("unknown property `{name}` on {on}"),
        span,
        label: "unknown property".into(),
        also: None,
        help,
    }
}

/// A setting that takes several values written as a property.
pub fn not_a_property(name: &str, span: SourceSpan) -> Problem {
    Problem {
        kind: Kind::UnknownProperty,
        message: format!("`{name}` cannot be a property"),
        span,
        label: "write this as a child node".into(),
        also: None,
        help: format!("write `{name} \"NAME\" \"VALUE\"` inside the block"),
    }
}

/// More arguments than the node takes; `max` is how many it takes. `entries` are the node's
/// arguments and properties: an argument right after a property is most likely a second
/// value meant for it (`tools="a" "b"`), and the help says so.
pub fn unexpected_argument(
    node: &str,
    max: usize,
    span: SourceSpan,
    usage: &str,
    entries: &[&KdlEntry],
    several: &dyn Fn(&str) -> bool,
) -> Problem {
    let message = match max {
        0 => format!("`{node}` takes no arguments"),
        1 => format!("`{node}` takes one argument"),
        n => format!("`{node}` takes {n} arguments"),
    };
    let before = entries
        .iter()
        .filter(|e| e.span().offset() < span.offset())
        .max_by_key(|e| e.span().offset());
    let help = match before.and_then(|e| e.name()) {
        // Offered only where the block has such a child taking several values.
        Some(property) if several(property.value()) => {
            let property = property.value();
            format!(
                "a property takes one value, so this is read as another argument of `{node}`; \
                 for several values write a child node in its block, `{property} \"…\" \"…\"`, \
                 else write `{usage}`"
            )
        }
        Some(_) => format!(
            "a property takes one value, so this is read as another argument of `{node}`: \
             write `{usage}`"
        ),
        None => format!("write `{usage}`"),
    };
    Problem {
        kind: Kind::UnexpectedArgument,
        message,
        span,
        label: "unexpected argument".into(),
        also: None,
        help,
    }
}

/// A block on a node that takes none.
pub fn unexpected_block(node: &str, block: SourceSpan) -> Problem {
    Problem {
        kind: Kind::UnknownNode,
        message: format!("`{node}` does not take a block"),
        span: block,
        label: "unexpected block".into(),
        also: None,
        help: "remove the `{ … }` block".into(),
    }
}

/// Something the node needs (`what`: "an id", "`max=…`") is not there.
pub fn missing(node: &str, name_span: SourceSpan, what: &str, usage: &str) -> Problem {
    Problem {
        kind: Kind::Missing,
        message: format!("`{node}` needs {what}"),
        span: name_span,
        label: format!("missing {what}"),
        also: None,
        help: format!("write `{usage}`"),
    }
}

/// A value of another type than expected (`found`: "an integer", "a string").
pub fn wrong_type(expected: &str, found: &str, span: SourceSpan, help: &str) -> Problem {
    Problem {
        kind: Kind::WrongType,
        message: format!("expected {expected}, found {found}"),
        span,
        label: format!("expected {expected}"),
        also: None,
        help: help.to_string(),
    }
}

/// How a second one of something that is given once is reported.
pub struct Twice<'a> {
    /// What is wrong (`` `timeout` is set twice ``).
    pub message: String,
    pub again: (SourceSpan, &'a str),
    pub first: (SourceSpan, &'a str),
    pub help: &'a str,
}

/// A setting, a node or a block given a second time where one is allowed.
pub fn set_twice(t: Twice) -> Problem {
    Problem {
        kind: Kind::DuplicateSetting,
        message: t.message,
        span: t.again.0,
        label: t.again.1.to_string(),
        also: Some((t.first.0, t.first.1.to_string())),
        help: t.help.to_string(),
    }
}

/// The usual [`Twice`]: `` `NAME` is set twice{suffix} ``, pointing at both.
pub fn setting_twice(name: &str, suffix: &str, again: SourceSpan, first: SourceSpan) -> Problem {
    set_twice(Twice {
        message: format!("`{name}` is set twice{suffix}"),
        again: (again, "set again here"),
        first: (first, "first set here"),
        help: "remove one of them",
    })
}

// ----- the checks

/// The most arguments `spec` takes (`None`: any number).
pub fn max_args(spec: &NodeSpec) -> Option<usize> {
    match spec.args.last() {
        Some(a) if matches!(a.repeat, Repeat::Many | Repeat::Any) => None,
        _ => Some(spec.args.len()),
    }
}

/// Reports arguments past those `spec` takes.
pub fn check_args(node: &Node, spec: &NodeSpec, usage: &str, report: &mut impl FnMut(Problem)) {
    if let Some(max) = max_args(spec)
        && let Some(extra) = node.args.get(max)
    {
        let entries: Vec<&KdlEntry> = node.args.iter().chain(node.props).copied().collect();
        report(unexpected_argument(
            node.name,
            max,
            extra.span(),
            usage,
            &entries,
            &|property| {
                spec.child(property)
                    .is_some_and(|c| max_args(c).is_none_or(|m| m > 1))
            },
        ));
    }
}

/// Reports properties `spec` does not take and properties given twice (unless the node takes
/// any key, or the property is `repeatable`).
pub fn check_props(
    node: &Node,
    spec: &NodeSpec,
    repeatable: &[&str],
    report: &mut impl FnMut(Problem),
) {
    if spec.any_key() {
        // Any key (a tool call's params), but each once: a second `zone=` would replace the
        // first, and the check would hold on a value the suite never meant alone.
        let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
        for p in node.props {
            let name = prop_name(p);
            match seen.get(name) {
                Some(first) if !repeatable.contains(&name) => {
                    let suffix = format!(" on `{}`", node.name);
                    report(setting_twice(name, &suffix, p.span(), *first));
                }
                Some(_) => {}
                None => {
                    seen.insert(name, p.span());
                }
            }
        }
        return;
    }
    let allowed: Vec<&str> = spec.props.iter().map(|p| p.name).collect();
    check_props_in(node, &allowed, repeatable, report);
}

/// [`check_props`] with the allowed property names given as a list.
pub fn check_props_in(
    node: &Node,
    allowed: &[&str],
    repeatable: &[&str],
    report: &mut impl FnMut(Problem),
) {
    let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
    for p in node.props {
        let name = prop_name(p);
        if !allowed.contains(&name) {
            let on = format!("`{}`", node.name);
            report(unknown_property(
                name,
                p.span(),
                node.name,
                &on,
                allowed.iter().copied(),
            ));
        } else if let Some(first) = seen.get(name) {
            if !repeatable.contains(&name) {
                let suffix = format!(" on `{}`", node.name);
                report(setting_twice(name, &suffix, p.span(), *first));
            }
        } else {
            seen.insert(name, p.span());
        }
    }
}

/// Reports a block on a node whose spec takes none.
pub fn check_block(node: &Node, spec: &NodeSpec, report: &mut impl FnMut(Problem)) {
    if let (Children::None, Some(block)) = (spec.children, node.block) {
        report(unexpected_block(node.name, block));
    }
}

/// Checks a child node's name against the block of `parent`: reports an unknown one, and a
/// second one of a kind that is not repeatable (`seen` keeps the first of each). Returns the
/// child's spec when it is known and not a duplicate.
pub fn check_child(
    parent: &NodeSpec,
    name: &str,
    name_span: SourceSpan,
    context: &str,
    twice_suffix: &str,
    seen: &mut HashMap<&'static str, SourceSpan>,
    report: &mut impl FnMut(Problem),
) -> Option<&'static NodeSpec> {
    let Some(spec) = parent.child(name) else {
        let known = parent.child_specs().iter().map(|s| s.name);
        report(unknown_node(name, name_span, context, known));
        return None;
    };
    if !spec.repeatable {
        if let Some(first) = seen.get(spec.name) {
            report(setting_twice(spec.name, twice_suffix, name_span, *first));
            return None;
        }
        seen.insert(spec.name, name_span);
    }
    Some(spec)
}

/// The settings of a node whose block holds settings (`timeout="30s"` or `timeout "30s"`):
/// checks each against `spec`'s children and returns them in the order written. Child nodes
/// named in `others` are left to the caller; `context` names the node in messages.
pub fn settings<'s, 'a: 's>(
    node: &Node<'_, 'a>,
    children: impl IntoIterator<Item = Node<'s, 'a>>,
    spec: &NodeSpec,
    context: &str,
    others: &[&str],
    report: &mut impl FnMut(Problem),
) -> Vec<Setting<'a>> {
    let names = || {
        spec.child_specs()
            .iter()
            .map(|s| s.name)
            .filter(|n| !others.contains(n))
    };
    let mut items: Vec<Setting<'a>> = Vec::new();
    for p in node.props {
        let name = prop_name(p);
        let name_span = p.name().map_or(p.span(), |n| n.span());
        match spec.child(name).filter(|s| !others.contains(&s.name)) {
            None => report(unknown_property(
                name,
                p.span(),
                node.name,
                context,
                names(),
            )),
            Some(s) if s.form == Form::Node => report(not_a_property(name, p.span())),
            Some(_) => items.push(Setting {
                name,
                name_span,
                values: vec![*p],
            }),
        }
    }
    for child in children {
        if others.contains(&child.name) {
            continue;
        }
        let Some(s) = spec.child(child.name) else {
            let known = spec.child_specs().iter().map(|s| s.name);
            report(unknown_node(child.name, child.name_span, context, known));
            continue;
        };
        check_props(&child, s, &[], report);
        check_block(&child, s, report);
        let many = max_args(s).is_none();
        let usage = if s.form == Form::Node {
            format!("{} \"NAME\" \"VALUE\"", child.name)
        } else if many {
            format!("{} VALUE…", child.name)
        } else {
            format!("{} VALUE", child.name)
        };
        let min = s
            .args
            .iter()
            .filter(|a| matches!(a.repeat, Repeat::One | Repeat::Many))
            .count();
        if child.args.len() < min {
            let what = match (min, child.args.len()) {
                (2, 1) => "a value after its name",
                (2, _) => "a name and a value",
                _ => "a value",
            };
            report(missing(child.name, child.name_span, what, &usage));
            continue;
        }
        check_args(&child, s, &usage, report);
        items.push(Setting {
            name: child.name,
            name_span: child.name_span,
            values: child.args.to_vec(),
        });
    }
    // A setting written twice (as properties, children, or both) is ambiguous.
    let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
    for s in &items {
        if spec.child(s.name).is_some_and(|s| s.repeatable) {
            continue;
        }
        match seen.get(s.name) {
            Some(first) => report(setting_twice(s.name, "", s.name_span, *first)),
            None => {
                seen.insert(s.name, s.name_span);
            }
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lang::{decls, scenario};

    fn problems_of(text: &str, spec: &NodeSpec) -> (Vec<Problem>, Vec<String>) {
        let doc: kdl::KdlDocument = text.parse().expect("test KDL parses");
        let node = &doc.nodes()[0];
        let (args, props): (Vec<&KdlEntry>, Vec<&KdlEntry>) =
            node.entries().iter().partition(|e| e.name().is_none());
        let kids: Vec<(Vec<&KdlEntry>, Vec<&KdlEntry>, &kdl::KdlNode)> = node
            .children()
            .map(|c| c.nodes())
            .unwrap_or_default()
            .iter()
            .map(|n| {
                let (a, p) = n.entries().iter().partition(|e| e.name().is_none());
                (a, p, n)
            })
            .collect();
        let view = Node {
            name: node.name().value(),
            name_span: node.name().span(),
            args: &args,
            props: &props,
            block: node.children().map(|c| c.span()),
        };
        let children = kids.iter().map(|(a, p, n)| Node {
            name: n.name().value(),
            name_span: n.name().span(),
            args: a,
            props: p,
            block: n.children().map(|c| c.span()),
        });
        let mut found = Vec::new();
        let items = settings(&view, children, spec, "`persona`", &[], &mut |p| {
            found.push(p)
        });
        (found, items.iter().map(|s| s.name.to_string()).collect())
    }

    #[test]
    fn a_setting_written_as_property_and_child_is_set_twice_pointing_at_both() {
        let text = "persona \"p\" type=\"a\" { type \"b\"; description \"d\" }";
        let (found, items) = problems_of(text, &decls::PERSONA);
        assert_eq!(items, ["type", "type", "description"]);
        assert_eq!(found.len(), 1, "{found:?}");
        let p = &found[0];
        assert_eq!(p.kind, Kind::DuplicateSetting);
        assert_eq!(p.message, "`type` is set twice");
        assert_eq!(p.span.offset(), text.find("type \"b\"").unwrap());
        assert_eq!(p.also.as_ref().map(|a| a.0.offset()), text.find("type="));
    }

    #[test]
    fn unknown_settings_and_nodes_are_named_with_the_closest_one() {
        let text = "persona \"p\" typ=\"a\" { descripton \"d\"; instructions \"i\" \"j\" }";
        let (found, items) = problems_of(text, &decls::PERSONA);
        // An extra value is reported; the setting keeps its first.
        assert_eq!(items, ["instructions"]);
        let messages: Vec<(&str, &str)> = found
            .iter()
            .map(|p| (p.message.as_str(), p.help.as_str()))
            .collect();
        assert_eq!(
            messages,
            [
                (
                    "unknown property `typ` on `persona`",
                    "did you mean `type`?"
                ),
                (
                    "unknown node `descripton` in `persona`",
                    "did you mean `description`?"
                ),
                (
                    "`instructions` takes one argument",
                    "write `instructions VALUE`"
                ),
            ]
        );
    }

    #[test]
    fn a_second_singular_child_is_reported_and_repeatable_ones_are_not() {
        let mut seen = HashMap::new();
        let mut found = Vec::new();
        let span = |o: usize| SourceSpan::from(o..o + 1);
        for (i, name) in ["name", "outcome", "outcome", "name", "nam"]
            .iter()
            .enumerate()
        {
            check_child(
                &scenario::SCENARIO,
                name,
                span(i),
                "a `scenario`",
                " in scenario `s`",
                &mut seen,
                &mut |p| found.push(p),
            );
        }
        let messages: Vec<&str> = found.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "`name` is set twice in scenario `s`",
                "unknown node `nam` in a `scenario`"
            ]
        );
        assert_eq!(found[0].also.as_ref().map(|a| a.0.offset()), Some(0));
    }
}
