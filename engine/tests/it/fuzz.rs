//! Hostile agent output never panics or hangs a decoder: generated near-valid bodies (JSON of
//! every shape with the protocols' own keys and random types, truncated or mutated; YAML
//! forms of the Fixie handshake, alias bombs included; few-shot text) and plain bytes go
//! through every wire decoder, and random template syntax through the renderer.
//!
//! Framing is fuzzed where it is parsed: server-sent events through the `sse-stream` parser
//! the SSE transport reads with (`transport::sse`), fed from an in-memory byte stream cut at
//! random places; JSON lines through `transport::line::read_line` over an in-memory duplex
//! pipe written in random chunks. Every event's data and every line then goes through the
//! decoders.
//!
//! Every decoder of agent bytes is one line in [`DECODERS`]: a new protocol's decoder (A2A's
//! reply and task decoding, for one) is fuzzed by adding it there.
//!
//! The number of cases per property is `TRELLIS_FUZZ_CASES` (default small, for CI);
//! `just fuzz` runs a million of each (see README, "Fuzzing"). A case that runs longer than
//! the watchdog's bound aborts the binary, printing the input: that is a hang.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use serde_json::{Map, Value, json};
use trellis_engine::protocol::a2a;
use trellis_engine::protocol::fixie;
use trellis_engine::protocol::multiagent::wire;
use trellis_engine::render::{Templates, snapshot_env};
use trellis_engine::transport::line::read_line;

/// Cases per property: `TRELLIS_FUZZ_CASES`, or few enough for CI.
pub(crate) fn config(default: u32) -> Config {
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
fn bounded<T>(input: &[u8], f: impl FnOnce() -> T) -> T {
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
        let shown = String::from_utf8_lossy(input).into_owned();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), shown));
        let out = f();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        out
    })
}

/// A decoder's name and a call of it on a body.
type Decoder = (&'static str, fn(&[u8]));

/// Every decoder of bytes an agent sends. Each may fail in any way but a panic or a hang;
/// faults are formatted too, since they quote agent text.
const DECODERS: &[Decoder] = &[
    ("multiagent reply", |body| {
        if let Err(fault) = wire::decode_reply(body) {
            let _ = fault.message.len();
        }
    }),
    ("fixie handshake", |body| {
        match fixie::Handshake::parse(body) {
            Ok(handshake) => {
                let _ = handshake.functions();
                let _ = handshake.to_record("/");
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }),
    ("fixie function reply", |body| {
        if let Ok(reply) = fixie::parse_reply(body, "f") {
            let _ = reply.embed_parts();
        }
    }),
    ("fixie few-shots", |body| {
        let text = String::from_utf8_lossy(body);
        for shot in fixie::split_few_shots(&text) {
            let _ = fixie::parse_few_shot(&shot);
        }
    }),
    ("a2a answer", |body| {
        let _ = a2a::wire::parse_card(body);
        match a2a::wire::response_result(body, 1) {
            Ok(result) => {
                let mut assembly = a2a::wire::Assembly::new();
                let _ = assembly.apply(result);
                let _ = assembly.finish();
            }
            Err(fault) => {
                let _ = fault.message.len();
            }
        }
    }),
];

/// Keys the protocols use, so generated objects get past the first lookups.
const KEYS: &[&str] = &[
    "action",
    "type",
    "name",
    "arguments",
    "tool_calls",
    "tool_name",
    "tool_params",
    "tool_outputs",
    "content",
    "message",
    "text",
    "final_answer",
    "answer",
    "options",
    "alternatives",
    "branch",
    "branches",
    "option",
    "reason",
    "label",
    "summary",
    "agent",
    "agent_name",
    "agent_id",
    "role",
    "metadata",
    "result",
    "status",
    "error",
    "id",
    "functions",
    "function",
    "base_prompt",
    "few_shots",
    "handshake",
    "embeds",
    "embed",
    "output",
    "params",
    "paths",
    "path",
    "prompt",
    "description",
    "format",
    "model",
    "hitl_pause",
    "policy_violation",
    "instructions",
    "conversation_history",
    "turn",
    "logs",
    "index",
    "count",
];

/// Values the protocols look for.
const WORDS: &[&str] = &[
    "call_tool",
    "call_multiple_tools",
    "final_answer",
    "branch",
    "hitl_pause",
    "done",
    "provide_instructions",
    "tool",
    "text",
    "user",
    "assistant",
    "",
    "\u{0}",
    "é",
    "FINAL_ANSWER",
    "{{ x }}",
    "Func",
    "yaml",
    "json",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        prop::sample::select(WORDS).prop_map(|w| json!(w)),
        ".{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A body as an agent might garble it.
#[derive(Clone, Debug)]
enum Damage {
    None,
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    Splice(prop::sample::Index, &'static str),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => Just(Damage::None),
        2 => any::<prop::sample::Index>().prop_map(Damage::Truncate),
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Damage::Flip(i, b)),
        1 => (any::<prop::sample::Index>(), prop::sample::select(&["{", "}", "[", "]", "\"", ",", ":", "\\u", "\\ud800", "null", "1e99999", "\n", "&a", "*a", "- ", "!!binary"][..]))
            .prop_map(|(i, s)| Damage::Splice(i, s)),
    ]
}

fn apply(mut body: Vec<u8>, damage: &Damage) -> Vec<u8> {
    match damage {
        Damage::None => {}
        Damage::Truncate(at) => body.truncate(at.index(body.len() + 1)),
        Damage::Flip(at, byte) => {
            if !body.is_empty() {
                let at = at.index(body.len());
                body[at] = *byte;
            }
        }
        Damage::Splice(at, s) => {
            let at = at.index(body.len() + 1);
            body.splice(at..at, s.bytes());
        }
    }
    body
}

/// JSON bodies: an object of protocol keys (sometimes wrapped the way harnesses wrap
/// replies), as JSON or YAML, damaged or not.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let object = prop_oneof![
        3 => json_value(),
        2 => (prop::sample::select(WORDS), json_value()).prop_map(|(action, rest)| {
            let mut object = Map::new();
            object.insert("action".into(), json!(action));
            if let Value::Object(more) = rest {
                object.extend(more);
            } else {
                object.insert("tool_params".into(), rest);
            }
            Value::Object(object)
        }),
        1 => json_value().prop_map(|v| json!({ "functions": [v], "base_prompt": "p", "few_shots": ["a", v] })),
    ];
    (object, any::<bool>(), damage()).prop_map(|(value, yaml, damage)| {
        let text = if yaml {
            serde_yaml_ng::to_string(&value).unwrap_or_default()
        } else {
            value.to_string()
        };
        apply(text.into_bytes(), &damage)
    })
}

/// Bodies no JSON or YAML parser should choke on: nesting, aliases, huge numbers, runaway
/// repetition.
fn pathological() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop::sample::select(
        &[
            "[",
            "{\"a\":",
            "- ",
            "a: &a [*a, *a]\n",
            "&a [",
            "*a, ",
            "\"\\u",
            "9",
            "\n  ",
            "? ",
            "!!",
            "%YAML 1.2\n",
            "---\n",
            "{\"action\":\"call_tool\",\"tool_calls\":[",
            "Human: ",
            "Func[",
            "\nAI: ",
        ][..],
    );
    let count = prop_oneof![20 => 0usize..300, 1 => 300usize..50_000];
    (piece, count, ".{0,8}").prop_map(|(piece, count, tail)| {
        let mut body = piece.repeat(count);
        body.push_str(&tail);
        body.into_bytes()
    })
}

/// A YAML document whose aliases expand exponentially.
fn yaml_bomb(levels: usize) -> Vec<u8> {
    let mut text = String::from("a0: &a0 [\"lol\", \"lol\", \"lol\"]\n");
    for i in 1..=levels {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    text.push_str(&format!("functions: *a{levels}\n"));
    text.into_bytes()
}

fn decode_all(body: &[u8]) {
    for (_name, decode) in DECODERS {
        bounded(body, || decode(body));
    }
}

#[test]
fn decoders_survive_near_valid_bodies() {
    proptest!(config(1_000), |(body in body())| decode_all(&body));
}

#[test]
fn decoders_survive_pathological_bodies() {
    proptest!(config(200), |(body in pathological())| decode_all(&body));
}

#[test]
fn decoders_survive_random_bytes() {
    proptest!(config(1_000), |(body in prop::collection::vec(any::<u8>(), 0..512))| decode_all(&body));
}

#[test]
fn decoders_survive_yaml_alias_bombs() {
    for levels in 1..=12 {
        decode_all(&yaml_bomb(levels));
    }
}

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
    "tojson",
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
    "range(9)",
    "{{ x }}",
    "{% for a in range(99) %}",
    "{% endfor %}",
    "\\",
    "\n",
    "é",
    "9223372036854775807",
    "-1",
    "'x' * 99999999",
    "recursive",
    "loop(a)",
    "include",
    "extends",
    "import",
];

fn template_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(TEMPLATE_PIECES), 0..40)
            .prop_map(|pieces| pieces.concat()),
        1 => ".{0,80}",
        1 => (prop::sample::select(&["{{ (", "{% if x %}", "{{ [", "{{ -", "{% for a in range(9) %}"][..]), 0usize..3_000)
            .prop_map(|(open, n)| format!("{{{{ x }}}}{}", open.repeat(n))),
    ]
}

#[test]
fn renderer_survives_random_templates() {
    let templates = Templates::new(snapshot_env());
    let context = json!({
        "x": "value",
        "user_context": { "x": [1, 2, 3], "y": { "z": null } },
        "persona": { "name": "Ann" },
        "vars": {},
    });
    proptest!(config(2_000), |(source in template_text())| {
        bounded(source.as_bytes(), || {
            let _ = templates.render_source(&source, || minijinja::Value::from(minijinja::value::Serde(&context)));
        });
    });
}

/// A single-threaded runtime for the framing properties (one per test, reused by its cases).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How long an in-memory stream may take to frame: far more than any case needs.
const FRAMING: Duration = Duration::from_secs(10);

/// Cuts `bytes` at the given fractions of its length.
fn cut(bytes: &[u8], cuts: &[prop::sample::Index]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
}

/// A server-sent event stream: fields of every kind, events ending with every line ending,
/// bodies from [`body`] as data, comments, huge and partial lines.
fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        3 => body().prop_map(|b| [b"data: ".as_slice(), &b].concat()),
        1 => prop::sample::select(&["message", "error", "done", "ping", "response.completed", "content_block_delta", "message_stop", ""][..])
            .prop_map(|e| format!("event: {e}").into_bytes()),
        1 => Just(b": keep-alive".to_vec()),
        1 => ".{0,10}".prop_map(|id| format!("id: {id}").into_bytes()),
        1 => prop::sample::select(&["retry: 10", "retry: x", "data", "data:", ":", "event", "\u{feff}data: x"][..])
            .prop_map(|f| f.as_bytes().to_vec()),
        1 => (prop::sample::select(&["data: ", "event: ", ""][..]), 0usize..20_000)
            .prop_map(|(f, n)| [f.as_bytes(), &vec![b'x'; n]].concat()),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ];
    let ending = prop::sample::select(&["\n", "\r", "\r\n", "\n\n", "\r\r", "\r\n\r\n", ""][..]);
    prop::collection::vec((field, ending), 0..24).prop_map(|lines| {
        let mut out = Vec::new();
        for (field, ending) in lines {
            out.extend_from_slice(&field);
            out.extend_from_slice(ending.as_bytes());
        }
        out
    })
}

#[test]
fn sse_framing_survives_hostile_streams() {
    let rt = runtime();
    proptest!(config(1_000), |(stream in sse_stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12))| {
        let chunks = cut(&stream, &cuts);
        bounded(&stream, || {
            rt.block_on(async {
                let bytes = futures::stream::iter(
                    chunks.into_iter().map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from(c))),
                );
                let mut events = sse_stream::SseStream::from_bytes_stream(bytes);
                let framed = tokio::time::timeout(FRAMING, async {
                    use futures::StreamExt;
                    while let Some(event) = events.next().await {
                        match event {
                            Ok(event) => {
                                if let Some(data) = event.data {
                                    decode_all(data.as_bytes());
                                }
                            }
                            Err(_) => break,
                        }
                    }
                })
                .await;
                assert!(framed.is_ok(), "SSE framing did not end within {FRAMING:?}");
            });
        });
    });
}

#[test]
fn line_framing_survives_hostile_streams() {
    let rt = runtime();
    let lines = prop::collection::vec(
        prop_oneof![3 => body(), 1 => prop::collection::vec(any::<u8>(), 0..64), 1 => (0usize..20_000).prop_map(|n| vec![b'{'; n])],
        0..8,
    );
    proptest!(config(1_000), |(
        lines in lines,
        endings in prop::collection::vec(prop::sample::select(&["\n", "\r\n", "", "\r"][..]), 8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        max_line in 1u64..8_192,
        capacity in 1usize..256,
    )| {
        let mut stream = Vec::new();
        for (line, ending) in lines.iter().zip(endings) {
            stream.extend_from_slice(line);
            stream.extend_from_slice(ending.as_bytes());
        }
        let chunks = cut(&stream, &cuts);
        bounded(&stream, || {
            rt.block_on(async {
                use tokio::io::AsyncWriteExt;
                let (mut write, read) = tokio::io::duplex(64);
                let writer = tokio::spawn(async move {
                    for chunk in chunks {
                        if write.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                });
                let mut read = tokio::io::BufReader::with_capacity(capacity, read);
                let framed = tokio::time::timeout(FRAMING, async {
                    while let Ok(line) = read_line(&mut read, max_line, "the agent").await {
                        decode_all(&line);
                    }
                })
                .await;
                // The reader may stop at a too-long line with the writer blocked on a
                // full pipe: end it.
                writer.abort();
                assert!(framed.is_ok(), "line framing did not end within {FRAMING:?}");
            });
        });
    });
}
