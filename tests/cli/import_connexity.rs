//! `trellis import connexity`: Connexity test-case files in both shapes (tests/fixtures/
//! connexity/cases) imported and compared with the suites expected (tests/fixtures/connexity/
//! expected), checked by `trellis check`, and one imported case run end to end against the
//! builtin `booking` agent with the fake LLM as simulator and judge.
//!
//! The expected suites are golden files: after a deliberate change to the importer's output,
//! rewrite them with `TRELLIS_UPDATE_GOLDENS=1 cargo test --test cli import_connexity` and
//! review the diff.

use std::collections::BTreeMap;

use serde_json::json;

use super::support::llm::{FakeLlm, Reply, Rule};
use super::*;

const CASES: &str = "tests/fixtures/connexity/cases";
const EXPECTED: &str = "tests/fixtures/connexity/expected";

async fn import(args: &[&str]) -> Output {
    trellis()
        .args(["import", "connexity"])
        .args(args)
        .output()
        .await
        .unwrap()
}

/// Every file below `dir`, by path relative to it.
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let text = std::fs::read_to_string(&path).unwrap();
                out.insert(path.strip_prefix(root).unwrap().to_path_buf(), text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[tokio::test]
async fn both_shapes_import_as_the_golden_suites_and_they_check() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("imported");
    let o = import(&[CASES, "--out", out.to_str().unwrap()]).await;
    let err = stderr(&o);
    // Two files are not test cases (exit 1); the others are written anyway.
    assert_eq!(o.status.code(), Some(1), "{err}");
    for expected in [
        "awkward/not-a-case.json: the file holds a number, not a test case",
        "awkward/bad-test-cases.json: `test_cases` is an object, not an array",
        "`expected_tool_calls[0].mock_responses[1]` is a string, not an object",
        "`expected_tool_calls[0].mock_responses[2]` has no `response`",
        "`expected_tool_calls[0].mock_responses[3].weight` (2)",
        "`source` next to `test_cases`",
        "test case 2 (Out of area): `priority` (3)",
        "test case 2 (Out of area): `persona.mood` (\"calm\")",
        "imported 7 test cases from 5 of 7 files",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    let written = tree(&out);
    if std::env::var_os("TRELLIS_UPDATE_GOLDENS").is_some() {
        let _ = std::fs::remove_dir_all(EXPECTED);
        for (path, text) in &written {
            let target = Path::new(EXPECTED).join(path);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            // The source paths in the headers are the fixture's own, relative to the crate.
            std::fs::write(target, text).unwrap();
        }
    }
    assert_eq!(written, tree(Path::new(EXPECTED)));

    let o = trellis().arg("check").arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("5 suites, 7 scenarios"),
        "{}",
        stdout(&o)
    );

    // Outputs exist: nothing is written without --replace.
    let o = import(&[CASES, "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("pass --replace"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_single_file_goes_to_standard_output_with_its_agent() {
    let o = import(&[
        &format!("{CASES}/refund-schema.json"),
        "--agent-url",
        "http://127.0.0.1:9/agent/respond",
        "--agent-id",
        "prod",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for expected in [
        "agent \"prod\" protocol=\"connexity\" url=\"http://127.0.0.1:9/agent/respond\"",
        "scenario \"refund-request-valid\" {",
        "    persona type=\"polite-customer\" {",
        "    user-context json=",
        "    outcome refund_initiated=#true",
        "    expect-tool \"lookup_order\" order_id=\"ORD-12345\"",
        "    max-turns 10",
        "    simulate until-done",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// Expected params that a `KEY=VALUE` cannot write (one named `count`, objects, lists) are
/// imported in `params-json` and checked, not dropped; the suite loads.
#[tokio::test]
async fn params_a_property_cannot_write_go_in_params_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("case.json");
    std::fs::write(
        &file,
        r#"{"name": "n", "initial_message": "hi", "expected_tool_calls": [{"tool": "lookup",
            "expected_params": {"order_id": "A-1", "count": 2, "filters": {"open": true},
            "tags": ["{{x}}"]},
            "mock_responses": [{"expected_params": {"ids": [1, 2]}, "response": "ok"}]}]}"#,
    )
    .unwrap();
    let o = import(&[file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for expected in [
        r#"expect-tool "lookup" order_id="A-1" params-json="{\"count\":2,\"filters\":{\"open\":true},\"tags\":[\"{{x}}\"]}""#,
        r#"output "ok" params-json="{\"ids\":[1,2]}""#,
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains("Not mapped"), "{text}");
    let suite = dir.path().join("case.kdl");
    std::fs::write(&suite, &text).unwrap();
    let o = crate::check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A name over the schema's 255 characters is imported as it is, and said.
#[tokio::test]
async fn a_name_over_the_schemas_limit_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("long.json");
    let name = "n".repeat(256);
    std::fs::write(
        &file,
        format!(r#"{{"name": "{name}", "initial_message": "hi"}}"#),
    )
    .unwrap();
    let o = import(&[file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&name), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("`name` is 256 characters, over the schema's 255"),
        "{}",
        stderr(&o)
    );
}

/// An empty name is said, as a missing one is, and not written as `name ""`.
#[tokio::test]
async fn an_empty_name_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("odd.json");
    std::fs::write(&file, r#"{"name": " ", "initial_message": "hi"}"#).unwrap();
    let o = import(&[file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`name` is empty (required: a short human-readable name)"),
        "{}",
        stderr(&o)
    );
    assert!(
        stdout(&o).contains("scenario \"odd-1\" {"),
        "{}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains("name \" \""), "{}", stdout(&o));
}

#[tokio::test]
async fn a_case_that_is_not_an_object_loses_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    std::fs::write(
        &file,
        r#"[{"name": "A"}, {"name": "B"}, "oops", {"name": "C"}]"#,
    )
    .unwrap();
    let o = import(&[file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("test case 3 is a string, not an object (not imported)"),
        "{}",
        stderr(&o)
    );
    let text = stdout(&o);
    for id in ["\"a\"", "\"b\"", "\"c\""] {
        assert!(text.contains(&format!("scenario {id}")), "{text}");
    }
    // A file of one object that is not a case (a `package.json` beside the cases, a
    // MultiAgentEval scenario) is reported, not imported as an empty scenario.
    for (name, text) in [
        (
            "package.json",
            r#"{"name": "my-tools", "version": "1.0.0", "dependencies": {}}"#,
        ),
        (
            "scenario.json",
            r#"{"aes_version": 1.4, "metadata": {"id": "x"}, "workflow": {"nodes": []}}"#,
        ),
    ] {
        let other = dir.path().join(name);
        std::fs::write(&other, text).unwrap();
        let o = import(&[other.to_str().unwrap()]).await;
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("not a Connexity test case"),
            "{}",
            stderr(&o)
        );
        assert_eq!(stdout(&o), "", "{name}");
    }
    // Nothing left to import is still an error.
    std::fs::write(&file, r#"["oops", 2]"#).unwrap();
    let o = import(&[file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no test case of the file can be imported"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test]
async fn a_case_too_big_for_a_suite_loses_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    let doc = "lorem ipsum ".repeat(100_000);
    std::fs::write(
        &file,
        serde_json::json!([
            {"name": "Small A"},
            {"name": "Big context", "user_context": {"doc": doc}},
            {"name": "Small B"}
        ])
        .to_string(),
    )
    .unwrap();
    let out = dir.path().join("out.kdl");
    let o = import(&[file.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("test case 2 (`big-context`) would be"),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("scenario \"small-a\""), "{text}");
    assert!(text.contains("scenario \"small-b\""), "{text}");
    assert!(!text.contains("scenario \"big-context\""));
}

/// The reference-shaped case (agent speaks first, persona_context, outcome statements,
/// expected tool calls with case-insensitive params) runs against the builtin booking agent:
/// the fake LLM plays the caller and judges the outcomes.
#[tokio::test]
async fn an_imported_case_runs_end_to_end_against_the_booking_agent() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(
                r#"{"passed": true, "justification": "booked"}"#,
            )],
        ),
        // The case's evaluation_criteria_override, judged as its rubric: the judge's
        // system prompt holds its text.
        Rule::when(
            "",
            [Reply::text(
                r#"{"score": 1.0, "label": "good", "justification": "booked and confirmed"}"#,
            )],
        )
        .in_system("Score only whether the booking was made"),
        Rule::otherwise([
            Reply::text("I'd like a duct cleaning. My postal code is V4T 0A7."),
            Reply::text("Tuesday works."),
            Reply::text("[END]"),
        ]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    let o = import(&[
        &format!("{CASES}/reference"),
        "--out",
        suites.to_str().unwrap(),
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::write(
        suites.join("providers.kdl"),
        format!(
            "provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"sim\" api-key-env=\"FAKE_KEY\"\n",
            fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&suites)
        .args(["--filter", "*surrey*"])
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let criteria = read_parquet(&out.join("criteria.parquet"));
    let status = strings(&criteria, "status");
    let text = strings(&criteria, "criterion");
    let rows: Vec<(String, String)> = text
        .iter()
        .zip(&status)
        .map(|(t, s)| (t.clone().unwrap_or_default(), s.clone().unwrap_or_default()))
        .collect();
    for needle in [
        "check_service_area",
        "create_booking",
        "Agent MUST book the appointment for Tuesday",
        "this test case's evaluation criteria",
    ] {
        assert!(
            rows.iter()
                .any(|(t, s)| t.contains(needle) && s == "passed"),
            "{needle} not passed: {rows:?}"
        );
    }
    // The agent spoke first; the simulator then wrote two messages and ended the call.
    let turns = read_parquet(&out.join("turns.parquet"));
    assert_eq!(turns.height(), 3, "{turns:?}");
}

/// `expected_tool_calls: []` (no tool may be called) fails when the agent calls one.
#[tokio::test]
async fn an_empty_expected_tool_list_fails_a_tool_call() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(
                r#"{"passed": false, "justification": "it called a tool"}"#,
            )],
        ),
        Rule::otherwise([
            Reply::text("My postal code is V4T 0A7."),
            Reply::text("[END]"),
        ]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case.json");
    std::fs::write(
        &case,
        r#"{"name": "No tools", "initial_message": "Hi, I need a duct cleaning.",
            "expected_outcomes": ["Agent MUST answer without tools"],
            "expected_tool_calls": []}"#,
    )
    .unwrap();
    let suite = dir.path().join("case.kdl");
    let o = import(&[case.to_str().unwrap(), "--out", suite.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut text = std::fs::read_to_string(&suite).unwrap();
    text.push_str(&format!(
        "provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"sim\" api-key-env=\"FAKE_KEY\"\n",
        fake.base_url()
    ));
    std::fs::write(&suite, text).unwrap();
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&suite)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let criteria = read_parquet(&out.join("criteria.parquet"));
    let details = strings(&criteria, "detail");
    assert!(
        details
            .iter()
            .flatten()
            .any(|d| d.contains("no tool may be called") && d.contains("check_service_area")),
        "{details:?}"
    );
    // The judge is told so too.
    let judged = fake
        .seen()
        .iter()
        .map(|r| r.body.to_string())
        .find(|b| b.contains("Does this expected outcome hold"))
        .unwrap();
    assert!(judged.contains("None: no tool may be called."), "{judged}");
}

/// A reference-shaped case with `mock_responses` run against an `openai` agent under test:
/// the model calls `lookup_order` with params only the second mock matches (in another case
/// and without the `channel` the mock leaves open), and its next request must carry that
/// mock's answer as the tool result; the case's `expect-tool`s pass.
#[tokio::test]
async fn imported_mock_responses_answer_an_openai_agent_under_test() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "Does this expected outcome hold",
            [Reply::text(
                r#"{"passed": true, "justification": "shipped"}"#,
            )],
        ),
        // The agent's answer once the tool result is the second mock's response.
        Rule::when(
            r#""carrier":"Purolator""#,
            [Reply::text("Order ORD-2 has shipped with Purolator.")],
        ),
        // Otherwise the agent (again) looks the order up: a wrong answer ends in a fault
        // at `max-tool-rounds`, never in the reply above.
        Rule::for_model(
            "agent-model",
            [Reply::tool_call(
                "lookup_order",
                json!({"order_id": "ord-2"}),
            )],
        ),
        // The simulated caller ends the call after the agent's reply.
        Rule::otherwise([Reply::text("[END]")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    let o = import(&[
        &format!("{CASES}/reference"),
        "--out",
        suites.to_str().unwrap(),
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The user points the imported suites at their own agent: an engine-run model whose
    // project-level tool the case's scenario-level mocks replace.
    std::fs::write(
        suites.join("agents.kdl"),
        format!(
            r##"agent "connexity" protocol="openai" base-url="{url}" model="agent-model" \
    system-prompt="You answer order questions." tools="lookup_order" max-tool-rounds=2
tool "lookup_order" {{
    description "An order's status"
    param "order_id" required=#true
    mock returns=#"{{"status": "unknown"}}"#
}}
provider "fake" kind="openai" base-url="{url}" model="sim" api-key-env="FAKE_KEY"
"##,
            url = fake.base_url()
        ),
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&suites)
        .args(["--filter", "*order-status*"])
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    // The request after the call carried the second mock's answer as the tool message.
    let agent_requests: Vec<_> = fake
        .seen()
        .into_iter()
        .filter(|r| r.body["model"] == "agent-model")
        .collect();
    assert_eq!(agent_requests.len(), 2, "{agent_requests:#?}");
    let messages = agent_requests[1].body["messages"].as_array().unwrap();
    let tool_message = messages.last().unwrap();
    assert_eq!(tool_message["role"], "tool");
    let result: serde_json::Value =
        serde_json::from_str(tool_message["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        result,
        json!({"order_id": "ORD-2", "status": "shipped", "carrier": "Purolator"})
    );

    let criteria = read_parquet(&out.join("criteria.parquet"));
    let rows: Vec<(String, String)> = strings(&criteria, "criterion")
        .into_iter()
        .zip(strings(&criteria, "status"))
        .map(|(t, s)| (t.unwrap_or_default(), s.unwrap_or_default()))
        .collect();
    let expect_tools: Vec<_> = rows
        .iter()
        .filter(|(t, _)| t.contains("lookup_order"))
        .collect();
    assert_eq!(expect_tools.len(), 2, "{rows:?}");
    assert!(expect_tools.iter().all(|(_, s)| s == "passed"), "{rows:?}");
    let turns = read_parquet(&out.join("turns.parquet"));
    assert_eq!(turns.height(), 1, "{turns:?}");
}

/// A case file saved with a byte order mark, whose statements hold template syntax: it
/// imports, and the statements stay text (a judge reads `{{reset_token}}` as written).
#[tokio::test]
async fn a_bom_and_template_syntax_in_statements_import_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("braces.json");
    let case = json!({
        "name": "Braces in outcome",
        "first_message": "Reset my password",
        "expected_outcomes": ["Agent MUST NOT echo the {{reset_token}} placeholder"],
        "evaluation_criteria_override": "Focus on {% raw %}",
    });
    let mut bytes = b"\xef\xbb\xbf".to_vec();
    bytes.extend(case.to_string().as_bytes());
    std::fs::write(&src, bytes).unwrap();
    let out = dir.path().join("out");
    let o = import(&[src.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = trellis().arg("check").arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = trellis()
        .args(["list", "--verbose"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `sub/refund.json` and `sub.refund.json` both read as suite `sub.refund`: the second gets
/// `sub.refund-2`, and the imported suites load together.
#[tokio::test]
async fn files_whose_paths_read_as_one_suite_name_get_distinct_ones() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let case = |name: &str| json!({"name": name, "first_message": "Hi"}).to_string();
    std::fs::write(src.join("sub/refund.json"), case("One")).unwrap();
    std::fs::write(src.join("sub.refund.json"), case("Two")).unwrap();
    let out = dir.path().join("out");
    let o = import(&[src.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = trellis().arg("check").arg(&out).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = trellis().arg("list").arg(&out).output().await.unwrap();
    let listed = stdout(&o);
    assert!(
        listed.contains("sub.refund/") && listed.contains("sub.refund-2/"),
        "{listed}"
    );
}

/// Persona fields that are not text are kept as their JSON text and said, and a persona
/// with a type alone is written as `trellis fmt` writes it.
#[tokio::test]
async fn persona_fields_of_any_type_are_kept_and_the_output_is_formatted() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let cases = json!([
        {"name": "Listed", "first_message": "Hi",
         "persona": {"type": "terse", "instructions": ["be brief", "no small talk"]}},
        {"name": "Bare", "first_message": "Hi", "persona": {"type": "terse"}},
    ]);
    std::fs::write(src.join("cases.json"), cases.to_string()).unwrap();
    let out = dir.path().join("out");
    let o = import(&[src.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`persona.instructions` is an array: written as its JSON text"),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(out.join("cases.kdl")).unwrap();
    assert!(text.contains("no small talk"), "{text}");
    let o = trellis()
        .args(["fmt", "--check"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// A second import with `--replace` keeps the agent the user pointed at their endpoint in
/// `agents.kdl`; `--agent-url` rewrites it.
#[tokio::test]
async fn replace_keeps_an_edited_agent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let agents = out.join("agents.kdl");
    let source = format!("{CASES}/reference");
    let run = |extra: &'static [&'static str]| {
        let mut args = vec![source.clone(), "--out".into(), out.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let args = run(&["-q"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let edited = std::fs::read_to_string(&agents).unwrap().replace(
        "builtin=\"booking\"",
        "url=\"http://127.0.0.1:9/agent/respond\"",
    );
    assert!(edited.contains("127.0.0.1:9"), "{edited}");
    std::fs::write(&agents, &edited).unwrap();

    let args = run(&["-q", "--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&agents).unwrap(), edited);
    assert!(
        stderr(&o).contains("kept `connexity` as written there"),
        "{}",
        stderr(&o)
    );

    let args = run(&["-q", "--replace", "--agent-url", "http://127.0.0.1:9/new"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rewritten = std::fs::read_to_string(&agents).unwrap();
    assert!(
        rewritten.contains("url=\"http://127.0.0.1:9/new\""),
        "{rewritten}"
    );
    assert!(!rewritten.contains("agent/respond"), "{rewritten}");
}

/// An expected tool call with an empty name names no tool: it is reported as not mapped,
/// and the rest of the case still imports and checks.
#[tokio::test]
async fn an_empty_tool_name_is_reported_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("t.json");
    std::fs::write(
        &case,
        r#"{"test_cases":[{"name":"t","expected_tool_calls":[{"tool":"","mock_responses":[{"response":"x"}]},{"tool":"lookup"}]}]}"#,
    )
    .unwrap();
    let o = import(&[case.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`expected_tool_calls[0]` has an empty tool name"),
        "{}",
        stderr(&o)
    );
    let suite = stdout(&o);
    assert!(suite.contains("expect-tool \"lookup\""), "{suite}");
    assert!(!suite.contains("\"\""), "{suite}");
}

/// Importing again keeps each case's scenario id by its database `id`: a case inserted
/// before another of the same name, or a case renamed, does not move the others' ids (their
/// history and comparisons go by the id).
#[tokio::test]
async fn importing_again_keeps_each_cases_scenario_id() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    let case = |id: &str, name: &str| serde_json::json!({"id": id, "name": name, "initial_message": "Hi", "expected_outcomes": ["ok"]});
    let write = |cases: Vec<serde_json::Value>| {
        std::fs::write(&file, serde_json::Value::Array(cases).to_string()).unwrap();
    };
    write(vec![
        case("a1", "Same Name"),
        case("a2", "Same Name"),
        case("b1", "Other"),
    ]);
    let out = dir.path().join("out.kdl");
    let o = import(&[file.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ids = |text: &str| -> Vec<(String, String)> {
        let mut found = Vec::new();
        let mut scenario = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("scenario \"") {
                scenario = rest.split('"').next().map(str::to_owned);
            } else if let Some(id) = line.strip_prefix("    // id: ") {
                found.push((id.to_owned(), scenario.take().unwrap()));
            }
        }
        found.sort();
        found
    };
    let pairs = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&std::fs::read_to_string(&out).unwrap()),
        pairs(&[("a1", "same-name"), ("a2", "same-name-2"), ("b1", "other")])
    );
    // A new case of the same name first, and `b1` renamed.
    write(vec![
        case("a0", "Same Name"),
        case("a1", "Same Name"),
        case("a2", "Same Name"),
        case("b1", "Renamed"),
    ]);
    let o = import(&[
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--replace",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        ids(&std::fs::read_to_string(&out).unwrap()),
        pairs(&[
            ("a0", "same-name-3"),
            ("a1", "same-name"),
            ("a2", "same-name-2"),
            ("b1", "other")
        ])
    );
}

/// A Connexity agent on 127.0.0.1 that records every request's `messages` and answers
/// `Booked.`. Returns its URL and what it received.
async fn recording_agent() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    tokio::task::JoinHandle<()>,
) {
    use axum::routing::post;
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = received.clone();
    let respond = move |axum::Json(request): axum::Json<serde_json::Value>| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(request["messages"].clone());
            axum::Json(json!({"messages": [{"role": "assistant", "content": "Booked."}]}))
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/agent/respond", post(respond));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{address}/agent/respond"), received, server)
}

/// `first_turn: "agent"` with a `first_message`: the scripted greeting opens the
/// conversation as the agent's message, so the agent's first request carries it before the
/// caller's answer; it is never called with `messages: []` for a greeting of its own. (The
/// importer once dropped the greeting and wrote `first-turn "agent"`.)
#[tokio::test]
async fn a_scripted_greeting_opens_the_conversation_the_agent_is_sent() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::text("Hi, I'd like a duct cleaning."),
        Reply::text("[END]"),
    ])])
    .await;
    let (url, received, _server) = recording_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("greeting.json");
    let greeting = "Hello, this is Acme, how can I help? {{ not a template }}";
    std::fs::write(
        &case,
        json!({
            "name": "Scripted greeting",
            "first_turn": "agent",
            "first_message": greeting,
            "persona_context": "A homeowner.\n\nAsk for a duct cleaning."
        })
        .to_string(),
    )
    .unwrap();
    let suite = dir.path().join("greeting.kdl");
    let o = import(&[
        case.to_str().unwrap(),
        "--out",
        suite.to_str().unwrap(),
        "--agent-url",
        &url,
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not mapped"), "{}", stderr(&o));
    let mut text = std::fs::read_to_string(&suite).unwrap();
    assert!(!text.contains("first-turn"), "{text}");
    text.push_str(&format!(
        "provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"sim\" api-key-env=\"FAKE_KEY\"\n",
        fake.base_url()
    ));
    std::fs::write(&suite, text).unwrap();
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&suite)
        .env("FAKE_KEY", "k")
        .output()
        .await
        .unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    let received = received.lock().unwrap().clone();
    let first = received.first().expect("the agent was called");
    let first = first.as_array().unwrap();
    assert_eq!(first.len(), 2, "{received:#?}");
    assert_eq!(first[0]["role"], "assistant");
    assert_eq!(first[0]["content"], greeting);
    assert_eq!(first[1]["role"], "user");
    assert_eq!(first[1]["content"], "Hi, I'd like a duct cleaning.");
}

/// Single files imported one at a time into one directory each name their agent after
/// their `--out` file, so the directory checks as a whole (they once all defined agent
/// `connexity`: `duplicate agent`); `--agent-id` still names it, and standard output keeps
/// `connexity`.
#[tokio::test]
async fn single_files_imported_side_by_side_check_together() {
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("s");
    std::fs::create_dir_all(&suites).unwrap();
    for (name, out) in [("refund-schema", "ref"), ("array", "arr")] {
        let target = suites.join(format!("{out}.kdl"));
        let o = import(&[
            &format!("{CASES}/{name}.json"),
            "--out",
            target.to_str().unwrap(),
        ])
        .await;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(
            text.contains(&format!(
                "agent \"{out}\" protocol=\"connexity\" builtin=\"booking\""
            )),
            "{text}"
        );
        assert!(text.contains(&format!("    agent \"{out}\"\n")), "{text}");
    }
    let o = check(&suites).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let named = suites.join("named.kdl");
    let o = import(&[
        &format!("{CASES}/refund-schema.json"),
        "--out",
        named.to_str().unwrap(),
        "--agent-id",
        "prod",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&named).unwrap();
    assert!(text.contains("agent \"prod\" protocol="), "{text}");
    let o = import(&[&format!("{CASES}/refund-schema.json")]).await;
    assert!(
        stdout(&o).contains("agent \"connexity\" protocol="),
        "{}",
        stdout(&o)
    );
}

/// Many cases under few names: their scenario ids are numbered as before (`-2`, `-3`…,
/// kept on a re-import), and the console lists the first 20 unmapped parts of the file and
/// counts the rest, which the suite's header lists in full.
#[tokio::test]
async fn many_cases_under_few_names_are_numbered_and_their_unmapped_parts_counted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.json");
    let cases: Vec<serde_json::Value> = (0..30)
        .map(|i| {
            serde_json::json!({"id": format!("db-{i}"), "created_at": format!("t{i}"),
                "name": format!("Case {}", i % 3)})
        })
        .collect();
    std::fs::write(&file, serde_json::to_string(&cases).unwrap()).unwrap();
    let suite = dir.path().join("suite.kdl");
    let o = import(&[file.to_str().unwrap(), "--out", suite.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("30 items not mapped:"), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("  - ")).count(),
        20,
        "{err}"
    );
    assert!(
        err.contains("  … and 10 more, listed in the header of the suite written from it"),
        "{err}"
    );
    let text = std::fs::read_to_string(&suite).unwrap();
    assert_eq!(
        text.matches("`created_at` (a database field").count(),
        30,
        "{text}"
    );
    // The case's id is sent as the platform sends it, not dropped.
    assert!(text.contains("    test-case-id \"db-7\"\n"), "{text}");
    for id in ["case-0", "case-1", "case-2", "case-0-2", "case-2-10"] {
        assert!(
            text.contains(&format!("scenario \"{id}\" {{")),
            "{id} in {text}"
        );
    }
    assert!(!text.contains("\"case-0-11\""), "{text}");
}
