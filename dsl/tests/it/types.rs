//! The language table's value types are what decoding enforces: for every setting the table
//! declares (every agent's, each protocol's, and those of the other nodes), a value of its
//! type loads and a value of another type is an error pointing at it. A decoder that checked
//! a setting differently from its declared type (or not at all) fails here, naming it.

use trellis_dsl::lang::{self, Form, NodeSpec, ValueType};

/// A suite where `{{PARENT}}` marks where each node kind's settings go.
const BASE: &str = r#"
suite "types" {
{{suite}}
}
provider "p" {
{{provider}}
}
simulator {
{{simulator}}
}
judge "j" {
{{judge}}
}
panel "pa" {
{{panel}}
}
persona "pe" {
{{persona}}
}
tool "t" {
{{tool}}
}
agent "a" {
{{agent}}
}
agent "proto" {
{{agent:proto}}
}
scenario "s" {
{{scenario}}
    persona {
{{scenario.persona}}
    }
    simulator {
{{scenario.simulator}}
    }
    user "hi"
    expect reply contains="x"
    simulate turns=1
}
scenario "s2" {
    agent "a"
    user "hi"
    attack {
{{scenario.attack}}
    }
}
"#;

/// The settings a node needs to load besides the one under test, by marker.
fn filler(marker: &str, protocol: &str) -> Vec<(&'static str, &'static str)> {
    match marker {
        "provider" => vec![
            ("kind", "\"openai\""),
            ("base-url", "\"http://127.0.0.1:1/v1\""),
            ("model", "\"m\""),
        ],
        "simulator" => vec![("provider", "\"p\""), ("model", "\"m\"")],
        "judge" => vec![("provider", "\"p\""), ("model", "\"m\"")],
        "panel" => vec![("judges", "\"j\"")],
        "agent" => vec![("protocol", "\"connexity\""), ("builtin", "\"booking\"")],
        "agent:proto" => {
            let mut out = vec![("protocol", "PROTO")];
            out.extend(match protocol {
                "openai" | "anthropic" => vec![
                    ("base-url", "\"http://127.0.0.1:1/v1\""),
                    ("model", "\"m\""),
                ],
                "multiagent" => vec![("command", "\"agent\"")],
                "http" => vec![("url", "\"http://127.0.0.1:1/x\"")],
                _ => vec![("url", "\"http://127.0.0.1:1/x\"")],
            });
            out
        }
        "scenario" => vec![("agent", "\"a\"")],
        "scenario.persona" => vec![("type", "\"shopper\"")],
        "scenario.attack" => vec![("goal", "\"g\"")],
        _ => Vec::new(),
    }
}

/// Node settings a protocol's agent needs (written as child nodes).
fn node_filler(protocol: &str) -> &'static str {
    match protocol {
        "http" => "    request #\"{\"q\": 1}\"#\n    reply json-path=\"$.a\"\n",
        _ => "",
    }
}

/// A value of type `ty`, and one that is not (`None`: every value is of this type).
fn values(ty: ValueType) -> (String, Option<String>) {
    let s = |v: &str| format!("\"{v}\"");
    match ty {
        ValueType::String => (s("x"), Some("#true".into())),
        ValueType::Template | ValueType::TurnTemplate(_) => (s("x"), Some(s("{{"))),
        // The edges of each range: a decoder that wants more than its type says fails here.
        ValueType::Count => ("0".into(), Some("-1".into())),
        ValueType::Number => ("-1e6".into(), Some(s("one"))),
        ValueType::Between(lo, hi) => (hi.to_string(), Some((f64::from(lo) - 0.5).to_string())),
        ValueType::Positive => ("1".into(), Some("0".into())),
        ValueType::Boolean => ("#true".into(), Some(s("yes"))),
        ValueType::Duration => (s("30s"), Some(s("soon"))),
        ValueType::Size => (s("5MB"), Some(s("big"))),
        ValueType::Url => (s("http://127.0.0.1:1/x"), Some(s("nowhere"))),
        ValueType::Regex => (s("a+"), Some(s("(a"))),
        ValueType::JsonPath => (s("$.a"), Some(s("$.a["))),
        ValueType::HeaderName => (s("X-A"), Some(s("a b"))),
        ValueType::EnvName => (s("A_B"), Some(s("1A"))),
        ValueType::Path => (s("."), Some("5".into())),
        ValueType::Ref(kind) => {
            let id = match kind {
                "provider" => "p",
                "tool" => "t",
                "judge" => "j",
                "agent" => "a",
                "persona" => "pe",
                other => panic!("no declaration of kind `{other}` in the base suite"),
            };
            (s(id), Some(s("missing-id")))
        }
        ValueType::OneOf(words) => (s(words[0]), Some(s("not-a-word"))),
        ValueType::Any => (s("x"), None),
    }
}

/// One case: `setting` at `marker` with `value`; returns the suite text and the byte range
/// of the line written for the setting.
fn case(
    marker: &str,
    protocol: &str,
    setting: &str,
    value: &str,
) -> (String, std::ops::Range<usize>) {
    let mut text = BASE.to_string();
    let mut range = 0..0;
    let markers: Vec<String> = BASE
        .match_indices("{{")
        .filter_map(|(i, _)| {
            let rest = &BASE[i + 2..];
            Some(rest[..rest.find("}}")?].to_string())
        })
        .collect();
    for m in markers {
        let mut lines = String::new();
        for (name, v) in filler(&m, protocol) {
            // The setting under test replaces the filler's (an endpoint replaces another).
            let replaced = name == setting
                || (setting == "url" && name == "builtin")
                || (setting == "agents" && name == "agent");
            if m == marker && replaced {
                continue;
            }
            let v = if v == "PROTO" {
                format!("\"{protocol}\"")
            } else {
                v.to_string()
            };
            lines.push_str(&format!("    {name} {v}\n"));
        }
        if m == "agent:proto" {
            for line in node_filler(protocol).lines() {
                if !(m == marker && line.trim_start().starts_with(setting)) {
                    lines.push_str(line);
                    lines.push('\n');
                }
            }
        }
        let placeholder = format!("{{{{{m}}}}}\n");
        let at = text.find(&placeholder).expect("the marker is in the text");
        if m == marker {
            let line = format!("    {setting} {value}\n");
            lines.push_str(&line);
            let start = at + lines.len() - line.len();
            range = start..start + line.len();
        }
        // Markers are replaced in the order they are written, so what is replaced after the
        // setting's line lies after it and leaves its range as recorded.
        text.replace_range(at..at + placeholder.len(), &lines);
    }
    (text, range)
}

fn load(text: &str) -> Result<(), trellis_dsl::Diagnostics> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("types.kdl");
    std::fs::write(&path, text).unwrap();
    trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs()).map(|_| ())
}

/// Every one-value setting of the table, by marker: (marker, protocol, spec).
fn settings() -> Vec<(String, &'static str, &'static NodeSpec)> {
    let mut out = Vec::new();
    lang::walk(|path, spec| {
        let Some(parent) = path.last() else { return };
        let marker = if path.len() == 2 && path[0] == "scenario" {
            format!("scenario.{parent}")
        } else if path.len() == 1 {
            parent.to_string()
        } else {
            return;
        };
        if spec.form == Form::Setting && spec.args.len() == 1 {
            out.push((marker, "", spec));
        }
    });
    for protocol in trellis_engine::protocol::registry::specs() {
        for spec in protocol.settings {
            if spec.form == Form::Setting && spec.args.len() == 1 {
                out.push(("agent:proto".to_string(), protocol.name, spec));
            }
        }
    }
    out
}

/// Settings whose meaning a lone value cannot show: endpoints and the choices that need
/// another setting (checked by the golden diagnostics instead).
const NOT_ALONE: &[&str] = &[
    "agent.protocol",
    "agent.base-url",
    "agent.builtin",
    "agent.command",
    "agent.socket",
    "agent.model",
    "agent.provider",
    "agent:multiagent.transport",
    "agent:multiagent.keep-open",
    "provider.api-key-header",
    // A scenario id: the base has one scenario, which cannot need itself.
    "scenario.needs",
];

#[test]
fn the_base_suite_loads() {
    for protocol in trellis_engine::protocol::registry::specs() {
        let (text, _) = case("none", protocol.name, "", "");
        if let Err(e) = load(&text) {
            panic!("{}:\n{}\n{text}", protocol.name, e.render_plain());
        }
    }
}

#[test]
fn every_typed_setting_of_the_table_is_checked_by_its_type() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (marker, protocol, spec) in settings() {
        let key = if protocol.is_empty() {
            format!("{marker}.{}", spec.name)
        } else {
            format!("agent:{protocol}.{}", spec.name)
        };
        if NOT_ALONE.contains(&key.as_str()) {
            continue;
        }
        let protocol = if protocol.is_empty() {
            "connexity"
        } else {
            protocol
        };
        let ty = spec.args[0].ty;
        let (good, bad) = values(ty);
        let (text, _) = case(&marker, protocol, spec.name, &good);
        if let Err(e) = load(&text) {
            wrong.push(format!(
                "{key} {good} ({}) is refused:\n{}",
                ty.describe(),
                e.render_plain()
            ));
        }
        let Some(bad) = bad else { continue };
        let (text, line) = case(&marker, protocol, spec.name, &bad);
        match load(&text) {
            Ok(()) => wrong.push(format!("{key} {bad} is accepted as {}", ty.describe())),
            Err(e) => {
                if !e.iter().any(|d| line.contains(&d.offset())) {
                    wrong.push(format!(
                        "{key} {bad}: no error points at it:\n{}",
                        e.render_plain()
                    ));
                }
            }
        }
        checked += 1;
    }
    assert!(checked > 60, "only {checked} settings checked");
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn a_scenario_simulator_no_step_takes_is_still_checked() {
    let text = r#"
agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    simulator provider="nope" instructions="{{ unclosed"
    user "hi"
    expect reply contains="x"
}
"#;
    let Err(e) = load(text) else {
        panic!("a simulator block with a bad provider and template loaded")
    };
    let shown = e.render_plain();
    assert!(shown.contains("nope"), "{shown}");
    assert!(shown.contains("template_syntax"), "{shown}");
}
