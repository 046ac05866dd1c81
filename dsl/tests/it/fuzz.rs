//! Hostile suite text never panics, aborts or hangs the loader: generated near-valid suites
//! (real suites mutated, grammar-built node trees, pathological repetitions) and plain bytes
//! go through `trellis_dsl::load`, and random template syntax through the template check.
//!
//! The number of cases per property is `TRELLIS_FUZZ_CASES` (default small, for CI);
//! `just fuzz` runs a million of each (see README, "Fuzzing"). A case that runs longer than
//! the watchdog's bound aborts the binary, printing the input: that is a hang.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use trellis_dsl::template::{self, Names, Scope};
use trellis_dsl::{SourceFile, Span, Template};

/// Cases per property: `TRELLIS_FUZZ_CASES`, or few enough for CI.
pub(super) fn config(default: u32) -> Config {
    let cases = std::env::var("TRELLIS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}

/// How long one case may take before it counts as a hang (generous: debug builds on a
/// loaded machine; a real hang never ends).
const HANG: Duration = Duration::from_secs(30);

type Slot = Arc<Mutex<Option<(Instant, String)>>>;

/// Runs `f` while a watchdog thread checks that it ends within [`HANG`]; otherwise prints
/// `input` and aborts (a hang cannot be unwound).
pub(super) fn bounded<T>(input: &str, f: impl FnOnce() -> T) -> T {
    static SLOTS: OnceLock<Mutex<Vec<Slot>>> = OnceLock::new();
    thread_local! {
        static SLOT: Slot = {
            let slot: Slot = Arc::default();
            let slots = SLOTS.get_or_init(|| {
                std::thread::spawn(|| loop {
                    std::thread::sleep(Duration::from_millis(250));
                    let Some(slots) = SLOTS.get() else { continue };
                    for slot in slots.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        if let Some((started, input)) =
                            &*slot.lock().unwrap_or_else(|e| e.into_inner())
                            && started.elapsed() > HANG
                        {
                            let shown: String = input.chars().take(2_000).collect();
                            // Straight to stderr: the test harness captures `eprintln!`, and what it
                            // captured is lost with the abort.
                            let _ = writeln!(
                                std::io::stderr(),
                                "fuzz case still running after {HANG:?} (a hang); input:\n{shown:?}"
                            );
                            std::process::abort();
                        }
                    }
                });
                Mutex::default()
            });
            slots.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&slot));
            slot
        };
    }
    SLOT.with(|slot| {
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), input.to_string()));
        let out = f();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        out
    })
}

/// Real suites to mutate: the crate's valid and broken examples and the repository's suites.
pub(super) fn seeds() -> &'static [String] {
    static SEEDS: OnceLock<Vec<String>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut out = Vec::new();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for dir in ["tests/ok", "tests/ok/shared", "tests/golden", "../suites"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for path in paths {
                if path.extension().is_some_and(|e| e == "kdl")
                    && let Ok(text) = std::fs::read_to_string(&path)
                {
                    out.push(text);
                }
            }
        }
        assert!(
            out.len() >= 10,
            "seed suites not found under {}",
            root.display()
        );
        out
    })
}

/// Words and punctuation the language is made of, to splice into suites.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "{\n",
    "\n}",
    ";",
    "\n",
    " ",
    "=",
    "\"",
    "\"\"\"",
    "#\"",
    "\"#",
    "#\"\"\"\n",
    "\n\"\"\"#",
    "#",
    "#true",
    "#false",
    "#null",
    "#inf",
    "#nan",
    "/-",
    "//",
    "/*",
    "*/",
    "\\",
    "\\\n",
    "(",
    ")",
    "(i8)",
    "0x",
    "1e999",
    "-",
    ".",
    "-0",
    "18446744073709551616",
    "0.5",
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{{ user_context.x }}",
    "{% for x in y %}",
    "{% endfor %}",
    "{{ env.HOME }}",
    "suite",
    "agent",
    "scenario",
    "user",
    "expect",
    "capture",
    "fork",
    "branch",
    "then",
    "persona",
    "tool",
    "criterion",
    "judge",
    "provider",
    "include",
    "simulate",
    "simulator",
    "hitl",
    "call",
    "needs",
    "panel",
    "vars",
    "env",
    "transport",
    "protocol=",
    "builtin=",
    "url=",
    "command=",
    "socket=",
    "timeout=",
    "retries=",
    "max-response-size=",
    "\"5s\"",
    "\"0s\"",
    "\"1KB\"",
    "\"99999999999999999999GB\"",
    "regex=",
    "#\"(\"#",
    "#\"[\\d+\"#",
    "json-path=",
    "[?@.a",
    "\"$[?@.a[0]",
    "\"$..[?(@\"",
    "contains=",
    "reply",
    "state",
    "violations",
    "repeat=",
    "turns=",
    "until-done",
    "agent-branches",
    "breadth=",
    "depth=",
    "initial-state",
    "sequence",
    "returns",
    "tags",
    "difficulty=",
    "\"connexity\"",
    "\"multiagent\"",
    "\"agentscope\"",
    "\"fixie\"",
    "\"openai\"",
    "\"booking\"",
    "é",
    "\u{0}",
    "\u{feff}",
    "\u{202e}",
    "\r\n",
    "\t",
    "\u{2028}",
];

#[derive(Clone, Debug)]
enum Edit {
    Delete(usize),
    Insert(String),
    /// Repeat the text from the position on, `n` bytes long, `times` times.
    Repeat(usize, usize),
    Truncate,
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (1usize..40).prop_map(Edit::Delete),
        5 => prop::sample::select(TOKENS).prop_map(|t| Edit::Insert(t.to_string())),
        2 => ".{0,12}".prop_map(Edit::Insert),
        1 => (1usize..60, 2usize..30).prop_map(|(n, t)| Edit::Repeat(n, t)),
        1 => Just(Edit::Truncate),
    ]
}

/// A real suite with a few random edits at random places.
pub(super) fn mutated_suite() -> impl Strategy<Value = String> {
    (
        0..seeds().len(),
        prop::collection::vec((any::<prop::sample::Index>(), edit()), 1..8),
    )
        .prop_map(|(seed, edits)| {
            let mut text = seeds()[seed].clone().into_bytes();
            for (at, edit) in edits {
                let at = at.index(text.len() + 1);
                match edit {
                    Edit::Delete(n) => {
                        text.drain(at..(at + n).min(text.len()));
                    }
                    Edit::Insert(s) => {
                        text.splice(at..at, s.into_bytes());
                    }
                    Edit::Repeat(n, times) => {
                        let piece = text[at..(at + n).min(text.len())].to_vec();
                        for _ in 0..times {
                            text.splice(at..at, piece.iter().copied());
                        }
                    }
                    Edit::Truncate => text.truncate(at),
                }
            }
            // Edits cut UTF-8 sequences; the loader reads text, so keep it text.
            String::from_utf8_lossy(&text).into_owned()
        })
}

fn kdl_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(TOKENS).prop_map(|t| format!("{t:?}")),
        "[a-z{}%#. _$@?()\\[\\]*+-]{0,24}".prop_map(|s| format!("{s:?}")),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| {
            if n.is_finite() {
                format!("{n:?}")
            } else {
                "#nan".into()
            }
        }),
        prop::sample::select(&["#true", "#false", "#null", "#inf", "#-inf", "1.5e400"][..])
            .prop_map(str::to_string),
    ]
}

/// A node tree built from the language's own names, with values of every type.
pub(super) fn grammar_suite() -> impl Strategy<Value = String> {
    // Selected from the name-like tokens, not filtered (a filter rejects most draws and
    // proptest gives up on a long run).
    let names: Vec<&'static str> = TOKENS
        .iter()
        .copied()
        .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .collect();
    let name = prop::sample::select(names).prop_map(str::to_string);
    let entry = prop_oneof![
        kdl_value(),
        (name.clone(), kdl_value()).prop_map(|(k, v)| format!("{k}={v}")),
    ];
    let leaf = (name.clone(), prop::collection::vec(entry.clone(), 0..4))
        .prop_map(|(n, entries)| format!("{n} {}", entries.join(" ")));
    leaf.prop_recursive(6, 64, 8, move |inner| {
        (
            name.clone(),
            prop::collection::vec(entry.clone(), 0..3),
            prop::collection::vec(inner, 0..8),
        )
            .prop_map(|(n, entries, children)| {
                format!("{n} {} {{\n{}\n}}", entries.join(" "), children.join("\n"))
            })
    })
    .prop_map(|tree| {
        format!("suite \"fuzz\"\nagent \"a\" protocol=\"connexity\" builtin=\"booking\"\n{tree}\n")
    })
}

/// One token repeated up to far past any sane nesting or length, after a valid prefix.
fn repetition() -> impl Strategy<Value = String> {
    let count = prop_oneof![
        30 => 0usize..600,
        1 => 600usize..60_000,
    ];
    (
        prop::sample::select(TOKENS),
        prop::sample::select(&["", "scenario \"s\" ", "agent \"a\" x=", "/* ", "user \""][..]),
        count,
        any::<bool>(),
    )
        .prop_map(|(token, prefix, count, close)| {
            let mut text = format!("{prefix}{}", token.repeat(count));
            if close {
                text.push_str(&"}".repeat(count.min(1_000)));
            }
            text
        })
}

/// Writes `text` as a suite file and loads it; any outcome but a panic, abort or hang is
/// fine.
fn load_text(dir: &Path, text: &[u8]) {
    let path = dir.join("fuzz.kdl");
    std::fs::write(&path, text).unwrap();
    let shown = String::from_utf8_lossy(text);
    bounded(&shown, || {
        if let Err(diags) =
            trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        {
            // Rendering reads every span back out of the source: a span past the end or
            // inside a UTF-8 sequence would panic here.
            let _ = diags.to_string();
            let _ = diags.render_plain();
        }
    });
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Writes `text` to `path` and loads it under the hang watchdog: the suite, or its
/// diagnostics rendered.
fn load_bounded(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).unwrap();
    bounded(text, || {
        trellis_dsl::load(&[path], &trellis_engine::protocol::registry::specs())
            .map(|_| ())
            .map_err(|diags| diags.render_plain())
    })
}

/// Found by the million-case run of `loader_survives_mutated_suites`: a `/-` right after
/// another one is a syntax error the parser recovers from by rescanning the rest of the node,
/// so a few thousand of them on one line took minutes. The loader refuses the first one.
#[test]
fn slashdash_after_slashdash_is_refused_before_parsing() {
    let dir = tempdir();
    let path = dir.path().join("fuzz.kdl");
    let text = format!("suite \"x\"\n{}", "/- /- x ".repeat(2_000));
    let shown = load_bounded(&path, &text).expect_err("loaded");
    assert!(
        shown.contains("`/-` right after another `/-`") && shown.contains("fuzz.kdl:2:4"),
        "{shown}"
    );
}

/// Found by `loader_survives_pathological_repetition` on CI: after a syntax error each node
/// of the rest of the file is parsed on its own, and finding the start of each one's line
/// searched back from the node, so a line of 60,000 `;` (60,000 empty nodes) took over 30 s
/// in a debug build. The line starts are now found in one pass forward: 150,000 load at once
/// (this input took minutes before).
#[test]
fn a_line_of_many_nodes_after_a_syntax_error_is_read_once() {
    let dir = tempdir();
    let path = dir.path().join("fuzz.kdl");
    let text = format!("agent \"a\" x={}", ";".repeat(150_000));
    let shown = load_bounded(&path, &text).expect_err("loaded");
    assert!(
        shown.contains("a value must follow `=`") && shown.contains("fuzz.kdl:1:13"),
        "{shown}"
    );
}

/// Slashdashed nodes last in their block, and slashdashed children blocks, nested: the
/// parser (kdl 6.7.1) parsed each level's twice, so 24 levels took minutes
/// (`vendor/kdl/PATCHES.md`). Forty levels of each load at once, and forty levels with a
/// syntax error each fail at once; a hang aborts the binary through [`bounded`].
#[test]
fn nested_slashdashed_nodes_and_blocks_load() {
    let dir = tempdir();
    let path = dir.path().join("nested.kdl");
    for commented in ["/-branch \"b\" {\n    user \"x\"\n", "user \"x\" /-{\n"] {
        let text = format!(
            "agent \"a\" protocol=\"connexity\" url=\"http://127.0.0.1:1/agent\"\n\
             scenario \"s\" {{\n    user \"hi\"\n{}{}}}\n",
            commented.repeat(40),
            "}\n".repeat(40)
        );
        if let Err(shown) = load_bounded(&path, &text) {
            panic!("{shown}\n{text}");
        }
    }
    // The same nesting with a syntax error at every level, the blocks never closed: the
    // parser's error recovery went through the same double parses.
    let text = format!(
        "suite \"x\"\n{}",
        "/-scenario \"x\"\"s\" {\n    \"echo\"\n\n".repeat(40)
    );
    let shown = load_bounded(&path, &text).expect_err("loaded");
    assert!(
        shown.contains("a `\"` inside a quoted string ends it"),
        "{shown}"
    );
}

/// Found by the million-case run of `loader_survives_mutated_suites`: a `json-path` of
/// nested filters, each of which made the path parser about four times slower. The loader
/// refuses paths nested over its limit before parsing them.
#[test]
fn nested_json_path_filters_are_refused_before_parsing() {
    let dir = tempdir();
    let path = dir.path().join("fuzz.kdl");
    let text = format!(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {{\n  user \"hi\"\n  capture \"c\" json-path=\"$[?@.kins[0].parts{}\"\n}}\n",
        "[?@.kins[0].parts".repeat(40)
    );
    let shown = load_bounded(&path, &text).expect_err("loaded");
    assert!(
        shown.contains("JSON path nested more than") && shown.contains("fuzz.kdl:4:25"),
        "{shown}"
    );
}

/// Found while looking for slow inputs: after a multi-line raw string that is never closed,
/// the parser's recovery retried every later `#"""` to the end of the file. The loader
/// refuses the first one.
#[test]
fn unclosed_multi_line_strings_are_refused_before_parsing() {
    let dir = tempdir();
    let path = dir.path().join("fuzz.kdl");
    let text = format!(
        "scenario \"s\" {{\n  user {}}}\n",
        "#\"\"\"\n".repeat(5_000)
    );
    let shown = load_bounded(&path, &text).expect_err("loaded");
    assert!(
        shown.contains("multi-line string not closed") && shown.contains("fuzz.kdl:2:8"),
        "{shown}"
    );
}

#[test]
fn loader_survives_mutated_suites() {
    let dir = tempdir();
    proptest!(config(300), |(text in mutated_suite())| {
        load_text(dir.path(), text.as_bytes());
    });
}

#[test]
fn loader_survives_generated_node_trees() {
    let dir = tempdir();
    proptest!(config(300), |(text in grammar_suite())| {
        load_text(dir.path(), text.as_bytes());
    });
}

#[test]
fn loader_survives_pathological_repetition() {
    let dir = tempdir();
    proptest!(config(200), |(text in repetition())| {
        load_text(dir.path(), text.as_bytes());
    });
}

#[test]
fn loader_survives_random_bytes() {
    let dir = tempdir();
    proptest!(config(300), |(bytes in prop::collection::vec(any::<u8>(), 0..512))| {
        load_text(dir.path(), &bytes);
    });
}

/// Template syntax pieces, to assemble into near-valid templates.
const TEMPLATE_PIECES: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{{-",
    "-}}",
    " ",
    "x",
    "user_context",
    ".",
    "[",
    "]",
    "(",
    ")",
    "|",
    "upper",
    "default",
    "\"",
    "'",
    "0",
    "1e999",
    "for",
    "in",
    "endfor",
    "if",
    "else",
    "endif",
    "set",
    "=",
    "macro",
    "endmacro",
    "call",
    "raw",
    "endraw",
    "filter",
    "loop.index",
    "persona.name",
    "env.HOME",
    "vars",
    "~",
    "+",
    "*",
    "**",
    "//",
    "%",
    "not",
    "is",
    "defined",
    "range(999999999)",
    "{{ x }}",
    "{% for a in b %}",
    "{% endfor %}",
    "\\",
    "\n",
    "é",
];

fn template_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(TEMPLATE_PIECES), 0..40)
            .prop_map(|pieces| pieces.concat()),
        1 => ".{0,80}",
        1 => (prop::sample::select(&["{{ (", "{% if x %}", "{{ [", "{{ -", "{% for a in b %}"][..]), 0usize..3_000)
            .prop_map(|(open, n)| format!("{{{{ x }}}}{}", open.repeat(n))),
    ]
}

#[test]
fn template_check_survives_random_templates() {
    let text: Arc<str> = Arc::from("");
    let files = vec![SourceFile::new(
        PathBuf::from("fuzz.kdl"),
        "fuzz.kdl".to_string(),
        text,
    )];
    let scope = Scope::env_only()
        .with(
            "user_context",
            Names::Only(BTreeSet::from(["x".to_string()])),
        )
        .with("persona", Names::Any);
    proptest!(config(2_000), |(source in template_text())| {
        let template = Template {
            source: source.clone(),
            span: Span { file: 0, span: (0, 0).into() },
        };
        bounded(&source, || {
            for diag in template::check(&template, &scope, &files) {
                let _ = diag.to_string();
            }
        });
    });
}
