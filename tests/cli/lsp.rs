//! `trellis lsp` driven by a real LSP client: pygls's `LanguageClient` (the library
//! pytest-lsp is built on) starts the binary, speaks JSON-RPC over its stdio, opens,
//! changes, completes, hovers, jumps, renames and shuts it down (`tests/cli/lsp/client.py`).
//! The test fails, saying how to install it, when no Python with pygls is found
//! (`TRELLIS_PYTHON` names one; `.ci/run` installs pygls).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::repo;

/// A Python that imports pygls.
fn python() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("TRELLIS_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec!["python3".into(), "python".into()],
    };
    for python in &candidates {
        let ok = Command::new(python)
            .args(["-c", "import pygls.lsp.client, lsprotocol"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return python.clone();
        }
    }
    panic!(
        "the LSP tests drive `trellis lsp` with pygls, and no Python importing it was found \
         ({candidates:?}); install it with `python3 -m pip install pygls==2.1.1`, or set \
         TRELLIS_PYTHON to a Python that has it"
    );
}

/// Runs the client with `steps` against the project in `dir`; one JSON value per step.
fn session(dir: &Path, steps: Value) -> Vec<Value> {
    let script = dir.join("steps.json.txt");
    std::fs::write(&script, steps.to_string()).expect("script written");
    let out = Command::new(python())
        .arg(repo("tests/cli/lsp/client.py"))
        .arg(env!("CARGO_BIN_EXE_trellis"))
        .arg(dir)
        .arg(&script)
        .output()
        .expect("client started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

const AGENTS: &str = r#"agent "shop" protocol="connexity" builtin="booking"
persona "pat" type="polite-customer" {
    description "A customer"
}
"#;

const MAIN: &str = r#"scenario "first" {
    agent "shop"
    user-context {
        order_id "A-1"
    }
    user "Hello, order {{ user_context.order_id }}"
    expect reply contains="postal code"
    branch "yes" {
        user "Yes"
        expect no-error
    }
    branch "no" {
        user "No"
        expect no-error
    }
}

scenario "second" {
    agent "shop"
    needs "first"
    user "Hi"
    expect no-error
}
"#;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("agents.kdl"), AGENTS).expect("written");
    std::fs::write(dir.path().join("main.kdl"), MAIN).expect("written");
    dir
}

fn labels(step: &Value) -> Vec<String> {
    step["labels"]
        .as_array()
        .unwrap_or_else(|| panic!("no labels: {step}"))
        .iter()
        .map(|l| l.as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn an_editor_gets_checks_completion_hover_navigation_and_rename() {
    let dir = project();
    // The unsaved buffer has a typo on line 8 (`usr`): the same text saved elsewhere is what
    // `trellis check` is asked about.
    let typo = MAIN.replace("        user \"Yes\"", "        usr \"Yes\"");
    let saved = tempfile::tempdir().expect("temporary directory");
    std::fs::write(saved.path().join("agents.kdl"), AGENTS).expect("written");
    std::fs::write(saved.path().join("main.kdl"), &typo).expect("written");
    let check = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("check")
        .arg(saved.path())
        .env("NO_COLOR", "1")
        .output()
        .expect("check ran");
    assert_eq!(check.status.code(), Some(2));
    let check_out = String::from_utf8_lossy(&check.stderr).into_owned();

    let agent_value = MAIN
        .lines()
        .nth(1)
        .expect("line")
        .find("shop")
        .expect("shop") as u64;
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "change", "file": "main.kdl", "text": typo},
        {"do": "change", "file": "main.kdl", "text": MAIN},
        // A new line in the scenario's block, and in a branch's.
        {"do": "change", "file": "main.kdl", "text": MAIN.replace("    expect reply contains=\"postal code\"\n", "    expect reply contains=\"postal code\"\n    \n")},
        {"do": "complete", "file": "main.kdl", "line": 7, "character": 4},
        {"do": "change", "file": "main.kdl", "text": MAIN},
        {"do": "complete", "file": "main.kdl", "line": 1, "character": agent_value},
        {"do": "complete", "file": "main.kdl", "line": 5, "character": 46},
        {"do": "complete", "file": "agents.kdl", "line": 0, "character": 52},
        {"do": "hover", "file": "main.kdl", "line": 0, "character": 3},
        {"do": "hover", "file": "main.kdl", "line": 1, "character": agent_value + 1},
        {"do": "hover", "file": "main.kdl", "line": 5, "character": 40},
        {"do": "definition", "file": "main.kdl", "line": 1, "character": agent_value + 1},
        {"do": "definition", "file": "main.kdl", "line": 19, "character": 12},
        {"do": "references", "file": "agents.kdl", "line": 0, "character": 8},
        {"do": "rename", "file": "main.kdl", "line": 19, "character": 12, "to": "opening"},
        {"do": "symbols", "file": "main.kdl"},
        // Inline criteria: the criterion's help, its properties, and their names.
        {"do": "hover", "file": "main.kdl", "line": 6, "character": 12},
        {"do": "complete", "file": "main.kdl", "line": 6, "character": 16},
        {"do": "open", "file": "draft.kdl", "text": DRAFT},
        {"do": "complete", "file": "draft.kdl", "line": 0, "character": 9},
        {"do": "complete", "file": "draft.kdl", "line": 3, "character": 11},
        {"do": "complete", "file": "draft.kdl", "line": 4, "character": 11},
        {"do": "definition", "file": "draft.kdl", "line": 0, "character": 10},
        {"do": "references", "file": "draft.kdl", "line": 0, "character": 10},
        // Words typed in a comment get no completion and no hover.
        {"do": "change", "file": "draft.kdl", "text": COMMENTED},
        {"do": "complete", "file": "draft.kdl", "line": 1, "character": 7},
        {"do": "complete", "file": "draft.kdl", "line": 2, "character": 25},
        {"do": "hover", "file": "draft.kdl", "line": 2, "character": 22},
        {"do": "complete", "file": "draft.kdl", "line": 3, "character": 4},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(out[0]["server"], "trellis");

    // Opening checks the whole project (both files), nothing wrong.
    let open = &out[1]["diagnostics"];
    assert_eq!(open["main.kdl"], serde_json::json!([]), "{open}");
    assert_eq!(open["agents.kdl"], serde_json::json!([]), "{open}");

    // Diagnostics say which version of a buffer they are for; a file not open, none.
    assert_eq!(out[1]["versions"]["main.kdl"], 1, "{}", out[1]);
    assert_eq!(out[1]["versions"]["agents.kdl"], Value::Null, "{}", out[1]);
    assert_eq!(out[2]["versions"]["main.kdl"], 2, "{}", out[2]);
    // Edits of main.kdl leave agents.kdl's diagnostics as they were: sent once, at the open.
    assert_eq!(out[4]["published"]["main.kdl"], 4, "{}", out[4]);
    assert_eq!(out[4]["published"]["agents.kdl"], 1, "{}", out[4]);

    // The unsaved typo: `check`'s message, at the typo's line and column.
    let typo_diags = out[2]["diagnostics"]["main.kdl"]
        .as_array()
        .expect("main.kdl diagnostics");
    assert_eq!(typo_diags.len(), 1, "{typo_diags:?}");
    let d = &typo_diags[0];
    assert_eq!(
        (d["line"].as_u64(), d["character"].as_u64()),
        (Some(8), Some(8))
    );
    assert_eq!(d["code"], "trellis::unknown_node");
    let first_line = d["message"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default();
    assert!(
        check_out.contains(first_line) && first_line.contains("usr"),
        "LSP said {first_line:?}; check said:\n{check_out}"
    );
    let help = d["message"].as_str().unwrap_or_default();
    assert!(help.contains("help:") && help.contains("user"), "{help}");
    // Fixed: cleared.
    assert_eq!(out[3]["diagnostics"]["main.kdl"], serde_json::json!([]));

    // Step kinds of a scenario block.
    let nodes = labels(&out[5]);
    for want in [
        "user", "expect", "branch", "capture", "simulate", "criteria",
    ] {
        assert!(nodes.contains(&want.to_string()), "{want} not in {nodes:?}");
    }
    assert!(!nodes.contains(&"scenario".to_string()), "{nodes:?}");
    // Agent ids where an agent is named.
    assert_eq!(labels(&out[7]), ["shop"]);
    // Template variables: the scenario's user-context keys.
    assert_eq!(labels(&out[8]), ["order_id"], "{}", out[8]);
    // Properties of an agent: its settings, and its protocol's.
    let props = labels(&out[9]);
    assert!(props.contains(&"timeout=".to_string()), "{props:?}");
    assert!(
        !props.contains(&"protocol=".to_string()),
        "already written: {props:?}"
    );

    // Hover on a node name: its usage and help from the language table.
    let hover = out[10]["text"].as_str().unwrap_or_default();
    assert!(
        hover.contains("scenario ID") && hover.contains("In its block"),
        "{hover}"
    );
    // On an id: its definition.
    let hover = out[11]["text"].as_str().unwrap_or_default();
    assert!(
        hover.contains("agent `shop`") && hover.contains("agents.kdl:1"),
        "{hover}"
    );
    // On a template variable: where it comes from, the variable marked, not its string.
    let hover = out[12]["text"].as_str().unwrap_or_default();
    assert!(hover.contains("user-context"), "{hover}");
    let line = MAIN.lines().nth(5).expect("line");
    let start = line.find("user_context.order_id").expect("variable") as u64;
    let end = start + "user_context.order_id".len() as u64;
    assert_eq!(
        out[12]["range"],
        serde_json::json!([[5, start], [5, end]]),
        "{}",
        out[12]
    );

    // Definitions, across files, and of `needs`.
    assert_eq!(
        out[13]["locations"],
        serde_json::json!([{"file": "agents.kdl", "line": 0, "character": 7}])
    );
    assert_eq!(out[14]["locations"][0]["line"], 0);
    assert_eq!(out[14]["locations"][0]["file"], "main.kdl");
    // References of the agent: its definition and both scenarios' `agent`.
    assert_eq!(
        out[15]["locations"].as_array().map(Vec::len),
        Some(3),
        "{}",
        out[15]
    );
    // Renaming the scenario from its `needs`: the definition and the use.
    assert_eq!(out[16]["edits"], serde_json::json!({"main.kdl": 2}));
    // The outline.
    let symbols = &out[17]["symbols"];
    assert_eq!(symbols[0]["name"], "first");
    assert_eq!(symbols[0]["children"][1]["name"], "no");
    assert_eq!(symbols[1]["name"], "second");
    let hover = out[18]["text"].as_str().unwrap_or_default();
    assert!(
        hover.contains("reply") && hover.contains("contains"),
        "{hover}"
    );
    let props = labels(&out[19]);
    assert!(props.contains(&"matches=".to_string()), "{props:?}");
    assert!(
        !props.contains(&"contains=".to_string()),
        "already written: {props:?}"
    );
    // An unsaved new file: include paths, scenario ids for `needs`, inline criteria.
    let files = labels(&out[21]);
    assert!(files.contains(&"agents.kdl".to_string()), "{files:?}");
    // Accepting one replaces the string's whole text, not the word an editor would pick
    // (which stops at `/` and `-`).
    assert_eq!(
        out[21]["edits"]["agents.kdl"],
        serde_json::json!({"text": "agents.kdl", "start": [0, 9], "end": [0, 19]}),
        "{}",
        out[21]
    );
    assert!(
        !files.contains(&"draft.kdl".to_string()),
        "itself: {files:?}"
    );
    // Another suite's scenarios, as `needs` must name them there.
    let scenarios = labels(&out[22]);
    assert!(
        scenarios.contains(&"main/first".to_string())
            && scenarios.contains(&"main/second".to_string()),
        "{scenarios:?}"
    );
    // A scenario does not need itself.
    assert!(!scenarios.contains(&"draft".to_string()), "{scenarios:?}");
    let criteria = labels(&out[23]);
    for want in ["reply", "tool", "no-error", "latency"] {
        assert!(
            criteria.contains(&want.to_string()),
            "{want} not in {criteria:?}"
        );
    }
    assert_eq!(out[24]["locations"][0]["file"], "agents.kdl");
    assert_eq!(out[25]["locations"].as_array().map(Vec::len), Some(1));
    // In the comments: nothing; on the line after them, the scenario's nodes.
    assert_eq!(labels(&out[27]), Vec::<String>::new(), "{}", out[27]);
    assert_eq!(labels(&out[28]), Vec::<String>::new(), "{}", out[28]);
    assert_eq!(out[29]["text"], Value::Null, "{}", out[29]);
    assert!(
        labels(&out[30]).contains(&"user".to_string()),
        "{}",
        out[30]
    );
    assert_eq!(out.last().map(|s| s["step"].clone()), Some("exit".into()));
}

/// The draft with comments: a line comment, a block comment after a node, and a new line.
const COMMENTED: &str =
    "include \"agents.kdl\"\n// scen\nscenario \"draft\" { /* agent */\n    \n}\n";

/// A file being written: an include, and a scenario with half-typed lines.
const DRAFT: &str = "include \"agents.kdl\"\nscenario \"draft\" {\n    agent \"shop\"\n    needs \"\n    expect \n}\n";

#[test]
fn a_half_typed_file_gets_answers_and_never_stops_the_server() {
    let dir = project();
    let half = "scenario \"x\" {\n    agent \"\n    user \"unterminated\n    expect reply contains=\n    branch \"b\" {\n        us";
    let mut steps = vec![serde_json::json!({"do": "open", "file": "main.kdl", "text": half})];
    // Every position of the half-typed text: completion and hover answer at each.
    for (line, text) in half.lines().enumerate() {
        for character in 0..=text.chars().count() {
            steps.push(serde_json::json!({"do": "complete", "file": "main.kdl", "line": line, "character": character}));
            steps.push(serde_json::json!({"do": "hover", "file": "main.kdl", "line": line, "character": character}));
        }
    }
    steps.push(
        serde_json::json!({"do": "complete", "file": "main.kdl", "line": 1, "character": 11}),
    );
    steps.push(
        serde_json::json!({"do": "complete", "file": "main.kdl", "line": 5, "character": 10}),
    );
    steps.push(serde_json::json!({"do": "symbols", "file": "main.kdl"}));
    let out = session(dir.path(), Value::Array(steps));
    let diags = out[1]["diagnostics"]["main.kdl"]
        .as_array()
        .expect("diagnostics");
    assert!(
        diags.iter().any(|d| d["code"] == "trellis::kdl_syntax"),
        "{diags:?}"
    );
    let n = out.len();
    // In `agent "`: the agent ids; at `us`: step kinds of a branch block.
    assert_eq!(labels(&out[n - 4]), ["shop"]);
    assert!(
        labels(&out[n - 3]).contains(&"user".to_string()),
        "{}",
        out[n - 3]
    );
    assert_eq!(out[n - 2]["symbols"][0]["name"], "x");
    assert_eq!(out[n - 1]["step"], "exit");
}

/// One JSON-RPC message framed as LSP frames it.
fn frame(message: Value) -> Vec<u8> {
    let body = message.to_string();
    format!("Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

fn lsp_with_stdin(input: &[u8]) -> std::process::Output {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("lsp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("trellis lsp started");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input).expect("written");
    drop(stdin);
    child.wait_with_output().expect("trellis lsp ended")
}

#[test]
fn editors_that_quit_loosely_or_never_connect_get_a_clean_stop_or_a_clear_error() {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}});
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}});
    let shutdown = |id: u64| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "shutdown"});
    // Shut down twice (as Neovim does when a client is stopped and the editor then quits),
    // then gone without `exit`: both shutdowns answered, exit code 0.
    let input = [
        frame(init),
        frame(initialized),
        frame(shutdown(2)),
        frame(shutdown(3)),
    ]
    .concat();
    let out = lsp_with_stdin(&input);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(r#""id":2"#) && stdout.contains(r#""id":3"#),
        "{stdout}"
    );
    // Started by hand, stdin closed at once: says what the command is for.
    let out = lsp_with_stdin(b"");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("started by an editor"), "{stderr}");
}

#[test]
fn a_malformed_message_is_skipped_and_the_server_goes_on() {
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}});
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}});
    let shutdown = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "shutdown"});
    let exit = serde_json::json!({"jsonrpc": "2.0", "method": "exit"});
    let garbage = [
        b"Content-Length: 10\r\n\r\n{\"bad json".to_vec(),
        b"Content-Length: 6\r\n\r\n[1, 2]".to_vec(),
        b"Garbage header\r\n\r\n".to_vec(),
        frame(serde_json::json!({"jsonrpc": "2.0", "id": 9, "method": ["hover"]})),
    ]
    .concat();
    let input = [
        frame(init.clone()),
        frame(initialized.clone()),
        garbage,
        frame(shutdown),
        frame(exit.clone()),
    ]
    .concat();
    let out = lsp_with_stdin(&input);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.matches("skipped a message").count(), 4, "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The request with an id was answered with an error, and the shutdown after it served.
    assert!(
        stdout.contains(r#""id":9"#) && stdout.contains("-32600"),
        "{stdout}"
    );
    assert!(stdout.contains(r#""id":2,"result":null"#), "{stdout}");

    // `exit` without `shutdown`: exit code 1, as the protocol asks; also before or during
    // the handshake (it was 2, "closed the connection").
    for input in [
        [frame(init.clone()), frame(initialized), frame(exit.clone())].concat(),
        [frame(init), frame(exit.clone())].concat(),
        frame(exit),
    ] {
        let out = lsp_with_stdin(&input);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_file_changed_on_disk_is_checked_again_and_a_buffer_is_formatted() {
    let dir = project();
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "write", "file": "agents.kdl", "text": AGENTS.replace("\"shop\"", "\"store\"")},
        // Formatting: a messy buffer gets `trellis fmt`'s layout; a formatted one no edit.
        {"do": "change", "file": "main.kdl", "text": MESSY},
        {"do": "format", "file": "main.kdl"},
        {"do": "change", "file": "main.kdl", "text": MAIN},
        {"do": "format", "file": "main.kdl"},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(out[1]["diagnostics"]["main.kdl"], serde_json::json!([]));
    let after = out[2]["diagnostics"]["main.kdl"]
        .as_array()
        .expect("diagnostics");
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        after
            .iter()
            .all(|d| d["code"] == "trellis::undefined_reference"),
        "{after:?}"
    );
    assert_eq!(
        out[4]["edits"],
        serde_json::json!([{"line": 0, "end": 4, "text": FORMATTED}])
    );
    assert_eq!(out[6]["edits"], serde_json::json!([]));
}

const MESSY: &str = "scenario   \"x\"  {\n  agent \"store\" // who\n user \"hi\"\n}\n";
const FORMATTED: &str = "scenario \"x\" {\n    agent \"store\" // who\n    user \"hi\"\n}\n";

/// A suite over datasets gets the loader's diagnostics in the editor too: none for a sound
/// one (the CSV and the Parquet file are read), `row.*` checked against the columns, a
/// malformed row named; and completion offers the dataset nodes.
#[test]
fn a_suite_over_datasets_gets_diagnostics_and_completion() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
    std::fs::write(dir.path().join("data/o.csv"), "id,amount\nA1,3\nA2,4\n").expect("written");
    let mut parquet = Vec::new();
    {
        use polars_core::prelude::*;
        use polars_io::prelude::*;
        let mut df = df!("id" => ["P1", "P2"], "n" => [1i64, 2]).expect("frame");
        ParquetWriter::new(&mut parquet)
            .finish(&mut df)
            .expect("parquet");
    }
    std::fs::write(dir.path().join("data/p.parquet"), parquet).expect("written");
    let main = r#"agent "shop" protocol="connexity" builtin="booking"
dataset "o" path="data/o.csv"
dataset "p" path="data/p.parquet"
scenario "csv" for-each="o" {
    row-id "{{ row.id }}"
    user "order {{ row.id }} for {{ row.amount }}"
    expect no-error
}
scenario "pq" for-each="p" {
    user "hi {{ row.n }}"
    expect no-error
}
scenario "tones" for-each="o" {
    matrix { tone "calm" "angry"; }
    user "as {{ vars.tone }}: {{ row.id }}"
    expect no-error
}
"#;
    std::fs::write(dir.path().join("main.kdl"), main).expect("written");
    // Line 14 is the `user` step of `tones`; its characters: `{{ vars.tone }}` and
    // `{{ row.id }}`.
    let tones = main.lines().nth(14).expect("the tones step");
    let at = |needle: &str| tones.find(needle).expect("in the step") + 2;
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "change", "file": "main.kdl", "text": main.replace("row.amount", "row.amont")},
        {"do": "write", "file": "data/o.csv", "text": "id,amount\nA1,3\nA2\n"},
        {"do": "change", "file": "main.kdl", "text": main},
        {"do": "complete", "file": "main.kdl", "line": 17, "character": 0},
        {"do": "write", "file": "data/o.csv", "text": "id,amount\nA1,3\nA2,4\n"},
        {"do": "hover", "file": "main.kdl", "line": 14, "character": at("tone }}")},
        {"do": "hover", "file": "main.kdl", "line": 14, "character": at("id }}")},
        {"do": "complete", "file": "main.kdl", "line": 14, "character": at("vars.tone") + 3},
        {"do": "complete", "file": "main.kdl", "line": 14, "character": at("{{ vars") + 1},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(
        out[1]["diagnostics"]["main.kdl"],
        serde_json::json!([]),
        "{}",
        out[1]
    );
    let typo = out[2]["diagnostics"]["main.kdl"].to_string();
    assert!(
        typo.contains("row.amont") && typo.contains("row.amount"),
        "{typo}"
    );
    let bad_row = out[4]["diagnostics"]["main.kdl"].to_string();
    assert!(bad_row.contains("row 2"), "{bad_row}");
    assert!(
        labels(&out[5]).contains(&"dataset".to_string()),
        "{}",
        out[5]
    );
    // A matrix value is said as one, not as a capture missing from the scenario; a row's
    // column as the dataset's; completion offers both.
    let hover = out[7]["text"].to_string();
    assert!(hover.contains("the `matrix` value `tone`"), "{hover}");
    let hover = out[8]["text"].to_string();
    assert!(
        hover.contains("the column `id` of the dataset row"),
        "{hover}"
    );
    assert!(labels(&out[9]).contains(&"tone".to_string()), "{}", out[9]);
    assert!(labels(&out[10]).contains(&"row".to_string()), "{}", out[10]);
}

#[test]
fn an_unsaved_buffer_in_a_directory_not_created_yet_gets_its_own_diagnostics() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let text = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
                scenario \"s\" {\n    user \"hi\"\n    expect reply contans=\"x\"\n}\n";
    let steps = serde_json::json!([
        {"do": "open", "file": "fresh/new.kdl", "text": text},
    ]);
    let out = session(dir.path(), steps);
    let diagnostics = out
        .iter()
        .find_map(|step| step["diagnostics"].as_object())
        .unwrap_or_else(|| panic!("no diagnostics: {out:?}"));
    let (_, diags) = diagnostics
        .iter()
        .find(|(file, _)| file.ends_with("new.kdl"))
        .unwrap_or_else(|| panic!("{diagnostics:?}"));
    let diags = diags.as_array().expect("a list");
    // The buffer's own problem, where it is; not "cannot read `fresh`" at 0:0.
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["code"], "trellis::unknown_property", "{diags:?}");
}

#[test]
fn renaming_a_tool_renames_every_check_that_names_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let suite = r##"agent "bot" protocol="openai" base-url="http://127.0.0.1:9/v1" model="m" {
    tools "lookup"
}
tool "lookup" { description "x"; mock returns=#"{"ok": true}"#; }
scenario "s" {
    agent "bot"
    expect-tool "lookup"
    user "hi"
    expect tool "lookup"
    expect no-tool "lookup"
    criteria {
        tool "lookup"
        no-tool "lookup"
        tools-in-order "lookup" "lookup"
    }
}
"##;
    std::fs::write(dir.path().join("t.kdl"), suite).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "t.kdl"},
        {"do": "rename", "file": "t.kdl", "line": 3, "character": 8, "to": "find"},
        {"do": "references", "file": "t.kdl", "line": 3, "character": 8},
    ]);
    let out = session(dir.path(), steps);
    // The declaration, the agent's `tools`, and each of the seven places a check names it.
    assert_eq!(
        out[2]["edits"],
        serde_json::json!({"t.kdl": 9}),
        "{}",
        out[2]
    );
    assert_eq!(
        out[3]["locations"].as_array().map(Vec::len),
        Some(9),
        "{}",
        out[3]
    );
}

/// Scenario ids are per suite: renaming `smoke` in one file leaves another suite's `smoke`
/// and its `needs` alone. Panels are judges to `judge="ID"`: renaming one renames those.
/// An id written bare stays valid KDL when the new name needs quotes.
#[test]
fn renames_keep_to_the_ids_namespace_and_write_valid_kdl() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let suite = |other: &str| {
        format!(
            "agent \"bot\" protocol=\"connexity\" builtin=\"booking\"\n\
             scenario \"smoke\" {{\n    agent \"bot\"\n    user \"hi\"\n    expect no-error\n}}\n\
             scenario \"{other}\" {{\n    agent \"bot\"\n    needs \"smoke\"\n    user \"hi\"\n    expect no-error\n}}\n"
        )
    };
    std::fs::write(dir.path().join("a.kdl"), suite("second")).expect("written");
    std::fs::write(
        dir.path().join("b.kdl"),
        suite("third").replace(
            "agent \"bot\" protocol=\"connexity\" builtin=\"booking\"\n",
            "",
        ),
    )
    .expect("written");
    let judges = "provider \"p\" kind=\"openai\" base-url=\"http://127.0.0.1:9/v1\" model=\"m\"\n\
                  judge \"j1\" provider=\"p\"\njudge \"j2\" provider=\"p\"\n\
                  panel \"pn\" consensus=\"mean\" {\n    judges \"j1\" \"j2\"\n}\n\
                  agent demo protocol=\"connexity\" builtin=\"booking\"\n\
                  scenario \"c\" {\n    agent demo\n    user \"hi\"\n    criteria {\n        \
                  judge \"polite\" judge=\"pn\"\n    }\n}\n";
    std::fs::write(dir.path().join("c.kdl"), judges).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "a.kdl"},
        {"do": "rename", "file": "a.kdl", "line": 1, "character": 11, "to": "smoke-test"},
        // `second` to `smoke`: taken in a.kdl only (b.kdl's `smoke` is another suite's).
        {"do": "rename", "file": "b.kdl", "line": 5, "character": 11, "to": "second"},
        {"do": "rename", "file": "c.kdl", "line": 3, "character": 8, "to": "the-panel"},
        {"do": "rename", "file": "c.kdl", "line": 6, "character": 7, "to": "my agent"},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(
        out[2]["edits"],
        serde_json::json!({"a.kdl": 2}),
        "{}",
        out[2]
    );
    assert_eq!(
        out[3]["edits"],
        serde_json::json!({"b.kdl": 1}),
        "{}",
        out[3]
    );
    assert_eq!(
        out[4]["edits"],
        serde_json::json!({"c.kdl": 2}),
        "{}",
        out[4]
    );
    assert_eq!(
        out[5]["texts"],
        serde_json::json!({"c.kdl": ["\"my agent\"", "\"my agent\""]}),
        "{}",
        out[5]
    );
}

/// An include outside the project's directory: an unsaved edit of it checks the project
/// that includes it again (its diagnostics were stale until that project's own file was
/// edited).
#[test]
fn an_edit_of_an_include_outside_the_project_checks_the_includer_again() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::create_dir_all(dir.path().join("suites")).unwrap();
    std::fs::create_dir_all(dir.path().join("shared")).unwrap();
    let agents = "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n";
    std::fs::write(dir.path().join("shared/agents.kdl"), agents).unwrap();
    std::fs::write(
        dir.path().join("suites/main.kdl"),
        "include \"../shared/agents.kdl\"\nscenario \"s\" {\n    agent \"demo\"\n    \
         user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let steps = serde_json::json!([
        {"do": "open", "file": "suites/main.kdl"},
        {"do": "open", "file": "shared/agents.kdl"},
        {"do": "change", "file": "shared/agents.kdl", "text": agents.replace("demo", "renamed")},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(
        out[1]["diagnostics"]["main.kdl"],
        serde_json::json!([]),
        "{}",
        out[1]
    );
    let main = out[3]["diagnostics"]["main.kdl"].to_string();
    assert!(main.contains("undefined agent"), "{}", out[3]);
}

/// `trellis lsp` started in `dir`, its stdin and its stdout, for tests that speak JSON-RPC to
/// it by hand.
fn spawn_server(
    dir: &std::path::Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("lsp")
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("trellis lsp");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    (child, stdin, stdout)
}

/// Reads one framed message.
fn read_message(out: &mut impl std::io::BufRead) -> Value {
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).expect("read") > 0,
            "the server closed"
        );
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(n) = line.strip_prefix("Content-Length: ") {
            length = n.parse().expect("a length");
        }
    }
    let mut body = vec![0u8; length];
    std::io::Read::read_exact(out, &mut body).expect("a body");
    serde_json::from_slice(&body).expect("JSON")
}

/// An editor that dies without `exit` (crashed, killed) may leave the server's stdin open
/// through a child of its own: the server exits once `initialize`'s `processId` is gone, as
/// the protocol asks, instead of living on.
#[test]
fn the_server_exits_when_the_editor_that_started_it_is_gone() {
    use std::io::Write;
    let dir = project();
    let mut editor = Command::new("sleep").arg("60").spawn().expect("sleep");
    let (mut child, mut stdin, mut stdout) = spawn_server(dir.path());
    let mut send = |m: Value| stdin.write_all(&frame(m)).expect("written");
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"processId": editor.id(), "rootUri": null, "capabilities": {}}}),
    );
    assert!(read_message(&mut stdout)["result"]["capabilities"].is_object());
    send(serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        child.try_wait().expect("waited").is_none(),
        "exited with its editor alive"
    );
    editor.kill().expect("killed");
    editor.wait().expect("reaped");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waited") {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the server outlived its editor"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1));
    drop(stdin);
}

#[test]
fn a_request_before_initialized_is_answered_and_the_server_goes_on() {
    use std::io::Write;
    let dir = project();
    let (mut child, mut stdin, mut stdout) = spawn_server(dir.path());
    let mut send = |m: Value| stdin.write_all(&frame(m)).expect("written");
    // Before `initialize`: the request is refused in words, and the server waits on.
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "textDocument/hover",
        "params": {"textDocument": {"uri": "file:///x.kdl"}, "position": {"line": 0, "character": 0}}}),
    );
    let first = read_message(&mut stdout);
    assert_eq!(first["error"]["code"], -32002, "{first}");
    let said = first["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("`textDocument/hover` before `initialize`"),
        "{said}"
    );
    assert!(!said.contains("Request {"), "{said}");
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"processId": null, "rootUri": null, "capabilities": {}}}),
    );
    assert!(read_message(&mut stdout)["result"]["capabilities"].is_object());
    // Too early: a notification is let by, a request gets "server not initialized".
    send(serde_json::json!({"jsonrpc": "2.0", "method": "$/setTrace", "params": {"value": "off"}}));
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/hover",
        "params": {"textDocument": {"uri": "file:///x.kdl"}, "position": {"line": 0, "character": 0}}}),
    );
    let early = read_message(&mut stdout);
    assert_eq!(early["id"], 2, "{early}");
    assert_eq!(early["error"]["code"], -32002, "{early}");
    send(serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
    send(serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "shutdown", "params": null}));
    let shutdown = read_message(&mut stdout);
    assert_eq!(shutdown["id"], 3, "{shutdown}");
    send(serde_json::json!({"jsonrpc": "2.0", "method": "exit", "params": null}));
    drop(stdin);
    assert_eq!(child.wait().expect("exited").code(), Some(0));
}

/// A completion is written as the string it goes into needs: a file name holding a quote
/// comes escaped (it was inserted as it is, which ended the string early).
#[test]
fn completions_are_written_as_the_value_they_go_into_needs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(
        dir.path().join("q\"s.kdl"),
        "agent \"my bot\" protocol=\"connexity\" builtin=\"booking\"\n",
    )
    .expect("written");
    let main = "include \"q\"\n\
                scenario \"t\" {\n    agent \"my\"\n    user \"hi\"\n    expect no-error\n}\n";
    std::fs::write(dir.path().join("main.kdl"), main).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "complete", "file": "main.kdl", "line": 2, "character": 13},
        {"do": "complete", "file": "main.kdl", "line": 0, "character": 10},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(out[2]["edits"]["my bot"]["text"], "my bot", "{}", out[2]);
    assert_eq!(
        out[3]["edits"]["q\"s.kdl"]["text"], "q\\\"s.kdl",
        "{}",
        out[3]
    );
}

/// A suite per topic includes from a `shared/` directory beside its own (`include
/// "../shared/agents.kdl"`, which `check` takes): completion offers those files too; it
/// offered only files under the including file's directory, so none here.
#[test]
fn include_completion_offers_the_files_beside_the_including_ones_directory() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::create_dir_all(dir.path().join("booking")).expect("created");
    std::fs::create_dir_all(dir.path().join("shared")).expect("created");
    std::fs::write(
        dir.path().join("shared/agents.kdl"),
        "agent \"bot\" protocol=\"connexity\" builtin=\"booking\"\n",
    )
    .expect("written");
    let main = "include \"\"\nscenario \"t\" {\n    agent \"bot\"\n    user \"hi\"\n    expect no-error\n}\n";
    std::fs::write(dir.path().join("booking/main.kdl"), main).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "booking/main.kdl"},
        {"do": "complete", "file": "booking/main.kdl", "line": 0, "character": 9},
    ]);
    let out = session(dir.path(), steps);
    let offered = labels(&out[2]);
    assert!(
        offered.contains(&"../shared/agents.kdl".to_string()),
        "{offered:?}"
    );
    // Not itself, by a way round.
    assert!(
        !offered.iter().any(|l| l.contains("main.kdl")),
        "{offered:?}"
    );
}

/// Completion right after `KEY=` (`=` is a trigger character) offers the property's values,
/// quoted, not property names (accepting the first gave `protocol=url=`); a panel's `judges`
/// offers judges, not panels (which `check` refuses there).
#[test]
fn completion_after_an_equals_sign_offers_values_and_a_panel_lists_judges() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let text = "agent \"a\" protocol=\n\
                provider \"p\" kind=\"openai\" base-url=\"http://127.0.0.1:9/v1\" model=\"m\"\n\
                judge \"j1\" provider=\"p\"\n\
                judge \"j2\" provider=\"p\"\n\
                panel \"q\" consensus=\"mean\" {\n    judges \"\"\n}\n";
    std::fs::write(dir.path().join("main.kdl"), text).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "complete", "file": "main.kdl", "line": 0, "character": 20},
        {"do": "complete", "file": "main.kdl", "line": 5, "character": 12},
    ]);
    let out = session(dir.path(), steps);
    let labels = |n: usize| -> Vec<String> {
        out[n]["labels"]
            .as_array()
            .unwrap_or_else(|| panic!("{out:?}"))
            .iter()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect()
    };
    let after_equals = labels(2);
    assert!(
        after_equals.iter().any(|l| l == "connexity"),
        "{after_equals:?}"
    );
    assert!(
        !after_equals.iter().any(|l| l.ends_with('=')),
        "{after_equals:?}"
    );
    assert_eq!(
        out[2]["inserts"]["connexity"], "\"connexity\"",
        "{}",
        out[2]
    );
    let members = labels(3);
    assert!(
        members.contains(&"j1".to_owned()) && members.contains(&"j2".to_owned()),
        "{members:?}"
    );
    assert!(!members.contains(&"q".to_owned()), "{members:?}");
}

/// A node whose first argument has known values and is not written yet (`hitl `, `first-turn `,
/// a scenario's `agent `) offers those values, quoted (`#true`/`#false` bare).
#[test]
fn a_bare_first_argument_offers_its_values() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let text = "agent \"bot\" protocol=\"multiagent\" builtin=\"support\"\n\
                scenario \"s\" {\n    agent \n    first-turn \n    user \"hi\"\n    hitl \n}\n";
    std::fs::write(dir.path().join("main.kdl"), text).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "complete", "file": "main.kdl", "line": 2, "character": 10},
        {"do": "complete", "file": "main.kdl", "line": 3, "character": 15},
        {"do": "complete", "file": "main.kdl", "line": 5, "character": 9},
    ]);
    let out = session(dir.path(), steps);
    let inserts = |n: usize| out[n]["inserts"].clone();
    assert_eq!(inserts(2)["bot"], "\"bot\"", "{}", out[2]);
    assert_eq!(inserts(3)["agent"], "\"agent\"", "{}", out[3]);
    assert_eq!(inserts(3)["user"], "\"user\"", "{}", out[3]);
    assert_eq!(inserts(4)["approve"], "\"approve\"", "{}", out[4]);
    assert_eq!(inserts(4)["reject"], "\"reject\"", "{}", out[4]);
}

/// An agent's id may hold `/` (`check` accepts `agent "ms/x"`), so rename gives it one; only
/// a scenario's id may not (it separates a suite from its scenario in `needs`).
#[test]
fn rename_gives_an_agent_an_id_with_a_slash() {
    let dir = project();
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "rename", "file": "agents.kdl", "line": 0, "character": 8, "to": "team/shop"},
    ]);
    let out = session(dir.path(), steps);
    // The definition, and the two scenarios of main.kdl that name it.
    assert_eq!(
        out[2]["edits"],
        serde_json::json!({"agents.kdl": 1, "main.kdl": 2}),
        "{out:?}"
    );
    assert_eq!(
        out[2]["texts"]["main.kdl"],
        serde_json::json!(["team/shop", "team/shop"]),
        "{out:?}"
    );
}

/// A new id `check` would refuse is refused, saying why: empty, or holding a control
/// character (a tab was renamed to).
#[test]
fn rename_refuses_an_empty_id_and_a_control_character() {
    let dir = project();
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "rename", "file": "agents.kdl", "line": 0, "character": 8, "to": ""},
        {"do": "rename", "file": "agents.kdl", "line": 0, "character": 8, "to": "tab\there"},
    ]);
    let out = session(dir.path(), steps);
    let refused = |i: usize| {
        out[i]["refused"]
            .as_str()
            .unwrap_or_else(|| panic!("{out:?}"))
    };
    assert!(refused(2).contains("an id cannot be empty"), "{out:?}");
    assert!(
        refused(3).contains("it holds a control character (U+0009)"),
        "{out:?}"
    );
}

/// A new, empty buffer beside the project: its warning is on it, at its start, and the other
/// files have nothing (the error "holds no suite" was published on another file too).
#[test]
fn an_empty_new_buffer_is_warned_about_where_it_is() {
    let dir = project();
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "open", "file": "new.kdl", "text": ""},
    ]);
    let out = session(dir.path(), steps);
    let diagnostics = &out[2]["diagnostics"];
    let on_new = diagnostics["new.kdl"]
        .as_array()
        .unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(on_new.len(), 1, "{out:?}");
    assert_eq!(on_new[0]["code"], "trellis::empty_file", "{out:?}");
    assert_eq!(on_new[0]["line"], 0, "{out:?}");
    for other in ["main.kdl", "agents.kdl"] {
        assert!(
            diagnostics[other].as_array().is_none_or(|d| d
                .iter()
                .all(|d| d["code"] != "trellis::empty_file" && d["code"] != "trellis::no_suite")),
            "{other}: {out:?}"
        );
    }
}

/// A buffer the editor sent with its byte order mark gets its first line's diagnostics
/// where the editor counts them (the mark is a column to it); a file on disk with a mark,
/// which editors open without it, gets definitions where the editor shows them.
#[test]
fn a_byte_order_mark_moves_nothing_the_editor_sees() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("agents.kdl"), format!("\u{feff}{AGENTS}")).expect("written");
    let text = "\u{feff}scenario \"s\" colour=\"red\" {\n    agent \"shop\"\n    user \"hi\"\n    \
                expect no-error\n}\n";
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl", "text": text},
        {"do": "definition", "file": "main.kdl", "line": 1, "character": 12},
    ]);
    let out = session(dir.path(), steps);
    let diags = out[1]["diagnostics"]["main.kdl"]
        .as_array()
        .unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0]["code"], "trellis::unknown_property", "{diags:?}");
    // Where `colour` is in the buffer, the mark counted as its first character.
    let expected = text
        .char_indices()
        .position(|(i, _)| text[i..].starts_with("colour"))
        .expect("in the text");
    assert_eq!(
        (diags[0]["line"].as_u64(), diags[0]["character"].as_u64()),
        (Some(0), Some(expected as u64)),
        "{diags:?}"
    );
    let definition = &out[2]["locations"];
    assert_eq!(
        definition,
        // `shop` in `agent "shop"`, counted without the mark.
        &serde_json::json!([{"file": "agents.kdl", "line": 0, "character": 7}]),
        "{out:?}"
    );
}

/// Definitions and references follow every edit: of a file on disk the editor has not
/// opened, and of an open buffer (the server keeps what it read of the project between two
/// requests, and reads it again when a file changed).
#[test]
fn navigation_follows_edits_on_disk_and_in_buffers() {
    let dir = project();
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "definition", "file": "main.kdl", "line": 1, "character": 12},
        {"do": "definition", "file": "main.kdl", "line": 1, "character": 12},
        // Two lines down, and a mistake, so the write has diagnostics to publish.
        {"do": "write", "file": "agents.kdl", "text": format!("\n\n{AGENTS}").replace("type=", "colour=\"red\" type=")},
        {"do": "definition", "file": "main.kdl", "line": 1, "character": 12},
        {"do": "change", "file": "main.kdl", "text": format!("\n{MAIN}")},
        {"do": "definition", "file": "main.kdl", "line": 2, "character": 12},
        {"do": "references", "file": "agents.kdl", "line": 2, "character": 8},
    ]);
    let out = session(dir.path(), steps);
    let at = |line: u64| serde_json::json!([{"file": "agents.kdl", "line": line, "character": 7}]);
    assert_eq!(out[2]["locations"], at(0), "{out:?}");
    assert_eq!(out[3]["locations"], at(0), "asked again: {out:?}");
    assert_eq!(out[5]["locations"], at(2), "after the write: {out:?}");
    assert_eq!(out[7]["locations"], at(2), "after the change: {out:?}");
    let uses: Vec<u64> = format!("\n{MAIN}")
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == "agent \"shop\"")
        .map(|(i, _)| i as u64)
        .collect();
    assert_eq!(uses.len(), 2);
    let refs = out[8]["locations"].as_array().expect("references");
    for line in uses {
        assert!(
            refs.contains(&serde_json::json!({"file": "main.kdl", "line": line})),
            "main.kdl:{line} in {refs:?}"
        );
    }
}

/// The server keeps the files it loaded between checks and parses again only the edited
/// one: a mistake in a file that was not touched is still shown after each edit of
/// another, and a reference in it follows the edited file's definitions.
#[test]
fn an_edit_keeps_what_the_untouched_files_say() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("agents.kdl"), AGENTS).expect("written");
    let main = MAIN.replace("contains=\"postal code\"", "contans=\"postal code\"");
    std::fs::write(dir.path().join("main.kdl"), &main).expect("written");
    let renamed = AGENTS.replace("\"shop\"", "\"store\"");
    let steps = serde_json::json!([
        {"do": "open", "file": "agents.kdl"},
        {"do": "change", "file": "agents.kdl", "text": renamed},
        {"do": "change", "file": "agents.kdl", "text": AGENTS},
        {"do": "change", "file": "agents.kdl", "text": AGENTS.to_string() + "\n"},
    ]);
    let out = session(dir.path(), steps);
    let codes = |step: &Value| {
        let mut codes: Vec<String> = step["diagnostics"]["main.kdl"]
            .as_array()
            .unwrap_or_else(|| panic!("no diagnostics for main.kdl: {step}"))
            .iter()
            .map(|d| d["code"].as_str().unwrap_or_default().to_string())
            .collect();
        codes.sort();
        codes
    };
    let typo = vec!["trellis::unknown_property".to_string()];
    assert_eq!(codes(&out[1]), typo, "{}", out[1]);
    let mut undefined = typo.clone();
    undefined.extend(std::iter::repeat_n(
        "trellis::undefined_reference".to_string(),
        2,
    ));
    undefined.sort();
    assert_eq!(codes(&out[2]), undefined, "{}", out[2]);
    assert_eq!(codes(&out[3]), typo, "{}", out[3]);
    assert_eq!(codes(&out[4]), typo, "{}", out[4]);
}

/// A project with an error still shows `check`'s warnings of the files the error leaves
/// whole, as `check` prints them: the editor says every problem at once.
#[test]
fn warnings_of_files_without_errors_are_shown_beside_the_errors() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let broken = AGENTS.replace("description", "descripton");
    std::fs::write(dir.path().join("agents.kdl"), &broken).expect("written");
    let unchecked = "scenario \"first\" {\n    agent \"shop\"\n    user \"Hello\"\n}\n";
    std::fs::write(dir.path().join("main.kdl"), unchecked).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        // The fix, in the editor's buffer.
        {"do": "open", "file": "agents.kdl", "text": AGENTS},
    ]);
    let out = session(dir.path(), steps);
    let codes = |step: &Value, file: &str| {
        let mut codes: Vec<(String, u64)> = step["diagnostics"][file]
            .as_array()
            .unwrap_or_else(|| panic!("no diagnostics for {file}: {step}"))
            .iter()
            .map(|d| {
                (
                    d["code"].as_str().unwrap_or_default().to_string(),
                    d["severity"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
        codes.sort();
        codes
    };
    let warning = vec![("trellis::no_checks".to_string(), 2)];
    assert_eq!(
        codes(&out[1], "agents.kdl"),
        [("trellis::unknown_node".to_string(), 1)],
        "{}",
        out[1]
    );
    assert_eq!(codes(&out[1], "main.kdl"), warning, "{}", out[1]);
    // The error fixed, the warning stays, as `check` of the fixed project says it.
    assert_eq!(codes(&out[2], "agents.kdl"), [], "{}", out[2]);
    assert_eq!(codes(&out[2], "main.kdl"), warning, "{}", out[2]);
}

/// Edits that arrive while the server checks the project are applied together and checked
/// once: a paste or a burst of keys made the server check once per edit (each edit was
/// handed over only when the server asked for it), and a large suite answered seconds late.
#[test]
fn edits_sent_together_are_checked_together() {
    use std::io::Write;
    let dir = project();
    let path = dir.path().join("big.kdl");
    let text = |mark: usize| {
        let mut text = String::from("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n");
        for i in 0..400 {
            text.push_str(&format!(
                "scenario \"s{i}\" {{\n    user \"hello {i} {mark}\"\n    expect reply contains=\"x\"\n}}\n"
            ));
        }
        text
    };
    std::fs::write(&path, text(0)).unwrap();
    let uri = format!("file://{}", path.display());
    let (mut child, mut stdin, mut stdout) = spawn_server(dir.path());
    let mut send = |m: &Value| stdin.write_all(&frame(m.clone())).expect("written");
    send(
        &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"processId": null, "rootUri": null, "capabilities": {}}}),
    );
    assert!(read_message(&mut stdout)["result"]["capabilities"].is_object());
    send(&serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
    send(
        &serde_json::json!({"jsonrpc": "2.0", "method": "textDocument/didOpen",
        "params": {"textDocument": {"uri": uri, "languageId": "kdl", "version": 1, "text": text(0)}}}),
    );
    let opened = read_message(&mut stdout);
    assert_eq!(
        opened["method"], "textDocument/publishDiagnostics",
        "{opened}"
    );
    // Twenty full-text edits in one write, as a client flushes a burst, then a hover.
    let mut burst = Vec::new();
    for version in 2..22 {
        burst.extend(frame(serde_json::json!({"jsonrpc": "2.0",
            "method": "textDocument/didChange", "params": {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"text": text(version)}]}})));
    }
    burst.extend(frame(serde_json::json!({"jsonrpc": "2.0", "id": 2,
        "method": "textDocument/hover", "params": {"textDocument": {"uri": uri},
        "position": {"line": 1, "character": 2}}})));
    // From a thread of its own: a server that reads one edit per check answers between
    // them, and would fill the pipe this thread reads while it writes.
    let writer = std::thread::spawn(move || {
        stdin.write_all(&burst).expect("written");
        stdin
    });
    let mut published = Vec::new();
    loop {
        let message = read_message(&mut stdout);
        if message["id"] == 2 {
            break;
        }
        if message["method"] == "textDocument/publishDiagnostics" {
            published.push(message["params"]["version"].clone());
        }
    }
    assert!(
        published.len() <= 5,
        "checked once per edit: {} publishes ({published:?})",
        published.len()
    );
    drop(writer.join().expect("the writer"));
    let _ = child.kill();
    let _ = child.wait();
}

/// Inside an agent's block, completion offers what `check` takes there: not a setting the
/// agent's line already has (`protocol`, `url`: "set twice"), nor a second endpoint or one
/// its protocol does not take (`base-url`, `builtin`, `command`, `socket` on an `http`
/// agent with its `url`); its protocol's own settings are offered.
#[test]
fn an_agents_block_is_offered_only_what_it_can_still_take() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let text = "agent \"h\" protocol=\"http\" url=\"http://127.0.0.1:9/x\" {\n    \n}\n";
    std::fs::write(dir.path().join("main.kdl"), text).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "complete", "file": "main.kdl", "line": 1, "character": 4},
    ]);
    let out = session(dir.path(), steps);
    let labels: Vec<String> = out[2]["labels"]
        .as_array()
        .unwrap_or_else(|| panic!("{out:?}"))
        .iter()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect();
    for refused in [
        "protocol", "url", "base-url", "builtin", "command", "socket",
    ] {
        assert!(
            !labels.iter().any(|l| l == refused),
            "{refused}: {labels:?}"
        );
    }
    for offered in ["request", "reply", "header", "timeout"] {
        assert!(labels.iter().any(|l| l == offered), "{offered}: {labels:?}");
    }

    // A child written once per block (`reply`) is not offered where the block has one; a
    // repeatable one (`header`) still is.
    let text = "agent \"h\" protocol=\"http\" url=\"http://127.0.0.1:9/x\" {\n    \
                reply json-path=\"$.a\"\n    \n    header \"X-A\" \"b\"\n}\n";
    std::fs::write(dir.path().join("main.kdl"), text).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "main.kdl"},
        {"do": "complete", "file": "main.kdl", "line": 2, "character": 4},
    ]);
    let out = session(dir.path(), steps);
    let labels: Vec<String> = out[2]["labels"]
        .as_array()
        .unwrap_or_else(|| panic!("{out:?}"))
        .iter()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect();
    assert!(!labels.iter().any(|l| l == "reply"), "{labels:?}");
    for offered in ["request", "header"] {
        assert!(labels.iter().any(|l| l == offered), "{offered}: {labels:?}");
    }
}

/// A dataset id is an id like the others: `for-each="` completes the project's datasets,
/// jumps to the `dataset` node and back, renames with its uses, and is in the outline.
#[test]
fn dataset_ids_complete_navigate_rename_and_outline() {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("orders.csv"), "id,q\nA1,hi\n").expect("written");
    std::fs::write(
        dir.path().join("data.kdl"),
        "dataset \"orders\" path=\"orders.csv\"\ndataset \"refunds\" path=\"refunds.jsonl\"\n",
    )
    .expect("written");
    std::fs::write(
        dir.path().join("refunds.jsonl"),
        "{\"text\": \"hi\"}\n{\"text\": \"ho\", \"lang\": \"en\"}\n",
    )
    .expect("written");
    let suite = "agent \"bot\" protocol=\"connexity\" builtin=\"booking\"\n\
                 scenario \"ask\" for-each=\"orders\" {\n    row-id \"{{ row.id }}\"\n    \
                 user \"{{ row.q }}\"\n}\n\
                 scenario \"more\" for-each=\"orders\" {\n    user \"{{ row.q }}\"\n}\n\
                 scenario \"back\" for-each=\"refunds\" {\n    user \"{{ row.text }}\"\n}\n\
                 scenario \"plain\" {\n    user \"hi\"\n    \n    capture \"early\" regex=\"(x)\"\n    \
                 branch \"a\" {\n        capture \"inner\" regex=\"(y)\"\n        \
                 user \"{{ vars. }}\"\n    }\n    branch \"b\" {\n        user \"{{ vars. }}\"\n    }\n}\n";
    std::fs::write(dir.path().join("s.kdl"), suite).expect("written");
    let value = suite
        .lines()
        .nth(1)
        .expect("line")
        .find("orders")
        .expect("id") as u64;
    let scenario_line_end = suite.lines().nth(1).expect("line").find('{').expect("{") as u64;
    let filtered = "dataset \"orders\" path=\"orders.csv\" filter=\"{{ row. }}\"\n";
    let filter_at = filtered.find("row.").expect("row.") as u64 + 4;
    let vars_at = "        user \"{{ vars.".len() as u64;
    let agent_line_end = suite.lines().next().expect("line").len() as u64 + 1;
    let steps = serde_json::json!([
        {"do": "open", "file": "s.kdl"},
        {"do": "complete", "file": "s.kdl", "line": 1, "character": value},
        {"do": "definition", "file": "s.kdl", "line": 1, "character": value + 1},
        {"do": "references", "file": "data.kdl", "line": 0, "character": 10},
        {"do": "hover", "file": "s.kdl", "line": 1, "character": value + 1},
        {"do": "symbols", "file": "data.kdl"},
        // A scenario's line offers no settings (its block takes them); an agent's line
        // with an endpoint offers no other.
        {"do": "complete", "file": "s.kdl", "line": 1, "character": scenario_line_end},
        {"do": "complete", "file": "s.kdl", "line": 0, "character": agent_line_end},
        // `row.` offers the dataset's columns: a CSV's header, a JSON Lines file's keys.
        {"do": "complete", "file": "s.kdl", "line": 3, "character": 17},
        {"do": "complete", "file": "s.kdl", "line": 9, "character": 17},
        {"do": "rename", "file": "data.kdl", "line": 0, "character": 10, "to": "cases"},
        // After a step of a scenario without `for-each`: no `row-id`, nor what must come
        // before the steps.
        {"do": "complete", "file": "s.kdl", "line": 13, "character": 4},
        // A dataset's own filter: its file's columns.
        {"do": "open", "file": "data.kdl"},
        {"do": "change", "file": "data.kdl", "text": filtered},
        {"do": "complete", "file": "data.kdl", "line": 0, "character": filter_at},
        // `vars.` offers the captures made before, on the way there: not another branch's.
        {"do": "complete", "file": "s.kdl", "line": 17, "character": vars_at},
        {"do": "complete", "file": "s.kdl", "line": 20, "character": vars_at},
    ]);
    let out = session(dir.path(), steps);
    let labels = &out[2]["labels"];
    assert_eq!(
        labels,
        &serde_json::json!(["orders", "refunds"]),
        "{}",
        out[2]
    );
    assert_eq!(
        out[3]["locations"],
        serde_json::json!([{"file": "data.kdl", "line": 0, "character": 9}]),
        "{}",
        out[3]
    );
    // The declaration and both scenarios that run over it.
    let refs: Vec<(String, u64)> = out[4]["locations"]
        .as_array()
        .expect("references")
        .iter()
        .map(|l| {
            (
                l["file"].as_str().unwrap_or("").to_owned(),
                l["line"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    assert_eq!(
        refs,
        [
            ("data.kdl".to_owned(), 0),
            ("s.kdl".to_owned(), 1),
            ("s.kdl".to_owned(), 5)
        ],
        "{}",
        out[4]
    );
    let hover = out[5]["text"].as_str().unwrap_or_default();
    assert!(hover.contains("dataset"), "{hover}");
    let names: Vec<&str> = out[6]["symbols"]
        .as_array()
        .expect("symbols")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["orders", "refunds"], "{}", out[6]);
    let labels = |i: usize| -> Vec<String> {
        out[i]["labels"]
            .as_array()
            .expect("labels")
            .iter()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect()
    };
    assert!(
        !labels(7).iter().any(|l| l == "name=" || l == "repeat="),
        "{}",
        out[7]
    );
    let agent_line = labels(8);
    assert!(agent_line.iter().any(|l| l == "timeout="), "{}", out[8]);
    assert!(
        !agent_line.iter().any(|l| {
            ["url=", "base-url=", "command=", "socket=", "builtin="].contains(&l.as_str())
        }),
        "{}",
        out[8]
    );
    assert_eq!(
        out[9]["labels"],
        serde_json::json!(["id", "q"]),
        "{}",
        out[9]
    );
    assert_eq!(
        out[10]["labels"],
        serde_json::json!(["text", "lang"]),
        "{}",
        out[10]
    );
    assert_eq!(
        out[11]["edits"],
        serde_json::json!({"data.kdl": 1, "s.kdl": 2}),
        "{}",
        out[11]
    );
    assert_eq!(
        out[15]["labels"],
        serde_json::json!(["id", "q"]),
        "{}",
        out[15]
    );
    assert_eq!(labels(16), ["early", "inner"], "{}", out[16]);
    assert_eq!(labels(17), ["early"], "{}", out[17]);
    let body = labels(12);
    assert!(body.iter().any(|l| l == "expect"), "{}", out[12]);
    assert!(
        !body
            .iter()
            .any(|l| ["row-id", "history", "initial-message"].contains(&l.as_str())),
        "{}",
        out[12]
    );
}

/// A capture is a definition of its scenario: `vars.NAME` in a template goes to its
/// `capture`, finds its references, and renames with it; another scenario's capture of the
/// same name is another one, and a name templates cannot read is refused.
#[test]
fn captures_are_defined_found_and_renamed_within_their_scenario() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let suite = r##"agent "bot" protocol="connexity" builtin="booking"
scenario "a" {
    user "quote me"
    capture "quote" regex=#"\$(\d+)"#
    user "Is {{ vars.quote }} final? {{vars.quote}}"
    expect reply contains="{{ vars.quote }}"
    user "prose that says vars.quote is no use of it"
}
scenario "b" {
    user "hi"
    capture "quote" regex=#"(\d+)"#
    user "{{ vars.quote }}"
}
scenario "c" {
    user "hi"
    capture "quote" regex=#"(\d+)"#
    user "say \"{{ vars.quote }}\""
}
"##;
    std::fs::write(dir.path().join("t.kdl"), suite).expect("written");
    let steps = serde_json::json!([
        {"do": "open", "file": "t.kdl"},
        // On `quote` in `vars.quote` of scenario a's second user step.
        {"do": "definition", "file": "t.kdl", "line": 4, "character": 22},
        {"do": "references", "file": "t.kdl", "line": 3, "character": 14},
        {"do": "rename", "file": "t.kdl", "line": 3, "character": 14, "to": "price"},
        {"do": "rename", "file": "t.kdl", "line": 3, "character": 14, "to": "the-price"},
        {"do": "rename", "file": "t.kdl", "line": 3, "character": 14, "to": "quote"},
        // Scenario c reads it in a string with escapes, which rename cannot edit.
        {"do": "rename", "file": "t.kdl", "line": 15, "character": 14, "to": "price"},
        // A name KDL would quote bare is written as it is inside the strings.
        {"do": "rename", "file": "t.kdl", "line": 3, "character": 14, "to": "null"},
        // Letters of any script, as the templates read them (`vars.état`).
        {"do": "rename", "file": "t.kdl", "line": 3, "character": 14, "to": "état"},
    ]);
    let out = session(dir.path(), steps);
    assert_eq!(
        out[2]["locations"],
        serde_json::json!([{"file": "t.kdl", "line": 3, "character": 13}]),
        "{}",
        out[2]
    );
    // The definition and the three uses in scenario a; none of scenario b.
    assert_eq!(
        out[3]["locations"].as_array().map(Vec::len),
        Some(4),
        "{}",
        out[3]
    );
    assert_eq!(
        out[4]["edits"],
        serde_json::json!({"t.kdl": 4}),
        "{}",
        out[4]
    );
    assert!(
        out[5]["refused"]
            .as_str()
            .is_some_and(|r| r.contains("cannot be a capture's name")),
        "{}",
        out[5]
    );
    assert_eq!(out[6]["edits"], serde_json::json!({}), "{}", out[6]);
    assert!(
        out[7]["refused"]
            .as_str()
            .is_some_and(|r| r.contains("string written with escapes") && r.contains(":17)")),
        "{}",
        out[7]
    );
    assert_eq!(
        out[8]["texts"]["t.kdl"],
        serde_json::json!(["null", "null", "null", "null"]),
        "{}",
        out[8]
    );
    assert_eq!(
        out[9]["texts"]["t.kdl"],
        serde_json::json!(["état", "état", "état", "état"]),
        "{}",
        out[9]
    );
}

/// An id declared again in the buffer being edited, where the file it is also in sorts
/// after it (so that file's declaration is the one "defined again"): the duplicate is shown
/// in the buffer too, not only in the other file, which an editor does not show.
#[test]
fn a_duplicate_typed_in_one_file_is_shown_in_it_too() {
    let dir = project();
    let other = "agent \"other\" protocol=\"connexity\" builtin=\"booking\"\n";
    std::fs::write(dir.path().join("zz.kdl"), other).expect("written");
    let typed = format!("{AGENTS}{other}");
    let steps = serde_json::json!([
        {"do": "open", "file": "agents.kdl"},
        {"do": "change", "file": "agents.kdl", "text": typed},
    ]);
    let out = session(dir.path(), steps);
    let changed = out
        .iter()
        .rfind(|s| s["step"] == "change")
        .expect("the change's diagnostics");
    let duplicates = |file: &str| -> Vec<Value> {
        changed["diagnostics"][file]
            .as_array()
            .unwrap_or_else(|| panic!("no diagnostics for {file}: {changed}"))
            .iter()
            .filter(|d| d["code"] == "trellis::duplicate_id")
            .cloned()
            .collect()
    };
    let (typed_in, other_file) = (duplicates("agents.kdl"), duplicates("zz.kdl"));
    assert_eq!(other_file.len(), 1, "{changed}");
    assert_eq!(typed_in.len(), 1, "{changed}");
    // On the line just typed: the last of the buffer.
    let last_line = typed.lines().count() as u64 - 1;
    assert_eq!(typed_in[0]["line"], last_line, "{}", typed_in[0]);
    assert!(
        typed_in[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("duplicate agent `other`")),
        "{}",
        typed_in[0]
    );
}
